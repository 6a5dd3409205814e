"""Linear-angular attention core (Castling-ViT, arXiv 2211.10526, Sec. 3; official GATECH-EIC/Castling-ViT
`castling-vit.py`, `LinAngularAttention`, inference form): the keys-first product and its dense float64 reference.

q, k: (B, h, N, d); v: (B, h, N, e); outputs (B, h, N, e). With q^ = q / |q|, k^ = k / |k|:
x = 1/2 v + (1/pi) q^ (k^^T v) (the first-order Taylor form of the angular kernel 1 - arccos(q^ . k^) / pi, whose
constant term keeps the token's own value), out = x / |x| row by row.
"""

from __future__ import annotations

import math

import torch

__all__ = ["linear_angular", "linear_angular_matrix", "linear_angular_ref"]


def _unit(t: torch.Tensor, eps: float) -> torch.Tensor:
    return t / t.norm(dim=-1, keepdim=True).clamp_min(eps)


def linear_angular(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Keys-first linear-angular core: q, k (B, h, N, d), v (B, h, N, e) -> (B, h, N, e), each row L2-normalised.

    x = 1/2 v + (1/pi) q^ (k^^T v), out = x / |x| (norms clamped at `eps`)."""
    qn, kn = _unit(q, eps), _unit(k, eps)
    x = 0.5 * v + (qn @ (kn.transpose(-2, -1) @ v)) / math.pi
    return _unit(x, eps)


def linear_angular_matrix(q: torch.Tensor, k: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The un-normalised kernel matrix A = 1/2 I + (1/pi) q^ k^^T, (B, h, N, N) (x = A v)."""
    qn, kn = _unit(q, eps), _unit(k, eps)
    eye = torch.eye(q.shape[-2], dtype=q.dtype, device=q.device)
    return 0.5 * eye + (qn @ kn.transpose(-2, -1)) / math.pi


def linear_angular_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Dense reference of `linear_angular`: the explicit N x N matrix A, then x = A v and the row normalisation."""
    return _unit(linear_angular_matrix(q, k, eps) @ v, eps)
