"""FLatten focused linear attention: the focused feature map, the full token-level operator (dense reference and
fast path) and its DWC / V-resize / positional-encoding helpers.

Token-level shapes (the module boundary, before the head split): q (B, N, C), k and v (B, n, C) with
N = P + H * W query tokens and n = P + H_kv * W_kv key tokens, P leading prefix tokens (a class token), channel layout
head-major (channel = head * d + c). Inside, the linear core runs on (B, h, N, d) from `functional/linear.py`.

Operator (current official code):
    phi(x) = f_p(t) with t = (ReLU(x) + 1e-6) / softplus(scale), f_p(t) = t^p / ||t^p|| * ||t||, norms over all C;
    out = LinearCore(phi(q), phi(k), v; normaliser, eps=1e-6) + DWC(resize(v_grid)) [+ LePE(v_grid)].
The DWC is one depthwise k x k conv over the d head channels, shared by every head, applied to the grid tokens only
(prefix rows of the DWC term are 0). `normaliser='mean'` is the current code (mean(k), 1/sqrt(n)
scaling, i.e. eps enters n times larger), `'sum'` the original release.

1-D forms (ours; docs/deviations.md): `focused_linear_attention_1d` (fast) and `focused_linear_attention_1d_ref` (dense)
on (B, L, C) sequences: the same feature map and core, a depthwise conv1d over the tokens as the DWC ('same' padding,
or causal padding with the causal prefix-sum core), no positional encoding.

Paper: FLatten (arXiv 2308.00442), Eq. 5-6 (focused function f_p), Eq. 10-12 (rank restoration with DWC).
Official: LeapLabTHU/FLatten-Transformer `models/flatten_{swin,pvt,pvt_v2,cswin}.py` `FocusedLinearAttention.forward`.
Symbols: p focusing factor (paper p), k DWC kernel size, s = softplus(scale) per channel, h heads, d = C / h.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..._shapes import known_equal
from ...layers.precision import no_autocast
from .linear import (
    causal_linear_attention_chunked,
    depthwise_conv_matrix,
    linear_attention,
    linear_attention_matrix,
    linear_attention_ref,
)

__all__ = [
    "SR_MODES",
    "focused_feature_map",
    "resize_pe",
    "upsample_v",
    "upsample_matrix",
    "focused_linear_attention_ref",
    "focused_linear_attention_kv",
    "focused_attention_matrix",
    "focused_linear_attention_1d",
    "focused_linear_attention_1d_ref",
    "focused_attention_matrix_1d",
    "depthwise_conv_matrix_1d",
    "dwc_padding_1d",
]

SR_MODES = ("bilinear", "flat1d")
FEATURE_EPS = 1e-6
NORM_EPS = 1e-6


def focused_feature_map(x: torch.Tensor, scale: torch.Tensor, p: float) -> torch.Tensor:
    """FLatten feature map over the last (channel) axis: f_p((ReLU(x) + 1e-6) / softplus(scale)).

    Args:
        x: (..., C) projected queries or keys (all heads jointly, as the official code).
        scale: (..., C) raw `scale` parameter (broadcast; softplus applied here).
        p: focusing factor (p = 1 gives the scaled ReLU kernel t itself).

    Returns:
        (..., C) with ||phi(x)|| = ||t|| per token.
    """
    s = F.softplus(scale)
    # (ReLU(x) + eps) / s in one fused op: eps / s + ReLU(x) / s.
    t = torch.addcdiv(FEATURE_EPS / s, F.relu(x), s)
    return _focus(t, p)


def _focus(t: torch.Tensor, p: float) -> torch.Tensor:
    """f_p(t) = t^p / ||t^p|| * ||t|| over the last axis (t > 0)."""
    if p == 1:
        return t
    r = torch.linalg.vector_norm(t, dim=-1, keepdim=True)
    u = t.pow(p)
    return u * (r / torch.linalg.vector_norm(u, dim=-1, keepdim=True))


def resize_pe(pe: torch.Tensor, pe_hw: tuple[int, int], hw: tuple[int, int], prefix: int = 0) -> torch.Tensor:
    """Bicubic 2-D resize (align_corners False) of a (1, P + h_pe * w_pe, C) positional encoding to hw.

    Prefix slots are kept as they are (never resized); the official fine-tune loader's rule for the grid part.
    """
    if known_equal(pe_hw, hw):
        return pe
    C = pe.shape[-1]
    # Bicubic interpolation is separable: rows, then columns, each by one (out x in) weight matrix. The same function
    # as F.interpolate (equal up to rounding) as two small GEMMs, 3-6x faster than the CPU bicubic kernel on the stage
    # grids of Pola-PVT at 512 px. In the PE's dtype under autocast too, as the bicubic kernel ran.
    with no_autocast(pe):
        grid = pe[0, prefix:].reshape(pe_hw[0], pe_hw[1], C)
        grid = torch.einsum("ay,yxc->axc", _bicubic_weights(pe_hw[0], hw[0], pe), grid)
        grid = torch.einsum("bx,axc->abc", _bicubic_weights(pe_hw[1], hw[1], pe), grid)
    return torch.cat([pe[:, :prefix], grid.reshape(1, -1, C)], dim=1)


def _bicubic_weights(n_in: int, n_out, like: torch.Tensor) -> torch.Tensor:
    """(n_out, n_in): row o holds the weights of the n_in input samples in output sample o of a 1-D bicubic resize
    (F.interpolate's, align_corners False), from resizing the identity (its W axis of size 1 is left unchanged)."""
    eye = torch.eye(n_in, dtype=like.dtype, device=like.device).reshape(1, n_in, n_in, 1)
    return F.interpolate(eye, size=(n_out, 1), mode="bicubic", align_corners=False)[0, :, :, 0].transpose(0, 1)


def upsample_v(v_grid: torch.Tensor, kv_hw: tuple[int, int], hw: tuple[int, int], mode: str) -> torch.Tensor:
    """Bring grid values (B, n_g, C) on kv_hw to the query grid hw as a map (B, C, H, W).

    mode 'bilinear': 2-D bilinear resize (align_corners False) of the (H_kv, W_kv) map (ours; docs/deviations.md);
    'flat1d': the official 1-D linear interpolation along the flattened token axis, reshaped to (H, W).
    """
    B, n_g, C = v_grid.shape
    H, W = hw
    if known_equal(kv_hw, (H, W)):
        return v_grid.transpose(1, 2).reshape(B, C, H, W)
    if mode == "bilinear":
        vm = v_grid.transpose(1, 2).reshape(B, C, kv_hw[0], kv_hw[1])
        return F.interpolate(vm, size=(H, W), mode="bilinear", align_corners=False)
    if mode == "flat1d":
        return F.interpolate(v_grid.transpose(1, 2), size=H * W, mode="linear", align_corners=False).reshape(
            B, C, H, W)
    raise ValueError(f"sr_mode={mode!r} is not one of {SR_MODES}")


def upsample_matrix(kv_hw: tuple[int, int], hw: tuple[int, int], mode: str, dtype: torch.dtype = torch.float64,
                    device: torch.device | None = None) -> torch.Tensor:
    """The linear map of `upsample_v` as an explicit (H * W, H_kv * W_kv) matrix (identity when grids agree)."""
    n_g = kv_hw[0] * kv_hw[1]
    eye = torch.eye(n_g, dtype=dtype, device=device)[None]  # (1, n_g tokens, n_g channels)
    return upsample_v(eye, kv_hw, hw, mode)[0].flatten(1).T  # (N_g, n_g)


def _split(x: torch.Tensor, h: int) -> torch.Tensor:
    B, L, C = x.shape
    return x.reshape(B, L, h, C // h).transpose(1, 2)  # (B, h, L, d)


def _merge(x: torch.Tensor) -> torch.Tensor:
    B, h, L, d = x.shape
    return x.transpose(1, 2).reshape(B, L, h * d)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw, kv_hw, num_heads: int, prefix: int,
           normaliser: str, sr_mode: str) -> None:
    if normaliser not in ("mean", "sum"):
        raise ValueError(f"normaliser={normaliser!r} is not one of ('mean', 'sum')")
    if sr_mode not in SR_MODES:
        raise ValueError(f"sr_mode={sr_mode!r} is not one of {SR_MODES}")
    B, N, C = q.shape
    if C % num_heads:
        raise ValueError(f"focused linear attention: C={C} must be a multiple of num_heads={num_heads}")
    if prefix + hw[0] * hw[1] != N:
        raise ValueError(f"focused linear attention: hw={hw[0]}x{hw[1]} + {prefix} prefix token(s) != N={N}")
    if k.shape != v.shape or k.shape[0] != B or k.shape[2] != C or k.shape[1] != prefix + kv_hw[0] * kv_hw[1]:
        raise ValueError(f"focused linear attention: k {tuple(k.shape)} / v {tuple(v.shape)} do not match "
                         f"q {tuple(q.shape)} and key grid {kv_hw[0]}x{kv_hw[1]} + {prefix} prefix token(s)")


def _dwc_fast(v: torch.Tensor, hw, kv_hw, num_heads: int, prefix: int, sr_mode: str,
              dwc_weight: torch.Tensor | None, dwc_bias: torch.Tensor | None, lepe_weight: torch.Tensor | None,
              lepe_bias: torch.Tensor | None) -> torch.Tensor | None:
    """DWC (+ LePE) term on the grid tokens as (B, H * W, C) via conv2d; None when there is neither (the
    "+ f_p only" ablation without LePE)."""
    if dwc_weight is None and lepe_weight is None:
        return None
    # (B, C, H, W) in channels-last memory (the token-major layout): the fastest depthwise conv on CPU.
    vm = upsample_v(v[:, prefix:], kv_hw, hw, sr_mode).contiguous(memory_format=torch.channels_last)
    C = vm.shape[1]
    y = None
    if dwc_weight is not None:
        # The d-channel kernel shared by all heads is the C-channel depthwise kernel repeated h times (head-major).
        w = torch.cat([dwc_weight] * num_heads)
        b = None if dwc_bias is None else torch.cat([dwc_bias] * num_heads)
        y = F.conv2d(vm, w, b, padding=(w.shape[-2] // 2, w.shape[-1] // 2), groups=C)
    if lepe_weight is not None:
        # LePE on the same v map as the DWC (CSwin 'L' blocks have n == N, so no resize happens there).
        lp = F.conv2d(vm, lepe_weight, lepe_bias, padding=(lepe_weight.shape[-2] // 2, lepe_weight.shape[-1] // 2),
                      groups=C)
        y = lp if y is None else y + lp
    return y.flatten(2).transpose(1, 2)  # (B, H*W, C)


def focused_linear_attention_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: torch.Tensor,
                                dwc_weight: torch.Tensor, dwc_bias: torch.Tensor | None = None,
                                lepe_weight: torch.Tensor | None = None, lepe_bias: torch.Tensor | None = None, *,
                                hw: tuple[int, int], kv_hw: tuple[int, int] | None = None, num_heads: int,
                                p: float = 3.0, normaliser: str = "mean", prefix: int = 0,
                                sr_mode: str = "bilinear") -> torch.Tensor:
    """Fast focused linear attention (K^T V first, DWC and LePE by conv2d).

    Args:
        q: (B, N, C) projected queries, N = prefix + H * W.
        k: (B, n, C) projected keys with the positional encoding already added, n = prefix + H_kv * W_kv.
        v: (B, n, C) projected values.
        scale: (1, 1, C) raw `scale` parameter.
        dwc_weight: (d, 1, k, k) shared depthwise kernel (`dwc.weight`), or None for no DWC term (FLatten Tab. 4,
            "+ f_p" without DWC); dwc_bias: (d,) or None.
        lepe_weight: (C, 1, 3, 3) CSwin LePE kernel (`get_v.weight`) or None; lepe_bias: (C,) or None.
        hw: query grid (H, W); kv_hw: key grid (default hw).
        num_heads: h.
        p: focusing factor.
        normaliser: 'mean' (current official) or 'sum' (original release).
        prefix: P leading non-grid tokens in q, k, v.
        sr_mode: 'bilinear' or 'flat1d' (how V reaches the query grid for the DWC when kv_hw != hw).

    Returns:
        (B, N, C), before the output projection.
    """
    kv_hw = tuple(hw) if kv_hw is None else tuple(kv_hw)
    _check(q, k, v, hw, kv_hw, num_heads, prefix, normaliser, sr_mode)
    # The feature map of q and k with softplus(scale) computed once.
    s = F.softplus(scale)
    e = FEATURE_EPS / s
    qf, kf = _focus(torch.addcdiv(e, F.relu(q), s), p), _focus(torch.addcdiv(e, F.relu(k), s), p)
    h = num_heads
    out = _merge(linear_attention(_split(qf, h), _split(kf, h), _split(v, h), normaliser, NORM_EPS, order="kv"))
    conv = _dwc_fast(v, hw, kv_hw, h, prefix, sr_mode, dwc_weight, dwc_bias, lepe_weight, lepe_bias)
    if conv is None:
        return out
    if prefix:
        return torch.cat([out[:, :prefix], out[:, prefix:] + conv], dim=1)
    return out + conv


def _conv_matrices(dwc_weight: torch.Tensor | None, lepe_weight: torch.Tensor | None, hw, num_heads: int,
                   channel: int | None, d: int | None = None) -> torch.Tensor:
    """Equivalent conv matrices per head (h, d or 1, N_g, N_g): DWC (shared) + LePE (per channel) on the grid.
    Without a DWC (`dwc_weight=None`, head width `d` given) its part is a zero kernel."""
    if dwc_weight is None:
        ref = lepe_weight
        z = (d, 1, 1, 1)
        dwc_weight = torch.zeros(z, dtype=torch.float64) if ref is None else ref.new_zeros(z)
    d = dwc_weight.shape[0]
    if channel is None:
        m = depthwise_conv_matrix(dwc_weight.mean(0, keepdim=True), hw)[None]  # (1, 1, N_g, N_g)
        if lepe_weight is not None:
            lw = lepe_weight.reshape(num_heads, d, *lepe_weight.shape[1:]).mean(1)  # (h, 1, kh, kw)
            m = m + depthwise_conv_matrix(lw, hw)[:, None]
        return m.expand(num_heads, 1, -1, -1)
    if channel is True:
        m = depthwise_conv_matrix(dwc_weight, hw)[None]  # (1, d, N_g, N_g)
        if lepe_weight is not None:
            m = m + depthwise_conv_matrix(lepe_weight, hw).reshape(num_heads, d, *m.shape[-2:])
        return m.expand(num_heads, -1, -1, -1)
    c = int(channel)
    m = depthwise_conv_matrix(dwc_weight[c:c + 1], hw)[None]
    if lepe_weight is not None:
        m = m + depthwise_conv_matrix(lepe_weight[c::d], hw)[:, None]
    return m.expand(num_heads, 1, -1, -1)


def focused_linear_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: torch.Tensor,
                                 dwc_weight: torch.Tensor, dwc_bias: torch.Tensor | None = None,
                                 lepe_weight: torch.Tensor | None = None, lepe_bias: torch.Tensor | None = None, *,
                                 hw: tuple[int, int], kv_hw: tuple[int, int] | None = None, num_heads: int,
                                 p: float = 3.0, normaliser: str = "mean", prefix: int = 0,
                                 sr_mode: str = "bilinear") -> torch.Tensor:
    """Dense reference of `focused_linear_attention_kv` (same arguments and result).

    The kernel matrix A_ij = phi(q_i).phi(k_j) is built explicitly and row-normalised; the V resize, the DWC and the
    LePE are explicit matrices (U: N_g x n_g; M_DWC, M_LePE: N_g x N_g per channel; paper Eq. 10-11).
    """
    kv_hw = tuple(hw) if kv_hw is None else tuple(kv_hw)
    _check(q, k, v, hw, kv_hw, num_heads, prefix, normaliser, sr_mode)
    h = num_heads
    qf, kf = focused_feature_map(q, scale, p), focused_feature_map(k, scale, p)
    vh = _split(v, h)  # (B, h, n, d)
    out = linear_attention_ref(_split(qf, h), _split(kf, h), vh, normaliser, NORM_EPS)  # (B, h, N, d)
    if dwc_weight is None and lepe_weight is None:
        return _merge(out)  # no conv term at all (FLatten Tab. 4, "+ f_p" without DWC)
    u = upsample_matrix(kv_hw, hw, sr_mode, v.dtype, v.device)  # (N_g, n_g)
    m = _conv_matrices(dwc_weight, lepe_weight, hw, h, True, q.shape[-1] // h).to(v.dtype)  # (h, d, N_g, N_g)
    conv = torch.einsum("hcij,jk,bhkc->bhic", m, u, vh[:, :, prefix:])  # (B, h, N_g, d)
    if dwc_bias is not None:
        conv = conv + dwc_bias
    conv = _merge(conv)
    if lepe_bias is not None:
        conv = conv + lepe_bias
    out = _merge(out)
    return torch.cat([out[:, :prefix], out[:, prefix:] + conv], dim=1)


def focused_attention_matrix(q: torch.Tensor, k: torch.Tensor, scale: torch.Tensor, dwc_weight: torch.Tensor,
                             lepe_weight: torch.Tensor | None = None, *, hw: tuple[int, int],
                             kv_hw: tuple[int, int] | None = None, num_heads: int, p: float = 3.0,
                             normaliser: str = "mean", prefix: int = 0, sr_mode: str = "bilinear",
                             channel: int | None = None) -> torch.Tensor:
    """Equivalent token-mixing matrix (B, h, N, n): out[:, head, :, c] = M @ v[:, head, :, c] + conv biases.

    Exact for head channel `channel` = c (DWC kernel c, LePE kernel head * d + c; the V resize included). With
    `channel=None` the conv part uses the channel-mean kernels, which is the average of the exact per-channel maps
    (exact for every channel only when the kernels agree across channels). Prefix rows and columns of the conv part
    are 0. Shapes: q (B, N, C), k (B, n, C) with the PE added.
    """
    kv_hw = tuple(hw) if kv_hw is None else tuple(kv_hw)
    _check(q, k, k, hw, kv_hw, num_heads, prefix, normaliser, sr_mode)
    h = num_heads
    qf, kf = focused_feature_map(q, scale, p), focused_feature_map(k, scale, p)
    a = linear_attention_matrix(_split(qf, h), _split(kf, h), normaliser, NORM_EPS)  # (B, h, N, n)
    if dwc_weight is None and lepe_weight is None:
        return a
    u = upsample_matrix(kv_hw, hw, sr_mode, a.dtype, a.device)  # (N_g, n_g)
    m = _conv_matrices(None if dwc_weight is None else dwc_weight.to(a.dtype),
                       None if lepe_weight is None else lepe_weight.to(a.dtype), hw, h, channel,
                       q.shape[-1] // h)[:, 0].to(a.dtype) @ u  # (h, N_g, n_g)
    a = a.clone()
    a[:, :, prefix:, prefix:] += m
    return a


def _check_1d(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int, normaliser: str,
              prefix: int, causal: bool) -> None:
    if normaliser not in ("mean", "sum"):
        raise ValueError(f"normaliser={normaliser!r} is not one of ('mean', 'sum')")
    if q.dim() != 3 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"focused linear attention (1-D): q {tuple(q.shape)}, k {tuple(k.shape)} and "
                         f"v {tuple(v.shape)} must be equal (B, L, C)")
    if q.shape[-1] % num_heads:
        raise ValueError(f"focused linear attention (1-D): C={q.shape[-1]} must be a multiple of "
                         f"num_heads={num_heads}")
    if not 0 <= prefix <= q.shape[1] or (causal and prefix):
        raise ValueError(f"focused linear attention (1-D): prefix={prefix} must be in [0, L] (0 when causal)")


def dwc_padding_1d(kernel_size: int, causal: bool) -> tuple[int, int]:
    """Zero padding (left, right) of the 1-D DWC: 'same' (k // 2 each side, odd k) or causal (k - 1 on the left),
    so that output t reads inputs t - k // 2 .. t + k // 2, or t - k + 1 .. t."""
    return (kernel_size - 1, 0) if causal else (kernel_size // 2, kernel_size // 2)


def depthwise_conv_matrix_1d(weight: torch.Tensor, length: int, causal: bool) -> torch.Tensor:
    """Explicit (C, L, L) matrices of the 1-D depthwise convolution `dwc_padding_1d` pads (no bias):
    conv(x)[c, i] = sum_j M[c, i, j] x[c, j]. weight: (C, 1, k)."""
    k = weight.shape[-1]
    left = dwc_padding_1d(k, causal)[0]
    i = torch.arange(length, device=weight.device)
    # tap a of output i reads input j = i + a - left: a = j - i + left, valid for 0 <= a < k
    tap = i[None, :] - i[:, None] + left  # (L_i, L_j)
    valid = (tap >= 0) & (tap < k)
    m = weight[:, 0][:, tap.clamp(0, k - 1)]  # (C, L, L)
    return m * valid.to(weight.dtype)


def _dwc_1d_fast(v: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, num_heads: int,
                 causal: bool) -> torch.Tensor:
    """(B, L, C) -> (B, L, C): the d-channel kernel (d, 1, k) shared by every head, by conv1d."""
    C = v.shape[-1]
    w = torch.cat([weight] * num_heads)  # (C, 1, k), head-major
    b = None if bias is None else torch.cat([bias] * num_heads)
    x = F.pad(v.transpose(1, 2), dwc_padding_1d(weight.shape[-1], causal))
    return F.conv1d(x, w, b, groups=C).transpose(1, 2)


def _causal_mean_queries(qf: torch.Tensor) -> torch.Tensor:
    """phi(q_t) / (t + 1): the prefix mean of the causal 'mean' normaliser (numerator and denominator are both
    linear in phi(q_t), so scaling the query divides both by the t + 1 keys it sees and leaves eps fixed)."""
    L = qf.shape[-2]
    count = torch.arange(1, L + 1, device=qf.device, dtype=qf.dtype)[:, None]  # (L, 1)
    return qf / count


def focused_linear_attention_1d(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: torch.Tensor,
                                dwc_weight: torch.Tensor | None, dwc_bias: torch.Tensor | None = None, *,
                                num_heads: int, p: float = 3.0, normaliser: str = "mean", prefix: int = 0,
                                causal: bool = False, chunk_size: int = 64) -> torch.Tensor:
    """Fast 1-D focused linear attention on a token sequence (ours: FLatten defines the operator on image grids).

    Bidirectional: the 2-D operator with the grid replaced by the sequence: LinearCore(phi(q), phi(k), v) (K^T V
    first) + DWC_1d(v) with a 'same'-padded depthwise conv1d over the tokens after the `prefix` leading tokens.
    Causal (prefix 0): out_t = sum_{j<=t} (phi(q_t).phi(k_j)) v_j / c_t / (sum_{j<=t} phi(q_t).phi(k_j) / c_t
    + eps) + DWC_1d(v)_t with c_t = t + 1 ('mean': the prefix mean) or 1 ('sum'), the linear part by chunked prefix
    sums (`causal_linear_attention_chunked`), the conv left-padded by k - 1 (taps t - k + 1 .. t).

    Args:
        q, k, v: (B, L, C) projected queries, keys, values (no positional encoding).
        scale: (1, 1, C) raw `scale` parameter.
        dwc_weight: (d, 1, k) 1-D depthwise kernel shared by every head, or None (no DWC); dwc_bias: (d,) or None.
        num_heads: h; p: focusing factor; normaliser: 'mean' or 'sum'.
        prefix: leading non-sequence tokens (class tokens): linear-attention queries and keys, no DWC term.
        causal: the causal form; chunk_size: tokens per chunk of its fast path (speed only).

    Returns:
        (B, L, C), before the output projection.
    """
    _check_1d(q, k, v, num_heads, normaliser, prefix, causal)
    s = F.softplus(scale)
    e = FEATURE_EPS / s
    qf, kf = _focus(torch.addcdiv(e, F.relu(q), s), p), _focus(torch.addcdiv(e, F.relu(k), s), p)
    h = num_heads
    if causal:
        qh = _split(qf, h)
        if normaliser == "mean":
            qh = _causal_mean_queries(qh)
        out = _merge(causal_linear_attention_chunked(qh, _split(kf, h), _split(v, h), NORM_EPS, chunk_size))
    else:
        out = _merge(linear_attention(_split(qf, h), _split(kf, h), _split(v, h), normaliser, NORM_EPS, order="kv"))
    if dwc_weight is None:
        return out
    conv = _dwc_1d_fast(v[:, prefix:], dwc_weight, dwc_bias, h, causal)
    if prefix:
        return torch.cat([out[:, :prefix], out[:, prefix:] + conv], dim=1)
    return out + conv


def focused_attention_matrix_1d(q: torch.Tensor, k: torch.Tensor, scale: torch.Tensor,
                                dwc_weight: torch.Tensor | None, *, num_heads: int, p: float = 3.0,
                                normaliser: str = "mean", prefix: int = 0, causal: bool = False) -> torch.Tensor:
    """Dense (B, h, d, L, L) token-mixing matrices of the 1-D operator, per head channel:
    out[:, head, :, c] = M[:, head, c] @ v[:, head, :, c] + dwc_bias[c] (rows >= prefix). Built explicitly: the
    kernel matrix A_ij = phi(q_i).phi(k_j) (lower triangle when causal), row-normalised, plus the conv matrix."""
    _check_1d(q, k, k, num_heads, normaliser, prefix, causal)
    h, (B, L, C) = num_heads, q.shape
    qf, kf = _split(focused_feature_map(q, scale, p), h), _split(focused_feature_map(k, scale, p), h)
    a = qf @ kf.transpose(-2, -1)  # (B, h, L, L)
    if causal:
        a = a.tril()
    if normaliser == "mean":
        # the mean over the keys each query sees: t + 1 (causal) or L
        seen = torch.arange(1, L + 1, dtype=a.dtype, device=a.device)[:, None] if causal else L
        a = a / seen
    a = a / (a.sum(-1, keepdim=True) + NORM_EPS)
    m = a.unsqueeze(2).expand(B, h, C // h, L, L)  # (B, h, d, L, L)
    if dwc_weight is None:
        return m
    conv = depthwise_conv_matrix_1d(dwc_weight.to(a.dtype), L - prefix, causal)  # (d, L_g, L_g)
    m = m.clone()
    m[..., prefix:, prefix:] += conv
    return m


def focused_linear_attention_1d_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: torch.Tensor,
                                    dwc_weight: torch.Tensor | None, dwc_bias: torch.Tensor | None = None, *,
                                    num_heads: int, p: float = 3.0, normaliser: str = "mean", prefix: int = 0,
                                    causal: bool = False, chunk_size: int = 64) -> torch.Tensor:
    """Dense reference of `focused_linear_attention_1d` (same arguments and result; `chunk_size` unused): the
    explicit matrices of `focused_attention_matrix_1d` applied to v, float64-capable."""
    m = focused_attention_matrix_1d(q, k, scale, dwc_weight, num_heads=num_heads, p=p, normaliser=normaliser,
                                    prefix=prefix, causal=causal)  # (B, h, d, L, L)
    vh = _split(v, num_heads)  # (B, h, L, d)
    out = torch.einsum("bhcij,bhjc->bhic", m, vh)
    if dwc_bias is not None:
        bias = torch.zeros_like(out[0, 0])  # (L, d)
        bias[prefix:] = dwc_bias
        out = out + bias
    return _merge(out)
