"""GFNet-style global filter token mixer (`"global_filter"`): a static per-channel circular convolution via rfft2.

Registered for LiSA's Tab. 3(a) comparisons ("GF layer"): the input-independent counterpart of LiSA's dynamic
global convolution. The rfft2 fast path and its dense float64 reference are in `functional/global_filter.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .._shapes import as_hw, check_heads, check_sequence_hw, known_equal
from ..errors import UserError
from ..layers.precision import compute_dtype, no_autocast
from .base import AttentionCaps, TokenMixer
from .functional.global_filter import (
    global_filter_1d_fft,
    global_filter_1d_ref,
    global_filter_fft,
    global_filter_kernel,
    global_filter_kernel_1d,
    global_filter_ref,
)
from .functional.structure_aware import relative_index
from .registry import register_attention

__all__ = ["GlobalFilter", "GlobalFilter1d"]


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
        input_size: token grid (H0, W0) of the filter (required; `build_attention` without it builds the 1-D
            form, `GlobalFilter1d`).
        proj_drop: dropout on the output.
    """

    caps = AttentionCaps(bidirectional=True, causal=False, needs_hw=True, supports_mask=False,
                         complexity="O(N log N)", sequence=True,
                         notes="static (input-independent) filter; without input_size: the 1-D form (length via "
                               "seq_len); no causal form (a circular convolution)")

    @classmethod
    def resolve(cls, options: dict) -> tuple[type, dict]:
        """`build_attention`'s factory: without `input_size` the 1-D form (`GlobalFilter1d`); no causal form."""
        opts = dict(options)
        if opts.pop("causal", False):
            raise UserError("global_filter has no causal form: its filter is a circular convolution over the whole "
                            "sequence, so every output reads every token (causal=False only)")
        if opts.get("input_size") is None:
            return GlobalFilter1d, opts
        if opts.get("seq_len") is not None:
            raise UserError("global_filter: seq_len sizes the 1-D form; with input_size (the grid form) leave it out")
        opts.pop("seq_len", None)
        return cls, opts

    def __init__(self, dim: int, num_heads: int = 1, input_size: Sequence[int] | None = None,
                 proj_drop: float = 0.0, device=None, dtype=None) -> None:
        super().__init__()
        self.dim = dim
        self.num_heads = num_heads
        check_heads(dim, num_heads, "global_filter")
        if input_size is None:
            raise UserError("global_filter: the grid form needs input_size=(H, W); build without it for the 1-D form")
        self.input_size = as_hw(input_size, "input_size")
        H0, W0 = self.input_size
        self.complex_weight = nn.Parameter(torch.empty(H0, W0 // 2 + 1, dim, 2, device=device, dtype=dtype))
        self.proj_drop = nn.Dropout(proj_drop)
        self.caps = dataclasses.replace(type(self).caps, sequence=False)
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


class GlobalFilter1d(TokenMixer):
    """The global filter over a 1-D token sequence (ours: GFNet defines it on image grids): a learnable complex
    filter per channel on the rfft of the sequence, i.e. a per-channel circular convolution over the L tokens.
    `build_attention("global_filter", C, h)` without `input_size` builds it.

    Shapes: x (B, L, C) -> (B, L, C); hw None (a grid hw is refused: build with input_size); no masks; any L.
    Paper: GFNet (Rao et al. 2021, arXiv 2107.00645), Sec. 3 (global filter layer), with the 2-D FFT replaced by
        the 1-D one over the tokens.
    Official: raoyongming/GFNet `gfnet.py` `GlobalFilter` (the 2-D layer; init randn * 0.02, norm='ortho').
    Symbols: W = `complex_weight` (seq_len//2+1, C, 2), the half spectrum at seq_len; k = irfft(W) its kernel.

    Length: the filter is a function of the normalised frequency f = m / L in [0, 1/2], stored at the
    seq_len//2+1 bins of seq_len. At another length L it is resampled linearly over the bins (align_corners=True:
    bin 0 and the Nyquist bin stay put; real and imaginary parts separately), the 2-D form's rule. At 2x / 4x the
    training length every stored bin is kept exactly (bin m lands on bin 2m / 4m) and the bins between are linear
    in between, so the response per normalised frequency, hence the kernel's shape in tokens, is kept; the circular
    wrap-around moves to the new length.

    Args:
        dim: channels C.
        num_heads: accepted for the registry interface (must divide dim); the filter is per channel.
        seq_len: the length whose spectrum the filter is stored on (default 512).
        proj_drop: dropout on the output.
    """

    caps = AttentionCaps(bidirectional=True, causal=False, needs_hw=False, supports_mask=False,
                         complexity="O(N log N)", sequence=True, notes="GFNet filter over the sequence")
    name = "global_filter"

    def __init__(self, dim: int, num_heads: int = 1, seq_len: int | None = None, proj_drop: float = 0.0,
                 input_size: None = None, device=None, dtype=None) -> None:
        super().__init__()
        self.dim, self.num_heads = dim, num_heads
        check_heads(dim, num_heads, "global_filter")
        seq_len = 512 if seq_len is None else seq_len
        if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
            raise UserError(f"global_filter (1-D): seq_len={seq_len!r} must be an int >= 1")
        self.seq_len = seq_len
        self.complex_weight = nn.Parameter(torch.empty(seq_len // 2 + 1, dim, 2, device=device, dtype=dtype))
        self.proj_drop = nn.Dropout(proj_drop)
        if not self.complex_weight.is_meta:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.complex_weight, std=0.02)

    def filter_for(self, length: int) -> torch.Tensor:
        """The half-spectrum filter (length//2+1, C, 2) for `length` tokens (resampled when it differs)."""
        w = self.complex_weight
        if known_equal((length // 2 + 1,), (w.shape[0],)):
            return w
        C = w.shape[1]
        grid = w.permute(1, 2, 0).reshape(1, C * 2, w.shape[0])
        if w.shape[0] == 1:  # one stored bin (seq_len 1): a constant response
            return w.expand(length // 2 + 1, C, 2)
        grid = F.interpolate(grid, size=length // 2 + 1, mode="linear", align_corners=True)
        return grid.reshape(C, 2, length // 2 + 1).permute(2, 0, 1)

    def _check_input(self, x: torch.Tensor, hw=None, mask: torch.Tensor | None = None) -> None:
        """As `TokenMixer._check_input`, and a grid hw is refused (this form has no grid: build with input_size)."""
        super()._check_input(x, hw, mask)
        check_sequence_hw(x, hw, "global_filter (1-D)")

    def forward(self, x: torch.Tensor, hw: Sequence[int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        self._check_input(x, hw, mask)
        cdt = compute_dtype(x.dtype)
        with no_autocast(x):
            y = global_filter_1d_fft(x.to(cdt), self.filter_for(x.shape[1]).to(cdt))
        return self.proj_drop(y.to(x.dtype))

    def forward_ref(self, x: torch.Tensor, hw: Sequence[int] | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
        """Dense circulant-matrix reference of `forward`."""
        self._check_input(x, hw, mask)
        return global_filter_1d_ref(x, self.filter_for(x.shape[1]).to(x.dtype))

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw: Sequence[int] | None = None) -> torch.Tensor:
        """(B, L, C) -> (B, h, L, L): per head, the mean over its channels of the circulant matrices."""
        self._check_input(x, hw, None)
        L = x.shape[1]
        k = global_filter_kernel_1d(self.filter_for(L).to(x.dtype), L)  # (C, L)
        k = k.reshape(self.num_heads, -1, L).mean(1)  # (h, L)
        i = torch.arange(L, device=x.device)
        m = k[:, (i[:, None] - i[None, :]) % L]  # (h, L, L)
        return m.unsqueeze(0).expand(x.shape[0], -1, -1, -1)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, seq_len={self.seq_len}"
