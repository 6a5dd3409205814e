"""Linear-angular attention (`"linear_angular"`), the Castling-ViT baseline of FLatten Table 3.

Castling-ViT (You et al., CVPR 2023, arXiv 2211.10526, Sec. 3) measures the similarity of a query and a key by the
angle between them, sim(q, k) = 1 - arccos(q^ . k^) / pi with q^ = q / |q|, and keeps the first-order Taylor term
of arccos around 0, 1/2 + q^ . k^ / pi, so that the product can be taken keys-first in O(N d^2). The official module
(GATECH-EIC/Castling-ViT, `castling-vit.py`, `LinAngularAttention` with `sparse_reg=False`, its inference form)
computes, per head,

    x_i = 1/2 v_i + (1/pi) q^_i (sum_j k^_j^T v_j),     out_i = x_i / |x_i| + DWConv(v)_i,

i.e. the constant term of the kernel keeps the token's own value (not a sum over keys), no row normalisation by a
denominator, an L2 normalisation of each output row instead, and a depthwise convolution of the values along the
token axis (kernel `res_kernel_size` x 1, one filter per head shared by its channels, zero padding). This module
follows that code. The training-time softmax auxiliary (`sparse_reg=True`) is not implemented (see
docs/deviations.md). The core and its dense float64 reference are in `functional/linear_angular.py`.
"""

from __future__ import annotations

import torch
from torch import nn

from .._shapes import check_heads, merge_heads, split_packed_heads
from ..layers.init import init_linears_
from .base import AttentionCaps, TokenMixer
from .functional.linear_angular import linear_angular, linear_angular_matrix, linear_angular_ref
from .registry import register_attention

__all__ = ["LinearAngularAttention"]


@register_attention("linear_angular")
class LinearAngularAttention(TokenMixer):
    """Castling-ViT linear-angular attention (inference form) with its depthwise value convolution.

    Shapes: x (B, N, C) -> (B, N, C).
    Paper: You et al., "Castling-ViT", CVPR 2023 (arXiv 2211.10526), Sec. 3; a baseline of FLatten Transformer
        (arXiv 2308.00442) Table 3.
    Official: GATECH-EIC/Castling-ViT, castling-vit.py (`LinAngularAttention`): parameter names `qkv`, `proj` and
        `dconv` (Conv2d(h, h, (res_kernel_size, 1), groups=h, bias=False) over (B, h, N, d)) are the official ones.
    Symbols: h heads, d = C / h, q^ = q / |q|.

    Args:
        dim: channels C.
        num_heads: heads h.
        qkv_bias: bias on `qkv` (official default False).
        res_kernel_size: taps of the value convolution along the token axis (official 9; odd).
        eps: clamp of every L2 norm (the official code divides by the bare norm).
        input_size: accepted for interface uniformity; ignored (the convolution runs over the token order).
        fused: keys-first product (True) or the dense N x N reference (False).
    """

    caps = AttentionCaps(bidirectional=True, causal=False, needs_hw=False, supports_mask=False, complexity="O(N)",
                         sequence=True, grid_ndims=(2, 3),
                         notes="Castling-ViT angular kernel, first-order; value DWConv on tokens")

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, res_kernel_size: int = 9,
                 eps: float = 1e-6, input_size: tuple[int, int] | None = None, proj_drop: float = 0.0,
                 fused: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.head_dim = check_heads(dim, num_heads, "linear-angular attention")
        if not isinstance(res_kernel_size, int) or res_kernel_size < 1 or res_kernel_size % 2 == 0:
            raise ValueError(f"linear-angular attention: res_kernel_size must be an odd int >= 1, got "
                             f"{res_kernel_size!r}")
        self.dim, self.num_heads, self.eps, self.fused = dim, num_heads, float(eps), fused
        self.res_kernel_size = res_kernel_size
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.dconv = nn.Conv2d(num_heads, num_heads, (res_kernel_size, 1), padding=(res_kernel_size // 2, 0),
                               groups=num_heads, bias=False, **dd)
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        if not self.qkv.weight.is_meta:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        init_linears_(self.qkv, self.proj)
        self.dconv.reset_parameters()

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return split_packed_heads(self.qkv(x), 3, self.num_heads)  # (B, h, N, d) each

    def _run(self, x: torch.Tensor, fused: bool) -> torch.Tensor:
        q, k, v = self._qkv(x)
        core = linear_angular if fused else linear_angular_ref
        o = core(q, k, v, self.eps) + self.dconv(v)
        return self.proj_drop(self.proj(merge_heads(o)))

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        self._check_input(x, hw, mask)
        return self._run(x, self.fused)

    def forward_ref(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
        """Dense reference of `forward` (explicit N x N kernel matrix)."""
        self._check_input(x, hw, mask)
        return self._run(x, False)

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw: tuple[int, int] | None = None) -> torch.Tensor:
        """(B, N, C) -> (B, h, N, N) matrix P with the pre-projection output = P @ v, exactly for this x: the
        kernel rows scaled by the row normalisation (which depends on v), plus the banded value convolution."""
        q, k, v = self._qkv(x)
        a = linear_angular_matrix(q, k, self.eps)
        scale = 1.0 / (a @ v).norm(dim=-1, keepdim=True).clamp_min(self.eps)
        N, r = x.shape[1], self.res_kernel_size // 2
        w = self.dconv.weight[:, 0, :, 0]  # (h, taps): out_i = sum_t w[t] v_{i + t - r}
        idx = torch.arange(N, device=x.device)
        off = idx[None, :] - idx[:, None] + r  # tap index of key j for query i
        band = torch.where((off >= 0) & (off < self.res_kernel_size),
                           w[:, off.clamp(0, self.res_kernel_size - 1)], torch.zeros((), dtype=w.dtype))
        return a * scale + band.unsqueeze(0)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, res_kernel_size={self.res_kernel_size}"

