"""LRA trainer: resumable state at every evaluation; an interrupted and resumed run equals an uninterrupted one."""

from __future__ import annotations

import argparse
import csv
import json

import pytest
import torch
from safetensors.torch import load_file

from subquad.data.lra.listops import write_listops
from subquad.engine.checkpoint import load_state
from subquad.engine.sequence import LRA_TIMING_FIELDS, LRAConfig, _train_batches, train_lra
from subquad.errors import UserError
from subquad_cli.__main__ import main
from subquad_cli.lra import add_parser, resolve_config


class _Interrupt(Exception):
    pass


@pytest.fixture(scope="module")
def listops_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("lo")
    write_listops(out, num_train=40, num_val=8, num_test=8, seed=3, min_len=10, max_len=60)
    return out


def _cfg(data, out, **kw):
    # Dropout on: the resumed run must reproduce the RNG draws too. 40 examples / batch 8 = 5 steps per epoch, so
    # the 7 steps cross an epoch boundary and the interruption (step 4) falls inside the first epoch.
    args = dict(task="listops", data=str(data), max_len=64, dim=16, depth=2, num_heads=2, mlp_dim=24,
                pool="masked_mean", drop=0.2, batch_size=8, lr=3e-3, steps=7, warmup=2, eval_every=2, seed=5,
                device="cpu", output=str(out))
    args.update(kw)
    return LRAConfig(**args)


def _rows(path):
    with open(path, newline="") as f:
        return [{k: v for k, v in r.items() if k not in LRA_TIMING_FIELDS} for r in csv.DictReader(f)]


def _results(path):
    r = json.loads(path.read_text())
    return {k: v for k, v in r.items() if k not in LRA_TIMING_FIELDS + ("output", "checkpoint")}


def _assert_same_run(a, b):
    for name in ("last.safetensors", "best.safetensors"):
        wa, wb = load_file(a / name), load_file(b / name)
        assert wa.keys() == wb.keys()
        for k in wa:
            assert torch.equal(wa[k], wb[k]), f"{name}: {k} differs"
    assert _rows(a / "summary.csv") == _rows(b / "summary.csv")
    assert _results(a / "results.json") == _results(b / "results.json")


def test_data_order_is_a_function_of_seed_and_step():
    full = _train_batches(21, 4, seed=7, first_step=0)
    seq = [next(full) for _ in range(12)]  # 5 steps per epoch: crosses two epoch boundaries
    for k in (0, 3, 5, 8):
        tail = _train_batches(21, 4, seed=7, first_step=k)
        assert [next(tail) for _ in range(12 - k)] == seq[k:]
    assert seq[:5] != seq[5:10]  # a new permutation each epoch
    assert sorted(i for b in seq[:5] for i in b) == sorted(set(i for b in seq[:5] for i in b))
    other = _train_batches(21, 4, seed=8, first_step=0)
    assert [next(other) for _ in range(5)] != seq[:5]


def test_interrupted_and_resumed_run_equals_uninterrupted(listops_dir, tmp_path):
    full = tmp_path / "full"
    r_full = train_lra(_cfg(listops_dir, full), log=lambda s: None)
    assert r_full["steps"] == 7 and (full / "last_state.pth").is_file()

    part = tmp_path / "part"
    seen = []

    def stop(row):
        seen.append(row["step"])
        if row["step"] == 4:
            raise _Interrupt

    with pytest.raises(_Interrupt):
        train_lra(_cfg(listops_dir, part), log=lambda s: None, on_eval=stop)
    assert seen == [2, 4] and not (part / "results.json").exists()
    state = load_state(part / "last_state.pth")  # torch.load(weights_only=True)
    assert state["step"] == 4 and {"model", "optimizer", "scheduler", "rng", "best_acc"} <= set(state)
    # A fresh run refuses to overwrite it; a resume with other settings is refused too.
    with pytest.raises(UserError, match="already holds a run"):
        train_lra(_cfg(listops_dir, part), log=lambda s: None)
    with pytest.raises(UserError, match="other settings"):
        train_lra(_cfg(listops_dir, part, lr=1e-3, resume=True), log=lambda s: None)

    resumed = []
    r_part = train_lra(_cfg(listops_dir, part, resume=True), log=lambda s: None,
                       on_eval=lambda row: resumed.append(row["step"]))
    assert resumed == [6, 7]
    _assert_same_run(full, part)
    assert r_part["test_acc"] == r_full["test_acc"] and r_part["best_step"] == r_full["best_step"]
    # Resuming a finished run trains nothing and returns its results.
    again = train_lra(_cfg(listops_dir, part, resume=True), log=lambda s: None, on_eval=resumed.append)
    assert resumed == [6, 7] and again["test_acc"] == r_full["test_acc"]


def test_cli_resume(listops_dir, tmp_path, capsys):
    full, part = tmp_path / "full", tmp_path / "part"
    flags = ["--task", "listops", "--data", str(listops_dir), "--max-len", "64", "--batch-size", "8",
             "--max-steps", "6", "--eval-every", "2", "--drop", "0.1", "--pool", "masked_mean", "--device", "cpu"]
    assert main(["lra", "train", *flags, "--output", str(full)]) == 0
    # An interrupted run: the CLI's own config of `flags`, stopped from the callback after step 2.
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    cfg = resolve_config(parser.parse_args(["lra", "train", *flags, "--output", str(part)]))

    def stop(row):
        raise _Interrupt

    with pytest.raises(_Interrupt):
        train_lra(cfg, log=lambda s: None, on_eval=stop)
    capsys.readouterr()
    assert main(["lra", "train", "--resume", str(part)]) == 0
    assert "resuming" in capsys.readouterr().out
    _assert_same_run(full, part)
    assert main(["lra", "train", "--resume", str(part), "--lr", "1e-3"]) == 2
    assert "drop --lr" in capsys.readouterr().err
    assert main(["lra", "train", "--resume", str(tmp_path / "nothing")]) == 2
    assert "run directory not found" in capsys.readouterr().err
