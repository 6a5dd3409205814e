"""Softmax attention: dense reference and the SDPA fast path.

Shapes: q (B, h, N, d); k, v (B, h, n, d); mask broadcastable to (B, h, N, n), bool, True = may attend;
bias broadcastable to (B, h, N, n), float, added to the logits. A query row whose keys are all masked returns zeros
(never NaN) in both paths.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...backend import decompose_attention, onnx_graph_active

__all__ = ["sdpa", "sdpa_written_out", "export_mask",
           "softmax_attention_ref", "softmax_attention_probs", "softmax_attention", "spatial_reduction_ref",
           "adaptive_pool_bins", "adaptive_pool_2d", "adaptive_pool_matrix", "patch_mean_matrix", "causal_band_mask",
           "sliding_window_attention_ref", "sliding_window_attention"]


def sdpa_written_out(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
                     scale: float | None = None) -> torch.Tensor:
    """`F.scaled_dot_product_attention(q, k, v, attn_mask, scale=scale)` written out for a compiler to fuse.

    q k^T runs in the inputs' dtype; scale, mask and softmax run in float32 (float64 for float64 inputs); the
    probabilities return to v's dtype for the product with v. attn_mask as SDPA's: bool (True = may attend) or float
    (added to the logits), broadcastable to (..., N, n). A query row with no key left returns zeros, as SDPA's CPU
    kernel does, with zero gradients.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits = torch.matmul(q, k.transpose(-2, -1))
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) * scale
    if attn_mask is None:
        probs = logits.softmax(dim=-1)
    else:
        if attn_mask.dtype == torch.bool:
            logits = logits.masked_fill(~attn_mask, float("-inf"))
        else:
            logits = logits + attn_mask.to(logits.dtype)
        any_key = logits.amax(dim=-1, keepdim=True) > float("-inf")
        # Rows with no key get finite logits before the softmax, so their (zeroed) gradients stay finite.
        probs = torch.where(any_key, torch.where(any_key, logits, 0.0).softmax(dim=-1), 0.0)
    return torch.matmul(probs.to(v.dtype), v)


def export_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A bool SDPA mask (True = may attend) as the additive float mask (0 / -inf, `dtype`) in an exported program;
    unchanged elsewhere. Only for masks whose every query row keeps at least one key.

    ONNX's translation of SDPA with a bool mask turns it into -inf logits and then zeroes the probabilities of empty
    rows with `Where(IsNaN(p), 0, p)` over the whole (..., N, n) probability tensor; with a float mask there is only
    the addition. That Where was 10-12 % of the CSWin models' int8 ONNX Runtime step at 512 px on a Zen 3 EPYC.
    A caller whose rows are never empty (the padded CSWin stripes: every query row keeps its real keys or is a
    padded row kept whole) passes the mask through here.
    """
    if mask.dtype == torch.bool and torch.compiler.is_exporting():
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))
    return mask


def _attention_for_onnx(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
                        scale: float | None) -> torch.Tensor:
    """softmax(q k^T scale + mask) v as plain operators, for a graph traced for ONNX (`subquad.backend.onnx_graph`).

    ONNX's own translation of SDPA reshapes k to 3-D, transposes it as a separate node and scales q and k by the
    square root of the scale; written out, k^T is an operand ONNX Runtime can fuse into its MatMul and the scale one
    multiplication of the logits. No mask or a float mask only (rows are never empty: a float mask's callers keep a
    key in every row, as ONNX's float-mask translation assumes).
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits = torch.matmul(q, k.transpose(-2, -1)) * scale
    if attn_mask is not None:
        logits = logits + attn_mask.to(logits.dtype)  # as SDPA: the mask does not promote the logits
    return torch.matmul(logits.softmax(dim=-1), v)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
         dropout_p: float = 0.0, scale: float | None = None) -> torch.Tensor:
    """`F.scaled_dot_product_attention`, or `sdpa_written_out` where `subquad.backend.decompose_attention` says so
    (bf16 inference on a CPU under `torch.compile` without a bool mask, where the fused kernel gains nothing from
    bf16)."""
    if decompose_attention(q, k, v, dropout_p, attn_mask):
        return sdpa_written_out(q, k, v, attn_mask, scale)
    if onnx_graph_active() and torch.compiler.is_exporting() and not dropout_p and (
            attn_mask is None or attn_mask.dtype != torch.bool):
        return _attention_for_onnx(q, k, v, attn_mask, scale)
    # torch's fused CPU kernel refuses a mask of lower rank than q and a q, k or v whose last dim is strided, and
    # then runs its unfused math path (agent attention's (h, A, N) biases and pooled agent tokens: 3-4x slower per
    # call; benchmarks/sdpa_fused_cpu.py). The same broadcast at q's rank, and a copy of a strided operand, keep it
    # in eager mode (traced graphs keep the call as written: its strides are symbolic there).
    if q.device.type == "cpu" and not torch.compiler.is_compiling():
        if attn_mask is not None and attn_mask.dim() < q.dim():
            attn_mask = attn_mask[(None,) * (q.dim() - attn_mask.dim())]
        # Only where the fused kernel can run (4-D, no dropout, no mask gradient): elsewhere torch takes the math
        # path anyway, and the copies would be wasted.
        if q.dim() == 4 and not dropout_p and not (attn_mask is not None and attn_mask.requires_grad):
            q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)


def softmax_attention_probs(q: torch.Tensor, k: torch.Tensor, scale: float | None = None,
                            mask: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Dense attention probabilities (B, h, N, n); fully masked rows are all zero."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    logits = (q * scale) @ k.transpose(-2, -1)  # (B, h, N, n)
    if bias is not None:
        logits = logits + bias
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
        any_key = mask.any(dim=-1, keepdim=True)
        logits = torch.where(any_key, logits, torch.zeros_like(logits))
        probs = logits.softmax(dim=-1)
        return torch.where(any_key, probs, torch.zeros_like(probs))
    return logits.softmax(dim=-1)


def softmax_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                          mask: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Reference: softmax(q k^T * scale + bias, masked) v, materialising the (B, h, N, n) matrix."""
    return softmax_attention_probs(q, k, scale, mask, bias) @ v


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                      mask: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Fast path through `F.scaled_dot_product_attention` (fused flash kernel on CPU and CUDA).

    A bool mask and a float bias are merged into one float mask when both are given. Query rows with no key left
    are zeroed afterwards (SDPA would return NaN or an average there).
    """
    attn_mask = None
    if bias is not None:
        attn_mask = bias.to(q.dtype)
        if mask is not None:
            attn_mask = attn_mask.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        attn_mask = mask
    if mask is not None:
        any_key = mask.any(dim=-1, keepdim=True)  # broadcastable to (B, h, N, 1)
        if not bool(any_key.all()):
            # Rows with no key: give them one harmless key so the kernel stays finite, then zero them.
            fill = ~any_key
            if attn_mask.dtype == torch.bool:
                attn_mask = attn_mask | fill
            else:
                attn_mask = attn_mask.masked_fill(fill, 0.0)
            out = sdpa(q, k, v, attn_mask=attn_mask, scale=scale)
            return out.masked_fill(fill, 0.0)
    return sdpa(q, k, v, attn_mask=attn_mask, scale=scale)


def spatial_reduction_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                          sr_ratio: int) -> torch.Tensor:
    """PVT key/value reduction, written as a patch-wise linear map: (B, C, H, W) -> (B, n, C_out).

    Equals `Conv2d(C, C_out, kernel_size=sr, stride=sr)` (a trailing remainder of H or W is dropped, as the conv
    does); n = (H // sr) * (W // sr), row-major. weight: (C_out, C, sr, sr); bias: (C_out,).
    """
    B, C, H, W = x.shape
    s = sr_ratio
    h, w = H // s, W // s
    # (B, C, h, s, w, s) -> (B, h, w, C, s, s): one row per patch.
    patches = x[:, :, : h * s, : w * s].reshape(B, C, h, s, w, s).permute(0, 2, 4, 1, 3, 5)
    out = torch.einsum("bhwcij,ocij->bhwo", patches, weight)
    if bias is not None:
        out = out + bias
    return out.reshape(B, h * w, -1)


def adaptive_pool_bins(size_in: int, size_out: int, dtype: torch.dtype = torch.float64,
                       device: torch.device | None = None) -> torch.Tensor:
    """(size_out, size_in) matrix of 1-D adaptive average pooling: output i averages inputs
    [floor(i * n / m), ceil((i + 1) * n / m)) (PyTorch's AdaptiveAvgPool bins; they overlap when m > n).

    Built from comparisons of index vectors, so a symbolic size_in (torch.export) stays symbolic: no loop over it,
    no slice bounds, no negative floor division (ONNX's integer division truncates)."""
    j = torch.arange(size_in, device=device)
    i = torch.arange(size_out, device=device)
    lo = (i * size_in) // size_out
    hi = ((i + 1) * size_in + size_out - 1) // size_out
    inside = (j[None, :] >= lo[:, None]) & (j[None, :] < hi[:, None])
    return inside.to(dtype) / (hi - lo).to(dtype)[:, None]


def adaptive_pool_matrix(hw: tuple[int, int], out_hw: tuple[int, int], device=None,
                         dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(n, N) averaging matrix of `AdaptiveAvgPool2d(out_hw)` on an (H, W) map: bin i spans
    [floor(i H / h), ceil((i + 1) H / h)) in each direction (torch's rule)."""
    return torch.kron(adaptive_pool_bins(hw[0], out_hw[0], dtype, device),
                      adaptive_pool_bins(hw[1], out_hw[1], dtype, device))


def adaptive_pool_2d(x: torch.Tensor, out_hw: int | tuple[int, int]) -> torch.Tensor:
    """`F.adaptive_avg_pool2d(x, out_hw)` for a map (B, C, H, W); in a `torch.export` trace as two products with
    `adaptive_pool_bins`. The exported ONNX graph of adaptive_avg_pool2d over symbolic sides computes other bins than
    eager, or fails in ONNX Runtime, whenever H or W is not the traced one (torch 2.14)."""
    out_hw = (out_hw, out_hw) if isinstance(out_hw, int) else tuple(out_hw)
    if not torch.compiler.is_exporting():
        return F.adaptive_avg_pool2d(x, out_hw)
    H, W = x.shape[-2:]
    ph = adaptive_pool_bins(H, out_hw[0], x.dtype, x.device)
    pw = adaptive_pool_bins(W, out_hw[1], x.dtype, x.device)
    return torch.einsum("ih,bchw,jw->bcij", ph, x, pw)


def patch_mean_matrix(hw: tuple[int, int], sr_ratio: int, device=None,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(n, N) matrix averaging each sr x sr patch (remainder rows/columns get no weight)."""
    H, W = hw
    s = sr_ratio

    def bins(size: int) -> torch.Tensor:
        m = torch.zeros(size // s, size, dtype=dtype, device=device)
        for i in range(size // s):
            m[i, i * s:(i + 1) * s] = 1.0 / s
        return m

    return torch.kron(bins(H), bins(W))


def causal_band_mask(n: int, window: int, device=None) -> torch.Tensor:
    """(n, n) bool: query t may attend to key j when t - window < j <= t (the last `window` tokens, itself included)."""
    i = torch.arange(n, device=device)
    delta = i[:, None] - i[None, :]
    return (delta >= 0) & (delta < window)


def sliding_window_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                                 scale: float | None = None) -> torch.Tensor:
    """Reference causal sliding-window softmax: the dense (N, N) band mask of `causal_band_mask` and
    `softmax_attention_ref`. Shapes: q, k (B, h, N, d), v (B, h, N, d_v) -> (B, h, N, d_v)."""
    return softmax_attention_ref(q, k, v, scale, causal_band_mask(q.shape[-2], window, q.device))


def sliding_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                             scale: float | None = None, block: int | None = None) -> torch.Tensor:
    """Blocked fast path of `sliding_window_attention_ref`: O(N (b + w) d) instead of O(N^2 d).

    Queries are cut into blocks of b tokens (default max(w, 16)); block i (positions i b ... i b + b - 1) needs the
    b + w - 1 keys from i b - w + 1 on, read as one strided window of the keys padded with w - 1 absent positions in
    front. One SDPA call over all blocks with a (b, b + w - 1) band mask per block; every query keeps at least its
    own key, so no row is empty.
    """
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"sliding-window attention: window must be an int >= 1, got {window!r}")
    B, h, N, d = q.shape
    w = window
    b = max(w, 16) if block is None else block
    b = max(1, min(b, N))
    n = -(-N // b)
    L = n * b
    span = b + w - 1
    qp = F.pad(q, (0, 0, 0, L - N)).reshape(B, h, n, b, d)
    kp = F.pad(k, (0, 0, w - 1, L - N))  # (B, h, w - 1 + L, d)
    vp = F.pad(v, (0, 0, w - 1, L - N))
    kb = kp.unfold(2, span, b).transpose(-2, -1)  # (B, h, n, span, d)
    vb = vp.unfold(2, span, b).transpose(-2, -1)
    r = torch.arange(b, device=q.device)[:, None]
    c = torch.arange(span, device=q.device)[None, :]
    band = (c >= r) & (c <= r + w - 1)  # (b, span): key c of a block sits at i b - w + 1 + c
    start = torch.arange(n, device=q.device)[:, None, None] * b - (w - 1)
    mask = band[None] & (start + c[None] >= 0)  # (n, b, span): no key before position 0
    out = sdpa(qp, kb, vb, attn_mask=mask, scale=scale)
    return out.reshape(B, h, L, -1)[:, :, :N]
