"""benchmarks/int8_ort_breakdown.py: which ONNX nodes are weight GEMMs, the bounds from their share, and its rows."""

from __future__ import annotations

import csv

import pytest
import torch

from subquad.errors import UserError

from ._scripts import load_benchmark


def _graph():
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "W")
    bias = numpy_helper.from_array(np.ones(4, np.float32), "bias")
    wq = numpy_helper.from_array(np.ones((4, 4), np.int8), "Wq")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="linear"),
        helper.make_node("Add", ["h", "bias"], ["hb"], name="linear_bias"),
        helper.make_node("Add", ["hb", "x"], ["r"], name="residual"),
        helper.make_node("MatMul", ["r", "r"], ["a"], name="attention_product"),
        helper.make_node("DynamicQuantizeLinear", ["a"], ["aq", "s", "z"], name="quantize"),
        helper.make_node("MatMulInteger", ["aq", "Wq", "z"], ["y"], name="int8_linear"),
        helper.make_node("DynamicQuantizeLinear", ["a"], ["aq2", "s2", "z2"], name="quantize_unused"),
    ]
    f = TensorProto.FLOAT
    return helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [4, 4])],
                             [helper.make_tensor_value_info("y", TensorProto.INT32, [4, 4])], [w, bias, wq])


def test_table_refuses_other_files(tmp_path):
    """--table reads only this script's CSVs, and says which file is wrong."""
    bench = load_benchmark("int8_ort_breakdown")
    other = tmp_path / "other.csv"
    other.write_text("model,img_size\nx,1\n")
    for paths, match in (([], "needs the CSVs"), ([str(tmp_path / "none.csv")], "is not a file"),
                         ([str(other)], "columns differ")):
        with pytest.raises(UserError, match=match):
            bench.main(["--table", *paths])


def test_weight_gemm_nodes_and_bounds():
    """Weight GEMMs are GEMM ops with a constant second input, their bias Add and the quantize feeding them; a
    product of two activations, a residual Add and an unused quantize are not. The bounds are the speed-up over
    fp32 eager with the GEMMs free and at the peak gain, and the verdict follows them."""
    bench = load_benchmark("int8_ort_breakdown")
    assert bench.weight_gemm_nodes(_graph()) == {"linear", "linear_bias", "quantize", "int8_linear"}
    # eager 30 ms, int8 step 20 ms of which 40 % GEMMs (8 ms) at 1.5x over fp32's; peak gain 3: GEMMs at 4 ms.
    free, peak, verdict = bench.bounds(30.0, 20.0, 0.4, 1.5, 3.0, target=1.5)
    assert free == pytest.approx(30 / 12) and peak == pytest.approx(30 / 16) and verdict == "reaches"
    assert bench.bounds(27.0, 20.0, 0.4, 1.5, 3.0, target=1.5)[2] == "within reach"  # 1.35x now, 1.69x at peak
    assert bench.bounds(27.0, 20.0, 0.4, 1.5, 1.5, target=1.5)[2] == "needs GEMMs above the int8 peak"
    # free: 27 / 18 = 1.5 exactly, at the target (not out of reach); at peak 27 / 19
    assert bench.bounds(27.0, 20.0, 0.1, 1.5, 3.0, target=1.5)[2] == "needs GEMMs above the int8 peak"
    assert bench.bounds(26.0, 20.0, 0.1, 1.5, 3.0, target=1.5)[2] == "out of reach"


@pytest.mark.slow  # an ONNX export and two profiled sessions: ~9 s on a 2-core machine
def test_rows_and_refusals(tmp_path, monkeypatch):
    """One row per (model, size) on a micro model: the medians, shares and bounds consistent with each other; an
    existing output, a negative pause and an unknown model refused in one line before anything runs."""
    bench = load_benchmark("int8_ort_breakdown")
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr("subquad.backend.keep_freed_memory_from_env", lambda: False)
    monkeypatch.setattr(bench, "peak_gemm_gain", lambda **kw: 2.0)  # the 1024^3 products take seconds
    out = tmp_path / "b.csv"
    argv = ["--model", "vit_attn_micro", "--img-size", "32", "--rounds", "1", "--warmup", "0", "--block", "1",
            "--pause", "0", "--profile-steps", "2", "--threads", "1", "--out", str(out)]
    assert bench.main(argv) == 0
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == bench.COLUMNS and len(rows) == 1
    r = rows[0]
    v = {k: float(r[k]) for k in ("fp32_eager_ms", "int8_ort_ms", "int8_speedup", "int8_gemm_share", "gemm_gain",
                                  "bound_free_gemm", "bound_peak_gemm", "int8_between_share")}
    assert v["int8_speedup"] == pytest.approx(v["fp32_eager_ms"] / v["int8_ort_ms"], rel=1e-2)
    assert 0 < v["int8_gemm_share"] < 1 and v["gemm_gain"] > 0 and -0.05 < v["int8_between_share"] < 1
    assert v["bound_free_gemm"] == pytest.approx(v["fp32_eager_ms"] / (v["int8_ort_ms"] * (1 - v["int8_gemm_share"])),
                                                 rel=2e-2)
    assert v["bound_free_gemm"] > v["bound_peak_gemm"] > 0
    assert r["verdict"] in ("reaches", "out of reach", "needs GEMMs above the int8 peak", "within reach")
    assert r["rest_top"] and r["int8_weights"] == "7bit-per-channel" and r["peak_gemm_gain"] == "2.0"
    with pytest.raises(UserError, match="exists"):
        bench.main(argv)
    for bad, match in ((["--pause", "-1"], "--pause >= 0"), (["--model", "nope"], "unknown model")):
        with pytest.raises(UserError, match=match):
            bench.main(argv[:-1] + [str(tmp_path / "x.csv")] + bad)
    assert not (tmp_path / "x.csv").exists()
    table = bench.table([str(out)])
    assert table.count("\n") == 2 and "| `vit_attn_micro` | 32 |" in table and r["verdict"] in table


def test_summary_verdicts_over_processes(tmp_path):
    """--summary: a pair's int8 speed-ups from the sweep's part and every interleaved process, their median against
    the target; out of reach only when every process's peak bound is below it; single-process pairs without a sweep
    row in the second table."""
    from subquad.bench.sweep import write_csv

    bench = load_benchmark("int8_ort_breakdown")

    def row(model, size, speedup, peak, fp32_ort_ms=20.0):
        return dict(model=model, img_size=size, fp32_eager_ms=20.0, fp32_ort_ms=fp32_ort_ms, int8_speedup=speedup,
                    bound_peak_gemm=peak, rest_top="Gelu 5.0%", int8_gemm_share=0.4, gemm_gain=1.5,
                    peak_gemm_gain=2.0, bound_free_gemm=3.0, verdict="", int8_ort_ms=10.0)

    run1 = write_csv([row("a", 224, 1.4, 1.6), row("b", 224, 1.2, 1.4), row("c", 512, 1.3, 1.45, 12.0)],
                     tmp_path / "run1.csv", bench.COLUMNS)
    run2 = write_csv([row("a", 224, 1.45, 1.4), row("b", 224, 1.3, 1.45)], tmp_path / "run2.csv", bench.COLUMNS)
    parts = tmp_path / "parts"
    write_csv([{"model": "a", "infer_img_size": "224x224", "precision": "int8", "backend": "onnxruntime",
                "speedup_vs_fp32_eager": 1.9},
               {"model": "b", "infer_img_size": "224x224", "precision": "fp32", "backend": "compile",
                "speedup_vs_fp32_eager": 3.0}], parts / "a.csv",
              ["model", "infer_img_size", "precision", "backend", "speedup_vs_fp32_eager"])
    text = bench.summary([str(run1), str(run2)], str(parts))
    first, second = text.split("\n\n")
    assert "| `a` | 224 | 1.90; 1.40, 1.45 | 1.45x | 1.00, 1.00 | 1.60, 1.40 | misses (within reach at peak) |" in first
    assert "| `b` | 224 | 1.20, 1.30 | 1.25x | 1.00, 1.00 | 1.40, 1.45 | out of reach by int8 weights |" in first
    # c: int8 misses, fp32 ONNX Runtime (20 / 12 = 1.67x) reaches
    assert second.splitlines()[2] == "| `c` | 512 | 1.30x | 1.67x | 1.45x | reaches | Gelu 5.0% |"
    with pytest.raises(UserError, match="not a folder"):
        bench.summary([str(run1)], str(tmp_path / "none"))
    with pytest.raises(UserError, match="needs the folder"):
        bench.main(["--summary", "--sweep"])


def test_nan_pause_refused_and_peak_gain_positive(tmp_path):
    """A NaN --pause is refused in one line (not a ValueError from time.sleep); the peak gain is a positive ratio."""
    bench = load_benchmark("int8_ort_breakdown")
    with pytest.raises(UserError, match="--pause >= 0"):
        bench.main(["--pause", "nan", "--out", str(tmp_path / "x.csv")])
    assert bench.peak_gemm_gain(rounds=1, n=32, pause=0) > 0
