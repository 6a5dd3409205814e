"""InLine-PVT: the PVT v1 host with InLine attention in every stage.

A thin family over `subquad.models.flatten_pvt.FlattenPVT` (the official module names `patch_embed{i}`,
`pos_embed{i}`, `block{i}.{j}`, `head`; mean pooling, no final norm): every stage is `inline` (identity kernel,
local residual) on the full key grid (the official `PVT_LA_SR_RATIOS = 1111` default: no spatial reduction in
InLine stages). The official widths keep PVT's but with d = 32 heads, (2, 4, 10, 16). The official checkpoints'
`attn.q` + `attn.kv` are concatenated into our `attn.qkv` by `remap_official`. `inline_pvt_micro` is a tiny variant
for tests and the demo on 32 x 32 images (patch 2).

Paper: Bridging the Divide: Reconsidering Softmax and Linear Attention (arXiv 2412.06590), Tab. 3 (PVT rows).
Official: LeapLabTHU/InLine@e463a6f `models/inline_pvt.py` (`PyramidVisionTransformer`, `inline_pvt_*`).
Symbols: C_i stage width, h heads (d = C_i / h = 32).
"""

from __future__ import annotations

import torch
from torch import nn

from ._builder import Variant, register_family, unwrap_state_dict
from ._flatten_common import resize_token_tables
from ._inline_common import INLINE_CARD, INLINE_CFG, inline_release, remap_inline_q_kv
from .flatten_pvt import FlattenPVT

__all__ = ["remap_official"]


def remap_official(state_dict: dict[str, torch.Tensor], model: nn.Module, resize: bool = True) -> dict:
    """Official InLine-PVT checkpoint -> our state dict.

    Unwraps `model` / `model_ema` / `state_dict`, concatenates each block's `attn.q` and `attn.kv` into `attn.qkv`
    and, with `resize`, resizes `pos_embed{i}` (bilinear, the run-time rule) whose grid differs from the model's
    construction grid.

    Args:
        state_dict: official checkpoint (wrapped or flat).
        model: the target FlattenPVT built with attn='inline'.
        resize: resize `pos_embed{i}` to the model's construction grids.
    """
    sd = remap_inline_q_kv(dict(unwrap_state_dict(state_dict)), model)
    return resize_token_tables(sd, model) if resize else sd


_PVT = dict(embed_dims=(64, 128, 320, 512), num_heads=(2, 4, 10, 16), mlp_ratios=(8, 8, 4, 4), attn="inline")
register_family(__name__, FlattenPVT, [
    Variant("inline_pvt_micro", dict(img_size=32, patch_size=2, embed_dims=(32, 64, 96, 128), num_heads=(2, 2, 4, 4),
                                     mlp_ratios=(2, 2, 2, 2), depths=(1, 1, 1, 1), attn="inline"),
            dict(img_size=32, source="test/demo variant (patch 2)", notes="not a paper model"),
            cfg=dict(input_size=(3, 32, 32), crop_pct=1.0)),
    Variant("inline_pvt_tiny", dict(**_PVT, depths=(2, 2, 2, 2)),
            dict(params_m=12.0, gmacs=2.0, top1=78.2, ref_params=12_032_232, ref_gmacs=2.0),
            weights={"in1k": inline_release("90ac52b1555b401eb5e6", 78.2)}),
    Variant("inline_pvt_small", dict(**_PVT, depths=(3, 4, 6, 3)),
            dict(params_m=21.6, gmacs=3.9, top1=82.0, ref_params=21_556_136, ref_gmacs=3.9),
            weights={"in1k": inline_release("1ab953b2479d433080a3", 82.0)}),
    Variant("inline_pvt_medium", dict(**_PVT, depths=(3, 4, 18, 3)),
            dict(params_m=37.6, gmacs=6.9, top1=83.2, ref_params=37_618_856, ref_gmacs=6.9),
            weights={"in1k": inline_release("a72aec31e6084bc0a280", 83.2)}),
    Variant("inline_pvt_large", dict(**_PVT, depths=(3, 8, 27, 3)),
            dict(params_m=50.2, gmacs=10.2, top1=83.6, ref_params=51_154_280, ref_gmacs=10.2,
                 notes="README 50.2M; the official class has 51.15M (docs/deviations.md)"),
            weights={"in1k": inline_release("efd91318ba964f01b288", 83.6)}),
], cfg=dict(first_conv="patch_embed1.proj", **INLINE_CFG), stride=lambda a: a.get("patch_size", 4) * 8,
    remap=remap_official, card=INLINE_CARD)
