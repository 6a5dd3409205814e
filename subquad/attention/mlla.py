"""Mamba-like linear attention (`"mlla"`), the token mixer of MLLA (Han et al., NeurIPS 2024, arXiv 2405.16605).

The paper reads Mamba's selective scan as a linear attention and keeps the two designs that matter in vision (the
forget gate, here replaced by positional encodings, and Mamba's block design). Its attention is a plain linear
attention with ELU+1 kernels, a 2-D rotary position embedding (RoPE) on the numerator only, the token-mean
normaliser and LePE; it has no value and no output projection: the values are the mixer's input itself, and the
MLLA block (`subquad/models/mlla.py`) owns the input projection, the 3x3 depthwise convolution, the SiLU gate and
the output projection. The math and its dense float64 reference are in `functional/mlla.py`.
"""

from __future__ import annotations

import torch
from torch import nn

from .._shapes import check_heads
from ..errors import UserError
from ..layers.init import init_linears_
from ..layers.precision import fp32_island
from .base import AttentionCaps, TokenMixer
from .functional.mlla import mlla_attention, mlla_attention_matrix, mlla_attention_ref
from .registry import register_attention

__all__ = ["MllaAttention"]


@register_attention("mlla")
class MllaAttention(TokenMixer):
    """MLLA linear attention with 2-D RoPE and LePE (official `LinearAttention`).

    Shapes: x (B, N, C) with hw=(H, W), N = H * W -> (B, N, C).
    Paper: Han et al., "Demystify Mamba in Vision: A Linear Attention Perspective" (arXiv 2405.16605): the MLLA
        model (renamed MILA in the final version), its linear attention with RoPE and LePE.
    Official: LeapLabTHU/MLLA `models/mlla.py` (`LinearAttention`, `RoPE`): parameter names `qk` (one Linear for
        q and k) and `lepe` (depthwise 3x3) are the official ones; the official `rope.rotations` buffer is not kept
        (the angles are built for the grid of each call, so any H x W works; the official code fixes the grid at
        construction and assumes a square one).
    Symbols: phi = elu + 1, h heads, d = C / h, R_i the 2-D RoPE rotation of token i, eps = 1e-6.

    Args:
        dim: channels C (a multiple of 4 and of num_heads).
        num_heads: heads h.
        input_size: construction grid; accepted for interface uniformity (nothing is sized by it).
        qkv_bias: bias of `qk` (official True).
        rope_base: RoPE base (official 10000).
        eps: denominator offset (official 1e-6).
        fused: keys-first product (True) or the dense N x N reference (False).
    """

    caps = AttentionCaps(bidirectional=True, causal=False, needs_hw=True, supports_mask=False, complexity="O(N)",
                         sequence=False,
                         notes="MLLA; 2-D RoPE and 3x3 LePE need the (H, W) grid: no 1-D form (none in the paper "
                               "or the official code)")

    def __init__(self, dim: int, num_heads: int = 8, input_size: tuple[int, int] | int | None = None,
                 qkv_bias: bool = True, rope_base: float = 10000.0, eps: float = 1e-6, fused: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.head_dim = check_heads(dim, num_heads, "mlla attention")
        if dim % 4:
            raise UserError(f"mlla attention: dim={dim} must be a multiple of 4 (the 2-D RoPE rotates C/4 channel "
                            "pairs by the row and C/4 by the column)")
        self.dim, self.num_heads, self.fused = dim, num_heads, fused
        self.rope_base, self.eps = float(rope_base), float(eps)
        self.qk = nn.Linear(dim, 2 * dim, bias=qkv_bias, **dd)
        self.lepe = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, **dd)
        if not self.qk.weight.is_meta:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Official init: `qk` trunc_normal(0.02) with zero bias (the model's `_init_weights`); `lepe` PyTorch's."""
        init_linears_(self.qk)
        self.lepe.reset_parameters()

    def _run(self, x: torch.Tensor, hw: tuple[int, int], fused: bool) -> torch.Tensor:
        B, N, C = x.shape
        q, k = self.qk(x).reshape(B, N, 2, C).unbind(2)  # (B, N, C) each
        fn = mlla_attention if fused else mlla_attention_ref
        return fp32_island(fn, q, k, x, self.lepe.weight, self.lepe.bias, hw=tuple(hw), num_heads=self.num_heads,
                           eps=self.eps, base=self.rope_base)

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        hw = self._check_input(x, hw, mask)
        return self._run(x, hw, self.fused)

    def forward_ref(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
        """Dense reference of `forward` (explicit rotations, N x N matrix, LePE as shifts)."""
        hw = self._check_input(x, hw, mask)
        return self._run(x, hw, False)

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw: tuple[int, int] | None = None) -> torch.Tensor:
        """(B, N, C) -> (B, h, N, N): the attention term's matrix A (out_head = A @ x_head + LePE(x)); the LePE
        (a different 3x3 filter per channel) is added as the banded matrix of the head's mean filter."""
        hw = self._check_input(x, hw)
        B, N, C = x.shape
        q, k = self.qk(x).reshape(B, N, 2, C).unbind(2)
        a = mlla_attention_matrix(q, k, hw, self.num_heads, self.eps, self.rope_base)
        w = self.lepe.weight[:, 0].reshape(self.num_heads, self.head_dim, 3, 3).mean(1)  # (h, 3, 3)
        H, W = hw
        rows, cols = torch.arange(N, device=x.device) // W, torch.arange(N, device=x.device) % W
        dr = rows[None, :] - rows[:, None] + 1  # tap of key j for query i
        dc = cols[None, :] - cols[:, None] + 1
        inside = (dr >= 0) & (dr < 3) & (dc >= 0) & (dc < 3)
        band = torch.where(inside, w[:, dr.clamp(0, 2), dc.clamp(0, 2)], torch.zeros((), dtype=w.dtype))
        return a + band.unsqueeze(0).to(a.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, rope_base={self.rope_base:g}"
