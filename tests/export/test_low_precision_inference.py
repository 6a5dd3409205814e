"""bf16 eval and int8 ONNX export on a micro model with trained weights: top-1 on held-out digits within 0.5 points
of fp32, and the predicted labels agree."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import torch.nn.functional as F

from subquad import backend
from subquad.data.registry import open_source
from subquad.engine.checkpoint import save_weights, write_json
from subquad.engine.classify import eval_loader
from subquad.models import create_model
from subquad_cli.__main__ import main

# The digits eval transform of `subquad train --data digits --img-size 32` (resize only, mean = std = 0.5).
DCFG = {"img_size": 32, "in_chans": 3, "mean": [0.5] * 3, "std": [0.5] * 3, "interpolation": "", "crop_pct": None,
        "aug": "none", "source_aug": "none", "native_size": 8, "model_kwargs": {}}
# Label agreement with fp32 on the held-out split (364 images): at most 3 of them may change (measured on AVX512-BF16 /
# VNNI: bf16 99.7 %, int8 99.5 %; top-1 84.9 % fp32, 85.2 % bf16, 84.9 % int8).
MIN_AGREEMENT = 0.99


def _tensors(source, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*eval_loader(source, split, dict(DCFG), 512))
    return torch.cat(xs), torch.cat(ys)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """l2vit_micro trained for 24 AdamW steps on digits at 32 x 32 (~85 % held-out top-1), saved as a checkpoint
    with the sidecar `subquad train` writes; the held-out test split as tensors."""
    torch.manual_seed(0)
    source = open_source("digits", need_val=False)
    xtr, ytr = _tensors(source, "train")
    model = create_model("l2vit_micro", num_classes=10)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(24):
        idx = torch.randint(0, len(xtr), (64,), generator=gen)
        loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    run = tmp_path_factory.mktemp("lowp") / "run"
    run.mkdir()
    save_weights(model, run / "best.safetensors")
    write_json({"arch": "l2vit_micro", "classes": source.classes, "num_classes": 10, "data_config": DCFG,
                "args": {"model": "l2vit_micro", "data": "digits", "img_size": 32}, "weights": "best.safetensors"},
               run / "best.json")
    x, y = _tensors(source, "test")
    with torch.no_grad():
        ref = model(x)
    return {"run": run, "model": model, "x": x, "y": y, "ref": ref}


def _top1(logits: torch.Tensor, y: torch.Tensor) -> float:
    return 100.0 * float((logits.argmax(1) == y).double().mean())


def test_fixture_is_trained(trained):
    assert _top1(trained["ref"], trained["y"]) > 70  # a model that learned, not chance (10 %)


def test_bf16_keeps_top1_and_labels(trained):
    if not backend.cpu_features().bf16:
        pytest.skip("this CPU has no native bf16 arithmetic: bf16 falls back to fp32 (tested with a faked detector)")
    with torch.no_grad(), backend.precision_context(backend.resolve_precision("bf16"), "cpu"):
        got = trained["model"](trained["x"])
    assert got.dtype == torch.bfloat16  # the classifier ran in bf16, not in a silent fp32 fallback
    got = got.float()
    agree = float((got.argmax(1) == trained["ref"].argmax(1)).double().mean())
    assert agree >= MIN_AGREEMENT, agree
    assert abs(_top1(got, trained["y"]) - _top1(trained["ref"], trained["y"])) <= 0.5


def test_int8_eager_keeps_top1_and_labels(trained):
    from subquad.layers.int8 import Int8DynamicLinear, quantize_int8

    q = quantize_int8(trained["model"])
    assert sum(isinstance(m, Int8DynamicLinear) for m in q.modules()) >= 4  # the GEMMs really are int8
    with torch.no_grad():
        got = q(trained["x"])
    assert got.dtype == torch.float32
    assert not torch.equal(got, trained["ref"])  # not a silent float path
    agree = float((got.argmax(1) == trained["ref"].argmax(1)).double().mean())
    assert agree >= MIN_AGREEMENT, agree
    assert abs(_top1(got, trained["y"]) - _top1(trained["ref"], trained["y"])) <= 0.5


def test_eval_cli_precision(trained, tmp_path, capsys):
    rows = {}
    for p in ("fp32", "bf16", "int8"):
        res = tmp_path / f"{p}.json"
        assert main(["eval", "--checkpoint", str(trained["run"]), "--precision", p, "--results-file", str(res),
                     "--device", "cpu"]) == 0
        rows[p] = json.loads(res.read_text())
    assert rows["fp32"]["top1"] == pytest.approx(_top1(trained["ref"], trained["y"]), abs=1e-3)
    assert rows["bf16"]["precision"] == backend.resolve_precision("bf16")
    assert abs(rows["bf16"]["top1"] - rows["fp32"]["top1"]) <= 0.5
    assert rows["int8"]["precision"] == backend.resolve_precision("int8")
    assert abs(rows["int8"]["top1"] - rows["fp32"]["top1"]) <= 0.5


def test_eval_cli_bf16_falls_back_on_a_cpu_without_bf16(trained, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(backend, "cpu_features", lambda: backend.CpuFeatures(False, False, False, "test"))
    monkeypatch.setattr(backend, "_fallback_warned", set())
    res = tmp_path / "r.json"
    with caplog.at_level(logging.WARNING, logger="subquad.backend"):
        for _ in range(2):
            assert main(["eval", "--checkpoint", str(trained["run"]), "--precision", "bf16", "--limit", "32",
                         "--results-file", str(res), "--overwrite", "--device", "cpu"]) == 0
            assert json.loads(res.read_text())["precision"] == "fp32"
    warned = [r.getMessage() for r in caplog.records if "no native bf16" in r.getMessage()]
    assert len(warned) == 1 and "running fp32 instead" in warned[0]


@pytest.mark.parametrize("cmd", ["eval", "predict"])
def test_unknown_precision_refused(trained, cmd, capsys, tmp_path):
    extra = [str(tmp_path)] if cmd == "predict" else []
    assert main([cmd, "--checkpoint", str(trained["run"]), "--precision", "fp16", "--device", "cpu", *extra]) == 2
    err = capsys.readouterr().err
    assert "--precision 'fp16' is not a precision; choose one of fp32, bf16" in err and "Traceback" not in err


def test_predict_cli_bf16(trained, tmp_path, capsys):
    from subquad.data.small import save_digits_image

    img = tmp_path / "d.png"
    label = save_digits_image(img, 5)
    out = {}
    for p in ("fp32", "bf16"):
        js = tmp_path / f"{p}.json"
        assert main(["predict", "--checkpoint", str(trained["run"]), str(img), "--precision", p, "--json", str(js),
                     "--device", "cpu"]) == 0
        out[p] = json.loads(js.read_text())[0]["top"]
    assert out["bf16"][0]["class"] == out["fp32"][0]["class"]
    assert abs(out["bf16"][0]["prob"] - out["fp32"][0]["prob"]) < 0.05
    assert isinstance(label, int)


def test_int8_export_keeps_top1_and_labels(trained, tmp_path, capsys):
    import onnxruntime as ort

    out = tmp_path / "m_int8.onnx"
    assert main(["export", "--checkpoint", str(trained["run"]), "--format", "onnx", "--quantize", "int8",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "int8 (7bit-per-channel weights) against eager fp32 (held-out images): top-1 agreement" in printed
    assert not list(tmp_path.glob(".*"))  # the temporary files are gone
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert sess.get_modelmeta().custom_metadata_map["subquad.quantize"].startswith("int8")
    ops = {n.op_type for n in __import__("onnx").load(str(out)).graph.node}
    assert "MatMulInteger" in ops or "DynamicQuantizeMatMul" in ops
    (got,) = sess.run(None, {sess.get_inputs()[0].name: trained["x"].numpy()})
    got = torch.from_numpy(got)
    agree = float((got.argmax(1) == trained["ref"].argmax(1)).double().mean())
    assert agree >= MIN_AGREEMENT, agree
    assert abs(_top1(got, trained["y"]) - _top1(trained["ref"], trained["y"])) <= 0.5
    # The project's rule: an existing output is refused without --overwrite, and is left as it was.
    before = out.read_bytes()
    assert main(["export", "--checkpoint", str(trained["run"]), "--format", "onnx", "--quantize", "int8",
                 "--out", str(out)]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err and out.read_bytes() == before


def test_int8_export_at_a_non_square_size_checks_on_held_out_images(trained, tmp_path, capsys):
    """`--img-size HxW` with a checkpoint: the checkpoint is loaded at H x W and the int8 check after writing runs
    on held-out images made at that shape (before, it loaded at H x H and fell back to random inputs)."""
    out = tmp_path / "wide.onnx"
    assert main(["export", "--checkpoint", str(trained["run"]), "--format", "onnx", "--quantize", "int8",
                 "--img-size", "32x48", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "int8 (7bit-per-channel weights) against eager fp32 (held-out images): top-1 agreement" in printed
    import onnxruntime as ort

    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert sess.get_inputs()[0].shape[-2:] == [32, 48]


@pytest.mark.parametrize("argv, msg", [(["--quantize", "int4"], "--quantize 'int4' is not supported; choose one of "
                                        "int8"),
                                       (["--quantize", "int8", "--format", "pt2"], "--quantize int8 needs --format "
                                        "onnx")])
def test_quantize_errors(argv, msg, tmp_path, capsys):
    fmt = [] if "--format" in argv else ["--format", "onnx"]
    suffix = ".pt2" if "pt2" in argv else ".onnx"
    assert main(["export", "--model", "l2vit_micro", *fmt, *argv, "--out", str(tmp_path / f"m{suffix}")]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err and not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv, msg", [(["--int8-weights", "8bit"], "--int8-weights 8bit needs --quantize int8"),
                                       (["--quantize", "int8", "--int8-weights", "6bit"],
                                        "--int8-weights '6bit' is unknown; choose one of 7bit, 8bit, 7bit-per-channel, "
                                        "8bit-per-channel")])
def test_int8_weights_errors(argv, msg, tmp_path, capsys):
    assert main(["export", "--model", "l2vit_micro", "--format", "onnx", *argv, "--out", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err and not list(tmp_path.iterdir())


def test_int8_weights_reach_the_file(trained, tmp_path, capsys):
    """`--int8-weights 7bit` is the file's scheme: its metadata names it and its weight scales are one per tensor
    (the default's are one per output channel)."""
    import onnx
    from onnx import numpy_helper

    out = tmp_path / "m7.onnx"
    assert main(["export", "--checkpoint", str(trained["run"]), "--format", "onnx", "--quantize", "int8",
                 "--int8-weights", "7bit", "--out", str(out)]) == 0
    assert "int8 (7bit weights) against eager fp32 (held-out images)" in capsys.readouterr().out
    model = onnx.load(str(out))
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["subquad.quantize"].endswith(", 7bit weights")
    weights = [numpy_helper.to_array(t) for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8]
    scales = [numpy_helper.to_array(t) for t in model.graph.initializer if t.name.endswith("_scale")]
    assert weights and max(int(abs(w.astype(int)).max()) for w in weights) == 64
    assert scales and all(sc.ndim == 0 for sc in scales)


def test_precision_accuracy_benchmark(trained, tmp_path, capsys):
    """benchmarks/precision_accuracy.py on the trained checkpoint: fp32 eager is the reference row, bf16 eager keeps
    its top-1 and labels, the rows carry the binding columns, and an existing --out is refused untouched."""
    import csv

    from tests.bench._scripts import load_benchmark

    bench = load_benchmark("precision_accuracy")
    out = tmp_path / "acc.csv"
    assert bench.main(["--checkpoint", str(trained["run"]), "--paths", "bf16-eager,int8-onnxruntime",
                       "--int8-weights", "7bit,8bit-per-channel", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == bench.COLUMNS
    assert [(r["precision"], r["backend"], r["int8_weights"]) for r in rows] == [
        ("fp32", "eager", ""), ("bf16", "eager", ""), ("int8", "onnxruntime", "7bit"),
        ("int8", "onnxruntime", "8bit-per-channel")]
    ref, bf16, int8_7, int8_8 = rows
    assert int8_7["int8_saturates"] == str(int(backend.int8_saturates()))
    assert int8_7["status"] == "ok" and float(int8_7["agreement"]) >= 100 * MIN_AGREEMENT
    assert int8_7["max_abs_logit_err"] != int8_8["max_abs_logit_err"]  # two files, two schemes
    assert int(ref["images"]) == len(trained["y"])
    assert float(ref["top1"]) == pytest.approx(_top1(trained["ref"], trained["y"]), abs=0.01)
    assert (ref["top1_delta"], ref["agreement"], ref["status"]) == ("+0.00", "100.00", "ok")
    if backend.cpu_features().bf16:
        assert float(bf16["agreement"]) >= 100 * MIN_AGREEMENT and abs(float(bf16["top1_delta"])) <= 0.5
        assert bf16["status"] == "ok" and float(bf16["max_abs_logit_err"]) > 0  # it really ran in bf16
    else:
        assert bf16["status"].startswith("skipped: this CPU has no native bf16")
    before = out.read_bytes()
    assert bench.main(["--checkpoint", str(trained["run"]), "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err and out.read_bytes() == before
    assert bench.main(["--checkpoint", str(trained["run"]), "--paths", "fp16-eager", "--out",
                       str(tmp_path / "b.csv")]) == 2
    assert "--paths: unknown fp16-eager" in capsys.readouterr().err and not (tmp_path / "b.csv").exists()
    assert bench.main(["--checkpoint", str(trained["run"]), "--limit", "-3", "--out", str(tmp_path / "b.csv")]) == 2
    assert "--limit must be >= 0, got -3" in capsys.readouterr().err and not (tmp_path / "b.csv").exists()
    assert bench.main(["--checkpoint", str(trained["run"]), "--int8-weights", "4bit", "--out",
                       str(tmp_path / "b.csv")]) == 2
    assert "--int8-weights '4bit' is unknown" in capsys.readouterr().err and not (tmp_path / "b.csv").exists()
    assert bench.main(["--checkpoint", str(trained["run"]), "--paths", "bf16-eager", "--int8-weights", "8bit",
                       "--out", str(tmp_path / "b.csv")]) == 2
    assert "applies to the int8-onnxruntime path" in capsys.readouterr().err and not (tmp_path / "b.csv").exists()
    assert bench.main(["--checkpoint", str(trained["run"]), "--int8-weights", "",
                       "--out", str(tmp_path / "b.csv")]) == 2
    assert "--int8-weights needs at least one scheme" in capsys.readouterr().err and not (tmp_path / "b.csv").exists()


def test_precision_accuracy_changed_labels():
    """The flagged-row diagnosis ranks each image whose label changed by the reference's top-two gap (1: closest)."""
    from tests.bench._scripts import load_benchmark

    bench = load_benchmark("precision_accuracy")
    ref = torch.tensor([[2.0, 0.0], [1.0, 0.9], [0.0, 3.0], [0.5, 0.49], [0.0, 1.2]])
    assert bench.changed_labels(ref, ref.clone()) == "no label changed"
    path = ref.clone()
    path[1] = torch.tensor([0.9, 1.0])  # gap 0.1: rank 2
    path[2] = torch.tensor([3.0, 0.0])  # gap 3.0: rank 5
    msg = bench.changed_labels(ref, path)
    assert msg.startswith("labels changed on 2 images, ranked 2, 5 of 5 by the reference's top-two logit gap (0.1, 3;")
    assert msg.endswith("median 1.2)")
