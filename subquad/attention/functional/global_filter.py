"""GFNet's global filter (Rao et al., "Global Filter Networks for Image Classification", arXiv 2107.00645, Sec. 3;
official raoyongming/GFNet `gfnet.py`, `GlobalFilter`): the rfft2 fast path and its dense float64 reference.

x: (B, N, C) tokens of an (H, W) grid; weight: the half-spectrum filter (H, W//2+1, C, 2) (real, imaginary); outputs
(B, N, C). The filter is a per-channel circular convolution with the impulse response `global_filter_kernel`.
The 1-D functions (`*_1d`) are the same filter over a token sequence (B, L, C) with weight (L//2+1, C, 2) (ours:
GFNet defines it on image grids).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..._shapes import map_to_tokens, tokens_to_map
from .structure_aware import relative_index

__all__ = ["global_filter_kernel", "global_filter_ref", "global_filter_fft", "global_filter_kernel_1d",
           "global_filter_1d_ref", "global_filter_1d_fft"]


def global_filter_kernel(weight: torch.Tensor, hw: Sequence[int]) -> torch.Tensor:
    """Token-domain kernel of a half-spectrum filter: (H, W//2+1, C, 2) -> (C, H, W), k = irfft2(W, s=hw).

    The GF output equals the circular convolution y[i] = sum_n k[(i - n) mod hw] x[n] per channel
    (the filter's impulse response, since rfft2 of a delta is all ones).
    """
    w = torch.view_as_complex(weight.contiguous()).permute(2, 0, 1)  # (C, H, W//2+1)
    return torch.fft.irfft2(w, s=tuple(hw))


def global_filter_ref(x: torch.Tensor, weight: torch.Tensor, hw: Sequence[int]) -> torch.Tensor:
    """Dense reference: per-channel circulant matrices M_c[i, n] = k_c[(i - n) mod hw] applied to x.

    Shapes: x (B, N, C); weight (H, W//2+1, C, 2) -> (B, N, C).
    """
    k = global_filter_kernel(weight, hw).flatten(1)  # (C, N)
    # relative_index gives delta = n - i mod hw; convolution needs i - n = the transpose.
    m = k[:, relative_index(hw, "circular", x.device).T]  # (C, N_i, N_n)
    return torch.einsum("cin,bnc->bic", m, x)


def global_filter_fft(x: torch.Tensor, weight: torch.Tensor, hw: Sequence[int]) -> torch.Tensor:
    """GFNet GlobalFilter: irfft2(rfft2(x, ortho) * W, ortho) over the token grid.

    Shapes: x (B, N, C); weight (H, W//2+1, C, 2) -> (B, N, C).
    """
    xm = tokens_to_map(x, hw)  # (B, C, H, W)
    w = torch.view_as_complex(weight.contiguous()).permute(2, 0, 1)  # (C, H, W//2+1)
    y = torch.fft.irfft2(torch.fft.rfft2(xm, norm="ortho") * w, s=tuple(hw), norm="ortho")
    return map_to_tokens(y)


def global_filter_kernel_1d(weight: torch.Tensor, length: int) -> torch.Tensor:
    """Token-domain kernel of a 1-D half-spectrum filter: (L//2+1, C, 2) -> (C, L), k = irfft(W, n=L)."""
    w = torch.view_as_complex(weight.contiguous()).transpose(0, 1)  # (C, L//2+1)
    return torch.fft.irfft(w, n=length)


def global_filter_1d_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Dense reference of the 1-D filter: per-channel circulant matrices M_c[i, n] = k_c[(i - n) mod L].

    Shapes: x (B, L, C); weight (L//2+1, C, 2) -> (B, L, C).
    """
    L = x.shape[1]
    k = global_filter_kernel_1d(weight, L)  # (C, L)
    i = torch.arange(L, device=x.device)
    m = k[:, (i[:, None] - i[None, :]) % L]  # (C, L_i, L_n)
    return torch.einsum("cin,bnc->bic", m, x)


def global_filter_1d_fft(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The global filter over a token sequence: irfft(rfft(x, ortho) * W, ortho) along the tokens.

    Shapes: x (B, L, C); weight (L//2+1, C, 2) -> (B, L, C).
    """
    w = torch.view_as_complex(weight.contiguous())  # (L//2+1, C)
    return torch.fft.irfft(torch.fft.rfft(x, dim=1, norm="ortho") * w, n=x.shape[1], dim=1, norm="ortho")
