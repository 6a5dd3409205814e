"""ViL-LS: the multi-scale ViL host of Transformer-LS (long-short attention in stages 1-2, full attention in 3-4).

Four stages, each: a per-stage patch embedding (conv p x p stride p, LayerNorm `norm_embed`, a fresh class token when
the stage has one), then alternating attention blocks (LN -> attention -> DropPath residual) and MLP blocks
(LN -> MLP -> DropPath residual) as separate sequence items. The class token is discarded at every stage boundary.
Stages 1-2 use "long_short" attention (2-D form, ViL relative-position bias on the window logits); stages 3-4 use
full softmax attention with the ViL relative-position tables (local table over the whole stage map plus
global-to-local / global-to-global biases). Head: final LN, then the class token (or the mean of the tokens when the
last stage has none, as in every released model), then Linear.

Any input size works: the image is padded to the patch size at each embedding, long-short attention pads and masks
its tiles, and the full-attention tables are resized bicubically to the stage grid at run time [ours, register
LS-16; the official loader resizes a mismatched table bilinearly and the official model asserts its size].

`vil_medium` / `vil_base` are the same host with full attention in every stage (the papers' softmax baselines;
not the Vision Longformer attention of the original ViL).

Paper: seed 003, Sec. 4.3 and Table 5 (ViL-LS-Medium / Base).
Official: NVIDIA/transformer-ls `imagenet/models/msvit.py` MsViT, `imagenet/models/layers/{transformer_ls,
full_attention}.py` (key layout kept: `layer{s}.0.{proj, norm_embed, cls_token}`, `layer{s}.{2j+1}.{norm, attn}`,
`layer{s}.{2j+2}.{norm, mlp.fc1, mlp.fc2}`, `norm`, `head`).
Symbols: w window/tile size (official arch `f`), r projection rank (arch `r`), p patch size (arch `p`), g global
tokens (arch `g`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from timm.layers import DropPath, trunc_normal_
from timm.models import generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from torch import nn

from .._shapes import as_hw, merge_heads
from ..attention import build_attention
from ..attention.functional.softmax import softmax_attention, softmax_attention_ref
from ..errors import UserError
from ..layers.mlp import Mlp
from ._builder import build
from ._card import ModelCard, register_card

__all__ = ["ViLLS", "ViLFullAttention", "remap_official"]

_OFFICIAL_NO_DECAY = ("pos_embed", "cls_token", "norm.weight", "norm.bias", "norm_embed", "head.bias",
                      "relative_position")


def _vil_rel_index(hw: tuple[int, int], device=None) -> torch.Tensor:
    """(HW, HW) index into a ((2H - 1)(2W - 1)) table: (dy + H - 1)(2W - 1) + (dx + W - 1) (official)."""
    H, W = hw
    ys = torch.arange(H, device=device).repeat_interleave(W)
    xs = torch.arange(W, device=device).repeat(H)
    return (ys[:, None] - ys[None, :] + H - 1) * (2 * W - 1) + (xs[:, None] - xs[None, :] + W - 1)


def resize_rel_table(table: torch.Tensor, src: tuple[int, int], dst: tuple[int, int]) -> torch.Tensor:
    """Bicubic resize of a ((2H - 1)(2W - 1), h) ViL table from grid `src` to grid `dst` [ours, LS-16]."""
    if tuple(src) == tuple(dst):
        return table
    (H, W), (H2, W2) = src, dst
    h = table.shape[1]
    t = table.transpose(0, 1).reshape(1, h, 2 * H - 1, 2 * W - 1)
    t = F.interpolate(t, size=(2 * H2 - 1, 2 * W2 - 1), mode="bicubic", align_corners=False)
    return t.reshape(h, -1).transpose(0, 1)


class ViLFullAttention(nn.Module):
    """ViL full attention with relative-position biases (stages 3-4 of ViL-LS), through SDPA.

    Shapes: x (B, g + H*W, C) with hw = (H, W) -> (B, g + H*W, C).
    Official: `imagenet/models/layers/full_attention.py` Attention (keys `qkv`, `proj`,
    `local_relative_position_bias_table` ((2H-1)(2W-1), h), `g2l_relative_position_bias` (2, h, g),
    `g2g_relative_position_bias` (h, g, g)).

    Args:
        dim, num_heads: C and h. input_size: (H, W) the tables are built for. nglo: global tokens g.
        qkv_bias: bias on qkv. attn_drop, proj_drop: dropout. fused: SDPA (True) or the dense reference.
    """

    def __init__(self, dim: int, num_heads: int, input_size: tuple[int, int], nglo: int = 1, qkv_bias: bool = True,
                 attn_drop: float = 0.0, proj_drop: float = 0.0, fused: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.dim, self.num_heads, self.nglo, self.fused = dim, num_heads, nglo, fused
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.input_size = as_hw(input_size, "input_size")
        H, W = self.input_size
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self.local_relative_position_bias_table = nn.Parameter(torch.zeros((2 * H - 1) * (2 * W - 1), num_heads, **dd))
        if nglo >= 1:
            self.g2l_relative_position_bias = nn.Parameter(torch.zeros(2, num_heads, nglo, **dd))
            self.g2g_relative_position_bias = nn.Parameter(torch.zeros(num_heads, nglo, nglo, **dd))
        if not self.qkv.weight.is_meta:
            for p in self.parameters():
                if p.dim() >= 2 and p is not self.qkv.weight and p is not self.proj.weight:
                    trunc_normal_(p, std=0.02)

    def bias(self, hw: tuple[int, int]) -> torch.Tensor:
        """(h, N, N) relative-position bias at grid hw (table resized when hw differs from input_size)."""
        table = resize_rel_table(self.local_relative_position_bias_table, self.input_size, hw)
        idx = _vil_rel_index(hw, table.device)
        n = hw[0] * hw[1]
        local = table[idx.reshape(-1)].reshape(n, n, -1).permute(2, 0, 1)  # (h, n, n)
        if self.nglo == 0:
            return local
        g2g, g2l = self.g2g_relative_position_bias, self.g2l_relative_position_bias
        top = torch.cat([g2g, g2l[0].unsqueeze(-1).expand(-1, -1, n)], dim=-1)  # (h, g, g + n)
        bottom = torch.cat([g2l[1].unsqueeze(1).expand(-1, n, -1), local], dim=-1)  # (h, n, g + n)
        return torch.cat([top, bottom], dim=1)

    def _qkv(self, x: torch.Tensor):
        B, N, C = x.shape
        return self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        q, k, v = self._qkv(x)
        bias = self.bias(hw)[None]
        if self.fused and not (self.training and self.attn_drop > 0):
            o = softmax_attention(q, k, v, self.scale, None, bias)
        else:
            o = softmax_attention_ref(q, k, v, self.scale, None, bias)
        return self.proj_drop(self.proj(merge_heads(o)))


class PatchEmbed(nn.Module):
    """Conv p x p stride p (input padded to a multiple of p), LN `norm_embed`, optional class token.

    Shapes: (B, C_in, H, W) -> tokens (B, g + h*w, C) and (h, w). Official: msvit.PatchEmbed (keys `proj`,
    `norm_embed`, `cls_token`)."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int, nglo: int = 1, device=None,
                 dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, **dd)
        self.norm_embed = nn.LayerNorm(embed_dim, eps=1e-6, **dd)
        self.cls_token = nn.Parameter(torch.zeros(1, nglo, embed_dim, **dd)) if nglo else None
        if self.cls_token is not None and not self.cls_token.is_meta:
            trunc_normal_(self.cls_token, std=0.02)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        p = self.patch_size
        H, W = x.shape[-2:]
        x = F.pad(x, (0, (-W) % p, 0, (-H) % p))
        x = self.proj(x)
        hw = (x.shape[-2], x.shape[-1])
        x = self.norm_embed(x.flatten(2).transpose(1, 2))
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return x, hw


class AttnBlock(nn.Module):
    """x + DropPath(attn(LN(x), hw)). Official: msvit.AttnBlock (keys `norm`, `attn`)."""

    def __init__(self, dim: int, attn: nn.Module, drop_path: float, device=None, dtype=None) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-6, device=device, dtype=dtype)
        self.attn = attn
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        return x + self.drop_path(self.attn(self.norm(x), hw))


class MlpBlock(nn.Module):
    """x + DropPath(MLP(LN(x))), MLP ratio 4 with GELU. Official: msvit.MlpBlock (keys `norm`, `mlp.fc1/fc2`)."""

    def __init__(self, dim: int, mlp_ratio: float, drop: float, drop_path: float, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.norm = nn.LayerNorm(dim, eps=1e-6, **dd)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop, **dd)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        return x + self.drop_path(self.mlp(self.norm(x)))


class ViLLS(nn.Module):
    """ViL-LS / ViL host (MsViT) with per-stage attention.

    Shapes: images (B, in_chans, H, W), any H and W -> logits (B, num_classes); stage maps NCHW at strides
    patch_sizes cumulative (4, 8, 16, 32).

    Args:
        img_size: construction resolution (sizes the full-attention tables).
        in_chans, num_classes: input channels, classifier outputs (0: no head).
        embed_dims, depths, num_heads, patch_sizes, nglos: per stage C, blocks, h, p, global tokens g.
        stage_attn: per stage "long_short" or "full".
        window_sizes, ranks: per stage w and r of the long-short stages.
        mlp_ratio, qkv_bias, drop_rate, attn_drop_rate, drop_path_rate: the usual; drop path is linear over all
            blocks (the attention and MLP block of one block share a rate).
    """

    def __init__(self, img_size: int | tuple[int, int] = 224, in_chans: int = 3, num_classes: int = 1000,
                 embed_dims: Sequence[int] = (96, 192, 384, 768), depths: Sequence[int] = (1, 4, 16, 1),
                 num_heads: Sequence[int] = (3, 3, 6, 12), patch_sizes: Sequence[int] = (4, 2, 2, 2),
                 nglos: Sequence[int] = (1, 1, 1, 0),
                 stage_attn: Sequence[str] = ("long_short", "long_short", "full", "full"),
                 window_sizes: Sequence[int] = (7, 7, 7, 7), ranks: Sequence[int] = (8, 8, 8, 8),
                 mlp_ratio: float = 4.0, qkv_bias: bool = True, drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, global_pool: str = "auto", device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        n = len(depths)
        for name, seq in (("embed_dims", embed_dims), ("num_heads", num_heads), ("patch_sizes", patch_sizes),
                          ("nglos", nglos), ("stage_attn", stage_attn), ("window_sizes", window_sizes),
                          ("ranks", ranks)):
            if len(seq) != n:
                raise ValueError(f"ViLLS: {name} has {len(seq)} entries for {n} stages")
        for a in stage_attn:
            if a not in ("long_short", "full"):
                raise ValueError(f"ViLLS: stage_attn entries must be 'long_short' or 'full', got {a!r}")
        if global_pool not in ("auto", "token", "avg"):
            raise ValueError(f"ViLLS: global_pool must be 'auto', 'token' or 'avg', got {global_pool!r}")
        self.img_size = as_hw(img_size)
        self.num_classes = num_classes
        self.nglos = tuple(nglos)
        self.stage_attn = tuple(stage_attn)
        self.global_pool = ("token" if nglos[-1] > 0 else "avg") if global_pool == "auto" else global_pool
        self.num_features = self.head_hidden_size = embed_dims[-1]
        self.grad_checkpointing = False
        dpr = torch.linspace(0, drop_path_rate, sum(depths)).split(list(depths))
        H, W = self.img_size
        in_dim, stride = in_chans, 1
        self.feature_info = []
        for s in range(n):
            p = patch_sizes[s]
            H, W, stride = math.ceil(H / p), math.ceil(W / p), stride * p
            dim = embed_dims[s]
            layers: list[nn.Module] = [PatchEmbed(p, in_dim, dim, nglos[s], **dd)]
            for rate in dpr[s].tolist():
                if stage_attn[s] == "long_short":
                    attn = build_attention("long_short", dim, num_heads[s], window_size=window_sizes[s],
                                           rank=ranks[s], dims=2, num_prefix_tokens=nglos[s], rpe=True,
                                           qkv_bias=qkv_bias, attn_drop=attn_drop_rate, proj_drop=drop_rate, **dd)
                else:
                    attn = ViLFullAttention(dim, num_heads[s], (H, W), nglos[s], qkv_bias, attn_drop_rate,
                                            drop_rate, **dd)
                layers.append(AttnBlock(dim, attn, rate, **dd))
                layers.append(MlpBlock(dim, mlp_ratio, drop_rate, rate, **dd))
            self.add_module(f"layer{s + 1}", nn.Sequential(*layers))
            self.feature_info.append(dict(num_chs=dim, reduction=stride, module=f"layer{s + 1}"))
            in_dim = dim
        self.num_stages = n
        self.norm = nn.LayerNorm(embed_dims[-1], eps=1e-6, **dd)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dims[-1], num_classes, **dd) if num_classes > 0 else nn.Identity()
        if not self.norm.weight.is_meta:
            self.apply(self._init_module)

    @staticmethod
    def _init_module(m: nn.Module) -> None:
        """Official `_init_weights`: Linear trunc_normal(0.02), bias 0; LayerNorm (1, 0); convs default."""
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    def stages(self) -> list[nn.Sequential]:
        return [getattr(self, f"layer{s + 1}") for s in range(self.num_stages)]

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Parameter names the official optimiser excludes from weight decay (name contains one of
        `pos_embed`, `cls_token`, `norm.weight`, `norm.bias`, `norm_embed`, `head.bias`, `relative_position`)."""
        return {n for n, _ in self.named_parameters() if any(s in n for s in _OFFICIAL_NO_DECAY)}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(stem=r"^layer1\.0\.", blocks=[(r"^layer(\d+)\.(\d+)", None), (r"^norm", (99999,))])

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = num_classes
        if global_pool is not None:
            if global_pool not in ("token", "avg"):
                raise ValueError(f"global_pool must be 'token' or 'avg', got {global_pool!r}")
            self.global_pool = global_pool
        ref = self.layer1[0].proj.weight
        self.head = nn.Linear(self.num_features, num_classes, device=ref.device, dtype=ref.dtype) \
            if num_classes > 0 else nn.Identity()

    def _stage(self, s: int, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Map (B, C_in, H, W) -> tokens (B, g + h*w, C) of stage s and its grid."""
        layers = self.stages()[s]
        x, hw = layers[0](x)
        for blk in list(layers)[1:]:
            if self.grad_checkpointing and torch.is_grad_enabled() and not torch.jit.is_scripting():
                x = torch.utils.checkpoint.checkpoint(blk, x, hw, use_reentrant=False)
            else:
                x = blk(x, hw)
        return x, hw

    def _to_map(self, s: int, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        g = self.nglos[s]
        return x[:, g:].transpose(1, 2).reshape(x.shape[0], -1, *hw)

    def _check_images(self, x: torch.Tensor) -> None:
        in_chans = self.layer1[0].proj.in_channels
        if x.dim() != 4 or x.shape[1] != in_chans:
            raise ValueError(f"{type(self).__name__}: expected images (B, {in_chans}, H, W) with {in_chans} input "
                             f"channels, got shape {tuple(x.shape)}")

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C_in, H, W) -> final normalised tokens (B, g + h*w, C) of the last stage."""
        self._check_images(x)
        hw = (x.shape[-2], x.shape[-1])
        for s in range(self.num_stages):
            if s:
                x = self._to_map(s - 1, x, hw)
            x, hw = self._stage(s, x)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        g = self.nglos[-1]
        if self.global_pool == "token" and g > 0:
            x = x[:, 0]
        else:
            x = x[:, g:].mean(dim=1) if self.global_pool == "avg" and g > 0 else x.mean(dim=1)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(self, x: torch.Tensor, indices: int | list[int] | None = None, norm: bool = False,
                              stop_early: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False):
        """Stage outputs as maps (B, C_s, h_s, w_s) (global tokens dropped)."""
        if output_fmt != "NCHW":
            raise ValueError(f"output_fmt must be 'NCHW', got {output_fmt!r}")
        self._check_images(x)
        take, max_index = feature_take_indices(self.num_stages, indices)
        last = max_index if stop_early else self.num_stages - 1
        inter = []
        hw = (x.shape[-2], x.shape[-1])
        for s in range(last + 1):
            if s:
                x = self._to_map(s - 1, x, hw)
            x, hw = self._stage(s, x)
            if s in take:
                y = self.norm(x) if norm and s == self.num_stages - 1 else x
                inter.append(self._to_map(s, y, hw))
        if intermediates_only:
            return inter
        return self.norm(x), inter

    def prune_intermediate_layers(self, indices: int | list[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        take, max_index = feature_take_indices(self.num_stages, indices)
        for s in range(max_index + 1, self.num_stages):
            setattr(self, f"layer{s + 1}", nn.Sequential())
        self.num_stages = max_index + 1
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0)
        return take


def remap_official(state_dict: dict, model: nn.Module) -> dict:
    """Official MsViT checkpoint -> this layout: unwrap `net` / `model`, strip `module.`, drop the recomputed
    `relative_position_index` buffers, and resize full-attention tables whose grid differs (bicubic, [ours])."""
    if "net" in state_dict and isinstance(state_dict["net"], dict):
        state_dict = state_dict["net"]
    if "model" in state_dict and isinstance(state_dict["model"], dict):
        state_dict = state_dict["model"]
    out = {}
    own = model.state_dict()
    for k, v in state_dict.items():
        k = k[len("module."):] if k.startswith("module.") else k
        if k.endswith("relative_position_index"):
            continue
        if k.endswith("local_relative_position_bias_table") and k in own and own[k].shape != v.shape:
            attn = model.get_submodule(k.rsplit(".", 1)[0])
            if isinstance(attn, ViLFullAttention):
                src = _grid_of_table(v.shape[0])
                v = resize_rel_table(v, src, attn.input_size)
        out[k] = v
    return out


def _grid_of_table(rows: int) -> tuple[int, int]:
    """Square grid (H, H) with (2H - 1)^2 == rows (official checkpoints are trained on square maps)."""
    side = (math.isqrt(rows) + 1) // 2
    if (2 * side - 1) ** 2 != rows:
        raise UserError(f"cannot infer the grid of a ViL relative-position table with {rows} rows")
    return side, side


def _cfg(**kwargs) -> dict:
    return {"url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None, "crop_pct": 0.875,
            "interpolation": "bicubic", "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
            "first_conv": "layer1.0.proj", "classifier": "head", "license": "mit",
            "origin_url": "https://github.com/NVIDIA/transformer-ls", "paper_ids": "arXiv:2107.02192", **kwargs}


default_cfgs = generate_default_cfgs({
    "vil_ls_micro": _cfg(input_size=(3, 32, 32), crop_pct=1.0, notes="tiny test/demo variant"),
    "vil_ls_medium.in1k": _cfg(notes="official weights: imagenet/README.md (Dropbox), convert with subquad convert"),
    "vil_ls_base.in1k": _cfg(notes="official weights: imagenet/README.md (Dropbox), convert with subquad convert"),
    "vil_ls_medium_384.in1k": _cfg(input_size=(3, 384, 384), crop_pct=0.875,
                                   notes="official weights: imagenet/README.md (Dropbox); eval crop_pct 0.875 as "
                                         "the official transform"),
    "vil_medium": _cfg(notes="softmax-attention host (baseline), no weights"),
    "vil_base": _cfg(notes="softmax-attention host (baseline), no weights"),
})


def _create(variant: str, pretrained: bool = False, **kwargs) -> ViLLS:
    if pretrained and not kwargs.get("pretrained_cfg_overlay"):
        raise UserError(f"{variant}: no weights are bundled; pass checkpoint_path=... or "
                        "pretrained_cfg_overlay=dict(file=...)")
    return build(ViLLS, variant, pretrained, remap=remap_official, default_out_indices=(0, 1, 2, 3), **kwargs)


_MEDIUM = dict(embed_dims=(96, 192, 384, 768), depths=(1, 4, 16, 1), num_heads=(3, 3, 6, 12),
               patch_sizes=(4, 2, 2, 2), nglos=(1, 1, 1, 0), window_sizes=(7, 7, 7, 7), ranks=(8, 8, 8, 8))
_BASE = {**_MEDIUM, "depths": (1, 8, 24, 1)}
_LS = ("long_short", "long_short", "full", "full")
_FULL = ("full", "full", "full", "full")


@register_model
def vil_ls_micro(pretrained: bool = False, **kwargs) -> ViLLS:
    args = dict(img_size=32, embed_dims=(16, 24, 32, 48), depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 2),
                patch_sizes=(4, 2, 2, 2), nglos=(1, 1, 1, 0), window_sizes=(2, 2, 2, 2), ranks=(2, 2, 2, 2),
                stage_attn=_LS)
    return _create("vil_ls_micro", pretrained, **{**args, **kwargs})


@register_model
def vil_ls_medium(pretrained: bool = False, **kwargs) -> ViLLS:
    return _create("vil_ls_medium", pretrained, **{**_MEDIUM, "stage_attn": _LS, **kwargs})


@register_model
def vil_ls_base(pretrained: bool = False, **kwargs) -> ViLLS:
    return _create("vil_ls_base", pretrained, **{**_BASE, "stage_attn": _LS, **kwargs})


@register_model
def vil_ls_medium_384(pretrained: bool = False, **kwargs) -> ViLLS:
    args = {**_MEDIUM, "window_sizes": (8, 8, 8, 8), "stage_attn": _LS, "img_size": 384}
    return _create("vil_ls_medium_384", pretrained, **{**args, **kwargs})


@register_model
def vil_medium(pretrained: bool = False, **kwargs) -> ViLLS:
    return _create("vil_medium", pretrained, **{**_MEDIUM, "stage_attn": _FULL, **kwargs})


@register_model
def vil_base(pretrained: bool = False, **kwargs) -> ViLLS:
    return _create("vil_base", pretrained, **{**_BASE, "stage_attn": _FULL, **kwargs})


_SRC = "seed 003 Table 5 + NVIDIA/transformer-ls imagenet/README.md"
_CODE = "NVIDIA/transformer-ls"
register_card(ModelCard("vil_ls_micro", "long_short", img_size=32, source="test/demo variant",
                        status="official-arch"))
register_card(ModelCard("vil_ls_medium", "long_short", 224, 39.8, 8.7, 83.8, _SRC, ref_params=39_799_423,
                        ref_gmacs=8.72, code=_CODE, notes="measured official MsViT @1527c5cc: 39.80M / 8.72G"))
register_card(ModelCard("vil_ls_base", "long_short", 224, 55.8, 13.4, 84.1, _SRC, ref_params=55_834_363,
                        ref_gmacs=13.39, code=_CODE, notes="measured official MsViT @1527c5cc: 55.83M / 13.39G"))
register_card(ModelCard("vil_ls_medium_384", "long_short", 384, 39.8, 28.7, 84.4, _SRC, ref_params=39_947_653,
                        ref_gmacs=28.74, code=_CODE, notes="measured official MsViT @1527c5cc: 39.95M / 28.74G "
                                                           "(full-attention RPB tables grow with resolution)"))
register_card(ModelCard("vil_medium", "long_short", 224, None, 8.7, 83.5, "seed 003 Table 5 (ViL-Medium)",
                        status="unofficial", code="",
                        notes="softmax-attention host; the published ViL-Medium uses Vision Longformer attention in "
                              "stages 1-2, so the published numbers are context, not a target"))
register_card(ModelCard("vil_base", "long_short", 224, None, 13.4, 83.7, "seed 003 Table 5 (ViL-Base)",
                        status="unofficial", code="",
                        notes="softmax-attention host; the published ViL-Base uses Vision Longformer attention in "
                              "stages 1-2, so the published numbers are context, not a target"))
