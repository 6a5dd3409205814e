"""GFNet-style global filter token mixer (`"global_filter"`): a static per-channel circular convolution via rfft2.

Registered for LiSA's Tab. 3(a) comparisons ("GF layer"): the input-independent counterpart of LiSA's dynamic
global convolution. The rfft2 fast path and its dense float64 reference are in `functional/global_filter.py`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .._shapes import as_hw, check_heads, known_equal
from ..layers.precision import compute_dtype, no_autocast
from .base import AttentionCaps, TokenMixer
from .functional.global_filter import global_filter_fft, global_filter_kernel, global_filter_ref
from .functional.structure_aware import relative_index
from .registry import register_attention

__all__ = ["GlobalFilter"]


@register_attention("global_filter")
class GlobalFilter(TokenMixer):
    """Global filter layer (GFNet): a learnable complex filter per channel on the 2-D spectrum of the token map.

    Shapes: x (B, N, C) with hw = (H, W), N = H*W -> (B, N, C).
    Paper: GFNet (Rao et al. 2021), the "GF layer" of LiSA (arXiv 2211.16289) Tab. 3(a).
    Official: raoyongming/GFNet `gfnet.py` `GlobalFilter` (`complex_weight` (H, W//2+1, C, 2), randn * 0.02,
        rfft2/irfft2 norm='ortho'); only the layout and init are followed, the code is ours.
    Symbols: W = `complex_weight` (half spectrum); k = irfft2(W) the equivalent token-domain kernel.

    Resolution: the filter lives on the spectrum of `input_size` (H0, W0). At another grid it is resampled over the
    frequency grid (H0, W0//2+1) -> (H, W//2+1) bilinearly (align_corners=True; real and imaginary parts
    separately), as GFNet resizes its filters for fine-tuning at another resolution.

    Args:
        dim: channels C.
        num_heads: accepted for the registry interface (must divide dim); the filter is per channel.
        input_size: token grid (H0, W0) of the filter; default 14 x 14.
        proj_drop: dropout on the output.
    """

    caps = AttentionCaps(bidirectional=True, causal=False, needs_hw=True, supports_mask=False,
                         complexity="O(N log N)", sequence=False, notes="static (input-independent) filter")

    def __init__(self, dim: int, num_heads: int = 1, input_size: Sequence[int] | None = None,
                 proj_drop: float = 0.0, device=None, dtype=None) -> None:
        super().__init__()
        self.dim = dim
        self.num_heads = num_heads
        check_heads(dim, num_heads, "global_filter")
        self.input_size = as_hw(input_size if input_size is not None else (14, 14), "input_size")
        H0, W0 = self.input_size
        self.complex_weight = nn.Parameter(torch.empty(H0, W0 // 2 + 1, dim, 2, device=device, dtype=dtype))
        self.proj_drop = nn.Dropout(proj_drop)
        if not self.complex_weight.is_meta:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.complex_weight, std=0.02)

    def filter_for(self, hw: Sequence[int]) -> torch.Tensor:
        """The half-spectrum filter (H, W//2+1, C, 2) for grid hw (resampled when hw differs from input_size)."""
        H, W = hw
        w = self.complex_weight
        # known_equal: a traced (symbolic) grid always resamples, which is the identity at input_size (bilinear
        # with align_corners=True samples the grid points).
        if known_equal(tuple(hw), self.input_size):
            return w
        C = w.shape[2]
        grid = w.permute(2, 3, 0, 1).reshape(1, C * 2, *w.shape[:2])
        grid = F.interpolate(grid, size=(H, W // 2 + 1), mode="bilinear", align_corners=True)
        return grid.reshape(C, 2, H, W // 2 + 1).permute(2, 3, 0, 1)

    def forward(self, x: torch.Tensor, hw: Sequence[int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        hw = self._check_input(x, hw, mask)
        cdt = compute_dtype(x.dtype)
        with no_autocast(x):
            y = global_filter_fft(x.to(cdt), self.filter_for(hw).to(cdt), hw)
        return self.proj_drop(y.to(x.dtype))

    def forward_ref(self, x: torch.Tensor, hw: Sequence[int] | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
        """Dense circulant-matrix reference of `forward`."""
        hw = self._check_input(x, hw, mask)
        return global_filter_ref(x, self.filter_for(hw).to(x.dtype), hw)

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw: Sequence[int] | None = None) -> torch.Tensor:
        """(B, N, C) -> (B, h, N, N): per head, the mean over its channels of the per-channel circulant matrices
        (exact per head only when its channels share a filter; the mixer itself is per channel)."""
        hw = self._check_input(x, hw, None)
        k = global_filter_kernel(self.filter_for(hw).to(x.dtype), hw).flatten(1)  # (C, N)
        k = k.reshape(self.num_heads, -1, k.shape[-1]).mean(1)  # (h, N)
        m = k[:, relative_index(hw, "circular", x.device).T]  # (h, N, N)
        return m.unsqueeze(0).expand(x.shape[0], -1, -1, -1)
