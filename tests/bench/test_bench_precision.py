"""`subquad bench model --precision ... --backend ...`: one row per (model, precision, backend), skipped pairs say
why, speed-up against fp32 eager and the fraction of the measured GEMM rate."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from subquad import backend
from subquad.bench.precision import gemm_gflops, skip_reason
from subquad.bench.sweep import MODEL_COLUMNS, bench_models
from subquad_cli.__main__ import main

FAST = ["--img-size", "16", "--repeats", "1", "--warmup", "0", "--no-plot"]


def test_precision_backend_grid_rows(tmp_path, capsys):
    out = tmp_path / "m.csv"
    assert main(["bench", "model", "--model", "vit_attn_micro", "--precision", "fp32,bf16,int8",
                 "--backend", "eager,onnxruntime", *FAST, "--out", str(out)]) == 0
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == MODEL_COLUMNS
    for col in ("precision", "backend", "speedup_vs_fp32_eager", "achieved_gflops", "gemm_fraction"):
        assert col in MODEL_COLUMNS
    by = {(r["precision"], r["backend"]): r for r in rows}
    assert len(rows) == 6 and set(by) == {(p, b) for p in ("fp32", "bf16", "int8") for b in ("eager", "onnxruntime")}
    assert by[("bf16", "onnxruntime")]["status"].startswith("skipped: ONNX Runtime")
    measured = [("fp32", "eager"), ("fp32", "onnxruntime"), ("int8", "onnxruntime")]
    if backend.cpu_features().int8_dot:
        measured.append(("int8", "eager"))
    else:
        assert by[("int8", "eager")]["status"].startswith("skipped: this CPU has no int8 dot products")
    if backend.cpu_features().bf16:
        measured.append(("bf16", "eager"))
    else:
        assert by[("bf16", "eager")]["status"].startswith("skipped: this CPU has no native bf16")
    for key in measured:
        r = by[key]
        assert r["status"] == "ok", r
        assert float(r["infer_step_time"]) > 0 and float(r["infer_samples_per_sec"]) > 0
        assert float(r["gemm_gflops"]) > 0 and float(r["achieved_gflops"]) > 0
        assert float(r["gemm_fraction"]) == pytest.approx(float(r["achieved_gflops"]) / float(r["gemm_gflops"]),
                                                         rel=1e-2)
        speed = float(by[("fp32", "eager")]["infer_step_time"]) / float(r["infer_step_time"])
        assert float(r["speedup_vs_fp32_eager"]) == pytest.approx(speed, rel=1e-2)
    assert float(by[("fp32", "eager")]["speedup_vs_fp32_eager"]) == 1.0
    for key in set(by) - set(measured):
        assert by[key]["infer_step_time"] == "" and by[key]["speedup_vs_fp32_eager"] == ""
    # One GEMM rate per precision for the whole run.
    assert len({r["gemm_gflops"] for r in rows if r["precision"] == "fp32" and r["gemm_gflops"]}) == 1
    if ("int8", "eager") in measured:  # torch._int_mm's rate, not ONNX Runtime's MatMulInteger
        assert by[("int8", "eager")]["gemm_gflops"] != by[("int8", "onnxruntime")]["gemm_gflops"]


def test_int8_eager_and_compile_rows(monkeypatch):
    """int8 in eager / compile times the quantize_int8 copy (made once per model and size, the float model untouched),
    measures no training step, and is skipped off a CPU with int8 dot products."""
    from subquad.layers.int8 import Int8DynamicLinear

    seen = []

    def fake_compile(model):
        seen.append(model)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(backend, "cpu_features", lambda: backend.CpuFeatures(True, True, False, "test"))
    # the faked CPU's int8 GEMM rate at a small size: without int8 dot products torch._int_mm's 1024^3 rate takes
    # ~13 s to measure on a Zen 3 EPYC, and its value is not what this test checks
    monkeypatch.setattr("subquad.bench.precision.gemm_gflops", lambda p, **k: gemm_gflops(p, **{**k, "n": 128}))
    rows = bench_models(["vit_attn_micro"], (16,), warmup=0, repeats=1, precisions=("fp32", "int8"),
                        backends=("eager", "compile"), backward=True)
    by = {(r["precision"], r["backend"]): r for r in rows}
    for key in (("int8", "eager"), ("int8", "compile")):
        assert by[key]["status"] == "train not measured: the int8 layers run inference only", by[key]
        assert float(by[key]["infer_step_time"]) > 0 and by[key]["train_step_time"] == ""
    assert by[("fp32", "eager")]["train_step_time"] != ""
    compiled = {type(m.head).__name__ for m in seen}
    assert compiled == {"Linear", "Int8DynamicLinear"}, compiled  # fp32 compiled the float model, int8 its copy
    assert any(isinstance(m, Int8DynamicLinear) for s in seen for m in s.modules())
    monkeypatch.setattr(backend, "cpu_features", lambda: backend.CpuFeatures(True, False, False, "test"))
    assert skip_reason("int8", "eager", torch.device("cpu")).startswith("skipped: this CPU has no int8 dot")
    assert skip_reason("int8", "compile", torch.device("cuda")).startswith("skipped: int8 in compile runs on the CPU")


def test_rates_keep_significant_digits_for_tiny_models():
    """achieved_gflops and gemm_fraction are rounded to significant digits: a micro model at 16 px reaches ~1e-3 of
    a bf16 GEMM rate, which a fixed four decimals rounded by several per cent (the grid test above flaked on it)."""
    from types import SimpleNamespace

    from subquad.bench.sweep import _rates

    sweep = SimpleNamespace(device=__import__("torch").device("cpu"), gemm={"bf16": 914.28, "fp32": 189.4})
    for gmacs, ms, prec in [(1.3e-4, 1.0, "bf16"), (4.18527, 82.7261, "bf16"), (2e-6, 0.05, "fp32")]:
        row = {"infer_step_time": ms, "infer_gmacs": gmacs}
        _rates(sweep, row, prec)
        achieved = 2 * gmacs / (ms / 1e3)
        assert row["achieved_gflops"] == pytest.approx(achieved, rel=1e-5)
        assert row["gemm_fraction"] == pytest.approx(achieved / sweep.gemm[prec], rel=1e-3)
        assert row["gemm_fraction"] == pytest.approx(row["achieved_gflops"] / row["gemm_gflops"], rel=1e-3)


def test_bf16_rows_skipped_on_a_cpu_without_bf16(monkeypatch):
    monkeypatch.setattr(backend, "cpu_features", lambda: backend.CpuFeatures(False, False, False, "test"))
    assert skip_reason("bf16", "eager", __import__("torch").device("cpu")).startswith("skipped: this CPU has no")
    rows = bench_models(["vit_attn_micro"], (16,), warmup=0, repeats=1, precisions=("bf16",), backends=("eager",))
    assert len(rows) == 1 and rows[0]["status"].startswith("skipped: this CPU has no native bf16")
    assert rows[0]["infer_step_time"] == ""


@pytest.mark.parametrize("flag, value, msg", [("--precision", "fp16", "--precision 'fp16' is unknown; choose from "
                                               "fp32, bf16, int8"),
                                              ("--backend", "tensorrt", "--backend 'tensorrt' is unknown; choose "
                                               "from eager, compile, onnxruntime"),
                                              ("--precision", ",", "--precision needs at least one of")])
def test_unknown_precision_or_backend_one_line(flag, value, msg, tmp_path, capsys):
    out = tmp_path / "m.csv"
    assert main(["bench", "model", "--model", "vit_attn_micro", flag, value, *FAST, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err and not out.exists()


def test_gemm_rate_per_precision():
    for p in ("fp32", "int8") + (("bf16",) if backend.cpu_features().bf16 else ()):
        assert gemm_gflops(p, n=128, repeats=1) > 0
    assert gemm_gflops("int8", n=128, repeats=1, backend="eager") > 0


@pytest.mark.slow
def test_compile_backend_rows():
    rows = bench_models(["vit_attn_micro"], (16,), warmup=1, repeats=1, precisions=("fp32", "bf16"),
                        backends=("eager", "compile"))
    by = {(r["precision"], r["backend"]): r for r in rows}
    assert by[("fp32", "compile")]["status"] == "ok" and by[("fp32", "compile")]["compiled"] == 1
    assert float(by[("fp32", "compile")]["speedup_vs_fp32_eager"]) > 0


def test_each_compiled_path_starts_from_a_fresh_dynamo_cache(monkeypatch):
    """Every compiled (size, precision) is compiled after torch._dynamo.reset(): a later size must not reuse the
    earlier size's code with symbolic shapes. torch.compile stands in for an identity wrapper here."""
    events = []

    def fake_compile(model):
        events.append("compile")
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(torch._dynamo, "reset", lambda: events.append("reset"))
    rows = bench_models(["vit_attn_micro"], (16, 24), warmup=0, repeats=1, precisions=("fp32",),
                        backends=("eager", "compile"))
    assert [r["status"] for r in rows] == ["ok"] * 4
    assert events == ["reset", "compile"] * 2


def test_non_square_sizes_in_every_backend(tmp_path):
    """`--img-size HxW`: the model runs, is counted and exported at H x W, rows say 'HxW', sizes go by pixels."""
    from subquad.bench.flops import count_macs

    out = tmp_path / "ns.csv"
    assert main(["bench", "model", "--model", "vit_attn_micro", "--img-size", "32x16,24,16x40",
                 "--precision", "fp32,int8", "--backend", "eager,onnxruntime", "--repeats", "1", "--warmup", "0",
                 "--no-plot", "--out", str(out)]) == 0
    with open(out, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "ok"]
    assert list(dict.fromkeys(r["infer_img_size"] for r in rows)) == ["32x16", "24", "16x40"]  # 512, 576, 640 px
    for r in rows:
        hw = tuple(int(v) for v in r["infer_img_size"].split("x")) * (1 if "x" in r["infer_img_size"] else 2)
        assert float(r["infer_gmacs"]) == pytest.approx(count_macs("vit_attn_micro", hw)["gmacs"], rel=1e-4)
    assert {(r["precision"], r["backend"]) for r in rows if r["infer_img_size"] == "16x40"} == {
        ("fp32", "eager"), ("fp32", "onnxruntime"), ("int8", "onnxruntime")} | (
        {("int8", "eager")} if backend.cpu_features().int8_dot else set())


@pytest.mark.parametrize("bad", ["0x16", "16x", "axb", "16x16x3", ","])
def test_bad_image_sizes_are_one_line(bad, capsys):
    with pytest.raises(SystemExit):
        main(["bench", "model", "--model", "vit_attn_micro", "--img-size", bad, "--no-plot"])
    err = capsys.readouterr().err
    assert "--img-size" in err and "HxW" in err and "Traceback" not in err


def test_image_size_forms():
    from subquad.bench.sweep import image_size, size_label
    from subquad.errors import UserError

    assert image_size(224) == image_size("224") == image_size((224, 224)) == (224, 224)
    assert image_size("224x320") == image_size("224X320") == image_size((224, 320)) == (224, 320)
    assert size_label((224, 224)) == 224 and size_label((224, 320)) == "224x320"
    import numpy as np

    assert image_size(np.int64(224)) == image_size(224.0) == (224, 224)
    assert image_size([np.int64(16), 24]) == (16, 24)
    for bad in ((0, 3), "2_24", True, 224.5, "16x", "x", None, (1, 2, 3)):
        with pytest.raises(UserError, match="HxW"):
            image_size(bad)


def test_plot_reads_sizes_back_from_csv_cells():
    from subquad.bench.sweep import _pixels

    assert _pixels(224) == _pixels("224") == _pixels(224.0) == _pixels("224.0") == 224 * 224
    assert _pixels("32x16") == 512
    assert _pixels("") == _pixels(None) == _pixels(float("nan")) == 0


def test_plot_names_non_square_points(tmp_path, monkeypatch):
    """16x32 and 32x16 have the same pixels, so they share an x; each non-square point is labelled with its shape
    (square points are not), read back from CSV-like cells."""
    from subquad.bench import sweep

    figs = []
    monkeypatch.setattr(sweep, "_save", lambda fig, path: figs.append(fig) or Path(path))
    rows = [dict(model="m", infer_img_size=size, infer_step_time=t, peak_mem_mb=1.0)
            for size, t in (("16", "1.0"), ("16x32", "2.0"), ("32x16", "2.5"), (32, "4.0"))]
    sweep.plot_models(rows, tmp_path / "p.png")
    texts = sorted(t.get_text() for t in figs[0].axes[0].texts)
    assert texts == ["16x32", "32x16"]
    # An error row (no time) among equal-pixel shapes has no point and does not break the plot.
    rows[1]["infer_step_time"] = ""
    sweep.plot_models(rows, tmp_path / "q.png")
    assert sorted(t.get_text() for t in figs[1].axes[0].texts) == ["32x16"]


def test_a_too_small_side_names_the_size_asked():
    from subquad.bench.sweep import check_model_sizes
    from subquad.errors import UserError

    check_model_sizes(["vit_attn_micro"], ["16x64", "64x16"])  # each side at least the stride
    with pytest.raises(UserError, match="--img-size 64x8 is too small for l2vit_micro"):
        check_model_sizes(["l2vit_micro"], ["64x16", "64x8"])


def test_timm_baseline_at_a_non_square_size():
    """timm models are built for the shape asked (`img_size=(H, W)`: position tables), then counted and timed."""
    rows = bench_models(["deit_tiny_patch16_224"], ["32x48"], warmup=0, repeats=1)
    assert [(r["infer_img_size"], r["status"]) for r in rows] == [("32x48", "ok")]
    assert float(rows[0]["infer_gmacs"]) > 0 and float(rows[0]["infer_step_time"]) > 0


def test_timed_inference_steps_share_one_autocast_region():
    """bench model's bf16 inference steps run inside one autocast region (`_serving_region`), each step entering
    its own inside it: an fp32 weight is cast to bf16 once for all steps (autocast's weight cache), as in a serving
    loop. Training steps (and fp32, and ONNX Runtime) get no outer region: a cast per step."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from subquad.backend import precision_context
    from subquad.bench.sweep import _serving_region

    lin = torch.nn.Linear(8, 6)
    x = torch.randn(5, 8)
    casts = []

    class CountWeightCasts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.ops.aten._to_copy.default and args[0].shape == lin.weight.shape \
                    and kwargs.get("dtype") == torch.bfloat16:
                casts.append(func)
            return func(*args, **kwargs)

    def run(steps, grad, precision="bf16", backend="eager"):
        casts.clear()
        with CountWeightCasts(), _serving_region(precision, x.device, grad, backend):
            for _ in range(steps):
                with precision_context(precision, x.device), torch.set_grad_enabled(grad):
                    lin(x)
        return len(casts)

    assert run(3, grad=False) == 1
    assert run(3, grad=True) == 3
    assert run(3, grad=False, precision="fp32") == 0
    assert run(2, grad=False, backend="onnxruntime") == 2  # no region of its own (ORT never runs torch autocast)
