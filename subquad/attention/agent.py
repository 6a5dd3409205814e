"""Agent attention (`"agent"`): `AgentAttention`, with a fused `qkv` projection (Agent-DeiT / Agent-Swin names; the
Agent-PVT checkpoints' `q` + `kv` are concatenated into it by `remap_q_kv`), the optional PVT key/value reduction
(`sr`, `norm`), the agent bias tables, the 3 x 3 depthwise `dwc` on V and the output projection `proj`."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import nn

from .._shapes import as_hw, check_heads, map_to_tokens, tokens_to_map
from ..errors import UserError
from .base import AttentionCaps, TokenMixer
from .focused_linear import remap_q_kv
from .functional.agent import agent_attention, agent_attention_matrix, agent_attention_ref, agent_biases
from .registry import register_attention, register_attention_form

__all__ = ["AgentAttention", "AgentCore", "remap_q_kv"]

BIAS_NAMES = ("an_bias", "na_bias", "ah_bias", "aw_bias", "ha_bias", "wa_bias", "ac_bias", "ca_bias")


def _agent_side(agent_num: int, who: str) -> int:
    """sqrt(A) for a perfect square A (agents are pooled to a sqrt(A) x sqrt(A) grid), else a one-line UserError."""
    a = math.isqrt(agent_num) if isinstance(agent_num, int) and not isinstance(agent_num, bool) and agent_num > 0 else 0
    if a * a != agent_num:
        raise UserError(f"{who}: agent_num={agent_num!r} must be a perfect square (agents are pooled to a "
                        "sqrt(A) x sqrt(A) grid), e.g. 9, 16, 49")
    return a


def _add_bias_tables(m: nn.Module, h: int, A: int, P: int, hw: tuple[int, int], kv_hw: tuple[int, int],
                     dd: dict) -> None:
    """The official bias parameters: an / na (h, A, 7, 7), ah / aw on the key grid, ha / wa on the query grid and,
    with P prefix tokens, ac (1, h, A, P) / ca (1, h, P, A)."""
    (H, W), (Hk, Wk) = hw, kv_hw
    shapes = {"an_bias": (h, A, 7, 7), "na_bias": (h, A, 7, 7), "ah_bias": (1, h, A, Hk, 1),
              "aw_bias": (1, h, A, 1, Wk), "ha_bias": (1, h, H, 1, A), "wa_bias": (1, h, 1, W, A)}
    if P:
        shapes.update(ac_bias=(1, h, A, P), ca_bias=(1, h, P, A))
    for name, shape in shapes.items():
        setattr(m, name, nn.Parameter(torch.empty(shape, **dd)))


@register_attention_form("agent", "host_qkv")
class AgentCore(TokenMixer):
    """Agent attention on queries, keys and values that the host projects (`forward_qkv`): the form of Agent-CSwin's
    'A' blocks, whose block owns the q/k/v and output projections. The depthwise 3 x 3 convolution of V is CSwin's
    LePE `get_v` there (the same term as `AgentAttention.dwc`, under the official CSwin name); no projections, no
    key/value reduction. `build_attention("agent", ..., host_qkv=True)` builds it.

    Shapes: `forward_qkv(q, k, v, hw)`: q, k, v (B, P + H * W, C) -> (B, P + H * W, C), no output projection.
    Paper: Agent Attention (arXiv 2312.08874), Sec. 4.1-4.2.
    Official: LeapLabTHU/Agent-Attention `agent_transformer/models/agent_cswin.py` `AgentAttention` (idx=-1: the
        whole stage map, which is what every released Agent-CSwin 'A' stage uses).

    Args:
        dim, num_heads, input_size, agent_num, num_prefix_tokens: as `AgentAttention` (prefix tokens: queries and
            keys with `ca_bias` / `ac_bias`, no agents pooled from them, no `get_v` term).
        fused: SDPA fast path (True) or the dense reference (False).
    """

    caps = AttentionCaps(bidirectional=True, causal=False, needs_hw=True, supports_mask=False, complexity="O(N)",
                         sequence=False, notes="host-projected form of 'agent'")

    def __init__(self, dim: int, num_heads: int = 8, input_size: tuple[int, int] | int | None = None,
                 agent_num: int = 49, num_prefix_tokens: int = 0, fused: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        who = "agent attention (host_qkv)"
        if num_prefix_tokens < 0:
            raise UserError(f"{who}: num_prefix_tokens={num_prefix_tokens} must be >= 0")
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.dim, self.num_heads = dim, num_heads
        self.head_dim = check_heads(dim, num_heads, who)
        if input_size is None:
            raise ValueError(f"{who} needs input_size=(H, W) to size its bias tables")
        self.input_size = as_hw(input_size, "input_size")
        a = _agent_side(agent_num, who)
        self.agent_num, self.agent_hw, self.fused = agent_num, (a, a), fused
        self.get_v = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, **dd)
        _add_bias_tables(self, num_heads, agent_num, self.num_prefix_tokens, self.input_size, self.input_size, dd)
        if not self.get_v.weight.is_meta:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Official init: every bias table trunc_normal(0.02); `get_v` keeps PyTorch's default."""
        for name in BIAS_NAMES:
            if hasattr(self, name):
                trunc_normal_(getattr(self, name), std=0.02)

    def forward_qkv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: tuple[int, int],
                    x: torch.Tensor | None = None, fused: bool | None = None) -> torch.Tensor:
        """Agent attention on projected q, k, v (B, N, C) plus LePE(v); x (the host's input) is not read."""
        hw = self._check_input(q, hw)
        if k.shape != q.shape or v.shape != q.shape:
            raise ValueError(f"agent forward_qkv: q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} "
                             "must have the same shape")
        b1, b2 = agent_biases(self.an_bias, self.na_bias, self.ah_bias, self.aw_bias, self.ha_bias, self.wa_bias,
                              getattr(self, "ac_bias", None), getattr(self, "ca_bias", None), hw, hw)
        fn = agent_attention if (self.fused if fused is None else fused) else agent_attention_ref
        return fn(q, k, v, b1, b2, self.get_v.weight, self.get_v.bias, hw=tuple(hw), agent_hw=self.agent_hw,
                  num_heads=self.num_heads, prefix=self.num_prefix_tokens)

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        raise ValueError("agent attention built with host_qkv=True has no projections; call forward_qkv(q, k, v, hw)")


@register_attention("agent")
class AgentAttention(TokenMixer):
    """Agent attention: A agent tokens pooled from the queries aggregate the keys/values by a softmax with the agent
    -> key bias, then broadcast back to the queries by a softmax with the query -> agent bias; plus a 3 x 3
    depthwise convolution of V (bilinearly resized to the query grid when the keys are PVT-reduced).

    Shapes: x (B, N, C) with hw=(H, W), N = num_prefix_tokens + H * W -> (B, N, C).
    Paper: Agent Attention (arXiv 2312.08874), Sec. 4.1 Eq. 3-4 (agent aggregation and broadcast), Sec. 4.2 Eq. 5
        (agent bias, DWC, agents by pooling).
    Official: LeapLabTHU/Agent-Attention `agent_transformer/models/agent_{deit,pvt,swin}.py` `AgentAttention`.
        subquad: the 1-D bias tables are resized linearly at grids other than the construction grid, the 7 x 7
        tables to the run-time grid (the official code runs at its construction grid only; docs/deviations.md).
    Symbols: A = agent_num (paper n), a = sqrt(A) agent grid side, h heads, d = C / h, sr = sr_ratio,
        B_1 = an + ah + aw [+ ac] (agent -> key), B_2 = na + ha + wa [+ ca] (query -> agent).

    Args:
        dim: channels C.
        num_heads: heads h.
        input_size: (H, W) query grid at construction; sizes the 1-D bias tables (keys: (H // sr, W // sr)).
        agent_num: A, a perfect square (agents pooled to an a x a grid; 49 in the official default).
        qkv_bias: bias on the input projection.
        sr_ratio: PVT spatial reduction of K/V (a strided conv `sr` + `norm` on the map before the key/value rows).
        num_prefix_tokens: P leading class tokens: queries and keys with their own biases `ca_bias` / `ac_bias`
            (Agent-DeiT), no agents pooled from them and no DWC term.
        dwc_kernel_size: DWC kernel (odd; 3 in every official model).
        proj_drop: dropout after `proj`.
        fused: SDPA fast path (True) or the dense reference (False); both compute the same function.
    """

    caps = AttentionCaps(bidirectional=True, causal=False, needs_hw=True, supports_mask=False, complexity="O(N)",
                         sequence=False, notes="agents pooled from the 2-D query grid, 2-D bias tables and a 3 x 3 "
                         "DWC: no 1-D form in the paper or the official code; biases resized at other grids")

    @classmethod
    def stage_kwargs(cls, stage: dict) -> dict:
        """The key/value reduction of a PVT host's linear-attention stages (`la_sr_ratio`; Agent-PVT's
        `agent_sr_ratios`, 1 in every released model), not the softmax baseline's `sr_ratio`."""
        kw = super().stage_kwargs(stage)
        if stage.get("la_sr_ratio", 1) != 1:
            kw["sr_ratio"] = stage["la_sr_ratio"]
        return kw

    def __init__(self, dim: int, num_heads: int = 8, input_size: tuple[int, int] | int | None = None,
                 agent_num: int = 49, qkv_bias: bool = True, sr_ratio: int = 1, num_prefix_tokens: int = 0,
                 dwc_kernel_size: int = 3, proj_drop: float = 0.0, fused: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        who = "agent attention"
        self.dim, self.num_heads = dim, num_heads
        self.head_dim = check_heads(dim, num_heads, who)
        if input_size is None:
            raise ValueError(f"{who} needs input_size=(H, W) to size its bias tables")
        self.input_size = as_hw(input_size, "input_size")
        a = _agent_side(agent_num, who)
        if not isinstance(dwc_kernel_size, int) or dwc_kernel_size < 1 or dwc_kernel_size % 2 == 0:
            raise UserError(f"{who}: dwc_kernel_size={dwc_kernel_size!r} must be a positive odd int")
        if not isinstance(sr_ratio, int) or sr_ratio < 1:
            raise UserError(f"{who}: sr_ratio={sr_ratio!r} must be an int >= 1")
        if num_prefix_tokens < 0:
            raise UserError(f"{who}: num_prefix_tokens={num_prefix_tokens} must be >= 0")
        self.agent_num, self.agent_hw = agent_num, (a, a)
        self.sr_ratio, self.num_prefix_tokens, self.fused = sr_ratio, int(num_prefix_tokens), fused
        H, W = self.input_size
        if H < sr_ratio or W < sr_ratio:
            raise UserError(f"{who}: input_size {H}x{W} is smaller than sr_ratio={sr_ratio}")
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        if sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, sr_ratio, stride=sr_ratio, **dd)
            self.norm = nn.LayerNorm(dim, **dd)
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self.dwc = nn.Conv2d(dim, dim, dwc_kernel_size, padding=dwc_kernel_size // 2, groups=dim, **dd)
        _add_bias_tables(self, num_heads, agent_num, self.num_prefix_tokens, (H, W), (H // sr_ratio, W // sr_ratio),
                         dd)
        if not self.qkv.weight.is_meta:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Official init: every bias table trunc_normal(0.02); Linear trunc_normal(0.02) with zero bias; `dwc`,
        `sr` and `norm` keep PyTorch's defaults."""
        for name in BIAS_NAMES:
            if hasattr(self, name):
                trunc_normal_(getattr(self, name), std=0.02)
        for m in (self.qkv, self.proj):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def _kv_hw(self, hw: tuple[int, int]) -> tuple[int, int]:
        s = self.sr_ratio
        if hw[0] < s or hw[1] < s:
            raise ValueError(f"agent attention: grid {hw[0]}x{hw[1]} is smaller than sr_ratio={s}")
        return (hw[0] // s, hw[1] // s)

    def biases(self, hw: tuple[int, int], kv_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """B_1 (h, A, n) and B_2 (h, N, A) at query grid hw and key grid kv_hw (see `agent_biases`)."""
        return agent_biases(self.an_bias, self.na_bias, self.ah_bias, self.aw_bias, self.ha_bias, self.wa_bias,
                            getattr(self, "ac_bias", None), getattr(self, "ca_bias", None), hw, kv_hw)

    def _project(self, x: torch.Tensor, hw: tuple[int, int]):
        """x (B, N, C) -> q (B, N, C), k, v (B, n, C) and the key grid."""
        B, N, C = x.shape
        if self.sr_ratio == 1:
            q, k, v = self.qkv(x).reshape(B, N, 3, C).unbind(2)
            return q, k, v, tuple(hw)
        w, b = self.qkv.weight, self.qkv.bias
        q = F.linear(x, w[:C], None if b is None else b[:C])
        P = self.num_prefix_tokens
        xr = map_to_tokens(self.sr(tokens_to_map(x[:, P:], hw)))  # (B, n_g, C)
        xr = self.norm(torch.cat([x[:, :P], xr], dim=1))
        k, v = F.linear(xr, w[C:], None if b is None else b[C:]).reshape(B, xr.shape[1], 2, C).unbind(2)
        return q, k, v, self._kv_hw(hw)

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        return self._forward(x, hw, mask, self.fused)

    def forward_ref(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
        """Dense reference of `forward` (explicit pooling, softmax, V-resize and DWC matrices)."""
        return self._forward(x, hw, mask, False)

    def _forward(self, x, hw, mask, fused: bool) -> torch.Tensor:
        hw = self._check_input(x, hw, mask)
        q, k, v, kv_hw = self._project(x, hw)
        b1, b2 = self.biases(hw, kv_hw)
        fn = agent_attention if fused else agent_attention_ref
        o = fn(q, k, v, b1, b2, self.dwc.weight, self.dwc.bias, hw=tuple(hw), kv_hw=kv_hw, agent_hw=self.agent_hw,
               num_heads=self.num_heads, prefix=self.num_prefix_tokens)
        return self.proj_drop(self.proj(o))

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                         channel: int | None = None) -> torch.Tensor:
        """(B, N, C) -> (B, h, N, n) equivalent map (agent softmax product plus the DWC as a matrix), before `proj`;
        exact for head channel `channel`, the head's mean DWC kernel with channel=None."""
        hw = self._check_input(x, hw)
        q, k, _, kv_hw = self._project(x, hw)
        b1, b2 = self.biases(hw, kv_hw)
        return agent_attention_matrix(q, k, b1, b2, self.dwc.weight, hw=tuple(hw), kv_hw=kv_hw,
                                      agent_hw=self.agent_hw, num_heads=self.num_heads,
                                      prefix=self.num_prefix_tokens, channel=channel)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, agent_num={self.agent_num}, "
                f"grid={self.input_size}, sr_ratio={self.sr_ratio}, prefix={self.num_prefix_tokens}")

