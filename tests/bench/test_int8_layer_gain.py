"""benchmarks/int8_layer_gain.py: the int8 layers' gain at a model's own calls, and the Amdahl columns from it."""

from __future__ import annotations

import csv

import pytest
import torch

from subquad.errors import UserError
from subquad.layers import int8

from ._scripts import load_benchmark

TOL = dict(rel=1e-2, abs=2e-3)  # the CSV rounds times to 1 us and ratios to 3 decimals


def test_rows_columns_and_refusals(tmp_path, monkeypatch):
    """One row per (model, size) with every call recorded (LiSA's channel-major q/k/v among them), the sums and
    ratios consistent with each other; the int8 layer code restored; an existing output, an unknown model and a
    model without nn.Linear refused in one line."""
    bench = load_benchmark("int8_layer_gain")
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr("subquad.backend.keep_freed_memory_from_env", lambda: False)
    real = int8._int8_linear_impl
    out = tmp_path / "g.csv"
    argv = ["--model", "lisanet_micro", "--img-size", "32", "48", "--rounds", "1", "--threads", "1", "--out", str(out)]
    assert bench.main(argv) == 0
    assert int8._int8_linear_impl is real
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == bench.COLUMNS
    assert [(r["model"], r["img_size"]) for r in rows] == [("lisanet_micro", "32"), ("lisanet_micro", "48")]
    for r in rows:
        v = {k: float(r[k]) for k in bench.COLUMNS[3:16]}
        assert v["calls"] > 0 and min(v[k] for k in ("fp32_step_ms", "int8_step_ms", "fp32_linear_ms",
                                                     "int8_layer_ms", "int_mm_ms")) > 0
        assert v["int8_speedup_vs_fp32_eager"] == pytest.approx(v["fp32_step_ms"] / v["int8_step_ms"], **TOL)
        assert v["quant_dequant_ms"] == pytest.approx(v["int8_layer_ms"] - v["int_mm_ms"], abs=2e-3)
        assert v["layer_gain"] == pytest.approx(v["fp32_linear_ms"] / v["int8_layer_ms"], **TOL)
        rest = max(v["fp32_step_ms"] - v["fp32_linear_ms"], 0)
        assert v["predicted_speedup"] == pytest.approx(v["fp32_step_ms"] / (rest + v["int8_layer_ms"]), **TOL)
        assert v["bound_int_mm_only"] == pytest.approx(v["fp32_step_ms"] / (rest + v["int_mm_ms"]), **TOL)
        room = v["fp32_step_ms"] / 1.5 - rest
        if room > 0:
            assert float(r["layer_gain_for_1p5"]) == pytest.approx(v["fp32_linear_ms"] / room, **TOL)
        else:
            assert r["layer_gain_for_1p5"] == ""
    with pytest.raises(UserError, match="exists"):
        bench.main(argv)
    with pytest.raises(UserError, match="unknown model"):
        bench.main(["--model", "no_such_model", "--out", str(tmp_path / "e.csv")])


def test_recorded_calls_name_both_forms():
    """The spy sees the token-major calls (MLP) and LiSA's channel-major q/k/v, with their shapes and bias flags."""
    from subquad import create_model
    from subquad.layers.int8 import quantize_int8

    bench = load_benchmark("int8_layer_gain")
    q = quantize_int8(create_model("lisanet_micro", num_classes=10))
    calls = bench.record_calls(q, torch.randn(1, 3, 32, 32))
    assert any(c[2] for c in calls) and any(not c[2] for c in calls)
    assert all(len(c[0]) >= 2 and c[0][-1] == c[1][1] for c in calls)
    assert int8._int8_linear_impl.__name__ == "_int8_linear_impl"
