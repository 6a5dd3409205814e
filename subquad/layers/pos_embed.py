"""Positional layers shared by backbones."""

from __future__ import annotations

import torch
from torch import nn

from .._shapes import map_to_tokens, tokens_to_map

__all__ = ["ConvPosEnc"]


class ConvPosEnc(nn.Module):
    """Conditional positional encoding: x + DWConv_k(x) on the token map (no activation).

    Shapes: x (B, N, C) with hw=(H, W), N == H * W -> (B, N, C).
    Paper: CPVT (Chu et al. 2021); L2ViT paper and LiSA (arXiv 2211.16289) use it in every block.
    Official: L2ViT `ConvPosEnc` (`cpe.{i}.proj`, cpe_act=False).
    """

    def __init__(self, dim: int, k: int = 3, device=None, dtype=None) -> None:
        super().__init__()
        self.proj = nn.Conv2d(dim, dim, k, 1, k // 2, groups=dim, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        H, W = hw
        if x.shape[1] != H * W:
            raise ValueError(f"ConvPosEnc: hw={H}x{W} does not match N={x.shape[1]}")
        return x + map_to_tokens(self.proj(tokens_to_map(x, hw)))
