"""L2ViT enhanced linear attention (`"enhanced_linear"`) and the Local Concentration Module (LCM)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .._shapes import check_heads, map_to_tokens, merge_heads, split_packed_heads, tokens_to_map
from ..errors import UserError
from ..layers.init import init_linears_
from ..layers.precision import fp32_island
from .base import AttentionCaps, TokenMixer
from .functional.linear import (
    depthwise_conv_matrix,
    enhanced_linear_attention_kv,
    enhanced_linear_attention_ref,
    linear_attention_matrix,
)
from .registry import register_attention

__all__ = ["EnhancedLinearAttention", "LocalConcentrationModule"]


@register_attention("enhanced_linear")
class EnhancedLinearAttention(TokenMixer):
    """L2ViT global linear attention with a ReLU kernel, clamped token-sum denominator and per-head temperature.

    Shapes: x (B, N, C) -> (B, N, C); hw is accepted and ignored (global, no grid needed).
    Paper: L2ViT paper, Eq. 3-5 (Paper: scale s = sqrt(C) on K.V, denominator clamped to [1e2, inf)).
    Official: `ChuanyangZheng/L2ViT` `classification/models/l2vit.py` `LinearAttention` (kv first):
        out_i = temperature_h * q_i (K^T V) / clamp(q_i . sum_j k_j, min=100), q, k after ReLU, no eps.
    subquad: the official code (docs/deviations.md); the core runs in float32 under autocast (docs/deviations.md).
    Symbols: h heads, d = C / h head dim, s_h = `temperature` (h, 1, 1), init d^-1/2 (paper s).

    Args:
        dim: channels C.
        num_heads: heads h.
        qkv_bias: bias on `qkv` (True in every L2ViT model).
        clamp_min: denominator clamp (official 100).
        qk_scale: overrides d^-1/2 as the temperature init (official `qk_scale`; unused by the models).
        proj_drop: dropout after `proj` (official rate 0).
        input_size: accepted for interface uniformity; ignored.
        fused: K^T V first (True) or the dense reference (False); both compute the same function.
        learnable_scale: the per-head `temperature` s (default). False builds no `temperature` and uses s = 1, the
            linear attention of paper Eq. 4 with the clamped denominator: the "without scale parameter" row of
            L2ViT paper Tab. 6.
    """

    caps = AttentionCaps(bidirectional=True, causal=False, needs_hw=False, supports_mask=False,
                         complexity="O(N)", sequence=True, notes="L2ViT; clamp on the token sum (N-dependent)",
                         grid_ndims=(2, 3))

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = True, clamp_min: float = 100.0,
                 qk_scale: float | None = None, proj_drop: float = 0.0, input_size: tuple[int, int] | None = None,
                 fused: bool = True, learnable_scale: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = check_heads(dim, num_heads, "enhanced_linear attention")
        if isinstance(clamp_min, bool) or not isinstance(clamp_min, (int, float)) or not clamp_min > 0:
            # No epsilon in the official denominator: a clamp of 0 divides all-zero ReLU rows by 0.
            raise UserError(f"enhanced_linear: clamp_min={clamp_min!r} must be a number > 0 (official: 100)")
        self.clamp_min = float(clamp_min)
        self.fused = fused
        self.learnable_scale = bool(learnable_scale)
        self.temperature = nn.Parameter(torch.empty(num_heads, 1, 1, **dd)) if learnable_scale else None
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self._temperature_init = qk_scale or self.head_dim ** -0.5
        if not self.qkv.weight.is_meta:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Official init: trunc_normal(0.02) weights, zero biases, temperature d^-1/2."""
        if self.temperature is not None:
            nn.init.constant_(self.temperature, self._temperature_init)
        init_linears_(self.qkv, self.proj)

    def _qkv(self, x: torch.Tensor):
        return split_packed_heads(self.qkv(x), 3, self.num_heads)  # each (B, h, N, d)

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        self._check_input(x, hw, mask)
        q, k, v = self._qkv(x)
        core = enhanced_linear_attention_kv if self.fused else enhanced_linear_attention_ref
        o = fp32_island(core, q, k, v, self._scale(q), clamp_min=self.clamp_min)
        return self.proj_drop(self.proj(merge_heads(o)))

    def forward_ref(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
        """Dense reference of `forward` (explicit N x N matrix)."""
        self._check_input(x, hw, mask)
        q, k, v = self._qkv(x)
        o = enhanced_linear_attention_ref(q, k, v, self._scale(q), self.clamp_min)
        return self.proj(merge_heads(o))

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw: tuple[int, int] | None = None) -> torch.Tensor:
        """(B, N, C) -> (B, h, N, N): P with attn-output = P @ v per head (exact, temperature and clamp included).

        The LCM is a separate residual branch on another input; see `LocalConcentrationModule.equivalent_matrix`.
        """
        q, k, _ = self._qkv(x)
        return linear_attention_matrix(F.relu(q), F.relu(k), "sum", 0.0, self.clamp_min, self._scale(q))

    def _scale(self, ref: torch.Tensor) -> torch.Tensor:
        """(h, 1, 1) numerator scale: the learnable `temperature`, or ones (paper Eq. 4, no scale parameter)."""
        return self.temperature if self.temperature is not None else ref.new_ones(self.num_heads, 1, 1)

    def denominator(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, C) -> (B, h, N, 1): the un-clamped denominators q_i . sum_j k_j (for clamp statistics)."""
        q, k, _ = self._qkv(x)
        q, k = F.relu(q), F.relu(k)
        return q @ k.sum(dim=-2, keepdim=True).transpose(-2, -1)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, clamp_min={self.clamp_min}, "
                f"learnable_scale={self.learnable_scale}")


class LocalConcentrationModule(nn.Module):
    """L2ViT LCM: depthwise conv -> GELU -> BatchNorm -> depthwise conv on the token map.

    Shapes: x (B, N, C) with hw=(H, W), N == H * W -> (B, N, C). The LGA block computes x + LCM(LN(x)).
    Paper: L2ViT paper, Eq. 6-8 (local concentration module).
    Official: `classification/models/l2vit.py` `LCM` (`local_mp`): conv1 DW k x k, GELU (erf), bn, conv2 DW k x k.
    Symbols: k kernel size (7 in every model, 3 in the ablation).

    Args:
        dim: channels C.
        kernel_size: k (odd).
    """

    def __init__(self, dim: int, kernel_size: int = 7, device=None, dtype=None) -> None:
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"LocalConcentrationModule: kernel_size={kernel_size} must be a positive odd int")
        dd = {"device": device, "dtype": dtype}
        self.dim = dim
        p = kernel_size // 2
        self.conv1 = nn.Conv2d(dim, dim, kernel_size, padding=p, groups=dim, **dd)
        self.act = nn.GELU()
        self.bn = nn.BatchNorm2d(dim, **dd)
        self.conv2 = nn.Conv2d(dim, dim, kernel_size, padding=p, groups=dim, **dd)

    def _map(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"LocalConcentrationModule: expected x (B, N, {self.dim}), got {tuple(x.shape)}")
        H, W = hw
        if H * W != x.shape[1]:
            raise ValueError(f"LocalConcentrationModule: hw={H}x{W} makes {H * W} tokens but x has N={x.shape[1]}")
        return tokens_to_map(x, (H, W))

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        y = self.conv2(self.bn(self.act(self.conv1(self._map(x, hw)))))
        return map_to_tokens(y)

    @torch.no_grad()
    def equivalent_matrix(self, x: torch.Tensor, hw: tuple[int, int], channel: int | None = None) -> torch.Tensor:
        """Linearisation of the LCM at x as token-mixing matrices (B, N, N) (paper Eq. 11 style).

        Exact statement: for channel c, J_c = M2_c diag(g_c) M1_c is the Jacobian d LCM(x)_c / d x_c in eval mode
        (BatchNorm with running statistics), where M1_c, M2_c are the conv matrices and
        g_c = bn_scale_c * GELU'(conv1(x)_c). `channel=None` returns the mean of J_c over channels (an average, not
        the map of any single channel).
        """
        H, W = hw
        h1 = self.conv1(self._map(x, hw)).flatten(2)  # (B, C, N)
        # GELU'(u) = Phi(u) + u phi(u) (exact erf form).
        cdf = 0.5 * (1.0 + torch.erf(h1 / 2 ** 0.5))
        pdf = torch.exp(-0.5 * h1 * h1) / (2 * torch.pi) ** 0.5
        bn_scale = self.bn.weight / torch.sqrt(self.bn.running_var + self.bn.eps)  # (C,)
        g = (cdf + h1 * pdf) * bn_scale[None, :, None]  # (B, C, N)
        m1 = depthwise_conv_matrix(self.conv1.weight, (H, W))  # (C, N, N)
        m2 = depthwise_conv_matrix(self.conv2.weight, (H, W))
        if channel is not None:
            c = int(channel)
            return (m2[c] * g[:, c, None, :]) @ m1[c]  # (B, N, N)
        return torch.einsum("cij,bcj,cjk->bik", m2, g, m1) / self.dim
