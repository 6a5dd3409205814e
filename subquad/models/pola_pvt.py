"""Pola-PVT (the PVT v1 host of FLatten-PVT with PolaFormer's polarity-aware linear attention in every stage).

The host is `FlattenPVT` with `attn="polarity"` (official `ATTN_TYPE='LLLL'`, `PVT_LA_SR_RATIOS=1111`): no class
token, no final norm, mean pooling, LayerNorm eps 1e-6, MLP ratios (8, 8, 4, 4). The official attention's `qg`
([q; g]) and `kv` ([k; v]) are concatenated into our `qkvg` by `remap_official`; every other name is the official one.

Paper: PolaFormer (arXiv 2501.15061), Sec. 5.1 (ImageNet-1K, the PVT rows); PVT v1 (arXiv 2102.12122) for the host.
Official: ZacharyMeng/PolaFormer@44cdd39 `models/pola_pvt.py` (`PyramidVisionTransformer`, `pola_pvt_tiny`, ...).
    Official code: the polarity PE has the stage grid's token count / subquad: resized to the run-time grid, so
    every model runs at any resolution (docs/deviations.md).
Symbols: C_i stage width, h heads (d = C_i / h = 64), alpha power range (4), k DWC kernel (5).
"""

from __future__ import annotations

import torch
from torch import nn

from ..attention.polarity import remap_qg_kv
from ._builder import Variant, register_family, unwrap_state_dict
from ._flatten_common import resize_token_tables
from ._pola_common import POLA_CARD, POLA_CFG
from .flatten_pvt import FlattenPVT

__all__ = ["remap_official"]


def remap_official(state_dict: dict[str, torch.Tensor], model: nn.Module, resize: bool = True) -> dict:
    """Official Pola-PVT checkpoint -> our state dict.

    Unwraps `model` / `model_ema` / `state_dict`, drops the unused final `norm.*` (built but never called by the
    official model; not built here), concatenates each attention's `qg` + `kv` into `qkvg` ([q; k; v; g]) and, with
    `resize`, resizes `pos_embed{i}` (bilinear) and `positional_encoding` (bicubic) tables whose grid differs from
    the model's construction grid.

    Args:
        state_dict: official checkpoint (wrapped or flat).
        model: the target model (a `FlattenPVT` with polarity stages).
        resize: resize size-bound tables to the model's construction grids.
    """
    sd = {k: v for k, v in unwrap_state_dict(state_dict).items() if k not in ("norm.weight", "norm.bias")}
    sd = remap_qg_kv(sd, model)
    return resize_token_tables(sd, model) if resize else sd


_PVT = dict(embed_dims=(64, 128, 320, 512), num_heads=(1, 2, 5, 8), mlp_ratios=(8, 8, 4, 4), attn="polarity")
register_family(__name__, FlattenPVT, [
    Variant("pola_pvt_micro", dict(img_size=32, patch_size=2, embed_dims=(32, 64, 96, 128), num_heads=(1, 2, 3, 4),
                                   mlp_ratios=(2, 2, 2, 2), depths=(1, 1, 1, 1), attn="polarity"),
            dict(img_size=32, source="test/demo variant (patch 2)", notes="not a paper model"),
            cfg=dict(input_size=(3, 32, 32), crop_pct=1.0, notes="test/demo variant")),
    Variant("pola_pvt_tiny", dict(**_PVT, depths=(2, 2, 2, 2)),
            dict(top1=78.8, ref_params=12_924_648 - 1024, ref_gmacs=2.257)),
    Variant("pola_pvt_small", dict(**_PVT, depths=(3, 4, 6, 3)),
            dict(top1=81.9, ref_params=23_157_224 - 1024, ref_gmacs=4.469)),
], cfg=dict(first_conv="patch_embed1.proj", **POLA_CFG), stride=lambda a: a.get("patch_size", 4) * 8,
    remap=remap_official, card={**POLA_CARD, "notes": POLA_CARD["notes"] + ", minus the unused final norm "
                                                      "(2 x 512 = 1024 params, dropped here)"})
