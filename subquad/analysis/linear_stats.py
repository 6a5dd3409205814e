"""Per-layer statistics of attention maps and token features: entropy, locality, over-smoothing, L2ViT clamp share.

Maps that are not row-stochastic (linear attention with a DWC/LCM term, LiSA, GFNet filters) are read through their
absolute values normalised per row, so every statistic is defined for every mechanism.
"""

from __future__ import annotations

import math

import torch

from ..errors import UserError

__all__ = ["row_distribution", "attention_entropy", "attention_locality", "token_cosine", "clamp_share"]


def row_distribution(attn: torch.Tensor) -> torch.Tensor:
    """(..., N, n) -> (..., N, n): |A| with each row scaled to sum 1 (rows of zeros stay zero)."""
    a = attn.detach().abs().to(torch.float64)
    return a / a.sum(-1, keepdim=True).clamp_min(1e-300)


def attention_entropy(attn: torch.Tensor) -> dict:
    """Mean entropy of the rows of an attention map (FLatten's focus argument: low entropy = focused).

    Args:
        attn: (h, N, n) one image's map.
    Returns:
        {'entropy': mean nats per query, 'entropy_ratio': entropy / log(n) (1 = uniform)}.
    """
    p = row_distribution(attn)
    ent = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)  # (h, N)
    value = float(ent.mean())
    n = attn.shape[-1]
    return {"entropy": value, "entropy_ratio": value / math.log(n) if n > 1 else 0.0}


def _neighbourhood(hw: tuple[int, int], k: int, device: torch.device) -> torch.Tensor:
    """(HW, HW) bool: key j lies in the k x k window centred on query i (clipped at the border)."""
    H, W = hw
    ys, xs = torch.meshgrid(torch.arange(H, device=device), torch.arange(W, device=device), indexing="ij")
    ys, xs = ys.flatten(), xs.flatten()
    r = k // 2
    return ((ys[:, None] - ys[None, :]).abs() <= r) & ((xs[:, None] - xs[None, :]).abs() <= r)


def attention_locality(attn: torch.Tensor, hw: tuple[int, int], k: int = 3, prefix: int = 0) -> float | None:
    """Share of each grid query's attention mass that falls within its k x k grid neighbourhood (mean).

    Args:
        attn: (h, N, N) one image's map with N = prefix + H * W (grid tokens last).
        hw: the token grid (H, W).
        k: neighbourhood side (odd).
        prefix: leading non-grid tokens (dropped from rows and columns).
    Returns:
        the mean share in [0, 1], or None when the map is not token-to-token on this grid (spatial reduction).
    """
    if k < 1 or k % 2 == 0:
        raise UserError(f"locality window k must be a positive odd number, got {k}")
    H, W = hw
    if attn.shape[-1] != attn.shape[-2] or attn.shape[-1] != prefix + H * W:
        return None
    p = row_distribution(attn[:, prefix:, prefix:])
    near = _neighbourhood((H, W), k, attn.device)
    return float((p * near).sum(-1).mean())


def token_cosine(x: torch.Tensor, prefix: int = 0) -> float:
    """Mean pairwise cosine similarity of distinct tokens (Transformer-LS over-smoothing measure).

    Args:
        x: (N, C) or (1, N, C) token features.
        prefix: leading tokens to drop.
    Returns:
        mean over pairs i != j of cos(x_i, x_j).
    """
    x = x.detach().reshape(-1, x.shape[-1])[prefix:].to(torch.float64)
    n = x.shape[0]
    if n < 2:
        return 1.0
    u = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    s = u.sum(0)
    return float(((s @ s) - (u * u).sum()) / (n * (n - 1)))


def clamp_share(module: torch.nn.Module, x: torch.Tensor) -> float | None:
    """Share of queries whose L2ViT denominator q . sum(k) is below the clamp (None if the module has none).

    Uses the documented `denominator(x)` method and `clamp_min` attribute of "enhanced_linear".
    """
    den = getattr(module, "denominator", None)
    clamp = getattr(module, "clamp_min", None)
    if den is None or clamp is None:
        return None
    with torch.no_grad():
        d = den(x)
    return float((d < clamp).to(torch.float64).mean())
