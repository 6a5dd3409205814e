"""Transformer-LS long-short attention modules: bidirectional 1-D / 2-D (`LongShortAttention`, and `LongShortCore` for
hosts that project q, k, v themselves) and causal (`ChunkedLongShortAttention`), registered as one mechanism,
"long_short".

`build_attention("long_short", dim, heads, ...)` returns (`LongShortCore.resolve` picks the class):
- `causal=False`: a `LongShortAttention`; it computes the 1-D form when called with hw=None and the 2-D image form
  when called with hw=(H, W) (`dims=1` or `dims=2` pins one form);
- `causal=False, host_qkv=True`: a `LongShortCore` (no q/k/v layers; the host calls `forward_qkv`);
- `causal=True`: a `ChunkedLongShortAttention` (autoregressive form with a decoding cache).

One set of parameter names per module: the bidirectional forms use the ImageNet code's names (`qkv`, `proj`,
`to_dynamic_projection`, `dual_ln_full`, `dual_ln_dp`, `local_relative_position_bias_table`); `remap_lra_official`
maps the LRA code's keys onto them and `remap_legacy` the keys of subquad <= 0.1 checkpoints. The math lives in
`functional/long_short.py`; these modules hold the parameters and prepare q, k, v.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from timm.layers import StdConv2d, trunc_normal_
from torch import nn

from .._shapes import check_heads, check_hw, check_mask, check_tokens, merge_heads, size_oblivious, split_heads
from ..errors import UserError
from .base import AttentionCaps, TokenMixer
from .functional.long_short import (
    dynamic_projection,
    long_short_1d_sdpa,
    long_short_2d_sdpa,
    long_short_causal_ref,
    long_short_causal_sdpa,
    long_short_global_sdpa,
    long_short_ref,
    post_cls_ref,
    post_cls_sdpa,
    rpe_index_2d,
    rpe_index_tile,
    rpe_table_size,
    window_mask_1d,
    window_mask_2d,
    xl_sinusoid,
)
from .registry import register_attention, register_attention_form

__all__ = ["LongShortAttention", "LongShortCore", "ChunkedLongShortAttention", "LongShortCache", "remap_lra_official",
           "remap_legacy"]

_CAPS = AttentionCaps(bidirectional=True, causal=True, needs_hw=False, supports_mask=True, complexity="O(N)",
                      sequence=True, notes="1-D with hw=None, 2-D with hw; causal=True gives the autoregressive form")


def _check_positive(who: str, **values: int) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{who}: {name} must be an int >= 1, got {v!r}")


def _check_terms(who: str, window_size: int, rank: int) -> None:
    """w >= 0 and r >= 0, not both 0: w = 0 is the dynamic-projection-only and r = 0 the window-only ablation
    (Transformer-LS, arXiv 2107.02192, Tab. 1)."""
    for name, v in (("window_size", window_size), ("rank", rank)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise UserError(f"{who}: {name} must be an int >= 0 (0 drops that branch), got {v!r}")
    if window_size == 0 and rank == 0:
        raise UserError(f"{who}: window_size=0 and rank=0 leave no keys; keep at least one of them >= 1")


def _fused_qkv(dim: int, bias: bool, dd: dict) -> nn.Linear:
    """Linear(C -> 3C) initialised as three Linear(C -> C) layers built one after the other (PyTorch's default
    init: weight, then bias, per layer): the RNG draws of the LRA code's `W_q`, `W_k`, `W_v`, so a seeded LRA model
    (the hosts that keep PyTorch's init) starts from the same weights under the fused name. Vision hosts
    re-initialise every Linear themselves."""
    device = torch.get_default_device() if dd["device"] is None else torch.device(dd["device"])
    lin = nn.Linear(dim, dim * 3, bias=bias, device="meta", dtype=dd["dtype"]).to_empty(device=device)
    if device.type == "meta":
        return lin
    with torch.no_grad():
        for i in range(3):
            rows = slice(i * dim, (i + 1) * dim)
            nn.init.kaiming_uniform_(lin.weight[rows], a=math.sqrt(5))
            if bias:
                nn.init.uniform_(lin.bias[rows], -1 / math.sqrt(dim), 1 / math.sqrt(dim))
    return lin


def _dual_ln(dim: int, on: bool, dd: dict) -> nn.Module:
    """One DualLN LayerNorm, or the identity for the no-DualLN ablation."""
    return nn.LayerNorm(dim, **dd) if on else nn.Identity()


@register_attention_form("long_short", "host_qkv")
class LongShortCore(TokenMixer):
    """Bidirectional long-short attention on queries, keys and values that the host projects (`forward_qkv`).

    The form for hosts with their own q/k/v projections (CvT*-LS's convolutional projections): the module owns what
    the mechanism adds to the host's projections -- the dynamic projection W^P (`to_dynamic_projection`, with the
    weight-standardised depthwise conv `dp_conv` in front of it when `dp_conv=True`, Transformer-LS App. E), the
    DualLN pair `dual_ln_full` (LN_L) / `dual_ln_dp` (LN_G) and the optional ViL window bias
    `local_relative_position_bias_table` -- and neither the q/k/v nor the output projection (the host's).
    `build_attention("long_short", ..., host_qkv=True)` builds it (the mechanism's "host_qkv" form);
    `LongShortAttention` adds the fused `qkv`.

    Every query takes ONE softmax over [r dynamically projected keys (LN_G) ; its window keys (LN_L) ; the global
    token], then the global token takes the official post-CLS rule. 1-D: segments of w queries, each seeing
    w + 2 ext keys (ext = max(w // 2, 1)). 2-D: w x w query tiles, each seeing the (w + 2 ext)^2 keys around it,
    with the ViL relative-position bias on the window logits only. Any length / any H x W (padding is internal and
    masked; docs/deviations.md).

    Shapes: x (B, N, C) -> (B, N, C); N = P + n with P = num_prefix_tokens leading global tokens; 2-D: n = H * W.
    mask (B, N) bool, True = real token (the prefix entry is ignored). Padded (mask False) query rows get zero
    attention, so their output is zero here and the output-projection bias after `proj` (official;
    docs/deviations.md).

    Paper: Transformer-LS (arXiv 2107.02192), Eq. 3 (dynamic projection), Eq. 6-7 (DualLN aggregation).
    Official: NVIDIA/transformer-ls, `imagenet/models/layers/transformer_ls.py` AttentionLS (these key names) and
    `lra/attention_transformer_ls.py` AttentionLS (keys `W_q`, `W_k`, `W_v`, `W_o`, `dual_ln_l`, `dual_ln_s`,
    `dconv_fc`; `remap_lra_official` renames them).
    Symbols: w window_size (paper w; official `w` / `window_size`), r rank (paper r; official `dp_rank` /
    `num_landmarks`), h num_heads, d = C / h.

    Args:
        dim: channels C.
        num_heads: heads h.
        window_size: w >= 1 (default 7 for a 2-D build, i.e. `dims=2` or `input_size` given, else 8); 0 drops the
            short-term window: the "dynamic projection only" ablation (Transformer-LS, arXiv 2107.02192, Tab. 1).
        rank: r >= 1 (default 8 for a 2-D build, else 32); 0 drops the dynamic projection: the window-only ablation
            (ibid.). Both 0 is refused. A dropped branch builds no parameters (no W^P with r = 0; its DualLN is
            built only where a global token still uses it).
        dims: None (1-D when hw is None, 2-D when hw is given), 1 or 2.
        global_token_rule: "vision" (default; the ImageNet code: global K/V get LN_L and patches see them as an
            extra key) or "lra" (the LRA code: raw global K/V prepended to the projections before LN_G).
        num_prefix_tokens: 0 or 1 global (class) tokens at the front of x.
        qk_scale: logit scale (default d^-1/2).
        rpe: ViL relative-position bias on 2-D window logits (default: on for a 2-D build with w >= 2 and the
            "vision" rule).
        attn_drop: dropout on the attention probabilities.
        input_size: (H, W) of the construction grid (makes the defaults 2-D).
        fused: SDPA tile paths (True) or the dense references (False); both compute the same function.
        group: segments per 1-D SDPA tile (default max(1, ceil(64 / w))).
        dual_ln: the two DualLN LayerNorms on the local and the projected keys/values (paper Eq. 6-7; default).
            False replaces both by the identity: the "without DualLN" ablation (Transformer-LS, arXiv 2107.02192,
            Sec. 3, DualLN, and Fig. 2 right).
        dp_conv: W^P is a weight-standardised depthwise 3x3 conv on the token map followed by the Linear (CvT*-LS,
            Transformer-LS App. E; needs hw); default False (the Linear alone).
        input_projection, output_projection: builders of a subclass's fused `qkv` and output projection, called as
            `build(dd)` (dd: the device/dtype keywords) in the official construction order (see `__init__`).
    """

    caps = _CAPS
    name = "long_short"

    # A host with convolutional q/k/v projections keeps keys and values at full resolution (stride 1 for q, k
    # and v, Transformer-LS App. E), unlike CvT's softmax baseline.
    conv_kv_stride = 1

    @classmethod
    def resolve(cls, options: dict) -> tuple[type, dict]:
        """`build_attention`'s factory: `causal=True` builds a `ChunkedLongShortAttention`, otherwise the
        registered class."""
        opts = dict(options)
        if opts.pop("causal", False):
            if opts.get("host_qkv"):
                raise UserError("long_short attention: the causal form projects its own q/k/v; host_qkv=True "
                                "applies to causal=False only")
            return ChunkedLongShortAttention, opts
        causal_only = sorted(k for k in ("chunk_size", "causal_form", "clamp_len") if opts.get(k) is not None)
        if causal_only:
            raise ValueError(f"long_short attention: {' / '.join(causal_only)} apply to causal=True only")
        return cls, opts

    @classmethod
    def stage_kwargs(cls, stage: dict) -> dict:
        """A host's stage facts: `conv_proj` (the host's q/k/v projections are convolutional, CvT: W^P gets the
        depthwise conv too, Transformer-LS App. E), `window_size`, and `grid` (a 2-D stage)."""
        kw = super().stage_kwargs(stage)
        if stage.get("conv_proj"):
            kw["dp_conv"] = True
        if stage.get("window_size") is not None:
            kw["window_size"] = stage["window_size"]
        if stage.get("grid") is not None:
            kw["dims"] = 2
        return kw

    def __init__(self, dim: int, num_heads: int = 8, window_size: int | None = None, rank: int | None = None,
                 dims: int | None = None, global_token_rule: str = "vision", num_prefix_tokens: int = 0,
                 qk_scale: float | None = None, rpe: bool | None = None, attn_drop: float = 0.0,
                 input_size: tuple[int, int] | None = None, fused: bool = True, group: int | None = None,
                 dual_ln: bool = True, dp_conv: bool = False, device=None, dtype=None, *,
                 input_projection: Callable[[dict], None] | None = None,
                 output_projection: Callable[[dict], None] | None = None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        who = "long_short attention"
        if dims not in (None, 1, 2):
            raise ValueError(f"{who}: dims must be None, 1 or 2, got {dims!r}")
        rule = global_token_rule
        if rule not in ("vision", "lra"):
            raise ValueError(f"{who}: global_token_rule must be 'vision' or 'lra', got {global_token_rule!r}")
        if num_prefix_tokens not in (0, 1):
            raise ValueError(f"{who}: num_prefix_tokens must be 0 or 1 (the official code supports one global "
                             f"token), got {num_prefix_tokens!r}")
        two_d = dims == 2 or (dims is None and input_size is not None)
        window_size = (7 if two_d else 8) if window_size is None else window_size
        rank = (8 if two_d else 32) if rank is None else rank
        _check_terms(who, window_size, rank)
        if rpe is None:
            rpe = two_d and rule == "vision" and window_size >= 2
        if rpe and window_size < 2:
            raise ValueError(f"{who}: rpe=True needs window_size >= 2 (the ViL table uses e = w // 2), "
                             f"got window_size={window_size}")
        if rpe and dims == 1:
            raise ValueError(f"{who}: rpe applies to the 2-D form only; got rpe=True with dims=1")
        if dp_conv and dims == 1:
            raise ValueError(f"{who}: dp_conv=True convolves the token map (2-D form); got dims=1")
        self.dim, self.num_heads = dim, num_heads
        self.head_dim = check_heads(dim, num_heads, who)
        self.scale = qk_scale or self.head_dim ** -0.5
        self.window_size, self.rank, self.dims = window_size, rank, dims
        self.global_token_rule = rule
        self.num_prefix_tokens = num_prefix_tokens
        self.fused, self.group = fused, group
        self.attn_drop = attn_drop
        self.rpe = bool(rpe)
        # the LayerNorms a dropped branch leaves unused (Tab. 1 ablations): LN_G also normalises the raw global
        # token under the "lra" rule, LN_L the global token's key/value under the "vision" rule
        global_ln = rank > 0 or (num_prefix_tokens > 0 and rule == "lra")
        local_ln = window_size > 0 or (num_prefix_tokens > 0 and rule == "vision")
        # Construction order = the RNG draw order of the official forms (ImageNet: qkv, proj, W^P; CvT*-LS: W^P
        # before the output projection), so a seeded build initialises as before.
        if input_projection is not None:
            input_projection(dd)
        if dp_conv:
            self.dp_conv = StdConv2d(dim, dim, 3, padding=1, groups=dim, bias=False, **dd)
            if rank:
                self.to_dynamic_projection = nn.Linear(dim, num_heads * rank, **dd)
        if output_projection is not None:
            output_projection(dd)
        if rank and not dp_conv:
            self.to_dynamic_projection = nn.Linear(dim, num_heads * rank, **dd)
        self.dual_ln_dp = _dual_ln(dim, dual_ln and global_ln, dd)
        self.dual_ln_full = _dual_ln(dim, dual_ln and local_ln, dd)
        if self.rpe:
            self.local_relative_position_bias_table = nn.Parameter(
                torch.zeros(rpe_table_size(window_size), num_heads, **dd))
            self.register_buffer("relative_position_index", rpe_index_tile(window_size, device=device),
                                 persistent=False)
            if not self.local_relative_position_bias_table.is_meta:
                self.reset_parameters()

    def reset_parameters(self) -> None:
        """Official init of the ViL window RPB table: trunc_normal(0.02)."""
        if self.rpe:
            trunc_normal_(self.local_relative_position_bias_table, std=0.02)

    def init_non_persistent_buffers(self) -> None:
        """Recompute `relative_position_index` (not saved; e.g. after `to_empty()` of a meta-device build)."""
        if self.rpe:
            idx = self.relative_position_index
            idx.copy_(rpe_index_tile(self.window_size, device=idx.device))

    def _dp_logits(self, x: torch.Tensor, hw) -> torch.Tensor:
        """W^P logits (B, n, h*r) of the n non-prefix tokens x (B, n, C)."""
        if not hasattr(self, "dp_conv"):
            return self.to_dynamic_projection(x)
        if hw is None:
            raise ValueError("long_short attention: dp_conv=True needs hw=(H, W)")
        B, n, C = x.shape
        grid = self.dp_conv(x.transpose(1, 2).reshape(B, C, *hw))
        return self.to_dynamic_projection(grid.flatten(2).transpose(1, 2))

    def _out(self, t: torch.Tensor) -> torch.Tensor:
        return t  # the host projects the output

    def _grid(self, x: torch.Tensor, hw, mask: torch.Tensor | None) -> tuple[int, int] | None:
        who = f"{type(self).__name__} ({self.name!r})"
        check_tokens(x, self.dim, who)
        check_mask(mask, x, who)
        if self.dims == 1 or (self.dims is None and hw is None):
            if x.shape[1] <= self.num_prefix_tokens:
                raise ValueError(f"{who}: x has N={x.shape[1]} tokens, needs more than num_prefix_tokens="
                                 f"{self.num_prefix_tokens}")
            return None
        return check_hw(x, hw, who, self.num_prefix_tokens)

    def _project(self, x: torch.Tensor):
        raise ValueError("long_short attention built with host_qkv=True has no q/k/v projections; call "
                         "forward_qkv(q, k, v, hw, x=x)")

    def _prepare(self, x: torch.Tensor, mask: torch.Tensor | None, grid, qkv=None):
        """q, k, v (B, h, n, d) of the n non-prefix tokens, global keys/values (B, h, G, d), validity, and the
        global token's (q, k, v) for the post-CLS rule (None without one). `qkv` = the host's (q, k, v) replaces the
        module's own projection; x is what W^P reads."""
        P, h = self.num_prefix_tokens, self.num_heads
        q, k, v = self._project(x) if qkv is None else qkv  # (B, N, C) each
        dp = self._dp_logits(x[:, P:], grid) if self.rank else None
        kl, vl = self.dual_ln_full(k), self.dual_ln_full(v)
        valid = None if mask is None else mask[:, P:]
        qh, kh, vh = split_heads(q[:, P:], h), split_heads(kl[:, P:], h), split_heads(vl[:, P:], h)
        if self.rank:
            proj = dynamic_projection(dp, h, self.rank, valid)  # (B, h, r, n)
            # (B, r, C) compressed keys/values, LN_G over the full width (all heads jointly)
            kbar, vbar = merge_heads(proj @ kh), merge_heads(proj @ vh.to(proj.dtype))
        else:  # window-only ablation: no projected keys
            kbar, vbar = k[:, :0], v[:, :0]
        cls = None
        if P and self.global_token_rule == "lra":
            # raw global K/V join the projections before LN_G; the post-CLS rule uses them raw
            kg = split_heads(self.dual_ln_dp(torch.cat([k[:, :P], kbar], dim=1)), h)
            vg = split_heads(self.dual_ln_dp(torch.cat([v[:, :P], vbar], dim=1)), h)
            cls = (split_heads(q[:, :P], h), split_heads(k[:, :P], h), split_heads(v[:, :P], h))
        else:
            if self.rank:
                kg, vg = split_heads(self.dual_ln_dp(kbar), h), split_heads(self.dual_ln_dp(vbar), h)
            else:
                kg, vg = split_heads(kbar, h), split_heads(vbar, h)
            if P:
                kc, vc = split_heads(kl[:, :P], h), split_heads(vl[:, :P], h)
                kg, vg = torch.cat([kg, kc], dim=2), torch.cat([vg, vc], dim=2)
                cls = (split_heads(q[:, :P], h), kc, vc)
        return qh, kh, vh, kg, vg, valid, cls

    def _tile_bias(self) -> torch.Tensor:
        """(h, w^2, (w + 2e)^2) RPE bias of one tile."""
        idx = self.relative_position_index
        return self.local_relative_position_bias_table[idx.reshape(-1)].reshape(*idx.shape, -1).permute(2, 0, 1)

    def _finish(self, out: torch.Tensor, valid, cls, ref: bool, project: bool = True) -> torch.Tensor:
        """Masked rows, the post-CLS rule, merged heads and (`project`) the module's output projection."""
        if valid is not None:
            # padded query rows get zero attention (official), so their output is the projection bias
            out = out.masked_fill(~valid[:, None, :, None], 0.0)
        if cls is not None:
            fn = post_cls_ref if ref else post_cls_sdpa
            out = torch.cat([fn(*cls, out, valid, self.scale), out], dim=2)
        out = merge_heads(out)
        return self._out(out) if project else out

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, N, C), hw (H, W) or None, mask (B, N) bool -> (B, N, C)."""
        return self._fast(x, hw, mask)

    def forward_qkv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: tuple[int, int] | None = None,
                    x: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                    ref: bool = False) -> torch.Tensor:
        """Attention on the host's projections q, k, v (B, N, C) (prefix tokens first); x (B, N, C) is the input
        they were projected from, which W^P reads (needed when rank > 0). Returns (B, N, C), heads merged, before
        any output projection (in `LongShortAttention` too: `proj` is its `forward`'s)."""
        if x is None:
            if self.rank:
                raise ValueError("long_short forward_qkv: x (the input q, k, v were projected from) is needed for "
                                 f"the dynamic projection (rank={self.rank})")
            x = q
        for name, t in (("k", k), ("v", v), ("x", x)):
            if t.shape != q.shape:
                raise ValueError(f"long_short forward_qkv: {name} has shape {tuple(t.shape)}, q has "
                                 f"{tuple(q.shape)}; they must match")
        qkv = (q, k, v)
        return self._dense_out(x, hw, mask, qkv) if ref or not self.fused else self._fast(x, hw, mask, qkv)

    def _fast(self, x: torch.Tensor, hw, mask: torch.Tensor | None, qkv=None) -> torch.Tensor:
        if not self.fused:
            return self._dense_out(x, hw, mask, qkv)
        with size_oblivious():  # a traced tile count is not specialised at 1 (see subquad._shapes)
            grid = self._grid(x, hw, mask)
            qh, kh, vh, kg, vg, valid, cls = self._prepare(x, mask, grid, qkv)
            p = self.attn_drop if self.training else 0.0
            if not self.window_size:
                out = long_short_global_sdpa(qh, kg, vg, self.scale, p)
            elif grid is None:
                out = long_short_1d_sdpa(qh, kh, vh, kg, vg, self.window_size, valid, self.scale, self.group, p)
            else:
                bias = self._tile_bias() if self.rpe else None
                out = long_short_2d_sdpa(qh, kh, vh, kg, vg, grid, self.window_size, valid, bias, self.scale, p)
            return self._finish(out, valid, cls, ref=False, project=qkv is None)

    def _dense(self, x: torch.Tensor, hw, mask: torch.Tensor | None, return_probs: bool = False, qkv=None):
        grid = self._grid(x, hw, mask)
        qh, kh, vh, kg, vg, valid, cls = self._prepare(x, mask, grid, qkv)
        n = qh.shape[2]
        bias = None
        if not self.window_size:
            local = None
        elif grid is None:
            local = window_mask_1d(n, self.window_size, x.device)
        else:
            local = window_mask_2d(grid, self.window_size, x.device)
            if self.rpe:
                idx = rpe_index_2d(grid, self.window_size, x.device)
                bias = self.local_relative_position_bias_table[idx].permute(2, 0, 1)  # (h, n, n)
        res = long_short_ref(qh, kh, vh, kg, vg, local, valid, bias, self.scale, return_probs)
        return res, valid, cls, grid

    def forward_ref(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
        """Dense reference of `forward`: explicit (N x (G + N)) masked softmax over the union of keys."""
        return self._dense_out(x, hw, mask)

    def _dense_out(self, x: torch.Tensor, hw, mask: torch.Tensor | None, qkv=None) -> torch.Tensor:
        out, valid, cls, _ = self._dense(x, hw, mask, qkv=qkv)
        return self._finish(out, valid, cls, ref=True, project=qkv is None)

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw: tuple[int, int] | None = None) -> torch.Tensor:
        """(B, N, C) -> (B, h, N, N): window probabilities plus the projected-key probabilities mapped back to
        tokens through P (the LN_G non-linearity is ignored, so this is the linearised token-mixing map)."""
        B, N, _ = x.shape
        P = self.num_prefix_tokens
        (out, (pg, pl)), _, cls, grid = self._dense(x, hw, None, return_probs=True)
        r = self.rank
        lra = P and self.global_token_rule == "lra"
        a = pl
        if r:
            proj = dynamic_projection(self._dp_logits(x[:, P:], grid), self.num_heads, r)  # (B, h, r, n)
            pg_proj = pg[..., P:P + r] if lra else pg[..., :r]
            a = a + pg_proj @ proj  # (B, h, n, n)
        if not P:
            return a
        p_cls = pg[..., :P] if lra else pg[..., r:]  # (B, h, n, 1)
        full = x.new_zeros(B, self.num_heads, N, N)
        full[:, :, P:, P:] = a
        full[:, :, P:, :P] = p_cls
        # global row: softmax over [own key ; token outputs] composed with the token rows
        qc, kc, _ = cls
        s = self.scale
        logits = torch.cat([(qc * s) @ kc.transpose(-2, -1), (qc * s) @ out.transpose(-2, -1)], dim=-1)
        pc = logits.softmax(dim=-1)  # (B, h, 1, 1 + n)
        full[:, :, :P] = pc[..., 1:] @ full[:, :, P:]
        full[:, :, :P, :P] += pc[..., :1]
        return full


@register_attention("long_short")
class LongShortAttention(LongShortCore):
    """Bidirectional long-short attention (1-D sequences and 2-D token maps) with its fused q/k/v projection `qkv`
    (the ImageNet code's names; the LRA code's separate `W_q`, `W_k`, `W_v` are concatenated into it by
    `remap_lra_official`, and subquad <= 0.1 checkpoints by `remap_legacy`).

    `build_attention("long_short", dim, heads, ...)` returns this class; `causal=True` returns a
    `ChunkedLongShortAttention` and `host_qkv=True` a `LongShortCore` (see `resolve`). Every other option, the
    shapes, the math and the references are `LongShortCore`'s.

    Args:
        qkv_bias: bias on the fused q/k/v projection (default True).
        causal: False (the causal form is a `ChunkedLongShortAttention`, built by `build_attention`).
        other: see `LongShortCore`.
    """

    def __init__(self, dim: int, num_heads: int = 8, window_size: int | None = None, rank: int | None = None,
                 causal: bool = False, dims: int | None = None, global_token_rule: str = "vision",
                 num_prefix_tokens: int = 0, qkv_bias: bool = True, qk_scale: float | None = None,
                 rpe: bool | None = None, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 input_size: tuple[int, int] | None = None, fused: bool = True, group: int | None = None,
                 dual_ln: bool = True, dp_conv: bool = False, device=None, dtype=None) -> None:
        if causal:
            raise ValueError("LongShortAttention is the bidirectional form; build the causal one with "
                             "build_attention('long_short', dim, num_heads, causal=True)")
        super().__init__(dim, num_heads, window_size=window_size, rank=rank, dims=dims,
                         global_token_rule=global_token_rule, num_prefix_tokens=num_prefix_tokens, qk_scale=qk_scale,
                         rpe=rpe, attn_drop=attn_drop, input_size=input_size, fused=fused, group=group,
                         dual_ln=dual_ln, dp_conv=dp_conv, device=device, dtype=dtype,
                         input_projection=lambda dd: self._build_qkv(bool(qkv_bias), dd),
                         output_projection=lambda dd: self._build_proj(float(proj_drop), dd))

    def _build_qkv(self, qkv_bias: bool, dd: dict) -> None:
        self.qkv = _fused_qkv(self.dim, qkv_bias, dd)

    def _build_proj(self, proj_drop: float, dd: dict) -> None:
        self.proj = nn.Linear(self.dim, self.dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)

    def _project(self, x: torch.Tensor):
        return self.qkv(x).chunk(3, dim=-1)

    def _out(self, t: torch.Tensor) -> torch.Tensor:
        return self.proj_drop(self.proj(t))


@dataclass
class LongShortCache:
    """Decoding state of one `ChunkedLongShortAttention` (create with `init_cache`; updated in place).

    Attributes:
        owner: signature of the module that made it (a cache from another module is refused).
        t: tokens consumed so far.
        kw, vw: (B, h, <= w - 1, d) LN_L'd window keys/values of the last tokens.
        kc, vc: (B, h, chunks * r, d) LN_G'd vectors of every completed chunk.
        pk, pv: (B, < l, C) the incomplete chunk's keys/values as compressed (projected, pre-LN_G).
        ps: (B, < l, h * r) its projection logits.
    """

    owner: tuple
    batch_size: int
    t: int = 0
    kw: torch.Tensor | None = None
    vw: torch.Tensor | None = None
    kc: torch.Tensor | None = None
    vc: torch.Tensor | None = None
    pk: torch.Tensor | None = None
    pv: torch.Tensor | None = None
    ps: torch.Tensor | None = None
    extra: dict = field(default_factory=dict)


class ChunkedLongShortAttention(TokenMixer):
    """Causal long-short attention (official autoregressive semantics), with a decoding cache.

    Query t attends, in ONE softmax, to exactly the w window keys t-w+1 ... t (LN_L) and to the r compressed
    vectors of every chunk of l tokens strictly before its own chunk (dynamic projection with the softmax over the
    chunk's l positions, then LN_G), with Transformer-XL relative terms on both branches. Any
    length T; positions before the start are absent (the official model fills them with a zero cache; [ours]).

    Decoding: `cache = m.init_cache(B)`, then `m(x_block, cache=cache)` for consecutive blocks of any size; the
    outputs equal the parallel `m(x_full)` (the cache keeps the same compressed vectors the parallel pass makes).

    Shapes: x (B, T, C) -> (B, T, C). mask: not supported (right padding never affects earlier outputs).

    Paper: Transformer-LS (arXiv 2107.02192), Sec. 3.3 and App. D (segment-wise compression of earlier segments,
    causal window).
    Official: NVIDIA/transformer-ls, `autoregressive/model_lib/layer.py` ChunkedLSAttention (keys `proj_query`,
    `proj_key`, `proj_val`, `proj_out`, `dconv_1`, `r_net`, `r_net_chunk`, `r_r_bias`, `r_w_bias`,
    `dual_ln_dproj`, `dual_ln_win`).
    Paper vs code: the code's per-token band of exactly w keys and its compression of projected keys before LN_L
    are the default (`causal_form="official"`); `causal_form="paper"` compresses LN_L(K), LN_L(V) as Eq. 3 reads.
    The official model compresses a carried-over Transformer-XL hidden-state cache differently from the current
    block (docs/deviations.md); here every chunk is compressed from projected keys, which is what makes parallel and
    cached decoding equal.
    Symbols: w window_size (official `window_len`), l chunk_size (official `chunk_size`), r rank (official
    `chunk_rank`), h num_heads, d = C / h.

    Args:
        dim, num_heads: C and h.
        window_size: w >= 1 (default 512, official); 0 = no window keys, the "dynamic projection only" ablation
            (Transformer-LS, arXiv 2107.02192, Tab. 1): a query sees only the chunks before its own, so the first
            chunk's outputs are the output-projection bias. Builds no `r_net`, `r_r_bias`, `r_w_bias`,
            `dual_ln_win`, and needs `causal_form="official"` (the paper form compresses LN_L(K)).
        rank: r >= 1 (default 1, official); 0 = no chunk vectors, the window-only ablation (ibid.; builds no
            `dconv_1`, `r_net_chunk`, `dual_ln_dproj`). Both 0 is refused.
        chunk_size: l >= 1 (default 16, official).
        causal_form: "official" or "paper" (see above).
        qkv_bias: bias on the four projections (official `use_bias`, default False).
        clamp_len: clamp of the window/chunk relative positions (official `clamp_len` / `cpos_clamp_len`; -1 off).
        attn_drop, proj_drop: dropout on the attention probabilities / after `proj_out`.
        fused: SDPA tile path (True) or the dense reference (False).
        dual_ln: the two DualLN LayerNorms `dual_ln_win` / `dual_ln_dproj` (default); False replaces both by the
            identity, the "without DualLN" ablation (Transformer-LS, arXiv 2107.02192, Sec. 3 and Fig. 2 right).
        input_size, dims, ...: accepted for interface uniformity where meaningful; 2-D options refused.
    """

    # Transformer-XL relative terms on both branches: a host adds no absolute positions.
    caps = dataclasses.replace(_CAPS, relative_positions=True)
    name = "long_short"

    def __init__(self, dim: int, num_heads: int = 8, window_size: int | None = None, rank: int | None = None,
                 dims: int | None = None, global_token_rule: str | None = None,
                 num_prefix_tokens: int = 0, qkv_bias: bool = False, qk_scale: float | None = None,
                 rpe: bool | None = None, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 input_size: tuple[int, int] | None = None, fused: bool = True, group: int | None = None,
                 chunk_size: int | None = None, causal_form: str | None = None, clamp_len: int = -1,
                 dual_ln: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        who = "long_short attention (causal)"
        if dims == 2 or rpe or num_prefix_tokens:
            raise ValueError(f"{who}: the causal form is 1-D without global tokens; got dims={dims!r}, rpe={rpe!r}, "
                             f"num_prefix_tokens={num_prefix_tokens!r}")
        window_size = 512 if window_size is None else window_size
        rank = 1 if rank is None else rank
        chunk_size = 16 if chunk_size is None else chunk_size
        _check_terms(who, window_size, rank)
        _check_positive(who, chunk_size=chunk_size)
        causal_form = causal_form or "official"
        if causal_form not in ("official", "paper"):
            raise ValueError(f"{who}: causal_form must be 'official' or 'paper', got {causal_form!r}")
        if causal_form == "paper" and window_size == 0:
            raise UserError(f"{who}: causal_form='paper' compresses LN_L(K) of the window branch, which "
                            "window_size=0 removes; use causal_form='official'")
        self.dim, self.num_heads = dim, num_heads
        self.head_dim = check_heads(dim, num_heads, who)
        self.scale = qk_scale or self.head_dim ** -0.5
        self.window_size, self.rank, self.chunk_size = window_size, rank, chunk_size
        self.causal_form, self.clamp_len, self.fused = causal_form, clamp_len, fused
        self.causal = True
        self.attn_drop = attn_drop
        self.proj_query = nn.Linear(dim, dim, bias=qkv_bias, **dd)
        self.proj_key = nn.Linear(dim, dim, bias=qkv_bias, **dd)
        self.proj_val = nn.Linear(dim, dim, bias=qkv_bias, **dd)
        self.proj_out = nn.Linear(dim, dim, bias=qkv_bias, **dd)
        if rank:
            self.dconv_1 = nn.Linear(dim, num_heads * rank, **dd)
        if window_size:
            self.r_net = nn.Linear(dim, dim, bias=False, **dd)
        if rank:
            self.r_net_chunk = nn.Linear(dim, dim, **dd)
        if window_size:
            self.r_r_bias = nn.Parameter(torch.zeros(1, num_heads, 1, self.head_dim, **dd))
            self.r_w_bias = nn.Parameter(torch.zeros(1, num_heads, 1, 1, self.head_dim, **dd))
        if rank:
            self.dual_ln_dproj = _dual_ln(dim, dual_ln, dd)
        if window_size:
            self.dual_ln_win = _dual_ln(dim, dual_ln, dd)
        self.dropout = nn.Dropout(proj_drop)
        if window_size and not self.r_r_bias.is_meta:
            # the official model re-initialises these with normal(0, 0.02); zeros would starve their gradients
            nn.init.normal_(self.r_r_bias, std=0.02)
            nn.init.normal_(self.r_w_bias, std=0.02)

    def _signature(self) -> tuple:
        return (id(self), self.dim, self.num_heads, self.window_size, self.chunk_size, self.rank)

    def init_cache(self, batch_size: int) -> LongShortCache:
        """An empty decoding cache for `batch_size` sequences."""
        return LongShortCache(owner=self._signature(), batch_size=batch_size)

    def _check_cache(self, cache: LongShortCache, x: torch.Tensor) -> None:
        if not isinstance(cache, LongShortCache):
            raise ValueError(f"long_short (causal): cache must be a LongShortCache from init_cache(), got "
                             f"{type(cache).__name__}")
        if cache.owner != self._signature():
            raise ValueError(f"long_short (causal): cache belongs to another module (made for dim, heads, w, l, r = "
                             f"{cache.owner[1:]}; this module has {self._signature()[1:]}); use this module's "
                             "init_cache()")
        if cache.batch_size != x.shape[0]:
            raise ValueError(f"long_short (causal): cache holds batch {cache.batch_size}, x has batch {x.shape[0]}")

    def _rel_tables(self, n_chunk_pos: int, ref: torch.Tensor):
        """R_win (h, w, d) for delta = 0 ... w-1 and R_chunk (h, P, d) for rho = 0 ... P-1 (an empty table for a
        dropped branch)."""
        h, d = self.num_heads, self.head_dim
        pos_w = torch.arange(self.window_size, device=ref.device, dtype=ref.dtype)
        pos_c = torch.arange(max(n_chunk_pos, 1), device=ref.device, dtype=ref.dtype)
        if self.clamp_len > 0:
            pos_w, pos_c = pos_w.clamp(max=self.clamp_len), pos_c.clamp(max=self.clamp_len)
        if self.window_size:
            r_win = self.r_net(xl_sinusoid(pos_w, self.dim)).reshape(-1, h, d).transpose(0, 1)
        else:
            r_win = ref.new_zeros(h, 0, d)
        if self.rank:
            r_chunk = self.r_net_chunk(xl_sinusoid(pos_c, self.dim)).reshape(-1, h, d).transpose(0, 1)
        else:
            r_chunk = ref.new_zeros(h, 0, d)
        return r_win, r_chunk

    def _xl_biases(self, ref: torch.Tensor):
        """(u, v) = (r_w_bias, r_r_bias) as (h, d); zeros without the window branch (they act on it only)."""
        h, d = self.num_heads, self.head_dim
        if not self.window_size:
            return ref.new_zeros(h, d), ref.new_zeros(h, d)
        return self.r_w_bias.reshape(h, d), self.r_r_bias.reshape(h, d)

    def _scores(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, h*r) chunk-projection logits (B, T, 0 without the chunk branch)."""
        return self.dconv_1(x) if self.rank else x[..., :0]

    def _win_ln(self, t: torch.Tensor) -> torch.Tensor:
        """LN_L of the window keys/values; no tokens without the window branch."""
        return self.dual_ln_win(t) if self.window_size else t[:, :0]

    def _compress(self, k: torch.Tensor, v: torch.Tensor, s: torch.Tensor):
        """Complete chunks of (B, L, C) keys/values with logits s (B, L, h*r) -> LN_G'd (B, h, L/l * r, d)."""
        B, L, C = k.shape
        l, r, h, d = self.chunk_size, self.rank, self.num_heads, self.head_dim
        n = L // l
        if n == 0 or r == 0:
            return k.new_zeros(B, h, 0, d), v.new_zeros(B, h, 0, d)
        # (B, h, n, r, l): softmax over the l positions of each chunk, in float32 (official)
        sc = s[:, :n * l].reshape(B, n, l, h, r).permute(0, 3, 1, 4, 2)
        sc = sc.softmax(dim=-1, dtype=torch.promote_types(s.dtype, torch.float32)).to(k.dtype)

        def comp(t: torch.Tensor) -> torch.Tensor:
            t = t[:, :n * l].reshape(B, n, l, h, d).permute(0, 3, 1, 2, 4)  # (B, h, n, l, d)
            t = (sc @ t).reshape(B, h, n * r, d)
            return split_heads(self.dual_ln_dproj(merge_heads(t)), h)

        return comp(k), comp(v)

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None, mask: torch.Tensor | None = None,
                cache: LongShortCache | None = None, memory: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C).

        Args:
            cache: x continues the cached sequence; the cache is updated in place.
            memory: (B, L, C) official Transformer-XL memory (the normalised inputs of the previous segment,
                L % l == 0, L >= w - 1): its chunks are compressed from hidden states per head slice and then
                projected, exactly as the official `ChunkedLSAttention(h, h_cache)` does (parity path; exclusive
                with `cache`).
        """
        return self._run(x, mask, cache, ref=not self.fused, memory=memory)

    def forward_ref(self, x: torch.Tensor, hw: tuple[int, int] | None = None, mask: torch.Tensor | None = None,
                    cache: LongShortCache | None = None, memory: torch.Tensor | None = None) -> torch.Tensor:
        """Dense reference of `forward` (explicit masked softmax over [chunk vectors ; window keys])."""
        return self._run(x, mask, cache, ref=True, memory=memory)

    def _memory(self, memory: torch.Tensor):
        """Official cache branch: window keys of the last w memory tokens, chunk vectors compressed from hidden
        states per head slice, then projected and LN_G'd (docs/deviations.md)."""
        who = "long_short attention (causal)"
        check_tokens(memory, self.dim, who + " memory")
        B, L, C = memory.shape
        l, r, h, d = self.chunk_size, self.rank, self.num_heads, self.head_dim
        if L % l or L < self.window_size - 1:
            raise ValueError(f"{who}: memory length L={L} must be a multiple of chunk_size={l} and >= "
                             f"window_size - 1 = {self.window_size - 1}")
        n = L // l
        if r:
            sc = self.dconv_1(memory).reshape(B, n, l, h, r).permute(0, 3, 1, 4, 2)
            sc = sc.softmax(dim=-1, dtype=torch.promote_types(memory.dtype, torch.float32)).to(memory.dtype)
            hid = (sc @ memory.reshape(B, n, l, h, d).permute(0, 3, 1, 2, 4)).reshape(B, h, n * r, d)
            hid = merge_heads(hid)  # (B, n r, C), heads mixed by the projections below (official)
            kc = split_heads(self.dual_ln_dproj(self.proj_key(hid)), h)
            vc = split_heads(self.dual_ln_dproj(self.proj_val(hid)), h)
        else:
            kc = vc = memory.new_zeros(B, h, 0, d)
        tail = memory[:, L - (self.window_size - 1):] if self.window_size > 1 else memory[:, :0]
        kw = split_heads(self._win_ln(self.proj_key(tail)), h)
        vw = split_heads(self._win_ln(self.proj_val(tail)), h)
        return LongShortCache(owner=self._signature(), batch_size=B, t=L, kw=kw, vw=vw, kc=kc, vc=vc,
                              pk=memory[:, :0], pv=memory[:, :0], ps=memory.new_zeros(B, 0, h * r))

    def _run(self, x: torch.Tensor, mask: torch.Tensor | None, cache: LongShortCache | None,
             ref: bool, memory: torch.Tensor | None = None) -> torch.Tensor:
        who = "long_short attention (causal)"
        check_tokens(x, self.dim, who)
        if mask is not None:
            raise ValueError(f"{who}: masks are not supported by the causal form (pad on the right instead: "
                             "later tokens never change earlier outputs); pass mask=None")
        if cache is not None:
            self._check_cache(cache, x)
        if memory is not None:
            if cache is not None:
                raise ValueError(f"{who}: pass either cache= or memory=, not both")
            cache = self._memory(memory)
            if cache.batch_size != x.shape[0]:
                raise ValueError(f"{who}: memory has batch {cache.batch_size}, x has batch {x.shape[0]}")
        B, M, C = x.shape
        h, w, l, r = self.num_heads, self.window_size, self.chunk_size, self.rank
        t0 = cache.t if cache is not None else 0
        q = split_heads(self.proj_query(x), h)
        k, v, s = self.proj_key(x), self.proj_val(x), self._scores(x)
        klw, vlw = self._win_ln(k), self._win_ln(v)
        # what the chunk branch compresses: projected K/V (official) or LN_L(K/V) (paper Eq. 3)
        ck, cv = (k, v) if self.causal_form == "official" else (klw, vlw)
        kw, vw = split_heads(klw, h), split_heads(vlw, h)
        if cache is not None and cache.t:
            kw, vw = torch.cat([cache.kw, kw], dim=2), torch.cat([cache.vw, vw], dim=2)
            ck, cv, s = (torch.cat([cache.pk, ck], dim=1), torch.cat([cache.pv, cv], dim=1),
                         torch.cat([cache.ps, s], dim=1))
        kc, vc = self._compress(ck, cv, s)
        if cache is not None and cache.t:
            kc, vc = torch.cat([cache.kc, kc], dim=2), torch.cat([cache.vc, vc], dim=2)
        n_pos = ((t0 + M - 1) // l) * r
        r_win, r_chunk = self._rel_tables(n_pos, x)
        u, vb = self._xl_biases(x)
        p = self.attn_drop if self.training else 0.0
        if ref or (M <= w and not p):
            # a block no longer than one tile (incremental decoding): the dense form costs M (w + chunks) scores,
            # the tile path would pad M up to w queries
            out = long_short_causal_ref(q, kw, vw, kc, vc, r_win, r_chunk, u, vb, t0, w, l, r, self.scale)
        else:
            out = long_short_causal_sdpa(q, kw, vw, kc, vc, r_win, r_chunk, u, vb, t0, w, l, r, self.scale, p)
        if cache is not None:
            keep = max(w - 1, 0)
            cache.kw, cache.vw = kw[:, :, kw.shape[2] - min(keep, kw.shape[2]):], \
                vw[:, :, vw.shape[2] - min(keep, vw.shape[2]):]
            done = (ck.shape[1] // l) * l
            cache.pk, cache.pv, cache.ps = ck[:, done:], cv[:, done:], s[:, done:]
            cache.kc, cache.vc = kc, vc
            cache.t = t0 + M
        return self.dropout(self.proj_out(merge_heads(out)))

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw: tuple[int, int] | None = None) -> torch.Tensor:
        """(B, T, C) -> (B, h, T, T): window probabilities plus chunk-vector probabilities mapped back to tokens
        through the chunk projections (LN_G ignored: the linearised map). Lower triangular."""
        B, T, C = x.shape
        h, w, l, r = self.num_heads, self.window_size, self.chunk_size, self.rank
        q = split_heads(self.proj_query(x), h)
        k, s = self.proj_key(x), self._scores(x)
        kl = self._win_ln(k)
        kc, _ = self._compress(k if self.causal_form == "official" else kl, k, s)
        n = kc.shape[2] // r if r else 0
        r_win, r_chunk = self._rel_tables(((T - 1) // l) * r, x)
        u, vb = self._xl_biases(x)
        eye_c = torch.eye(kc.shape[2], dtype=x.dtype, device=x.device).expand(B, h, -1, -1)
        kw = split_heads(kl, h)
        S = kw.shape[2]  # T, or 0 without the window branch
        eye_w = torch.eye(T, dtype=x.dtype, device=x.device)[T - S:].expand(B, h, -1, -1)
        # probabilities: feed identity "values" through the reference
        pc = long_short_causal_ref(q, kw, torch.zeros(B, h, S, kc.shape[2], dtype=x.dtype, device=x.device), kc,
                                   eye_c, r_win, r_chunk, u, vb, 0, w, l, r, self.scale)
        pw = long_short_causal_ref(q, kw, eye_w, kc, torch.zeros(B, h, kc.shape[2], T, dtype=x.dtype,
                                                                 device=x.device),
                                   r_win, r_chunk, u, vb, 0, w, l, r, self.scale)
        sc = s[:, :n * l].reshape(B, n, l, h, r).permute(0, 3, 1, 4, 2).softmax(dim=-1)  # (B, h, n, r, l)
        proj = x.new_zeros(B, h, n * r, T)
        for c in range(n):
            proj[:, :, c * r:(c + 1) * r, c * l:(c + 1) * l] = sc[:, :, c]
        return pw + pc @ proj


_LRA_RENAMES = (("W_o.", "proj."), ("dual_ln_l.", "dual_ln_full."), ("dual_ln_s.", "dual_ln_dp."),
                ("dconv_fc.", "to_dynamic_projection."))


def remap_lra_official(state_dict: dict[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    """Keys of the LRA code's AttentionLS (NVIDIA/transformer-ls `lra/attention_transformer_ls.py`: `W_q`, `W_k`,
    `W_v`, `W_o`, `dual_ln_l`, `dual_ln_s`, `dconv_fc`) under `prefix` -> `LongShortAttention`'s: `qkv` = the
    row-wise concatenation [W_q; W_k; W_v] (weights and biases), `proj`, `dual_ln_full`, `dual_ln_dp`,
    `to_dynamic_projection`. Other keys pass unchanged; a state dict without `{prefix}W_q.weight` is returned as is.
    subquad <= 0.1 saved its LRA-form modules under these same names."""
    if prefix + "W_q.weight" not in state_dict:
        return state_dict
    sd = dict(state_dict)
    for t in ("weight", "bias"):
        parts = [sd.pop(f"{prefix}W_{c}.{t}", None) for c in "qkv"]
        if all(p is not None for p in parts):
            sd[f"{prefix}qkv.{t}"] = torch.cat(parts, dim=0)
        elif any(p is not None for p in parts):
            raise ValueError(f"LRA long-short checkpoint: {prefix}W_q/W_k/W_v.{t} must all be present or all absent")
    out = {}
    for k, v in sd.items():
        if k.startswith(prefix):
            rest = k[len(prefix):]
            for a, b in _LRA_RENAMES:
                if rest.startswith(a):
                    k = prefix + b + rest[len(a):]
                    break
        out[k] = v
    return out


def remap_legacy(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """A state dict saved by subquad <= 0.1 (before one name set per mechanism) -> the current names, for every
    bidirectional long-short module in `model`: the LRA-form keys (`W_q`, ...) as `remap_lra_official` maps them.
    Detected by key names (no version field needed); current state dicts pass unchanged."""
    for name, m in model.named_modules():
        if isinstance(m, LongShortAttention):
            state_dict = remap_lra_official(state_dict, f"{name}." if name else "")
    return state_dict
