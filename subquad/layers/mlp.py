"""MLPs shared by backbones (timm's `Mlp` is reused where it is identical)."""

from __future__ import annotations

import torch
from torch import nn

from .._shapes import map_to_tokens, tokens_to_map

__all__ = ["DWConv", "ConvMlp"]


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

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        x = self.act(self.dwconv(self.fc1(x), hw))
        return self.drop(self.fc2(self.drop(x)))
