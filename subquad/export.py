"""Export a model for deployment: ONNX (`torch.onnx.export(dynamo=True)`) or a `torch.export` program (`.pt2`).

`export_model` traces the model once with `torch.export`, with the batch and, when `dynamic`, the image height and
width symbolic over every size the model admits in eager: any side from its minimum input size (its total stride)
up to 2048, padded inside the program exactly as eager pads it. It writes the file next to its destination, checks the
written program against eager PyTorch at the export size (and, when dynamic, at a second, non-square size that is not
a multiple of the total stride, so that every padding path runs), and only then moves it into place. A file that
disagrees with eager is never left behind.

The ONNX path needs the `export` extra (`pip install "subquad[export]"`: onnx, onnxscript, onnxruntime); the `.pt2`
path needs only torch. The check runs the `.onnx` file in ONNX Runtime and the `.pt2` file through
`torch.export.load`, i.e. what a deployment would load.
"""

from __future__ import annotations

import importlib.util
import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .backend import real_dft
from .errors import UserError

__all__ = ["FORMATS", "MAX_SIDE", "ExportCheckError", "admissible", "export_model", "relative_error"]

FORMATS = ("onnx", "pt2")
SUFFIX = {"onnx": ".onnx", "pt2": ".pt2"}
MAX_SIDE = 2048
# Relative error (max-abs difference over the eager output's max-abs) above which a written file is refused. fp32
# programs agree to ~1e-6; the acceptance bound for ONNX Runtime is 1e-4.
RTOL = 1e-4
EXTRA = {"onnx": ("onnx", "onnxscript", "onnxruntime")}


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
                 log=print) -> dict[str, Any]:
    """Export `model` (switched to eval mode) to `out` in `fmt` ('onnx' or 'pt2') and check the file against eager.

    Args:
        img_size: (H, W) of the example input (default: the model's `pretrained_cfg['input_size']`).
        dynamic: H and W symbolic over the admissible sizes (the batch is always symbolic).
        overwrite: replace an earlier export of the same format at `out`.
        protect: input files `out` must not be.
        rtol: the largest relative error (see `relative_error`) a written file may have.
        check_sizes: the (H, W) sizes to check the file at (default: the export size, and with `dynamic` one other
            admissible, non-square size).
    Returns:
        {"file", "format", "dynamic", "checks": [{"size": [H, W], "rel_err": float}, ...]}.
    Raises:
        UserError: an unknown format, a size the model can't take, a missing extra, a bad output path.
        ExportCheckError: the written program disagrees with eager (the file is removed).
    """
    name = name or (getattr(model, "pretrained_cfg", None) or {}).get("architecture", type(model).__name__)
    dest = check_output(out, fmt, overwrite, protect)
    _need_extra(fmt)
    if getattr(model, "input_ndim", 4) != 4:
        raise UserError(f"{name} takes video clips; `subquad export` covers image models")
    cfg = getattr(model, "pretrained_cfg", None) or {}
    if img_size is None:
        img_size = tuple(cfg.get("input_size", (3, 224, 224))[1:])
    size = (int(img_size[0]), int(img_size[-1]))
    _check_size(model, size, name)
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
    with torch.no_grad(), real_dft(fmt == "onnx" or dynamic):
        prog = torch.export.export(model, (ex,), dynamic_shapes=_dynamic_shapes(stride, low, dynamic), strict=False)
    covered = covered_sides(prog)
    if dynamic:
        (h0, h1), (w0, w1) = covered
        if not (h0 <= size[0] <= h1 and w0 <= size[1] <= w1):
            raise UserError(f"the dynamic program of {name} covers H {h0}-{h1} and W {w0}-{w1}; "
                            f"{size[0]}x{size[1]} is outside: export dynamic at a size in that range, or "
                            "export this size without --dynamic (nothing was written)")
    tmp = dest.with_name(f".{dest.name}.tmp{os.getpid()}{dest.suffix}")
    try:
        _write_program(prog, ex, fmt, tmp, covered)
        sizes = [tuple(c) for c in check_sizes] if check_sizes else \
            [size] + ([_second_size(size, stride, low, covered)] if dynamic else [])
        if not dynamic and any(s != size for s in sizes):
            raise UserError(f"a static export runs at {size[0]}x{size[1]} only; pass dynamic=True to check others")
        for s in sizes:
            _check_size(model, s, name)
        checks = _check_program(model, tmp, fmt, sizes, size, chans, gen, name, rtol, log)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    return {"file": str(dest), "format": fmt, "dynamic": dynamic, "checks": checks,
            "covers": {"H": list(covered[0]), "W": list(covered[1])}}


def _write_program(prog: Any, ex: torch.Tensor, fmt: str, path: Path, covered) -> None:
    """Save the exported program `prog` (traced on `ex`) to `path` as a .pt2 archive or an ONNX file.

    A .pt2 program refuses a size outside `covered` itself (its range constraints). An ONNX graph has no such
    check, so the file says in its metadata which sides it was checked for: `subquad.input_height` and
    `subquad.input_width`, "MIN-MAX" (ONNX Runtime: `session.get_modelmeta().custom_metadata_map`)."""
    if fmt == "pt2":
        torch.export.save(prog, str(path))
        return
    onnx_prog = torch.onnx.export(prog, (ex,), dynamo=True, verbose=False)
    onnx_prog.model.metadata_props.update({"subquad.input_height": f"{covered[0][0]}-{covered[0][1]}",
                                           "subquad.input_width": f"{covered[1][0]}-{covered[1][1]}"})
    onnx_prog.save(str(path))


def _check_program(model: nn.Module, path: Path, fmt: str, sizes: list[tuple[int, int]], size: tuple[int, int],
                   chans: int, gen: torch.Generator, name: str, rtol: float, log) -> list[dict[str, Any]]:
    """Run the file at `path` at each of `sizes` (batch 2 at the export `size`, else 1; inputs drawn from `gen`) and
    compare it with eager; an error above `rtol`, or a file that does not run, raises ExportCheckError."""
    checks = []
    try:
        run = _load_file(path, fmt)
    except Exception as e:  # noqa: BLE001 - re-raised, the file is removed
        raise ExportCheckError(f"{name}: the written {fmt} file does not load ({type(e).__name__}: "
                               f"{str(e).splitlines()[0][:300] if str(e) else ''}); nothing was written") from e
    for s in sizes:
        xs = torch.randn(2 if s == size else 1, chans, *s, generator=gen)
        with torch.no_grad():
            ref = model(xs)
        try:
            got = run(xs)
        except Exception as e:  # noqa: BLE001 - re-raised with the size, the file is removed
            raise ExportCheckError(f"{name}: the {fmt} program does not run at {s[0]}x{s[1]} ({type(e).__name__}: "
                                   f"{str(e).splitlines()[0][:300]}); nothing was written") from e
        err = relative_error(got, ref)
        checks.append({"size": list(s), "rel_err": err})
        log(f"check {fmt} at {s[0]}x{s[1]}: relative error {err:.2e} against eager")
        if not err <= rtol:
            raise ExportCheckError(f"{name}: the {fmt} program disagrees with eager at {s[0]}x{s[1]} (relative "
                                   f"error {err:.2e} > {rtol:.0e}); nothing was written")
    return checks
