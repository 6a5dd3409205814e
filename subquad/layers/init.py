"""Weight initialisation shared by the mechanisms."""

from __future__ import annotations

from timm.layers import trunc_normal_
from torch import nn

__all__ = ["init_linears_"]


def init_linears_(*linears: nn.Linear, std: float = 0.02) -> None:
    """ViT initialisation of projections, in the order given: weights truncated normal (std 0.02), biases zero."""
    for lin in linears:
        trunc_normal_(lin.weight, std=std)
        if lin.bias is not None:
            nn.init.zeros_(lin.bias)
