"""InLine-DeiT: the DeiT host with InLine attention in every block.

A thin family over `subquad.models.vit.VisionTransformerAttn` (timm DeiT key layout, the official file's): every
block is `inline` (identity kernel, local residual; the class token attends and is attended to, gets no local term
and enters the token mean, as the official code). The official widths are not DeiT's: InLine-DeiT-T is 192 wide with
6 heads (d = 32), -S 320 wide with 10 heads at 288 px and -B 384 wide with 12 heads at 448 px (official
`models/inline_deit.py`, `inline_deit_{tiny,small,base}`, and `cfgs/inline_deit_{t,s,b}.yaml`).
`inline_deit_micro` is a tiny variant for tests and the demo (patch 4 on 32 x 32 images).

Paper: Bridging the Divide: Reconsidering Softmax and Linear Attention (arXiv 2412.06590), Tab. 3 (DeiT rows).
Official: LeapLabTHU/InLine@e463a6f `models/inline_deit.py` (`VisionTransformer`, `InLineBlock`).
Symbols: C width, h heads, d = C / h = 32.
"""

from __future__ import annotations

import torch
from torch import nn

from ._builder import Variant, register_family
from ._inline_common import INLINE_CARD, INLINE_CFG, inline_release
from .flatten_deit import remap_official as _remap_deit
from .vit import VisionTransformerAttn, vit_out_indices

__all__ = ["remap_official"]


def remap_official(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Official InLine-DeiT checkpoint -> our state dict (identical names): unwrap `model` / `model_ema` /
    `state_dict` and resample `pos_embed` (timm's `resample_abs_pos_embed`, bicubic, class slot kept) to the model's
    grid when it differs. InLine has no other size-bound tensor."""
    return _remap_deit(state_dict, model)


_DEIT = dict(patch_size=16, depth=12, attn="inline")
register_family(__name__, VisionTransformerAttn, [
    Variant("inline_deit_micro", dict(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=2, mlp_ratio=2.0,
                                      attn="inline"),
            dict(img_size=32, source="test/demo variant (patch 4)", notes="not a paper model"),
            cfg=dict(input_size=(3, 32, 32), crop_pct=1.0)),
    Variant("inline_deit_tiny", dict(**_DEIT, embed_dim=192, num_heads=6),
            dict(params_m=6.5, gmacs=1.1, top1=74.5, ref_params=6_477_736, ref_gmacs=1.1),
            weights={"in1k": inline_release("1d6b8191ad6d4114b291", 74.5)}),
    Variant("inline_deit_small", dict(**_DEIT, img_size=288, embed_dim=320, num_heads=10),
            dict(img_size=288, params_m=16.7, gmacs=5.0, top1=80.2, ref_params=16_734_760, ref_gmacs=5.0),
            cfg=dict(input_size=(3, 288, 288)),
            weights={"in1k": inline_release("2f3898b07e9247f3beb3", 80.2)}),
    Variant("inline_deit_base", dict(**_DEIT, img_size=448, embed_dim=384, num_heads=12),
            dict(img_size=448, params_m=23.8, gmacs=17.2, top1=82.3, ref_params=23_797_096, ref_gmacs=17.2),
            cfg=dict(input_size=(3, 448, 448)),
            weights={"in1k": inline_release("10bdd726d4b0435eb34e", 82.3)}),
], cfg=dict(first_conv="patch_embed.proj", **INLINE_CFG), stride=lambda a: a.get("patch_size", 16),
    remap=remap_official, card=INLINE_CARD, out_indices=vit_out_indices, non_std=True)
