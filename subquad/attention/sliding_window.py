"""Causal sliding-window softmax attention over 1-D sequences ("sliding_window"): each query attends to the last
w tokens (itself included). The short-term half of Transformer-LS on its own, its window-only ablation.

Paper: Transformer-LS (arXiv 2107.02192), Sec. 3.1 (short-term attention via segment-wise sliding window) and the
window-only rows of its ablations; the sliding-window pattern as in Longformer (Beltagy et al. 2020,
arXiv 2004.05150, Sec. 3.1, with a one-sided causal window).
"""

from __future__ import annotations

import torch
from torch import nn

from .._shapes import check_heads, merge_heads, split_packed_heads
from ..layers.init import init_linears_
from .base import AttentionCaps, TokenMixer
from .functional.softmax import (
    causal_band_mask,
    sliding_window_attention,
    sliding_window_attention_ref,
    softmax_attention_probs,
)
from .registry import register_attention

__all__ = ["SlidingWindowAttention"]


@register_attention("sliding_window")
class SlidingWindowAttention(TokenMixer):
    """Causal multi-head softmax attention over the last `window_size` tokens.

    out_t = softmax_{t - w < j <= t}(q_t . k_j / sqrt(d)) v_j. No positions of its own (a host adds them).

    Shapes: x (B, T, C) -> (B, T, C); no masks (right padding never changes earlier outputs).
    Symbols: w window_size, h heads, d = C / h.

    Args:
        dim: channels C.
        num_heads: heads h.
        window_size: w >= 1 (default 128); w >= T is full causal softmax.
        causal: must be True (the mechanism is causal only; the argument exists for `build_attention(...,
            causal=True)`).
        qkv_bias: bias on `qkv`.
        proj_drop: dropout after the output projection.
        input_size: accepted for interface uniformity; ignored.
        fused: blocked SDPA path (True) or the dense band-masked reference (False).
        block: query block of the fast path (default max(w, 16); speed only).
    """

    caps = AttentionCaps(bidirectional=False, causal=True, needs_hw=False, supports_mask=False,
                         complexity="O(N w)", sequence=True, notes="causal only; the window-only ablation")

    def __init__(self, dim: int, num_heads: int = 8, window_size: int = 128, causal: bool = True,
                 qkv_bias: bool = True, proj_drop: float = 0.0, input_size: tuple[int, int] | None = None,
                 fused: bool = True, block: int | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        who = "sliding_window attention"
        if not causal:
            raise ValueError(f"{who}: causal only; causal=False is not supported (use 'softmax' or 'long_short' "
                             "for a bidirectional encoder)")
        if not isinstance(window_size, int) or window_size < 1:
            raise ValueError(f"{who}: window_size must be an int >= 1, got {window_size!r}")
        if block is not None and (not isinstance(block, int) or block < 1):
            raise ValueError(f"{who}: block must be an int >= 1 or None, got {block!r}")
        self.dim, self.num_heads = dim, num_heads
        self.head_dim = check_heads(dim, num_heads, who)
        self.scale = self.head_dim ** -0.5
        self.window_size, self.fused, self.block = window_size, fused, block
        self.causal = True
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        if not self.qkv.weight.is_meta:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        init_linears_(self.qkv, self.proj)

    def _qkv(self, x: torch.Tensor):
        return split_packed_heads(self.qkv(x), 3, self.num_heads)  # each (B, h, T, d)

    def _run(self, x: torch.Tensor, mask, fused: bool) -> torch.Tensor:
        self._check_input(x, None, mask)
        q, k, v = self._qkv(x)
        if fused:
            o = sliding_window_attention(q, k, v, self.window_size, self.scale, self.block)
        else:
            o = sliding_window_attention_ref(q, k, v, self.window_size, self.scale)
        return self.proj_drop(self.proj(merge_heads(o)))

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        return self._run(x, mask, self.fused)

    def forward_ref(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
        """Dense reference of `forward` (explicit (T, T) band mask)."""
        return self._run(x, mask, False)

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw: tuple[int, int] | None = None) -> torch.Tensor:
        """(B, T, C) -> (B, h, T, T): the banded lower-triangular softmax probabilities (exact)."""
        q, k, _ = self._qkv(x)
        return softmax_attention_probs(q, k, self.scale, causal_band_mask(x.shape[1], self.window_size, x.device))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, window_size={self.window_size}"
