"""Discrete Fourier transforms over trailing grid axes in real arithmetic: matrix products with cos/sin tables.

For graphs whose runtime has no complex tensors (ONNX: its exporter has no complex-valued `unsqueeze`, `complex`,
`view_as_real`, ...): a complex tensor is a pair (re, im) of real tensors, and each axis of the transform is one
matrix product. An axis of F points costs O(F) per output instead of O(log F), which is cheap at token-grid sizes
(F <= 2 * 64 here). The tables are built from `torch.arange` of the axis sizes inside the graph, so they follow a
symbolic size.

Conventions are torch.fft's: forward X[f] = sum_n x[n] exp(-2 pi i f n / F), inverse x[n] = (1 / F) sum_f X[f]
exp(+2 pi i f n / F). An input axis of g < F points is zero-padded to F (torch.fft's `s=`); an inverse axis can
keep only its first g outputs (a crop).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["dft_tables", "rdft", "irdft_real"]


def dft_tables(n_out: int, n_in: int, n_fft: int, inverse: bool, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(cos, sin) tables (n_out, n_in) of angle 2 pi * row * col / n_fft; the inverse ones carry the 1 / n_fft."""
    rows = torch.arange(n_out, device=like.device, dtype=like.dtype)
    cols = torch.arange(n_in, device=like.device, dtype=like.dtype)
    # The product row * col is reduced mod n_fft in integers' stead: exact for the small sizes of a token grid.
    ang = torch.outer(rows, cols).remainder(n_fft) * (2 * math.pi / n_fft)
    c, s = torch.cos(ang), torch.sin(ang)
    if inverse:
        c, s = c / n_fft, s / n_fft
    return c, s


def _along(t: torch.Tensor, m: torch.Tensor, dim: int) -> torch.Tensor:
    """Apply the matrix m (out, in) along axis `dim` of t."""
    return torch.matmul(t.movedim(dim, -1), m.transpose(0, 1)).movedim(-1, dim)


def rdft(x: torch.Tensor, fft_grid: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Full spectrum of a real x over its trailing len(fft_grid) axes (zero-padded to fft_grid): (re, im).

    Equals (X.real, X.imag) for X = torch.fft.fftn(x, s=fft_grid) over those axes.
    """
    nd = len(fft_grid)
    re, im = x, None
    for ax in range(nd):
        dim = x.dim() - nd + ax
        c, s = dft_tables(fft_grid[ax], x.shape[dim], fft_grid[ax], False, x)
        # (re + i im)(cos - i sin) = (re cos + im sin) + i (im cos - re sin)
        if im is None:
            re, im = _along(re, c, dim), -_along(re, s, dim)
        else:
            re, im = _along(re, c, dim) + _along(im, s, dim), _along(im, c, dim) - _along(re, s, dim)
    return re, im


def irdft_real(re: torch.Tensor, im: torch.Tensor, out_sizes: Sequence[int]) -> torch.Tensor:
    """Real part of the inverse transform over the trailing len(out_sizes) axes, keeping the first out_sizes[a]
    outputs of each axis: torch.fft.ifftn(re + i im).real cropped to out_sizes."""
    nd = len(out_sizes)
    for ax in range(nd):
        dim = re.dim() - nd + ax
        n_fft = re.shape[dim]
        c, s = dft_tables(out_sizes[ax], n_fft, n_fft, True, re)
        # (re + i im)(cos + i sin) = (re cos - im sin) + i (im cos + re sin); the last axis needs the real part only
        if ax == nd - 1:
            re = _along(re, c, dim) - _along(im, s, dim)
        else:
            re, im = _along(re, c, dim) - _along(im, s, dim), _along(im, c, dim) + _along(re, s, dim)
    return re
