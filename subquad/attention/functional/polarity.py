"""PolaFormer polarity-aware linear attention: the polarity feature maps, the full token-level operator (dense
reference and fast path).

Token-level shapes (the module boundary, before the head split): q, k, v and the gate g (B, N, C) with N = H * W
grid tokens, channel layout head-major (channel = head * d + c). Inside, the linear core runs on (B, h, N, 2d) from
`functional/linear.py` (the normaliser 'mean' with eps 1e-6, FLatten's, which the official code reuses).

Operator (official code; paper Eq. 6-9 with the learned power of Sec. 4.2):
    q' = q / s, k' = (k + PE) / s with s = softplus(scale) per channel;
    per head, with the learned exponent p = 1 + alpha * sigmoid(power) per head channel (p in (1, 1 + alpha)):
        q+ = ReLU(q')^p, q- = ReLU(-q')^p, k+ = ReLU(k')^p, k- = ReLU(-k')^p;
        K = [k+, k-], Q_sim = [q+, q-] (same-sign pairs), Q_opp = [q-, q+] (opposite-sign pairs);
        v = [v1, v2] split along the head channels (v1 the first ceil(d / 2), as `torch.chunk`);
        o_sim = LinearCore(Q_sim, K, v1), o_opp = LinearCore(Q_opp, K, v2), o = [o_sim, o_opp];
    out = (o + DWC(v_grid)) * g.
The DWC is one depthwise k x k conv over the d head channels, shared by every head (as FLatten's), on the grid.

Paper: PolaFormer (arXiv 2501.15061), Sec. 4.1 Eq. 6-9 (polarity-aware attention; the same-/opposite-sign halves
of V), Sec. 4.2 (learnable power function) and Sec. 4.3 / Fig. 3 (DWC for rank restoration, the gate).
Official: ZacharyMeng/PolaFormer `models/pola_swin.py` and `models/pola_pvt.py` `PolaLinearAttention.forward`.
Symbols: h heads, d = C / h, alpha (official `alpha`, 4), p the learned power, k DWC kernel size (5).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..._shapes import tracing
from .linear import depthwise_conv_matrix, linear_attention, linear_attention_matrix, linear_attention_ref

__all__ = ["polarity_features", "polarity_linear_attention_ref", "polarity_linear_attention_kv",
           "polarity_attention_maps"]

NORM_EPS = 1e-6


def _split(x: torch.Tensor, h: int) -> torch.Tensor:
    B, L, C = x.shape
    return x.reshape(B, L, h, C // h).transpose(1, 2)  # (B, h, L, d)


def _merge(x: torch.Tensor) -> torch.Tensor:
    B, h, L, d = x.shape
    return x.transpose(1, 2).reshape(B, L, h * d)


def polarity_features(x: torch.Tensor, scale: torch.Tensor, power: torch.Tensor, alpha: float,
                      num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The positive and negative parts of x / softplus(scale), each raised to the learned power, per head.

    Args:
        x: (B, L, C) projected queries or keys (keys with the positional encoding added).
        scale: (1, 1, C) raw `scale` parameter (softplus applied here).
        power: (1, h, 1, d) raw `power` parameter; the exponent is 1 + alpha * sigmoid(power).
        alpha: the power range.
        num_heads: h.

    Returns:
        (ReLU(x')^p, ReLU(-x')^p), each (B, h, L, d).
    """
    xs = _split(x / F.softplus(scale), num_heads)
    p = 1 + alpha * torch.sigmoid(power)
    return F.relu(xs).pow(p), F.relu(-xs).pow(p)


def _polarity_features_fast(x: torch.Tensor, scale: torch.Tensor, power: torch.Tensor, alpha: float,
                            num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`polarity_features`, with each power written as exp(p log t) in an exported inference program (t = 0 gives
    exp(-inf) = 0, as 0^p with p > 1).

    ONNX Runtime's CPU `Pow` with a per-channel exponent runs element by element: it was 21-31 % of PolaFormer-PVT's
    int8 step on a Zen 3 EPYC, and Log, Mul and Exp (vectorised) take 2.4x less time on its first stage's features
    (benchmarks/results/export-forms-zen3). Splitting one |x'|^p by sign with `Where` was slower there than both
    powers. Eager keeps `pow` (vectorised in PyTorch; exp-log ran 1.7x slower).
    """
    xs = _split(x / F.softplus(scale), num_heads)
    p = 1 + alpha * torch.sigmoid(power)
    if torch.compiler.is_exporting() and not torch.is_grad_enabled():
        # inference programs only: the exponent's gradient of exp(p log t) is NaN at t = 0 (pow's is 0)
        return torch.exp(p * torch.log(F.relu(xs))), torch.exp(p * torch.log(F.relu(-xs)))
    return F.relu(xs).pow(p), F.relu(-xs).pow(p)


def _check(q, k, v, g, hw, num_heads: int) -> None:
    B, N, C = q.shape
    if C % num_heads:
        raise ValueError(f"polarity attention: C={C} must be a multiple of num_heads={num_heads}")
    if hw[0] * hw[1] != N:
        raise ValueError(f"polarity attention: hw={hw[0]}x{hw[1]} != N={N}")
    if k.shape != q.shape or v.shape != q.shape or g.shape != q.shape:
        raise ValueError(f"polarity attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} and "
                         f"g {tuple(g.shape)} must have the same shape")


def _halves(q, k, v, scale, power, alpha, h):
    """(Q_sim, Q_opp, K, v1, v2) on (B, h, ., .)."""
    qp, qn = polarity_features(q, scale, power, alpha, h)
    kp, kn = polarity_features(k, scale, power, alpha, h)
    vh = _split(v, h)
    d1 = (vh.shape[-1] + 1) // 2  # torch.chunk(v, 2): the first half takes the odd channel
    return torch.cat([qp, qn], -1), torch.cat([qn, qp], -1), torch.cat([kp, kn], -1), vh[..., :d1], vh[..., d1:]


def _polarity_core(q, k, v, scale, power, alpha, h) -> torch.Tensor:
    """Both halves of the polarity core in one product over the queries: (B, h, N, d) before the merge.

    Q_opp = [q-, q+] is Q_sim = [q+, q-] with its halves swapped, so Q_opp M = Q_sim swap(M), swap exchanging the
    first and last d rows of M. With K = [k+, k-] and KV = K^T v (both halves of v at once):
        Q_sim [KV[:, :d1] | swap(KV[:, d1:]) | sum K | swap(sum K)] = [num_sim | num_opp | den_sim | den_opp],
    each then normalised as `linear_attention` (normaliser 'mean', eps 1e-6). Q_opp is never built.
    """
    qp, qn = _polarity_features_fast(q, scale, power, alpha, h)
    kp, kn = _polarity_features_fast(k, scale, power, alpha, h)
    kk = torch.cat([kp, kn], -1)  # (B, h, n, 2d)
    vh = _split(v, h)  # (B, h, n, d)
    n, d = vh.shape[-2], vh.shape[-1]
    d1 = (d + 1) // 2  # torch.chunk(v, 2): the first half takes the odd channel
    kv = kk.transpose(-2, -1) @ vh  # (B, h, 2d, d)
    ksum = kk.sum(dim=-2).unsqueeze(-1)  # (B, h, 2d, 1)

    def swap(m: torch.Tensor) -> torch.Tensor:
        return torch.cat([m[..., d:, :], m[..., :d, :]], -2)

    nd = torch.cat([qp, qn], -1) @ torch.cat([kv[..., :d1], swap(kv[..., d1:]), ksum, swap(ksum)], -1)
    num, den = nd[..., :d] / n, nd[..., d:] / n + NORM_EPS  # (B, h, N, d), (B, h, N, 2)
    return torch.cat([num[..., :d1] / den[..., :1], num[..., d1:] / den[..., 1:]], -1)


def polarity_linear_attention_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                                 scale: torch.Tensor, power: torch.Tensor, dwc_weight: torch.Tensor | None,
                                 dwc_bias: torch.Tensor | None = None, *, hw: tuple[int, int], num_heads: int,
                                 alpha: float = 4.0) -> torch.Tensor:
    """Fast polarity-aware linear attention (K^T V first for both halves, DWC by conv2d).

    Args:
        q: (B, N, C) projected queries, N = H * W.
        k: (B, N, C) projected keys with the positional encoding already added.
        v: (B, N, C) projected values.
        g: (B, N, C) the gate (the fourth projection).
        scale: (1, 1, C) raw `scale` parameter.
        power: (1, h, 1, d) raw `power` parameter.
        dwc_weight: (d, 1, k, k) depthwise kernel shared by the heads (`dwc.weight`), or None for no DWC term;
            dwc_bias: (d,) or None.
        hw: grid (H, W).
        num_heads: h.
        alpha: power range (exponent in (1, 1 + alpha)).

    Returns:
        (B, N, C), before the output projection.
    """
    _check(q, k, v, g, hw, num_heads)
    h = num_heads
    if tracing() and torch.is_grad_enabled():
        # Two linear cores, as the reference: the one-product form below slices a product with a concatenated
        # right-hand side, whose backward AOTAutograd compiles wrongly (see `linear.linear_attention`).
        q_sim, q_opp, kk, v1, v2 = _halves(q, k, v, scale, power, alpha, h)
        o = torch.cat([linear_attention(q_sim, kk, v1, "mean", NORM_EPS, order="kv"),
                       linear_attention(q_opp, kk, v2, "mean", NORM_EPS, order="kv")], -1)  # (B, h, N, d)
    else:
        o = _polarity_core(q, k, v, scale, power, alpha, h)
    out = _merge(o)
    if dwc_weight is not None:
        B, N, C = v.shape
        vm = v.transpose(1, 2).reshape(B, C, hw[0], hw[1]).contiguous(memory_format=torch.channels_last)
        # The d-channel kernel shared by all heads is the C-channel depthwise kernel repeated h times (head-major).
        w = torch.cat([dwc_weight] * h)
        b = None if dwc_bias is None else torch.cat([dwc_bias] * h)
        conv = F.conv2d(vm, w, b, padding=(w.shape[-2] // 2, w.shape[-1] // 2), groups=C)
        out = out + conv.flatten(2).transpose(1, 2)
    return out * g


def polarity_linear_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                                  scale: torch.Tensor, power: torch.Tensor, dwc_weight: torch.Tensor | None,
                                  dwc_bias: torch.Tensor | None = None, *, hw: tuple[int, int], num_heads: int,
                                  alpha: float = 4.0) -> torch.Tensor:
    """Dense reference of `polarity_linear_attention_kv` (same arguments and result).

    The same-sign and opposite-sign kernel matrices A_sim = Q_sim K^T / N and A_opp = Q_opp K^T / N (N x N per
    head) are built explicitly and row-normalised; the DWC is an explicit N x N matrix per head channel.
    """
    _check(q, k, v, g, hw, num_heads)
    h = num_heads
    q_sim, q_opp, kk, v1, v2 = _halves(q, k, v, scale, power, alpha, h)
    o = torch.cat([linear_attention_ref(q_sim, kk, v1, "mean", NORM_EPS),
                   linear_attention_ref(q_opp, kk, v2, "mean", NORM_EPS)], -1)  # (B, h, N, d)
    if dwc_weight is not None:
        m = depthwise_conv_matrix(dwc_weight.to(v.dtype), tuple(hw))  # (d, N, N)
        conv = torch.einsum("cij,bhjc->bhic", m, _split(v, h))  # (B, h, N, d)
        if dwc_bias is not None:
            conv = conv + dwc_bias
        o = o + conv
    return _merge(o) * g


def polarity_attention_maps(q: torch.Tensor, k: torch.Tensor, scale: torch.Tensor, power: torch.Tensor, *,
                            num_heads: int, alpha: float = 4.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The two row-normalised kernel maps of the polarity attention, (A_sim, A_opp), each (B, h, N, N): A_sim
    mixes the first half of each head's value channels, A_opp the second (before the DWC and the gate).

    Args: q, k (B, N, C) as `polarity_linear_attention_kv` (keys with the positional encoding added); scale, power,
        num_heads, alpha as there.
    """
    h = num_heads
    qp, qn = polarity_features(q, scale, power, alpha, h)
    kp, kn = polarity_features(k, scale, power, alpha, h)
    kk = torch.cat([kp, kn], -1)
    return (linear_attention_matrix(torch.cat([qp, qn], -1), kk, "mean", NORM_EPS),
            linear_attention_matrix(torch.cat([qn, qp], -1), kk, "mean", NORM_EPS))
