"""Generic kernel linear attention (`"linear"`, plus one registered name per feature map: `"linear_relu"`, ...).

These are the baselines of L2ViT Table 8 and FLatten Table 3, all on the shared core of `functional/linear.py`.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from .._shapes import check_heads, merge_heads
from ..layers.init import init_linears_
from ..layers.precision import fp32_island
from .base import AttentionCaps, TokenMixer
from .functional.linear import (
    FEATURE_MAPS,
    SELF_NORMALISED,
    causal_linear_attention_chunked,
    causal_linear_attention_ref,
    feature_map,
    linear_attention,
    linear_attention_matrix,
    linear_attention_ref,
)
from .registry import register_attention

__all__ = ["LinearAttention", "CAUSAL_MAPS"]

# Feature maps with a causal (prefix-sum) form: strictly non-negative features computed token by token. The others
# normalise over all tokens (l1, softmax, hydra's keys), re-weight by the sequence length (cosformer) or can make
# the running denominator vanish (leaky_relu).
CAUSAL_MAPS = ("relu", "elu1")


def _core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, name: str, eps: float,
          fused: bool) -> torch.Tensor:
    qf, kf = feature_map(name, q, k, mask)
    normaliser = "none" if name in SELF_NORMALISED else "sum"
    if fused:
        return linear_attention(qf, kf, v, normaliser, eps)
    return linear_attention_ref(qf, kf, v, normaliser, eps)


@register_attention("linear")
class LinearAttention(TokenMixer):
    """Bidirectional kernel linear attention: out_i = phi(q_i) sum_j phi(k_j)^T v_j / (phi(q_i) . sum_j phi(k_j) + eps).

    Shapes: x (B, N, C) -> (B, N, C); mask (B, N) bool, True = real token (masked keys are dropped).
    Paper: Katharopoulos et al. 2020 (linear attention); the feature maps of L2ViT paper Table 8 and FLatten
        (arXiv 2308.00442) Table 3: 'relu', 'elu1' (elu + 1), 'leaky_relu' (slope 0.01), 'l1' (SimA: each channel
        L1-normalised
        over the tokens, no denominator), 'softmax' (Efficient Attention: q softmax over channels, k softmax over
        tokens, no denominator), 'hydra' (Hydra attention: cosine kernel with one head per channel, i.e. d = 1 and
        no denominator; `num_heads` is then ignored), 'cosformer' (ReLU with cos((pi / 2)(i - j) / M) re-weighting,
        M = max(N, n), i the flattened token index).
    Official: no single official code; each map follows its paper. Q(K^T V) or (Q K^T) V by cost (`order='auto'`).
    Symbols: phi feature map, h heads, d = C / h, eps denominator epsilon.

    Args:
        dim: channels C.
        num_heads: heads h.
        feature_map: one of `FEATURE_MAPS`.
        qkv_bias: bias on `qkv`.
        eps: added to the denominator (maps with a denominator).
        input_size: accepted for interface uniformity; ignored.
        fused: fast path (True) or the dense reference (False).
        causal: query t sees keys <= t only (language models; feature maps in `CAUSAL_MAPS`):
            out_t = phi(q_t) S_t / (phi(q_t) . z_t + eps) with the prefix sums S_t = sum_{j<=t} phi(k_j)^T v_j and
            z_t = sum_{j<=t} phi(k_j) (Katharopoulos et al. 2020, arXiv 2006.16236, Eq. 9-12), computed in chunks
            of `chunk_size` tokens; no masks.
        chunk_size: tokens per chunk of the causal fast path (speed only; the function does not depend on it).
    """

    caps = AttentionCaps(bidirectional=True, causal=True, needs_hw=False, supports_mask=True, complexity="O(N)",
                         sequence=True, notes="kernel linear attention baselines; causal=True with relu or elu1",
                         grid_ndims=(2, 3))
    default_feature_map = "relu"

    def __init__(self, dim: int, num_heads: int = 8, feature_map: str | None = None, qkv_bias: bool = True,
                 eps: float = 1e-6, input_size: tuple[int, int] | None = None, fused: bool = True,
                 causal: bool = False, chunk_size: int = 64, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        feature_map = feature_map or self.default_feature_map
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"linear attention: feature_map={feature_map!r} is not one of {sorted(FEATURE_MAPS)}")
        if causal and feature_map not in CAUSAL_MAPS:
            raise ValueError(f"linear attention: feature_map={feature_map!r} has no causal form; causal=True needs "
                             f"one of {', '.join(CAUSAL_MAPS)}")
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"linear attention: chunk_size must be an int >= 1, got {chunk_size!r}")
        self.causal, self.chunk_size = bool(causal), chunk_size
        if feature_map not in CAUSAL_MAPS:
            self.caps = dataclasses.replace(type(self).caps, causal=False)
        elif causal:
            self.caps = dataclasses.replace(type(self).caps, bidirectional=False, supports_mask=False)
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = check_heads(dim, num_heads, f"linear attention ({feature_map})")
        self.feature_map = feature_map
        self.eps = float(eps)
        self.fused = fused
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.proj = nn.Linear(dim, dim, **dd)
        if not self.qkv.weight.is_meta:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        init_linears_(self.qkv, self.proj)

    def _qkv(self, x: torch.Tensor):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, C).unbind(2)  # (B, N, C) each
        if self.feature_map == "hydra":
            # Hydra: normalise over all C channels, then one head per channel (d = 1).
            q = q / q.norm(dim=-1, keepdim=True).clamp_min(1e-6)
            k = k / k.norm(dim=-1, keepdim=True).clamp_min(1e-6)
            h, d = C, 1
        else:
            h, d = self.num_heads, self.head_dim
        return tuple(t.reshape(B, N, h, d).transpose(1, 2) for t in (q, k, v))  # (B, h, N, d)

    def _run(self, x: torch.Tensor, mask: torch.Tensor | None, fused: bool) -> torch.Tensor:
        q, k, v = self._qkv(x)
        if self.causal:
            qf, kf = feature_map(self.feature_map, q, k)
            if fused:
                o = fp32_island(causal_linear_attention_chunked, qf, kf, v, eps=self.eps, chunk_size=self.chunk_size)
            else:
                o = fp32_island(causal_linear_attention_ref, qf, kf, v, eps=self.eps)
        elif self.feature_map == "hydra":
            kk = k if mask is None else k * mask[:, None, :, None].to(k.dtype)
            core = linear_attention if fused else linear_attention_ref
            o = fp32_island(core, q, kk, v, normaliser="none")
        else:
            o = fp32_island(_core, q, k, v, mask, name=self.feature_map, eps=self.eps, fused=fused)
        return self.proj(merge_heads(o))

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        self._check_input(x, hw, mask)
        return self._run(x, mask, self.fused)

    def forward_ref(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
        """Dense reference of `forward` (explicit N x N kernel matrix)."""
        self._check_input(x, hw, mask)
        return self._run(x, mask, False)

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw: tuple[int, int] | None = None) -> torch.Tensor:
        """(B, N, C) -> (B, h, N, N) normalised kernel matrix P with attn-output = P @ v (exact).

        For 'hydra' h = C (one head per channel).
        """
        q, k, _ = self._qkv(x)
        if self.feature_map == "hydra":
            return linear_attention_matrix(q, k, "none")
        qf, kf = feature_map(self.feature_map, q, k)
        if self.causal:
            a = (qf @ kf.transpose(-2, -1)).tril()
            return a / (a.sum(-1, keepdim=True) + self.eps)
        normaliser = "none" if self.feature_map in SELF_NORMALISED else "sum"
        return linear_attention_matrix(qf, kf, normaliser, self.eps)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, feature_map={self.feature_map!r}"
                + (f", causal=True, chunk_size={self.chunk_size}" if self.causal else ""))


def _make_variant(map_name: str) -> type[LinearAttention]:
    """A registered subclass with `feature_map` fixed to `map_name` (registered as `linear_<map_name>`)."""

    class _Variant(LinearAttention):
        default_feature_map = map_name
        caps = dataclasses.replace(LinearAttention.caps, causal=map_name in CAUSAL_MAPS,
                                   notes="kernel linear attention baselines" + (
                                       "; causal=True: chunked prefix sums" if map_name in CAUSAL_MAPS else ""))

        def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = True, eps: float = 1e-6,
                     input_size: tuple[int, int] | None = None, fused: bool = True, causal: bool = False,
                     chunk_size: int = 64, device=None, dtype=None) -> None:
            super().__init__(dim, num_heads, map_name, qkv_bias, eps, input_size, fused, causal, chunk_size,
                             device, dtype)

    _Variant.__name__ = _Variant.__qualname__ = f"LinearAttention_{map_name}"
    _Variant.__doc__ = f"`LinearAttention` with feature_map={map_name!r} (see `LinearAttention`)."
    return register_attention(f"linear_{map_name}")(_Variant)


VARIANTS = {name: _make_variant(name) for name in FEATURE_MAPS}
