"""MLLA: Mamba-like linear attention backbones (conv stem, four stages of MLLA blocks, conv patch merging).

Module names follow the official file (`patch_embed.conv{1,2,3}`, `layers.{s}.blocks.{b}` with `cpe1`, `norm1`,
`in_proj`, `act_proj`, `dwc`, `attn`, `out_proj`, `cpe2`, `norm2`, `mlp`; `layers.{s}.downsample.conv`, `norm`,
`head`), so the official checkpoints load with an identity remap (the recomputed RoPE buffers dropped). Every
block's token mixer comes from `attn` (one name, or one per stage; default `"mlla"`); any registered mechanism that
takes a 2-D grid may be named, built with `input_size` = the stage grid.

Paper: Han et al., "Demystify Mamba in Vision: A Linear Attention Perspective" (NeurIPS 2024, arXiv 2405.16605),
    the MLLA model (renamed MILA in the final version) and its block (the paper's macro-design figure); sizes and
    ImageNet-1K numbers from the official README.
Official: LeapLabTHU/MLLA `models/mlla.py` (`MLLA`, `MLLABlock`, `Stem`, `PatchMerging`, `ConvLayer`); variants in
    `cfgs/mlla_{t,s,b}.yaml`.
    Official code: the grid of every block is fixed at construction (the RoPE table, `input_resolution`) and the
    attention takes it as int(sqrt(N)) (square inputs only) / subquad: every block receives (H, W) and the RoPE is
    built for it, so any input size works, square or not (docs/deviations.md).
Symbols: C embed dim, h heads, r = 4 (patch-merging expansion), phi = elu + 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from timm.layers import DropPath, register_notrace_module
from torch import nn

from .._shapes import as_hw, map_to_tokens, tokens_to_map
from ..attention import build_stage_attention
from ..errors import UserError
from ..layers.mlp import Mlp
from ._base import Backbone, drop_path_rates, stage_mechanisms
from ._builder import Variant, register_family, unwrap_state_dict

__all__ = ["Mlla", "MllaBlock", "MllaStem", "MllaPatchMerging", "ConvNormAct", "remap_official"]

MLLA_CODE = "LeapLabTHU/MLLA"
MLLA_PAPER = "Demystify Mamba in Vision: A Linear Attention Perspective (arXiv 2405.16605)"


class ConvNormAct(nn.Module):
    """Conv2d -> optional BatchNorm2d -> optional ReLU (official `ConvLayer`; keys `conv`, `norm`).

    Shapes: (B, C_in, H, W) -> (B, C_out, H', W')."""

    def __init__(self, cin: int, cout: int, kernel_size: int = 3, stride: int = 1, padding: int = 0,
                 groups: int = 1, bias: bool = True, norm: bool = True, act: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.conv = nn.Conv2d(cin, cout, kernel_size, stride, padding, groups=groups, bias=bias, **dd)
        self.norm = nn.BatchNorm2d(cout, **dd) if norm else None
        self.act = nn.ReLU() if act else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        if self.norm is not None:
            x = self.norm(x)
        return x if self.act is None else self.act(x)


@register_notrace_module
class MllaStem(nn.Module):
    """Official `Stem`: 3x3/2 conv to C/2, a residual pair of 3x3 convs, 3x3/2 conv to 4C, 1x1 conv to C (BN each).

    Shapes: images (B, in_chans, H, W) -> tokens (B, H0 * W0, C) and (H0, W0) = (ceil(H / 4), ceil(W / 4))."""

    def __init__(self, in_chans: int, embed_dim: int, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        c2 = embed_dim // 2
        self.conv1 = ConvNormAct(in_chans, c2, 3, 2, 1, bias=False, **dd)
        self.conv2 = nn.Sequential(ConvNormAct(c2, c2, 3, 1, 1, bias=False, **dd),
                                   ConvNormAct(c2, c2, 3, 1, 1, bias=False, act=False, **dd))
        self.conv3 = nn.Sequential(ConvNormAct(c2, embed_dim * 4, 3, 2, 1, bias=False, **dd),
                                   ConvNormAct(embed_dim * 4, embed_dim, 1, bias=False, act=False, **dd))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x = self.conv1(x)
        x = self.conv3(self.conv2(x) + x)
        return map_to_tokens(x), (x.shape[2], x.shape[3])


@register_notrace_module
class MllaPatchMerging(nn.Module):
    """Official `PatchMerging`: 1x1 conv to 2rC (ReLU), 3x3/2 depthwise conv (ReLU), 1x1 conv to 2C (BN).

    Shapes: x (B, H * W, C) with hw -> (B, ceil(H / 2) * ceil(W / 2), 2C) and the new grid."""

    def __init__(self, dim: int, ratio: float = 4.0, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        hidden = int(2 * dim * ratio)
        self.conv = nn.Sequential(ConvNormAct(dim, hidden, 1, norm=False, **dd),
                                  ConvNormAct(hidden, hidden, 3, 2, 1, groups=hidden, norm=False, **dd),
                                  ConvNormAct(hidden, 2 * dim, 1, act=False, **dd))

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> tuple[torch.Tensor, tuple[int, int]]:
        y = self.conv(tokens_to_map(x, hw))
        return map_to_tokens(y), (y.shape[2], y.shape[3])


@register_notrace_module
class MllaBlock(nn.Module):
    """The MLLA block (the paper's macro-design figure; official `MLLABlock`), any token mixer as its attention.

    x = x + CPE1(x); y = LN1(x); g = SiLU(act_proj(y)); y = SiLU(DWC3x3(in_proj(y))); y = attn(y, hw);
    x = x + DropPath(out_proj(y * g)); x = x + CPE2(x); x = x + DropPath(MLP(LN2(x))).

    Shapes: x (B, N, C) with hw=(H, W), N = H * W -> (B, N, C).

    Args:
        dim: channels C.
        num_heads: heads h.
        input_size: stage grid at construction (passed to the mechanism as `input_size`).
        attn: mechanism name ("mlla": the paper's linear attention with RoPE and LePE).
        mlp_ratio, qkv_bias, drop, drop_path: the usual block options.
        attn_kwargs: the user's mechanism options.
    """

    def __init__(self, dim: int, num_heads: int, input_size: tuple[int, int], attn: str = "mlla",
                 mlp_ratio: float = 4.0, qkv_bias: bool = True, drop: float = 0.0, drop_path: float = 0.0,
                 attn_kwargs: dict | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.cpe1 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, **dd)
        self.norm1 = nn.LayerNorm(dim, **dd)
        self.in_proj = nn.Linear(dim, dim, **dd)
        self.act_proj = nn.Linear(dim, dim, **dd)
        self.dwc = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, **dd)
        self.act = nn.SiLU()
        stage = dict(grid=input_size, qkv_bias=qkv_bias, hints={}, host="MLLA stages")
        self.attn = build_stage_attention(attn, dim, num_heads, stage, attn_kwargs, **dd)
        self.out_proj = nn.Linear(dim, dim, **dd)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.cpe2 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, **dd)
        self.norm2 = nn.LayerNorm(dim, **dd)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop, **dd)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        x = x + map_to_tokens(self.cpe1(tokens_to_map(x, hw)))
        shortcut = x
        y = self.norm1(x)
        gate = self.act(self.act_proj(y))
        y = map_to_tokens(self.act(self.dwc(tokens_to_map(self.in_proj(y), hw))))
        y = self.attn(y, hw)
        x = shortcut + self.drop_path(self.out_proj(y * gate))
        x = x + map_to_tokens(self.cpe2(tokens_to_map(x, hw)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class MllaStage(nn.Module):
    """`layers.{s}`: `blocks` and the `downsample` that follows them (None in the last stage)."""

    def __init__(self, blocks: list[nn.Module], downsample: nn.Module | None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.downsample = downsample


class Mlla(Backbone):
    """MLLA backbone: conv stem (stride 4), four stages of MLLA blocks with conv patch merging, LN, average pool.

    Shapes: images (B, in_chans, H, W), any H, W >= 32; stage i tokens (B, H_i * W_i, C * 2^i) with
    H_0 = ceil(H / 4) and H_{i+1} = ceil(H_i / 2) (stride-2 convolutions with padding 1). No position embedding.

    Paper: arXiv 2405.16605 (MLLA / MILA). Official: LeapLabTHU/MLLA `models/mlla.py` `MLLA`.

    Args:
        img_size: construction resolution (passed on as each stage's grid; the model runs at any size).
        in_chans, num_classes: input channels, classifier outputs (0: no head).
        embed_dim, depths, num_heads, mlp_ratio: MLLA sizes (official T: 64, (2, 4, 8, 4), (2, 4, 8, 16), 4).
        attn: the token mixer: a name for every stage, or one name per stage (default "mlla").
        qkv_bias: bias of the attention's q/k projection.
        attn_kwargs: extra options for every stage's mechanism.
        drop_rate: dropout after the stem and in the MLPs (official; the head has none).
        drop_path_rate: stochastic depth, linear over all blocks (official recipes 0.2 / 0.3 / 0.5 for T / S / B).
        global_pool: 'avg' or '' (unpooled (B, H, W, C) features).
    """

    init_norms = True
    group_patterns = dict(stem=r"^patch_embed", blocks=[(r"^layers\.(\d+)\.downsample", (0,)),
                                                        (r"^layers\.(\d+)\.blocks\.(\d+)", None), (r"^norm", (99999,))])
    group_patterns_coarse = dict(stem=r"^patch_embed", blocks=r"^layers\.(\d+)")

    def __init__(self, img_size: int | tuple[int, int] = 224, in_chans: int = 3, num_classes: int = 1000,
                 embed_dim: int = 64, depths: Sequence[int] = (2, 4, 8, 4), num_heads: Sequence[int] = (2, 4, 8, 16),
                 mlp_ratio: float = 4.0, attn: str | Sequence[str] = "mlla", qkv_bias: bool = True,
                 attn_kwargs: dict | None = None, drop_rate: float = 0.0, drop_path_rate: float = 0.0,
                 global_pool: str = "avg", device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        depths, num_heads = tuple(depths), tuple(num_heads)
        if len(depths) != len(num_heads):
            raise UserError(f"mlla: depths {depths} and num_heads {num_heads} must have one entry per stage")
        if embed_dim % 2:
            raise UserError(f"mlla: embed_dim={embed_dim} must be even (the stem's first conv has embed_dim / 2)")
        names = stage_mechanisms("mlla", attn, len(depths))
        self.img_size = as_hw(img_size, "img_size")
        self.in_chans = in_chans
        self.num_stages = len(depths)
        self.attn_names = names
        self.embed_dim = embed_dim
        self.num_features = self.head_hidden_size = embed_dim * 2 ** (self.num_stages - 1)
        self.total_stride = 4 * 2 ** (self.num_stages - 1)
        self.grad_checkpointing = False
        self.patch_embed = MllaStem(in_chans, embed_dim, **dd)
        self.pos_drop = nn.Dropout(drop_rate)
        grid = tuple(-(-s // 4) for s in self.img_size)
        dpr = drop_path_rates(drop_path_rate, depths)
        stages, self.feature_info = [], []
        for i, (depth, heads, name) in enumerate(zip(depths, num_heads, names)):
            dim = embed_dim * 2 ** i
            blocks = [MllaBlock(dim, heads, grid, name, mlp_ratio, qkv_bias, drop_rate, dpr[i][j], attn_kwargs, **dd)
                      for j in range(depth)]
            last = i == self.num_stages - 1
            stages.append(MllaStage(blocks, None if last else MllaPatchMerging(dim, **dd)))
            self.feature_info.append(dict(num_chs=dim, reduction=4 * 2 ** i, module=f"layers.{i}"))
            grid = tuple(-(-s // 2) for s in grid)
        self.layers = nn.ModuleList(stages)
        self.norm = nn.LayerNorm(self.num_features, **dd)
        self._init_head(num_classes, global_pool, 0.0, **dd)
        self._finish_init()

    def _forward_level(self, i: int, x: torch.Tensor, hw: tuple[int, int] | None):
        if i == 0:
            x, hw = self.patch_embed(x)
            x = self.pos_drop(x)
        else:
            x, hw = self.layers[i - 1].downsample(x, hw)
        return self._run_blocks(self.layers[i].blocks, x, hw), hw

    def _truncate(self, num_stages: int) -> None:
        self.layers = self.layers[:num_stages]
        self.layers[-1].downsample = None
        self.num_stages = num_stages


_DROPPED_SUFFIXES = (".rope.rotations",)


def remap_official(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Official MLLA checkpoint -> our state dict (identical names).

    Unwraps `model` / `model_ema` / `state_dict` and drops the RoPE tables `layers.{s}.blocks.{b}.attn.rope.rotations`
    (recomputed for every input grid; also `rope.rotations` of a bare official `LinearAttention`). No parameter is
    sized by the resolution, so nothing is resized.

    Args:
        state_dict: official checkpoint (wrapped or flat).
        model: the target Mlla.
    """
    return {k: v for k, v in unwrap_state_dict(state_dict).items()
            if not ("." + k).endswith(_DROPPED_SUFFIXES)}


def mlla_release(key: str, top1: float) -> dict:
    """The cfg of a checkpoint linked from the official README (TsinghuaCloud, `?dl=1`)."""
    return dict(url=f"https://cloud.tsinghua.edu.cn/f/{key}/?dl=1",
                notes=f"official release ({MLLA_CODE} README, TsinghuaCloud): {top1} top-1")


MLLA_CFG = dict(first_conv="patch_embed.conv1.conv", license="mit", paper_ids="arXiv:2405.16605",
                origin_url="https://github.com/" + MLLA_CODE)
MLLA_CARD = dict(family="mlla", source=MLLA_PAPER + " and the official README (Pretrained Models)", code=MLLA_CODE,
                 notes="ref_params measured from the official class at 66b6d29; ref_gmacs from subquad's counter")

_T = dict(embed_dim=64, depths=(2, 4, 8, 4), num_heads=(2, 4, 8, 16))
_S = dict(embed_dim=64, depths=(3, 6, 21, 6), num_heads=(2, 4, 8, 16))
_B = dict(embed_dim=96, depths=(3, 6, 21, 6), num_heads=(3, 6, 12, 24))
register_family(__name__, Mlla, [
    Variant("mlla_micro", dict(img_size=64, embed_dim=32, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8),
                               mlp_ratio=2.0),
            dict(img_size=64, source="test/demo variant (stage grids 16/8/4/2)", notes="not a paper model"),
            cfg=dict(input_size=(3, 64, 64), crop_pct=1.0)),
    Variant("mlla_tiny", _T, dict(params_m=25.0, gmacs=4.2, top1=83.5, ref_params=24_392_200, ref_gmacs=4.13),
            weights={"in1k": mlla_release("7a19712877cb4242889c", 83.5)}),
    Variant("mlla_small", _S, dict(params_m=43.0, gmacs=7.3, top1=84.4, ref_params=43_015_048, ref_gmacs=7.25),
            weights={"in1k": mlla_release("0e5d0b1409d540aaa80c", 84.4)}),
    Variant("mlla_base", _B, dict(params_m=96.0, gmacs=16.2, top1=85.3, ref_params=95_983_960, ref_gmacs=16.11),
            weights={"in1k": mlla_release("91c85c5a1061496d8796", 85.3)}),
], cfg=MLLA_CFG, stride=lambda a: 32, remap=remap_official, card=MLLA_CARD)
