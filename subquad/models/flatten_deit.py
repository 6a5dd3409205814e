"""FLatten-DeiT (every block focused linear attention) and L2ViT-DeiT (L2ViT Tab. 11), on the ViT host.

These are thin variants of `subquad.models.vit.VisionTransformerAttn` (timm DeiT key layout), differing only in the
per-block mechanism list:
    - `flatten_deit_tiny/small/base` **[unofficial]**: every block `focused_linear` (p = 3, k = 5, `qkv` layout).
      CLS rule (docs/deviations.md): the class token is an ordinary query/key of the linear attention, the PE has
      1 + h*w slots (slot 0 never resized) and the DWC runs on the patch grid only (the class row of the DWC term is
      0); the host passes `num_prefix_tokens=1` for that. No official code or weights exist (FLatten issue #12).
    - `l2vit_deit_tiny` **[unofficial]**: blocks 2, 4, ..., 12 (1-based) enhanced linear attention, the others
      softmax (L2ViT Tab. 11, 72.8 top-1). The paper's enhanced linear attention is linear attention followed by
      the LCM (Sec. 3.2); the default model has no LCM (the registered, checkpoint-compatible layout);
      `lcm_kernel_size=k` adds it after the enhanced-linear blocks only (keys `blocks.{j}.norm3`, `.local_mp`).
    - `flatten_deit_micro`: a tiny FLatten-DeiT for tests and the demo (patch 4 on 32 x 32 images).

Paper: FLatten Transformer (arXiv 2308.00442) Tab. 2 DeiT rows and Tab. 4; L2ViT paper Tab. 11.
Official: none for these hosts (DeiT layout: timm `vision_transformer.VisionTransformer`).
Symbols: C width, h heads, d = C / h = 64, p focusing factor, k DWC kernel.
"""

from __future__ import annotations

import math

import torch
from timm.layers import resample_abs_pos_embed
from torch import nn

from ..errors import UserError
from ._builder import Variant, register_family, unwrap_state_dict
from ._flatten_common import FLATTEN_CFG, FLATTEN_PAPER
from ._flatten_common import resize_token_tables as _resize_tables
from .vit import VisionTransformerAttn, vit_out_indices

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


def _alternate(depth: int) -> tuple[str, ...]:
    """L2ViT Tab. 11: enhanced linear in blocks 2, 4, ... (1-based), softmax elsewhere."""
    return tuple("enhanced_linear" if j % 2 == 1 else "softmax" for j in range(depth))


_DEIT = dict(patch_size=16, depth=12)
_OURS = ("unofficial; ref_params is this definition's count (DeiT + per block scale C, PE (1 + 196) C, DWC "
         "64 x 25 + 64; see docs/deviations.md); paper numbers not reproduced")
_FL = dict(notes="unofficial: no official code or weights (FLatten issue #12); see docs/deviations.md")
register_family(__name__, VisionTransformerAttn, [
    Variant("flatten_deit_micro", dict(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=2, mlp_ratio=2.0,
                                       attn="focused_linear"),
            dict(img_size=32, source="test/demo variant (patch 4)", notes="not a paper model"),
            cfg=dict(input_size=(3, 32, 32), crop_pct=1.0)),
    Variant("flatten_deit_tiny", dict(**_DEIT, embed_dim=192, num_heads=3, attn="focused_linear"),
            dict(params_m=6.1, gmacs=1.1, top1=74.1, source=FLATTEN_PAPER + " Tab. 2", ref_params=6_193_576),
            cfg=_FL),
    Variant("flatten_deit_small", dict(**_DEIT, embed_dim=384, num_heads=6, attn="focused_linear"),
            dict(source="not published", ref_params=22_983_016), cfg=_FL),
    Variant("flatten_deit_base", dict(**_DEIT, embed_dim=768, num_heads=12, attn="focused_linear"),
            dict(source="not published", ref_params=88_412_392), cfg=_FL),
    Variant("l2vit_deit_tiny", dict(**_DEIT, embed_dim=192, num_heads=3, attn=_alternate(12),
                                    lcm_after="enhanced_linear"),
            dict(family="l2vit", params_m=5.7, gmacs=1.3, top1=72.8, ref_params=5_717_434,
                 source="The Linear Attention Resurrection in Vision Transformer (L2ViT paper) Tab. 11",
                 notes="ref_params: DeiT-T + 6 blocks x temperature (3); paper numbers not reproduced"),
            cfg=dict(origin_url="https://github.com/ChuanyangZheng/L2ViT", license="mit",
                     paper_ids="The Linear Attention Resurrection in Vision Transformer",
                     notes="unofficial: L2ViT Tab. 11 ablation, no released code or weights")),
], cfg=dict(first_conv="patch_embed.proj", **FLATTEN_CFG), stride=lambda a: a.get("patch_size", 16),
    remap=remap_official, card=dict(family="flatten", status="unofficial", code="", notes=_OURS),
    out_indices=vit_out_indices, non_std=True)
