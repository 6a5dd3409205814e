"""InLine-CSwin: the CSwin host with global InLine attention in the early stages and CSwin stripes late.

A family over `subquad.models.flatten_cswin.FlattenCSWin` (official CSwin names, so official checkpoints load with
an identity remap): InLine-CSwin is ("inline", "inline", "cswin", "cswin") (official `ATTN_TYPE: IISS`). At 224 px
the official InLine split (`CSWIN_LA_SPLIT_SIZE: 56-28-14-7`) equals the stage grid, so an 'I' block is one global
branch with every head (the "host_qkv" form `InLineCore`: injective linear attention + local residual + LePE); the
blocks of `InLineCSWin` give that form their input before `norm1`, whose token mean predicts the local kernels (the
official `CSWinBlock.forward` passes `x.mean(dim=1)`). `inline_cswin_micro` is a tiny variant for tests and the demo.

Paper: Bridging the Divide: Reconsidering Softmax and Linear Attention (arXiv 2412.06590), Tab. 3 (CSwin rows).
Official: LeapLabTHU/InLine@e463a6f `models/inline_cswin.py` (`CSWinTransformer`, `CSWinBlock`, `InLineAttention`)
and `cfgs/inline_cswin_{t,s,b}.yaml`.
Symbols: C embed dim, sw stripe width (paper sw, `split_size`), h heads.
"""

from __future__ import annotations

import torch
from timm.layers import register_notrace_module
from torch import nn

from ._builder import Variant, register_family
from ._inline_common import INLINE_CARD, INLINE_CFG, inline_release
from .flatten_cswin import CSWinBlock, FlattenCSWin
from .flatten_cswin import remap_official as _remap_cswin

__all__ = ["InLineCSWin", "InLineCSWinBlock", "remap_official"]


@register_notrace_module
class InLineCSWinBlock(CSWinBlock):
    """`CSWinBlock` that hands a mixer declaring `reads_block_input` the block input before `norm1` as `x` (the
    official InLine-CSwin token mean); other mixers get the normed input, as in `CSWinBlock`. Same parameters."""

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        B, N, C = x.shape
        h = self.norm1(x)
        qkv = self.qkv(h).view(B, N, 3, C)
        mixer = self.mixer
        y = mixer.forward_qkv(*qkv.unbind(2), hw, x=x if getattr(mixer, "reads_block_input", False) else h)
        x = x + self.drop_path(self.proj_drop(self.proj(y)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class InLineCSWin(FlattenCSWin):
    """`FlattenCSWin` with `InLineCSWinBlock` blocks (same arguments, parameters and keys); `attn=None` is
    InLine-CSwin's ("inline", "inline", "cswin", "cswin")."""

    def __init__(self, *args, attn: str | tuple | None = None, attn_kwargs: dict | None = None, **kwargs) -> None:
        attn = ("inline", "inline", "cswin", "cswin") if attn is None else attn  # None: InLine-CSwin's IISS
        super().__init__(*args, attn=attn, attn_kwargs=attn_kwargs, **kwargs)
        for i in range(self.num_stages):
            for blk in getattr(self, f"stage{i + 1}"):
                blk.__class__ = InLineCSWinBlock


def remap_official(state_dict: dict[str, torch.Tensor], model: nn.Module, resize: bool = True) -> dict:
    """Official InLine-CSwin checkpoint -> our state dict (identical names): unwraps `model` / `model_ema` /
    `state_dict` / `state_dict_ema`. InLine has no size-bound tensor to resize."""
    return _remap_cswin(state_dict, model, resize)


_IISS = ("inline", "inline", "cswin", "cswin")
register_family(__name__, InLineCSWin, [
    Variant("inline_cswin_micro", dict(img_size=64, embed_dim=32, depths=(1, 1, 2, 1), num_heads=(2, 2, 4, 8),
                                       mlp_ratio=2.0, split_size=(1, 2, 3, 3), attn=_IISS),
            dict(img_size=64, source="test/demo variant (stage grids 16/8/4/2, 'S' stripes of width 3 in stage 3)",
                 notes="not a paper model"),
            cfg=dict(input_size=(3, 64, 64), crop_pct=1.0)),
    Variant("inline_cswin_tiny", dict(embed_dim=64, depths=(2, 4, 18, 1), num_heads=(2, 4, 8, 16), attn=_IISS),
            dict(params_m=25.0, gmacs=4.3, top1=83.2, ref_params=20_604_520, ref_gmacs=4.3,
                 notes="README params differ from the official class (docs/deviations.md); GMACs agree"),
            weights={"in1k": inline_release("49fa2ecc543647c4b970", 83.2)}),
    Variant("inline_cswin_small", dict(embed_dim=64, depths=(3, 6, 29, 2), num_heads=(2, 4, 8, 16), attn=_IISS),
            dict(params_m=43.0, gmacs=6.8, top1=83.8, ref_params=33_032_872, ref_gmacs=6.8,
                 notes="README params differ from the official class (docs/deviations.md); GMACs agree"),
            weights={"in1k": inline_release("59f4e65f776f4052b93c", 83.8)}),
    Variant("inline_cswin_base", dict(embed_dim=96, depths=(3, 6, 29, 2), num_heads=(4, 8, 16, 32), attn=_IISS),
            dict(params_m=96.0, gmacs=14.9, top1=84.5, ref_params=73_413_640, ref_gmacs=14.9,
                 notes="README params differ from the official class (docs/deviations.md); GMACs agree"),
            weights={"in1k": inline_release("91e17121df284ae38521", 84.5)}),
], cfg=dict(first_conv="stage1_conv_embed.0", crop_pct=0.9, **INLINE_CFG), stride=lambda a: 32,
    remap=remap_official, card=INLINE_CARD)
