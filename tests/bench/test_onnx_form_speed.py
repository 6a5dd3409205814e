"""benchmarks/onnx_form_speed.py: two ONNX files timed side by side with fp32 eager, their outputs compared."""

from __future__ import annotations

import csv

import onnx
import pytest
from onnx import TensorProto, helper

from subquad.errors import UserError

from ._scripts import load_benchmark


def _file(path, scale: float, shape=(1, 3, 16, 16)) -> str:
    """A handmade ONNX graph Y = mean over H, W of X * scale: an input of the model's shape, a known output."""
    s = helper.make_tensor("S", TensorProto.FLOAT, [], [scale])
    axes = helper.make_tensor("axes", TensorProto.INT64, [2], [2, 3])
    graph = helper.make_graph([helper.make_node("Mul", ["X", "S"], ["M"]),
                               helper.make_node("ReduceMean", ["M", "axes"], ["Y"], keepdims=0)], "g",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, list(shape[:2]))], [s, axes])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return str(path)


def test_row_ratios_and_refusals(tmp_path, monkeypatch):
    bench = load_benchmark("onnx_form_speed")
    monkeypatch.setattr(bench.torch, "set_num_threads", lambda n: None)  # --threads 1 must not outlive the test
    a, b = _file(tmp_path / "a.onnx", 1.0), _file(tmp_path / "b.onnx", 1.5)
    out = tmp_path / "f.csv"
    argv = ["--model", "vit_attn_micro", "--img-size", "16", "--before", a, "--after", b, "--rounds", "3",
            "--block", "1", "--pause", "0", "--threads", "1", "--out", str(out)]
    assert bench.main(argv) == 0
    with open(out, newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert list(row) == bench.COLUMNS
    assert (row["model"], row["img_size"], row["before"], row["after"]) == ("vit_attn_micro", "16", "a.onnx", "b.onnx")
    eager, before, after = (float(row[k]) for k in ("fp32_eager_ms", "before_ms", "after_ms"))
    assert min(eager, before, after) > 0
    assert float(row["after_vs_before"]) == pytest.approx(before / after, rel=1e-2)
    assert float(row["before_vs_fp32_eager"]) == pytest.approx(eager / before, rel=1e-2)
    assert float(row["after_vs_before_min"]) <= float(row["after_vs_before_max"])
    assert float(row["max_rel_diff"]) == pytest.approx(0.5, rel=1e-5)  # the outputs differ by the scale
    assert row["cpu"] and row["threads"] == "1" and row["rounds"] == "3"
    with pytest.raises(UserError, match="exists"):
        bench.main(argv)
    new = str(tmp_path / "g.csv")
    with pytest.raises(UserError, match="no such file"):
        bench.main([*argv[:5], str(tmp_path / "missing.onnx"), *argv[6:-1], new])
    wide = _file(tmp_path / "w.onnx", 1.0, (1, 3, 16, 24))
    with pytest.raises(UserError, match=r"not \[1, 3, 16, 16\]"):
        bench.main([*argv[:7], wide, *argv[8:-1], new])
    with pytest.raises(UserError, match="unknown model"):
        bench.main(["--model", "no_such_model", *argv[2:-1], new])
    with pytest.raises(UserError, match="--rounds must be positive"):
        bench.main([*argv[:-1], new, "--rounds", "0"])
    with pytest.raises(UserError, match="--threads must be positive"):
        bench.main([*argv[:-1], new, "--threads", "0"])
    batch2 = _file(tmp_path / "b2.onnx", 1.0, (2, 3, 16, 16))
    with pytest.raises(UserError, match=r"not \[1, 3, 16, 16\]"):
        bench.main([*argv[:7], batch2, *argv[8:-1], new])
    assert not (tmp_path / "g.csv").exists()
