"""FLatten-PVT (PVT v1 host with focused linear attention in every stage).

PVT v1 is not in timm, so the host is written here with the official module names (`patch_embed{i}`,
`pos_embed{i}`, `block{i}.{j}`, `head`). Each stage takes its mechanism from `attn` (one name for every stage, or
one per stage): `"focused_linear"` is FLatten-PVT (as released: sr 1 everywhere); `"softmax"` with the default
`sr_ratios=(8, 4, 2, 1)` is the PVT v1 spatial-reduction baseline. `flatten_pvt_micro` is a tiny variant for tests
and the demo on 32 x 32 images (patch 2, so the stage strides are 2/4/8/16).

Paper: FLatten Transformer (arXiv 2308.00442), Tab. 2 (PVT rows); PVT v1 (Wang et al.
2021) for the host.
Official: LeapLabTHU/FLatten-Transformer@abdb115 `models/flatten_pvt.py` (`PyramidVisionTransformer`, `Block`).
Symbols: C_i stage width, h heads (d = C_i / h = 64), p focusing factor (3), k DWC kernel (5), sr spatial reduction.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx
from timm.layers import DropPath, register_notrace_module, trunc_normal_
from torch import nn

from ..attention import build_stage_attention
from ..attention.focused_linear import remap_legacy as remap_focused_q_kv
from ..errors import UserError
from ..layers.mlp import ConvMlp, Mlp
from ..layers.patch_embed import PatchEmbedLN, resize_pos_embed_2d
from ._base import Backbone, deprecated_attn_keywords, drop_path_rates, stage_mechanisms, tokens_to_nchw
from ._builder import Variant, register_family, unwrap_state_dict
from ._flatten_common import FLATTEN_CARD, FLATTEN_CFG, flatten_release, resize_token_grid
from ._flatten_common import resize_token_tables as _resize_tables

__all__ = ["FlattenPVT", "PVTBlock", "PVTHost", "remap_official", "resize_token_grid"]

torch.fx.wrap("resize_pos_embed_2d")


@register_notrace_module
class PVTBlock(nn.Module):
    """Pre-norm PVT block: x + attn(LN1(x), hw), then x + MLP(LN2(x)). x: (B, H*W, C) -> (B, H*W, C).

    Paper: PVT v1/v2 block, FLatten (arXiv 2308.00442) Sec. 4. Official: FLatten `flatten_pvt.Block` /
    `flatten_pvt_v2.Block`
    (keys `norm1`, `attn`, `norm2`, `mlp.{fc1,fc2}` (+ `mlp.dwconv.dwconv` with conv_mlp)).

    Args:
        dim, num_heads, mlp_ratio: sizes.
        attn: mechanism name; stage: the stage facts its adapter reads (`build_stage_attention`);
            attn_kwargs: the user's options for it.
        conv_mlp: PVTv2 MLP with a depthwise 3x3 conv after fc1.
        drop: MLP dropout; drop_path: stochastic depth.
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, attn: str, stage: dict,
                 attn_kwargs: dict | None = None, conv_mlp: bool = False, drop: float = 0.0, drop_path: float = 0.0,
                 device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.norm1 = nn.LayerNorm(dim, eps=1e-6, **dd)
        self.attn = build_stage_attention(attn, dim, num_heads, stage, attn_kwargs, **dd)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6, **dd)
        hidden = int(dim * mlp_ratio)
        self.conv_mlp = conv_mlp
        self.mlp = ConvMlp(dim, hidden, drop=drop, **dd) if conv_mlp else Mlp(dim, hidden, drop=drop, **dd)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), hw))
        y = self.norm2(x)
        return x + self.drop_path(self.mlp(y, hw) if self.conv_mlp else self.mlp(y))


class PVTHost(Backbone):
    """Shared body of the PVT v1 / v2 hosts: stage i owns `patch_embed{i+1}` and `block{i+1}` plus the host's extras
    (`pos_embed{i+1}` / `pos_drop{i+1}` in v1, `norm{i+1}` in v2).

    The official checkpoints name every stage's modules with the stage number (`patch_embed1`, `block1.0...`), so the
    hosts keep those attributes, assigned and read by name (a ModuleList cannot spell these keys); a pruned stage's
    attributes are deleted."""
    group_patterns = dict(stem=r"^patch_embed1|^pos_embed1",
                          blocks=[(r"^block(\d+)\.(\d+)", None), (r"^(?:patch_embed|pos_embed|norm)(\d+)", (0,))])

    deprecated_attn = ("stage_attn",)

    def _setup(self, img_size, in_chans: int, total_stride: int, attn, stage_attn, drop_path_rate: float,
               **lists: Sequence) -> tuple[tuple[int, int], tuple[str, ...], list[list[float]]]:
        """Validate the four-stage lists and `attn=` (or its deprecated spelling `stage_attn=`); set the common
        attributes; return (img_hw, the mechanism of each stage, drop-path rates)."""
        host = type(self).__module__.rsplit(".", 1)[-1]
        attn = deprecated_attn_keywords(host, attn, stage_attn=stage_attn).get("stage_attn", attn)
        bad = {k: tuple(v) for k, v in lists.items() if len(v) != 4}
        if bad:
            raise UserError(f"PVT hosts need 4 stages; got {bad}")
        names = stage_mechanisms(host, "focused_linear" if attn is None else attn, 4)
        self.in_chans = in_chans
        self.num_stages = 4
        self.total_stride = total_stride
        self.num_features = self.head_hidden_size = lists["embed_dims"][-1]
        self.attn_names = names
        self.grad_checkpointing = False
        self.feature_info = []
        self.grids: list[tuple[int, int]] = []
        return (img_size, img_size) if isinstance(img_size, int) else tuple(img_size), names, \
            drop_path_rates(drop_path_rate, lists["depths"])

    # The official per-stage module names, `<name>{i+1}` for stage i (PVT v1 and v2 register them stage by stage).
    stage_modules: tuple[str, ...] = ("patch_embed", "block")

    def _make_blocks(self, i: int, *, depth: int, dim: int, num_heads: int, mlp_ratio: float, attn: str,
                     stage: dict, attn_kwargs: dict | None, conv_mlp: bool, drop: float, dpr: list[float],
                     stride: int, feature_module: str, dd: dict) -> nn.ModuleList:
        """Stage i's blocks (`block{i+1}`); records its feature info (`feature_module`: the module it names)."""
        self.feature_info.append(dict(num_chs=dim, reduction=stride, module=f"{feature_module}{i + 1}"))
        return nn.ModuleList([PVTBlock(dim=dim, num_heads=num_heads, mlp_ratio=mlp_ratio, attn=attn, stage=stage,
                                       attn_kwargs=attn_kwargs, conv_mlp=conv_mlp, drop=drop, drop_path=dpr[j], **dd)
                              for j in range(depth)])

    def _register_stage(self, i: int, **modules: nn.Module) -> None:
        """Registers stage i's modules under their official names (`patch_embed=m` -> `patch_embed{i+1}`)."""
        for name, module in modules.items():
            setattr(self, f"{name}{i + 1}", module)

    def _stage(self, i: int) -> tuple[nn.Module, nn.ModuleList]:
        """(`patch_embed{i+1}`, `block{i+1}`) of a kept stage."""
        return getattr(self, f"patch_embed{i + 1}"), getattr(self, f"block{i + 1}")

    def _embed(self, i: int, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        return x

    def _stage_norm(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return x

    def _forward_level(self, i: int, x: torch.Tensor, hw: tuple[int, int] | None):
        if i > 0:
            x = tokens_to_nchw(x, hw)
        patch_embed, blocks = self._stage(i)
        x, hw = patch_embed(x)
        x = self._run_blocks(blocks, self._embed(i, x, hw), hw)
        return self._stage_norm(i, x), hw

    def _truncate(self, num_stages: int) -> None:
        for i in range(num_stages, self.num_stages):
            for name in self.stage_modules:
                delattr(self, f"{name}{i + 1}")
        self.num_stages = num_stages


class FlattenPVT(PVTHost):
    """PVT v1 host (FLatten layout: no cls token, no final norm), any mechanism per stage.

    Shapes: images (B, in_chans, H, W) with H, W >= 8 * patch_size; stage i tokens (B, H_i * W_i, C_i) with
    H_0 = floor(H / patch_size), H_{i+1} = floor(H_i / 2) (the official convs floor; nothing is padded).
    The learned `pos_embed{i}` (1, h_i * w_i, C_i) is bilinearly resized (align_corners False) to the runtime grid
    when it differs, as PVT's `_get_pos_embed` does.

    Paper: FLatten Transformer (arXiv 2308.00442) Tab. 2; PVT v1 (arXiv 2102.12122). Official:
    LeapLabTHU/FLatten-Transformer `models/flatten_pvt.py` `PyramidVisionTransformer`.

    Args:
        img_size: construction resolution (sets the pos-embed and focused-attention PE grids).
        patch_size: stem patch (4; 2 in the tiny layout).
        in_chans, num_classes: input channels, classifier outputs (0: no head).
        embed_dims, num_heads, mlp_ratios, depths: per-stage sizes.
        attn: the mechanism: a name for every stage or 4 names, one per stage (e.g. "softmax"); None:
            "focused_linear" in every stage (FLatten-PVT).
        sr_ratios: spatial reduction of 'softmax' stages (the PVT baseline).
        la_sr_ratios: spatial reduction of 'focused_linear' stages (1 in every released model).
        focusing_factor, kernel_size: FLatten p and DWC k.
        qkv_bias: bias of the q/kv projections.
        attn_kwargs: extra options passed to every stage's mechanism.
        drop_rate, drop_path_rate: dropout (pos embed, MLP, head) and stochastic depth (linear rule).
        global_pool: 'avg' or '' (unpooled (B, H, W, C) features).
        stage_attn: deprecated spelling of `attn` (DeprecationWarning).
        stage_hints: 4 dicts of host options for whichever stage mechanism takes them (e.g. Agent-PVT's per-stage
            `agent_num`); None: none.
    """

    init_norms = True

    def __init__(self, img_size: int | tuple[int, int] = 224, patch_size: int = 4, in_chans: int = 3,
                 num_classes: int = 1000, embed_dims: Sequence[int] = (64, 128, 320, 512),
                 num_heads: Sequence[int] = (1, 2, 5, 8), mlp_ratios: Sequence[float] = (8, 8, 4, 4),
                 depths: Sequence[int] = (2, 2, 2, 2), attn: str | Sequence[str] | None = None,
                 sr_ratios: Sequence[int] = (8, 4, 2, 1), la_sr_ratios: Sequence[int] = (1, 1, 1, 1),
                 focusing_factor: int = 3, kernel_size: int = 5, qkv_bias: bool = True,
                 attn_kwargs: dict | None = None, drop_rate: float = 0.0, drop_path_rate: float = 0.0,
                 global_pool: str = "avg", stage_attn: Sequence[str] | None = None,
                 stage_hints: Sequence[dict] | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        stage_hints = stage_hints or ({},) * 4
        img_hw, names, dpr = self._setup(
            img_size, in_chans, patch_size * 8, attn, stage_attn, drop_path_rate, embed_dims=embed_dims,
            num_heads=num_heads, mlp_ratios=mlp_ratios, depths=depths, sr_ratios=sr_ratios, la_sr_ratios=la_sr_ratios,
            stage_hints=stage_hints)
        # Each stage's patch embedding: (input channels, patch): the stem, then 2x2 merges.
        embeds = [(in_chans, patch_size)] + [(embed_dims[i - 1], 2) for i in range(1, 4)]
        grid, stride = (img_hw[0] // patch_size, img_hw[1] // patch_size), patch_size
        for i, (embed_in, patch) in enumerate(embeds):
            if i > 0:
                grid, stride = (grid[0] // 2, grid[1] // 2), stride * 2
            self.grids.append(grid)
            stage = dict(grid=grid, qkv_bias=qkv_bias, sr_ratio=sr_ratios[i],
                         la_sr_ratio=la_sr_ratios[i], hints=dict(focusing_factor=focusing_factor,
                                                                 kernel_size=kernel_size, **stage_hints[i]),
                         host="PVT stages")
            self._register_stage(
                i, patch_embed=PatchEmbedLN(embed_in, embed_dims[i], patch_size=patch, **dd),
                pos_embed=nn.Parameter(torch.zeros(1, grid[0] * grid[1], embed_dims[i], **dd)),
                pos_drop=nn.Dropout(drop_rate),
                block=self._make_blocks(i, depth=depths[i], dim=embed_dims[i], num_heads=num_heads[i],
                                        mlp_ratio=mlp_ratios[i], attn=names[i], stage=stage, attn_kwargs=attn_kwargs,
                                        conv_mlp=False, drop=drop_rate, dpr=dpr[i], stride=stride,
                                        feature_module="block", dd=dd))
        self._init_head(num_classes, global_pool, drop_rate, **dd)
        self._finish_init()

    stage_modules = ("patch_embed", "pos_embed", "pos_drop", "block")

    def _pos(self, i: int) -> tuple[nn.Parameter, nn.Dropout]:
        """(`pos_embed{i+1}`, `pos_drop{i+1}`) of a kept stage."""
        return getattr(self, f"pos_embed{i + 1}"), getattr(self, f"pos_drop{i + 1}")

    def _embed(self, i: int, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        pos, drop = self._pos(i)
        return drop(x + resize_pos_embed_2d(pos, self.grids[i], hw))

    def _init_extra(self) -> None:
        for i in range(self.num_stages):
            trunc_normal_(self._pos(i)[0], std=0.02)


def remap_official(state_dict: dict[str, torch.Tensor], model: nn.Module, resize: bool = True) -> dict:
    """Official FLatten-PVT checkpoint -> our state dict.

    Unwraps `model` / `model_ema` / `state_dict`, drops the unused final `norm.*` (not built here), and, with
    `resize`, resizes `pos_embed{i}` (bilinear) and `positional_encoding` (bicubic) tables whose grid differs from
    the model's construction grid (the run-time rules, so a resized load equals running the source model there).

    Args:
        state_dict: official checkpoint (wrapped or flat).
        model: the target FlattenPVT.
        resize: resize size-bound tables to the model's construction grids.
    """
    sd = {k: v for k, v in unwrap_state_dict(state_dict).items() if k not in ("norm.weight", "norm.bias")}
    sd = remap_focused_q_kv(sd, model)  # focused stages: official `q` + `kv` -> our fused `qkv`
    return _resize_tables(sd, model) if resize else sd


_PVT = dict(embed_dims=(64, 128, 320, 512), num_heads=(1, 2, 5, 8), mlp_ratios=(8, 8, 4, 4))
_MEAS = ("ref_* measured from the official classes at abdb115 minus the unused final norm (2 x 512 = 1024 params, "
         "dropped here; see docs/deviations.md)")
register_family(__name__, FlattenPVT, [
    Variant("flatten_pvt_micro", dict(img_size=32, patch_size=2, embed_dims=(32, 64, 96, 128), num_heads=(1, 2, 3, 4),
                                      mlp_ratios=(2, 2, 2, 2), depths=(1, 1, 1, 1)),
            dict(img_size=32, source="test/demo variant (patch 2)", notes="not a paper model"),
            cfg=dict(input_size=(3, 32, 32), crop_pct=1.0)),
    Variant("flatten_pvt_tiny", dict(**_PVT, depths=(2, 2, 2, 2)),
            dict(params_m=12.2, gmacs=2.0, top1=77.8, ref_params=12_150_504 - 1024, ref_gmacs=2.05),
            weights={"in1k": flatten_release("3ab1d773f19d45648690", 77.8)}),
    Variant("flatten_pvt_small", dict(**_PVT, depths=(3, 4, 6, 3)),
            dict(params_m=21.7, gmacs=4.0, top1=81.7, ref_params=21_670_248 - 1024, ref_gmacs=4.05)),
    Variant("flatten_pvt_medium", dict(**_PVT, depths=(3, 4, 18, 3)),
            dict(gmacs=7.0, top1=83.0, ref_params=37_242_216 - 1024, ref_gmacs=7.06,
                 source=FLATTEN_CARD["source"] + " (read off Fig. 6, approx.)")),
    Variant("flatten_pvt_large", dict(**_PVT, depths=(3, 8, 27, 3)),
            dict(ref_params=50_649_192 - 1024, ref_gmacs=10.41, source="paper appendix only (not available)")),
], cfg=dict(first_conv="patch_embed1.proj", **FLATTEN_CFG), stride=lambda a: a.get("patch_size", 4) * 8,
    remap=remap_official, card={**FLATTEN_CARD, "notes": _MEAS})
