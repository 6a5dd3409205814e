"""Pola-Swin (the Swin-v1 host of FLatten-Swin with PolaFormer's polarity-aware linear attention early).

The host is `FlattenSwin` with `attn=("polarity", "polarity", "window", "window")` (official `ATTN_TYPE='LLSS'`):
module names follow the official file (`patch_embed`, `layers.{s}.blocks.{b}`, `layers.{s}.downsample`, `norm`,
`head`; the attention's `qkvg`, `dwc`, `power`, `scale`, `positional_encoding`, `proj`), so the official checkpoints
load with an identity remap (recomputed buffers dropped, size-bound tables resized).

Paper: PolaFormer (arXiv 2501.15061), Sec. 5.1 (ImageNet-1K, the Swin rows); Swin (arXiv 2103.14030) for the host.
Official: ZacharyMeng/PolaFormer@44cdd39 `models/pola_swin.py` (`PolaSwinTransformer`) and `cfgs/pola_swin_*.yaml`
    (window 56: the 'L' blocks of stages 1-2 attend over the whole 56^2 / 28^2 map at 224, no shift; 'S' blocks
    are Swin W-MSA/SW-MSA with window 7). Official code: the polarity PE has the window's token count / subquad:
    resized to the run-time grid, so every model runs at any resolution (docs/deviations.md).
Symbols: C embed dim, w 'S' window (7), alpha power range (4), k DWC kernel (5).
"""

from __future__ import annotations

from ._builder import Variant, register_family
from ._pola_common import POLA_CARD, POLA_CFG
from .flatten_swin import FlattenSwin
from .flatten_swin import remap_official as _remap_swin

__all__ = ["POLA_LLSS", "remap_official"]

#: Pola-Swin's stages (official `ATTN_TYPE='LLSS'`): polarity attention early, Swin's windows late.
POLA_LLSS = ("polarity", "polarity", "window", "window")


def remap_official(state_dict, model, resize: bool = True) -> dict:
    """Official Pola-Swin checkpoint -> our state dict (identical names).

    Unwraps `model` / `model_ema` / `state_dict`, drops the recomputed buffers (`relative_position_index`,
    `attn_mask`) and, with `resize`, bicubic-resizes `positional_encoding` and `relative_position_bias_table` whose
    size differs from the model's construction size (FLatten-Swin's loader rule, which the host shares).
    """
    return _remap_swin(state_dict, model, resize)


_T = dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), attn=POLA_LLSS)
_S = dict(embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24), attn=POLA_LLSS)
_B = dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32), attn=POLA_LLSS)
register_family(__name__, FlattenSwin, [
    Variant("pola_swin_micro", dict(img_size=64, embed_dim=32, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8),
                                    mlp_ratio=2.0, window_size=3, attn=POLA_LLSS),
            dict(img_size=64, source="test/demo variant (stage grids 16/8/4/2, 'S' window 3: padded, shifted, "
                                     "masked)", notes="not a paper model"),
            cfg=dict(input_size=(3, 64, 64), crop_pct=1.0, notes="test/demo variant")),
    Variant("pola_swin_tiny", _T, dict(top1=82.6, ref_params=29_285_696, ref_gmacs=4.659)),
    Variant("pola_swin_small", _S, dict(top1=83.6, ref_params=50_603_600, ref_gmacs=8.91)),
    Variant("pola_swin_base", _B, dict(top1=83.8, ref_params=89_137_864, ref_gmacs=15.708)),
], cfg=dict(first_conv="patch_embed.proj", **POLA_CFG), stride=lambda a: 32, remap=remap_official, card=POLA_CARD)
