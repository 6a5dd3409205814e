"""Precision helpers shared by the mechanisms: where a core runs in float32 under autocast.

The precision policy (docs/deviations.md, "Every backbone"): the linear-attention cores (L2ViT, FLatten, the
kernelised `linear` family) and the FFT cores (LiSA, the global filter) run in float32 under autocast and cast back;
float64 input (the references) stays float64. SDPA paths run in the autocast dtype.
- `compute_dtype(dtype)`: the dtype such a core computes in for input of `dtype`;
- `no_autocast(x)`: a context with autocast off on x's device;
- `fp32_island(fn, *tensors)`: run `fn` in float32 with autocast off and cast the result back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

__all__ = ["compute_dtype", "no_autocast", "fp32_island"]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half-precision or float32 input, float64 for float64 input (the references)."""
    return torch.promote_types(dtype, torch.float32)


def no_autocast(x: torch.Tensor):
    """Context with autocast disabled on x's device (a no-op on devices without autocast, e.g. meta); the LiSA and
    global-filter FFT cores run in float32 inside it (the precision rule listed in docs/deviations.md, "Every
    backbone")."""
    # Only where autocast is on: a disabled-autocast region traced with nothing to disable would still become a
    # wrap_with_autocast node, which torch.export cannot serialise with symbolic sizes among its inputs.
    if x.device.type in ("cpu", "cuda", "xpu", "mps") and torch.is_autocast_enabled(x.device.type):
        return torch.autocast(x.device.type, enabled=False)
    return contextlib.nullcontext()


def fp32_island(fn: Callable[..., torch.Tensor], *tensors: torch.Tensor, **kwargs) -> torch.Tensor:
    """Run fn(*tensors, **kwargs) in float32 with autocast off when inputs are half precision or autocast is on.

    The result is cast back to the dtype of the first tensor; float32 and float64 inputs run unchanged. Linear-attention
    cores run in float32 under autocast because the kv product and the normaliser overflow in fp16 (reported in
    LeapLabTHU/FLatten-Transformer issues #15, #18, #32); see docs/deviations.md, "Every backbone".
    """
    t0 = tensors[0]
    low = t0.dtype in (torch.float16, torch.bfloat16)
    # Meta tensors (FLOP counting) have no autocast state.
    if not low and (t0.device.type == "meta" or not torch.is_autocast_enabled(t0.device.type)):
        return fn(*tensors, **kwargs)
    with no_autocast(t0):  # (a no-op on devices without autocast, such as meta)
        out = fn(*(t.float() if t is not None and t.is_floating_point() and t.dtype != torch.float64 else t
                   for t in tensors), **kwargs)
    return out.to(t0.dtype) if low else out
