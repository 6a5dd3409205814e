"""Exported files agree with eager, and a file that disagrees is never left behind.

The default suite exports three micro models (window attention with padding, LiSA's FFTs, the L2ViT stages) at their
default size, and one dynamic-size export, checked at two sizes and two batch sizes.
"""

from __future__ import annotations

import pytest
import timm
import torch

import subquad  # noqa: F401  (registers the models)
from subquad import export as ex

# LiSA's ONNX file computes its FFTs with real DFT matrices (ONNX has no complex tensors; subquad.backend.real_dft).
CASES = [("l2vit_micro", "pt2"), ("l2vit_micro", "onnx"), ("flatten_swin_micro", "pt2"),
         ("flatten_swin_micro", "onnx"), ("lisanet_micro", "pt2"), ("lisanet_micro", "onnx")]


@pytest.mark.parametrize("name, fmt", CASES)
def test_micro_export_matches_eager(name, fmt, tmp_path):
    m = timm.create_model(name).eval()
    res = ex.export_model(m, fmt, tmp_path / f"m.{fmt}", log=lambda *a: None)
    size = list(m.pretrained_cfg["input_size"][1:])
    assert [c["size"] for c in res["checks"]] == [size]
    assert res["checks"][0]["rel_err"] < ex.RTOL
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"m.{fmt}"]  # no temporary left


def test_dynamic_export_runs_at_other_sizes_and_batches(tmp_path):
    m = timm.create_model("vit_attn_micro").eval()
    stride = m.total_stride
    res = ex.export_model(m, "pt2", tmp_path / "m.pt2", (8 * stride, 8 * stride), dynamic=True, log=lambda *a: None)
    assert len(res["checks"]) == 2 and res["checks"][1]["size"] == [9 * stride, 10 * stride]
    assert all(c["rel_err"] < ex.RTOL for c in res["checks"])
    prog = torch.export.load(str(tmp_path / "m.pt2")).module()
    x = torch.randn(3, 3, 6 * stride, 11 * stride)
    with torch.no_grad():
        assert ex.relative_error(prog(x), m(x)) < ex.RTOL


def test_dynamic_window_model_takes_single_window_stages(tmp_path):
    """l2vit_micro's window stages: one pt2 program runs at its default size, where the last stages hold a single
    (padded) window, and at larger, non-square sizes and batches."""
    m = timm.create_model("l2vit_micro").eval()
    stride = m.total_stride
    s0 = m.pretrained_cfg["input_size"][1]
    res = ex.export_model(m, "pt2", tmp_path / "m.pt2", (7 * stride, 7 * stride), dynamic=True,
                          check_sizes=[(s0, s0), (2 * stride, 3 * stride)], log=lambda *a: None)
    assert all(c["rel_err"] < ex.RTOL for c in res["checks"])
    prog = torch.export.load(str(tmp_path / "m.pt2")).module()
    x = torch.randn(3, 3, s0, 5 * stride)
    with torch.no_grad():
        assert ex.relative_error(prog(x), m(x)) < ex.RTOL


def test_a_disagreeing_file_is_removed(tmp_path, monkeypatch):
    m = timm.create_model("vit_attn_micro").eval()
    monkeypatch.setattr(ex, "_run_file", lambda path, fmt, x: m(x) + 1.0)
    with pytest.raises(ex.ExportCheckError, match="disagrees with eager"):
        ex.export_model(m, "pt2", tmp_path / "m.pt2", log=lambda *a: None)
    assert list(tmp_path.iterdir()) == []


def test_cli_export_writes_a_checked_file(tmp_path, capsys):
    from subquad.cli.__main__ import main

    out = tmp_path / "vit.pt2"
    assert main(["export", "--model", "vit_attn_micro", "--format", "pt2", "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out and out.is_file()
    assert main(["export", "--model", "vit_attn_micro", "--format", "pt2", "--out", str(out)]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert torch.is_grad_enabled()
