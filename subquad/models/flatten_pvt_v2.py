"""FLatten-PVTv2 (PVTv2 host with focused linear attention in every stage).

Module names follow the official file (`patch_embed{i}`, `block{i}.{j}`, `norm{i}`, `head`), so the official
checkpoints load unchanged. Each stage takes its mechanism from `attn` (one name, or one per stage):
`"focused_linear"` is FLatten-PVTv2; `"softmax"` with the default `sr_ratios=(8, 4, 2, 1)` is the PVTv2 baseline (timm's
`pvt_v2_b*` compute the same function, with another key layout). `flatten_pvt_v2_micro` is a tiny variant for tests
and the demo on 32 x 32 images: its first overlapping embedding is 3x3 stride 2, so the stage strides are 2/4/8/16.

Paper: FLatten Transformer (arXiv 2308.00442), Tab. 2 (PVTv2 rows); PVTv2 (Wang et al.
2022) for the host.
Official: LeapLabTHU/FLatten-Transformer@abdb115 `models/flatten_pvt_v2.py` (`PyramidVisionTransformerV2`).
Symbols: C_i stage width, h heads (d = 64 for b1-b5, 32 for b0), p focusing factor (3), k DWC kernel (5).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ..attention.focused_linear import remap_legacy as remap_focused_q_kv
from ..layers.patch_embed import OverlapPatchEmbed
from ._builder import Variant, register_family, unwrap_state_dict
from ._flatten_common import FLATTEN_CARD, FLATTEN_CFG, flatten_release
from ._flatten_common import resize_token_tables as _resize_tables
from .flatten_pvt import PVTHost

__all__ = ["FlattenPVTv2", "remap_official"]


class FlattenPVTv2(PVTHost):
    """PVTv2 host: overlapping patch embeddings, ConvMlp blocks, a LayerNorm closing every stage, mean-pool head.

    Shapes: images (B, in_chans, H, W) with H, W >= the total stride; stage i tokens (B, H_i * W_i, C_i) with
    H_0 = floor((H - 1) / s_0) + 1 and H_{i+1} = floor((H_i - 1) / 2) + 1 (convs padded by k // 2). No absolute
    position embedding; the focused-attention PE (built at `img_size`) is resized by the mechanism at run time.

    Paper: FLatten Transformer (arXiv 2308.00442) Tab. 2; PVTv2 (arXiv 2106.13797). Official:
    LeapLabTHU/FLatten-Transformer `models/flatten_pvt_v2.py` `PyramidVisionTransformerV2`.

    Args:
        img_size: construction resolution (sets the focused-attention PE grids as the official code does).
        in_chans, num_classes: input channels, classifier outputs (0: no head).
        embed_dims, num_heads, mlp_ratios, depths: per-stage sizes.
        stem: (kernel, stride) of the first overlapping embedding ((7, 4) official; (3, 2) in the tiny layout).
        attn: the mechanism: a name for every stage or 4 names, one per stage; None: "focused_linear" in every
            stage (FLatten-PVTv2).
        sr_ratios: spatial reduction of 'softmax' stages (the PVTv2 baseline).
        la_sr_ratios: spatial reduction of 'focused_linear' stages (1 in every released model).
        linear: PVTv2-Li pooled keys (AdaptiveAvgPool(7)) in the attention (no released model uses it).
        focusing_factor, kernel_size: FLatten p and DWC k.
        qkv_bias: bias of the q/kv projections.
        attn_kwargs: extra options passed to every stage's mechanism.
        drop_rate, drop_path_rate: dropout (MLP, head) and stochastic depth (linear rule).
        global_pool: 'avg' or '' (unpooled (B, H, W, C) features).
        stage_attn: deprecated spelling of `attn` (DeprecationWarning).
    """

    init_convs = "fan_out"
    init_norms = True

    def __init__(self, img_size: int | tuple[int, int] = 224, in_chans: int = 3, num_classes: int = 1000,
                 embed_dims: Sequence[int] = (64, 128, 320, 512), num_heads: Sequence[int] = (1, 2, 5, 8),
                 mlp_ratios: Sequence[float] = (8, 8, 4, 4), depths: Sequence[int] = (2, 2, 2, 2),
                 stem: tuple[int, int] = (7, 4), attn: str | Sequence[str] | None = None,
                 sr_ratios: Sequence[int] = (8, 4, 2, 1), la_sr_ratios: Sequence[int] = (1, 1, 1, 1),
                 linear: bool = False, focusing_factor: int = 3, kernel_size: int = 5, qkv_bias: bool = True,
                 attn_kwargs: dict | None = None, drop_rate: float = 0.0, drop_path_rate: float = 0.0,
                 global_pool: str = "avg", stage_attn: Sequence[str] | None = None, device=None,
                 dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        img_hw, names, dpr = self._setup(
            img_size, in_chans, stem[1] * 8, attn, stage_attn, drop_path_rate, embed_dims=embed_dims,
            num_heads=num_heads, mlp_ratios=mlp_ratios, depths=depths, sr_ratios=sr_ratios, la_sr_ratios=la_sr_ratios)
        # Construction grids as the official code computes them (floors of img / stride).
        # Each stage's overlapping patch embedding: (input channels, kernel, stride): the stem, then 3x3 stride-2.
        embeds = [(in_chans, *stem)] + [(embed_dims[i - 1], 3, 2) for i in range(1, 4)]
        grid, stride = (img_hw[0] // stem[1], img_hw[1] // stem[1]), stem[1]
        for i, (embed_in, kernel, embed_stride) in enumerate(embeds):
            if i > 0:
                grid, stride = (grid[0] // 2, grid[1] // 2), stride * 2
            self.grids.append(grid)
            stage = dict(grid=grid, qkv_bias=qkv_bias, sr_ratio=sr_ratios[i],
                         la_sr_ratio=la_sr_ratios[i], hints=dict(focusing_factor=focusing_factor,
                                                                 kernel_size=kernel_size, linear_sr=linear,
                                                                 dwc_init="pvt_v2"), host="PVTv2 stages")
            self._register_stage(
                i, patch_embed=OverlapPatchEmbed(embed_in, embed_dims[i], patch_size=kernel, stride=embed_stride, **dd),
                block=self._make_blocks(i, depth=depths[i], dim=embed_dims[i], num_heads=num_heads[i],
                                        mlp_ratio=mlp_ratios[i], attn=names[i], stage=stage, attn_kwargs=attn_kwargs,
                                        conv_mlp=True, drop=drop_rate, dpr=dpr[i], stride=stride,
                                        feature_module="norm", dd=dd),
                norm=nn.LayerNorm(embed_dims[i], eps=1e-6, **dd))
        self._init_head(num_classes, global_pool, drop_rate, **dd)
        self._finish_init()

    stage_modules = ("patch_embed", "block", "norm")

    def _stage_norm(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, f"norm{i + 1}")(x)

    def _final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return x



def remap_official(state_dict: dict[str, torch.Tensor], model: nn.Module, resize: bool = True) -> dict:
    """Official FLatten-PVTv2 checkpoint -> our state dict (identical names, but the focused stages' `q` + `kv`,
    concatenated into `qkv`).

    Unwraps `model` / `model_ema` / `state_dict` and, with `resize`, bicubic-resizes `positional_encoding` tables
    whose grid differs from the model's construction grid (the official fine-tuning loader's rule).

    Args:
        state_dict: official checkpoint (wrapped or flat).
        model: the target FlattenPVTv2.
        resize: resize size-bound tables to the model's construction grids.
    """
    sd = remap_focused_q_kv(dict(unwrap_state_dict(state_dict)), model)  # focused: `q` + `kv` -> `qkv`
    return _resize_tables(sd, model) if resize else sd


_B = dict(embed_dims=(64, 128, 320, 512), num_heads=(1, 2, 5, 8), mlp_ratios=(8, 8, 4, 4))
register_family(__name__, FlattenPVTv2, [
    Variant("flatten_pvt_v2_micro", dict(img_size=32, embed_dims=(32, 64, 96, 128), num_heads=(1, 2, 3, 4),
                                         mlp_ratios=(2, 2, 2, 2), depths=(1, 1, 1, 1), stem=(3, 2)),
            dict(img_size=32, source="test/demo variant (3x3 s2 stem)", notes="not a paper model"),
            cfg=dict(input_size=(3, 32, 32), crop_pct=1.0)),
    Variant("flatten_pvt_v2_b0", dict(embed_dims=(32, 64, 160, 256), num_heads=(1, 2, 5, 8), mlp_ratios=(8, 8, 4, 4),
                                      depths=(2, 2, 2, 2)),
            dict(top1=71.1, source="official README (71.098 top-1)", ref_params=3_594_824, ref_gmacs=0.59),
            weights={"in1k": flatten_release("5d1f01532b104da28e7b", 71.1)}),
    Variant("flatten_pvt_v2_b1", dict(**_B, depths=(2, 2, 2, 2)),
            dict(params_m=12.9, gmacs=2.2, top1=79.5, ref_params=12_931_240, ref_gmacs=2.23)),
    Variant("flatten_pvt_v2_b2", dict(**_B, depths=(3, 4, 6, 3)),
            dict(params_m=22.6, gmacs=4.3, top1=82.5, ref_params=22_548_264, ref_gmacs=4.27)),
    Variant("flatten_pvt_v2_b3", dict(**_B, depths=(3, 4, 18, 3)),
            dict(gmacs=7.3, top1=83.7, ref_params=38_273_832, ref_gmacs=7.31,
                 source=FLATTEN_CARD["source"] + " (read off Fig. 6, approx.)")),
    Variant("flatten_pvt_v2_b4", dict(**_B, depths=(3, 8, 27, 3)),
            dict(gmacs=10.7, top1=84.0, ref_params=51_836_968, ref_gmacs=10.71,
                 source=FLATTEN_CARD["source"] + " (read off Fig. 6, approx.)")),
    Variant("flatten_pvt_v2_b5", dict(embed_dims=(64, 128, 320, 512), num_heads=(1, 2, 5, 8), mlp_ratios=(4, 4, 4, 4),
                                      depths=(3, 6, 40, 3)),
            dict(ref_params=67_061_544, ref_gmacs=12.48, source="no official config; not in the paper")),
], cfg=dict(first_conv="patch_embed1.proj", **FLATTEN_CFG), stride=lambda a: a.get("stem", (7, 4))[1] * 8,
    remap=remap_official, card=FLATTEN_CARD)
