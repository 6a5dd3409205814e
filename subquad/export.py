"""Export a model for deployment: ONNX (`torch.onnx.export(dynamo=True)`) or a `torch.export` program (`.pt2`).

`export_model` traces the model once with `torch.export`, with the batch and, when `dynamic`, the image height and
width symbolic over every size the model admits in eager: any side from its minimum input size (its total stride)
up to 2048, padded inside the program exactly as eager pads it. It writes the file next to its destination, checks the
written program against eager PyTorch at the export size (and, when dynamic, at a second, non-square size that is not
a multiple of the total stride, so that every padding path runs), and only then moves it into place. A file that
disagrees with eager is never left behind.

`quantize="int8"` (ONNX only) then applies ONNX Runtime's dynamic quantization
(`onnxruntime.quantization.quantize_dynamic`) to the file's MatMul and Gemm nodes: int8 weights, activations
quantized per batch at run time to uint8 (VNNI kernels where the CPU has them). `int8_weights` says how the weights
are quantized (`INT8_WEIGHTS`): 7 or 8 bits, one scale per tensor or per output channel. 8-bit weights are wrong on
x86 CPUs without VNNI: ONNX Runtime multiplies uint8 by int8 there with `vpmaddubsw`, which adds two products in a
saturating 16-bit lane (255 x 127 x 2 > 32767), so large products are clipped (`subquad.backend.int8_saturates`);
7-bit weights (|q| <= 64, ONNX Runtime's `reduce_range`) keep every pair below 2^15, so the same file computes
exactly on every x86 CPU. Its check cannot hold the fp32 bound; it
reports the error against eager fp32 instead (top-1 agreement and the max / mean absolute error of the logits, on
`check_inputs` when given, e.g. held-out images, else on random inputs) and refuses only a file that does not run or
gives non-finite logits.

The ONNX path needs the `export` extra (`pip install "subquad[export]"`: onnx, onnxscript, onnxruntime); the `.pt2`
path needs only torch. The check runs the `.onnx` file in ONNX Runtime and the `.pt2` file through
`torch.export.load`, i.e. what a deployment would load.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .backend import onnx_graph, real_dft
from .errors import UserError

__all__ = ["FORMATS", "QUANTIZE", "INT8_WEIGHTS", "DEFAULT_INT8_WEIGHTS", "MAX_SIDE", "quantize_int8",
           "check_int8_weights", "logit_agreement", "ExportCheckError", "admissible", "export_model",
           "relative_error"]

FORMATS = ("onnx", "pt2")
SUFFIX = {"onnx": ".onnx", "pt2": ".pt2"}
MAX_SIDE = 2048
# Relative error (max-abs difference over the eager output's max-abs) above which a written file is refused. fp32
# programs agree to ~1e-6; the acceptance bound for ONNX Runtime is 1e-4.
RTOL = 1e-4
EXTRA = {"onnx": ("onnx", "onnxscript", "onnxruntime")}
QUANTIZE = ("int8",)
# The node types whose weights dynamic quantization makes int8: the projections and MLPs. Attention's own
# activation-by-activation products are MatMuls too, but quantize_dynamic leaves them in fp32 (its MatMulConstBOnly
# option defaults to True in dynamic mode). Quantizing them as well made vit_attn_tiny at 512 px about 7 % faster in
# ONNX Runtime on a Zen 4 EPYC (ad hoc, one process), not enough to change its verdict, so they stay fp32.
QUANT_OPS = ("MatMul", "Gemm")
# How `quantize="int8"` quantizes weights: bits (7: ONNX Runtime's reduce_range, |q| <= 64) and the scale's extent.
INT8_WEIGHTS = ("7bit", "8bit", "7bit-per-channel", "8bit-per-channel")
DEFAULT_INT8_WEIGHTS = "7bit-per-channel"


class ExportCheckError(RuntimeError):
    """The exported program disagrees with eager PyTorch (a defect of the export path, not a user error)."""


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref| (0 when both are all zero), in float64."""
    out, ref = out.detach().double(), ref.detach().double()
    scale = ref.abs().max().item()
    diff = (out - ref).abs().max().item()
    return diff / scale if scale > 0 else diff


def admissible(model: nn.Module) -> tuple[int, int]:
    """(stride, minimum side) of the image sizes a model takes: any side in [min, 2048] (eager pads a side that is
    not a multiple of `stride`, the total stride, and so does an exported program)."""
    stride = int(getattr(model, "total_stride", 0) or 0)
    if stride <= 0:
        raise UserError(f"{type(model).__name__} does not declare its total stride; only subquad image backbones "
                        "can be exported by `subquad export`")
    cfg = getattr(model, "pretrained_cfg", None) or {}
    low = max(stride, int((cfg.get("min_input_size") or (0, 0, 0))[-1]))
    return stride, low


def _check_size(model: nn.Module, size: tuple[int, int], name: str) -> None:
    _, low = admissible(model)
    h, w = size
    if min(h, w) < low or max(h, w) > MAX_SIDE:
        raise UserError(f"{name} takes sides from {low} to {MAX_SIDE}, got {h}x{w}")


def _second_size(size: tuple[int, int], stride: int, low: int, covered=None) -> tuple[int, int]:
    """Another admissible, non-square size to check a dynamic export at, neither side a multiple of the total
    stride (so that the program's padding runs): about one stride taller and two wider (or smaller where that would
    leave the covered range)."""
    (h0, h1), (w0, w1) = covered or ((low, MAX_SIDE), (low, MAX_SIDE))
    h, w = (-(-s // stride) * stride for s in size)  # from the multiples at or above the export size
    h2 = h + stride + 3 if h + stride + 3 <= h1 else h - stride + 3
    w2 = w + 2 * stride - 5 if w + 2 * stride - 5 <= w1 else w - 2 * stride + 5
    return min(max(h2, h0, low), h1), min(max(w2, w0, low), w1)


def _generic_size(size: tuple[int, int], stride: int) -> tuple[int, int]:
    """A non-square trace size with at least 8 tokens a side at the last stage, neither side a multiple of the
    stride (a program traced at a multiple could keep a branch that only multiples take)."""
    h = min(MAX_SIDE - 2 * stride, -(-max(size[0], 8 * stride) // stride) * stride)
    return h + 3, h + stride + 5


def covered_sides(prog) -> tuple[tuple[int, int], tuple[int, int]]:
    """((H_min, H_max), (W_min, W_max)) an exported program accepts, from its range constraints (a static side gives
    (s, s)). PyTorch narrows the requested range where the model's code needs it (e.g. a stage that would hold a
    single window behaves differently), so this is what the file really covers."""
    name = prog.graph_signature.user_inputs[0]
    val = next(n for n in prog.graph.nodes if n.op == "placeholder" and n.name == name).meta["val"]
    out = []
    for side in val.shape[-2:]:
        if isinstance(side, int):
            out.append((side, side))
            continue
        vr = prog.range_constraints.get(side.node.expr)
        out.append((int(vr.lower), int(vr.upper)) if vr is not None else (1, MAX_SIDE))
    return out[0], out[1]


def logit_agreement(got: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """How a quantized program's logits `got` (N, classes) agree with eager fp32 `ref`: the share of rows with the
    same top-1 class, the max and mean absolute error, and `relative_error`."""
    got, ref = got.detach().double().flatten(1), ref.detach().double().flatten(1)
    diff = (got - ref).abs()
    return {"top1_agreement": float((got.argmax(1) == ref.argmax(1)).double().mean()),
            "max_abs_err": float(diff.max()), "mean_abs_err": float(diff.mean()),
            "rel_err": relative_error(got, ref)}


def check_int8_weights(weights: str, what: str = "--int8-weights") -> tuple[bool, bool]:
    """(reduce_range, per_channel) of an `INT8_WEIGHTS` name; UserError (one line) for another."""
    if weights not in INT8_WEIGHTS:
        raise UserError(f"{what} {weights!r} is unknown; choose one of {', '.join(INT8_WEIGHTS)}")
    return weights.startswith("7bit"), weights.endswith("per-channel")


_clip_warned: set[str] = set()


def _warn_if_clipped(weights: str) -> None:
    """One warning per process and scheme where 8-bit weights are quantized on a CPU that clips their products
    (`subquad.backend.int8_saturates`): a check or benchmark run here shows this CPU's error, not a VNNI CPU's."""
    from .backend import int8_saturates

    if weights.startswith("8bit") and weights not in _clip_warned and int8_saturates():
        _clip_warned.add(weights)
        logging.getLogger("subquad").warning(
            "warning: this CPU (x86 without VNNI) clips uint8 x int8 products of 8-bit weights in ONNX Runtime, so "
            "the %s file computes wrong products here (not on CPUs with VNNI); 7-bit weights are exact on both",
            weights)


def quantize_int8(src: str | os.PathLike, dst: str | os.PathLike, weights: str = DEFAULT_INT8_WEIGHTS) -> None:
    """Dynamic int8 quantization of the MatMul / Gemm weights of the ONNX file `src`, written to `dst`
    (`onnxruntime.quantization.quantize_dynamic`: signed int8 weights, symmetric, of `weights` (`INT8_WEIGHTS`: 7 or
    8 bits, per tensor or per output channel); activations quantized to uint8 at run time). The file's metadata
    `subquad.quantize` names the scheme."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    reduce_range, per_channel = check_int8_weights(weights)
    _warn_if_clipped(weights)

    meta = {p.key: p.value for p in onnx.load(str(src), load_external_data=False).metadata_props}
    # quantize_dynamic logs advice on the root logger (run its shape pre-processing first); our graphs come from
    # torch.onnx's exporter with shapes inferred, so the advice is held back for the call.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, op_types_to_quantize=list(QUANT_OPS),
                         reduce_range=reduce_range, per_channel=per_channel)
    finally:
        root.setLevel(level)
    model = onnx.load(str(dst))
    meta["subquad.quantize"] = f"int8 dynamic ({', '.join(QUANT_OPS)}), {weights} weights"
    del model.metadata_props[:]
    for k, v in meta.items():
        model.metadata_props.add(key=k, value=v)
    onnx.save(model, str(dst))


def _need_extra(fmt: str) -> None:
    missing = [m for m in EXTRA.get(fmt, ()) if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"--format {fmt} needs the export extra (missing: {', '.join(missing)}); install it with "
                        "pip install \"subquad[export]\"")


def _is_onnx(p: Path) -> bool:
    # An ONNX ModelProto starts with field 1 (ir_version, a varint): tag byte 0x08.
    with open(p, "rb") as f:
        return f.read(1) == b"\x08"


def _is_pt2(p: Path) -> bool:
    if not zipfile.is_zipfile(p):
        return False
    with zipfile.ZipFile(p) as z:
        return any(n.endswith("archive_format") or "/models/" in n for n in z.namelist())


def check_output(out: str | os.PathLike, fmt: str, overwrite: bool = False, protect: tuple = ()) -> Path:
    """The destination of an export: the right suffix, not an input, and (when it exists) an earlier export of the
    same format that `overwrite` allows to replace."""
    if fmt not in FORMATS:
        raise UserError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    p = Path(out)
    if p.suffix.lower() != SUFFIX[fmt]:
        raise UserError(f"--out {p} must end in {SUFFIX[fmt]} for --format {fmt}")
    for q in protect:
        if q is not None and Path(q).resolve() == p.resolve():
            raise UserError(f"--out {p} is one of the inputs; choose another path (nothing was written)")
    if p.exists():
        same = p.is_file() and (_is_onnx(p) if fmt == "onnx" else _is_pt2(p))
        if not same:
            raise UserError(f"--out {p} exists and is not an earlier {fmt} export; choose another path "
                            "(nothing was written)")
        if not overwrite:
            raise UserError(f"--out {p} exists; pass --overwrite to replace it (nothing was written)")
    if not p.parent.is_dir():
        raise UserError(f"--out {p}: folder {p.parent} does not exist")
    return p


def _dynamic_shapes(stride: int, low: int, dynamic: bool) -> dict[str, Any]:
    from torch.export import Dim

    shapes: dict[int, Any] = {0: Dim("batch", min=1, max=1024)}
    if dynamic:
        # Dim.DYNAMIC, not a named Dim: PyTorch may narrow the range where the model's code needs it (a last stage
        # of one token behaves differently), and `covered_sides` reports what the program really takes.
        shapes[2] = Dim.DYNAMIC(min=low, max=MAX_SIDE)
        shapes[3] = Dim.DYNAMIC(min=low, max=MAX_SIDE)
    return {"x": shapes}


def _load_file(path: Path, fmt: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The written file as a function of the input, loaded once for every check: loading a dynamic .pt2 program
    rebuilds its symbolic shapes, several seconds for a micro model."""
    if fmt == "pt2":
        prog = torch.export.load(str(path)).module()

        def run_pt2(x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return prog(x)

        return run_pt2
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, torch.get_num_threads())
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name

    def run_onnx(x: torch.Tensor) -> torch.Tensor:
        (out,) = sess.run(None, {name: x.numpy()})
        return torch.from_numpy(out)

    return run_onnx


def export_model(model: nn.Module, fmt: str, out: str | os.PathLike, img_size: tuple[int, int] | None = None,
                 dynamic: bool = False, overwrite: bool = False, name: str | None = None,
                 protect: tuple = (), rtol: float = RTOL, check_sizes: list[tuple[int, int]] | None = None,
                 log=print, quantize: str | None = None, check_inputs: torch.Tensor | None = None,
                 int8_weights: str | None = None) -> dict[str, Any]:
    """Export `model` (switched to eval mode) to `out` in `fmt` ('onnx' or 'pt2') and check the file against eager.

    Args:
        img_size: (H, W) of the example input (default: the model's `pretrained_cfg['input_size']`).
        dynamic: H and W symbolic over the admissible sizes (the batch is always symbolic).
        overwrite: replace an earlier export of the same format at `out`.
        protect: input files `out` must not be.
        rtol: the largest relative error (see `relative_error`) a written file may have (fp32 files).
        check_sizes: the (H, W) sizes to check the file at (default: the export size, and with `dynamic` one other
            admissible, non-square size).
        quantize: None, or 'int8' (ONNX only): dynamic int8 quantization of the MatMul / Gemm weights, checked by
            `logit_agreement` against eager fp32 instead of `rtol`.
        check_inputs: (N, C, H, W) images at the export size for the int8 check (default: random inputs).
        int8_weights: with quantize='int8', how the weights are quantized (`INT8_WEIGHTS`; default
            `DEFAULT_INT8_WEIGHTS`, '7bit-per-channel', exact on every CPU, see the module docstring). Refused
            without quantize.
    Returns:
        {"file", "format", "dynamic", "quantize", "int8_weights" (None without quantize), "covers",
        "checks": [{"size": [H, W], "rel_err": float, and for int8 "top1_agreement", "max_abs_err", "mean_abs_err"},
        ...]}.
    Raises:
        UserError: an unknown format or quantization, a size the model can't take, a missing extra, a bad output path.
        ExportCheckError: the written program disagrees with eager (the file is removed).
    """
    name = name or (getattr(model, "pretrained_cfg", None) or {}).get("architecture", type(model).__name__)
    _check_quantize(quantize, fmt)
    if int8_weights is not None and not quantize:
        raise UserError(f"--int8-weights {int8_weights} needs --quantize int8")
    int8_weights = int8_weights or DEFAULT_INT8_WEIGHTS
    check_int8_weights(int8_weights)
    dest = check_output(out, fmt, overwrite, protect)
    _need_extra(fmt)
    if getattr(model, "input_ndim", 4) != 4:
        raise UserError(f"{name} takes video clips; `subquad export` covers image models")
    cfg = getattr(model, "pretrained_cfg", None) or {}
    if img_size is None:
        img_size = tuple(cfg.get("input_size", (3, 224, 224))[1:])
    size = (int(img_size[0]), int(img_size[-1]))
    _check_size(model, size, name)
    if check_inputs is not None and tuple(check_inputs.shape[-2:]) != size:
        raise UserError(f"check_inputs are {tuple(check_inputs.shape[-2:])}, not the export size {size}")
    stride, low = admissible(model)
    model = model.eval()
    chans = int(getattr(model, "in_chans", 3))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, chans, *size, generator=gen)
    # A dynamic program is traced at a generic size: at a small one, a stage with a single window (or a single row
    # of tokens) would specialise the program to it (PyTorch specialises sizes 0 and 1), and a square one would tie
    # H to W. Tracing uses fake tensors, so the size costs nothing.
    ex = x if not dynamic else torch.randn(2, chans, *_generic_size(size, stride), generator=gen)
    # ONNX has no complex tensors: spectral mechanisms trace their real-DFT form for it (subquad.backend.real_dft).
    # A dynamic program takes that form too: torch.fft's kernels specialise the transform length to the example's.
    # For ONNX, softmax attention is written out as plain operators (subquad.backend.onnx_graph).
    with torch.no_grad(), real_dft(fmt == "onnx" or dynamic), onnx_graph(fmt == "onnx"):
        prog = torch.export.export(model, (ex,), dynamic_shapes=_dynamic_shapes(stride, low, dynamic), strict=False)
    covered = covered_sides(prog)
    if dynamic:
        (h0, h1), (w0, w1) = covered
        if not (h0 <= size[0] <= h1 and w0 <= size[1] <= w1):
            raise UserError(f"the dynamic program of {name} covers H {h0}-{h1} and W {w0}-{w1}; "
                            f"{size[0]}x{size[1]} is outside: export dynamic at a size in that range, or "
                            "export this size without --dynamic (nothing was written)")
    sizes = [tuple(c) for c in check_sizes] if check_sizes else \
        [size] + ([_second_size(size, stride, low, covered)] if dynamic else [])
    if not dynamic and any(s != size for s in sizes):
        raise UserError(f"a static export runs at {size[0]}x{size[1]} only; pass dynamic=True to check others")
    for s in sizes:
        _check_size(model, s, name)
    check = _Check(model, fmt, sizes, size, chans, gen, name, rtol, log, quantize, check_inputs)
    checks = _write_atomic(dest, lambda tmp: _write_program(prog, ex, fmt, tmp, covered), quantize, check,
                           int8_weights)
    return {"file": str(dest), "format": fmt, "dynamic": dynamic, "quantize": quantize,
            "int8_weights": int8_weights if quantize else None, "checks": checks,
            "covers": {"H": list(covered[0]), "W": list(covered[1])}}


def _check_quantize(quantize: str | None, fmt: str) -> None:
    if quantize is None:
        return
    if quantize not in QUANTIZE:
        raise UserError(f"--quantize {quantize!r} is not supported; choose one of {', '.join(QUANTIZE)}")
    if fmt != "onnx":
        raise UserError(f"--quantize {quantize} needs --format onnx (ONNX Runtime runs the int8 program), got "
                        f"--format {fmt}")


def _write_atomic(dest: Path, write: Callable[[Path], None], quantize: str | None, check,
                  int8_weights: str = DEFAULT_INT8_WEIGHTS) -> list[dict[str, Any]]:
    """Write to a temporary file beside `dest` (then quantize it), check it and only then rename it into place; the
    temporary files are removed whatever happens."""
    tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}{dest.suffix}")
    tmp_q = dest.with_name(f".{dest.name}.q{os.getpid()}{dest.suffix}")
    try:
        write(tmp)
        if quantize:
            quantize_int8(tmp, tmp_q, int8_weights)
            os.replace(tmp_q, tmp)
        checks = check(tmp)
        os.replace(tmp, dest)
    finally:
        for t in (tmp, tmp_q):
            if t.exists():
                t.unlink()
    return checks


@contextlib.contextmanager
def _linear_time_rewrites() -> Iterator[None]:
    """torch.onnx's graph optimizer (onnxscript's `optimize_ir`) without its rewrite rules of several output nodes.

    For a pattern with more than one output node onnxscript's matcher indexes the whole graph again for every
    candidate node (`onnxscript/rewriter/_matcher.py`, `SimplePatternMatcher.match`), so its one such default rule,
    `SlicesSplit` (two Slices of one tensor -> one Split), costs O(Slices x nodes). A dynamic CSwin graph holds
    thousands of Slices (its stripes and the crops of padded maps): measured on this project's 2-core AMD EPYC, one
    thread, the optimizer took 14 s on `flatten_cswin_micro` (2,977 nodes) and over 4 minutes on
    `flatten_cswin_tiny` (19,807 nodes) before this; `flatten_cswin_small` did not finish in 15 minutes. Every
    other rule, constant folding and the clean-up passes run as before; ONNX Runtime can still fuse the slices at
    load time. When onnxscript changes the names this relies on, nothing is changed."""
    try:
        from onnxscript import rewriter
        rules = rewriter._DEFAULT_REWRITE_RULES
        kept = tuple(r for r in rules if r._target_pattern.has_single_output_node)
    except (ImportError, AttributeError):
        yield
        return
    rewriter._DEFAULT_REWRITE_RULES = kept
    try:
        yield
    finally:
        rewriter._DEFAULT_REWRITE_RULES = rules


def _write_program(prog: Any, ex: torch.Tensor, fmt: str, path: Path, covered) -> None:
    """Save the exported program `prog` (traced on `ex`) to `path` as a .pt2 archive or an ONNX file.

    A .pt2 program refuses a size outside `covered` itself (its range constraints). An ONNX graph has no such
    check, so the file says in its metadata which sides it was checked for: `subquad.input_height` and
    `subquad.input_width`, "MIN-MAX" (ONNX Runtime: `session.get_modelmeta().custom_metadata_map`)."""
    if fmt == "pt2":
        torch.export.save(prog, str(path))
        return
    with _linear_time_rewrites():
        onnx_prog = torch.onnx.export(prog, (ex,), dynamo=True, verbose=False)
    onnx_prog.model.metadata_props.update({"subquad.input_height": f"{covered[0][0]}-{covered[0][1]}",
                                           "subquad.input_width": f"{covered[1][0]}-{covered[1][1]}"})
    onnx_prog.save(str(path))


class _Check:
    """The check of a written file: `_Check(...)(path)` returns the list of checks or raises ExportCheckError."""

    def __init__(self, model: nn.Module, fmt: str, sizes: list[tuple[int, int]], size: tuple[int, int], chans: int,
                 gen: torch.Generator, name: str, rtol: float, log, quantize: str | None,
                 check_inputs: torch.Tensor | None) -> None:
        self.model, self.fmt, self.sizes, self.size, self.chans, self.gen = model, fmt, sizes, size, chans, gen
        self.name, self.rtol, self.log, self.quantize, self.check_inputs = name, rtol, log, quantize, check_inputs

    def __call__(self, path: Path) -> list[dict[str, Any]]:
        kind = f"{self.fmt} ({self.quantize})" if self.quantize else self.fmt
        try:
            run = _load_file(path, self.fmt)
        except Exception as e:  # noqa: BLE001 - re-raised, the file is removed
            raise ExportCheckError(f"{self.name}: the written {kind} file does not load ({type(e).__name__}: "
                                   f"{str(e).splitlines()[0][:300] if str(e) else ''}); nothing was written") from e
        checks = []
        for s in self.sizes:
            if self.check_inputs is not None and s == self.size:
                xs = self.check_inputs.float()
            else:
                xs = torch.randn(2 if s == self.size else 1, self.chans, *s, generator=self.gen)
            with torch.no_grad():
                ref = self.model(xs)
            try:
                got = run(xs)
            except Exception as e:  # noqa: BLE001 - re-raised with the size, the file is removed
                raise ExportCheckError(f"{self.name}: the {kind} program does not run at {s[0]}x{s[1]} "
                                       f"({type(e).__name__}: {str(e).splitlines()[0][:300]}); nothing was "
                                       "written") from e
            checks.append(self._compare(got, ref, s, kind))
        return checks

    def _compare(self, got: torch.Tensor, ref: torch.Tensor, s: tuple[int, int], kind: str) -> dict[str, Any]:
        where = f"{s[0]}x{s[1]}"
        if not self.quantize:
            err = relative_error(got, ref)
            self.log(f"check {kind} at {where}: relative error {err:.2e} against eager")
            if not err <= self.rtol:
                raise ExportCheckError(f"{self.name}: the {kind} program disagrees with eager at {where} (relative "
                                       f"error {err:.2e} > {self.rtol:.0e}); nothing was written")
            return {"size": list(s), "rel_err": err}
        if not bool(torch.isfinite(got).all()):
            raise ExportCheckError(f"{self.name}: the {kind} program gives non-finite outputs at {where}; nothing "
                                   "was written")
        agree = logit_agreement(got, ref)
        self.log(f"check {kind} at {where} on {got.shape[0]} input(s) against eager fp32: top-1 agreement "
                 f"{100 * agree['top1_agreement']:.1f} %, max abs error {agree['max_abs_err']:.3g}, mean abs error "
                 f"{agree['mean_abs_err']:.3g} (relative {agree['rel_err']:.2e})")
        return {"size": list(s), **agree}
