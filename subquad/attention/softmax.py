"""Global multi-head softmax attention (ViT / DeiT), the quadratic baseline every mechanism is compared with, and its
PVT / PVTv2 spatial-reduction forms (keys and values from a reduced map)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from .._shapes import check_heads, check_hw, map_to_tokens, merge_heads, split_heads, split_packed_heads, tokens_to_map
from .base import AttentionCaps, TokenMixer
from .functional.rotary import rotary, rotary_ref
from .functional.softmax import (
    adaptive_pool_2d,
    adaptive_pool_matrix,
    patch_mean_matrix,
    softmax_attention,
    softmax_attention_probs,
    softmax_attention_ref,
    spatial_reduction_ref,
)
from .registry import register_attention

__all__ = ["MultiHeadAttention"]


@register_attention("softmax")
class MultiHeadAttention(TokenMixer):
    """Global multi-head softmax attention through `F.scaled_dot_product_attention`.

    Shapes: x (B, N, C) -> (B, N, C); mask (B, N) bool, True = real token (keys only are masked).
    Paper: the quadratic baseline of all four seeds (softmax(QK^T / sqrt(d)) V).
    Official: timm `vision_transformer.Attention` layout (`qkv`, `proj`), as the DeiT checkpoints use; with spatial
        reduction PVT `pvt.py` `Attention` (`q`, `kv`, `sr`, `norm`, `proj`) and PVTv2 `pvt_v2.py` `Attention`
        (`linear=True`: `pool`, `sr`, `norm`, `act`), whose layouts the FLatten PVT checkpoints share.
    Symbols: h heads (num_heads), d head dim = C / h, R spatial-reduction ratio (PVT paper R_i), n key tokens.

    Spatial reduction (PVT, `sr_ratio` > 1): keys and values come from LN(Conv2d_{k=s=R}(x map)), n = (H // R) *
    (W // R) (a remainder row/column is dropped, as the strided conv does; H and W must be >= R). PVTv2's pooled form
    (`linear_sr=True`): LN(Conv1x1(AdaptiveAvgPool2d(pool_size)(x map))) then GELU, n = pool_size^2 at any map size.
    Both need hw; neither supports masks or the causal mode.

    Args:
        dim: channels C.
        num_heads: heads h.
        qkv_bias: bias on the qkv projection.
        attn_drop: dropout on the attention probabilities (training only).
        proj_drop: dropout after the output projection.
        input_size: accepted for interface uniformity; global attention ignores it.
        fused: use SDPA (True) or the explicit reference (False); both compute the same function.
        causal: query t attends to keys <= t only (language models).
        sr_ratio: PVT spatial-reduction ratio R (1: none, layout `qkv`; > 1: layout `q`, `kv`, `sr`, `norm`).
        linear_sr: PVTv2 pooled reduction (layout `q`, `kv`, `sr` 1x1, `norm`, `act`; `sr_ratio` is then unused).
        pool_size: output side of the PVTv2 pooling.
        rope: rotary position embedding on q and k (RoFormer, arXiv 2104.09864; `functional/rotary.py`): scores
            depend on relative positions only, and a host adds no absolute positions (`caps.relative_positions`).
            Needs an even head dim; not with spatial reduction.
        rope_base: the rotary frequency base.
    """

    caps = AttentionCaps(bidirectional=True, causal=True, needs_hw=False, supports_mask=True,
                         complexity="O(N^2)", sequence=True, grid_ndims=(2, 3))

    @classmethod
    def stage_kwargs(cls, stage: dict) -> dict:
        """PVT's spatial-reduction attention takes the host's `sr_ratio` (keys and values on a map reduced by it)."""
        kw = super().stage_kwargs(stage)
        if stage.get("sr_ratio", 1) > 1 or kw.get("linear_sr"):
            kw["sr_ratio"] = stage.get("sr_ratio", 1)
        return kw

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, input_size: tuple[int, int] | None = None, fused: bool = True,
                 causal: bool = False, sr_ratio: int = 1, linear_sr: bool = False, pool_size: int = 7,
                 rope: bool = False, rope_base: float = 10000.0, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = check_heads(dim, num_heads, "softmax attention")
        self.scale = self.head_dim ** -0.5
        self.fused = fused
        self.causal = causal
        if not isinstance(sr_ratio, int) or sr_ratio < 1:
            raise ValueError(f"softmax attention: sr_ratio must be an int >= 1, got {sr_ratio!r}")
        if linear_sr and (not isinstance(pool_size, int) or pool_size < 1):
            raise ValueError(f"softmax attention: pool_size must be an int >= 1, got {pool_size!r}")
        self.sr_ratio = sr_ratio
        self.linear_sr = bool(linear_sr)
        self.pool_size = pool_size
        self.reduces = sr_ratio > 1 or self.linear_sr
        if self.reduces and causal:
            raise ValueError("softmax attention: causal=True cannot be combined with spatial reduction "
                             f"(sr_ratio={sr_ratio}, linear_sr={linear_sr})")
        self.rope, self.rope_base = bool(rope), float(rope_base)
        if self.rope and (self.reduces or self.head_dim % 2):
            raise ValueError(f"softmax attention: rope=True needs an even head dim and no spatial reduction, got head "
                             f"dim {self.head_dim}, sr_ratio={sr_ratio}, linear_sr={linear_sr}")
        if self.rope:
            self.caps = dataclasses.replace(type(self).caps, relative_positions=True)
        if self.reduces:
            # Spatial reduction needs the grid and has neither masks nor a causal mode.
            self.caps = dataclasses.replace(type(self).caps, supports_mask=False, causal=False, needs_hw=True,
                                            sequence=False)
            self.q = nn.Linear(dim, dim, bias=qkv_bias, **dd)
            self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias, **dd)
            if self.linear_sr:
                self.pool = nn.AdaptiveAvgPool2d(pool_size)
                self.sr = nn.Conv2d(dim, dim, 1, 1, **dd)
                self.norm = nn.LayerNorm(dim, **dd)
                self.act = nn.GELU()
            else:
                self.sr = nn.Conv2d(dim, dim, sr_ratio, sr_ratio, **dd)
                self.norm = nn.LayerNorm(dim, **dd)
        else:
            self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)

    def _reduced_tokens(self, x: torch.Tensor, hw: tuple[int, int], explicit: bool = False) -> torch.Tensor:
        """(B, N, C) -> (B, n, C): the key/value source of the PVT / PVTv2 reduction (explicit: reference math)."""
        xm = tokens_to_map(x, hw)  # (B, C, H, W)
        if self.linear_sr:
            if explicit:
                pool = adaptive_pool_matrix(hw, (self.pool_size, self.pool_size), x.device, x.dtype)  # (n, N)
                pooled = torch.einsum("mn,bnc->bmc", pool, x)  # (B, n, C)
                w = self.sr.weight[:, :, 0, 0]
                t = pooled @ w.t() + self.sr.bias
            else:
                t = map_to_tokens(self.sr(adaptive_pool_2d(xm, self.pool.output_size)))
            return self.act(self.norm(t))
        if explicit:
            t = spatial_reduction_ref(xm, self.sr.weight, self.sr.bias, self.sr_ratio)
        else:
            t = map_to_tokens(self.sr(xm))
        return self.norm(t)

    def _check_reduction(self, x: torch.Tensor, hw, mask: torch.Tensor | None) -> tuple[int, int]:
        who = f"{type(self).__name__} ('softmax', sr_ratio={self.sr_ratio}, linear_sr={self.linear_sr})"
        if mask is not None:
            raise ValueError(f"{who}: key-padding masks are not supported with spatial reduction; pass mask=None")
        H, W = check_hw(x, hw, who)
        if not self.linear_sr and min(H, W) < self.sr_ratio:
            raise ValueError(f"{who}: map hw={H}x{W} is smaller than sr_ratio={self.sr_ratio}")
        return H, W

    def _qkv(self, x: torch.Tensor, hw: tuple[int, int] | None = None, explicit: bool = False):
        if self.reduces:
            kv_src = self._reduced_tokens(x, hw, explicit)  # (B, n, C)
            k, v = split_packed_heads(self.kv(kv_src), 2, self.num_heads)  # (B, h, n, d) each
            return split_heads(self.q(x), self.num_heads), k, v
        q, k, v = split_packed_heads(self.qkv(x), 3, self.num_heads)
        if self.rope:
            rot = rotary_ref if explicit else rotary
            q, k = rot(q, self.rope_base), rot(k, self.rope_base)
        return q, k, v  # each (B, h, N, d)

    def _mask(self, mask: torch.Tensor | None, N: int, device: torch.device) -> torch.Tensor | None:
        """Key-padding mask (B, N) and the causal band merged into a bool mask broadcastable to (B, h, N, N)."""
        key_mask = None if mask is None else mask[:, None, None, :]  # (B, 1, 1, N)
        if self.causal:
            band = torch.ones(N, N, dtype=torch.bool, device=device).tril()  # (N, N)
            key_mask = band if key_mask is None else key_mask & band
        return key_mask

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        self._check_input(x, hw, mask)
        if self.reduces:
            hw = self._check_reduction(x, hw, mask)
        q, k, v = self._qkv(x, hw)
        key_mask = self._mask(mask, x.shape[1], x.device)
        if self.fused and not (self.training and self.attn_drop.p > 0):
            o = softmax_attention(q, k, v, self.scale, key_mask)
        else:
            p = self.attn_drop(softmax_attention_probs(q, k, self.scale, key_mask))
            o = p @ v
        return self.proj_drop(self.proj(merge_heads(o)))

    def forward_ref(self, x: torch.Tensor, hw=None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Explicit reference of `forward` (materialises the N x n matrix; the reductions as explicit patch / bin
        averages)."""
        if self.reduces:
            hw = self._check_reduction(x, hw, mask)
        q, k, v = self._qkv(x, hw, explicit=True)
        key_mask = self._mask(mask, x.shape[1], x.device)
        return self.proj(merge_heads(softmax_attention_ref(q, k, v, self.scale, key_mask)))

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw=None) -> torch.Tensor:
        """(B, N, C) -> (B, h, N, N) softmax probabilities (exact without spatial reduction).

        With spatial reduction the probabilities over the n reduced keys are spread back over the tokens that form
        each key: A = P M with M (n, N) the patch mean (PVT) or the adaptive-pool bins (PVTv2). This is exact for
        which tokens each query reads from, approximate in treating each reduced key as the mean of its tokens (the
        learned conv and LN are not linear averages). Rows sum to 1.
        """
        if self.reduces:
            hw = self._check_reduction(x, hw, None)
            q, k, _ = self._qkv(x, hw)
            p = softmax_attention_probs(q, k, self.scale)  # (B, h, N, n)
            if self.linear_sr:
                m = adaptive_pool_matrix(hw, (self.pool_size, self.pool_size), x.device, p.dtype)
            else:
                m = patch_mean_matrix(hw, self.sr_ratio, x.device, p.dtype)
            return p @ m
        q, k, _ = self._qkv(x)
        return softmax_attention_probs(q, k, self.scale, self._mask(None, x.shape[1], x.device))
