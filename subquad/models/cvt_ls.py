"""CvT*-LS [unofficial]: the CvT host with convolutional token embeddings and convolutional projections, and
long-short attention in every stage (register LS-12); `cvt_13` / `cvt_21` are the same host with CvT's softmax
attention (the baselines).

Three stages (strides 4, 8, 16): a convolutional token embedding (7x7 s4 p2, then 3x3 s2 p1) with LayerNorm, then
pre-norm blocks. Each attention projects q, k, v with a depthwise 3x3 conv + BatchNorm followed by a Linear (CvT's
"convolutional projection"). Long-short blocks use stride 1 for q, k and v and a dynamic-projection score layer W^P
that is a depthwise 3x3 conv with weight standardisation followed by Linear(C -> h*r) (paper App. E); the long-short
core is the shared `long_short` mechanism (`layout="external"`, vision CLS rule, no position encoding, w = 7, r = 64
in every stage [ours]). Softmax baseline blocks use CvT's key/value stride 2. A class token joins stage 3 only; the
head reads it after the final LayerNorm.

The CvT*-LS code was never released; the seed gives the host (a CvT re-implementation), DualLN, the
weight-standardised W^P and the top-1 numbers, but not r and w. Every number we produce is ours, not a reproduction.
-17 and -21S are not registered (their configs are lost).

Paper: seed 003, Sec. 4.3, Table 5 and App. E (CvT*-LS); CvT (Wu et al. 2021) for the host.
Official: none for CvT*-LS (host layout after microsoft/CvT `cls_cvt.py`: `stage{i}.patch_embed.{proj, norm}`,
`stage{i}.blocks.{j}.{norm1, attn.{conv_proj_q, conv_proj_k, conv_proj_v, proj_q, proj_k, proj_v, proj}, norm2,
mlp.{fc1, fc2}}`, `stage2.cls_token`, `norm`, `head`).
Symbols: w window size (paper w), r projection rank (paper r), h heads, C channels.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.utils.checkpoint
from timm.layers import DropPath, StdConv2d, trunc_normal_
from timm.models import generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from torch import nn

from .._shapes import as_hw, merge_heads, split_heads
from ..attention import build_attention
from ..attention.functional.softmax import softmax_attention
from ..errors import UserError
from ..layers.mlp import Mlp
from ._builder import build
from ._card import ModelCard, register_card

__all__ = ["CvTLS", "ConvProjAttention"]


class ConvProj(nn.Module):
    """Depthwise 3x3 conv (no bias) + BatchNorm2d (keys `conv`, `bn`). (B, C, H, W) -> (B, C, H', W')."""

    def __init__(self, dim: int, stride: int = 1, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.conv = nn.Conv2d(dim, dim, 3, stride, 1, groups=dim, bias=False, **dd)
        self.bn = nn.BatchNorm2d(dim, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


class ConvProjAttention(nn.Module):
    """CvT attention with convolutional q/k/v projections; long-short or softmax core.

    Shapes: x (B, P + H*W, C) (P = 0 or 1 class token first), hw = (H, W) -> (B, P + H*W, C).

    Args:
        dim, num_heads: C and h.
        attn: "long_short" (stride 1 for q, k, v; weight-standardised depthwise W^P) or "softmax" (CvT: k, v with
            stride 2).
        num_prefix_tokens: class tokens P (they skip the convolutions, as in CvT).
        window_size, rank: w and r of the long-short core.
        qkv_bias, attn_drop, proj_drop: the usual.
    """

    def __init__(self, dim: int, num_heads: int, attn: str = "long_short", num_prefix_tokens: int = 0,
                 window_size: int = 7, rank: int = 64, qkv_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if attn not in ("long_short", "softmax"):
            raise ValueError(f"ConvProjAttention: attn must be 'long_short' or 'softmax', got {attn!r}")
        self.kind, self.num_heads, self.dim = attn, num_heads, dim
        self.num_prefix_tokens = num_prefix_tokens
        self.scale = (dim // num_heads) ** -0.5
        kv_stride = 1 if attn == "long_short" else 2
        self.conv_proj_q = ConvProj(dim, 1, **dd)
        self.conv_proj_k = ConvProj(dim, kv_stride, **dd)
        self.conv_proj_v = ConvProj(dim, kv_stride, **dd)
        self.proj_q = nn.Linear(dim, dim, bias=qkv_bias, **dd)
        self.proj_k = nn.Linear(dim, dim, bias=qkv_bias, **dd)
        self.proj_v = nn.Linear(dim, dim, bias=qkv_bias, **dd)
        if attn == "long_short":
            # W^P: depthwise 3x3 with weight standardisation (BN replaced, paper App. E), then Linear(C -> h r)
            self.dp_conv = StdConv2d(dim, dim, 3, padding=1, groups=dim, bias=False, **dd)
            self.dp_fc = nn.Linear(dim, num_heads * rank, **dd)
            self.ls = build_attention("long_short", dim, num_heads, window_size=window_size, rank=rank, dims=2,
                                      layout="external", num_prefix_tokens=num_prefix_tokens, rpe=False,
                                      attn_drop=attn_drop, proj_drop=proj_drop, **dd)
        else:
            self.attn_drop = attn_drop
            self.proj = nn.Linear(dim, dim, **dd)
            self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        P = self.num_prefix_tokens
        B, N, C = x.shape
        H, W = hw
        cls, grid = x[:, :P], x[:, P:].transpose(1, 2).reshape(B, C, H, W)

        def tokens(t: torch.Tensor) -> torch.Tensor:
            return torch.cat([cls, t.flatten(2).transpose(1, 2)], dim=1)

        q = self.proj_q(tokens(self.conv_proj_q(grid)))
        k = self.proj_k(tokens(self.conv_proj_k(grid)))
        v = self.proj_v(tokens(self.conv_proj_v(grid)))
        if self.kind == "long_short":
            dp = self.dp_fc(self.dp_conv(grid).flatten(2).transpose(1, 2))  # (B, H*W, h r)
            return self.ls.forward_qkv(q, k, v, dp, hw)
        h = self.num_heads
        p = self.attn_drop if self.training else 0.0
        if p:
            probs = ((split_heads(q, h) * self.scale) @ split_heads(k, h).transpose(-2, -1)).softmax(-1)
            o = nn.functional.dropout(probs, p) @ split_heads(v, h)
        else:
            o = softmax_attention(split_heads(q, h), split_heads(k, h), split_heads(v, h), self.scale)
        return self.proj_drop(self.proj(merge_heads(o)))


class Block(nn.Module):
    """Pre-norm block: x + DropPath(attn(norm1(x), hw)); x + DropPath(mlp(norm2(x)))."""

    def __init__(self, dim: int, attn: nn.Module, mlp_ratio: float, drop_path: float, drop: float, device=None,
                 dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.norm1 = nn.LayerNorm(dim, **dd)
        self.attn = attn
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, **dd)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop, **dd)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), hw))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class ConvEmbed(nn.Module):
    """Conv (k, s, p) + LayerNorm on tokens (keys `proj`, `norm`). (B, C_in, H, W) -> (B, h*w, C), (h, w)."""

    def __init__(self, in_chans: int, dim: int, kernel: int, stride: int, padding: int, device=None,
                 dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.proj = nn.Conv2d(in_chans, dim, kernel, stride, padding, **dd)
        self.norm = nn.LayerNorm(dim, **dd)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x = self.proj(x)
        hw = (x.shape[-2], x.shape[-1])
        return self.norm(x.flatten(2).transpose(1, 2)), hw


class Stage(nn.Module):
    """Conv embedding, optional class token, blocks. Map (B, C_in, H, W) -> tokens (B, P + h*w, C), (h, w)."""

    def __init__(self, in_chans: int, dim: int, depth: int, num_heads: int, embed: tuple[int, int, int],
                 attn: str, cls_token: bool, window_size: int, rank: int, mlp_ratio: float, dpr: Sequence[float],
                 drop: float, attn_drop: float, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.patch_embed = ConvEmbed(in_chans, dim, *embed, **dd)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim, **dd)) if cls_token else None
        P = int(cls_token)
        self.blocks = nn.ModuleList([
            Block(dim, ConvProjAttention(dim, num_heads, attn, P, window_size, rank, True, attn_drop, drop, **dd),
                  mlp_ratio, dpr[j], drop, **dd) for j in range(depth)])
        self.grad_checkpointing = False

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x, hw = self.patch_embed(x)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        for blk in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled() and not torch.jit.is_scripting():
                x = torch.utils.checkpoint.checkpoint(blk, x, hw, use_reentrant=False)
            else:
                x = blk(x, hw)
        return x, hw


class CvTLS(nn.Module):
    """CvT host with long-short (CvT*-LS) or softmax (CvT) attention.

    Shapes: images (B, in_chans, H, W), any H and W -> logits (B, num_classes); stage maps NCHW at strides
    4, 8, 16.

    Args:
        img_size: nominal resolution (cards and cfgs only; any size runs).
        in_chans, num_classes: input channels, classifier outputs (0: no head).
        embed_dims, depths, num_heads: per stage C, blocks, h.
        attn: "long_short" or "softmax" in every stage.
        window_size, rank: w and r of the long-short core (every stage).
        mlp_ratio, drop_rate, attn_drop_rate, drop_path_rate: the usual (drop path linear over all blocks).
    """

    def __init__(self, img_size: int | tuple[int, int] = 224, in_chans: int = 3, num_classes: int = 1000,
                 embed_dims: Sequence[int] = (64, 192, 384), depths: Sequence[int] = (1, 2, 10),
                 num_heads: Sequence[int] = (1, 3, 6), attn: str = "long_short", window_size: int = 7,
                 rank: int = 64, mlp_ratio: float = 4.0, drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.1, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if not (len(embed_dims) == len(depths) == len(num_heads) == 3):
            raise ValueError(f"CvTLS: embed_dims, depths and num_heads need 3 entries each, got {embed_dims}, "
                             f"{depths}, {num_heads}")
        self.img_size = as_hw(img_size)
        self.num_classes = num_classes
        self.num_features = self.head_hidden_size = embed_dims[-1]
        embeds = [(7, 4, 2), (3, 2, 1), (3, 2, 1)]
        dpr = torch.linspace(0, drop_path_rate, sum(depths)).split(list(depths))
        in_dim, stride = in_chans, 1
        self.feature_info = []
        for i in range(3):
            stride *= embeds[i][1]
            self.add_module(f"stage{i}", Stage(in_dim, embed_dims[i], depths[i], num_heads[i], embeds[i], attn,
                                               i == 2, window_size, rank, mlp_ratio, dpr[i].tolist(), drop_rate,
                                               attn_drop_rate, **dd))
            self.feature_info.append(dict(num_chs=embed_dims[i], reduction=stride, module=f"stage{i}"))
            in_dim = embed_dims[i]
        self.num_stages = 3
        self.norm = nn.LayerNorm(embed_dims[-1], **dd)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dims[-1], num_classes, **dd) if num_classes > 0 else nn.Identity()
        if not self.norm.weight.is_meta:
            self.apply(self._init_module)
            trunc_normal_(self.stage2.cls_token, std=0.02)

    @staticmethod
    def _init_module(m: nn.Module) -> None:
        """CvT init: Linear trunc_normal(0.02), bias 0; LayerNorm / BatchNorm (1, 0); convs default."""
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.LayerNorm, nn.BatchNorm2d)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    def stages(self) -> list[Stage]:
        return [getattr(self, f"stage{i}") for i in range(self.num_stages)]

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {"stage2.cls_token"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(stem=r"^stage0\.patch_embed", blocks=[(r"^stage(\d+)\.blocks\.(\d+)", None),
                                                          (r"^norm", (99999,))])

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        for s in self.stages():
            s.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = num_classes
        ref = self.stage0.patch_embed.proj.weight
        self.head = nn.Linear(self.num_features, num_classes, device=ref.device, dtype=ref.dtype) \
            if num_classes > 0 else nn.Identity()

    def _check_images(self, x: torch.Tensor) -> None:
        in_chans = self.stage0.patch_embed.proj.in_channels
        if x.dim() != 4 or x.shape[1] != in_chans:
            raise ValueError(f"{type(self).__name__}: expected images (B, {in_chans}, H, W) with {in_chans} input "
                             f"channels, got shape {tuple(x.shape)}")

    @staticmethod
    def _to_map(stage: Stage, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        P = int(stage.cls_token is not None)
        return x[:, P:].transpose(1, 2).reshape(x.shape[0], -1, *hw)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C_in, H, W) -> normalised stage-3 tokens (B, 1 + h*w, C) (class token first)."""
        self._check_images(x)
        stages = self.stages()
        for i, st in enumerate(stages):
            x, hw = st(x)
            if i < len(stages) - 1:
                x = self._to_map(st, x, hw)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.head_drop(x[:, 0])
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(self, x: torch.Tensor, indices: int | list[int] | None = None, norm: bool = False,
                              stop_early: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False):
        """Stage outputs as maps (B, C_s, h_s, w_s) (class token dropped)."""
        if output_fmt != "NCHW":
            raise ValueError(f"output_fmt must be 'NCHW', got {output_fmt!r}")
        self._check_images(x)
        take, max_index = feature_take_indices(self.num_stages, indices)
        stages = self.stages()[: (max_index + 1 if stop_early else self.num_stages)]
        inter = []
        for i, st in enumerate(stages):
            x, hw = st(x)
            if i in take:
                y = self.norm(x) if norm and i == self.num_stages - 1 else x
                inter.append(self._to_map(st, y, hw))
            if i < len(stages) - 1:
                x = self._to_map(st, x, hw)
        if intermediates_only:
            return inter
        return self.norm(x), inter

    def prune_intermediate_layers(self, indices: int | list[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        take, max_index = feature_take_indices(self.num_stages, indices)
        self.num_stages = max_index + 1
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0)
        return take


def _cfg(**kwargs) -> dict:
    return {"url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None, "crop_pct": 0.875,
            "interpolation": "bicubic", "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
            "first_conv": "stage0.patch_embed.proj", "classifier": "head", "license": "mit",
            "paper_ids": "arXiv:2107.02192", **kwargs}


default_cfgs = generate_default_cfgs({
    "cvt_ls_micro": _cfg(input_size=(3, 32, 32), crop_pct=1.0, notes="tiny test/demo variant [unofficial]"),
    "cvt_ls_13": _cfg(notes="[unofficial] reconstruction of CvT*-LS-13 (code never released; w = 7, r = 64 ours)"),
    "cvt_ls_21": _cfg(notes="[unofficial] reconstruction of CvT*-LS-21 (code never released; w = 7, r = 64 ours)"),
    "cvt_13": _cfg(paper_ids="arXiv:2103.15808", notes="CvT-13 host with softmax attention (kv stride 2)"),
    "cvt_21": _cfg(paper_ids="arXiv:2103.15808", notes="CvT-21 host with softmax attention (kv stride 2)"),
})


def _create(variant: str, pretrained: bool = False, **kwargs) -> CvTLS:
    if pretrained and not kwargs.get("pretrained_cfg_overlay"):
        raise UserError(f"{variant}: no weights exist; pass checkpoint_path=... of your own training")
    return build(CvTLS, variant, pretrained, default_out_indices=(0, 1, 2), **kwargs)


_13 = dict(embed_dims=(64, 192, 384), depths=(1, 2, 10), num_heads=(1, 3, 6))
_21 = {**_13, "depths": (1, 4, 16)}


@register_model
def cvt_ls_micro(pretrained: bool = False, **kwargs) -> CvTLS:
    args = dict(img_size=32, embed_dims=(16, 24, 32), depths=(1, 1, 1), num_heads=(1, 2, 2), window_size=2,
                rank=4)
    return _create("cvt_ls_micro", pretrained, **{**args, **kwargs})


@register_model
def cvt_ls_13(pretrained: bool = False, **kwargs) -> CvTLS:
    return _create("cvt_ls_13", pretrained, **{**_13, "attn": "long_short", **kwargs})


@register_model
def cvt_ls_21(pretrained: bool = False, **kwargs) -> CvTLS:
    return _create("cvt_ls_21", pretrained, **{**_21, "attn": "long_short", **kwargs})


@register_model
def cvt_13(pretrained: bool = False, **kwargs) -> CvTLS:
    return _create("cvt_13", pretrained, **{**_13, "attn": "softmax", **kwargs})


@register_model
def cvt_21(pretrained: bool = False, **kwargs) -> CvTLS:
    return _create("cvt_21", pretrained, **{**_21, "attn": "softmax", **kwargs})


_LS_SRC = "seed 003 App. E / Table 5 (CvT*-LS); #P and FLOPs [unverified]"
_CVT_SRC = "CvT paper (arXiv 2103.15808) Table 2 [unverified]"
_LS_NOTE = ("[unofficial] reconstruction: code never released, r and w lost (w = 7, r = 64 ours); ref_params is "
            "our definition's count, not the paper's")
register_card(ModelCard("cvt_ls_micro", "long_short", img_size=32, source="test/demo variant", status="unofficial"))
register_card(ModelCard("cvt_ls_13", "long_short", 224, 20.3, 4.9, 81.9, _LS_SRC, status="unofficial",
                        ref_params=21_609_896, ref_gmacs=5.73, notes=_LS_NOTE))
register_card(ModelCard("cvt_ls_21", "long_short", 224, 32.1, 7.9, 82.7, _LS_SRC, status="unofficial",
                        ref_params=34_231_208, ref_gmacs=9.23, notes=_LS_NOTE))
register_card(ModelCard("cvt_13", "long_short", 224, 20.0, 4.5, 81.6, _CVT_SRC, status="unofficial",
                        ref_params=19_997_480, ref_gmacs=4.57, code="microsoft/CvT",
                        notes="CvT-13 host re-implemented here (softmax baseline of CvT*-LS); no weights"))
register_card(ModelCard("cvt_21", "long_short", 224, 31.6, 7.1, 82.5, _CVT_SRC, status="unofficial",
                        ref_params=31_622_696, ref_gmacs=7.18, code="microsoft/CvT",
                        notes="CvT-21 host re-implemented here (softmax baseline of CvT*-LS); no weights"))
