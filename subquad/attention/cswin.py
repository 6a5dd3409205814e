"""CSwin cross-shaped window attention with LePE (the softmax 'S' blocks of FLatten-CSwin)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .._shapes import as_hw, check_heads, merge_heads, size_oblivious, split_heads
from .base import AttentionCaps, TokenMixer
from .functional.cswin import (
    cswin_attention,
    cswin_attention_packed,
    cswin_attention_probs_ref,
    cswin_attention_ref,
    stripe_shape,
)
from .registry import register_attention

__all__ = ["LePEAttention", "CSWinAttention", "cswin_branches"]


class LePEAttention(nn.Module):
    """One CSwin branch: softmax attention inside stripes plus LePE (`get_v`), on already projected q, k, v.

    Shapes: q, k, v (B, N, C_b) with hw=(H, W), N = H * W -> (B, N, C_b) (no projection).
    Paper: CSwin (Dong et al. 2022) Eq. 1-3. Official: FLatten `models/flatten_cswin.py` `LePEAttention` (key
        `get_v`; the block owns `qkv` and `proj`).
    Symbols: idx 0 vertical stripes (H x sw), 1 horizontal (sw x W), -1 one global branch (H x W); sw = split_size.

    Args:
        dim: branch channels C_b (C / 2 for two branches, C for the global branch).
        num_heads: branch heads (h / 2 or h).
        idx: stripe direction (0, 1 or -1).
        split_size: stripe width sw.
        attn_drop: dropout on the probabilities (training only).
        fused: SDPA fast path (True) or the dense reference (False).
    """

    def __init__(self, dim: int, num_heads: int, idx: int, split_size: int = 7, attn_drop: float = 0.0,
                 fused: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = check_heads(dim, num_heads, "CSwin branch")
        stripe_shape((1, 1), idx, split_size)
        self.idx = idx
        self.split_size = split_size
        self.scale = self.head_dim ** -0.5
        self.fused = fused
        self.get_v = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim, device=device, dtype=dtype)
        self.attn_drop = attn_drop

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, idx={self.idx}, split_size={self.split_size}"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        q, k, v = (split_heads(t, self.num_heads) for t in (q, k, v))  # (B, h_b, N, d)
        stripe = stripe_shape(hw, self.idx, self.split_size)
        if self.fused:
            drop = self.attn_drop if self.training else 0.0
            o = cswin_attention(q, k, v, hw, stripe, self.get_v.weight, self.get_v.bias, self.scale, drop)
        else:
            o = cswin_attention_ref(q, k, v, hw, stripe, self.get_v.weight, self.get_v.bias, self.scale)
        return merge_heads(o)

    def forward_packed(self, qkv: torch.Tensor) -> torch.Tensor:
        """Fast path on the channels-last map qkv (B, H, W, 3, C_b) -> (B, H, W, C_b) (no stacking copies)."""
        B, H, W, _, C = qkv.shape
        stripe = stripe_shape((H, W), self.idx, self.split_size)
        drop = self.attn_drop if self.training else 0.0
        o = cswin_attention_packed(qkv.view(B, H, W, 3, self.num_heads, self.head_dim), stripe, self.get_v.weight,
                                   self.get_v.bias, self.scale, drop)
        return o.reshape(B, H, W, C)

    def forward_ref(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """Dense reference of `forward`."""
        q, k, v = (split_heads(t, self.num_heads) for t in (q, k, v))
        stripe = stripe_shape(hw, self.idx, self.split_size)
        return merge_heads(cswin_attention_ref(q, k, v, hw, stripe, self.get_v.weight, self.get_v.bias, self.scale))

    @torch.no_grad()
    def probs(self, q: torch.Tensor, k: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """(B, h_b, N, N) stripe softmax probabilities (LePE excluded)."""
        q, k = split_heads(q, self.num_heads), split_heads(k, self.num_heads)
        return cswin_attention_probs_ref(q, k, hw, stripe_shape(hw, self.idx, self.split_size), self.scale)


def cswin_branches(attns: Sequence[nn.Module], qkv: torch.Tensor, hw: tuple[int, int],
                   ref: bool = False) -> torch.Tensor:
    """Run CSwin branches on the projected qkv (B, N, 3, C): one branch takes all channels, two branches take the
    first and the last C / 2 channels (official `CSWinBlock.forward`). Returns the concatenation (B, N, C)."""
    B, N, _, C = qkv.shape
    H, W = hw
    parts = [slice(0, C)] if len(attns) == 1 else [slice(0, C // 2), slice(C // 2, C)]
    if ref or not all(a.fused for a in attns):
        outs = [a.forward_ref(qkv[:, :, 0, sl], qkv[:, :, 1, sl], qkv[:, :, 2, sl], hw) if ref
                else a(qkv[:, :, 0, sl], qkv[:, :, 1, sl], qkv[:, :, 2, sl], hw) for a, sl in zip(attns, parts)]
        return torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0]
    qmap = qkv.view(B, H, W, 3, C)
    # every caller (the module and the hosts' projection-free form): a traced stripe count is not specialised at 1
    with size_oblivious():
        outs = [a.forward_packed(qmap[..., sl]) for a, sl in zip(attns, parts)]  # each (B, H, W, C_b)
    return (torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0]).reshape(B, N, C)


@register_attention("cswin")
class CSWinAttention(TokenMixer):
    """CSwin cross-shaped window self-attention: `qkv`, two stripe branches (`attns.0` vertical, `attns.1`
    horizontal; each h / 2 heads on C / 2 channels with its own LePE `get_v`) or one global branch, then `proj`.

    Shapes: x (B, N, C) with hw=(H, W), N = H * W -> (B, N, C). Any H, W (stripes padded and masked, **[ours]**).
    Paper: CSwin (Dong et al. 2022) Eq. 1-3 (cross-shaped window, LePE).
    Official: FLatten `models/flatten_cswin.py` `CSWinBlock` attention part (`qkv`, `attns`, `proj`) with
        `LePEAttention`; the FLatten-CSwin host keeps those names at block level and calls `cswin_branches`.
    Symbols: sw = split_size (paper sw), h heads, d = C / h.

    Args:
        dim: channels C.
        num_heads: heads h (even for two branches).
        split_size: stripe width sw.
        last_stage: one global branch (all heads over the whole map), as the official last stage. Also chosen when
            `input_size` equals (sw, sw), the official `patches_resolution == split_size` rule.
        qkv_bias: bias on `qkv`.
        attn_drop: dropout on the probabilities (training only).
        proj_drop: dropout after `proj`.
        input_size: construction map (H, W).
        fused: SDPA fast path (True) or the dense reference (False).
    """

    caps = AttentionCaps(bidirectional=True, causal=False, needs_hw=True, supports_mask=False,
                         complexity="O(N sw (H + W))", sequence=False,
                         notes="CSwin stripes + LePE; non-divisible maps padded, padded keys masked")

    def __init__(self, dim: int, num_heads: int = 8, split_size: int = 7, last_stage: bool = False,
                 qkv_bias: bool = True, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 input_size: tuple[int, int] | None = None, fused: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = check_heads(dim, num_heads, "cswin attention")
        if not isinstance(split_size, int) or split_size < 1:
            raise ValueError(f"cswin attention: split_size must be an int >= 1, got {split_size!r}")
        self.input_size = as_hw(input_size, "input_size")
        if self.input_size == (split_size, split_size):
            last_stage = True
        self.last_stage = last_stage
        self.split_size = split_size
        if not last_stage and num_heads % 2:
            raise ValueError(f"cswin attention: two branches need an even num_heads, got num_heads={num_heads} "
                             "(or use last_stage=True)")
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        if last_stage:
            branches = [LePEAttention(dim, num_heads, -1, split_size, attn_drop, fused, **dd)]
        else:
            branches = [LePEAttention(dim // 2, num_heads // 2, i, split_size, attn_drop, fused, **dd)
                        for i in range(2)]
        self.attns = nn.ModuleList(branches)
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)

    def _qkv(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        return self.qkv(x).view(B, N, 3, C)

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        H, W = self._check_input(x, hw, mask)
        return self.proj_drop(self.proj(cswin_branches(self.attns, self._qkv(x), (H, W))))

    def forward_ref(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
        """Dense reference of `forward`."""
        return self.proj_drop(self.proj(cswin_branches(self.attns, self._qkv(x), tuple(hw), ref=True)))

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw: tuple[int, int] | None = None) -> torch.Tensor:
        """(B, N, C) -> (B, h, N, N): the stripe softmax probabilities of every head (branch 0 heads first).

        Exact for the softmax part; the LePE term (a per-channel 3x3 conv inside the stripe) is not a per-head map
        and is not included.
        """
        H, W = self._check_input(x, hw)
        q, k, _ = self._qkv(x).unbind(2)
        if len(self.attns) == 1:
            return self.attns[0].probs(q, k, (H, W))
        half = self.dim // 2
        return torch.cat([self.attns[0].probs(q[..., :half], k[..., :half], (H, W)),
                          self.attns[1].probs(q[..., half:], k[..., half:], (H, W))], dim=1)
