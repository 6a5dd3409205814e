"""MLPs shared by backbones: timm's `Mlp` (same keys) and PVTv2's `ConvMlp`, both with a chunked inference path.

Without autograd, at high resolution, the MLPs run over bands of tokens: their hidden activations (4-8x the width,
N tokens) are the largest tensors of a backbone, and at 1024 px a stage-1 hidden tensor is 130 MiB, freshly paged in
by every block. A band's hidden tensor (at most `CHUNK_ELEMS` floats) stays in cache and in the allocator's reused
memory; FLatten-PVTv2's stage-1 MLP at 1024 px runs about 3x faster. Values are the same (tokens are independent
in fc1/act/fc2; the 3x3 depthwise conv gets one halo row on each side of its band). With autograd, or when the hidden
tensor is small (every model at 224 px), the plain forward runs. The banded path is a CPU schedule: `subquad.backend`
chooses it (on CPU, outside tracing); elsewhere the plain forward runs. Its output has the dtype the plain forward
would give (under autocast, the autocast dtype).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import timm.layers
import torch
from torch import nn

from .._shapes import map_to_tokens, tokens_to_map
from ..backend import cpu_schedules, use_backend

__all__ = ["DWConv", "ConvMlp", "Mlp", "CHUNK_ELEMS", "plain_mlps"]

# Largest hidden activation (floats) one band of the chunked inference path holds: 8 MiB in fp32.
CHUNK_ELEMS = 2 ** 21


@contextlib.contextmanager
def plain_mlps() -> Iterator[None]:
    """Inside the block every MLP runs its plain forward (FLOP counting uses it: the halo rows a banded ConvMlp
    recomputes belong to the schedule, not to the architecture). The same as `subquad.backend.use_backend('plain')`."""
    with use_backend("plain"):
        yield


def _chunked(hidden_elems: int, device: torch.device | str | None = "cpu") -> bool:
    """Whether an MLP on `device` whose hidden activation has `hidden_elems` values runs in bands: a CPU schedule
    (`subquad.backend`), without autograd, with at least 2 bands."""
    # The schedule first: a size comparison would add a guard to a traced program.
    return cpu_schedules(device) and not torch.is_grad_enabled() and hidden_elems > 2 * CHUNK_ELEMS


class Mlp(timm.layers.Mlp):
    """timm's `Mlp` (fc1 -> act -> drop -> norm -> fc2 -> drop; the same state-dict keys), evaluated over token
    chunks without autograd when its hidden activation is large (module docstring). Shapes: (..., C) -> (..., C_out).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.fc1.out_features if isinstance(self.fc1, nn.Linear) else None
        n = x.numel() // max(1, x.shape[-1])
        if hidden is None or not _chunked(n * hidden, x.device):
            return super().forward(x)
        rows = max(1, CHUNK_ELEMS // hidden)
        flat = x.reshape(n, x.shape[-1])
        out = None
        for i in range(0, n, rows):
            y = super().forward(flat[i:i + rows])
            if out is None:  # the dtype of the plain forward (autocast's, under autocast)
                out = y.new_empty(n, y.shape[-1])
            out[i:i + rows] = y
        return out.view(*x.shape[:-1], out.shape[-1])


class DWConv(nn.Module):
    """Depthwise 3x3 conv on tokens: (B, N, C) with hw -> (B, N, C). Key layout `dwconv.weight` (PVTv2)."""

    def __init__(self, dim: int, device=None, dtype=None) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        return map_to_tokens(self.dwconv(tokens_to_map(x, hw)))


class ConvMlp(nn.Module):
    """fc1 -> depthwise 3x3 -> GELU -> fc2 (PVTv2 style). Shapes: x (B, N, C) with hw -> (B, N, C_out).

    Official: PVTv2 `Mlp` (`fc1`, `dwconv.dwconv`, `fc2`); FLatten-PVTv2 keeps the same names.
    """

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 act_layer: type[nn.Module] = nn.GELU, drop: float = 0.0, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        hidden = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, hidden, **dd)
        self.dwconv = DWConv(hidden, **dd)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden, out_features or in_features, **dd)
        self.drop = nn.Dropout(drop)

    def _plain(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        x = self.act(self.dwconv(self.fc1(x), hw))
        return self.drop(self.fc2(self.drop(x)))

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        B, N, C = x.shape
        H, W = hw
        hidden = self.fc1.out_features
        if not _chunked(B * N * hidden, x.device) or H * W != N:
            return self._plain(x, hw)
        # Bands of rows; each gets one halo row above and below for the 3x3 depthwise conv (zero padding at the
        # map border is the conv's own, as in the plain forward).
        rows = max(1, CHUNK_ELEMS // (B * W * hidden))
        xm = x.view(B, H, W, C)
        out = None
        for r0 in range(0, H, rows):
            r1 = min(H, r0 + rows)
            a, b = max(0, r0 - 1), min(H, r1 + 1)
            h = self.fc1(xm[:, a:b].reshape(B, (b - a) * W, C))
            h = self.dwconv(h, (b - a, W)).view(B, b - a, W, hidden)[:, r0 - a:r1 - a]
            y = self.drop(self.fc2(self.drop(self.act(h))))
            if out is None:  # the dtype of the plain forward (autocast's, under autocast)
                out = y.new_empty(B, H, W, y.shape[-1])
            out[:, r0:r1] = y
        return out.view(B, N, -1)
