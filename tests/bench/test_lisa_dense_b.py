"""benchmarks/lisa_dense_b.py: LiSA's kernel path as FFT correlations against the dense product, per grid and model."""

from __future__ import annotations

import csv

import pytest
import torch

from subquad.attention.functional import structure_aware as fsa
from subquad.errors import UserError

from ._scripts import load_benchmark


def test_rows_and_refusals(tmp_path, monkeypatch):
    """Grid rows and model rows (fp32 and bf16) with both sides timed and agreeing; the dense limit restored; an
    existing output and a bad grid refused in one line."""
    bench = load_benchmark("lisa_dense_b")
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # --threads 1 must not outlive the test
    monkeypatch.setattr("subquad.backend.keep_freed_memory_from_env", lambda: False)  # the process keeps its malloc
    out = tmp_path / "d.csv"
    argv = ["--grids", "5x7", "3x4", "--heads", "2", "--head-dim", "4", "--patterns", "3", "--models",
            "lisanet_micro", "--img-size", "48", "--rounds", "1", "--threads", "1", "--out", str(out)]
    limit = fsa.DENSE_B_TOKENS_PER_PATTERN
    where, dense_calls = [], []  # which part of the script ran the dense path, at which limit
    real_dense, real_model_rows = fsa._dense_kernel_path, bench.model_rows
    monkeypatch.setattr(fsa, "_dense_kernel_path", lambda *a: dense_calls.append(
        (where[-1] if where else "grid", fsa.DENSE_B_TOKENS_PER_PATTERN)) or real_dense(*a))
    monkeypatch.setattr(bench, "model_rows", lambda *a: where.append("model") or real_model_rows(*a))
    assert bench.main(argv) == 0
    assert fsa.DENSE_B_TOKENS_PER_PATTERN == limit
    model_limits = {lim for part, lim in dense_calls if part == "model"}
    assert model_limits == {limit}, f"the model rows' dense side did not take the dense path: {dense_calls}"
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == bench.COLUMNS
    assert [(r["kind"], r["name"], r["precision"]) for r in rows] == [
        ("grid", "5x7", ""), ("grid", "3x4", ""), ("model", "lisanet_micro", "fp32"),
        ("model", "lisanet_micro", "bf16")]
    assert [r["tokens"] for r in rows[:2]] == ["35", "12"]
    for r in rows:
        assert float(r["fft_ms"]) > 0 and float(r["dense_ms"]) > 0
        assert float(r["dense_vs_fft"]) == pytest.approx(float(r["fft_ms"]) / float(r["dense_ms"]), rel=2e-2)
        assert float(r["rel_diff"]) < (2e-2 if r["precision"] == "bf16" else 1e-5), r  # same operator both ways
    with pytest.raises(UserError, match="exists"):
        bench.main(argv)
    with pytest.raises(UserError, match="'5y7' is not HxW"):
        bench.main(["--grids", "5y7", "--out", str(tmp_path / "e.csv")])
