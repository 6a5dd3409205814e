"""InLine (injective linear) attention: the kernel functions, the dense reference and the K^T V fast path, with the
per-sample local residual (a 3 x 3 depthwise convolution of the value map whose kernel each sample predicts).

Token-level shapes (the module boundary, before the head split): q, k, v (B, N, C) with N = P + H * W tokens, P
leading prefix tokens (a class token), channel layout head-major (channel = head * d + c). Inside: (B, h, N, d).

Operator (official code; the paper's Eq. 5 with the scale s / N folded into phi(Q), as the official comment says):
    A_ij = s / N * phi(q_i).phi(k_j) - s / N^2 * sum_m phi(q_i).phi(k_m) + 1 / N        (every row sums to 1)
    out_i = sum_j A_ij v_j + [grid rows only] DWC_b(V grid)_i
          = phi(q_i) (s / N phi(K)^T V) + (1 - s phi(q_i).mean(phi(K))) mean(V) + DWC_b(V grid)_i,
with s = d^-0.5 and DWC_b the depthwise 3 x 3 convolution (zero padding, no bias) with the kernel w_b (C, 3, 3) of
sample b. Prefix rows get no DWC term and prefix values do not enter it.

Paper: Bridging the Divide: Reconsidering Softmax and Linear Attention (arXiv 2412.06590), Sec. 4.1 Eq. 5 (InL_K,
the injective linear attention) and Sec. 4.2 (local attention residual).
Official: LeapLabTHU/InLine `models/inline_{deit,pvt,swin,cswin}.py` `InLineAttention.forward`; the kernel
functions in `models/inline_swin.py` (`kernel_func`, `exp_kernel`).
Symbols: phi kernel function (paper phi), s = d^-0.5, N tokens (paper N), h heads, d = C / h, w_b the predicted
local kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .linear import depthwise_conv_matrix

__all__ = [
    "KERNELS",
    "EXP_T",
    "inline_kernel",
    "inline_attention_matrix",
    "inline_attention_ref",
    "inline_attention_kv",
]

#: The official kernel functions phi (`kernel_func` in `inline_swin.py`); 'identity' is every released model's.
KERNELS = ("identity", "relu", "leakyrelu", "exp")
#: The temperature of the official `exp_kernel(x, t=0.2) = exp(t x)`.
EXP_T = 0.2
#: Local kernel size of the official residual (3 x 3).
LOCAL_K = 3


def inline_kernel(x: torch.Tensor, kernel: str) -> torch.Tensor:
    """phi(x), elementwise: identity, ReLU, LeakyReLU (slope 0.01, PyTorch's default) or exp(0.2 x)."""
    if kernel == "identity":
        return x
    if kernel == "relu":
        return F.relu(x)
    if kernel == "leakyrelu":
        return F.leaky_relu(x)
    if kernel == "exp":
        return (x * EXP_T).exp()
    raise ValueError(f"kernel={kernel!r} is not one of {KERNELS}")


def _split(x: torch.Tensor, h: int) -> torch.Tensor:
    B, L, C = x.shape
    return x.reshape(B, L, h, C // h).transpose(1, 2)  # (B, h, L, d)


def _merge(x: torch.Tensor) -> torch.Tensor:
    B, h, L, d = x.shape
    return x.transpose(1, 2).reshape(B, L, h * d)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, local_weight: torch.Tensor | None, hw, num_heads: int,
           prefix: int, kernel: str) -> None:
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r} is not one of {KERNELS}")
    if q.dim() != 3 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"inline attention: q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} must be "
                         "(B, N, C) of one shape")
    B, N, C = q.shape
    if C % num_heads:
        raise ValueError(f"inline attention: C={C} must be a multiple of num_heads={num_heads}")
    if local_weight is not None:
        if hw is None or prefix + hw[0] * hw[1] != N:
            raise ValueError(f"inline attention: the local residual needs hw with {prefix} + H * W == N={N}, got {hw}")
        if tuple(local_weight.shape) != (B, C, LOCAL_K, LOCAL_K):
            raise ValueError(f"inline attention: local_weight {tuple(local_weight.shape)} must be "
                             f"(B, C, {LOCAL_K}, {LOCAL_K}) = {(B, C, LOCAL_K, LOCAL_K)}")


def _local_fast(v: torch.Tensor, w: torch.Tensor, hw: tuple[int, int], prefix: int) -> torch.Tensor:
    """(B, H * W, C): the per-sample depthwise 3 x 3 conv of the grid values (one grouped conv over B * C maps).

    Inside `torch.export` the batch is symbolic, and ONNX's Conv takes `group` as a fixed attribute, so there the
    same convolution is the sum of the K * K shifted maps, each scaled by its per-sample tap (one program for every
    batch size)."""
    B, _, C = v.shape
    H, W = hw
    if torch.compiler.is_exporting():
        p = LOCAL_K // 2
        vp = F.pad(v[:, prefix:].transpose(1, 2).reshape(B, C, H, W), (p, p, p, p))
        y = sum(w[:, :, i, j, None, None] * vp[:, :, i:i + H, j:j + W]
                for i in range(LOCAL_K) for j in range(LOCAL_K))
        return y.reshape(B, C, H * W).transpose(1, 2)
    vm = v[:, prefix:].transpose(1, 2).reshape(1, B * C, H, W)
    y = F.conv2d(vm, w.reshape(B * C, 1, LOCAL_K, LOCAL_K), None, padding=LOCAL_K // 2, groups=B * C)
    return y.reshape(B, C, H * W).transpose(1, 2)


def _add_grid(out: torch.Tensor, local: torch.Tensor, prefix: int) -> torch.Tensor:
    if prefix:
        return torch.cat([out[:, :prefix], out[:, prefix:] + local], dim=1)
    return out + local


def inline_attention_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, local_weight: torch.Tensor | None = None,
                        *, hw: tuple[int, int] | None = None, num_heads: int, kernel: str = "identity",
                        prefix: int = 0) -> torch.Tensor:
    """Fast InLine attention: O(N d^2) with phi(K)^T V first, the local residual by one grouped conv2d.

    Args:
        q: (B, N, C) projected queries (before phi), N = prefix + H * W.
        k: (B, N, C) projected keys (before phi).
        v: (B, N, C) projected values.
        local_weight: (B, C, 3, 3) per-sample depthwise kernels (the `residual` branch's prediction), or None for no
            local residual (the injective linear attention alone).
        hw: token grid (H, W) (needed with local_weight only).
        num_heads: h.
        kernel: phi, one of `KERNELS`.
        prefix: P leading non-grid tokens (they attend and are attended to, but get no local term).

    Returns:
        (B, N, C), before the output projection.
    """
    _check(q, k, v, local_weight, hw, num_heads, prefix, kernel)
    h = num_heads
    N, d = q.shape[1], q.shape[2] // h
    s = d ** -0.5
    qf, kf, vh = _split(inline_kernel(q, kernel), h), _split(inline_kernel(k, kernel), h), _split(v, h)
    kv = kf.transpose(-2, -1) @ vh * (s / N)  # (B, h, d, d)
    k_mean, v_mean = kf.mean(dim=2, keepdim=True), vh.mean(dim=2, keepdim=True)  # (B, h, 1, d)
    out = qf @ kv + (1 - s * (qf @ k_mean.transpose(-2, -1))) * v_mean  # (B, h, N, d)
    out = _merge(out)
    if local_weight is None:
        return out
    return _add_grid(out, _local_fast(v, local_weight, tuple(hw), prefix), prefix)


def inline_attention_matrix(q: torch.Tensor, k: torch.Tensor, *, num_heads: int,
                            kernel: str = "identity") -> torch.Tensor:
    """The injective linear attention map A (B, h, N, N) (module docstring), built explicitly; rows sum to 1.

    Shapes: q, k (B, N, C) before phi.
    """
    _check(q, k, k, None, None, num_heads, 0, kernel)
    h = num_heads
    N, d = q.shape[1], q.shape[2] // h
    s = d ** -0.5
    a = _split(inline_kernel(q, kernel), h) @ _split(inline_kernel(k, kernel), h).transpose(-2, -1)  # (B, h, N, N)
    a = a * (s / N)
    return a - a.mean(dim=-1, keepdim=True) + 1.0 / N


def inline_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, local_weight: torch.Tensor | None = None,
                         *, hw: tuple[int, int] | None = None, num_heads: int, kernel: str = "identity",
                         prefix: int = 0) -> torch.Tensor:
    """Dense reference of `inline_attention_kv` (same arguments and result): the N x N map of
    `inline_attention_matrix` times V, plus the local residual as an explicit (N_g x N_g) matrix per sample and
    channel (`depthwise_conv_matrix`, zero padding)."""
    _check(q, k, v, local_weight, hw, num_heads, prefix, kernel)
    h = num_heads
    out = _merge(inline_attention_matrix(q, k, num_heads=h, kernel=kernel) @ _split(v, h))  # (B, N, C)
    if local_weight is None:
        return out
    B, _, C = v.shape
    m = depthwise_conv_matrix(local_weight.reshape(B * C, 1, LOCAL_K, LOCAL_K), tuple(hw))  # (B * C, N_g, N_g)
    m = m.reshape(B, C, *m.shape[-2:])
    local = torch.einsum("bcij,bjc->bic", m, v[:, prefix:])  # (B, N_g, C)
    return _add_grid(out, local, prefix)
