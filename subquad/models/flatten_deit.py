"""FLatten-DeiT (every block focused linear attention) and L2ViT-DeiT (L2ViT Tab. 11), on the ViT host.

These are thin variants of `subquad.models.vit.VisionTransformerAttn` (timm DeiT key layout), differing only in the
per-block mechanism list:
    - `flatten_deit_tiny/small/base` **[unofficial]**: every block `focused_linear` (p = 3, k = 5, `qkv` layout).
      CLS rule (spec flatten.md 5.1): the class token is an ordinary query/key of the linear attention, the PE has
      1 + h*w slots (slot 0 never resized) and the DWC runs on the patch grid only (the class row of the DWC term is
      0); the host passes `num_prefix_tokens=1` for that. No official code or weights exist (FLatten issue #12).
    - `l2vit_deit_tiny` **[unofficial]**: blocks 2, 4, ..., 12 (1-based) enhanced linear attention, the others
      softmax (L2ViT Tab. 11, 72.8 top-1).
    - `flatten_deit_micro`: a tiny FLatten-DeiT for tests and the demo (patch 4 on 32 x 32 images).

Paper: FLatten Transformer (seed 001, arXiv 2308.00442) Tab. 2 DeiT rows and Tab. 4; L2ViT (seed 000) Tab. 11.
Official: none for these hosts (DeiT layout: timm `vision_transformer.VisionTransformer`).
Symbols: C width, h heads, d = C / h = 64, p focusing factor, k DWC kernel.
"""

from __future__ import annotations

import math

import torch
from timm.layers import resample_abs_pos_embed
from timm.models import generate_default_cfgs, register_model
from torch import nn

from ..errors import UserError
from ._builder import build, unwrap_state_dict
from ._card import ModelCard, register_card
from .flatten_pvt import _resize_tables
from .vit import VisionTransformerAttn, _check_out_indices

__all__ = ["remap_official"]


def remap_official(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Checkpoint in the timm DeiT layout -> our state dict: unwrap the container and resample `pos_embed` (timm's
    `resample_abs_pos_embed`, bicubic) and the focused-attention `positional_encoding` (bicubic, class slot kept) to
    the model's grid when they differ: the run-time rules, so a resized load equals running the source model there.

    There is no official FLatten-DeiT checkpoint; a timm DeiT checkpoint has no FLatten parameters (`scale`,
    `positional_encoding`, `dwc`), so it loads only with strict=False.

    Args:
        state_dict: checkpoint (flat or wrapped in `model` / `model_ema` / `state_dict`).
        model: the target VisionTransformerAttn.
    """
    sd = dict(unwrap_state_dict(state_dict))
    pos = sd.get("pos_embed")
    own = model.state_dict().get("pos_embed")
    if pos is not None and own is not None and pos.shape != own.shape and pos.shape[-1] == own.shape[-1]:
        prefix = model.num_prefix_tokens
        n = pos.shape[1] - prefix
        side = math.isqrt(n)
        if side * side != n:
            raise UserError(f"cannot resample pos_embed of shape {tuple(pos.shape)}: {n} grid tokens are not square")
        sd["pos_embed"] = resample_abs_pos_embed(pos, tuple(model.grid_size), (side, side), num_prefix_tokens=prefix)
    return _resize_tables(sd, model)


def _cfg(**kwargs) -> dict:
    return {"url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None, "crop_pct": 0.875,
            "interpolation": "bicubic", "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
            "first_conv": "patch_embed.proj", "classifier": "head", "license": "apache-2.0", **kwargs}


_FL = dict(paper_ids="arXiv:2308.00442", origin_url="https://github.com/LeapLabTHU/FLatten-Transformer",
           notes="unofficial: no official code or weights (spec flatten.md 5.1)")
default_cfgs = generate_default_cfgs({
    "flatten_deit_micro": _cfg(input_size=(3, 32, 32), crop_pct=1.0, notes="tiny test/demo variant (patch 4)"),
    "flatten_deit_tiny": _cfg(**_FL),
    "flatten_deit_small": _cfg(**_FL),
    "flatten_deit_base": _cfg(**_FL),
    "l2vit_deit_tiny": _cfg(origin_url="https://github.com/ChuanyangZheng/L2ViT",
                            notes="unofficial: L2ViT Tab. 11 ablation, no released code or weights"),
})


def _create(variant: str, pretrained: bool = False, **kwargs) -> VisionTransformerAttn:
    if pretrained and not kwargs.get("pretrained_cfg_overlay"):
        raise UserError(f"{variant}: no weights are bundled; pass checkpoint_path=... or "
                        "pretrained_cfg_overlay=dict(file=...)")
    depth = kwargs.get("depth", 12)
    return build(VisionTransformerAttn, variant, pretrained, remap=remap_official,
                 default_out_indices=_check_out_indices(depth), **kwargs)


def _alternate(depth: int) -> tuple[str, ...]:
    """L2ViT Tab. 11: enhanced linear in blocks 2, 4, ... (1-based), softmax elsewhere."""
    return tuple("enhanced_linear" if j % 2 == 1 else "softmax" for j in range(depth))


@register_model
def flatten_deit_micro(pretrained: bool = False, **kwargs) -> VisionTransformerAttn:
    args = dict(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=2, mlp_ratio=2.0, attn="focused_linear")
    return _create("flatten_deit_micro", pretrained, **{**args, **kwargs})


@register_model
def flatten_deit_tiny(pretrained: bool = False, **kwargs) -> VisionTransformerAttn:
    args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3, attn="focused_linear")
    return _create("flatten_deit_tiny", pretrained, **{**args, **kwargs})


@register_model
def flatten_deit_small(pretrained: bool = False, **kwargs) -> VisionTransformerAttn:
    args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6, attn="focused_linear")
    return _create("flatten_deit_small", pretrained, **{**args, **kwargs})


@register_model
def flatten_deit_base(pretrained: bool = False, **kwargs) -> VisionTransformerAttn:
    args = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12, attn="focused_linear")
    return _create("flatten_deit_base", pretrained, **{**args, **kwargs})


@register_model
def l2vit_deit_tiny(pretrained: bool = False, **kwargs) -> VisionTransformerAttn:
    args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3, attn=_alternate(12))
    return _create("l2vit_deit_tiny", pretrained, **{**args, **kwargs})


_OURS = ("unofficial; ref_params is this definition's count (DeiT + per block scale C, PE (1 + 196) C, DWC "
         "64 x 25 + 64), spec flatten.md 5.1; paper numbers not reproduced")
register_card(ModelCard("flatten_deit_micro", "flatten", img_size=32, source="test/demo variant (patch 4)",
                        status="unofficial", notes="not a paper model"))
register_card(ModelCard("flatten_deit_tiny", "flatten", 224, 6.1, 1.1, 74.1, "FLatten paper Tab. 2 (arXiv 2308.00442)",
                        status="unofficial", ref_params=6_193_576, notes=_OURS))
register_card(ModelCard("flatten_deit_small", "flatten", 224, None, None, None, "not published", status="unofficial",
                        ref_params=22_983_016, notes=_OURS))
register_card(ModelCard("flatten_deit_base", "flatten", 224, None, None, None, "not published", status="unofficial",
                        ref_params=88_412_392, notes=_OURS))
register_card(ModelCard("l2vit_deit_tiny", "l2vit", 224, 5.7, 1.3, 72.8, "L2ViT paper Tab. 11 (seed 000)",
                        status="unofficial", ref_params=5_717_434,
                        notes="ref_params: DeiT-T + 6 blocks x temperature (3); paper numbers not reproduced"))
