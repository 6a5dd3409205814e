"""MAC counting with `torch.utils.flop_counter.FlopCounterMode` on the meta device.

GMACs = FLOPs / 2 (one fused multiply-add is one "FLOP" in the papers). Besides torch's own formulas we count:
    - `aten._scaled_dot_product_flash_attention_for_cpu` with torch's SDPA formula (real CPU tensors only; on meta
      SDPA decomposes into bmm and is counted natively);
    - real/complex FFTs: 2.5 n log2 n FLOPs per r2c/c2r transform and 5 n log2 n per c2c transform, n being the
      product of the transformed sizes;
    - complex element-wise multiplication: 6 FLOPs per output element.
Element-wise real ops, norms and softmax are not counted (as fvcore and the papers' tables do not count them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

__all__ = ["count_macs", "flop_mapping", "count_module_macs"]

aten = torch.ops.aten


def _prod(xs) -> int:
    return int(math.prod(int(x) for x in xs))


def _fft_flops(shape: Sequence[int], dims: Sequence[int], per_point: float) -> int:
    dims = [d % len(shape) for d in dims]
    n = _prod(shape[d] for d in dims)
    if n <= 1:
        return 0
    transforms = _prod(shape) // n
    return int(per_point * n * math.log2(n) * transforms)


def _r2c(x_shape, dim, *args, out_shape=None, **kwargs) -> int:
    return _fft_flops(x_shape, dim, 2.5)


def _c2r(x_shape, dim, *args, out_shape=None, **kwargs) -> int:
    # The transform size is the real (output) length along the last transformed dim.
    return _fft_flops(out_shape, dim, 2.5)


def _c2c(x_shape, dim, *args, out_shape=None, **kwargs) -> int:
    return _fft_flops(x_shape, dim, 5.0)


def _complex_mul(*args, out_val=None, **kwargs) -> int:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not any(t.is_complex() for t in tensors):
        return 0
    out = out_val if isinstance(out_val, torch.Tensor) else torch.broadcast_tensors(*tensors)[0]
    return 6 * out.numel()


_complex_mul._get_raw = True  # type: ignore[attr-defined]


def _cpu_sdpa(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(q_shape, k_shape, v_shape)


def flop_mapping() -> dict[Any, Any]:
    """The custom formulas passed to FlopCounterMode (see module docstring)."""
    mapping: dict[Any, Any] = {
        aten._fft_r2c: _r2c,
        aten._fft_c2r: _c2r,
        aten._fft_c2c: _c2c,
        aten.mul: _complex_mul,
    }
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_sdpa
    return mapping


def count_module_macs(module: nn.Module, *inputs: Any, breakdown: bool = False, **kw: Any) -> dict[str, Any]:
    """Run `module(*inputs, **kw)` under the counter; returns {'gmacs', 'breakdown' (module -> GMACs)}."""
    from ..layers.mlp import plain_mlps

    with torch.no_grad(), plain_mlps(), FlopCounterMode(display=False, custom_mapping=flop_mapping()) as counter:
        module(*inputs, **kw)
    out: dict[str, Any] = {"gmacs": counter.get_total_flops() / 2e9}
    if breakdown:
        out["breakdown"] = {name: sum(ops.values()) / 2e9 for name, ops in counter.get_flop_counts().items()
                            if name != "Global"}
        out["ops"] = {str(op): v / 2e9 for op, v in counter.get_flop_counts()["Global"].items()}
    return out


def size_kwargs(name: str, hw: tuple[int, int]) -> dict[str, Any]:
    """Construction options for `name` at (H, W): timm models are built at the size (position tables, Swin masks;
    Swin pads windows itself); subquad models run at any size as built."""
    import timm

    from ..models import is_subquad_model

    if is_subquad_model(name):
        return {}
    cfg = timm.models.get_pretrained_cfg(name.split(".")[0])
    native = tuple(cfg.input_size[-2:]) if cfg is not None else None
    return {} if native == tuple(hw) else {"img_size": hw[0] if hw[0] == hw[1] else tuple(hw)}


def _create_at(name: str, hw: tuple[int, int], model_kwargs: dict[str, Any]) -> nn.Module:
    """`name` on the meta device with `model_kwargs`, built for `hw` where the model fixes its input size
    (`size_kwargs`)."""
    from ..models import create_model

    kw = {**size_kwargs(name, hw), **model_kwargs}
    try:
        return create_model(name, device="meta", **kw)
    except TypeError as e:  # a timm model that runs at any size and takes no img_size (PVTv2)
        if "img_size" not in kw or "img_size" not in str(e):
            raise
        return create_model(name, device="meta", **model_kwargs)


def count_macs(model: str | nn.Module, img_size: int | Sequence[int] = 224, in_chans: int | None = None,
               batch_size: int = 1, breakdown: bool = False, **model_kwargs: Any) -> dict[str, Any]:
    """Parameters and GMACs of an image model at `img_size`, counted on the meta device.

    Args:
        model: a registered name (built with device='meta', and at `img_size` where the model fixes its input
            size, as timm's ViTs do: their parameter count then follows the size, through the position table) or
            a module (counted on its own device).
        img_size: H or (H, W) of the input (video models, `model.video`, get clips of `model.num_frames` frames).
        in_chans: input channels (default: the model's `pretrained_cfg` or 3).
        batch_size: GMACs are reported per batch of this size (1 as in the papers).
        breakdown: also return GMACs per module.
    Returns:
        {'params': int, 'gmacs': float, 'img_size': (H, W), 'breakdown': {...} when asked}.
    """
    from ..errors import UserError

    sides = [img_size] * 2 if isinstance(img_size, int) else list(img_size) if isinstance(img_size, (list, tuple)) \
        else []
    if len(sides) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sides):
        raise UserError(f"count_macs: img_size must be a positive int H or a pair (H, W), got {img_size!r}")
    for name, v in (("batch_size", batch_size), ("in_chans", in_chans)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise UserError(f"count_macs: {name} must be a positive int, got {v!r}")
    if isinstance(model, str):
        model = _create_at(model, (sides[0], sides[1]), model_kwargs)
    H, W = sides
    if in_chans is None:
        in_chans = getattr(model, "pretrained_cfg", {}).get("input_size", (3,))[0]
    params = sum(p.numel() for p in model.parameters())
    device = next(model.parameters()).device
    model.eval()
    if getattr(model, "video", False):
        # Video backbones take clips (B, C, T, H, W) of the length their kernels are sized for.
        x = torch.empty(batch_size, in_chans, int(getattr(model, "num_frames", 16)), H, W, device=device)
    else:
        x = torch.empty(batch_size, in_chans, H, W, device=device)
    result = count_module_macs(model, x, breakdown=breakdown)
    return {"params": params, "img_size": (H, W), **result}
