"""Arena cells of the sequence tasks: quick-budget cells of the shipped YAMLs, refusals, resume, data preparation."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

import subquad
from subquad.arena import lra
from subquad.attention import ATTENTION_REGISTRY, Request, check
from subquad.errors import UserError

ARENA = Path(subquad.__file__).parent / "configs" / "arena"


def _task(name):
    return yaml.safe_load((ARENA / f"{name}.yaml").read_text())


def _quick_train(task, data):
    return {**task["train"], **task["budgets"]["quick"], "data": str(data)}


@pytest.fixture(scope="module")
def quick_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("arena_data")
    return {name: lra.prepare_data(_task(name), root, budget="quick") for name in ("listops", "pathfinder32")}


@pytest.mark.parametrize("name", ["listops", "pathfinder32"])
def test_yaml_schema(name):
    task = _task(name)
    assert {"task", "kind", "description", "seeds", "data", "train", "budgets", "mechanisms",
            "default_mechanisms"} <= set(task)
    assert task["task"] == name and task["kind"] == "lra" and task["seeds"] == [0, 1, 2]
    assert {"default", "quick"} <= set(task["budgets"])
    assert set(task["default_mechanisms"]) <= set(task["mechanisms"])
    for label, mech in task["mechanisms"].items():
        assert lra.refusal(task["train"], mech) is None, label
    must = {"listops": {"softmax", "linear", "long_short", "long_short_no_dualln"},
            "pathfinder32": {"softmax", "linear", "long_short", "focused_linear", "structure_aware", "window"}}[name]
    assert must <= set(task["default_mechanisms"])


@pytest.mark.parametrize("name,label", [("listops", "long_short"), ("pathfinder32", "structure_aware")])
def test_quick_cell_returns_every_key_and_finished_cell_is_reused(name, label, quick_data, tmp_path):
    task = _task(name)
    train = _quick_train(task, quick_data[name])
    seen = []
    res = lra.run_cell(train, task["mechanisms"][label], 0, tmp_path / "cell", seen.append)
    assert list(res) == list(lra.CELL_KEYS)
    steps = task["budgets"]["quick"]["max_steps"]
    assert [p["step"] for p in seen] == list(range(task["budgets"]["quick"]["eval_every"], steps + 1,
                                                  task["budgets"]["quick"]["eval_every"]))
    assert all(p["steps"] == steps and 0 <= p["val_acc"] <= 100 for p in seen)
    assert res["curve"] == [{"step": p["step"], "val_acc": p["val_acc"]} for p in seen]
    assert 0 <= res["test_acc"] <= 100 and res["best_val_acc"] == max(p["val_acc"] for p in seen)
    assert res["params"] > 0 and res["gmacs"] > 0
    for k in ("train_per_sec", "train_per_wall_sec", "eval_per_sec", "wall_s"):
        assert res[k] > 0, k
    assert res["peak_mem_mb"] >= 0
    for f in ("args.yaml", "summary.csv", "last.safetensors", "best.safetensors", "best.json", "results.json"):
        assert (tmp_path / "cell" / f).is_file(), f
    # A finished cell is returned as it is, without training.
    again = lra.run_cell(train, task["mechanisms"][label], 0, tmp_path / "cell", seen.append)
    assert len(seen) == steps // task["budgets"]["quick"]["eval_every"] and again == res


class _Kill(Exception):
    pass


def test_interrupted_cell_resumes_to_the_same_numbers(quick_data, tmp_path):
    task = _task("listops")
    train = {**_quick_train(task, quick_data["listops"]), "max_steps": 6, "drop": 0.1}
    mech = task["mechanisms"]["softmax"]
    full = lra.run_cell(train, mech, 1, tmp_path / "full", None)

    def kill(p):
        if p["step"] == 4:
            raise _Kill

    with pytest.raises(_Kill):
        lra.run_cell(train, mech, 1, tmp_path / "part", kill)
    steps = []
    part = lra.run_cell(train, mech, 1, tmp_path / "part", lambda p: steps.append(p["step"]))
    assert steps == [6]
    timing = ("train_per_sec", "train_per_wall_sec", "eval_per_sec", "peak_mem_mb", "wall_s")
    assert {k: v for k, v in part.items() if k not in timing} == {k: v for k, v in full.items() if k not in timing}
    # A cell killed before its first evaluation (no state file) starts over.
    (tmp_path / "early").mkdir()
    (tmp_path / "early" / "args.yaml").write_text("stale: 1\n")
    (tmp_path / "early" / "last.safetensors").write_text("torn")
    early = lra.run_cell(train, mech, 1, tmp_path / "early", None)
    assert early["test_acc"] == full["test_acc"] and early["curve"] == full["curve"]


def test_refusals(quick_data):
    lo = _quick_train(_task("listops"), quick_data["listops"])
    pf = _quick_train(_task("pathfinder32"), quick_data["pathfinder32"])
    assert lra.refusal(lo, {"attention": "cswin"}) == \
        "needs a 2-D token grid (hw); listops is a 1-D sequence"
    assert "class token" in lra.refusal({**pf, "pool": "cls_last"}, {"attention": "window"})
    assert "cannot be built" in lra.refusal(pf, {"attention": "window", "attn_kw": {"window_size": 0}})
    # The caps decide: on ListOps exactly the mechanisms whose caps refuse a 1-D bidirectional request are refused,
    # on the 32 x 32 grid only those that refuse a bidirectional one (none is causal-only today).
    for name in subquad.list_attention():
        caps = ATTENTION_REGISTRY.get(name).builder.caps
        assert (lra.refusal(lo, {"attention": name}) is None) == (not check(caps, Request(sequence=True))), name
        assert (lra.refusal(pf, {"attention": name}) is None) == (not check(caps, Request())), name
    with pytest.raises(UserError, match="unknown attention 'nope'; allowed: "):
        lra.refusal(lo, {"attention": "nope"})
    with pytest.raises(UserError, match="unknown mechanism option"):
        lra.refusal(lo, {"attention": "softmax", "dual_ln": False})


def _digest(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.suffix != ".npz"}


@pytest.mark.parametrize("generator,settings", [
    ("listops", {"num_train": 6, "num_val": 3, "num_test": 3, "seed": 4, "min_len": 10, "max_len": 40}),
    ("pathfinder", {"size": 32, "contour_length": 6, "num_images": 10, "seed": 4})])
def test_prepare_data_is_deterministic_and_reused(generator, settings, tmp_path):
    task = {"task": "t", "data": {"generator": generator, **settings}, "train": {"max_len": 64}}
    a = lra.prepare_data(task, tmp_path / "a")
    b = lra.prepare_data(task, tmp_path / "b")
    assert a.name == b.name and _digest(a) == _digest(b) and len(_digest(a)) >= 4
    assert json.loads((a / "arena_data.json").read_text())["settings"]["generator"] == generator
    stamp = (a / "arena_data.json").stat().st_mtime_ns
    assert lra.prepare_data(task, tmp_path / "a") == a and (a / "arena_data.json").stat().st_mtime_ns == stamp
    other = lra.prepare_data({**task, "data": {**task["data"], "seed": 5}}, tmp_path / "a")
    assert other != a and _digest(other) != _digest(a)
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".")]  # no temporary folder left
    with pytest.raises(UserError, match="unknown"):
        lra.prepare_data({**task, "data": {**task["data"], "colour": 1}}, tmp_path / "c")
