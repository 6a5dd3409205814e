"""The `charlm` arena task (kind lm): the quick run on a small corpus the test writes, the task file, and its
refusals. No test needs the Debian linux-doc package: SUBQUAD_ARENA_CORPUS points the task at the test's text."""

from __future__ import annotations

import csv
import json
import random
import resource
import time
from pathlib import Path

import pytest
import yaml

from subquad.arena import lm, load_task
from subquad.arena.tasks import CONFIG_DIR
from subquad.errors import UserError
from subquad_cli.__main__ import main


def _write_text(path: Path, n_bytes: int = 60_000, seed: int = 0) -> Path:
    """Sentences of a small vocabulary: real bytes (UTF-8 text with newlines), nothing downloaded."""
    rng = random.Random(seed)
    words = ("the kernel driver device memory page interrupt scheduler process file system lock mutex buffer "
             "cache queue register module parameter option über").split()
    out, n = [], 0
    while n < n_bytes:
        line = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12))).capitalize() + ".\n"
        out.append(line)
        n += len(line.encode())
    path.write_text("".join(out), encoding="utf-8")
    return path


def _board(out: Path) -> dict[str, dict[str, str]]:
    with open(out / "leaderboard.csv", newline="") as f:
        return {r["attention"]: r for r in csv.DictReader(f)}


def _cpu_seconds() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def test_quick_charlm_run(tmp_path, monkeypatch, capsys):
    corpus = _write_text(tmp_path / "text.txt")
    monkeypatch.setenv(lm.CORPUS_ENV, str(corpus))
    out = tmp_path / "arena"
    t0, c0 = time.perf_counter(), _cpu_seconds()
    assert main(["arena", "run", "--task", "charlm", "--attention", "softmax,long_short", "--seeds", "0",
                 "--budget", "quick", "--device", "cpu", "--out", str(out)]) == 0
    wall, cpu = time.perf_counter() - t0, _cpu_seconds() - c0
    assert wall < 120, f"quick charlm run took {wall:.0f} s"
    assert cpu < 60, f"quick charlm run used {cpu:.0f} CPU s"
    rows = _board(out)
    assert list(rows) == ["softmax", "long_short"]
    for r in rows.values():
        assert r["status"] == "ok" and r["n_seeds"] == "1"
        # bits per byte of a barely trained byte model: above 0, near log2(256) = 8
        assert 0 < float(r["mean_acc"]) < 9 and 0 < float(r["mean_val_acc"]) < 9
        assert int(r["params"]) > 0 and float(r["gmacs"]) > 0 and float(r["train_per_sec"]) > 0
    assert rows["long_short"]["options"] == "chunk_size=16;rank=1;window_size=128"
    cell = out / "cells" / "long_short" / "seed0"
    res = json.loads((cell / "results.json").read_text())
    row = json.loads((cell / "cell.json").read_text())
    # the test bpc is the one the cell reports, for the checkpoint the valid split selected
    assert res["selected_on"] == "valid" and row["test_acc"] == res["test_bpc"] and row["metric"] == "bpc"
    assert row["best_val_acc"] == res["valid_bpc"] and row["context"] == 256
    assert res["eval_ctx"] == 256 and res["eval_score"] == 128
    assert [c["step"] for c in row["curve"]] == [2, 4]
    # the corpus: the test's file, contiguous 90/5/5 split of its bytes
    (data,) = [p for p in (out / "data").iterdir() if not p.name.startswith(".")]
    meta = json.loads((data / "meta.json").read_text())
    size = corpus.stat().st_size
    assert meta["files"] == 1 and meta["source_bytes"] == size
    sizes = [meta["splits"][s]["symbols"] for s in ("train", "valid", "test")]
    assert sizes == [size * 90 // 100, size * 5 // 100, size - size * 90 // 100 - size * 5 // 100]
    raw = corpus.read_bytes()
    assert (data / "train.bin").read_bytes() + (data / "valid.bin").read_bytes() + \
        (data / "test.bin").read_bytes() == raw
    # a rerun with other text under the same --out is refused: cells of one run share their corpus
    monkeypatch.setenv(lm.CORPUS_ENV, str(_write_text(tmp_path / "other.txt", seed=1)))
    capsys.readouterr()
    assert main(["arena", "run", "--task", "charlm", "--attention", "softmax,window", "--seeds", "0",
                 "--budget", "quick", "--device", "cpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "cells of one run share their text" in err and "Traceback" not in err


def test_charlm_task_file():
    task = load_task("charlm")
    raw = yaml.safe_load((CONFIG_DIR / "charlm.yaml").read_text())
    assert task.kind == "lm" and raw["metric"] == {"name": "bpc", "goal": "min"} and task.seeds == [0, 1, 2]
    assert set(task.default_mechanisms) == {"softmax", "softmax_ctx128", "window", "long_short",
                                             "long_short_no_dualln", "linear_elu1"}
    ids = {c["id"]: c for c in task.claims}
    assert {"long-context-helps", "ls-vs-window", "ls-noninferior-softmax", "ls-dualln", "softmax-vs-linear"} <= set(
        ids)
    assert ids["ls-noninferior-softmax"]["test"] == "noninferior" and ids["ls-noninferior-softmax"]["margin"] == 0.02
    for c in task.claims:
        assert c["a"] in task.mechanisms and c["b"] in task.mechanisms
    train = task.recipe("default")
    assert train["seq_len"] == 1024 and train["eval_ctx"] == 1024 and train["eval_score"] == 512
    # Frozen at the calibration that passed (attempt 5, benchmarks/results/arena/charlm-calibration/README.md).
    assert "CALIBRATION PASSED at attempt 5" in (CONFIG_DIR / "charlm.yaml").read_text()
    assert (train["dim"], train["depth"], train["num_heads"], train["ffn_dim"], train["batch_size"],
            train["max_steps"], train["lr"], train["warmup"]) == (256, 4, 4, 1024, 32, 6000, 1e-3, 500)
    assert train["attn_kw"] == {"softmax": {"rope": True}} and train["amp"] is True and train["device"] == "cuda"
    assert load_task("charlm").requires == "gpu"
    for label in task.default_mechanisms:
        assert lm.refusal(train, task.mechanism(label)) is None, label
    cfgs = {label: lm.cell_config(train, task.mechanism(label)) for label in task.default_mechanisms}
    short = cfgs["softmax_ctx128"]
    assert (short.seq_len, short.eval_ctx, short.eval_score) == (128, 128, 64)
    assert short.seq_len * short.batch_size == train["seq_len"] * train["batch_size"]  # tokens per step
    # one host: everything but the mixer (and the context of softmax_ctx128) is the same in every cell
    host = {k: v for k, v in vars(cfgs["softmax"]).items() if k not in ("attention", "attn_kw")}
    for label, cfg in cfgs.items():
        if label != "softmax_ctx128":
            assert {k: v for k, v in vars(cfg).items() if k not in ("attention", "attn_kw")} == host, label
    assert cfgs["long_short_no_dualln"].attn_kw["long_short"]["dual_ln"] is False
    assert cfgs["window"].attn_kw["sliding_window"]["window_size"] == \
        cfgs["long_short"].attn_kw["long_short"]["window_size"]


def test_refusals_and_missing_corpus(tmp_path, monkeypatch, capsys):
    train = load_task("charlm").recipe("quick")
    assert "causal" in lm.refusal(train, {"attention": "enhanced_linear"})
    assert "2-D token grid" in lm.refusal(train, {"attention": "cswin"})
    assert "has no causal mode" in lm.refusal(train, {"attention": "linear_cosformer"})
    # caps allow it, the options do not: refused when the host is built (meta device)
    why = lm.refusal(train, {"attention": "linear", "attn_kw": {"feature_map": "l1"}})
    assert why.startswith("the host cannot take it") and "no causal form" in why
    with pytest.raises(UserError, match="unknown mechanism option"):
        lm.refusal(train, {"attention": "softmax", "window": 3})
    with pytest.raises(UserError, match="context must be"):
        lm.cell_config(train, {"attention": "softmax", "context": 100})
    # The corpus is absent: one line saying what to install or set, before any cell starts.
    monkeypatch.setenv(lm.CORPUS_ENV, str(tmp_path / "nowhere"))
    assert main(["arena", "run", "--task", "charlm", "--attention", "softmax", "--seeds", "0", "--budget", "quick",
                 "--device", "cpu", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "nowhere does not exist" in err and "Traceback" not in err
    monkeypatch.delenv(lm.CORPUS_ENV)
    import subquad.data.char as char

    monkeypatch.setattr(char, "LINUX_DOC_SOURCES", str(tmp_path / "linux-doc"))
    task = load_task("charlm").as_dict()
    task["data"]["corpus"] = str(tmp_path / "linux-doc")
    with pytest.raises(UserError, match="apt-get install linux-doc-6.12.*SUBQUAD_ARENA_CORPUS"):
        lm.prepare_data(task, tmp_path / "data", "quick")


def test_context_rescales_every_phase():
    """`context: n` applies to every training phase: the same tokens per step at n tokens per window."""
    train = dict(load_task("charlm").recipe("default"),
                 phases=[{"seq_len": 128, "batch_size": 64, "steps": 3}, {"seq_len": 1024, "batch_size": 8,
                                                                           "steps": 2, "warmup": 0}])
    cfg = lm.cell_config(train, {"attention": "softmax", "context": 128})
    assert [(p["seq_len"], p["batch_size"], p["steps"]) for p in cfg.phases] == [(128, 64, 3), (128, 64, 2)]
    assert cfg.phases[1]["warmup"] == 0
    long = lm.cell_config(train, {"attention": "softmax"})
    assert [(p["seq_len"], p["batch_size"]) for p in long.phases] == [(128, 64), (1024, 8)]
    with pytest.raises(UserError, match="divide every phase"):
        lm.cell_config(dict(train, phases=[{"seq_len": 96, "batch_size": 8, "steps": 1}]),
                       {"attention": "softmax", "context": 64})
    with pytest.raises(UserError, match="missing"):
        lm.cell_config(dict(train, phases=[{"seq_len:128": None}]), {"attention": "softmax", "context": 64})
