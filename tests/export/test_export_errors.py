"""`subquad export` refuses bad input in one line, before any tracing."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import subquad
from subquad import export as ex
from subquad.errors import UserError
from subquad_cli.__main__ import main


@pytest.fixture(scope="module")
def micro():
    return subquad.create_model("l2vit_micro").eval()


def test_unknown_format_and_wrong_suffix(tmp_path, micro):
    with pytest.raises(UserError, match="unknown export format 'tflite'; choose one of onnx, pt2"):
        ex.export_model(micro, "tflite", tmp_path / "m.tflite")
    with pytest.raises(UserError, match=r"must end in \.onnx for --format onnx"):
        ex.export_model(micro, "onnx", tmp_path / "m.pt2")


def test_out_holding_another_kind_of_file_is_refused(tmp_path, micro):
    other = tmp_path / "weights.pt2"
    other.write_bytes(b"not an export")
    with pytest.raises(UserError, match="exists and is not an earlier pt2 export"):
        ex.export_model(micro, "pt2", other)
    assert other.read_bytes() == b"not an export"
    onnx = tmp_path / "m.onnx"
    onnx.write_text("{}")
    with pytest.raises(UserError, match="is not an earlier onnx export"):
        ex.export_model(micro, "onnx", onnx)
    with pytest.raises(UserError, match="folder .* does not exist"):
        ex.export_model(micro, "pt2", tmp_path / "missing" / "m.pt2")


def test_sizes_the_model_cannot_take(tmp_path, micro):
    stride, low = ex.admissible(micro)
    assert (stride, low) == (micro.total_stride, micro.total_stride)
    with pytest.raises(UserError, match=f"takes sides from {low} to 2048, got 8x32"):
        ex.export_model(micro, "pt2", tmp_path / "m.pt2", (8, 32))
    with pytest.raises(UserError, match=f"takes sides from {low} to 2048, got {low - 1}x40"):
        ex.export_model(micro, "pt2", tmp_path / "m.pt2", (low - 1, 40), dynamic=True)
    with pytest.raises(UserError, match="takes sides from"):
        ex.export_model(micro, "pt2", tmp_path / "m.pt2", (32, 4096))


def test_missing_extra_names_it(tmp_path, micro, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "onnxscript" else real(n, *a))
    with pytest.raises(UserError, match=r"needs the export extra \(missing: onnxscript\).*subquad\[export\]"):
        ex.export_model(micro, "onnx", tmp_path / "m.onnx")


def test_relative_error():
    ref = torch.tensor([1.0, -4.0])
    assert ex.relative_error(ref, ref) == 0.0
    assert ex.relative_error(ref + torch.tensor([0.0, 0.4]), ref) == pytest.approx(0.1)


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["export", "--format", "pt2", "--out", str(tmp_path / "m.pt2")]) == 2
    assert "give --model NAME, --checkpoint PATH, or both" in capsys.readouterr().err
    assert main(["export", "--model", "l2vit_micro", "--format", "onnx", "--out", str(tmp_path / "m.pt2")]) == 2
    assert "must end in .onnx" in capsys.readouterr().err
    assert main(["export", "--model", "l2vit_micro", "--format", "pt2", "--img-size", "1", "2", "3",
                 "--out", str(tmp_path / "m.pt2")]) == 2
    assert "--img-size '1 2 3': expected one size, S or HxW" in capsys.readouterr().err
    for bad in (["0x32"], ["32x"], ["ax3"]):
        assert main(["export", "--model", "l2vit_micro", "--format", "pt2", "--img-size", *bad,
                     "--out", str(tmp_path / "m.pt2")]) == 2
        assert f"--img-size {bad[0]!r}: expected a positive side S or HxW" in capsys.readouterr().err
    assert main(["export", "--model", "nope_micro", "--format", "pt2", "--out", str(tmp_path / "m.pt2")]) == 2
    assert "unknown model 'nope_micro'" in capsys.readouterr().err
    assert torch.is_grad_enabled()  # the command leaves no global state behind
