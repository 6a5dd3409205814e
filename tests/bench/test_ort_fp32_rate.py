"""benchmarks/ort_fp32_rate.py: GEMM and model rows, ONNX Runtime with and without graph optimizations."""

from __future__ import annotations

import csv

import pytest
from onnx import TensorProto, helper

from subquad.errors import UserError

from ._scripts import load_benchmark


def test_rows_and_refusals(tmp_path):
    rate = load_benchmark("ort_fp32_rate")
    out = tmp_path / "r.csv"
    argv = ["--model", "vit_attn_micro", "--img-size", "16", "--shapes", "8x4x6,5x7x3", "--rounds", "1",
            "--min-time", "0.001", "--threads", "1", "--out", str(out)]
    assert rate.main(argv) == 0
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == rate.COLUMNS
    assert [(r["kind"], r["name"], r["engine"]) for r in rows] == [
        ("gemm", "8x4x6", "torch"), ("gemm", "8x4x6", "torch_onednn"), ("gemm", "8x4x6", "onnxruntime"),
        ("gemm", "5x7x3", "torch"), ("gemm", "5x7x3", "torch_onednn"), ("gemm", "5x7x3", "onnxruntime"),
        ("model", "vit_attn_micro", "torch"), ("model", "vit_attn_micro", "torch_onednn"),
        ("model", "vit_attn_micro", "onnxruntime_opt_all"), ("model", "vit_attn_micro", "onnxruntime_opt_none")]
    assert all(float(r["ms"]) > 0 and float(r["gflops"]) > 0 for r in rows)
    assert {r["ratio_vs_torch"] for r in rows if r["engine"] == "torch"} == {"1.0"}
    assert float(rows[0]["gmacs"]) == pytest.approx(8 * 4 * 6 / 1e9)
    ort_rows = [r for r in rows if r["engine"].startswith("onnxruntime_opt")]
    assert all(0 <= int(r["const_nodes"]) < int(r["nodes"]) for r in ort_rows)
    assert all(r["const_nodes"] == r["nodes"] == "" for r in rows if r["engine"].startswith("torch"))
    with pytest.raises(UserError, match="exists"):
        rate.main(argv)
    for bad in ("8x4", "8xfourx6", "0x4x6"):
        with pytest.raises(UserError, match="--shapes"):
            rate.main(argv[:5] + [bad] + argv[6:-1] + [str(tmp_path / "new.csv")])


def test_const_nodes_counts_what_depends_on_initializers_only(tmp_path):
    rate = load_benchmark("ort_fp32_rate")
    w = helper.make_tensor("W", TensorProto.FLOAT, [2, 2], [1.0, 2.0, 3.0, 4.0])
    nodes = [helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.FLOAT, [], [2.0])),
             helper.make_node("Mul", ["W", "c"], ["w2"]),  # parameter-only: foldable
             helper.make_node("Transpose", ["w2"], ["wt"]),  # parameter-only: foldable
             helper.make_node("MatMul", ["X", "wt"], ["Y"])]  # depends on the input
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 2])], [w])
    path = tmp_path / "g.onnx"
    path.write_bytes(helper.make_model(graph).SerializeToString())
    assert rate.const_nodes(path) == (2, 4)


@pytest.mark.skipif(not __import__("torch").backends.mkldnn.is_available(), reason="this torch build has no oneDNN")
def test_onednn_linears_swaps_only_linear_layers_and_keeps_values():
    import torch

    rate = load_benchmark("ort_fp32_rate")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.GELU(), torch.nn.LayerNorm(7), torch.nn.Linear(7, 3))
    swapped = rate.onednn_linears(net)
    assert [type(m).__name__ for m in swapped] == ["MkldnnLinear", "GELU", "LayerNorm", "MkldnnLinear"]
    assert type(net[0]) is torch.nn.Linear  # the original is left as it was
    x = torch.randn(2, 9, 5)  # odd token count, 3-D as in a transformer block
    with torch.no_grad():
        torch.testing.assert_close(swapped(x), net(x), rtol=1e-5, atol=1e-5)
