"""Global multi-head softmax attention (ViT / DeiT), the quadratic baseline every mechanism is compared with."""

from __future__ import annotations

import torch
from torch import nn

from .._shapes import check_heads, merge_heads
from . import register_attention
from .base import AttentionCaps, TokenMixer
from .functional.softmax import softmax_attention, softmax_attention_probs, softmax_attention_ref

__all__ = ["MultiHeadAttention"]


@register_attention("softmax")
class MultiHeadAttention(TokenMixer):
    """Global multi-head softmax attention through `F.scaled_dot_product_attention`.

    Shapes: x (B, N, C) -> (B, N, C); mask (B, N) bool, True = real token (keys only are masked).
    Paper: the quadratic baseline of all four seeds (softmax(QK^T / sqrt(d)) V).
    Official: timm `vision_transformer.Attention` layout (`qkv`, `proj`), as the DeiT checkpoints use.
    Symbols: h heads (num_heads), d head dim = C / h.

    Args:
        dim: channels C.
        num_heads: heads h.
        qkv_bias: bias on the qkv projection.
        attn_drop: dropout on the attention probabilities (training only).
        proj_drop: dropout after the output projection.
        input_size: accepted for interface uniformity; global attention ignores it.
        fused: use SDPA (True) or the explicit reference (False); both compute the same function.
        causal: query t attends to keys <= t only (language models).
    """

    caps = AttentionCaps(bidirectional=True, causal=True, needs_hw=False, supports_mask=True,
                         complexity="O(N^2)", sequence=True)

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0, input_size: tuple[int, int] | None = None, fused: bool = True,
                 causal: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = check_heads(dim, num_heads, "softmax attention")
        self.scale = self.head_dim ** -0.5
        self.fused = fused
        self.causal = causal
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)

    def _qkv(self, x: torch.Tensor):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return qkv.unbind(0)  # each (B, h, N, d)

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
        q, k, v = self._qkv(x)
        key_mask = self._mask(mask, x.shape[1], x.device)
        if self.fused and not (self.training and self.attn_drop.p > 0):
            o = softmax_attention(q, k, v, self.scale, key_mask)
        else:
            p = self.attn_drop(softmax_attention_probs(q, k, self.scale, key_mask))
            o = p @ v
        return self.proj_drop(self.proj(merge_heads(o)))

    def forward_ref(self, x: torch.Tensor, hw=None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Explicit reference of `forward` (materialises the N x N matrix)."""
        q, k, v = self._qkv(x)
        key_mask = self._mask(mask, x.shape[1], x.device)
        return self.proj(merge_heads(softmax_attention_ref(q, k, v, self.scale, key_mask)))

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw=None) -> torch.Tensor:
        """(B, N, C) -> (B, h, N, N) softmax probabilities (exact)."""
        q, k, _ = self._qkv(x)
        return softmax_attention_probs(q, k, self.scale, self._mask(None, x.shape[1], x.device))
