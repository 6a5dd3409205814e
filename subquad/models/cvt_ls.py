"""CvT*-LS [unofficial]: the CvT host with convolutional token embeddings and convolutional projections, and
long-short attention in every stage (docs/deviations.md); `cvt_13` / `cvt_21` are the same host with CvT's softmax
attention (the baselines).

Three stages (strides 4, 8, 16): a convolutional token embedding (7x7 s4 p2, then 3x3 s2 p1) with LayerNorm, then
pre-norm blocks. Each attention projects q, k, v with a depthwise 3x3 conv + BatchNorm followed by a Linear (CvT's
"convolutional projection"). Long-short blocks use stride 1 for q, k and v and a dynamic-projection score layer W^P
that is a depthwise 3x3 conv with weight standardisation followed by Linear(C -> h*r) (paper App. E); the long-short
core is the shared `long_short` mechanism's "host_qkv" form (`attn.mixer`, with the conv W^P `mixer.dp_conv` and
`mixer.to_dynamic_projection`; vision CLS rule, no position encoding, w = 7, r = 64
in every stage [ours]). Softmax baseline blocks use CvT's key/value stride 2. A class token joins stage 3 only; the
head reads it after the final LayerNorm.

The CvT*-LS code was never released; the seed gives the host (a CvT re-implementation), DualLN, the
weight-standardised W^P and the top-1 numbers, but not r and w. Every number we produce is ours, not a reproduction.
-17 and -21S are not registered (their configs are lost).

Paper: Transformer-LS (arXiv 2107.02192), Sec. 4.3, Table 5 and App. E (CvT*-LS); CvT (Wu et al. 2021) for the host.
Official: none for CvT*-LS (host layout after microsoft/CvT `cls_cvt.py`: `stage{i}.patch_embed.{proj, norm}`,
`stage{i}.blocks.{j}.{norm1, attn.{conv_proj_q, conv_proj_k, conv_proj_v, proj_q, proj_k, proj_v, proj}, norm2,
mlp.{fc1, fc2}}`, `stage2.cls_token`, `norm`, `head`).
Symbols: w window size (paper w), r projection rank (paper r), h heads, C channels.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.utils.checkpoint
from timm.layers import DropPath, register_notrace_module, trunc_normal_
from torch import nn

from .._shapes import as_hw
from ..attention import build_stage_attention, get_attention_form
from ..errors import UserError
from ..layers.mlp import Mlp
from ._base import Backbone, drop_path_rates, stage_mechanisms, tokens_to_nchw
from ._builder import Variant, register_family

__all__ = ["CvTLS", "ConvProjAttention", "remap_legacy"]


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
    """CvT attention: convolutional q/k/v projections, the stage mechanism's "host_qkv" form, output `proj`.

    Shapes: x (B, P + H*W, C) (P = 0 or 1 class token first), hw = (H, W) -> (B, P + H*W, C).

    The key/value stride is the mechanism's (`conv_kv_stride` of its "host_qkv" form): 1 for long-short (q, k, v at
    full resolution; its W^P is a weight-standardised depthwise conv + Linear, `mixer.dp_conv` /
    `mixer.to_dynamic_projection`, paper App. E), 2 for softmax (CvT's squeezed keys/values). A mechanism without
    a "host_qkv" form is refused when the model is built.

    Args:
        dim, num_heads: C and h.
        attn: a registered mechanism with a "host_qkv" form ("long_short" for CvT*-LS, "softmax" for CvT).
        num_prefix_tokens: class tokens P (they skip the convolutions, as in CvT).
        window_size, rank: w and r (hints for mechanisms that take them: the long-short core).
        qkv_bias, attn_drop, proj_drop: the usual.
        grid: the stage's token grid at the construction resolution (for mechanisms sized by it).
        attn_kwargs: the user's options for the mechanism.
    """

    def __init__(self, dim: int, num_heads: int, attn: str = "long_short", num_prefix_tokens: int = 0,
                 window_size: int = 7, rank: int = 64, qkv_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, grid: tuple[int, int] | None = None, attn_kwargs: dict | None = None,
                 device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        try:
            kv_stride = getattr(get_attention_form(attn, "host_qkv"), "conv_kv_stride", 1)
        except UserError as e:  # the host projects q, k, v: the mechanism needs a "host_qkv" form
            raise UserError(f"cvt: {e}") from None
        self.num_heads, self.dim = num_heads, dim
        self.num_prefix_tokens = num_prefix_tokens
        self.conv_proj_q = ConvProj(dim, 1, **dd)
        self.conv_proj_k = ConvProj(dim, kv_stride, **dd)
        self.conv_proj_v = ConvProj(dim, kv_stride, **dd)
        self.proj_q = nn.Linear(dim, dim, bias=qkv_bias, **dd)
        self.proj_k = nn.Linear(dim, dim, bias=qkv_bias, **dd)
        self.proj_v = nn.Linear(dim, dim, bias=qkv_bias, **dd)
        # stage facts: convolutional projections, window, class tokens; host hints for mechanisms that take them
        stage = dict(conv_proj=True, grid=grid, window_size=window_size, num_prefix_tokens=num_prefix_tokens,
                     hints=dict(rank=rank, dims=2, rpe=False, attn_drop=attn_drop))
        self.mixer = build_stage_attention(attn, dim, num_heads, stage, attn_kwargs, host_qkv=True, **dd)
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
        return self.proj_drop(self.proj(self.mixer.forward_qkv(q, k, v, hw, x=x)))


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


@register_notrace_module
class Stage(nn.Module):
    """Conv embedding, optional class token, blocks. Map (B, C_in, H, W) -> tokens (B, P + h*w, C), (h, w)."""

    def __init__(self, in_chans: int, dim: int, depth: int, num_heads: int, embed: tuple[int, int, int],
                 attn: str, cls_token: bool, window_size: int, rank: int, mlp_ratio: float, dpr: Sequence[float],
                 drop: float, attn_drop: float, grid: tuple[int, int] | None = None,
                 attn_kwargs: dict | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.patch_embed = ConvEmbed(in_chans, dim, *embed, **dd)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim, **dd)) if cls_token else None
        P = int(cls_token)
        self.blocks = nn.ModuleList([
            Block(dim, ConvProjAttention(dim, num_heads, attn=attn, num_prefix_tokens=P, window_size=window_size,
                                         rank=rank, qkv_bias=True, attn_drop=attn_drop, proj_drop=drop, grid=grid,
                                         attn_kwargs=attn_kwargs, **dd),
                  mlp_ratio=mlp_ratio, drop_path=dpr[j], drop=drop, **dd)
            for j in range(depth)])
        self.grad_checkpointing = False

    def reset_parameters(self) -> None:
        if self.cls_token is not None:
            trunc_normal_(self.cls_token, std=0.02)

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


class CvTLS(Backbone):
    """CvT host with long-short (CvT*-LS) or softmax (CvT) attention.

    Shapes: images (B, in_chans, H, W), any H and W -> logits (B, num_classes); stage maps NCHW at strides
    4, 8, 16.

    Args:
        img_size: nominal resolution (cards and cfgs only; any size runs).
        in_chans, num_classes: input channels, classifier outputs (0: no head).
        embed_dims, depths, num_heads: per stage C, blocks, h.
        attn: the mechanism: a name for every stage, or 3 names (one per stage), each with a "host_qkv" form
            ("long_short": CvT*-LS, "softmax": CvT).
        window_size, rank: w and r of the long-short core (every stage).
        mlp_ratio, drop_rate, attn_drop_rate, drop_path_rate: the usual (drop path linear over all blocks).
        global_pool: 'token' (the stage-3 class token, CvT's head), 'avg' (mean of the patch tokens) or ''.
        attn_kwargs: extra options for every stage's mechanism.
    """

    init_norms = True

    output_fmt = "NLC"
    num_prefix_tokens = 1
    group_patterns = dict(stem=r"^stage0\.patch_embed", blocks=[(r"^stage(\d+)\.blocks\.(\d+)", None),
                                                                 (r"^norm", (99999,))])
    no_decay = (r"^stage2\.cls_token$",)

    def __init__(self, img_size: int | tuple[int, int] = 224, in_chans: int = 3, num_classes: int = 1000,
                 embed_dims: Sequence[int] = (64, 192, 384), depths: Sequence[int] = (1, 2, 10),
                 num_heads: Sequence[int] = (1, 3, 6), attn: str | Sequence[str] = "long_short",
                 window_size: int = 7, rank: int = 64, mlp_ratio: float = 4.0, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0, drop_path_rate: float = 0.1, global_pool: str = "token",
                 attn_kwargs: dict | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if not (len(embed_dims) == len(depths) == len(num_heads) == 3):
            raise ValueError(f"CvTLS: embed_dims, depths and num_heads need 3 entries each, got {embed_dims}, "
                             f"{depths}, {num_heads}")
        self.attn_names = stage_mechanisms("cvt_ls", attn, 3)
        self.img_size = as_hw(img_size)
        self.in_chans = in_chans
        self.total_stride = 16
        self.grad_checkpointing = False
        self.num_features = self.head_hidden_size = embed_dims[-1]
        embeds = [(7, 4, 2), (3, 2, 1), (3, 2, 1)]
        dpr = drop_path_rates(drop_path_rate, depths)
        in_dim, stride = in_chans, 1
        self.feature_info = []
        grid = self.img_size
        for i in range(3):
            stride *= embeds[i][1]
            k, s, p = embeds[i]
            grid = tuple((n + 2 * p - k) // s + 1 for n in grid)  # the embedding conv's output map
            self.add_module(f"stage{i}", Stage(in_dim, embed_dims[i], depths[i], num_heads[i], embeds[i],
                                               self.attn_names[i], i == 2, window_size, rank, mlp_ratio, dpr[i],
                                               drop_rate, attn_drop_rate, grid, attn_kwargs=attn_kwargs, **dd))
            self.feature_info.append(dict(num_chs=embed_dims[i], reduction=stride, module=f"stage{i}"))
            in_dim = embed_dims[i]
        self.num_stages = 3
        self.norm = nn.LayerNorm(embed_dims[-1], **dd)
        self._init_head(num_classes, global_pool, drop_rate, **dd)
        self._finish_init()


    def _init_extra(self) -> None:
        self.stage2.reset_parameters()

    def _level_prefix(self, i: int) -> int:
        return int(getattr(self, f"stage{i}").cls_token is not None)

    def _forward_level(self, i: int, x: torch.Tensor, hw):
        """Stage i: the previous stage's tokens as a map (class token dropped), then the stage."""
        if i:
            x = tokens_to_nchw(x, hw, self._level_prefix(i - 1))
        return getattr(self, f"stage{i}")(x)

    def _truncate(self, num_levels: int) -> None:
        for i in range(num_levels, self.num_stages):
            delattr(self, f"stage{i}")
        self.num_stages = num_levels


_LEGACY = ((".attn.ls.proj.", ".attn.proj."), (".attn.ls.", ".attn.mixer."),
           (".attn.dp_conv.", ".attn.mixer.dp_conv."), (".attn.dp_fc.", ".attn.mixer.to_dynamic_projection."))


def remap_legacy(state_dict: dict[str, torch.Tensor], model: nn.Module | None = None) -> dict[str, torch.Tensor]:
    """A CvT*-LS state dict saved by subquad <= 0.1 -> the current names: the long-short module is `attn.mixer`
    (was `attn.ls`), its output projection the block attention's `attn.proj` (as the softmax baseline's always was),
    and the dynamic projection moved into it (`attn.dp_conv`, `attn.dp_fc` -> `attn.mixer.dp_conv`,
    `attn.mixer.to_dynamic_projection`). Detected by key names; current state dicts pass unchanged."""
    out = {}
    for k, v in state_dict.items():
        for old, new in _LEGACY:
            if old in k:
                k = k.replace(old, new)
                break
        out[k] = v
    return out


_13 = dict(embed_dims=(64, 192, 384), depths=(1, 2, 10), num_heads=(1, 3, 6))
_21 = {**_13, "depths": (1, 4, 16)}
_LS_SRC = ("Long-Short Transformer: Efficient Transformers for Language and Vision (arXiv 2107.02192) App. E / "
           "Table 5 (CvT*-LS)")
_CVT_SRC = "CvT: Introducing Convolutions to Vision Transformers (arXiv 2103.15808) Table 2"
_LS_NOTE = ("[unofficial] reconstruction: code never released and the paper's r and w are not in its text; w = 7, "
            "r = 64 are ours. ref_params / ref_gmacs are our definition's counts: the paper's smaller numbers are met "
            "by a smaller dynamic projection and window (measured with r = 8, w = 4: 20.25 M / 4.91 GMACs for -13, "
            "32.03 M / 7.89 GMACs for -21), so the difference is r and w, not the host (see docs/deviations.md)")
_CVT_NOTE = "CvT host re-implemented here (softmax baseline of CvT*-LS); no weights"
register_family(__name__, CvTLS, [
    Variant("cvt_ls_micro", dict(img_size=32, embed_dims=(16, 24, 32), depths=(1, 1, 1), num_heads=(1, 2, 2),
                                 window_size=2, rank=4),
            dict(img_size=32, source="test/demo variant", notes="not a paper model"),
            cfg=dict(input_size=(3, 32, 32), crop_pct=1.0)),
    Variant("cvt_ls_13", {**_13, "attn": "long_short"},
            dict(params_m=20.3, gmacs=4.9, top1=81.9, ref_params=21_609_896, ref_gmacs=5.73)),
    Variant("cvt_ls_21", {**_21, "attn": "long_short"},
            dict(params_m=32.1, gmacs=7.9, top1=82.7, ref_params=34_231_208, ref_gmacs=9.23)),
    Variant("cvt_13", {**_13, "attn": "softmax"},
            dict(params_m=20.0, gmacs=4.5, top1=81.6, ref_params=19_997_480, ref_gmacs=4.57, source=_CVT_SRC,
                 code="microsoft/CvT", notes=_CVT_NOTE), cfg=dict(paper_ids="arXiv:2103.15808")),
    Variant("cvt_21", {**_21, "attn": "softmax"},
            dict(params_m=31.6, gmacs=7.1, top1=82.5, ref_params=31_622_696, ref_gmacs=7.18, source=_CVT_SRC,
                 code="microsoft/CvT", notes=_CVT_NOTE), cfg=dict(paper_ids="arXiv:2103.15808")),
], cfg=dict(first_conv="stage0.patch_embed.proj", license="mit", paper_ids="arXiv:2107.02192",
            origin_url="https://github.com/NVIDIA/transformer-ls",
            notes="unofficial reconstruction; no released code or weights"),
    stride=lambda a: 16, card=dict(family="long_short", source=_LS_SRC, status="unofficial", notes=_LS_NOTE),
    out_indices=lambda a: (0, 1, 2), non_std=True)
