"""The one dispatch point for device-specific schedules.

Some fast paths are CPU schedules: they change how a result is computed, never what it is.
- The banded inference MLP (`subquad.layers.mlp`) keeps a band's hidden activation in cache.
- LiSA's cache-sized tiles and reused workspace (`lisa_fft`) do the same for its spectral products.
- LiSA pins its q/k/v projection to fp32 under an autocast whose dtype is slow on this CPU (`fast_gemm_dtype`:
  fp16, or bf16 without native bf16 arithmetic); with native bf16 the projection runs in bf16 like every other
  GEMM. LiSA's and the global filter's FFTs always run in fp32.

On an accelerator these would mean serial tiles, extra kernel launches and fp32 GEMMs, so there the plain batched
path runs. Inside `torch.compile` / `torch.export` tracing the plain path runs as well: Python tile loops would be
unrolled into the graph and specialised to the traced size.

`schedule(device)` makes the choice. `set_backend(name)` or the `SUBQUAD_BACKEND` environment variable overrides it
for the whole process, and `use_backend(name)` does so for a block:
- 'auto' (default): CPU schedules on CPU, plain elsewhere;
- 'cpu': CPU schedules on every device (outside tracing);
- 'plain': the plain path everywhere.

Precision is decided here too. `cpu_features()` reads, once per process, whether this CPU has bf16 arithmetic
(x86 `avx512_bf16` / `amx_bf16`, Arm `bf16`) and int8 dot products (x86 `avx512_vnni` / `avx_vnni` / `amx_int8`, Arm
`asimddp`), from /proc/cpuinfo, or from torch's own CPU probe where that file is missing. `resolve_precision(name,
device)` turns a requested precision ('fp32', 'bf16' or 'int8') into the one that runs: bf16 on a CPU without bf16
arithmetic is emulated and slower than fp32, so it falls back to fp32 with one warning per process; int8 (dynamic int8
GEMMs for the `nn.Linear` layers, `subquad.layers.int8`) runs on the CPU only and falls back to fp32 the same way on
a CPU without int8 dot products. `precision_context(name, device)` is the matching autocast context (bf16:
`torch.autocast(device, dtype=torch.bfloat16)`; fp32 and int8: none), inside which the mechanisms keep their float32
islands (`subquad.layers.precision`); `subquad.layers.int8.precision_model(model, name)` is the matching model (int8:
`quantize_int8`'s copy; otherwise the model itself).

Memory is one more CPU matter. glibc's malloc hands freed memory at the top of the heap back to the system and
serves large blocks with `mmap`, so a model whose steps allocate and free tens of MiB (LiSA's FFT outputs) faults
every page of them in again on each step (one fault per 4 KiB page), and whether it does depends on thresholds glibc
adapts as a process runs. `keep_freed_memory(nbytes)` makes glibc keep up to `nbytes` of freed memory for reuse
(`mallopt(M_TOP_PAD)`), for the whole process; the `subquad` command does it at start (256 MiB, the
`SUBQUAD_KEEP_FREED_MIB` environment variable; 0 leaves glibc's defaults). It is not done on import: the library does
not change a user's allocator unasked.

Attention is the one schedule chosen inside tracing. torch's fused CPU attention kernel
(`scaled_dot_product_attention`) gains nothing from bf16 inputs (about 6.0 ms in fp32 and 6.4 ms in bf16 for 3 heads
x 1,025 tokens x 64 on a Zen 4 EPYC). So under `torch.compile` on a CPU, bf16 attention in inference is written out
instead (`decompose_attention`: q k^T and the product with v as bf16 GEMMs, scale, mask and softmax in float32,
which inductor fuses): 4.8 ms there. Everywhere else (eager, fp32, off the CPU, while exporting, under autograd,
under 'plain', with a bool mask, or above `DECOMPOSE_MAX_LOGITS` logits per call, since the written-out form holds
them all in memory) the fused kernel runs. A bool mask is left to the fused kernel because written out it ran 2x
slower under Inductor (CSwin's padded stripes, 5 x 4 x 224 x 32 with a (5, 1, 224, 224) mask: 3.5 ms against 1.7 ms),
while float masks (Swin's relative-position bias and shift mask) ran 1.8x faster written out. A graph exported for
ONNX is the other exception: inside `onnx_graph()` (which `subquad.export` sets for ONNX) attention without a bool
mask is traced as plain operators, which ONNX Runtime fuses better than ONNX's translation of SDPA (docs/deploy.md,
"Export forms for ONNX Runtime").

`real_dft()` is a separate switch, for graphs whose runtime has no complex tensors (ONNX, `subquad.export`): inside
it LiSA's structure-aware attention computes its correlations with real DFT matrices (`lisa_dft`) instead of
complex FFTs. Same result, more arithmetic; the FFT path stays the default everywhere else (torch.compile included:
the DFT form made a compiled `lisanet_s` slower, see docs/deploy.md, "Compile").
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import UserError

__all__ = ["BACKENDS", "PRECISIONS", "CpuFeatures", "cpu_features", "parse_cpu_flags", "resolve_precision",
           "precision_context", "get_backend", "schedule", "eager_schedule", "set_backend", "use_backend",
           "cpu_schedules", "real_dft", "real_dft_active", "onnx_graph", "onnx_graph_active", "decompose_attention",
           "DECOMPOSE_MAX_LOGITS",
           "fast_gemm_dtype", "int8_saturates", "keep_freed_memory", "kept_freed_memory",
           "keep_freed_memory_from_env", "KEEP_FREED_DEFAULT"]

_log = logging.getLogger(__name__)

BACKENDS = ("auto", "cpu", "plain")


def _checked(name: str, where: str) -> str:
    if name not in BACKENDS:
        raise UserError(f"{where}: unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return name


_backend = _checked(os.environ.get("SUBQUAD_BACKEND", "auto") or "auto", "SUBQUAD_BACKEND")


def get_backend() -> str:
    """The current override: 'auto', 'cpu' or 'plain'."""
    return _backend


def set_backend(name: str) -> str:
    """Set the schedule override for the process ('auto', 'cpu' or 'plain'); returns the previous one."""
    global _backend
    previous, _backend = _backend, _checked(name, "set_backend")
    return previous


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """`set_backend(name)` for the duration of a `with` block."""
    previous = set_backend(name)
    try:
        yield
    finally:
        set_backend(previous)


def schedule(device: torch.device | str | None) -> str:
    """'cpu' or 'plain': the schedule that work on `device` runs (see the module docstring)."""
    return "plain" if torch.compiler.is_compiling() else eager_schedule(device)


def eager_schedule(device: torch.device | str | None) -> str:
    """The schedule that eager code on `device` runs, also asked while `torch.compile` traces: for an opaque
    operator that runs eager code inside a compiled graph (`subquad::lisa_core`)."""
    if _backend == "plain":
        return "plain"
    if _backend == "cpu":
        return "cpu"
    dev = torch.device(device) if device is not None else torch.device("cpu")
    return "cpu" if dev.type == "cpu" else "plain"


def cpu_schedules(device: torch.device | str | None) -> bool:
    """Whether work on `device` takes the CPU schedules."""
    return schedule(device) == "cpu"


# The most logits (B * h * N * n) a written-out attention call holds: 2^25 (128 MiB in float32).
DECOMPOSE_MAX_LOGITS = 2 ** 25


def decompose_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                        attn_mask: torch.Tensor | None = None) -> bool:
    """Whether softmax attention of q (..., N, d) over k, v (..., n, d) is written out as GEMMs and a float32
    softmax rather than run by the fused kernel: only while `torch.compile` traces (not `torch.export`), for bf16 on
    a CPU, in inference (no input that autograd tracks, no dropout), without a bool `attn_mask` (a float one is fine),
    with at most `DECOMPOSE_MAX_LOGITS` logits, and unless the backend is 'plain' (see the module docstring)."""
    if _backend == "plain" or dropout_p or q.dtype != torch.bfloat16 or q.device.type != "cpu":
        return False
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        return False
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, attn_mask)):
        return False
    if not torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return False
    return q.numel() // q.shape[-1] * k.shape[-2] <= DECOMPOSE_MAX_LOGITS


_real_dft = False


@contextlib.contextmanager
def real_dft(enabled: bool = True) -> Iterator[None]:
    """Within the block, spectral mechanisms use real-arithmetic DFTs (no complex tensors); see the module docstring."""
    global _real_dft
    previous, _real_dft = _real_dft, bool(enabled)
    try:
        yield
    finally:
        _real_dft = previous


def real_dft_active() -> bool:
    """Whether `real_dft()` is on."""
    return _real_dft


_onnx_graph = False


@contextlib.contextmanager
def onnx_graph(enabled: bool = True) -> Iterator[None]:
    """Within the block, an export is traced for ONNX (`subquad.export` sets it): softmax attention without a bool
    mask is written out for ONNX Runtime (`subquad.attention.functional.softmax.sdpa`)."""
    global _onnx_graph
    previous, _onnx_graph = _onnx_graph, bool(enabled)
    try:
        yield
    finally:
        _onnx_graph = previous


def onnx_graph_active() -> bool:
    """Whether `onnx_graph()` is on."""
    return _onnx_graph


PRECISIONS = ("fp32", "bf16", "int8")
# /proc/cpuinfo flags (x86 "flags", Arm "Features") that mean native bf16 arithmetic / int8 dot products.
_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
_INT8_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8", "asimddp"})


@dataclass(frozen=True)
class CpuFeatures:
    """What this CPU computes natively: bf16 arithmetic, int8 dot products (VNNI and kin), AMX tiles; `source` says
    where it was read ('/proc/cpuinfo' or 'torch')."""

    bf16: bool
    int8_dot: bool
    amx: bool
    source: str


def parse_cpu_flags(text: str) -> CpuFeatures | None:
    """The features named by the first flags line of a /proc/cpuinfo text (None when it has none)."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags = set(value.split())
            return CpuFeatures(bf16=bool(flags & _BF16_FLAGS), int8_dot=bool(flags & _INT8_FLAGS),
                               amx=any(f.startswith("amx_") for f in flags), source="/proc/cpuinfo")
    return None


@functools.cache
def cpu_features() -> CpuFeatures:
    """This CPU's bf16 / int8 features, detected once per process (see the module docstring)."""
    try:
        found = parse_cpu_flags(Path("/proc/cpuinfo").read_text(errors="replace"))
    except OSError:
        found = None
    if found is not None:
        return found
    probe = torch.cpu  # torch's cpuinfo-based probe (private helpers; absent ones count as "no")

    def has(name: str) -> bool:
        fn = getattr(probe, name, None)
        return bool(fn()) if callable(fn) else False

    return CpuFeatures(bf16=has("_is_avx512_bf16_supported"), int8_dot=has("_is_vnni_supported"),
                       amx=has("_is_amx_tile_supported"), source="torch")


_X86 = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})


def int8_saturates(machine: str | None = None, feats: CpuFeatures | None = None) -> bool:
    """Whether uint8 x int8 products saturate on this CPU: an x86 CPU without int8 dot products (no VNNI / AMX-INT8).

    There ONNX Runtime (and oneDNN) multiply uint8 activations by int8 weights with `vpmaddubsw`, which adds two
    adjacent products in a signed 16-bit lane with saturation: with full-range weights (|q| <= 127) a pair reaches
    255 x 127 x 2 = 64,770 > 32,767 and is clipped. 7-bit weights (|q| <= 64, ONNX Runtime's `reduce_range`) stay
    below 2^15 (`subquad.export.quantize_int8`). VNNI's `vpdpbusd` and Arm's dot products accumulate in 32 bits.
    On a 2-core AMD EPYC of family 25, model 1 (Zen 3: AVX2, no AVX-512) the product of `tests/export/
    test_int8_weights.py` (uint8 activations mostly in [200, 255], full-range weights) was off by 22 % of its largest
    output with 8-bit weights and exact with 7-bit ones. `machine` (default `platform.machine()`) and `feats`
    (default `cpu_features()`) are for tests."""
    import platform

    machine = (machine if machine is not None else platform.machine()).lower()
    feats = feats if feats is not None else cpu_features()
    return machine in _X86 and not feats.int8_dot


def fast_gemm_dtype(dtype: torch.dtype, device: torch.device | str | None = "cpu") -> bool:
    """Whether GEMMs in the low-precision `dtype` run at least as fast as fp32 on `device`: always off the CPU; on the
    CPU only bf16 with native bf16 arithmetic (`cpu_features().bf16`). fp16 GEMMs on a CPU never beat fp32 in torch
    2.14: emulated, about 40x slower than fp32 on the AMD EPYCs the benchmarks ran on; about fp32's rate (1.0x on a
    1024³ product) on an Intel Xeon with AVX512-FP16 and AMX, where bf16 ran 3.9x fp32."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type != "cpu":
        return True
    return dtype == torch.bfloat16 and cpu_features().bf16


_fallback_warned: set[str] = set()


def resolve_precision(name: str, device: torch.device | str | None = "cpu", what: str = "--precision") -> str:
    """The precision that runs for a requested one ('fp32', 'bf16' or 'int8') on `device`.

    bf16 on a CPU without native bf16 arithmetic (`cpu_features().bf16` false), and int8 on a CPU without int8 dot
    products (`cpu_features().int8_dot` false), run fp32 instead, with one warning per process each. Raises
    UserError for another name, and for int8 off the CPU."""
    if name not in PRECISIONS:
        raise UserError(f"{what} {name!r} is not a precision; choose one of {', '.join(PRECISIONS)}")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if name == "int8" and dev.type != "cpu":
        raise UserError(f"{what} int8 runs on the CPU only (dynamic int8 GEMMs, torch._int_mm); on {dev.type} use "
                        "fp32 or bf16")
    if dev.type != "cpu":
        return name
    feats = cpu_features()
    missing = {"bf16": (not feats.bf16, "native bf16 arithmetic (no avx512_bf16 / amx_bf16 flag), where bf16 is "
                                        "emulated and slower than fp32"),
               "int8": (not feats.int8_dot, "int8 dot products (no avx512_vnni / avx_vnni / amx_int8 flag), where "
                                            "int8 GEMMs do not beat fp32")}.get(name)
    if missing and missing[0]:
        if name not in _fallback_warned:
            _fallback_warned.add(name)
            _log.warning("warning: this CPU has no %s; running fp32 instead", missing[1])
        return "fp32"
    return name


def precision_context(name: str, device: torch.device | str | None = "cpu") -> contextlib.AbstractContextManager:
    """The autocast context of a resolved precision: bf16 -> torch.autocast(device type, bfloat16); fp32 and int8
    (whose model is converted instead, `subquad.layers.int8.precision_model`) -> none."""
    if name not in PRECISIONS:
        raise UserError(f"unknown precision {name!r}; choose one of {', '.join(PRECISIONS)}")
    if name != "bf16":
        return contextlib.nullcontext()
    dev = torch.device(device) if device is not None else torch.device("cpu")
    return torch.autocast(dev.type, dtype=torch.bfloat16)


KEEP_FREED_DEFAULT = 256 * 2 ** 20
_M_TOP_PAD, _M_MMAP_THRESHOLD = -2, -3  # glibc <malloc.h>
_MMAP_THRESHOLD_MAX = 32 * 2 ** 20  # the largest M_MMAP_THRESHOLD glibc accepts on 64-bit systems
_kept_freed: int | None = None


def _glibc():
    """The running glibc as a ctypes library, or None (musl, macOS, Windows)."""
    import ctypes

    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
        return ctypes.CDLL(None)
    except (ValueError, OSError, AttributeError):
        return None


def keep_freed_memory(nbytes: int = KEEP_FREED_DEFAULT) -> bool:
    """Let glibc's malloc keep up to `nbytes` of freed memory in the heap for reuse instead of returning it to the
    system (`mallopt(M_TOP_PAD, nbytes)`), and serve blocks below 32 MiB from the heap (`M_MMAP_THRESHOLD`, which
    glibc's own adaptive threshold reaches at most), for the whole process. Returns whether it was applied: False
    for `nbytes=0` (glibc's defaults stay) and where the C library is not glibc.

    Why: a step that allocates and frees large tensors (LiSA's FFT outputs, tens of MiB at 224 x 224) otherwise
    page-faults them in again on the next step, one fault per 4 KiB page; on the 2-core AMD EPYC of
    docs/benchmarks.md that made `hylisanet_s`'s bf16 step up to 1.7x slower. Cost: the process's resident memory
    stays up to `nbytes` above its live tensors, and freed blocks inside the heap are not returned either."""
    import ctypes

    global _kept_freed
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise UserError(f"keep_freed_memory: nbytes must be a whole number of bytes >= 0, got {nbytes!r}")
    if nbytes == 0:
        return False
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    libc.malloc.argtypes, libc.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
    libc.free.argtypes, libc.free.restype = [ctypes.c_void_p], None
    if not libc.mallopt(_M_TOP_PAD, min(nbytes, 2 ** 31 - 1)):
        return False
    libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)
    # glibc pads the heap only when it next grows it: one block just below the threshold, freed at once, makes it
    # grow now if it must, so that blocks above 32 MiB find the kept memory too. Its pages are never touched.
    libc.free(libc.malloc(_MMAP_THRESHOLD_MAX - 2 ** 16))
    _kept_freed = min(nbytes, 2 ** 31 - 1)
    return True


def kept_freed_memory() -> int:
    """The bytes of freed memory `keep_freed_memory` asked glibc to keep in this process (0 if it never did)."""
    return _kept_freed or 0


def keep_freed_memory_from_env(default_mib: int = KEEP_FREED_DEFAULT // 2 ** 20) -> bool:
    """`keep_freed_memory` with the MiB named by the SUBQUAD_KEEP_FREED_MIB environment variable (`default_mib`
    when unset; 0 leaves glibc's defaults), as the `subquad` command applies it. A value that is not a whole number
    >= 0 is a UserError naming it."""
    raw = os.environ.get("SUBQUAD_KEEP_FREED_MIB", "").strip()
    if not raw:
        mib = default_mib
    elif raw.isascii() and raw.isdigit():  # not other scripts' digits, which int() would read
        mib = int(raw)
    else:
        raise UserError(f"SUBQUAD_KEEP_FREED_MIB={raw!r} is not a whole number of MiB >= 0 (0 leaves glibc's "
                        "defaults)")
    return keep_freed_memory(mib * 2 ** 20)
