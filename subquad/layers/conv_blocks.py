"""Convolutional blocks of HyLiSANet stages 1-2 and the channels-first / 3-D helpers LiSANet needs.

Everything here works on 2-D maps (B, C, H, W) or, for video, 3-D maps (B, C, T, H, W): `ndim` selects Conv2d or
Conv3d and the matching BatchNorm. Token-layout 3-D counterparts of `ConvPosEnc` and `ConvMlp` keep the key names
of the 2-D layers (`proj`; `fc1`, `dwconv.dwconv`, `fc2`) so 2-D weights inflate key by key.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from timm.layers import DropPath
from torch import nn

__all__ = ["conv_nd", "bn_nd", "LayerNormChannels", "ConvPosEncMap", "ConvMlpMap", "DWConvBlock", "ConvPosEnc3d",
           "ConvMlp3d"]


def conv_nd(ndim: int) -> type[nn.Module]:
    """Conv2d for ndim 2, Conv3d for ndim 3."""
    if ndim not in (2, 3):
        raise ValueError(f"ndim must be 2 (images) or 3 (video), got {ndim}")
    return nn.Conv2d if ndim == 2 else nn.Conv3d


def bn_nd(ndim: int) -> type[nn.Module]:
    """BatchNorm2d for ndim 2, BatchNorm3d for ndim 3."""
    conv_nd(ndim)
    return nn.BatchNorm2d if ndim == 2 else nn.BatchNorm3d


def _dw_kernel(k: int, ndim: int) -> tuple[int, ...]:
    """Depthwise k x k becomes 3 x k x k in video; 1 x 1 stays 1 x 1 x 1."""
    return (k,) * 2 if ndim == 2 else ((3 if k > 1 else 1), k, k)


class LayerNormChannels(nn.LayerNorm):
    """LayerNorm over the channel dim of a channels-first map (B, C, *spatial) -> same shape. Keys: weight, bias."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.movedim(1, -1)).movedim(-1, 1)


class ConvPosEncMap(nn.Module):
    """CPE on a channels-first map: x + DWConv3x3(x) (3x3x3 in video). Shapes: (B, C, *spatial) -> same. Key `proj`."""

    def __init__(self, dim: int, ndim: int = 2, device=None, dtype=None) -> None:
        super().__init__()
        k = _dw_kernel(3, ndim)
        self.proj = conv_nd(ndim)(dim, dim, k, 1, [s // 2 for s in k], groups=dim, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(x)


class ConvMlpMap(nn.Module):
    """Conv MLP on a channels-first map: fc1 (1x1) -> DW 3x3 -> GELU -> fc2 (1x1). Keys `fc1`, `dwconv`, `fc2`."""

    def __init__(self, dim: int, hidden: int, ndim: int = 2, drop: float = 0.0, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        conv = conv_nd(ndim)
        k = _dw_kernel(3, ndim)
        self.fc1 = conv(dim, hidden, 1, **dd)
        self.dwconv = conv(hidden, hidden, k, 1, [s // 2 for s in k], groups=hidden, **dd)
        self.act = nn.GELU()
        self.fc2 = conv(hidden, dim, 1, **dd)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.dwconv(self.fc1(x))))))


class DWConvBlock(nn.Module):
    """Depthwise-conv block of HyLiSANet stages 1-2 (UniFormer CBlock-like), channels-first.

    x <- x + CPE(x);  x <- x + DropPath(conv2(dwconv5x5(conv1(BN1(x)))));  x <- x + DropPath(ConvMLP(BN2(x))).
    Shapes: x (B, C, H, W), or (B, C, T, H, W) with ndim=3 (depthwise 3 x 5 x 5, BN3d) -> same shape.
    Paper: LiSA (arXiv 2211.16289) (HyLiSANet: convolutions in the early stages); config ours (docs/deviations.md).
    Official: none (LiSA has no released code); keys `cpe.proj, norm1, conv1, dwconv, conv2, norm2, mlp.*`.
    """

    def __init__(self, dim: int, mlp_ratio: float = 4.0, drop_path: float = 0.0, ndim: int = 2,
                 kernel_size: int = 5, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        conv, bn = conv_nd(ndim), bn_nd(ndim)
        k = _dw_kernel(kernel_size, ndim)
        self.cpe = ConvPosEncMap(dim, ndim, **dd)
        self.norm1 = bn(dim, **dd)
        self.conv1 = conv(dim, dim, 1, **dd)
        self.dwconv = conv(dim, dim, k, 1, [s // 2 for s in k], groups=dim, **dd)
        self.conv2 = conv(dim, dim, 1, **dd)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = bn(dim, **dd)
        self.mlp = ConvMlpMap(dim, int(dim * mlp_ratio), ndim, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cpe(x)
        x = x + self.drop_path(self.conv2(self.dwconv(self.conv1(self.norm1(x)))))
        return x + self.drop_path(self.mlp(self.norm2(x)))


def _tokens_to_map3d(x: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
    """(B, N, C) -> (B, C, T, H, W)."""
    B, N, C = x.shape
    if N != math.prod(grid):
        raise ValueError(f"grid {tuple(grid)} makes {math.prod(grid)} tokens but x has N={N}")
    return x.transpose(1, 2).reshape(B, C, *grid)


class ConvPosEnc3d(nn.Module):
    """Token-layout CPE for video: x + DWConv3x3x3(x). Shapes: x (B, N, C), grid (T, H, W) -> (B, N, C). Key `proj`."""

    def __init__(self, dim: int, device=None, dtype=None) -> None:
        super().__init__()
        self.proj = nn.Conv3d(dim, dim, 3, 1, 1, groups=dim, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
        return x + self.proj(_tokens_to_map3d(x, grid)).flatten(2).transpose(1, 2)


class _DWConv3d(nn.Module):
    def __init__(self, dim: int, device=None, dtype=None) -> None:
        super().__init__()
        self.dwconv = nn.Conv3d(dim, dim, 3, 1, 1, groups=dim, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
        return self.dwconv(_tokens_to_map3d(x, grid)).flatten(2).transpose(1, 2)


class ConvMlp3d(nn.Module):
    """Token-layout conv MLP for video: fc1 -> DW 3x3x3 -> GELU -> fc2. Keys `fc1`, `dwconv.dwconv`, `fc2`.

    Shapes: x (B, N, C), grid (T, H, W) -> (B, N, C). The 2-D counterpart is `subquad.layers.mlp.ConvMlp`.
    """

    def __init__(self, in_features: int, hidden_features: int, drop: float = 0.0, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.fc1 = nn.Linear(in_features, hidden_features, **dd)
        self.dwconv = _DWConv3d(hidden_features, **dd)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, in_features, **dd)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
        x = self.act(self.dwconv(self.fc1(x), grid))
        return self.drop(self.fc2(self.drop(x)))
