"""Kernel (linear) attention: the one non-causal core shared by L2ViT, FLatten and the generic baselines.

Shapes: q (B, h, N, d') and k (B, h, n, d') are already feature-mapped (phi(Q), phi(K)); v (B, h, n, d_v);
outputs (B, h, N, d_v). `kv_scale` broadcasts against (B, h, 1, 1) (L2ViT's per-head temperature (h, 1, 1)).

With A_ij = q_i . k_j (the un-normalised kernel matrix, N x n), every variant computes

    out_i = s * sum_j A_ij v_j / c  /  den_i,    den_i = max(sum_j A_ij / c + eps, clamp_min)

Symbols:
    c: 1 for normaliser='sum', n for normaliser='mean' (FLatten's current code: mean(k) in the denominator and
        (k / sqrt(n))^T (v / sqrt(n)) in the numerator, i.e. the same quotient with eps entering n times larger);
    s: kv_scale (L2ViT `temperature`, paper s; multiplies the numerator only);
    eps: added to the denominator (FLatten 1e-6; L2ViT none);
    clamp_min: lower clamp of the denominator (L2ViT 100 on a token *sum*; FLatten none).
normaliser='none' drops the denominator (SimA, Efficient Attention, Hydra: their maps normalise themselves).

The dense reference builds A explicitly (float64-capable); the fast path evaluates q (k^T v) or (q k^T) v, whichever
costs fewer multiply-adds (`order='auto'`), and never forms an N x n matrix in the K-first order.

Paper: L2ViT paper Eq. 3-5 (ReLU kernel, clamp); FLatten (arXiv 2308.00442) Eq. 3 (linear attention) and Sec. 4.
Official: L2ViT `classification/models/l2vit.py` `LinearAttention.forward`; FLatten `models/flatten_*.py`
`FocusedLinearAttention.forward` (the z / kv lines).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..._shapes import tracing

__all__ = [
    "NORMALISERS",
    "FEATURE_MAPS",
    "linear_attention_matrix",
    "linear_attention_ref",
    "linear_attention",
    "causal_linear_attention_ref",
    "causal_linear_attention",
    "causal_linear_attention_chunked",
    "enhanced_linear_attention_ref",
    "enhanced_linear_attention_kv",
    "feature_map",
    "depthwise_conv_matrix",
]

NORMALISERS = ("sum", "mean", "none")
ORDERS = ("auto", "kv", "qk")


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, normaliser: str, order: str = "auto") -> None:
    if normaliser not in NORMALISERS:
        raise ValueError(f"normaliser={normaliser!r} is not one of {NORMALISERS}")
    if order not in ORDERS:
        raise ValueError(f"order={order!r} is not one of {ORDERS}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"linear attention expects (B, h, N, d) tensors, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if (q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2] or q.shape[:2] != k.shape[:2]
            or k.shape[:2] != v.shape[:2]):
        raise ValueError(f"linear attention: incompatible q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")


def linear_attention_matrix(q: torch.Tensor, k: torch.Tensor, normaliser: str = "sum", eps: float = 0.0,
                            clamp_min: float | None = None, kv_scale: torch.Tensor | float | None = None
                            ) -> torch.Tensor:
    """Dense normalised kernel matrix P (B, h, N, n) with out = P @ v (exact for every normaliser).

    Args:
        q: (B, h, N, d') feature-mapped queries.
        k: (B, h, n, d') feature-mapped keys.
        normaliser: 'sum' | 'mean' | 'none' (see the module docstring).
        eps: added to the denominator.
        clamp_min: lower clamp of the denominator (None: no clamp).
        kv_scale: numerator scale broadcastable to (B, h, 1, 1), or None.
    """
    _check(q, k, k, normaliser)
    n = k.shape[-2]
    a = q @ k.transpose(-2, -1)  # (B, h, N, n)
    if normaliser == "mean":
        a = a / n
    if normaliser != "none":
        den = a.sum(dim=-1, keepdim=True) + eps  # (B, h, N, 1)
        if clamp_min is not None:
            den = den.clamp(min=clamp_min)
        a = a / den
    if kv_scale is not None:
        a = a * kv_scale
    return a


def linear_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, normaliser: str = "sum",
                         eps: float = 0.0, clamp_min: float | None = None,
                         kv_scale: torch.Tensor | float | None = None) -> torch.Tensor:
    """Reference: P @ v with the explicit (B, h, N, n) matrix of `linear_attention_matrix`."""
    return linear_attention_matrix(q, k, normaliser, eps, clamp_min, kv_scale) @ v


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, normaliser: str = "sum", eps: float = 0.0,
                     clamp_min: float | None = None, kv_scale: torch.Tensor | float | None = None,
                     order: str = "auto") -> torch.Tensor:
    """Fast path of `linear_attention_ref`: O(N d^2) with K^T V first, or (Q K^T) V when that is cheaper.

    Args:
        q: (B, h, N, d') feature-mapped queries.
        k: (B, h, n, d') feature-mapped keys.
        v: (B, h, n, d_v) values.
        normaliser: 'sum' | 'mean' | 'none'.
        eps: added to the denominator.
        clamp_min: lower clamp of the denominator (None: no clamp).
        kv_scale: numerator scale broadcastable to (B, h, 1, 1), or None.
        order: 'auto' (fewest multiply-adds), 'kv' (q (k^T v), the official order) or 'qk' ((q k^T) v).

    Returns:
        (B, h, N, d_v).
    """
    _check(q, k, v, normaliser, order)
    N, dq = q.shape[-2], q.shape[-1]
    n, dv = v.shape[-2:]
    if order == "auto":
        # K-first: n*dq*dv + N*dq*dv; Q-first: N*n*dq + N*n*dv.
        order = "kv" if (n + N) * dq * dv <= N * n * (dq + dv) else "qk"
    if order == "qk":
        return linear_attention_ref(q, k, v, normaliser, eps, clamp_min, kv_scale)
    kv = k.transpose(-2, -1) @ v  # (B, h, d', d_v)
    if normaliser == "none":
        return q @ (kv if kv_scale is None else kv * kv_scale)  # (B, h, N, d_v)
    if kv_scale is not None:
        kv = kv * kv_scale
    ksum = k.sum(dim=-2).unsqueeze(-1)  # (B, h, d', 1)
    if tracing():
        # Two products: the backward AOTAutograd builds for the fused one below views a non-contiguous slice of the
        # concatenation's gradient, which fails when the compiled program runs.
        num, den = q @ kv, q @ ksum
    else:
        # Numerator and denominator in one pass over q: q [kv | ksum] -> (B, h, N, d_v + 1).
        nd = q @ torch.cat([kv, ksum], dim=-1)
        num, den = nd[..., :dv], nd[..., dv:]
    if normaliser == "mean":
        # Both divided by n (FLatten's mean(k)): eps and the clamp act on the mean, as in the official code. (Folding
        # n into eps instead would make eps a symbolic float in a traced program, which PyTorch specialises.)
        num, den = num / n, den / n
    if eps:
        den = den + eps
    if clamp_min is not None:
        den = den.clamp(min=clamp_min)
    return num / den


def causal_linear_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """Causal reference (N == n): out_t = sum_{j<=t} (q_t.k_j) v_j / (sum_{j<=t} q_t.k_j + eps), dense N x N."""
    a = (q @ k.transpose(-2, -1)).tril()  # (B, h, N, N)
    return (a / (a.sum(-1, keepdim=True) + eps)) @ v


def causal_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """Causal fast path by prefix sums of k_j^T v_j (memory O(N d^2); for reference-sized problems)."""
    s = torch.cumsum(k.unsqueeze(-1) * v.unsqueeze(-2), dim=-3)  # (B, h, N, d', d_v)
    z = torch.cumsum(k, dim=-2)  # (B, h, N, d')
    num = (q.unsqueeze(-2) @ s).squeeze(-2)  # (B, h, N, d_v)
    return num / ((q * z).sum(-1, keepdim=True) + eps)


def causal_linear_attention_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, eps: float = 0.0,
                                    chunk_size: int = 64) -> torch.Tensor:
    """Causal fast path in chunks of c tokens: O(N c d + N d^2) time, O(N c + (N / c) d^2) memory.

    Inside a chunk the masked (c x c) kernel matrix is used; across chunks the prefix sums S = sum_j k_j^T v_j and
    z = sum_j k_j of all earlier chunks (an exclusive cumsum over chunks) carry the past, as in the recurrent form
    of Katharopoulos et al. 2020 ("Transformers are RNNs", arXiv 2006.16236, Sec. 3.2 and Eq. 9-12). Same function
    as `causal_linear_attention_ref`; any N (the last chunk is padded with zero keys/values, which add nothing).

    Shapes: q (B, h, N, d'), k (B, h, N, d'), v (B, h, N, d_v) -> (B, h, N, d_v).
    """
    if chunk_size < 1:
        raise ValueError(f"causal linear attention: chunk_size must be >= 1, got {chunk_size}")
    B, h, N, dq = q.shape
    if k.shape[-2] != N or v.shape[-2] != N:
        raise ValueError(f"causal linear attention needs as many keys as queries, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    dv = v.shape[-1]
    c = min(chunk_size, N)
    n = -(-N // c)
    pad = n * c - N
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    qc, kc, vc = (t.reshape(B, h, n, c, t.shape[-1]) for t in (q, k, v))
    a = (qc @ kc.transpose(-2, -1)).tril()  # (B, h, n, c, c): within-chunk kernel, causal
    kv = kc.transpose(-2, -1) @ vc  # (B, h, n, d', d_v)
    # exclusive prefix over chunks: the state entering chunk i holds chunks 0 .. i-1
    s = torch.cat([torch.zeros_like(kv[:, :, :1]), torch.cumsum(kv[:, :, :-1], dim=2)], dim=2)
    ksum = kc.sum(dim=-2)  # (B, h, n, d')
    z = torch.cat([torch.zeros_like(ksum[:, :, :1]), torch.cumsum(ksum[:, :, :-1], dim=2)], dim=2)
    num = a @ vc + qc @ s  # (B, h, n, c, d_v)
    den = a.sum(-1, keepdim=True) + (qc * z.unsqueeze(-2)).sum(-1, keepdim=True)
    out = (num / (den + eps)).reshape(B, h, n * c, dv)
    return out[:, :, :N]


def enhanced_linear_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                  temperature: torch.Tensor | float, clamp_min: float = 100.0) -> torch.Tensor:
    """L2ViT enhanced linear attention, dense: s_h sum_j (q_i.k_j) v_j / max(sum_j q_i.k_j, clamp_min).

    Args:
        q: (B, h, N, d) raw queries (ReLU applied here).
        k: (B, h, n, d) raw keys (ReLU applied here).
        v: (B, h, n, d).
        temperature: (h, 1, 1) per-head numerator scale s_h (paper s; official `temperature`).
        clamp_min: denominator clamp (official 1e2), applied to the token sum.
    """
    return linear_attention_ref(F.relu(q), F.relu(k), v, "sum", 0.0, clamp_min, temperature)


def enhanced_linear_attention_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 temperature: torch.Tensor | float, clamp_min: float = 100.0) -> torch.Tensor:
    """Fast path of `enhanced_linear_attention_ref`: K^T V first, as the official code (shapes as the reference)."""
    return linear_attention(F.relu(q), F.relu(k), v, "sum", 0.0, clamp_min, temperature, order="kv")


def _mask_keys(k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return k if mask is None else k * mask[:, None, :, None].to(k.dtype)


def _relu(x: torch.Tensor, is_key: bool, mask: torch.Tensor | None) -> torch.Tensor:
    return _mask_keys(F.relu(x), mask) if is_key else F.relu(x)


def _elu1(x: torch.Tensor, is_key: bool, mask: torch.Tensor | None) -> torch.Tensor:
    if tracing():
        # The strides a traced program predicts for ELU's gradient of a transposed input differ from the kernel's,
        # and a view decided on them fails when the compiled backward runs.
        x = x.contiguous()
    y = F.elu(x) + 1.0
    return _mask_keys(y, mask) if is_key else y


def _leaky_relu(x: torch.Tensor, is_key: bool, mask: torch.Tensor | None) -> torch.Tensor:
    y = F.leaky_relu(x, 0.01)
    return _mask_keys(y, mask) if is_key else y


def _l1(x: torch.Tensor, is_key: bool, mask: torch.Tensor | None) -> torch.Tensor:
    # SimA: each channel divided by its L1 norm over the tokens; padded tokens (mask False) are left out of the norm
    # (queries too, in self-attention), so padding never changes the real rows.
    xm = _mask_keys(x, mask)
    return (xm if is_key else x) / xm.abs().sum(dim=-2, keepdim=True).clamp_min(1e-6)


def _softmax(x: torch.Tensor, is_key: bool, mask: torch.Tensor | None) -> torch.Tensor:
    # Efficient Attention: queries softmax over channels, keys softmax over tokens.
    if not is_key:
        return x.softmax(dim=-1)
    if mask is None:
        return x.softmax(dim=-2)
    # Masked keys get the lowest finite logit and are zeroed after the softmax, so a sample whose keys are all
    # padding gives zeros (never 0/0 = NaN).
    m = mask[:, None, :, None]
    return x.masked_fill(~m, torch.finfo(x.dtype).min).softmax(dim=-2) * m.to(x.dtype)


def _hydra(x: torch.Tensor, is_key: bool, mask: torch.Tensor | None) -> torch.Tensor:
    # Hydra: L2 normalisation over the channels of the (single) head; the module uses d = 1 heads.
    y = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)
    return _mask_keys(y, mask) if is_key else y


def _cosformer(x: torch.Tensor, is_key: bool, mask: torch.Tensor | None,
               length: int | torch.Tensor | None = None) -> torch.Tensor:
    # cosFormer: relu(x) re-weighted by cos/sin(pi/2 * i / M), i = 1..L, concatenated to 2d channels, so that
    # phi(q_i).phi(k_j) = relu(q_i).relu(k_j) cos(pi/2 (i - j) / M). M is an int or a per-sample (B, 1, 1, 1)
    # tensor (the real, unpadded length when a mask is given).
    L = x.shape[-2]
    M = L if length is None else length
    pos = torch.arange(1, L + 1, device=x.device, dtype=x.dtype)[:, None]  # (L, 1)
    ang = pos * (math.pi / 2) / M  # (L, 1) or (B, 1, L, 1)
    r = F.relu(x)
    y = torch.cat([r * ang.cos(), r * ang.sin()], dim=-1)  # (B, h, L, 2d)
    return _mask_keys(y, mask) if is_key else y


FEATURE_MAPS: dict[str, Callable[..., torch.Tensor]] = {
    "relu": _relu,
    "elu1": _elu1,
    "leaky_relu": _leaky_relu,
    "l1": _l1,
    "softmax": _softmax,
    "hydra": _hydra,
    "cosformer": _cosformer,
}

# Maps that normalise themselves (no denominator in their papers).
SELF_NORMALISED = ("l1", "softmax", "hydra")


def feature_map(name: str, q: torch.Tensor, k: torch.Tensor,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply the named feature map to q (B, h, N, d) and k (B, h, n, d); mask (B, n) bool drops keys.

    Returns (phi(q), phi(k)) with d' channels (2d for 'cosformer', else d).
    """
    if name not in FEATURE_MAPS:
        raise ValueError(f"feature_map={name!r} is not one of {sorted(FEATURE_MAPS)}")
    fn = FEATURE_MAPS[name]
    # In self-attention (N == n) the key-padding mask also marks padded queries.
    qmask = mask if mask is not None and q.shape[-2] == mask.shape[-1] else None
    if name == "cosformer":
        if mask is None:
            m: int | torch.Tensor = max(q.shape[-2], k.shape[-2])
        else:
            # M = max(N, n) over the real (unpadded) tokens, per sample: (B, 1, 1, 1).
            real = mask.sum(dim=-1).to(q.dtype)
            m = (real if qmask is not None else real.clamp_min(q.shape[-2])).clamp_min(1)[:, None, None, None]
        return fn(q, False, None, m), fn(k, True, mask, m)
    if name == "l1":
        return fn(q, False, qmask), fn(k, True, mask)
    return fn(q, False, None), fn(k, True, mask)


def depthwise_conv_matrix(weight: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """Explicit token-mixing matrices of a depthwise 2-D convolution with zero 'same' padding (no bias).

    Args:
        weight: (C, 1, kh, kw) depthwise kernel (odd sizes; padding kh // 2, kw // 2, stride 1).
        hw: (H, W) grid.

    Returns:
        M (C, N, N), N = H * W, with conv(x)[c, i] = sum_j M[c, i, j] x[c, j] (row-major token order).
    """
    C, _, kh, kw = weight.shape
    H, W = hw
    ph, pw = kh // 2, kw // 2
    # Shift matrices: sh[a, y, y'] = 1 where input row y' = y + a - ph feeds output row y (zero padding outside).
    sh = torch.stack([torch.eye(H, dtype=weight.dtype, device=weight.device).roll(a - ph, 1)
                      * _band(H, a - ph, weight) for a in range(kh)])  # (kh, H, H)
    sw = torch.stack([torch.eye(W, dtype=weight.dtype, device=weight.device).roll(b - pw, 1)
                      * _band(W, b - pw, weight) for b in range(kw)])  # (kw, W, W)
    m = torch.einsum("cab,ayz,bxw->cyxzw", weight[:, 0], sh, sw)  # (C, H, W, H, W)
    return m.reshape(C, H * W, H * W)


def _band(size: int, shift: int, like: torch.Tensor) -> torch.Tensor:
    """(size, size) mask of the rows y whose shifted input y + shift lies inside [0, size)."""
    y = torch.arange(size, device=like.device)
    return ((y + shift >= 0) & (y + shift < size)).to(like.dtype)[:, None]
