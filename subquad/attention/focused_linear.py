"""FLatten focused linear attention (`"focused_linear"`): `FocusedLinearAttention` (fused `qkv` projection, optional PVT
key/value reduction, `proj`) and `FocusedLinearCore` (no projections: hosts that project q, k, v call `forward_qkv`).
One set of parameter names: the PVT checkpoints' `q` + `kv` are concatenated into `qkv` by `remap_q_kv`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from torch import nn

from .._shapes import as_hw, check_heads, check_sequence_hw, known_equal, map_to_tokens, tokens_to_map, tracing
from ..errors import UserError
from ..layers.precision import fp32_island
from .base import AttentionCaps, TokenMixer
from .functional.focused import (
    SR_MODES,
    focused_attention_matrix,
    focused_attention_matrix_1d,
    focused_linear_attention_1d,
    focused_linear_attention_1d_ref,
    focused_linear_attention_kv,
    focused_linear_attention_ref,
    resize_pe,
)
from .functional.softmax import adaptive_pool_2d
from .registry import register_attention, register_attention_form

__all__ = ["FocusedLinearAttention", "FocusedLinearAttention1d", "FocusedLinearCore", "KeyReduction", "ResizedPECache",
           "remap_q_kv", "remap_legacy"]

DWC_INITS = ("default", "pvt_v2")


@dataclasses.dataclass(frozen=True)
class KeyReduction:
    """PVT's reduction of the key/value grid before the linear attention (`FocusedLinearAttention`; the core
    without projections keeps the full grid).

    Args:
        sr_ratio: PVT spatial reduction (a strided sr_ratio x sr_ratio conv; 1: none).
        linear_sr: PVTv2's pooled reduction to a 7x7 key grid (with sr_ratio 1).
        sr_mode: 'bilinear' (2-D resize of the V map for the DWC) or 'flat1d' (official 1-D interpolation).
    """

    sr_ratio: int = 1
    linear_sr: bool = False
    sr_mode: str = "bilinear"

    def __post_init__(self) -> None:
        who = "focused_linear attention"
        if self.sr_mode not in SR_MODES:
            raise ValueError(f"{who}: sr_mode={self.sr_mode!r} is not one of {SR_MODES}")
        if int(self.sr_ratio) != self.sr_ratio or self.sr_ratio < 1:
            raise ValueError(f"{who}: sr_ratio={self.sr_ratio} must be a positive int")
        if self.sr_ratio > 1 and self.linear_sr:
            raise ValueError(f"{who}: use either sr_ratio > 1 or linear_sr=True (PVTv2 uses sr_ratio=1 with linear)")
        object.__setattr__(self, "sr_ratio", int(self.sr_ratio))
        object.__setattr__(self, "linear_sr", bool(self.linear_sr))


class ResizedPECache:
    """Mixin of a mechanism whose learned `positional_encoding` (1, P + h_pe * w_pe, C) on the construction grid
    `pe_hw` is resized bicubically (`resize_pe`) to the run-time grid: the resized table is cached in eval mode
    without autograd, outside tracing (at 1024 px the bicubic resize of FLatten-PVTv2's stage-1 PE is ~6 % of a
    forward; Pola-PVT resizes its PE in every block at any size but 224 px). The key holds the parameter's identity,
    version counter, device and dtype, so loading weights, editing the PE in place or moving the module invalidates
    it; `train()` drops it. Not state: never saved."""

    _pe_cache: tuple | None = None

    def _resized_pe(self, hw: tuple[int, int]) -> torch.Tensor:
        pe = self.positional_encoding
        if known_equal(hw, self.pe_hw) or self.training or torch.is_grad_enabled() or tracing():
            return resize_pe(pe, self.pe_hw, hw, self.num_prefix_tokens)
        key = (tuple(hw), id(pe), pe._version, pe.device, pe.dtype)
        if self._pe_cache is None or self._pe_cache[0] != key:
            self._pe_cache = (key, resize_pe(pe, self.pe_hw, hw, self.num_prefix_tokens))
        return self._pe_cache[1]

    def train(self, mode: bool = True):
        self._pe_cache = None
        return super().train(mode)


@register_attention_form("focused_linear", "host_qkv")
class FocusedLinearCore(ResizedPECache, TokenMixer):
    """FLatten focused linear attention on queries, keys and values that the host projects (`forward_qkv`): the form
    of CSwin's 'L' blocks, whose block owns the q/k/v and output projections. It owns the focusing `scale`, the
    `positional_encoding` on K, the rank-restoring `dwc` and, with `lepe=True`, CSwin's LePE `get_v`; no projection
    layers. `build_attention("focused_linear", ..., host_qkv=True)` builds it (the mechanism's "host_qkv" form);
    `FocusedLinearAttention` adds the projections.

    Shapes: `forward_qkv(q, k, v, hw)`: q, k, v (B, N, C), N = num_prefix_tokens + H * W -> (B, N, C), no output
    projection.
    Paper: FLatten (arXiv 2308.00442), Eq. 5-6 (focused function, p = 3) and Eq. 12 (O = phi(Q) phi(K)^T V + DWC(V)).
    Official: LeapLabTHU/FLatten-Transformer `models/flatten_{swin,pvt,pvt_v2,cswin}.py` `FocusedLinearAttention`.
        Paper: no scale, no eps, no PE, no normaliser / Official code: softplus(scale) per channel, +1e-6, norms over
        all C, PE on K, mean/sqrt(n) normaliser, DWC over d channels shared by heads (k = 5) / subquad: the code
        (docs/deviations.md), plus the PE resized bicubically at other grids (docs/deviations.md), a 2-D V resize for
        sr > 1
        (docs/deviations.md; official 1-D mode as `sr_mode='flat1d'`), the DeiT class-token rule (docs/deviations.md)
        and a float32 core
        under autocast (docs/deviations.md).
    Symbols: p = focusing_factor (paper p), k = kernel_size, s = softplus(`scale`), h heads, d = C / h, sr = sr_ratio.

    Args:
        dim: channels C.
        num_heads: heads h.
        input_size: (H, W) query grid at construction; sizes `positional_encoding` (key grid + prefix tokens).
        focusing_factor: p.
        kernel_size: DWC kernel k (odd); 0 builds no DWC: FLatten Tab. 4's "+ f_p" rung (focused function without
            the rank-restoring DWC, arXiv 2308.00442 Sec. 5.3).
        normaliser: 'mean' (current official) or 'sum' (original release).
        num_prefix_tokens: P leading class tokens; they take part in the linear attention as queries and keys, own
            PE slots that are never resized, and get no DWC term.
        lepe: add CSwin's LePE `get_v` (depthwise 3x3 on the v map) to the output.
        dwc_init: 'default' (PyTorch init; Swin, PVT, CSwin) or 'pvt_v2' (normal(0, sqrt(2 / fan_out))).
        fused: K^T V fast path (True) or the dense reference (False); both compute the same function.
        reduction: the key-grid reduction (`KeyReduction`; None: the full grid).
        input_projections, output_projection: builders of a subclass's projection modules, called as
            `build(dd)` (dd: the device/dtype keywords) before the scale and after the LePE, the official order.
    """

    caps = AttentionCaps(bidirectional=True, causal=False, needs_hw=True, supports_mask=False, complexity="O(N)",
                         sequence=False, notes="FLatten; DWC needs the grid; PE resized bicubically at other grids")
    name = "focused_linear"

    @classmethod
    def stage_kwargs(cls, stage: dict) -> dict:
        """The spatial reduction of linear-attention stages (`la_sr_ratio`, 1 in every released FLatten model)."""
        kw = super().stage_kwargs(stage)
        if stage.get("la_sr_ratio", 1) != 1:
            kw["sr_ratio"] = stage["la_sr_ratio"]
        return kw

    def __init__(self, dim: int, num_heads: int = 8, input_size: tuple[int, int] | int | None = None,
                 focusing_factor: float = 3, kernel_size: int = 5, normaliser: str = "mean",
                 num_prefix_tokens: int = 0, lepe: bool = False, dwc_init: str = "default", fused: bool = True,
                 device=None, dtype=None, *, reduction: KeyReduction | None = None,
                 input_projections: Callable[[dict], None] | None = None,
                 output_projection: Callable[[dict], None] | None = None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        who = "focused_linear attention"
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = check_heads(dim, num_heads, who)
        if input_size is None:
            raise ValueError(f"{who} needs input_size=(H, W) to size positional_encoding")
        self.input_size = as_hw(input_size, "input_size")
        for name, val, allowed in (("normaliser", normaliser, ("mean", "sum")), ("dwc_init", dwc_init, DWC_INITS)):
            if val not in allowed:
                raise ValueError(f"{who}: {name}={val!r} is not one of {allowed}")
        if not isinstance(kernel_size, int) or isinstance(kernel_size, bool) or kernel_size < 0 or \
                (kernel_size and kernel_size % 2 == 0):
            raise UserError(f"{who}: kernel_size={kernel_size!r} must be a positive odd int, or 0 for no DWC")
        if focusing_factor <= 0:
            raise ValueError(f"{who}: focusing_factor={focusing_factor} must be > 0")
        if num_prefix_tokens < 0:
            raise ValueError(f"{who}: num_prefix_tokens={num_prefix_tokens} must be >= 0")
        self.focusing_factor = focusing_factor
        self.normaliser = normaliser
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.dwc_init = dwc_init
        self.fused = fused
        reduction = reduction or KeyReduction()
        self.sr_ratio, self.linear_sr, self.sr_mode = reduction.sr_ratio, reduction.linear_sr, reduction.sr_mode
        # Construction order = the official modules' (input projections, scale, PE, dwc, LePE, output projection):
        # a seeded build draws its initial values as before. The projection builders (FocusedLinearAttention's) run
        # once the settings above are stored; each gets the device/dtype keywords.
        if input_projections is not None:
            input_projections(dd)
        self.pe_hw = self._kv_hw(self.input_size)
        n_pe = self.num_prefix_tokens + self.pe_hw[0] * self.pe_hw[1]
        self.scale = nn.Parameter(torch.empty(1, 1, dim, **dd))
        self.positional_encoding = nn.Parameter(torch.empty(1, n_pe, dim, **dd))
        self._pe_cache = None  # eval-only cache of the resized PE (`ResizedPECache`)
        d = self.head_dim
        self.dwc = nn.Conv2d(d, d, kernel_size, padding=kernel_size // 2, groups=d, **dd) if kernel_size else None
        self.get_v = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, **dd) if lepe else None
        if output_projection is not None:
            output_projection(dd)
        if not self.scale.is_meta:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Official init: zero `scale` and `positional_encoding`; Linear trunc_normal(0.02), zero bias; `dwc` keeps
        PyTorch's default, or normal(0, sqrt(2 / fan_out)) with zero bias for dwc_init='pvt_v2'."""
        nn.init.zeros_(self.scale)
        nn.init.zeros_(self.positional_encoding)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        if self.dwc_init == "pvt_v2" and self.dwc is not None:
            fan_out = self.dwc.kernel_size[0] * self.dwc.kernel_size[1] * self.dwc.out_channels // self.dwc.groups
            nn.init.normal_(self.dwc.weight, 0.0, math.sqrt(2.0 / fan_out))
            nn.init.zeros_(self.dwc.bias)

    def _kv_hw(self, hw: tuple[int, int]) -> tuple[int, int]:
        """Key grid for query grid hw."""
        if self.linear_sr:
            return (7, 7)
        s = self.sr_ratio
        H, W = hw
        if H < s or W < s:
            raise ValueError(f"focused_linear attention: grid {H}x{W} is smaller than sr_ratio={s}")
        return (H // s, W // s)

    def _pe(self, kv_hw: tuple[int, int]) -> torch.Tensor:
        """The PE on the key grid (`ResizedPECache`)."""
        return self._resized_pe(kv_hw)

    def _core(self, q, k, v, hw, kv_hw, fused: bool) -> torch.Tensor:
        k = k + self._pe(kv_hw)
        fn = focused_linear_attention_kv if fused else focused_linear_attention_ref
        lw = None if self.get_v is None else self.get_v.weight
        lb = None if self.get_v is None else self.get_v.bias
        dw = None if self.dwc is None else self.dwc.weight
        db = None if self.dwc is None else self.dwc.bias
        return fp32_island(fn, q, k, v, self.scale, dw, db, lw, lb, hw=tuple(hw),
                           kv_hw=kv_hw, num_heads=self.num_heads, p=self.focusing_factor,
                           normaliser=self.normaliser, prefix=self.num_prefix_tokens, sr_mode=self.sr_mode)

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        return self._forward(x, hw, mask, self.fused)

    def forward_ref(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
        """Dense reference of `forward` (explicit kernel, V-resize, DWC and LePE matrices)."""
        return self._forward(x, hw, mask, False)

    def _forward(self, x, hw, mask, fused: bool) -> torch.Tensor:
        raise ValueError("focused_linear attention built with host_qkv=True has no projections; call "
                         "forward_qkv(q, k, v, hw)")

    def forward_qkv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: tuple[int, int],
                    x: torch.Tensor | None = None, fused: bool | None = None) -> torch.Tensor:
        """Attention on projected q, k, v (B, N, C) (CSwin 'L' blocks); returns (B, N, C), no projection (in
        `FocusedLinearAttention` too: its own projections are bypassed). x (the host's input) is not read."""
        hw = self._check_input(q, hw)
        if k.shape != q.shape or v.shape != q.shape:
            raise ValueError(f"focused_linear forward_qkv: q {tuple(q.shape)}, k {tuple(k.shape)} and "
                             f"v {tuple(v.shape)} must have the same shape")
        return self._core(q, k, v, hw, tuple(hw), self.fused if fused is None else fused)

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                         channel: int | None = None) -> torch.Tensor:
        """(B, N, C) -> (B, h, N, n) equivalent map including the DWC (and LePE) as explicit matrices (Eq. 11).

        Exact for head channel `channel`: out_head[:, c] = M @ v_head[:, c] + biases, before `proj`. With
        channel=None the conv part is the mean over the d channel kernels (see `focused_attention_matrix`).
        n = N unless sr_ratio > 1 / linear_sr (then n = P + reduced key grid, V resize included).
        Without projections (`FocusedLinearCore`), x is taken as q = k = v.
        """
        hw = self._check_input(x, hw)
        q, k, kv_hw = self._qk_for_matrix(x, hw)
        k = k + self._pe(kv_hw)
        lw = None if self.get_v is None else self.get_v.weight
        dw = None if self.dwc is None else self.dwc.weight
        return focused_attention_matrix(q, k, self.scale, dw, lw, hw=tuple(hw), kv_hw=kv_hw,
                                        num_heads=self.num_heads, p=self.focusing_factor, normaliser=self.normaliser,
                                        prefix=self.num_prefix_tokens, sr_mode=self.sr_mode, channel=channel)

    def _qk_for_matrix(self, x: torch.Tensor, hw):
        return x, x, tuple(hw)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, p={self.focusing_factor}, "
                f"pe_grid={self.pe_hw}, prefix={self.num_prefix_tokens}, sr_ratio={self.sr_ratio}, "
                f"linear_sr={self.linear_sr}, normaliser={self.normaliser}")


@register_attention("focused_linear")
class FocusedLinearAttention(FocusedLinearCore):
    """FLatten focused linear attention with its projections: the fused `qkv` (FLatten-Swin/DeiT names; the PVT
    checkpoints' `q` and `kv` are concatenated into it by `remap_q_kv`), the optional PVT key/value reduction
    (`sr`, `norm`, and `pool`/`act` for PVTv2's linear reduction) and the output projection `proj`.

    `build_attention("focused_linear", ...)` returns this class (with `input_size`), a `FocusedLinearCore` with
    `host_qkv=True`, or, without `input_size`, the 1-D forms of `FocusedLinearAttention1d` (`causal=True`: causal).
    Shapes: x (B, N, C) with hw=(H, W), N = num_prefix_tokens + H * W -> (B, N, C). Queries are projected from
    x and keys/values from x or its reduced map, with the rows [C : 3C] of `qkv` (one matmul without a reduction).

    Args:
        qkv_bias: bias on the input projection.
        sr_ratio: PVT spatial reduction of K/V (a strided conv `sr` + `norm` on the map before the key/value rows).
        linear_sr: PVTv2 pooled reduction (AdaptiveAvgPool2d(7) -> 1x1 `sr` -> `norm` -> GELU).
        sr_mode: 'bilinear' (2-D resize of the V map for the DWC) or 'flat1d' (official 1-D interpolation).
        proj_drop: dropout after `proj`.
        other: see `FocusedLinearCore`.
    """

    # The registered name also has the 1-D forms of `FocusedLinearAttention1d` (`resolve`); a grid build
    # (input_size given) narrows its own caps to the 2-D form.
    caps = AttentionCaps(bidirectional=True, causal=True, needs_hw=True, supports_mask=False, complexity="O(N)",
                         sequence=True, notes="FLatten; the grid form needs hw (DWC, PE resized bicubically); built "
                         "without input_size: 1-D forms (1-D DWC, no PE), causal=True by prefix sums")

    @classmethod
    def resolve(cls, options: dict) -> tuple[type, dict]:
        """`build_attention`'s factory: without `input_size` (and without `host_qkv`) the 1-D forms of
        `FocusedLinearAttention1d` (bidirectional, or causal with `causal=True`); with it, the grid form."""
        opts = dict(options)
        causal = bool(opts.pop("causal", False))
        if opts.get("input_size") is None and not opts.get("host_qkv"):
            return FocusedLinearAttention1d, {**opts, "causal": causal}
        if causal:
            raise UserError("focused_linear attention: causal=True is a 1-D form; build it without input_size "
                            "(a token grid has no causal order)")
        return cls, opts

    def __init__(self, dim: int, num_heads: int = 8, input_size: tuple[int, int] | int | None = None,
                 qkv_bias: bool = True, focusing_factor: float = 3, kernel_size: int = 5, sr_ratio: int = 1,
                 linear_sr: bool = False, sr_mode: str = "bilinear", normaliser: str = "mean",
                 num_prefix_tokens: int = 0, lepe: bool = False, dwc_init: str = "default", proj_drop: float = 0.0,
                 fused: bool = True, device=None, dtype=None) -> None:
        super().__init__(dim, num_heads, input_size, focusing_factor=focusing_factor, kernel_size=kernel_size,
                         normaliser=normaliser, num_prefix_tokens=num_prefix_tokens, lepe=lepe, dwc_init=dwc_init,
                         fused=fused, device=device, dtype=dtype,
                         reduction=KeyReduction(sr_ratio=sr_ratio, linear_sr=linear_sr, sr_mode=sr_mode),
                         input_projections=lambda dd: self._build_input_projections(bool(qkv_bias), dd),
                         output_projection=lambda dd: self._build_output_projection(proj_drop, dd))
        self.caps = FocusedLinearCore.caps  # the grid form (the registered name also has 1-D forms)

    def _build_input_projections(self, qkv_bias: bool, dd: dict) -> None:
        """The fused `qkv` and the key-grid reduction's modules (`sr`, `norm`; `pool`, `act` for linear_sr)."""
        dim = self.dim
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        if self.linear_sr:
            self.pool = nn.AdaptiveAvgPool2d(7)
            self.sr = nn.Conv2d(dim, dim, 1, **dd)
            self.norm = nn.LayerNorm(dim, **dd)
            self.act = nn.GELU()
        elif self.sr_ratio > 1:
            self.sr = nn.Conv2d(dim, dim, self.sr_ratio, stride=self.sr_ratio, **dd)
            self.norm = nn.LayerNorm(dim, **dd)

    def _build_output_projection(self, proj_drop: float, dd: dict) -> None:
        self.proj = nn.Linear(self.dim, self.dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)

    def _project(self, x: torch.Tensor, hw: tuple[int, int]):
        """x (B, N, C) -> q (B, N, C), k, v (B, n, C) and the key grid."""
        B, N, C = x.shape
        if not (self.sr_ratio > 1 or self.linear_sr):
            q, k, v = self.qkv(x).reshape(B, N, 3, C).unbind(2)
            return q, k, v, tuple(hw)
        w, b = self.qkv.weight, self.qkv.bias
        q = F.linear(x, w[:C], None if b is None else b[:C])
        P = self.num_prefix_tokens
        kv_hw = self._kv_hw(hw)
        xm = tokens_to_map(x[:, P:], hw)  # (B, C, H, W)
        if self.linear_sr:
            xm = adaptive_pool_2d(xm, self.pool.output_size)
        xr = map_to_tokens(self.sr(xm))  # (B, n_g, C)
        xr = self.norm(torch.cat([x[:, :P], xr], dim=1))
        if self.linear_sr:
            xr = self.act(xr)
        k, v = F.linear(xr, w[C:], None if b is None else b[C:]).reshape(B, xr.shape[1], 2, C).unbind(2)
        return q, k, v, kv_hw

    def _forward(self, x, hw, mask, fused: bool) -> torch.Tensor:
        hw = self._check_input(x, hw, mask)
        q, k, v, kv_hw = self._project(x, hw)
        o = self._core(q, k, v, hw, kv_hw, fused)
        return self.proj_drop(self.proj(o))

    def _qk_for_matrix(self, x: torch.Tensor, hw):
        q, k, _, kv_hw = self._project(x, hw)
        return q, k, kv_hw


class FocusedLinearAttention1d(TokenMixer):
    """FLatten focused linear attention on 1-D token sequences (ours): the grid form with the grid replaced by the
    sequence. `build_attention("focused_linear", C, h)` without `input_size` builds it (with `causal=True`, the
    causal form); the recall, LRA and language-model hosts build it from their 1-D stages.

    Same focused feature map, linear core and parameter names as `FocusedLinearAttention` (`qkv`, `scale`, `dwc`,
    `proj`), with two changes: the rank-restoring DWC is a depthwise conv1d over the tokens (kernel k, shared by
    the heads), 'same'-padded, or left-padded by k - 1 in the causal form so that output t reads v_{t-k+1..t}; and
    there is no positional encoding (FLatten's PE is sized by the grid; the 1-D form stays length-free and takes
    positions from its host). Causal: prefix sums in chunks (`causal_linear_attention_chunked`), with the 'mean'
    normaliser as the mean over the t + 1 visible keys (docs/deviations.md).

    Shapes: x (B, L, C) -> (B, L, C); hw None (a grid hw is refused: build with input_size); no masks.
    Paper: FLatten (arXiv 2308.00442), Sec. 4, Eq. 5-6 (focused function) and Eq. 12 (O = phi(Q) phi(K)^T V +
        DWC(V)); the causal prefix sums of Katharopoulos et al. 2020 (arXiv 2006.16236), Eq. 9-12.
    Official: LeapLabTHU/FLatten-Transformer `models/flatten_swin.py` `FocusedLinearAttention` (the 2-D form).
    Symbols: p = focusing_factor (paper p), k = kernel_size, h heads, d = C / h.

    Args:
        dim, num_heads, qkv_bias, focusing_factor, kernel_size, normaliser, proj_drop, fused: as
            `FocusedLinearAttention` (kernel_size 0: no DWC).
        num_prefix_tokens: P leading class tokens (bidirectional only): queries and keys of the linear attention,
            no DWC term; the conv runs over the L - P other tokens.
        causal: the causal form (token t sees tokens <= t only).
        chunk_size: tokens per chunk of the causal fast path (speed only).
        input_size: must be None (a grid builds `FocusedLinearAttention`).
    """

    caps = AttentionCaps(bidirectional=True, causal=True, needs_hw=False, supports_mask=False, complexity="O(N)",
                         sequence=True, notes="FLatten 1-D form: conv1d DWC, no PE")
    name = "focused_linear"

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = True, focusing_factor: float = 3,
                 kernel_size: int = 5, normaliser: str = "mean", num_prefix_tokens: int = 0, proj_drop: float = 0.0,
                 fused: bool = True, causal: bool = False, chunk_size: int = 64,
                 input_size: tuple[int, int] | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        who = "focused_linear attention (1-D)"
        self.dim, self.num_heads = dim, num_heads
        self.head_dim = check_heads(dim, num_heads, who)
        if input_size is not None:
            raise UserError(f"{who}: input_size={input_size!r} must be None (give it to build the grid form)")
        if normaliser not in ("mean", "sum"):
            raise UserError(f"{who}: normaliser={normaliser!r} is not one of ('mean', 'sum')")
        if not isinstance(kernel_size, int) or isinstance(kernel_size, bool) or kernel_size < 0 or \
                (kernel_size and kernel_size % 2 == 0):
            raise UserError(f"{who}: kernel_size={kernel_size!r} must be a positive odd int, or 0 for no DWC")
        if not focusing_factor > 0:
            raise UserError(f"{who}: focusing_factor={focusing_factor} must be > 0")
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise UserError(f"{who}: chunk_size={chunk_size!r} must be an int >= 1")
        if num_prefix_tokens < 0 or (causal and num_prefix_tokens):
            raise UserError(f"{who}: num_prefix_tokens={num_prefix_tokens} must be >= 0, and 0 when causal")
        self.focusing_factor, self.normaliser, self.fused = focusing_factor, normaliser, fused
        self.causal, self.chunk_size, self.num_prefix_tokens = bool(causal), chunk_size, int(num_prefix_tokens)
        if self.causal:
            self.caps = dataclasses.replace(type(self).caps, bidirectional=False)
        else:
            self.caps = dataclasses.replace(type(self).caps, causal=False)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.scale = nn.Parameter(torch.empty(1, 1, dim, **dd))
        d = self.head_dim
        self.dwc = nn.Conv1d(d, d, kernel_size, groups=d, **dd) if kernel_size else None
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        if not self.scale.is_meta:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """As the grid form: zero `scale`, Linear trunc_normal(0.02) with zero bias, `dwc` PyTorch's default."""
        nn.init.zeros_(self.scale)
        for m in (self.qkv, self.proj):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def _run(self, x: torch.Tensor, fused: bool) -> torch.Tensor:
        B, L, C = x.shape
        q, k, v = self.qkv(x).reshape(B, L, 3, C).unbind(2)  # (B, L, C) each
        fn = focused_linear_attention_1d if fused else focused_linear_attention_1d_ref
        dw = None if self.dwc is None else self.dwc.weight
        db = None if self.dwc is None else self.dwc.bias
        o = fp32_island(fn, q, k, v, self.scale, dw, db, num_heads=self.num_heads, p=self.focusing_factor,
                        normaliser=self.normaliser, prefix=self.num_prefix_tokens, causal=self.causal,
                        chunk_size=self.chunk_size)
        return self.proj_drop(self.proj(o))

    def _check_input(self, x: torch.Tensor, hw=None, mask: torch.Tensor | None = None) -> None:
        """As `TokenMixer._check_input`, and a grid hw is refused (this form has no grid: build with input_size)."""
        super()._check_input(x, hw, mask)
        check_sequence_hw(x, hw, "focused_linear attention (1-D)")

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        self._check_input(x, hw, mask)
        return self._run(x, self.fused)

    def forward_ref(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
        """Dense reference of `forward` (explicit attention and conv matrices)."""
        self._check_input(x, hw, mask)
        return self._run(x, False)

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                         channel: int | None = None) -> torch.Tensor:
        """(B, L, C) -> (B, h, L, L): the map of head channel `channel` (exact: out[:, head, :, c] = M @ v + the
        DWC bias, before `proj`), or the mean over the d channels (channel=None)."""
        self._check_input(x, hw)
        B, L, C = x.shape
        q, k, _ = self.qkv(x).reshape(B, L, 3, C).unbind(2)
        m = focused_attention_matrix_1d(q, k, self.scale, None if self.dwc is None else self.dwc.weight,
                                        num_heads=self.num_heads, p=self.focusing_factor,
                                        normaliser=self.normaliser, prefix=self.num_prefix_tokens,
                                        causal=self.causal)  # (B, h, d, L, L)
        return m.mean(2) if channel is None else m[:, :, int(channel)]

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, p={self.focusing_factor}, "
                f"normaliser={self.normaliser}, causal={self.causal}, prefix={self.num_prefix_tokens}")


def remap_q_kv(state_dict: dict[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    """PVT / PVTv2 keys of one focused (or PVT softmax-form) module under `prefix`: `q` and `kv` -> `qkv` = the
    row-wise concatenation [q; kv] (weights and biases). Other keys pass unchanged; without `{prefix}q.weight` and
    `{prefix}kv.weight` the state dict is returned as is."""
    if prefix + "q.weight" not in state_dict or prefix + "kv.weight" not in state_dict:
        return state_dict
    sd = dict(state_dict)
    for t in ("weight", "bias"):
        q, kv = sd.pop(f"{prefix}q.{t}", None), sd.pop(f"{prefix}kv.{t}", None)
        if q is not None and kv is not None:
            sd[f"{prefix}qkv.{t}"] = torch.cat([q, kv], dim=0)
        elif q is not None or kv is not None:
            raise ValueError(f"focused_linear checkpoint: {prefix}q.{t} and {prefix}kv.{t} must both be present")
    return sd


def remap_legacy(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """A state dict saved by subquad <= 0.1 -> the current names, for every `FocusedLinearAttention` in `model`
    (the former PVT-form keys `q`, `kv`; detected by key names). Current state dicts pass unchanged."""
    for name, m in model.named_modules():
        if isinstance(m, FocusedLinearAttention):
            state_dict = remap_q_kv(state_dict, f"{name}." if name else "")
    return state_dict
