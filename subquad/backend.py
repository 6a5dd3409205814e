"""The one dispatch point for device-specific schedules.

Some fast paths are CPU schedules: they change how a result is computed, never what it is.
- The banded inference MLP (`subquad.layers.mlp`) keeps a band's hidden activation in cache.
- LiSA's cache-sized tiles and reused workspace (`lisa_fft`) do the same for its spectral products.
- LiSA and the global filter pin their q/k/v projection to fp32 under autocast, since bf16/fp16 GEMMs are slow on
  most CPUs. Their FFTs always run in fp32.

On an accelerator these would mean serial tiles, extra kernel launches and fp32 GEMMs, so there the plain batched
path runs. Inside `torch.compile` / `torch.export` tracing the plain path runs as well: Python tile loops would be
unrolled into the graph and specialised to the traced size.

`schedule(device)` makes the choice. `set_backend(name)` or the `SUBQUAD_BACKEND` environment variable overrides it
for the whole process, and `use_backend(name)` does so for a block:
- 'auto' (default): CPU schedules on CPU, plain elsewhere;
- 'cpu': CPU schedules on every device (outside tracing);
- 'plain': the plain path everywhere.

`real_dft()` is a separate switch, for graphs whose runtime has no complex tensors (ONNX, `subquad.export`): inside
it LiSA's structure-aware attention computes its correlations with real DFT matrices (`lisa_dft`) instead of
complex FFTs. Same result, more arithmetic; the FFT path stays the default everywhere else (torch.compile included:
the DFT form made a compiled `lisanet_s` slower, see docs/deploy.md, "Compile").
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from .errors import UserError

__all__ = ["BACKENDS", "get_backend", "schedule", "set_backend", "use_backend", "cpu_schedules", "real_dft",
           "real_dft_active"]

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
    if _backend == "plain" or torch.compiler.is_compiling():
        return "plain"
    if _backend == "cpu":
        return "cpu"
    dev = torch.device(device) if device is not None else torch.device("cpu")
    return "cpu" if dev.type == "cpu" else "plain"


def cpu_schedules(device: torch.device | str | None) -> bool:
    """Whether work on `device` takes the CPU schedules."""
    return schedule(device) == "cpu"


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
