"""The "host_qkv" forms of mechanisms whose main module projects q, k, v itself: softmax and CSwin.

A host that projects q, k, v (CSwin's block-level `qkv`, CvT's convolutional projections) builds a mechanism with
`build_attention(name, dim, heads, ..., host_qkv=True)`, calls `forward_qkv(q, k, v, hw, x=None)` and projects the
(B, N, C) result itself; the form owns what the mechanism adds to the projections and nothing else. long_short
and focused_linear register theirs next to their main classes.
"""

from __future__ import annotations

import torch
from torch import nn

from .._shapes import as_hw, check_heads, merge_heads, split_heads, tracing
from .base import AttentionCaps, TokenMixer
from .cswin import CSWinAttention, LePEAttention, cswin_branches
from .functional.softmax import softmax_attention
from .registry import register_attention_form

__all__ = ["SoftmaxCore", "CSWinStripes"]


@register_attention_form("softmax", "host_qkv")
class SoftmaxCore(TokenMixer):
    """Multi-head softmax attention on the host's q (B, N, C) and k, v (B, n, C); no parameters.

    Keys and values may be fewer than the queries (n <= N): a host with convolutional projections reduces them with
    stride `conv_kv_stride` = 2, CvT's rule for its softmax attention (CvT, arXiv 2103.15808, Sec. 3.2, "squeezed"
    key/value projection), and prepends its class tokens to both.

    Shapes: forward_qkv(q, k, v, hw=None, x=None) -> (B, N, C), heads merged.
    Args:
        dim, num_heads: C and h.
        attn_drop: dropout on the probabilities (training only; then the explicit product replaces SDPA).
        input_size: accepted for interface uniformity.
    """

    caps = AttentionCaps(bidirectional=True, causal=False, needs_hw=False, supports_mask=False, complexity="O(N n)")
    conv_kv_stride = 2

    def __init__(self, dim: int, num_heads: int = 8, attn_drop: float = 0.0,
                 input_size: tuple[int, int] | None = None, device=None, dtype=None) -> None:
        super().__init__()
        self.dim, self.num_heads = dim, num_heads
        self.head_dim = check_heads(dim, num_heads, "softmax attention (host_qkv)")
        self.scale = self.head_dim ** -0.5
        self.attn_drop = attn_drop

    def forward(self, x: torch.Tensor, hw=None, mask=None) -> torch.Tensor:
        raise ValueError("softmax attention built with host_qkv=True has no projections; call forward_qkv(q, k, v)")

    def forward_qkv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: tuple[int, int] | None = None,
                    x: torch.Tensor | None = None) -> torch.Tensor:
        h = self.num_heads
        p = self.attn_drop if self.training else 0.0
        if p:
            probs = ((split_heads(q, h) * self.scale) @ split_heads(k, h).transpose(-2, -1)).softmax(-1)
            o = nn.functional.dropout(probs, p) @ split_heads(v, h)
        else:
            o = softmax_attention(split_heads(q, h), split_heads(k, h), split_heads(v, h), self.scale)
        return merge_heads(o)


def _packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """(B, N, 3, C) holding q, k, v: a view when they are the unbound slices of one packed projection (the CSwin
    block's `qkv(x).view(B, N, 3, C).unbind(2)`), else a stacked copy (same values)."""
    B, N, C = q.shape
    step = C * q.element_size()
    if tracing() or q.device.type == "meta":  # no storage to compare (fake / meta tensors): copy in the graph
        return torch.stack([q, k, v], dim=2)
    if (q.stride() == k.stride() == v.stride() == (N * 3 * C, 3 * C, 1)
            and k.data_ptr() == q.data_ptr() + step and v.data_ptr() == q.data_ptr() + 2 * step):
        return q.as_strided((B, N, 3, C), (N * 3 * C, 3 * C, C, 1))
    return torch.stack([q, k, v], dim=2)


@register_attention_form("cswin", "host_qkv")
class CSWinStripes(TokenMixer, nn.ModuleList):
    """CSwin's stripe branches on the host's q, k, v (the FLatten-CSwin block owns `qkv` and `proj`): two
    `LePEAttention` branches (vertical `0`, horizontal `1`; h / 2 heads on C / 2 channels each) or one global
    branch in the last stage / when the construction grid equals (sw, sw) (the official rule). A ModuleList, so
    the branches keep the official keys `attns.{0,1}.get_v` when the host stores this module as `attns`.

    Shapes: forward_qkv(q, k, v, hw) with q, k, v (B, H * W, C) -> (B, H * W, C), no projection.
    Official: LeapLabTHU/FLatten-Transformer `models/flatten_cswin.py` `CSWinBlock` / `LePEAttention`.
    Args:
        dim, num_heads: C and h (even for two branches).
        split_size: stripe width sw.
        last_stage: one global branch.
        attn_drop: dropout on the probabilities (training only).
        input_size: construction grid (the single-branch rule).
        fused: SDPA fast path (True) or the dense reference (False).
    """

    caps = CSWinAttention.caps

    def __init__(self, dim: int, num_heads: int = 8, split_size: int = 7, last_stage: bool = False,
                 attn_drop: float = 0.0, input_size: tuple[int, int] | None = None, fused: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.dim, self.num_heads = dim, num_heads
        if input_size is not None and as_hw(input_size, "input_size") == (split_size, split_size):
            last_stage = True
        if last_stage:
            self.append(LePEAttention(dim, num_heads, -1, split_size, attn_drop, fused, **dd))
        else:
            if num_heads % 2:
                raise ValueError(f"cswin attention: two stripe branches need an even num_heads, got {num_heads} "
                                 "(or use last_stage=True)")
            for i in range(2):
                self.append(LePEAttention(dim // 2, num_heads // 2, i, split_size, attn_drop, fused, **dd))

    def forward(self, x: torch.Tensor, hw=None, mask=None) -> torch.Tensor:
        raise ValueError("cswin attention built with host_qkv=True has no projections; call forward_qkv(q, k, v, hw)")

    def forward_qkv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: tuple[int, int],
                    x: torch.Tensor | None = None, ref: bool = False) -> torch.Tensor:
        return cswin_branches(self, _packed(q, k, v), hw, ref=ref)
