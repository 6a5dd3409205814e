"""FLatten-PVTv2 (PVTv2 host with focused linear attention in every stage).

Module names follow the official file (`patch_embed{i}`, `block{i}.{j}`, `norm{i}`, `head`), so the official
checkpoints load unchanged. Each stage takes its mechanism from `stage_attn`: `("focused_linear",) * 4` is
FLatten-PVTv2; `("softmax",) * 4` with the default `sr_ratios=(8, 4, 2, 1)` is the PVTv2 baseline (timm's
`pvt_v2_b*` compute the same function, with another key layout). `flatten_pvt_v2_micro` is a tiny variant for tests
and the demo on 32 x 32 images: its first overlapping embedding is 3x3 stride 2, so the stage strides are 2/4/8/16.

Paper: FLatten Transformer (seed 001_95cca12290c6a157, arXiv 2308.00442), Tab. 2 (PVTv2 rows); PVTv2 (Wang et al.
2022) for the host.
Official: LeapLabTHU/FLatten-Transformer@abdb115 `models/flatten_pvt_v2.py` (`PyramidVisionTransformerV2`).
Symbols: C_i stage width, h heads (d = 64 for b1-b5, 32 for b0), p focusing factor (3), k DWC kernel (5).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from timm.layers import trunc_normal_
from timm.models import generate_default_cfgs, register_model
from torch import nn

from ..errors import UserError
from ..layers.patch_embed import OverlapPatchEmbed
from ._builder import build, unwrap_state_dict
from ._card import ModelCard, register_card
from ._pyramid import PyramidBackbone
from .flatten_pvt import PVTBlock, _check_stages, _resize_tables, stage_attn_kwargs

__all__ = ["FlattenPVTv2", "remap_official"]


class FlattenPVTv2(PyramidBackbone):
    """PVTv2 host: overlapping patch embeddings, ConvMlp blocks, a LayerNorm closing every stage, mean-pool head.

    Shapes: images (B, in_chans, H, W) with H, W >= the total stride; stage i tokens (B, H_i * W_i, C_i) with
    H_0 = floor((H - 1) / s_0) + 1 and H_{i+1} = floor((H_i - 1) / 2) + 1 (convs padded by k // 2). No absolute
    position embedding; the focused-attention PE (built at `img_size`) is resized by the mechanism at run time.

    Paper: FLatten (seed 001) Tab. 2. Official: FLatten `flatten_pvt_v2.PyramidVisionTransformerV2`.

    Args:
        img_size: construction resolution (sets the focused-attention PE grids as the official code does).
        in_chans, num_classes: input channels, classifier outputs (0: no head).
        embed_dims, num_heads, mlp_ratios, depths: per-stage sizes.
        stem: (kernel, stride) of the first overlapping embedding ((7, 4) official; (3, 2) in the tiny layout).
        stage_attn: mechanism per stage.
        sr_ratios: spatial reduction of 'softmax' stages (the PVTv2 baseline).
        la_sr_ratios: spatial reduction of 'focused_linear' stages (1 in every released model).
        linear: PVTv2-Li pooled keys (AdaptiveAvgPool(7)) in the attention (no released model uses it).
        focusing_factor, kernel_size: FLatten p and DWC k.
        qkv_bias: bias of the q/kv projections.
        attn_kwargs: extra options passed to every stage's mechanism.
        drop_rate, drop_path_rate: dropout (MLP, head) and stochastic depth (linear rule).
    """

    arch_name = "flatten_pvt_v2"

    def __init__(self, img_size: int | tuple[int, int] = 224, in_chans: int = 3, num_classes: int = 1000,
                 embed_dims: Sequence[int] = (64, 128, 320, 512), num_heads: Sequence[int] = (1, 2, 5, 8),
                 mlp_ratios: Sequence[float] = (8, 8, 4, 4), depths: Sequence[int] = (2, 2, 2, 2),
                 stem: tuple[int, int] = (7, 4), stage_attn: Sequence[str] = ("focused_linear",) * 4,
                 sr_ratios: Sequence[int] = (8, 4, 2, 1), la_sr_ratios: Sequence[int] = (1, 1, 1, 1),
                 linear: bool = False, focusing_factor: int = 3, kernel_size: int = 5, qkv_bias: bool = True,
                 attn_kwargs: dict | None = None, drop_rate: float = 0.0, drop_path_rate: float = 0.0,
                 device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if isinstance(stage_attn, str):
            stage_attn = (stage_attn,) * 4
        _check_stages(embed_dims=embed_dims, num_heads=num_heads, mlp_ratios=mlp_ratios, depths=depths,
                      stage_attn=stage_attn, sr_ratios=sr_ratios, la_sr_ratios=la_sr_ratios)
        img_hw = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        self.in_chans = in_chans
        self.num_classes = num_classes
        self.num_stages = 4
        self.total_stride = stem[1] * 8
        self.num_features = self.head_hidden_size = embed_dims[-1]
        self.stage_attn = tuple(stage_attn)
        self.grad_checkpointing = False
        dpr = torch.linspace(0, drop_path_rate, sum(depths)).tolist()
        # Construction grids as the official code computes them (floors of img / stride).
        grid = (img_hw[0] // stem[1], img_hw[1] // stem[1])
        self.grids: list[tuple[int, int]] = []
        self.feature_info = []
        cur, stride = 0, stem[1]
        for i in range(4):
            if i > 0:
                grid, stride = (grid[0] // 2, grid[1] // 2), stride * 2
            self.grids.append(grid)
            k, s = stem if i == 0 else (3, 2)
            setattr(self, f"patch_embed{i + 1}",
                    OverlapPatchEmbed(in_chans if i == 0 else embed_dims[i - 1], embed_dims[i], k, s, **dd))
            kw = stage_attn_kwargs(stage_attn[i], grid, qkv_bias, sr_ratios[i], la_sr_ratios[i], focusing_factor,
                                   kernel_size, linear_sr=linear, dwc_init="pvt_v2", extra=attn_kwargs)
            setattr(self, f"block{i + 1}", nn.ModuleList([
                PVTBlock(embed_dims[i], num_heads[i], mlp_ratios[i], stage_attn[i], kw, True, drop_rate,
                         dpr[cur + j], **dd) for j in range(depths[i])]))
            setattr(self, f"norm{i + 1}", nn.LayerNorm(embed_dims[i], eps=1e-6, **dd))
            self.feature_info.append(dict(num_chs=embed_dims[i], reduction=stride, module=f"norm{i + 1}"))
            cur += depths[i]
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dims[-1], num_classes, **dd) if num_classes > 0 else nn.Identity()
        if not self.norm1.weight.is_meta:
            self.apply(_init_pvt_v2)

    def _forward_stage(self, i: int, x: torch.Tensor, hw: tuple[int, int] | None):
        if i > 0:
            x = x.transpose(1, 2).reshape(x.shape[0], -1, *hw)
        x, hw = getattr(self, f"patch_embed{i + 1}")(x)
        x = self._run_blocks(getattr(self, f"block{i + 1}"), x, hw)
        return getattr(self, f"norm{i + 1}")(x), hw

    def _truncate(self, num_stages: int) -> None:
        for i in range(num_stages, self.num_stages):
            for name in (f"patch_embed{i + 1}", f"block{i + 1}", f"norm{i + 1}"):
                delattr(self, name)
        self.num_stages = num_stages

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Official exclusions: `pos_embed1..4` and `cls_token`, none of which exists (`scale`/`positional_encoding`
        decay, as in the official training)."""
        return set()

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(stem=r"^patch_embed1",
                    blocks=[(r"^block(\d+)\.(\d+)", None), (r"^patch_embed(\d+)", (0,)), (r"^norm(\d+)", (0,))])


def _init_pvt_v2(m: nn.Module) -> None:
    """Official PVTv2 init: Linear trunc_normal(0.02), LN (1, 0), every Conv2d normal(0, sqrt(2 / fan_out)), fan_out =
    k_h * k_w * out / groups, zero biases."""
    if isinstance(m, nn.Linear):
        trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)
    elif isinstance(m, nn.Conv2d):
        fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels // m.groups
        nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
        if m.bias is not None:
            nn.init.zeros_(m.bias)


def remap_official(state_dict: dict[str, torch.Tensor], model: nn.Module, resize: bool = True) -> dict:
    """Official FLatten-PVTv2 checkpoint -> our state dict (identical names).

    Unwraps `model` / `model_ema` / `state_dict` and, with `resize`, bicubic-resizes `positional_encoding` tables
    whose grid differs from the model's construction grid (the official fine-tuning loader's rule).

    Args:
        state_dict: official checkpoint (wrapped or flat).
        model: the target FlattenPVTv2.
        resize: resize size-bound tables to the model's construction grids.
    """
    sd = dict(unwrap_state_dict(state_dict))
    return _resize_tables(sd, model) if resize else sd


def _cfg(**kwargs) -> dict:
    return {"url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None, "crop_pct": 0.875,
            "interpolation": "bicubic", "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
            "first_conv": "patch_embed1.proj", "classifier": "head", "license": "mit",
            "origin_url": "https://github.com/LeapLabTHU/FLatten-Transformer", "paper_ids": "arXiv:2308.00442",
            **kwargs}


default_cfgs = generate_default_cfgs({
    "flatten_pvt_v2_micro": _cfg(input_size=(3, 32, 32), crop_pct=1.0,
                                 notes="tiny test/demo variant (first embed 3x3 s2)"),
    "flatten_pvt_v2_b0.in1k": _cfg(notes="official README: FLatten-PVTv2-B0 weights (TsinghuaCloud link, "
                                         "71.098 top-1)"),
    **{f"flatten_pvt_v2_b{b}": _cfg() for b in range(1, 6)},
})


def _create(variant: str, pretrained: bool = False, **kwargs) -> FlattenPVTv2:
    if pretrained and not kwargs.get("pretrained_cfg_overlay"):
        raise UserError(f"{variant}: no weights are bundled; pass checkpoint_path=... or "
                        "pretrained_cfg_overlay=dict(file=...)")
    return build(FlattenPVTv2, variant, pretrained, remap=remap_official, **kwargs)


_B = dict(embed_dims=(64, 128, 320, 512), num_heads=(1, 2, 5, 8), mlp_ratios=(8, 8, 4, 4))


@register_model
def flatten_pvt_v2_micro(pretrained: bool = False, **kwargs) -> FlattenPVTv2:
    args = dict(img_size=32, embed_dims=(32, 64, 96, 128), num_heads=(1, 2, 3, 4), mlp_ratios=(2, 2, 2, 2),
                depths=(1, 1, 1, 1), stem=(3, 2))
    return _create("flatten_pvt_v2_micro", pretrained, **{**args, **kwargs})


@register_model
def flatten_pvt_v2_b0(pretrained: bool = False, **kwargs) -> FlattenPVTv2:
    args = dict(embed_dims=(32, 64, 160, 256), num_heads=(1, 2, 5, 8), mlp_ratios=(8, 8, 4, 4), depths=(2, 2, 2, 2))
    return _create("flatten_pvt_v2_b0", pretrained, **{**args, **kwargs})


@register_model
def flatten_pvt_v2_b1(pretrained: bool = False, **kwargs) -> FlattenPVTv2:
    return _create("flatten_pvt_v2_b1", pretrained, **{**_B, "depths": (2, 2, 2, 2), **kwargs})


@register_model
def flatten_pvt_v2_b2(pretrained: bool = False, **kwargs) -> FlattenPVTv2:
    return _create("flatten_pvt_v2_b2", pretrained, **{**_B, "depths": (3, 4, 6, 3), **kwargs})


@register_model
def flatten_pvt_v2_b3(pretrained: bool = False, **kwargs) -> FlattenPVTv2:
    return _create("flatten_pvt_v2_b3", pretrained, **{**_B, "depths": (3, 4, 18, 3), **kwargs})


@register_model
def flatten_pvt_v2_b4(pretrained: bool = False, **kwargs) -> FlattenPVTv2:
    return _create("flatten_pvt_v2_b4", pretrained, **{**_B, "depths": (3, 8, 27, 3), **kwargs})


@register_model
def flatten_pvt_v2_b5(pretrained: bool = False, **kwargs) -> FlattenPVTv2:
    args = dict(embed_dims=(64, 128, 320, 512), num_heads=(1, 2, 5, 8), mlp_ratios=(4, 4, 4, 4), depths=(3, 6, 40, 3))
    return _create("flatten_pvt_v2_b5", pretrained, **{**args, **kwargs})


_SRC = "FLatten paper main table (arXiv 2308.00442) and official README"
_CODE = "LeapLabTHU/FLatten-Transformer"
_MEAS = "ref_* measured from the official classes at abdb115 (fvcore GMACs)"
register_card(ModelCard("flatten_pvt_v2_micro", "flatten", img_size=32, source="test/demo variant (3x3 s2 stem)",
                        status="official-arch", notes="not a paper model"))
register_card(ModelCard("flatten_pvt_v2_b0", "flatten", 224, None, None, 71.1, "official README (71.098 top-1)",
                        ref_params=3_594_824, ref_gmacs=0.59, code=_CODE, notes=_MEAS))
register_card(ModelCard("flatten_pvt_v2_b1", "flatten", 224, 12.9, 2.2, 79.5, _SRC, ref_params=12_931_240,
                        ref_gmacs=2.23, code=_CODE, notes=_MEAS))
register_card(ModelCard("flatten_pvt_v2_b2", "flatten", 224, 22.6, 4.3, 82.5, _SRC, ref_params=22_548_264,
                        ref_gmacs=4.27, code=_CODE, notes=_MEAS))
register_card(ModelCard("flatten_pvt_v2_b3", "flatten", 224, None, 7.3, 83.7, _SRC + " (read off Fig. 6, approx.)",
                        ref_params=38_273_832, ref_gmacs=7.31, code=_CODE, notes=_MEAS))
register_card(ModelCard("flatten_pvt_v2_b4", "flatten", 224, None, 10.7, 84.0, _SRC + " (read off Fig. 6, approx.)",
                        ref_params=51_836_968, ref_gmacs=10.71, code=_CODE, notes=_MEAS))
register_card(ModelCard("flatten_pvt_v2_b5", "flatten", 224, None, None, None, "no official config; not in the paper",
                        ref_params=67_061_544, ref_gmacs=12.48, code=_CODE, notes=_MEAS))
