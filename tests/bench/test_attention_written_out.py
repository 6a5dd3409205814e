"""benchmarks/attention_written_out.py: the written-out and fused sides of one compiled attention call, alternating."""

from __future__ import annotations

import csv

import pytest
import torch

from subquad.errors import UserError

from ._scripts import load_benchmark


def _fake_compile(log):
    def compile_(fn):
        def run(*a):
            from subquad import backend

            log.append(backend.get_backend())
            return fn(*a)
        return run
    return compile_


def test_sides_alternate_and_rows_are_written(tmp_path, monkeypatch):
    """Both sides are called once per round (fused under 'plain'), the ratio is the medians' ratio, the CSV has the
    columns, and an existing output or a bad count is refused in one line. torch.compile stands in for an identity
    wrapper: the script's bookkeeping is tested, not inductor."""
    bench = load_benchmark("attention_written_out")
    log = []
    monkeypatch.setattr(torch, "compile", _fake_compile(log))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(bench, "SHAPES", [((1, 2, 5, 7, 4), "float", "tiny"), ((2, 1, 3, 3, 4), "bool", "tiny bool")])
    out = tmp_path / "a.csv"
    assert bench.main(["--rounds", "3", "--warmup", "1", "--threads", "1", "--out", str(out)]) == 0
    assert log.count("plain") == log.count("auto") == 2 * (1 + 3)
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == bench.COLUMNS and [r["mask"] for r in rows] == ["float", "bool"]
    for r in rows:
        w, f_ = float(r["written_ms"]), float(r["fused_ms"])
        assert w > 0 and f_ > 0 and float(r["fused_over_written"]) == pytest.approx(f_ / w, rel=2e-2)
    assert rows[0]["logits"] == str(1 * 2 * 5 * 7) and rows[0]["shape"] == "1x2x5x7x4"
    with pytest.raises(UserError, match="exists"):
        bench.main(["--out", str(out)])
    with pytest.raises(UserError, match="must be positive"):
        bench.main(["--rounds", "0", "--out", str(tmp_path / "b.csv")])


def test_force_bool_times_the_written_out_form(monkeypatch):
    """--force-bool: a bool-mask row's written side goes through sdpa_written_out itself, which the dispatch would
    not pick for a bool mask."""
    bench = load_benchmark("attention_written_out")
    monkeypatch.setattr(torch, "compile", lambda fn: fn)
    called = []
    from subquad.attention.functional import softmax as fs

    real = fs.sdpa_written_out
    monkeypatch.setattr(fs, "sdpa_written_out", lambda *a: called.append(1) or real(*a))
    bench.measure((1, 1, 3, 3, 4), "bool", rounds=2, warmup=0, force_bool=False)
    assert not called
    bench.measure((1, 1, 3, 3, 4), "bool", rounds=2, warmup=0, force_bool=True)
    assert len(called) == 2
