"""Rotary position embedding (RoPE; Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding",
arXiv 2104.09864, Sec. 3.4): each pair of channels (i, i + d/2) of a query or key at position t is rotated by the
angle t * base^(-2i/d), so q_s . k_t depends on s - t only. The pairing is the half-split one (channel i with
channel i + d/2), one of the two common layouts; it is a fixed permutation of the paper's interleaved pairs.
"""

from __future__ import annotations

import torch

__all__ = ["rotary_angles", "rotary", "rotary_ref"]


def rotary_angles(n: int, d: int, base: float = 10000.0, offset: int = 0, device=None,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(n, d/2) angles t * base^(-2i/d) for positions t = offset .. offset + n - 1."""
    if d % 2:
        raise ValueError(f"rotary position embedding needs an even head dim, got {d}")
    inv = base ** (-torch.arange(0, d, 2, device=device, dtype=torch.float64) / d)
    t = torch.arange(offset, offset + n, device=device, dtype=torch.float64)
    return torch.outer(t, inv).to(dtype)


def rotary(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate x (..., N, d) by its positions 0..N-1 (fast form: cos/sin on the two halves)."""
    n, d = x.shape[-2], x.shape[-1]
    ang = rotary_angles(n, d, base, device=x.device, dtype=torch.float32 if x.dtype != torch.float64
                        else torch.float64)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def rotary_ref(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Dense reference of `rotary`: an explicit (d, d) rotation matrix per position, applied by einsum."""
    n, d = x.shape[-2], x.shape[-1]
    ang = rotary_angles(n, d, base, device=x.device, dtype=torch.float64)
    h = d // 2
    rot = torch.zeros(n, d, d, dtype=torch.float64, device=x.device)
    idx = torch.arange(h, device=x.device)
    rot[:, idx, idx] = ang.cos()
    rot[:, idx + h, idx + h] = ang.cos()
    rot[:, idx, idx + h] = -ang.sin()
    rot[:, idx + h, idx] = ang.sin()
    return torch.einsum("nij,...nj->...ni", rot.to(x.dtype), x)
