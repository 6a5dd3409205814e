"""Window attention: Swin W-MSA / SW-MSA with relative position bias, and L2ViT's local window attention (LWA).

The module takes the full map tokens (B, H*W, C) with hw and does pad -> cyclic shift -> partition -> attention ->
reverse -> unshift -> crop itself, so hosts never partition.
"""

from __future__ import annotations

import torch
from timm.layers import trunc_normal_
from torch import nn

from .._shapes import as_hw, check_heads, known_equal, merge_heads, size_oblivious, split_packed_heads, tracing
from .base import AttentionCaps, TokenMixer
from .functional.softmax import sdpa
from .functional.window import (
    WindowGeometry,
    relative_position_bias,
    relative_position_index,
    window_attention_probs_ref,
    window_attention_ref,
    window_gather_index,
    window_geometry,
    window_mask,
)
from .registry import register_attention

__all__ = ["WindowAttention"]


@register_attention("window")
class WindowAttention(TokenMixer):
    """Multi-head softmax attention inside non-overlapping w x w windows of the token map.

    Shapes: x (B, N, C) with hw=(H, W), N = H * W -> (B, N, C). Any H, W: the map is padded at the bottom/right to
    multiples of the window and cropped afterwards.
    Paper: Swin (Liu et al. 2021) Eq. 4 (RPB) and shifted windows; L2ViT paper section 3.2 (LWA: no RPB, no shift).
    Official: FLatten-Transformer `models/flatten_swin.py` `WindowAttention` + `SwinTransformerBlock` (Swin);
        L2ViT `classification/models/l2vit.py` `WindowAttention` + `LWABlock` (zero padding after LN, no mask).
    Symbols: w window side (paper M), s shift (paper floor(M/2)), h heads, d = C / h.

    Two configurations:
        * Swin: `rel_pos_bias=True`, `shift_size` 0 or w // 2, `pad_mode="mask"`. Following the official block,
          when min(H, W) <= w the window is clipped to min(H, W) and the shift set to 0: at construction for
          `input_size` (this also sizes the bias table, as the official code does) and again at run time for the
          given hw (a clipped run-time window reads the central offsets of the table). Padded keys are masked
          **[ours]**: the official code requires divisible maps.
        * L2ViT LWA: `rel_pos_bias=False`, `shift_size=0`, `pad_mode="zero"`: padded tokens are zeros projected by
          `qkv` (their key/value are the qkv bias) and take part as keys, without a mask and without clipping,
          exactly as the official code. An L2ViT host asks for it with the stage form 'lwa' (`stage_kwargs`).

    Args:
        dim: channels C.
        num_heads: heads h.
        window_size: window side w.
        shift_size: cyclic shift s (0 <= s < w).
        qkv_bias: bias on `qkv`.
        rel_pos_bias: learnable `relative_position_bias_table` ((2w - 1)^2, h), trunc_normal(0.02).
        pad_mode: 'mask' (padded keys excluded) or 'zero' (padded zero tokens are keys).
        clip_window: clip the window to small maps (default: True for 'mask', False for 'zero').
        attn_drop: dropout on the attention probabilities (training only).
        proj_drop: dropout after `proj`.
        input_size: construction map (H, W); sets the official clipping of window and shift.
        fused: SDPA fast path (True) or the dense reference (False).
    """

    caps = AttentionCaps(bidirectional=True, causal=False, needs_hw=True, supports_mask=False,
                         complexity="O(N w^2)", sequence=False,
                         notes="Swin W-MSA/SW-MSA (RPB, shift mask, padded keys masked) or L2ViT LWA (zero padding)")

    @classmethod
    def stage_kwargs(cls, stage: dict) -> dict:
        """Window w = `window_size` (7), shift w // 2 on `shifted` blocks (Swin W-MSA / SW-MSA with RPB); the
        form 'lwa' is L2ViT's local window attention (no RPB, zero-padded tokens kept as keys, no shift)."""
        kw = super().stage_kwargs(stage)
        w = stage.get("window_size") or 7
        if stage.get("form") == "lwa":
            return {**kw, "window_size": w, "shift_size": 0, "rel_pos_bias": False, "pad_mode": "zero"}
        return {**kw, "window_size": w, "shift_size": w // 2 if stage.get("shifted") else 0}

    def __init__(self, dim: int, num_heads: int = 8, window_size: int = 7, shift_size: int = 0,
                 qkv_bias: bool = True, rel_pos_bias: bool = True, pad_mode: str = "mask",
                 clip_window: bool | None = None, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 input_size: tuple[int, int] | None = None, fused: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = check_heads(dim, num_heads, "window attention")
        if pad_mode not in ("mask", "zero"):
            raise ValueError(f"window attention: pad_mode must be 'mask' or 'zero', got {pad_mode!r}")
        if not isinstance(window_size, int) or window_size < 1:
            raise ValueError(f"window attention: window_size must be an int >= 1, got {window_size!r}")
        if not 0 <= shift_size < window_size:
            raise ValueError(f"window attention: shift_size must satisfy 0 <= shift_size < window_size={window_size},"
                             f" got {shift_size}")
        self.pad_mode = pad_mode
        self.clip_window = (pad_mode == "mask") if clip_window is None else bool(clip_window)
        self.input_size = as_hw(input_size, "input_size")
        if self.input_size is not None:
            geo = window_geometry(self.input_size, window_size, shift_size, self.clip_window)
            window_size, shift_size = geo.window, geo.shift
        self.window_size = window_size
        self.shift_size = shift_size
        self.scale = self.head_dim ** -0.5
        self.fused = fused
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        if rel_pos_bias:
            self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window_size - 1) ** 2, num_heads, **dd))
            self.register_buffer("relative_position_index",
                                 relative_position_index(window_size, device=device), persistent=False)
            if not self.relative_position_bias_table.is_meta:
                self.reset_parameters()
        else:
            self.relative_position_bias_table = None
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        # Per-geometry index maps and masks (recomputed buffers, never saved); small and bounded by the number of
        # distinct map sizes a model sees.
        self._cache: dict = {}

    def reset_parameters(self) -> None:
        """Official init of the RPB table: trunc_normal(0.02) (the Linear layers keep the host's init)."""
        if self.relative_position_bias_table is not None:
            trunc_normal_(self.relative_position_bias_table, std=0.02)

    def init_non_persistent_buffers(self) -> None:
        """Recompute `relative_position_index` (not saved; e.g. after `to_empty()` of a meta-device build)."""
        if self.relative_position_bias_table is not None:
            self.relative_position_index.copy_(relative_position_index(self.window_size,
                                                                       device=self.relative_position_index.device))
        self._cache.clear()

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, window_size={self.window_size}, "
                f"shift_size={self.shift_size}, pad_mode={self.pad_mode!r}")

    def geometry(self, hw: tuple[int, int]) -> WindowGeometry:
        """Effective window, shift and padded map for a run-time map hw."""
        return window_geometry(hw, self.window_size, self.shift_size, self.clip_window)

    def _pad_kv(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Key and value (h, d) of a zero token: the qkv bias (pad_mode='zero'), else None."""
        b = self.qkv.bias
        if self.pad_mode != "zero" or b is None:
            return None
        C, h, d = self.dim, self.num_heads, self.head_dim
        return b[C:2 * C].view(h, d), b[2 * C:].view(h, d)

    def _cached(self, key: tuple, make):
        if tracing():  # tensors made while tracing are fake; sizes may be symbolic (unhashable)
            return make()
        if key not in self._cache:
            if len(self._cache) > 32:
                self._cache.clear()
            self._cache[key] = make()
        return self._cache[key]

    def _attn_mask(self, geo: WindowGeometry, dtype: torch.dtype, device) -> torch.Tensor | None:
        """Float mask (1, nW * h, L, L) (shift / padding), (1, h, L, L) (bias only) or None: relative position bias
        plus the shift / padding mask.

        The shift/padding part is cached per geometry; the bias is gathered from the table on every call while
        gradients are needed, and cached with the table's version counter otherwise (inference).
        """
        table = self.relative_position_bias_table
        nW, h, L = geo.num_windows, self.num_heads, geo.window ** 2
        m = self._cached(("mask", geo, dtype, device),
                         lambda: window_mask(geo, self.pad_mode == "mask", device, dtype))
        if table is None:
            return None if m is None else m[:, None].expand(nW, h, L, L).reshape(1, nW * h, L, L)
        if not (torch.is_grad_enabled() and table.requires_grad) and not tracing():
            key = ("full", geo, dtype, device, table._version, table.data_ptr())
            if key not in self._cache:
                self._cache = {k: v for k, v in self._cache.items() if k[0] != "full"}
                with torch.no_grad():
                    self._cache[key] = self._full_mask(geo, m, dtype)
            return self._cache[key]
        return self._full_mask(geo, m, dtype)

    def _full_mask(self, geo: WindowGeometry, m: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        nW, h, L = geo.num_windows, self.num_heads, geo.window ** 2
        if known_equal((geo.window,), (self.window_size,)):
            bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(L, L, -1)
            bias = bias.permute(2, 0, 1)
        else:
            bias = relative_position_bias(self.relative_position_bias_table, geo.window, self.window_size)
        bias = bias.to(dtype)[None]  # (1, h, L, L)
        if m is None:
            return bias
        return (bias + m[:, None]).reshape(1, nW * h, L, L)

    def _qkv(self, x: torch.Tensor):
        return split_packed_heads(self.qkv(x), 3, self.num_heads)  # each (B, h, N, d)

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        H, W = self._check_input(x, hw, mask)
        if not self.fused:
            return self.forward_ref(x, (H, W))
        with size_oblivious():
            return self._forward_windows(x, H, W)

    def _forward_windows(self, x: torch.Tensor, H, W) -> torch.Tensor:
        B, N, C = x.shape
        h, d = self.num_heads, self.head_dim
        geo = self.geometry((H, W))
        L, nW = geo.window ** 2, geo.num_windows
        fwd, inv = self._cached(("index", geo, x.device), lambda: window_gather_index(geo, x.device))
        # Pad (zero tokens: L2ViT pads after LN; for 'mask' the pads are masked keys) + shift + partition as one
        # gather: (B, N, C) -> (B*nW, L, C).
        src = x if known_equal(geo.padded, (H, W)) else torch.cat([x, x.new_zeros(B, 1, C)], dim=1)
        # The batch axis is never merged with the window axis of a symbolic size: a traced reshape (B, nW) -> B*nW
        # is guarded nW >= 2 (PyTorch specialises size 1), which would refuse inputs with one window.
        # (A 1-D index viewed as 2-D needs no size check; the gather then makes (B, nW, L, C) directly.)
        xw = src[:, fwd.view(nW, L)]
        attn_mask = self._attn_mask(geo, x.dtype, x.device)
        # (B, nW, L, 3C) -> (3, B, nW*h, L, d) when the mask differs per window (windows and heads share one batch
        # axis, so a (1, nW*h, L, L) mask broadcasts over B), else (3, B*nW, h, L, d); 4-D for the fused kernel.
        # While tracing, the first layout always (a per-head mask repeated over the windows).
        per_window = attn_mask is not None and not known_equal((attn_mask.shape[1],), (h,))
        if tracing() and not per_window:
            per_window = True
            if attn_mask is not None:
                attn_mask = attn_mask.repeat(1, nW, 1, 1)
        qkv = self.qkv(xw).view(B, nW, L, 3, h, d).permute(3, 0, 1, 4, 2, 5)
        q, k, v = qkv.reshape(3, B, nW * h, L, d).unbind(0) if per_window else qkv.reshape(3, B * nW, h, L, d).unbind(0)
        if attn_mask is not None and attn_mask.dtype != q.dtype:
            attn_mask = attn_mask.to(q.dtype)  # autocast
        drop = self.attn_drop.p if self.training else 0.0
        o = sdpa(q, k, v, attn_mask=attn_mask, dropout_p=drop, scale=self.scale)
        # (B, nW*h, L, d) -> (B, nW*L, C); proj is per token, so it runs before the reverse.
        # Explicit copies: an exported program's SDPA decomposition may return other strides than the eager kernel,
        # so a view decided while tracing would not hold there (and the transpose needs a copy anyway).
        o = self.proj(o.contiguous().view(B, nW, h, L, d).transpose(2, 3).contiguous().view(B, nW * L, C))
        # Reverse + unshift + crop as one gather: (B, nW*L, C) -> (B, N, C).
        return self.proj_drop(torch.index_select(o, 1, inv))

    def forward_ref(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
        """Dense reference of `forward`: one masked (N x N) softmax over the whole (padded) map."""
        q, k, v = self._qkv(x)
        o = window_attention_ref(q, k, v, tuple(hw), self.window_size, self.shift_size,
                                 self.relative_position_bias_table, self.window_size, self.pad_mode,
                                 self.clip_window, self.scale, self._pad_kv())
        return self.proj_drop(self.proj(merge_heads(o)))

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw: tuple[int, int] | None = None) -> torch.Tensor:
        """(B, N, C) -> (B, h, N, N) softmax probabilities between real tokens (exact).

        With pad_mode='zero' the padded zero tokens also receive probability mass, which this matrix omits (its
        rows then sum to less than 1).
        """
        H, W = self._check_input(x, hw)
        q, k, _ = self._qkv(x)
        geo = self.geometry((H, W))
        pad_kv = self._pad_kv()
        p = window_attention_probs_ref(q, k, (H, W), self.window_size, self.shift_size,
                                       self.relative_position_bias_table, self.window_size, self.pad_mode,
                                       self.clip_window, self.scale, None if pad_kv is None else pad_kv[0])
        Hp, Wp = geo.padded
        real = (torch.arange(H, device=x.device)[:, None] * Wp + torch.arange(W, device=x.device)[None, :]).flatten()
        return p[:, :, real][:, :, :, real]
