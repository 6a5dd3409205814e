"""FLatten-PVT (PVT v1 host with focused linear attention in every stage).

PVT v1 is not in timm, so the host is written here with the official module names (`patch_embed{i}`,
`pos_embed{i}`, `block{i}.{j}`, `head`). Each stage takes its mechanism from the tuple `stage_attn`:
`("focused_linear",) * 4` is FLatten-PVT (as released: sr 1 everywhere); `("softmax",) * 4` with the default
`sr_ratios=(8, 4, 2, 1)` is the PVT v1 spatial-reduction baseline. `flatten_pvt_micro` is a tiny variant for tests
and the demo on 32 x 32 images (patch 2, so the stage strides are 2/4/8/16).

Paper: FLatten Transformer (arXiv 2308.00442), Tab. 2 (PVT rows); PVT v1 (Wang et al.
2021) for the host.
Official: LeapLabTHU/FLatten-Transformer@abdb115 `models/flatten_pvt.py` (`PyramidVisionTransformer`, `Block`).
Symbols: C_i stage width, h heads (d = C_i / h = 64), p focusing factor (3), k DWC kernel (5), sr spatial reduction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.fx
from timm.layers import DropPath, register_notrace_module, trunc_normal_
from torch import nn

from ..attention import build_stage_attention
from ..attention.focused_linear import remap_legacy as remap_focused_q_kv
from ..attention.functional.focused import resize_pe
from ..errors import UserError
from ..layers.mlp import ConvMlp, Mlp
from ..layers.patch_embed import PatchEmbedLN, resize_pos_embed_2d
from ._base import Backbone, drop_path_rates, tokens_to_nchw
from ._builder import Variant, register_family, unwrap_state_dict

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
    (`pos_embed{i+1}` / `pos_drop{i+1}` in v1, `norm{i+1}` in v2), listed in `stage_attrs`."""

    stage_attrs: tuple[str, ...] = ("patch_embed", "block")
    group_patterns = dict(stem=r"^patch_embed1|^pos_embed1",
                          blocks=[(r"^block(\d+)\.(\d+)", None), (r"^(?:patch_embed|pos_embed|norm)(\d+)", (0,))])

    def _setup(self, img_size, in_chans: int, total_stride: int, stage_attn, drop_path_rate: float,
               **lists: Sequence) -> tuple[tuple[int, int], tuple[str, ...], list[list[float]]]:
        """Validate the four-stage lists; set the common attributes; return (img_hw, stage_attn, drop-path rates)."""
        stage_attn = (stage_attn,) * 4 if isinstance(stage_attn, str) else tuple(stage_attn)
        bad = {k: tuple(v) for k, v in {**lists, "stage_attn": stage_attn}.items() if len(v) != 4}
        if bad:
            raise UserError(f"PVT hosts need 4 stages; got {bad}")
        if not all(isinstance(a, str) for a in stage_attn):
            raise UserError(f"stage_attn must hold 4 mechanism names, got {stage_attn!r}")
        self.in_chans = in_chans
        self.num_stages = 4
        self.total_stride = total_stride
        self.num_features = self.head_hidden_size = lists["embed_dims"][-1]
        self.stage_attn = stage_attn
        self.grad_checkpointing = False
        self.feature_info = []
        self.grids: list[tuple[int, int]] = []
        return (img_size, img_size) if isinstance(img_size, int) else tuple(img_size), stage_attn, \
            drop_path_rates(drop_path_rate, lists["depths"])

    def _add_blocks(self, i: int, depth: int, dim: int, heads: int, mlp_ratio: float, attn: str, stage: dict,
                    attn_kwargs: dict | None, conv_mlp: bool, drop: float, dpr: list[float], stride: int,
                    feature_module: str, dd: dict) -> None:
        setattr(self, f"block{i + 1}", nn.ModuleList([
            PVTBlock(dim, heads, mlp_ratio, attn, stage, attn_kwargs, conv_mlp, drop, dpr[j], **dd)
            for j in range(depth)]))
        self.feature_info.append(dict(num_chs=dim, reduction=stride, module=f"{feature_module}{i + 1}"))

    def _embed(self, i: int, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        return x

    def _stage_norm(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return x

    def _forward_level(self, i: int, x: torch.Tensor, hw: tuple[int, int] | None):
        if i > 0:
            x = tokens_to_nchw(x, hw)
        x, hw = getattr(self, f"patch_embed{i + 1}")(x)
        x = self._run_blocks(getattr(self, f"block{i + 1}"), self._embed(i, x, hw), hw)
        return self._stage_norm(i, x), hw

    def _truncate(self, num_stages: int) -> None:
        for i in range(num_stages, self.num_stages):
            for name in self.stage_attrs:
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
        stage_attn: mechanism per stage (e.g. ("focused_linear",) * 4 or ("softmax",) * 4).
        sr_ratios: spatial reduction of 'softmax' stages (the PVT baseline).
        la_sr_ratios: spatial reduction of 'focused_linear' stages (1 in every released model).
        focusing_factor, kernel_size: FLatten p and DWC k.
        qkv_bias: bias of the q/kv projections.
        attn_kwargs: extra options passed to every stage's mechanism.
        drop_rate, drop_path_rate: dropout (pos embed, MLP, head) and stochastic depth (linear rule).
        global_pool: 'avg' or '' (unpooled (B, H, W, C) features).
    """

    init_norms = True

    stage_attrs = ("patch_embed", "pos_embed", "pos_drop", "block")

    def __init__(self, img_size: int | tuple[int, int] = 224, patch_size: int = 4, in_chans: int = 3,
                 num_classes: int = 1000, embed_dims: Sequence[int] = (64, 128, 320, 512),
                 num_heads: Sequence[int] = (1, 2, 5, 8), mlp_ratios: Sequence[float] = (8, 8, 4, 4),
                 depths: Sequence[int] = (2, 2, 2, 2),
                 stage_attn: Sequence[str] = ("focused_linear",) * 4, sr_ratios: Sequence[int] = (8, 4, 2, 1),
                 la_sr_ratios: Sequence[int] = (1, 1, 1, 1), focusing_factor: int = 3, kernel_size: int = 5,
                 qkv_bias: bool = True, attn_kwargs: dict | None = None, drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, global_pool: str = "avg", device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        img_hw, stage_attn, dpr = self._setup(
            img_size, in_chans, patch_size * 8, stage_attn, drop_path_rate, embed_dims=embed_dims,
            num_heads=num_heads, mlp_ratios=mlp_ratios, depths=depths, sr_ratios=sr_ratios, la_sr_ratios=la_sr_ratios)
        grid, stride = (img_hw[0] // patch_size, img_hw[1] // patch_size), patch_size
        for i in range(4):
            if i > 0:
                grid, stride = (grid[0] // 2, grid[1] // 2), stride * 2
            self.grids.append(grid)
            p = patch_size if i == 0 else 2
            setattr(self, f"patch_embed{i + 1}",
                    PatchEmbedLN(in_chans if i == 0 else embed_dims[i - 1], embed_dims[i], p, **dd))
            setattr(self, f"pos_embed{i + 1}", nn.Parameter(torch.zeros(1, grid[0] * grid[1], embed_dims[i], **dd)))
            setattr(self, f"pos_drop{i + 1}", nn.Dropout(drop_rate))
            stage = dict(grid=grid, qkv_bias=qkv_bias, sr_ratio=sr_ratios[i],
                         la_sr_ratio=la_sr_ratios[i], hints=dict(focusing_factor=focusing_factor,
                                                                 kernel_size=kernel_size))
            self._add_blocks(i, depths[i], embed_dims[i], num_heads[i], mlp_ratios[i], stage_attn[i], stage,
                             attn_kwargs, False, drop_rate, dpr[i], stride, "block", dd)
        self._init_head(num_classes, global_pool, drop_rate, **dd)
        self._finish_init()

    def _embed(self, i: int, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        pos = resize_pos_embed_2d(getattr(self, f"pos_embed{i + 1}"), self.grids[i], hw)
        return getattr(self, f"pos_drop{i + 1}")(x + pos)


    def _init_extra(self) -> None:
        for i in range(self.num_stages):
            trunc_normal_(getattr(self, f"pos_embed{i + 1}"), std=0.02)


def resize_token_grid(t: torch.Tensor, dst_hw: tuple[int, int], prefix: int = 0, what: str = "tensor",
                      mode: str = "bicubic") -> torch.Tensor:
    """Resize a (1, prefix + n, C) token table from its square official grid to `dst_hw` (prefix slots kept).

    Official checkpoints are trained at square sizes, so the source side is sqrt(n) (checked exactly).
    """
    n = t.shape[1] - prefix
    side = math.isqrt(n)
    if side * side != n:
        raise UserError(f"cannot resize {what} of shape {tuple(t.shape)}: {n} grid tokens are not a square grid")
    grid = resize_pos_embed_2d(t[:, prefix:], (side, side), dst_hw, mode=mode)
    return torch.cat([t[:, :prefix], grid.to(t.dtype)], dim=1) if prefix else grid.to(t.dtype)


def _resize_tables(sd: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Resize `pos_embed{i}` / `*.attn.positional_encoding` whose token count differs from the model's.

    Targets are the model's construction grids: `model.grids[i]` for `pos_embed{i+1}` (bilinear, PVT's run-time rule)
    and the owning attention's `pe_hw` for its PE (bicubic through `resize_pe`, the FLatten loader's and the
    mechanism's run-time rule). Loading at another size therefore equals running the source model at that size.
    """
    own = model.state_dict()
    grids = getattr(model, "grids", None)
    out = {}
    for k, v in sd.items():
        if k in own and own[k].shape != v.shape and v.dim() == 3 and own[k].shape[-1] == v.shape[-1]:
            if k.startswith("pos_embed") and grids:
                v = resize_token_grid(v, grids[int(k[len("pos_embed"):]) - 1], what=k, mode="bilinear")
            elif k.endswith(".positional_encoding"):
                attn = model.get_submodule(k[: -len(".positional_encoding")])
                prefix = getattr(attn, "num_prefix_tokens", 0)
                n = v.shape[1] - prefix
                side = math.isqrt(n)
                if side * side != n:
                    raise UserError(f"cannot resize {k} of shape {tuple(v.shape)}: {n} tokens are not a square grid")
                v = resize_pe(v, (side, side), tuple(attn.pe_hw), prefix)
        out[k] = v
    return out


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


FLATTEN_CODE = "LeapLabTHU/FLatten-Transformer"
FLATTEN_PAPER = "FLatten Transformer: Vision Transformer using Focused Linear Attention (arXiv 2308.00442)"
#: The pretrained-cfg fields of every FLatten family (no LICENSE file is published in the official repository).
FLATTEN_CFG = dict(license="unknown (the official repository publishes no license)", paper_ids="arXiv:2308.00442",
                   origin_url="https://github.com/" + FLATTEN_CODE)
FLATTEN_CARD = dict(family="flatten", source=FLATTEN_PAPER + " Tab. 2 and the official README", code=FLATTEN_CODE,
                    notes="ref_* measured from the official classes at abdb115 (fvcore GMACs)")


def flatten_release(key: str, top1: float) -> dict:
    """The cfg of a checkpoint linked from the official README (TsinghuaCloud, `?dl=1`)."""
    return dict(url=f"https://cloud.tsinghua.edu.cn/f/{key}/?dl=1",
                notes=f"official release ({FLATTEN_CODE} README, TsinghuaCloud): {top1} top-1")


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
