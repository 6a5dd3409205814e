"""GFNet's global filter (Rao et al., "Global Filter Networks for Image Classification", arXiv 2107.00645, Sec. 3;
official raoyongming/GFNet `gfnet.py`, `GlobalFilter`): the rfft2 fast path and its dense float64 reference.

x: (B, N, C) tokens of an (H, W) grid; weight: the half-spectrum filter (H, W//2+1, C, 2) (real, imaginary); outputs
(B, N, C). The filter is a per-channel circular convolution with the impulse response `global_filter_kernel`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..._shapes import map_to_tokens, tokens_to_map
from .structure_aware import relative_index

__all__ = ["global_filter_kernel", "global_filter_ref", "global_filter_fft"]


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
