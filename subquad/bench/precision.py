"""Precisions and backends of `subquad bench model`: which (precision, backend) pairs exist, the machine's measured
GEMM rate at each precision, and ONNX Runtime sessions of a model.

Pairs that run:
- `eager` and `compile` (`torch.compile`): fp32; bf16 through `torch.autocast` (`subquad.backend`); and int8 (CPU
  only), the model's copy from `subquad.layers.int8.quantize_int8`: every `nn.Linear` a dynamic int8 GEMM
  (`torch._int_mm`), the rest fp32. bf16 on a CPU without native bf16 arithmetic, and int8 on a CPU without int8
  dot products, are skipped (they would run slower than fp32). Timed bf16 inference steps run inside one autocast
  region, as a serving loop holds it, so each weight is cast to bf16 once per run (autocast's weight cache), not
  once per step; the int8 weights are quantized once, when the copy is made;
- `onnxruntime` (CPU only, the `export` extra): fp32, the file `subquad export --format onnx` writes, and int8, the
  same file after `subquad export --quantize int8` (ONNX Runtime dynamic quantization of MatMul / Gemm weights, in
  `subquad.export.DEFAULT_INT8_WEIGHTS`' scheme: 7-bit, per-channel scales since 2026-12-07, 8-bit per tensor
  before).
bf16 in ONNX Runtime gets a row whose `status` says why it was skipped; training steps are not measured for int8.

The GEMM rate is the best of a few timed square products (n = 1024) at the precision: fp32 and bf16 `torch.matmul`;
int8 in eager / compile `torch._int_mm` (int8 x int8 -> int32), in ONNX Runtime a `MatMulInteger` (uint8 x int8 ->
int32, what dynamically quantized MatMuls run). It is measured once per run with the run's threads; a row's
`gemm_fraction` is its achieved GFLOP/s (2 x GMACs / step time) over the rate at its precision and backend.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ..errors import UserError

__all__ = ["BENCH_PRECISIONS", "BENCH_BACKENDS", "check_pairs", "skip_reason", "gemm_gflops", "ort_runner"]

BENCH_PRECISIONS = ("fp32", "bf16", "int8")
BENCH_BACKENDS = ("eager", "compile", "onnxruntime")
GEMM_N = 1024


def check_pairs(precisions: Sequence[str], backends: Sequence[str]) -> None:
    """Refuse (one line) an unknown precision or backend, or an empty list."""
    for flag, given, allowed in (("--precision", precisions, BENCH_PRECISIONS), ("--backend", backends,
                                                                                 BENCH_BACKENDS)):
        if not given:
            raise UserError(f"{flag} needs at least one of {', '.join(allowed)}")
        for v in given:
            if v not in allowed:
                raise UserError(f"{flag} {v!r} is unknown; choose from {', '.join(allowed)} (comma-separated)")


def skip_reason(precision: str, backend: str, device: torch.device) -> str | None:
    """Why (precision, backend) does not run on `device` (None when it runs)."""
    from ..backend import cpu_features

    if backend == "onnxruntime":
        if device.type != "cpu":
            return "skipped: the onnxruntime backend runs on CPU only"
        if precision == "bf16":
            return "skipped: ONNX Runtime's CPU provider has no bf16 path for these graphs (use eager or compile)"
        missing = [m for m in ("onnx", "onnxscript", "onnxruntime") if importlib.util.find_spec(m) is None]
        if missing:
            return f"skipped: the onnxruntime backend needs the export extra (missing: {', '.join(missing)})"
        return None
    if precision == "int8":
        if device.type != "cpu":
            return f"skipped: int8 in {backend} runs on the CPU only (torch._int_mm with dynamic scales)"
        if not cpu_features().int8_dot:
            return "skipped: this CPU has no int8 dot products (int8 GEMMs would not beat fp32)"
        return None
    if precision == "bf16" and device.type == "cpu" and not cpu_features().bf16:
        return "skipped: this CPU has no native bf16 arithmetic (bf16 would be emulated, slower than fp32)"
    return None


def _best(fn: Callable[[], object], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _int8_gemm(n: int) -> Callable[[], object]:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    g = np.random.default_rng(0)
    b = helper.make_tensor("B", TensorProto.INT8, [n, n], g.integers(-127, 128, (n, n), dtype=np.int8).tobytes(),
                           raw=True)
    graph = helper.make_graph([helper.make_node("MatMulInteger", ["A", "B"], ["Y"])], "gemm",
                              [helper.make_tensor_value_info("A", TensorProto.UINT8, [n, n])],
                              [helper.make_tensor_value_info("Y", TensorProto.INT32, [n, n])], [b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(model.SerializeToString(), _ort_options(), providers=["CPUExecutionProvider"])
    a = g.integers(0, 256, (n, n), dtype=np.uint8)
    return lambda: sess.run(None, {"A": a})


def _int8_torch_gemm(n: int) -> Callable[[], object]:
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randint(-127, 128, (n, n), generator=gen, dtype=torch.int8) for _ in range(2))
    return lambda: torch._int_mm(a, b)


def gemm_gflops(precision: str, n: int = GEMM_N, repeats: int = 5, backend: str = "onnxruntime") -> float:
    """This machine's GEMM rate at `precision` ('fp32', 'bf16' or 'int8'), in GFLOP/s (2 n^3 per product), with
    torch's current threads. int8 is ONNX Runtime's MatMulInteger for backend 'onnxruntime', `torch._int_mm`
    otherwise."""
    if precision == "int8":
        step = _int8_gemm(n) if backend == "onnxruntime" else _int8_torch_gemm(n)
    else:
        dtype = torch.float32 if precision == "fp32" else torch.bfloat16
        gen = torch.Generator().manual_seed(0)
        a, b = (torch.randn(n, n, generator=gen).to(dtype) for _ in range(2))

        def step():
            return torch.matmul(a, b)

    return 2 * n**3 / _best(step, repeats) / 1e9


def _ort_options():
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, torch.get_num_threads())
    opts.inter_op_num_threads = 1
    return opts


def ort_runner(model: torch.nn.Module, size: int | tuple[int, int], precision: str, folder: str | os.PathLike,
               cache: dict) -> Callable[[torch.Tensor], torch.Tensor]:
    """`model` exported to ONNX at `size` (a side or (H, W); batch symbolic) under `folder`, int8-quantized for
    'int8', as a function of the input run by an ONNX Runtime CPU session. `cache` (one per model and size) keeps
    the fp32 file, so fp32 and int8 come from one export."""
    import tempfile

    import onnxruntime as ort

    from ..export import export_model, quantize_int8

    if "onnx_fp32" not in cache:
        path = Path(tempfile.mkdtemp(dir=folder)) / "model.onnx"
        hw = (size, size) if isinstance(size, int) else tuple(size)
        export_model(model, "onnx", path, hw, log=lambda *_: None)
        cache["onnx_fp32"] = path
    path = cache["onnx_fp32"]
    if precision == "int8":
        q = path.with_name(path.stem + "_int8.onnx")
        if not q.exists():
            quantize_int8(path, q)
        path = q
    sess = ort.InferenceSession(str(path), _ort_options(), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name

    def run(x: torch.Tensor) -> torch.Tensor:
        (out,) = sess.run(None, {name: x.numpy()})
        return torch.from_numpy(out)

    return run
