"""Agent attention: agent pooling, the position-bias tables at any grid, the dense reference and the SDPA fast path.

Token-level shapes (the module boundary, before the head split): q (B, N, C), k and v (B, n, C) with
N = P + H * W query tokens and n = P + H_kv * W_kv key tokens (P leading prefix tokens, e.g. DeiT's class token;
H_kv x W_kv = the PVT-reduced key grid, or the query grid), channel layout head-major (channel = head * d + c).

Operator (official code; A = a_h * a_w agents):
    agents  a = AdaptiveAvgPool2d((a_h, a_w))(q grid)                                 (B, A, C)
    agent aggregation   V_A = softmax(s a k^T + B_1) v                                (B, h, A, d)
    agent broadcast     O   = softmax(s q a^T + B_2) V_A                              (B, h, N, d)
    out = O + DWC(resize(v grid)) on the grid rows (3 x 3 depthwise, C channels, bias; prefix rows get no DWC),
with s = d^-1/2, B_1 (h, A, n) the agent -> key bias and B_2 (h, N, A) the query -> agent bias (`agent_biases`).

Paper: Agent Attention (Han et al., ECCV 2024, arXiv 2312.08874), Sec. 4.1 Eq. 3-4 (generalised linear attention,
    agent aggregation and broadcast) and Sec. 4.2 Eq. 5 (agent bias, DWC).
Official: LeapLabTHU/Agent-Attention `agent_transformer/models/agent_{deit,pvt,swin}.py` `AgentAttention.forward`.
Symbols: A agent count (paper n), a_h x a_w agent grid, h heads, d = C / h, s = d^-1/2, B_1 / B_2 the agent biases
    (paper B_1 / B_2 in Sec. 4.2), P prefix tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..._shapes import known_equal
from .focused import upsample_matrix, upsample_v
from .linear import depthwise_conv_matrix
from .softmax import adaptive_pool_2d, adaptive_pool_bins, sdpa

__all__ = [
    "resize_axis",
    "agent_biases",
    "pool_matrix",
    "agent_attention",
    "agent_attention_ref",
    "agent_attention_matrix",
]


def resize_axis(t: torch.Tensor, size: int, dim: int) -> torch.Tensor:
    """Linear resize (align_corners False) of `t` along axis `dim` to `size` (unchanged when the size agrees): how
    the 1-D agent bias tables (`ah`, `aw`, `ha`, `wa`) reach a grid other than the one they were built for."""
    if known_equal((t.shape[dim],), (size,)):
        return t
    x = t.movedim(dim, -1)
    lead = x.shape[:-1]
    y = F.interpolate(x.reshape(1, -1, x.shape[-1]), size=size, mode="linear", align_corners=False)
    return y.reshape(*lead, size).movedim(-1, dim)


def agent_biases(an: torch.Tensor, na: torch.Tensor, ah: torch.Tensor, aw: torch.Tensor, ha: torch.Tensor,
                 wa: torch.Tensor, ac: torch.Tensor | None, ca: torch.Tensor | None, hw: tuple[int, int],
                 kv_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The agent biases at query grid hw and key grid kv_hw.

    Args:
        an, na: (h, A, 7, 7) agent->key / query->agent tables, resized bilinearly (align_corners False) to kv_hw /
            hw (the official rule, there always to the construction grid).
        ah, aw: (1, h, A, H_kv0, 1), (1, h, A, 1, W_kv0) agent->key row / column terms; ha, wa: (1, h, H0, 1, A),
            (1, h, 1, W0, A) query->agent terms. Each is resized linearly along its grid axis when the grid differs
            from its construction grid (ours; the official code runs at the construction grid only).
        ac, ca: (1, h, A, P) agent->prefix-key and (1, h, P, A) prefix-query->agent terms, or None (P = 0).
        hw: (H, W) query grid; kv_hw: (H_kv, W_kv) key grid.

    Returns:
        B_1 (h, A, P + H_kv * W_kv) and B_2 (h, P + H * W, A).
    """
    h, A = an.shape[:2]
    b1 = F.interpolate(an, size=tuple(kv_hw), mode="bilinear", align_corners=False).reshape(h, A, -1)
    b1 = b1 + (resize_axis(ah, kv_hw[0], 3) + resize_axis(aw, kv_hw[1], 4)).reshape(h, A, -1)
    b2 = F.interpolate(na, size=tuple(hw), mode="bilinear", align_corners=False).reshape(h, A, -1).transpose(1, 2)
    b2 = b2 + (resize_axis(ha, hw[0], 2) + resize_axis(wa, hw[1], 3)).reshape(h, -1, A)
    if ac is not None:
        b1 = torch.cat([ac.reshape(h, A, -1).to(b1.dtype), b1], dim=-1)
        b2 = torch.cat([ca.reshape(h, -1, A).to(b2.dtype), b2], dim=-2)
    return b1, b2


# (size_out, size_in) 1-D adaptive average pooling bins, in a form torch.export keeps symbolic.
pool_matrix = adaptive_pool_bins


def _split(x: torch.Tensor, h: int) -> torch.Tensor:
    B, L, C = x.shape
    return x.reshape(B, L, h, C // h).transpose(1, 2)  # (B, h, L, d)


def _merge(x: torch.Tensor) -> torch.Tensor:
    B, h, L, d = x.shape
    return x.transpose(1, 2).reshape(B, L, h * d)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor, hw, kv_hw,
           agent_hw, num_heads: int, prefix: int) -> None:
    B, N, C = q.shape
    who = "agent attention"
    if C % num_heads:
        raise ValueError(f"{who}: C={C} must be a multiple of num_heads={num_heads}")
    if prefix + hw[0] * hw[1] != N:
        raise ValueError(f"{who}: hw={hw[0]}x{hw[1]} + {prefix} prefix token(s) != N={N}")
    n = prefix + kv_hw[0] * kv_hw[1]
    if k.shape != v.shape or k.shape[0] != B or k.shape[2] != C or k.shape[1] != n:
        raise ValueError(f"{who}: k {tuple(k.shape)} / v {tuple(v.shape)} do not match q {tuple(q.shape)} and key "
                         f"grid {kv_hw[0]}x{kv_hw[1]} + {prefix} prefix token(s)")
    A = agent_hw[0] * agent_hw[1]
    if tuple(b1.shape) != (num_heads, A, n) or tuple(b2.shape) != (num_heads, N, A):
        raise ValueError(f"{who}: biases {tuple(b1.shape)} / {tuple(b2.shape)} are not ({num_heads}, {A}, {n}) / "
                         f"({num_heads}, {N}, {A})")


def agent_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor,
                    dwc_weight: torch.Tensor, dwc_bias: torch.Tensor | None = None, *, hw: tuple[int, int],
                    kv_hw: tuple[int, int] | None = None, agent_hw: tuple[int, int], num_heads: int,
                    prefix: int = 0) -> torch.Tensor:
    """Fast agent attention: adaptive pooling, two SDPA calls with the biases as float masks, DWC by conv2d.

    Args:
        q: (B, N, C) projected queries, N = prefix + H * W.
        k, v: (B, n, C) projected keys and values, n = prefix + H_kv * W_kv.
        b1: (h, A, n) agent -> key bias; b2: (h, N, A) query -> agent bias (`agent_biases`).
        dwc_weight: (C, 1, kh, kw) depthwise kernel (`dwc.weight`, odd sizes); dwc_bias: (C,) or None.
        hw: query grid (H, W); kv_hw: key grid (default hw), V is resized bilinearly to hw for the DWC.
        agent_hw: (a_h, a_w) agent grid, A = a_h * a_w.
        num_heads: h.
        prefix: P leading non-grid tokens in q, k, v (queries and keys; no agents pooled from them, no DWC).

    Returns:
        (B, N, C), before the output projection.
    """
    kv_hw = tuple(hw) if kv_hw is None else tuple(kv_hw)
    _check(q, k, v, b1, b2, hw, kv_hw, agent_hw, num_heads, prefix)
    B, N, C = q.shape
    h = num_heads
    qm = q[:, prefix:].transpose(1, 2).reshape(B, C, hw[0], hw[1])
    a = adaptive_pool_2d(qm, tuple(agent_hw)).flatten(2).transpose(1, 2)  # (B, A, C)
    a = _split(a, h)
    va = sdpa(a, _split(k, h), _split(v, h), attn_mask=b1.to(q.dtype))  # (B, h, A, d)
    out = _merge(sdpa(_split(q, h), a, va, attn_mask=b2.to(q.dtype)))  # (B, N, C)
    vm = upsample_v(v[:, prefix:], kv_hw, hw, "bilinear")  # (B, C, H, W)
    pad = (dwc_weight.shape[-2] // 2, dwc_weight.shape[-1] // 2)
    conv = F.conv2d(vm, dwc_weight, dwc_bias, padding=pad, groups=C).flatten(2).transpose(1, 2)
    if prefix:
        return torch.cat([out[:, :prefix], out[:, prefix:] + conv], dim=1)
    return out + conv


def _mixing(q: torch.Tensor, k: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor, hw, agent_hw, num_heads: int,
            prefix: int) -> torch.Tensor:
    """Explicit softmax product softmax(s q a^T + B_2) softmax(s a k^T + B_1): (B, h, N, n)."""
    h = num_heads
    d = q.shape[-1] // h
    P = torch.kron(pool_matrix(hw[0], agent_hw[0], q.dtype, q.device),
                   pool_matrix(hw[1], agent_hw[1], q.dtype, q.device))  # (A, H * W)
    a = _split(torch.einsum("ag,bgc->bac", P, q[:, prefix:]), h)  # (B, h, A, d)
    s = d ** -0.5
    p1 = torch.softmax(s * a @ _split(k, h).transpose(-1, -2) + b1.to(q.dtype), dim=-1)  # (B, h, A, n)
    p2 = torch.softmax(s * _split(q, h) @ a.transpose(-1, -2) + b2.to(q.dtype), dim=-1)  # (B, h, N, A)
    return p2 @ p1


def agent_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor,
                        dwc_weight: torch.Tensor, dwc_bias: torch.Tensor | None = None, *, hw: tuple[int, int],
                        kv_hw: tuple[int, int] | None = None, agent_hw: tuple[int, int], num_heads: int,
                        prefix: int = 0) -> torch.Tensor:
    """Dense reference of `agent_attention` (same arguments and result).

    The agents are an explicit pooling matrix applied to q, the two softmaxes are explicit and multiplied into the
    (N, n) mixing matrix per head (paper Eq. 4 as one matrix), the V resize and the DWC are explicit matrices.
    """
    kv_hw = tuple(hw) if kv_hw is None else tuple(kv_hw)
    _check(q, k, v, b1, b2, hw, kv_hw, agent_hw, num_heads, prefix)
    h = num_heads
    out = _merge(_mixing(q, k, b1, b2, hw, agent_hw, h, prefix) @ _split(v, h))  # (B, N, C)
    u = upsample_matrix(kv_hw, hw, "bilinear", v.dtype, v.device)  # (N_g, n_g)
    m = depthwise_conv_matrix(dwc_weight.to(v.dtype), hw)  # (C, N_g, N_g)
    conv = torch.einsum("cij,jk,bkc->bic", m, u, v[:, prefix:])  # (B, N_g, C)
    if dwc_bias is not None:
        conv = conv + dwc_bias
    return torch.cat([out[:, :prefix], out[:, prefix:] + conv], dim=1)


def agent_attention_matrix(q: torch.Tensor, k: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor,
                           dwc_weight: torch.Tensor | None, *, hw: tuple[int, int],
                           kv_hw: tuple[int, int] | None = None, agent_hw: tuple[int, int], num_heads: int,
                           prefix: int = 0, channel: int | None = None) -> torch.Tensor:
    """Equivalent token-mixing matrix (B, h, N, n): out[:, head, :, c] = M @ v[:, head, :, c] + DWC bias.

    Exact for head channel `channel` = c (DWC kernel head * d + c); with `channel=None` the DWC part is the mean of
    each head's d kernels. Prefix rows and columns of the DWC part are 0.
    """
    kv_hw = tuple(hw) if kv_hw is None else tuple(kv_hw)
    _check(q, k, k, b1, b2, hw, kv_hw, agent_hw, num_heads, prefix)
    h = num_heads
    mix = _mixing(q, k, b1, b2, hw, agent_hw, h, prefix)
    if dwc_weight is None:
        return mix
    d = q.shape[-1] // h
    w = dwc_weight.to(mix.dtype).reshape(h, d, *dwc_weight.shape[1:])
    w = w.mean(1) if channel is None else w[:, int(channel)]  # (h, 1, kh, kw)
    u = upsample_matrix(kv_hw, hw, "bilinear", mix.dtype, mix.device)
    mix = mix.clone()
    mix[:, :, prefix:, prefix:] += depthwise_conv_matrix(w, hw) @ u
    return mix
