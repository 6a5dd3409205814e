"""InLine-Swin: the Swin host with InLine attention in the early stages and Swin windows late.

A family over `subquad.models.flatten_swin.FlattenSwin` (official Swin names): each stage takes its mechanism from
`attn`; InLine-Swin-T is ("inline", "inline", "inline", "window") (official `ATTN_TYPE: IIIS`), -S is
("inline", "inline", "window", "window") (`IISS`). InLine-Swin-B (`IIMS2`) mixes mechanisms inside stage 3: its
first 2 blocks are InLine and the other 16 Swin windows; the Swin host takes such a stage as a tuple of one name per
block. The official InLine window (`WINDOW_SIZE: 56`) covers the whole stage grid at 224 px (stage grids 56 / 28 / 14,
the window clipped to the grid, no shift), so InLine blocks are global here (the host's default); 'S' blocks use
windows of 7 (`max(7, 56 // 8)`). `inline_swin_micro` is a tiny variant for tests and the demo.

Paper: Bridging the Divide: Reconsidering Softmax and Linear Attention (arXiv 2412.06590), Tab. 3 (Swin rows).
Official: LeapLabTHU/InLine@e463a6f `models/inline_swin.py` (`InLineSwin`, `BasicLayer`) and
`cfgs/inline_swin_{t,s,b}.yaml`.
Symbols: C embed dim, w 'S' window (paper M), h heads (d = 32).
"""

from __future__ import annotations

from collections.abc import Sequence

from ._builder import Variant, register_family
from ._inline_common import INLINE_CARD, INLINE_CFG, inline_release
from .flatten_swin import FlattenSwin
from .flatten_swin import remap_official as _remap_swin

__all__ = ["InLineSwin", "remap_official"]


class InLineSwin(FlattenSwin):
    """`FlattenSwin` with InLine-Swin-T's stages by default; `attn` may give a stage as a tuple of one mechanism name
    per block (InLine-Swin-B's stage 3: 2 InLine blocks, then 16 window blocks). Every other argument is
    `FlattenSwin`'s.

    Args:
        attn: a name for every stage, or one entry per stage, each a name or a tuple of `depths[i]` names; None:
            InLine-Swin-T's ("inline", "inline", "inline", "window").
        other: see `FlattenSwin`.
    """

    def __init__(self, *args, attn: str | Sequence[str | Sequence[str]] | None = None,
                 attn_kwargs: dict | None = None, **kwargs) -> None:
        attn = ("inline", "inline", "inline", "window") if attn is None else attn  # None: InLine-Swin-T's IIIS
        super().__init__(*args, attn=attn, attn_kwargs=attn_kwargs, **kwargs)


def remap_official(state_dict, model, resize: bool = True) -> dict:
    """Official InLine-Swin checkpoint -> our state dict (identical names): unwraps `model` / `model_ema` /
    `state_dict`, drops the recomputed buffers (`relative_position_index`, `attn_mask`) and, with `resize`,
    bicubic-resizes `relative_position_bias_table` to the model's window (the official fine-tuning loader's rule)."""
    return _remap_swin(state_dict, model, resize)


_I, _W = "inline", "window"
_T = dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), attn=(_I, _I, _I, _W))
_S = dict(embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24), attn=(_I, _I, _W, _W))
_B = dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32), attn=(_I, _I, (_I,) * 2 + (_W,) * 16, _W))
register_family(__name__, InLineSwin, [
    Variant("inline_swin_micro", dict(img_size=64, embed_dim=32, depths=(1, 1, 2, 1), num_heads=(2, 2, 4, 8),
                                      mlp_ratio=2.0, window_size=3, attn=(_I, _I, (_I, _W), _W)),
            dict(img_size=64, source="test/demo variant (stage grids 16/8/4/2; stage 3 mixes inline and window "
                                     "blocks as InLine-Swin-B)", notes="not a paper model"),
            cfg=dict(input_size=(3, 64, 64), crop_pct=1.0)),
    Variant("inline_swin_tiny", _T, dict(params_m=30.0, gmacs=4.5, top1=82.4, ref_params=29_223_544, ref_gmacs=4.5),
            weights={"in1k": inline_release("32810869fcc34410966b", 82.4)}),
    Variant("inline_swin_small", _S, dict(params_m=50.0, gmacs=8.7, top1=83.6, ref_params=49_793_296, ref_gmacs=8.7),
            weights={"in1k": inline_release("e9657fd247c04c7cb1a1", 83.6)}),
    Variant("inline_swin_base", _B, dict(params_m=88.0, gmacs=15.4, top1=84.1, ref_params=88_350_120, ref_gmacs=15.4),
            weights={"in1k": inline_release("bf23564bb64c420aafe1", 84.1)}),
], cfg=dict(first_conv="patch_embed.proj", **INLINE_CFG), stride=lambda a: 32, remap=remap_official,
    card=INLINE_CARD)
