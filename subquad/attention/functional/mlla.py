"""Mamba-like linear attention (MLLA) core: ELU+1 kernels, a 2-D rotary position embedding on the numerator only, the
token-mean normaliser and the LePE term; the keys-first fast path and its dense float64 reference.

Paper: Han et al., "Demystify Mamba in Vision: A Linear Attention Perspective" (NeurIPS 2024, arXiv 2405.16605),
    the MLLA model (renamed MILA in the final version): linear attention with RoPE and LePE in Mamba's block.
Official: LeapLabTHU/MLLA `models/mlla.py` (`RoPE`, `LinearAttention.forward`).

Inputs are token layouts (B, N, C) with N = H * W (row-major), because the official 2-D RoPE rotates the C channels
before they are split into heads. With phi(t) = elu(t) + 1, R_i the rotation of token i, h heads of d = C / h
channels and q, k, v restricted to one head:

    out_i = [ sum_j (R_i phi(q_i)) . (R_j phi(k_j)) v_j / N ] / ( phi(q_i) . mean_j phi(k_j) + eps ) + LePE(v)_i

i.e. q and k are rotated in the numerator and unrotated in the denominator (the official code's choice).

2-D RoPE (official `RoPE`): channels are taken in interleaved pairs (2m, 2m + 1), m = 0 .. C/2 - 1, each rotated as a
complex number by an angle; pairs m < C/4 by row * theta_m, pairs m >= C/4 by col * theta_(m - C/4), with
theta_k = base^(-k / (C/4)). Angles are built for the grid actually given (any H, W).

Symbols: C channels, h heads, d = C / h, (H, W) grid, N = H * W, eps = 1e-6 (official), base = 10000 (official).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .rotary import rotary_angles

__all__ = ["rope_2d_angles", "rope_2d", "rope_2d_ref", "lepe_ref", "mlla_attention", "mlla_attention_ref",
           "mlla_attention_matrix"]


def rope_2d_angles(hw: tuple[int, int], dim: int, base: float = 10000.0, device=None,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(H * W, C / 2) angles of the channel pairs at every grid position (row-major).

    Pair m < C/4: row * theta_m; pair m >= C/4: col * theta_(m - C/4); theta_k = base^(-k / (C/4)). `rotary_angles`
    with d = C/2 gives exactly t * base^(-2k / (C/2)) = t * theta_k.
    """
    if dim % 4:
        raise ValueError(f"2-D rotary position embedding needs a channel count divisible by 4, got {dim}")
    H, W = hw
    rows = rotary_angles(H, dim // 2, base, device=device, dtype=torch.float64)  # (H, C/4)
    cols = rotary_angles(W, dim // 2, base, device=device, dtype=torch.float64)  # (W, C/4)
    ang = torch.cat([rows[:, None, :].expand(H, W, -1), cols[None, :, :].expand(H, W, -1)], dim=-1)
    return ang.reshape(H * W, dim // 2).to(dtype)


def rope_2d(x: torch.Tensor, hw: tuple[int, int], base: float = 10000.0) -> torch.Tensor:
    """Rotate x (B, N, C) by its grid positions (fast form: cos/sin on interleaved channel pairs)."""
    B, N, C = x.shape
    ang = rope_2d_angles(hw, C, base, device=x.device, dtype=torch.float64 if x.dtype == torch.float64
                         else torch.float32)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)  # (N, C/2)
    xp = x.reshape(B, N, C // 2, 2)
    re, im = xp[..., 0], xp[..., 1]
    return torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1).reshape(B, N, C)


def rope_2d_ref(x: torch.Tensor, hw: tuple[int, int], base: float = 10000.0) -> torch.Tensor:
    """Dense reference of `rope_2d`: an explicit (C, C) rotation matrix per position, applied by einsum."""
    B, N, C = x.shape
    ang = rope_2d_angles(hw, C, base, device=x.device, dtype=torch.float64)
    rot = torch.zeros(N, C, C, dtype=torch.float64, device=x.device)
    even = torch.arange(0, C, 2, device=x.device)
    rot[:, even, even] = ang.cos()
    rot[:, even + 1, even + 1] = ang.cos()
    rot[:, even, even + 1] = -ang.sin()
    rot[:, even + 1, even] = ang.sin()
    return torch.einsum("nij,bnj->bni", rot.to(x.dtype), x)


def lepe_ref(v: torch.Tensor, hw: tuple[int, int], weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Depthwise k x k convolution of the value map (LePE), written as a sum of zero-padded shifts.

    v (B, N, C), weight (C, 1, k, k), bias (C,) -> (B, N, C)."""
    B, N, C = v.shape
    H, W = hw
    k = weight.shape[-1]
    r = k // 2
    vm = F.pad(v.reshape(B, H, W, C), (0, 0, r, r, r, r))
    out = torch.zeros_like(v.reshape(B, H, W, C))
    for a in range(k):
        for b in range(k):
            out = out + vm[:, a:a + H, b:b + W] * weight[:, 0, a, b]
    out = out.reshape(B, N, C)
    return out if bias is None else out + bias


def _heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    B, N, C = x.shape
    return x.reshape(B, N, num_heads, C // num_heads).transpose(1, 2)  # (B, h, N, d)


def _merge(x: torch.Tensor) -> torch.Tensor:
    B, h, N, d = x.shape
    return x.transpose(1, 2).reshape(B, N, h * d)


def mlla_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lepe_weight: torch.Tensor,
                   lepe_bias: torch.Tensor | None, hw: tuple[int, int], num_heads: int, eps: float = 1e-6,
                   base: float = 10000.0) -> torch.Tensor:
    """Keys-first MLLA core, O(N d^2) per head.

    Shapes: q, k, v (B, N, C) (q and k before the kernel), lepe_weight (C, 1, k, k), lepe_bias (C,) -> (B, N, C).
    """
    N = q.shape[1]
    q, k = F.elu(q) + 1.0, F.elu(k) + 1.0
    qr, kr = _heads(rope_2d(q, hw, base), num_heads), _heads(rope_2d(k, hw, base), num_heads)
    qh, kh, vh = _heads(q, num_heads), _heads(k, num_heads), _heads(v, num_heads)  # (B, h, N, d)
    z = 1.0 / (qh @ kh.mean(dim=-2, keepdim=True).transpose(-2, -1) + eps)  # (B, h, N, 1)
    kv = (kr.transpose(-2, -1) @ vh) / N  # (B, h, d, d)
    out = _merge((qr @ kv) * z)
    B, _, C = v.shape
    vm = v.transpose(1, 2).reshape(B, C, hw[0], hw[1])
    lepe = F.conv2d(vm, lepe_weight, lepe_bias, padding=lepe_weight.shape[-1] // 2, groups=C)
    return out + lepe.flatten(2).transpose(1, 2)


def mlla_attention_matrix(q: torch.Tensor, k: torch.Tensor, hw: tuple[int, int], num_heads: int,
                          eps: float = 1e-6, base: float = 10000.0, rope=rope_2d) -> torch.Tensor:
    """The (B, h, N, N) matrix A of the attention term (LePE excluded): out_head = A @ v_head + LePE(v).

    A_ij = (R_i phi(q_i)) . (R_j phi(k_j)) / N / (phi(q_i) . mean_j phi(k_j) + eps)."""
    N = q.shape[1]
    q, k = F.elu(q) + 1.0, F.elu(k) + 1.0
    qr, kr = _heads(rope(q, hw, base), num_heads), _heads(rope(k, hw, base), num_heads)
    qh, kh = _heads(q, num_heads), _heads(k, num_heads)
    denom = (qh @ kh.transpose(-2, -1)).mean(dim=-1, keepdim=True) + eps  # (B, h, N, 1)
    return (qr @ kr.transpose(-2, -1)) / N / denom


def mlla_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lepe_weight: torch.Tensor,
                       lepe_bias: torch.Tensor | None, hw: tuple[int, int], num_heads: int, eps: float = 1e-6,
                       base: float = 10000.0) -> torch.Tensor:
    """Dense reference of `mlla_attention`: explicit rotation matrices, the N x N matrix A, and LePE as shifts."""
    a = mlla_attention_matrix(q, k, hw, num_heads, eps, base, rope=rope_2d_ref)
    return _merge(a @ _heads(v, num_heads)) + lepe_ref(v, hw, lepe_weight, lepe_bias)
