"""Benchmark sweeps: every mechanism over token grids, every model over image sizes; CSV rows and plots.

Rows use timm's benchmark columns (`infer_samples_per_sec`, `infer_step_time` in ms, `infer_batch_size`,
`infer_img_size`, `infer_gmacs`, the `train_*` equivalents, `param_count`) plus `peak_mem_mb` (forward) and
`train_peak_mem_mb` (forward + backward), `seq_len`, `device`, `torch`, `subquad` and a `status` that says why a
size was skipped or refused. Time is the median of repeats after warm-up (`timing.time_fn`); memory is the peak
allocated by one step beyond parameters and inputs (`memory.peak_memory`); GMACs are counted on the meta device
(`flops.count_module_macs` / `count_macs`).

A size is skipped for a mechanism (and every larger size after it) when the memory or time of one step, extrapolated
from the sizes already measured, would exceed the budget (`max_mem_mb`, `max_time_s`). Before numbers are recorded,
each step's outputs (and gradients with backward) must be finite; a mechanism that fails is refused unless
`force=True`, and forced rows are marked `forced=1`. This is a cheap sanity gate, not the test suite: run
`make test` before committing results.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import numbers
import os
import platform
import re
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import UserError
from ..files import atomic_savefig
from .memory import peak_memory
from .timing import time_fn

__all__ = ["ATTN_COLUMNS", "MODEL_COLUMNS", "attention_candidates", "sweep_attention", "bench_models",
           "check_model_sizes", "device_tag", "default_result_path", "new_result_path", "new_output", "write_csv",
           "read_csv", "plot_attention", "plot_models"]

_log = logging.getLogger(__name__)


def _reported(e: BaseException) -> None:
    """A sweep reports a failure in its row and goes on; its traceback is logged at debug level, and SUBQUAD_DEBUG=1
    re-raises it instead (a library bug then shows where it is)."""
    if os.environ.get("SUBQUAD_DEBUG"):
        raise e
    _log.debug("reported in the row", exc_info=e)

ATTN_COLUMNS = ["name", "grid", "seq_len", "dim", "heads", "infer_batch_size", "infer_img_size", "infer_step_time",
                "infer_samples_per_sec", "infer_gmacs", "peak_mem_mb", "infer_time_vs_softmax", "train_step_time",
                "train_samples_per_sec", "train_peak_mem_mb", "train_time_vs_softmax", "param_count", "complexity",
                "time_spread_pct", "status", "forced", "device", "threads", "torch", "subquad", "kept_freed_mib"]
MODEL_COLUMNS = ["model", "infer_img_size", "infer_batch_size", "infer_step_time", "infer_samples_per_sec",
                 "infer_gmacs", "peak_mem_mb", "train_img_size", "train_batch_size", "train_step_time",
                 "train_samples_per_sec", "train_peak_mem_mb", "param_count", "time_spread_pct", "status", "forced",
                 "device", "threads", "torch", "subquad", "compiled", "precision", "backend", "speedup_vs_fp32_eager",
                 "achieved_gflops", "gemm_gflops", "gemm_fraction", "kept_freed_mib"]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def cpuinfo_field(name: str, path: str = "/proc/cpuinfo") -> str:
    """The first value of the field `name` in /proc/cpuinfo ('' where there is none)."""
    try:
        with open(path) as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return ""


def _cpu_name() -> str:
    return cpuinfo_field("model name") or platform.processor() or platform.machine() or "cpu"


def script_setup(models: Sequence[str], threads: int | None) -> dict:
    """What a benchmark script (`benchmarks/`) does before it times anything: refuse unknown model names in one
    line, keep freed memory as the `subquad` command does (SUBQUAD_KEEP_FREED_MIB), set torch's threads. Returns the
    environment columns of its rows: kept_freed_mib, threads, cpu, cpu_family, torch."""
    from .. import backend
    from ..errors import UserError
    from ..models import list_models

    unknown = [m for m in models if m not in list_models()]
    if unknown:
        raise UserError(f"--model: unknown model(s) {', '.join(unknown)} (`subquad list` names them)")
    backend.keep_freed_memory_from_env()
    if threads:
        torch.set_num_threads(threads)
    return dict(kept_freed_mib=backend.kept_freed_memory() // 2 ** 20, threads=torch.get_num_threads(),
                cpu=_cpu_name(), cpu_family=cpuinfo_field("cpu family"), torch=torch.__version__)


def device_tag(device: torch.device | str) -> str:
    """Hardware name for result files: e.g. 'cpu-amd-epyc-7b13-2t' (threads used) or 'cuda-nvidia-h200'."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda-{_slug(torch.cuda.get_device_name(device))}"
    name = _slug(_cpu_name())
    for noise in ("-processor", "-cpu", "-with-radeon-graphics"):
        name = name.replace(noise, "")
    name = re.sub(r"-\d+-core$", "", name)
    return f"cpu-{name}-{torch.get_num_threads()}t"


def torch_tag() -> str:
    """'pt' + torch's release digits, as timm names its result files (2.14.1 -> pt2141)."""
    return "pt" + torch.__version__.split("+")[0].replace(".", "")


def default_result_path(kind: str, device: torch.device | str, root: str | Path | None = None) -> Path:
    """`<root>/bench-<kind>-<device tag>-pt<torch>.csv`; root defaults to benchmarks/results when that exists."""
    if root is None:
        root = Path("benchmarks/results") if Path("benchmarks/results").is_dir() else Path(".")
    return Path(root) / f"bench-{kind}-{device_tag(device)}-{torch_tag()}.csv"


def new_result_path(kind: str, device: torch.device | str, root: str | Path = "runs") -> Path:
    """A new file `<root>/bench-<kind>-<device tag>-pt<torch>-<YYYYmmdd-HHMMSS>[-i].csv` (the default of `subquad
    bench`: a run never replaces an existing file, committed results included)."""
    import time

    stem = f"bench-{kind}-{device_tag(device)}-{torch_tag()}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, i = Path(root) / f"{stem}.csv", 1
    while path.exists() or path.with_suffix(".png").exists():
        i += 1
        path = Path(root) / f"{stem}-{i}.csv"
    return path


def _env(device: torch.device) -> dict[str, str | int]:
    """The run's setting columns; kept_freed_mib: the freed memory glibc keeps for reuse (`subquad.backend.
    keep_freed_memory`; the `subquad` command sets 256 MiB, 0 = glibc's defaults)."""
    from ..backend import kept_freed_memory
    from ..version import __version__

    return {"device": device_tag(device), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "subquad": __version__, "kept_freed_mib": kept_freed_memory() // 2 ** 20}


def attention_candidates() -> list[str]:
    """Registered mechanisms that run bidirectionally on a 2-D token grid (every mechanism takes hw)."""
    from ..attention import ATTENTION_REGISTRY

    return [n for n in ATTENTION_REGISTRY.names() if ATTENTION_REGISTRY.get(n).builder.caps.bidirectional]


def _finite(*tensors: torch.Tensor | None) -> bool:
    return all(t is None or bool(torch.isfinite(t).all()) for t in tensors)


def _extrapolate(history: list[tuple[float, float]], size: float, max_slope: float) -> float | None:
    """Predict a cost at `size` from (size, cost) pairs on a log-log line.

    The slope is measured on the last two points and clamped to [1, max_slope] (max_slope: 2 for O(N^2)
    mechanisms, else 1), so one noisy timing on a shared machine cannot stop a sweep early; with one point the
    slope is 1 (small sizes are dominated by the linear projections).
    """
    pts = [(s, c) for s, c in history if c > 0]
    if not pts:
        return None
    s1, c1 = pts[-1]
    slope = 1.0
    if len(pts) >= 2:
        s0, c0 = pts[-2]
        if s1 > s0:
            slope = min(max_slope, max(1.0, math.log(c1 / c0) / math.log(s1 / s0)))
    return c1 * (size / s1) ** slope


class _Budget:
    """Per (name, mode) history of measured steps and the skip decision for the next size."""

    def __init__(self, max_mem_mb: float | None, max_time_s: float | None, calls: int) -> None:
        self.max_mem_mb, self.max_time_s, self.calls = max_mem_mb, max_time_s, calls
        self.mem: dict[tuple, list] = {}
        self.time: dict[tuple, list] = {}
        self.stopped: dict[tuple, str] = {}

    def reason(self, key: tuple, size: float, slope: float) -> str | None:
        if key in self.stopped:
            return f"skipped: {self.stopped[key]} at a smaller size"
        mem = _extrapolate(self.mem.get(key, []), size, slope)
        if self.max_mem_mb is not None and mem is not None and mem > self.max_mem_mb:
            self.stopped[key] = "over --max-mem"
            return f"skipped: estimated {mem:.0f} MiB > --max-mem {self.max_mem_mb:.0f} MiB"
        t = _extrapolate(self.time.get(key, []), size, slope)
        if self.max_time_s is not None and t is not None and t * self.calls > self.max_time_s:
            self.stopped[key] = "over --max-time"
            total = t * self.calls
            return f"skipped: estimated {total:.0f} s for {self.calls} steps > --max-time {self.max_time_s:.0f} s"
        return None

    def record(self, key: tuple, size: float, mem_mb: float, step_s: float) -> None:
        """Add a measurement; `step_s` should be the fastest repeat (robust to other processes' load)."""
        self.mem.setdefault(key, []).append((size, mem_mb))
        self.time.setdefault(key, []).append((size, step_s))


# Fast steps are repeated until their timed calls add up to this long (at most 200 calls): one-shot medians of a
# millisecond step move by tens of percent on a shared machine.
MIN_TIME_S = 1.0


def _measure(step: Callable[[], object], device: torch.device, warmup: int, repeats: int,
             budget_s: float | None) -> tuple[float, float, float, float]:
    """(median seconds, best seconds, peak MiB, spread of the repeats) of `step`."""
    timing = time_fn(step, device, warmup=warmup, repeats=repeats, budget_s=budget_s, min_time_s=MIN_TIME_S)
    mem = peak_memory(step, device) / 2**20
    return timing.median, timing.best, mem, timing.spread


def _record(row: dict[str, Any], mode: str, sec: float, mem: float, spread: float, batch_size: int) -> None:
    """Put one measured mode into its row (times in ms, the row's spread the largest of its modes, in %)."""
    row.update({f"{mode}_step_time": _ms(sec), f"{mode}_samples_per_sec": round(batch_size / sec, 3),
                "peak_mem_mb" if mode == "infer" else "train_peak_mem_mb": round(mem, 3)})
    row["time_spread_pct"] = max(float(row.get("time_spread_pct") or 0.0), round(100 * spread, 1))


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


class _Sweep:
    """What every measured mode of a sweep shares: the device, the skip budget, the timing settings and `force`."""

    def __init__(self, device: torch.device, max_mem_mb: float | None, max_time_s: float | None, warmup: int,
                 repeats: int, force: bool, batch_size: int) -> None:
        self.device, self.warmup, self.repeats, self.force, self.batch_size = device, warmup, repeats, force, batch_size
        self.env = _env(device)
        self.budget = _Budget(max_mem_mb, max_time_s, warmup + repeats + 1)
        self.step_budget = None if max_time_s is None else max_time_s / 2
        # The machine's GEMM rate per precision (measured once per run) and the folder of ONNX exports.
        self.gemm: dict[str, float] = {}
        self.folder: str | None = None

    def measure(self, row: dict[str, Any], status: list[str], key: tuple, size: float, slope: float,
                make_step: Callable[[], tuple[Callable[[], object], Callable[[object], str | None]]]) -> bool:
        """Measure mode `key[1]` of `row` at `size` unless the budget skips it; True when it was measured.

        `make_step()` (called once the budget allows the size) returns the step and a check of its result that
        names what is not finite ('output' / 'gradients') or returns None. A refusal, skip or error goes into
        `status`; a refusal, a budget skip or running out of memory stops this (name, mode) at larger sizes, while
        another error does not (with non-square sizes, a larger size need not contain a failing one)."""
        mode = key[1]
        why = self.budget.reason(key, size, slope)
        if why:
            status.append(f"{mode} {why}")
            return False
        step, non_finite = make_step()
        try:
            bad = non_finite(step())
            if bad and not self.force:
                status.append(f"{mode} refused: non-finite {bad} (--force records it)")
                self.budget.stopped[key] = "refused"
                return False
            if bad:
                row["forced"] = 1
            sec, best, mem, spread = _measure(step, self.device, max(0, self.warmup - 1), self.repeats,
                                              self.step_budget)
        except Exception as e:  # noqa: BLE001 - report the failure in the row and go on
            _reported(e)
            msg = str(e).splitlines()[0][:160] if str(e) else ""
            status.append(f"{mode} error: {type(e).__name__}: {msg}")
            if isinstance(e, MemoryError) or "out of memory" in str(e).lower():
                self.budget.stopped[key] = "out of memory"
            return False
        self.budget.record(key, size, mem, best)
        _record(row, mode, sec, mem, spread, self.batch_size)
        return True


def _build_failed(row: dict[str, Any], e: Exception) -> dict[str, Any]:
    row["status"] = f"error: build failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return row


def sweep_attention(names: Sequence[str] | None = None, dim: int = 192, heads: int = 6,
                    tokens: Sequence[int] = (14, 28, 56, 112, 224), backward: bool = False, batch_size: int = 1,
                    device: str | torch.device = "cpu", max_mem_mb: float | None = 8192.0,
                    max_time_s: float | None = 120.0, warmup: int = 1, repeats: int = 5, force: bool = False,
                    attn_kwargs: dict[str, dict[str, Any]] | None = None,
                    on_row: Callable[[dict], None] | None = None) -> list[dict]:
    """Time, peak memory and GMACs of mechanisms on square t x t token grids.

    Args:
        names: mechanisms (default: `attention_candidates()`); "softmax" is always added as the baseline.
        dim: channels C; heads: heads h (C % h == 0).
        tokens: grid sides t (N = t * t tokens); measured in increasing order.
        backward: also time forward + backward (gradients of the input and every parameter).
        batch_size: B.
        device: 'cpu' or a CUDA device.
        max_mem_mb: skip a size (and larger ones) whose peak memory, extrapolated from smaller sizes, exceeds this.
        max_time_s: skip a size whose warm-up + repeats + memory probe would take longer than this.
        warmup, repeats: untimed and timed calls per measurement.
        force: record mechanisms whose outputs or gradients are not finite (rows marked forced=1).
        attn_kwargs: extra constructor options per mechanism name.
        on_row: called with each finished row (progress printing).
    Returns:
        rows with `ATTN_COLUMNS` (ratios to "softmax" at the same grid filled in at the end).
    """
    from ..attention import ATTENTION_REGISTRY

    device = torch.device(device)
    names = list(dict.fromkeys(["softmax", *(names if names else attention_candidates())]))
    for n in names:
        ATTENTION_REGISTRY.get(n)
    bad = [t for t in tokens if int(t) < 1]
    if bad or dim % heads:
        raise UserError(f"need positive grid sides and dim % heads == 0, got tokens={list(tokens)}, "
                        f"dim={dim}, heads={heads}")
    sweep = _Sweep(device, max_mem_mb, max_time_s, warmup, repeats, force, batch_size)
    rows: list[dict] = []
    for name in names:
        for t in sorted({int(t) for t in tokens}):
            row = _attention_row(sweep, name, t, dim, heads, backward, (attn_kwargs or {}).get(name, {}))
            rows.append(row)
            # softmax is measured first, so each row's ratio is known when it is shown (a row that failed to build
            # has no times, so it gets no ratio).
            _ratio(row, next((r for r in rows if r["name"] == "softmax" and r["grid"] == row["grid"]), None))
            if on_row:
                on_row(row)
    return rows


def _attention_row(sweep: _Sweep, name: str, t: int, dim: int, heads: int, backward: bool,
                   extra: dict[str, Any]) -> dict[str, Any]:
    """The row of mechanism `name` on a t x t grid: built, counted, then each mode measured."""
    from ..attention import ATTENTION_REGISTRY, build_attention

    caps = ATTENTION_REGISTRY.get(name).builder.caps
    slope = 2.0 if "N^2" in caps.complexity or "N²" in caps.complexity else 1.2
    N, device, batch_size = t * t, sweep.device, sweep.batch_size
    row: dict[str, Any] = dict.fromkeys(ATTN_COLUMNS, "")
    row.update(name=name, grid=f"{t}x{t}", seq_len=N, dim=dim, heads=heads, infer_batch_size=batch_size,
               infer_img_size=t, complexity=caps.complexity, forced=0, **sweep.env)
    status: list[str] = []
    kw = {"input_size": (t, t), **extra}
    try:
        module = build_attention(name, dim, heads, device=device, **kw).eval()
        meta = build_attention(name, dim, heads, device="meta", **kw).eval()
        row["param_count"] = sum(p.numel() for p in module.parameters())
    except Exception as e:  # noqa: BLE001 - a mechanism that cannot be built is reported, not fatal
        _reported(e)
        return _build_failed(row, e)
    x = torch.randn(batch_size, N, dim, device=device)
    row["infer_gmacs"] = _attn_gmacs(meta, module, x, t)
    for mode, grad in [("infer", False)] + ([("train", True)] if backward else []):

        def make_step(grad=grad):
            xin = x.detach().requires_grad_(grad)

            def step():
                if grad:
                    for p in module.parameters():
                        p.grad = None
                    xin.grad = None
                    module(xin, (t, t)).sum().backward()
                    return None
                with torch.no_grad():
                    return module(xin, (t, t))

            def non_finite(out):
                grads = [xin.grad] + [p.grad for p in module.parameters()] if grad else []
                return None if _finite(out, *grads) else ("gradients" if grad else "output")

            return step, non_finite

        sweep.measure(row, status, (name, mode), N, slope, make_step)
    row["status"] = "; ".join(status) or "ok"
    return row


def _attn_gmacs(meta: torch.nn.Module, module: torch.nn.Module, x: torch.Tensor, t: int) -> float | str:
    """GMACs of one forward, counted on meta; on the real module when a mechanism cannot run on meta."""
    from .flops import count_module_macs

    for m, inp in ((meta, torch.empty(x.shape, device="meta")), (module, x)):
        try:
            return float(f'{count_module_macs(m, inp, hw=(t, t))["gmacs"]:.6g}')
        except Exception as e:  # noqa: BLE001 - counting is best effort; timing still runs
            _reported(e)
            _log.debug("GMACs of %s at %s on %s failed: %s", type(m).__name__, t, inp.device, e)
    return ""


def _ratio(row: dict, base: dict | None) -> None:
    """Fill `*_time_vs_softmax` = step time / the softmax row's step time at the same grid (< 1: faster)."""
    for mode in ("infer", "train"):
        t, tb = row.get(f"{mode}_step_time"), (base or {}).get(f"{mode}_step_time")
        if t not in ("", None) and tb not in ("", None) and float(tb) > 0:
            row[f"{mode}_time_vs_softmax"] = round(float(t) / float(tb), 4)


def _is_subquad(name: str) -> bool:
    from ..models import is_subquad_model

    return is_subquad_model(name)


def image_size(size: int | str | Sequence[int]) -> tuple[int, int]:
    """(H, W) of an image size given as a side (224), 'HxW' ('224x320') or a pair; refused (one line) unless
    both are positive integers."""
    def side(v: Any) -> int:
        if isinstance(v, bool) or (isinstance(v, str) and not v.strip().isdigit()) or int(v) != float(v):
            raise ValueError(v)
        return int(v)

    try:
        if isinstance(size, str):
            hw = tuple(side(p) for p in size.lower().split("x"))
        elif isinstance(size, numbers.Real):
            hw = (side(size), side(size))
        else:
            hw = tuple(side(v) for v in size)
    except (TypeError, ValueError):
        hw = ()
    if len(hw) == 1:
        hw = (hw[0], hw[0])
    if len(hw) != 2 or min(hw) < 1:
        raise UserError(f"image size {size!r}: expected a positive side S or HxW (for example 224 or 224x320)")
    return hw  # type: ignore[return-value]


def size_label(hw: tuple[int, int]) -> str | int:
    """The `infer_img_size` of (H, W): the side when square (224), else 'HxW' ('224x320')."""
    return hw[0] if hw[0] == hw[1] else f"{hw[0]}x{hw[1]}"


def _model_kwargs(name: str, size: int | tuple[int, int]) -> dict[str, Any]:
    """Construction options for `name` at `size` (`subquad.bench.flops.size_kwargs`)."""
    from .flops import size_kwargs

    return size_kwargs(name, image_size(size))


def check_model_names(models: Sequence[str]) -> None:
    """Raise the one-line unknown-model error for the first name neither subquad nor timm registers."""
    import timm

    from ..errors import unknown_name
    from ..models import list_models

    for m in models:
        if not timm.is_model(m.split(".")[0]):
            raise unknown_name("model", m, list_models() + timm.list_models())


def check_model_sizes(models: Sequence[str], img_sizes: Sequence[int | str | tuple[int, int]]) -> None:
    """Refuse (one-line UserError) a size below what a subquad model takes (its total stride), found by a forward on
    the meta device at each size asked, before anything is measured or written."""
    from ..models import create_model
    from ..models._base import InputShapeError

    sizes = sorted({image_size(s) for s in img_sizes}, key=lambda hw: (hw[0] * hw[1], hw))
    for name in models:
        if not _is_subquad(name):
            continue
        model = create_model(name, device="meta").eval()
        in_chans = getattr(model, "pretrained_cfg", {}).get("input_size", (3,))[0]
        for hw in sizes:
            try:
                with torch.no_grad():
                    model(torch.empty(1, in_chans, *hw, device="meta"))
            except InputShapeError as e:
                raise UserError(f"--img-size {size_label(hw)} is too small for {name}: {e}") from None


def bench_models(models: Sequence[str], img_sizes: Sequence[int | str | tuple[int, int]] = (224,), batch_size: int = 1,
                 backward: bool = False, device: str | torch.device = "cpu", max_mem_mb: float | None = 8192.0,
                 max_time_s: float | None = 300.0, warmup: int = 1, repeats: int = 5, force: bool = False,
                 on_row: Callable[[dict], None] | None = None, compile: bool = False,
                 precisions: Sequence[str] = ("fp32",), backends: Sequence[str] | None = None) -> list[dict]:
    """Latency, images/s, peak memory, params and GMACs of image models at image sizes, per precision and backend.

    Args:
        models: registered names (subquad's or timm's).
        img_sizes: input sizes: a side S (S x S), 'HxW' or (H, W); measured in increasing order of pixels per model.
            `infer_img_size` is S for a square size and 'HxW' otherwise.
        batch_size: images per step.
        backward: also time a training step (forward, cross-entropy on random labels, backward; no optimizer step;
            eager and compile only).
        device, max_mem_mb, max_time_s, warmup, repeats, force, on_row: as in `sweep_attention`.
        compile: the same as backends=('compile',) (kept for earlier callers).
        precisions: 'fp32', 'bf16', 'int8' (see `subquad.bench.precision`).
        backends: 'eager', 'compile' (torch.compile; the untimed first call compiles, each (size, precision) after
            `torch._dynamo.reset()`, which clears every compiled graph of the process), 'onnxruntime'.
    Returns:
        rows with `MODEL_COLUMNS`: one per (model, size, precision, backend); a pair that does not exist has a row
        whose `status` says why it was skipped. `speedup_vs_fp32_eager` is filled when fp32 eager was measured.
    """
    from .precision import check_pairs

    device = torch.device(device)
    backends = list(backends) if backends else (["compile"] if compile else ["eager"])
    check_pairs(precisions, backends)
    check_model_names(models)
    sizes = sorted({image_size(s) for s in img_sizes}, key=lambda hw: (hw[0] * hw[1], hw))
    if batch_size < 1:
        raise UserError(f"need a positive --batch-size, got {batch_size}")
    check_model_sizes(models, img_sizes)
    sweep = _Sweep(device, max_mem_mb, max_time_s, warmup, repeats, force, batch_size)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="subquad-bench-") as folder:
        sweep.folder = folder
        for name in models:
            for size in sizes:
                built: dict[str, Any] = {}
                group = [_model_row(sweep, name, size, backward, be, prec, built)
                         for prec in precisions for be in backends]
                _speedups(group)
                for row in group:
                    rows.append(row)
                    if on_row:
                        on_row(row)
    return rows


def _pixels(label: Any) -> float:
    """H x W of an `infer_img_size` cell (224 or '224x320'); 0 when empty or unreadable."""
    try:
        if isinstance(label, str) and label.replace(".", "", 1).isdigit():
            label = float(label)  # a CSV cell read back: '224' or '224.0'
        h, w = image_size(label)
    except (UserError, ValueError):
        return 0.0
    return float(h * w)


def _speedups(group: list[dict]) -> None:
    """speedup_vs_fp32_eager of each measured row of one (model, size): fp32 eager step time over the row's."""
    base = next((_num(r.get("infer_step_time")) for r in group
                 if r.get("precision") == "fp32" and r.get("backend") == "eager"), None)
    for r in group:
        t = _num(r.get("infer_step_time"))
        if base and t:
            r["speedup_vs_fp32_eager"] = round(base / t, 3)


def _build_model(name: str, size: tuple[int, int], device: torch.device) -> tuple[torch.nn.Module, dict[str, Any]]:
    """`name` built for `size` on `device`, and the construction options used."""
    from ..models import create_model

    kw = _model_kwargs(name, size)
    try:
        return create_model(name, **kw).to(device), kw
    except TypeError as e:  # a timm model that runs at any size and takes no img_size (PVTv2)
        if "img_size" not in kw or "img_size" not in str(e):
            raise
        return create_model(name).to(device), {}


def _built(built: dict[str, Any], name: str, size: tuple[int, int], sweep: _Sweep) -> dict[str, Any]:
    """The model of one (model, size), built once and shared by its precisions and backends, with its GMACs."""
    from ..models import create_model
    from .flops import count_macs

    if built:
        return built
    built["model"], kw = _build_model(name, size, sweep.device)
    built["params"] = sum(p.numel() for p in built["model"].parameters())
    try:
        meta = create_model(name, device="meta", **kw)
        built["gmacs"] = float(f'{count_macs(meta, size, batch_size=sweep.batch_size)["gmacs"]:.6g}')
    except Exception as e:  # noqa: BLE001 - counting is best effort
        _reported(e)
        _log.debug("GMACs of %s at %s failed: %s", name, size, e)
        built["gmacs"] = ""
    return built


def _model_row(sweep: _Sweep, name: str, size: tuple[int, int], backward: bool, backend: str = "eager",
               precision: str = "fp32", built: dict[str, Any] | None = None) -> dict[str, Any]:
    """The row of model `name` at size (H, W) in `precision` on `backend`: built, counted, then each mode
    measured (or the reason the pair does not run)."""
    from .precision import skip_reason

    device, batch_size = sweep.device, sweep.batch_size
    row: dict[str, Any] = dict.fromkeys(MODEL_COLUMNS, "")
    row.update(model=name, infer_img_size=size_label(size), infer_batch_size=batch_size, forced=0,
               compiled=int(backend == "compile"), precision=precision, backend=backend, **sweep.env)
    why = skip_reason(precision, backend, device)
    if why:
        row["status"] = why
        return row
    try:
        b = _built(built if built is not None else {}, name, size, sweep)
    except Exception as e:  # noqa: BLE001 - reported in the row
        _reported(e)
        return _build_failed(row, e)
    model = b["model"]
    row.update(param_count=b["params"], infer_gmacs=b["gmacs"])
    in_chans = getattr(model, "pretrained_cfg", {}).get("input_size", (3,))[0]
    x = torch.randn(batch_size, in_chans, *size, device=device)
    status: list[str] = []
    modes = [("infer", False)] + ([("train", True)] if backward and backend != "onnxruntime" and precision != "int8"
                                  else [])
    if backward and backend == "onnxruntime":
        status.append("train not measured: ONNX Runtime runs inference only")
    elif backward and precision == "int8":
        status.append("train not measured: the int8 layers run inference only")
    for mode, grad in modes:
        make_step = _step_maker(sweep, b, x, grad, backend, precision, size)
        with _serving_region(precision, x.device, grad, backend):
            measured = sweep.measure(row, status, (name, mode, precision, backend), size[0] * size[1], 2.0,
                                     make_step)
        if measured and mode == "train":
            row.update(train_img_size=size_label(size), train_batch_size=batch_size)
    model.eval()
    if backend == "onnxruntime":
        row["peak_mem_mb"] = ""  # ONNX Runtime allocates outside torch's allocator probe
    _rates(sweep, row, precision, backend)
    row["status"] = "; ".join(status) or "ok"
    return row


def _serving_region(precision: str, device: torch.device, grad: bool, backend: str):
    """The autocast region around all timed inference steps of a bf16 torch path, as a serving loop holds it
    (`with torch.autocast(...): for batch in stream: model(batch)`): each step still enters its own region inside,
    and autocast casts each fp32 weight to bf16 once for the whole region (its weight cache) instead of once per
    step. A training step (the weights would change) and fp32 get no outer region."""
    import contextlib

    from ..backend import precision_context

    if grad or precision == "fp32" or backend == "onnxruntime":
        return contextlib.nullcontext()
    return precision_context(precision, device)


def _step_maker(sweep: _Sweep, built: dict[str, Any], x: torch.Tensor, grad: bool, backend: str, precision: str,
                size: tuple[int, int]):
    """make_step for `_Sweep.measure`: the timed step of one mode and its finiteness check."""
    from ..backend import precision_context

    model = built["model"]

    def make_step():
        if backend == "onnxruntime":
            from .precision import ort_runner

            model.eval()
            run_ort = ort_runner(model, size, precision, sweep.folder, built)
            return (lambda: run_ort(x)), (lambda out: None if _finite(out) else "output")
        model.train(grad)
        run = model
        if precision == "int8":  # the int8 copy (quantized once per model and size, shared by eager and compile)
            if "int8" not in built:
                from ..layers.int8 import quantize_int8

                built["int8"] = quantize_int8(model)
            run = built["int8"]
        if backend == "compile":
            # A fresh dynamo cache per compiled (size, precision, mode), as a deployment compiling for one size has:
            # with the cache of an earlier size, dynamo would recompile the same code with symbolic shapes
            # (automatic dynamic shapes), and time a graph nobody deploying at this size runs (inline_cswin_tiny at
            # 512 px after 224 px: 0.77x fp32 eager in bf16 instead of 1.54x).
            torch._dynamo.reset()
            run = torch.compile(run)

        def step():
            with precision_context(precision, x.device):
                if grad:
                    model.zero_grad(set_to_none=True)
                    out = run(x)
                    target = torch.zeros(out.shape[0], dtype=torch.long, device=out.device)
                    torch.nn.functional.cross_entropy(out.float().flatten(1), target).backward()
                    return out.detach()
                with torch.no_grad():
                    return run(x)

        return step, lambda out: None if _finite(out) else "output"

    return make_step


def _rates(sweep: _Sweep, row: dict[str, Any], precision: str, backend: str = "eager") -> None:
    """achieved_gflops (2 x GMACs / forward step time) and its fraction of the machine's GEMM rate at `precision`
    (measured once per run, on CPU; int8 is ONNX Runtime's rate on that backend, torch._int_mm's elsewhere)."""
    from .precision import gemm_gflops

    t, gmacs = _num(row.get("infer_step_time")), _num(row.get("infer_gmacs"))
    if not t or not gmacs:
        return
    achieved = 2 * gmacs / (t / 1e3)
    # Significant digits, not decimals: a micro model's fraction of a bf16 GEMM rate is ~1e-3, which four decimals
    # would round by up to 5 %.
    row["achieved_gflops"] = float(f"{achieved:.6g}")
    if sweep.device.type != "cpu":
        return
    gemm = sweep.gemm
    key = precision if precision != "int8" or backend == "onnxruntime" else "int8-torch"
    if key not in gemm:
        gemm[key] = gemm_gflops(precision, backend=backend)
    row["gemm_gflops"] = round(gemm[key], 2)
    row["gemm_fraction"] = float(f"{achieved / gemm[key]:.4g}")


def interleaved_parser(doc: str, models: Sequence[str], rounds: int = 15,
                       per_round: str = "one step of each side per round") -> argparse.ArgumentParser:
    """The command line of a `benchmarks/` script whose sides alternate in one process (`interleaved_times`): --out,
    --model, --img-size, --rounds, --warmup, --threads; the script adds its own options. `doc`: the script's
    docstring (its first line is the description); `per_round`: what a round runs, for --rounds' help."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--out", required=True, help="CSV to write (refused if it exists)")
    p.add_argument("--model", nargs="+", default=list(models), metavar="NAME")
    p.add_argument("--img-size", type=int, nargs="+", default=[224, 512])
    p.add_argument("--rounds", type=int, default=rounds, help=f"timed rounds ({per_round})")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    return p


def check_interleaved_args(args, extra: Sequence[str] = ()) -> None:
    """One-line UserError unless --rounds, --img-size, --threads (and the `extra` int options, by attribute name) are
    positive and --warmup >= 0."""
    from ..errors import UserError

    values = [args.rounds, *args.img_size, *(getattr(args, e) for e in extra)]
    if min(values) < 1 or args.warmup < 0 or (args.threads is not None and args.threads < 1):
        names = ", ".join(["--rounds", "--img-size", *("--" + e.replace("_", "-") for e in extra), "--threads"])
        got = ", ".join([f"--rounds {args.rounds}", f"--img-size {' '.join(map(str, args.img_size))}",
                         *(f"--{e.replace('_', '-')} {getattr(args, e)}" for e in extra), f"--warmup {args.warmup}",
                         f"--threads {args.threads}"])
        raise UserError(f"{names} must be positive and --warmup >= 0 (got {got})")


def interleaved_times(sides: dict[str, Callable[[], object]], rounds: int, warmup: int = 0,
                      block: int = 1, pause: float = 0.0) -> dict[str, list[float]]:
    """Each side called once per round, the order flipping every round (so a drifting machine reaches every side
    alike): {side: [milliseconds of each of the `rounds` timed rounds]}, after `warmup` untimed rounds. With `block`
    > 1 a side's turn in a timed round is one untimed call, then `block` timed calls whose mean is the round's time.
    `pause` (seconds, untimed) is slept before each side's turn: sides with thread pools of their own (torch's and
    each ONNX Runtime session's) spin a while after their work, and on a 2-core machine an ONNX Runtime pool still
    spinning slowed the next fp32 `torch.matmul` blocks by up to 2x even after an untimed call (0.1 s removed it)."""
    import time

    times: dict[str, list[float]] = {side: [] for side in sides}
    for r in range(warmup + rounds):
        timed = r >= warmup
        for side in (list(sides) if r % 2 == 0 else list(reversed(sides))):
            if pause > 0:
                time.sleep(pause)
            fn = sides[side]
            if timed and block > 1:
                fn()
            steps = block if timed else 1
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            if timed:
                times[side].append((time.perf_counter() - t0) * 1e3 / steps)
    return times


def run_script(main: Callable[[], int], prog: str) -> None:
    """Run a benchmark script's `main()` and exit with its status; a user error exits as one line `prog: ...`
    (library bugs keep their traceback)."""
    import sys

    try:
        sys.exit(main())
    except UserError as e:
        sys.exit(f"{prog}: {e}")


def new_output(path: str | Path, flag: str = "--out") -> Path:
    """`path` as a Path, or a one-line UserError when it exists: a result is never replaced."""
    path = Path(path)
    if path.exists():
        raise UserError(f"{flag} {path} exists; choose a new file (a result is never replaced)")
    return path


def write_csv(rows: Iterable[dict], path: str | Path, columns: Sequence[str]) -> Path:
    """Write rows (missing keys empty) to `path` atomically (a temporary name renamed over it), creating its folder;
    returns the path."""
    from ..files import atomic_write

    rows = list(rows)

    def write(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow({c: r.get(c, "") for c in columns})

    return atomic_write(path, write)


def read_csv(path: str | Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) and f > 0 else None


def _slopes(ax, xs: Sequence[float], ys: Sequence[float]) -> None:
    """Dotted O(N) and O(N^2) guides through the geometric middle of the plotted data."""
    x0, x1 = min(xs), max(xs)
    if x1 <= x0:
        return
    xm = math.sqrt(x0 * x1)
    ym = math.exp(sum(math.log(y) for y in ys) / len(ys))
    for power, style, label in ((1, ":", "O(N) slope"), (2, "--", "O(N²) slope")):
        ax.plot([x0, x1], [ym * (x0 / xm) ** power, ym * (x1 / xm) ** power], style, color="0.5", lw=1.2,
                label=label, zorder=0)


def _token_ticks(ax, ns: Sequence[float]) -> None:
    """Major ticks at the measured token counts, labelled 'N (t²)' for square grids."""
    from matplotlib.ticker import NullFormatter, NullLocator

    labels = []
    for n in ns:
        t = math.isqrt(int(n))
        labels.append(f"{int(n)}\n({t}²)" if t * t == int(n) else f"{int(n)}")
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(list(ns), labels, fontsize=8)


def _finish_axis(ax, all_x: list, all_y: list, xlabel: str, label: str) -> None:
    """Log-log axes with the O(N)/O(N^2) guides, measured-size ticks, labels, grid and legend."""
    if all_x:
        _slopes(ax, all_x, all_y)
        ax.set_xscale("log")
        ax.set_yscale("log")
        _token_ticks(ax, sorted(set(all_x)))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(label + " (log scale)")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, ncol=2)


def _save(fig, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return path


def plot_attention(rows: Sequence[dict], path: str | Path, title: str | None = None) -> Path:
    """Time and peak memory against tokens N, log-log, one line per mechanism, O(N)/O(N²) guides; PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("infer_step_time", "forward time per call (ms)"), ("peak_mem_mb", "forward peak memory (MiB)")]
    if any(_num(r.get("train_step_time")) for r in rows):
        panels += [("train_step_time", "forward + backward time (ms)"),
                   ("train_peak_mem_mb", "forward + backward peak memory (MiB)")]
    ncols = 2
    nrows = len(panels) // 2
    fig, axes = plt.subplots(nrows, ncols, figsize=(12, 4.6 * nrows), squeeze=False)
    order = [n for n in dict.fromkeys(r["name"] for r in rows)]
    cmap = plt.get_cmap("tab20" if len(order) > 10 else "tab10")
    for ax, (col, label) in zip([a for rr in axes for a in rr], [(c, lab) for c, lab in panels]):
        all_x, all_y = [], []
        for i, name in enumerate(order):
            pts = sorted((_num(r["seq_len"]), _num(r.get(col))) for r in rows if r["name"] == name)
            pts = [(x, y) for x, y in pts if x and y]
            if not pts:
                continue
            xs, ys = zip(*pts)
            all_x += xs
            all_y += ys
            ax.plot(xs, ys, marker="o", ms=4, lw=2 if name == "softmax" else 1.4, color=cmap(i % cmap.N),
                    label=name)
        _finish_axis(ax, all_x, all_y, "tokens N = H x W (log scale)", label)
    r0 = rows[0] if rows else {}
    fig.suptitle(title or f"attention cost: C={r0.get('dim')}, heads={r0.get('heads')}, "
                 f"B={r0.get('infer_batch_size')}, fp32, {r0.get('device')}, torch {r0.get('torch')}", fontsize=11)
    return _save(fig, path)


def plot_models(rows: Sequence[dict], path: str | Path, title: str | None = None) -> Path:
    """Latency and peak memory against pixels, log-log, one line per model, O(N)/O(N²) guides; PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("infer_step_time", "forward latency (ms)"), ("peak_mem_mb", "forward peak memory (MiB)")]
    if any(_num(r.get("train_step_time")) for r in rows):
        panels += [("train_step_time", "train step time (ms)"), ("train_peak_mem_mb", "train peak memory (MiB)")]
    fig, axes = plt.subplots(len(panels) // 2, 2, figsize=(12, 4.6 * (len(panels) // 2)), squeeze=False)
    pairs = {(r.get("precision") or "fp32", r.get("backend") or "eager") for r in rows}

    def line(r: dict) -> str:  # one line per model, or per (model, precision, backend) when several pairs ran
        return r["model"] if len(pairs) < 2 else f"{r['model']} {r.get('precision')} {r.get('backend')}"

    order = list(dict.fromkeys(line(r) for r in rows))
    cmap = plt.get_cmap("tab20" if len(order) > 10 else "tab10")
    for ax, (col, label) in zip([a for rr in axes for a in rr], panels):
        all_x, all_y = [], []
        for i, name in enumerate(order):
            pts = [(_pixels(r["infer_img_size"]), _num(r.get(col)), str(r["infer_img_size"])) for r in rows
                   if line(r) == name and _pixels(r["infer_img_size"])]
            pts = sorted((p for p in pts if p[1]), key=lambda p: (p[0], p[2]))  # no value (an error row): no point
            if not pts:
                continue
            xs, ys, sizes = zip(*pts)
            all_x += xs
            all_y += ys
            ax.plot(xs, ys, marker="o", ms=4, color=cmap(i % cmap.N), label=name)
            for x, y, s in zip(xs, ys, sizes):  # non-square points say their shape: 16x32 and 32x16 share an x
                if "x" in s:
                    ax.annotate(s, (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6,
                                color=cmap(i % cmap.N))
        _finish_axis(ax, all_x, all_y, "pixels per image = H x W (log scale)", label)
    r0 = rows[0] if rows else {}
    fig.suptitle(title or f"model cost: batch {r0.get('infer_batch_size')}, fp32, {r0.get('device')}, "
                 f"torch {r0.get('torch')}", fontsize=11)
    return _save(fig, path)
