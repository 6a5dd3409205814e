"""LiSA structure-aware attention as a registered token mixer (`"structure_aware"`), 2-D and 3-D (video) forms."""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Sequence

import torch
from timm.layers import trunc_normal_
from torch import nn

from .._shapes import check_heads, check_sequence_hw, check_tokens, known_equal, merge_heads, sizes, tracing
from ..backend import cpu_schedules, eager_schedule, fast_gemm_dtype, real_dft_active
from ..errors import UserError
from ..layers.int8 import Int8DynamicLinear
from ..layers.precision import compute_dtype, no_autocast
from .base import AttentionCaps, TokenMixer
from .functional.structure_aware import (
    _kernel_from_spectra,
    kernel_spectra,
    lisa_dft,
    lisa_eq8_ref,
    lisa_eq9_ref,
    lisa_eq10_dense,
    lisa_eq10_ref,
    lisa_fft,
    lisa_local,
    local_to_toeplitz,
    resize_kernel,
    rpe_matrix,
    toeplitz_to_circular,
)
from .registry import register_attention

__all__ = ["StructureAwareAttention", "StructureAwareAttention1d"]

_FORMS = ("fft", "eq8", "eq9", "eq10")

# Every grid-form module by id, where `subquad::lisa_core` finds the module that owns the kernels a compiled graph
# passes it (filled at construction and on unpickling or deep copy); `_OWNERS` remembers the owner of each set of
# kernels (kernel_a, kernel_b, struct_proj) by their ids.
_MIXERS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_OWNERS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _as_grid(size, name: str) -> tuple[int, ...]:
    if isinstance(size, int):
        size = (size, size)
    size = sizes(size)
    if len(size) not in (2, 3) or min(size) < 1:
        raise ValueError(f"{name} must be (H, W) or (T, H, W) of positive ints, got {size!r}")
    return size


def _channel_major_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """W x^T + b per batch item: x (B, N, C) -> (B, out, N), written channel-major (the FFTs run over the token axis).

    Under autocast, one image (B == 1, inference) takes one addmm on the module's own leaf weight and bias, which
    autocast casts once per autocast region (its weight cache, which keeps weights that require grad, as for
    nn.Linear) instead of once per call; a batch casts them once per call, before the batch broadcast (a broadcast
    view is never cached, and its cast would copy the weight per batch item and the bias per token). The same
    products either way (bit-identical logits on the LiSA models on an Intel Xeon, benchmarks/lisa_qkv_cast.py).
    """
    B, N, _ = x.shape
    xt = x.transpose(1, 2)
    if B == 1:
        return (torch.mm(w, xt[0]) if b is None else torch.addmm(b[:, None], w, xt[0])).unsqueeze(0)
    kind = x.device.type
    if w.dtype == torch.float32 and kind in ("cpu", "cuda", "xpu") and torch.is_autocast_enabled(kind):
        low = torch.get_autocast_dtype(kind)
        w, b = w.to(low), (None if b is None else b.to(low))
    w = w.expand(B, *w.shape)
    return torch.bmm(w, xt) if b is None else torch.baddbmm(b[:, None].expand(B, -1, N), w, xt)


def _normalize_channels(t: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """F.normalize over dim -2 of a channel-major (..., d, N) tensor: t / max(||t||, eps). Written as a sum of
    squares and rsqrt because torch's norm reduction over a strided dim is ~10x slower here."""
    return t * (t * t).sum(-2, keepdim=True).clamp_min(eps * eps).rsqrt()


@register_attention("structure_aware")
class StructureAwareAttention(TokenMixer):
    """LiSA: lightweight structure-aware attention (Eq. 13), with the explicit Eq. 10 form as reference.

    Shapes: x (B, N, C) with hw = (H, W) (N = H*W) or, for video (3-D `input_size`), hw = (T, H, W) (N = T*H*W)
    -> (B, N, C). No masks, no prefix tokens (LiSA mixes a full grid).
    Paper: LiSA (arXiv 2211.16289), Eq. 8-13; operator rebuilt from the paper's equations (docs/deviations.md).
    Official: none published; this module is the reference implementation.
    Symbols: D structural-pattern size (paper D); W^a = `kernel_a` (C, D, *grid0); W^b = `kernel_b` (h, D, *grid0)
        (or (1, D, *grid0) with `shared_kernel_b`); B = `struct_proj` (C, D); Q-bar, K-bar = L2-normalised q, k.

    Forward: q, k, v = qkv(x) (head-major); q, k L2-normalised over the head dim (eps 1e-6); Ga = corr(W^a, k),
    S = sum_c q * Ga per head, Gb = corr(W^b, v), Y = sum_d S_d (Gb_d + B_d); proj. Steps 2-10 run in float32
    (float64 for float64 input) with autocast off; the output is cast back before `proj`. Under autocast the qkv
    GEMM is pinned to float32 as well on the CPU schedule when the autocast dtype is slow on this CPU
    (`subquad.backend.fast_gemm_dtype`: fp16, or bf16 without native bf16).

    Resolution: kernels are stored in the token domain on `input_size` (H0, W0) (or (T0, H0, W0)). At another grid
    they are resampled by `resize_kernel(kernel, grid, kernel_resize)`: 'pad' (default) keeps each offset's weight
    in token units (centred zero-padding when the grid grows, centred cropping when it shrinks); 'interp' resamples
    the centred kernel bicubically (trilinear in 3-D) and rescales it by (H0*W0)/(H*W) to keep the DC gain. Local
    kernels (`local_kernel=k`) are size-independent. `boundary='zero'` kernels are Toeplitz (2*grid0-1) and are
    resized with the same rule on the (2*grid - 1) offset window.

    Args:
        dim: channels C.
        num_heads: heads h (C_h = C / h).
        D: structural-pattern size (>= 1; 8 for hierarchical models, 16 for LiSANet-I).
        input_size: token grid the kernels are sized for, (H0, W0) or (T0, H0, W0) (3-D form). Default 14 x 14
            when the class is built directly; `build_attention` without it builds the 1-D form
            (`StructureAwareAttention1d`).
        qkv_bias: bias of `qkv`.
        shared_kernel_b: one W^b for all heads (the paper's single-head N x D form) instead of one per head.
        local_kernel: None (global kernels, the paper's LiSA) or an odd k: k x k (k x k x k) zero-padded local
            kernels (Tab. 3(d)), computed with grouped convolutions.
        boundary: 'circular' (Eq. 13, registered models) or 'zero' (Toeplitz Eq. 11 via FFTs on the doubled grid;
            ablation of the circular approximation).
        d_chunk: process D in chunks of this size, rounded up to even (patterns travel in pairs, one complex FFT
            per pair; bounds peak memory); None = automatic tiling over heads and D (`plan_tiles`: Ga/Gb tiles of
            at most 2^21 floats).
        kernel_resize: 'pad' or 'interp' (see Resolution).
        normalize_v: also L2-normalise v (off; docs/deviations.md).
        checkpoint_kernels: recompute Ga/Gb per chunk in backward instead of storing them.
        proj_drop: dropout after `proj`.
        num_prefix_tokens: must be 0 (accepted for the host interface; LiSA has no class token).
        fft_dims: '2d' (default: FFTs over the token grid, H x W or T x H x W) or '1d' (ablation: one
            FFT over the raster-order token sequence, kernels (C, D, N0); a different circulant structure).
        form: how the layer is computed (the paper's derivation chain, Tab. 3(b); all but 'fft' are trainable
            dense forms with O(N^2) memory, for comparing cost and accuracy):
            'fft' (default): Eq. 13, the FFT evaluation.
            'eq10': Eq. 10 (Hadamard correlation) with dense RPE tensors (`lisa_eq10_dense`); same parameters and
                the same function as 'fft' (with boundary='zero' it is the paper's Toeplitz SA before the FFT
                approximation).
            'eq9': Eq. 9 (dot-product correlation, `lisa_eq9_ref`): `kernel_a` is (h, D, *K), one W^a per head
                instead of per channel (Eq. 10 with W^a equal over a head's channels); kernel_b, struct_proj as
                'fft'.
            'eq8': Eq. 8, multiplicative RPE without structural patterns (`lisa_eq8_ref`): Y = (q-bar k-bar^T * R) V
                per head; the only kernel is `rpe` (h, 1, *K) (or (1, 1, *K) with `shared_rpe`); no kernel_a,
                kernel_b, struct_proj; D is unused.
        shared_rpe: form='eq8' only: one RPE for all heads (Tab. 3(b) shared vs per-head RPE).
    """

    caps = AttentionCaps(bidirectional=True, causal=False, needs_hw=True, supports_mask=False,
                         complexity="O(N log N)", sequence=True,
                         notes="fp16/bf16 inputs compute the FFT core in fp32; without input_size: the 1-D form "
                               "(kernels over token offsets, length via seq_len)", grid_ndims=(2, 3))

    @classmethod
    def resolve(cls, options: dict) -> tuple[type, dict]:
        """`build_attention`'s factory: without `input_size` the 1-D form (`StructureAwareAttention1d`); no causal
        form."""
        opts = dict(options)
        if opts.pop("causal", False):
            raise UserError("structure_aware has no causal form: its structural vectors correlate every key with "
                            "global relative-position kernels, so every output reads every token (causal=False only)")
        if opts.get("input_size") is None:
            return StructureAwareAttention1d, opts
        if opts.get("seq_len") is not None:
            raise UserError("structure_aware: seq_len sizes the 1-D form; with input_size (the grid form) leave it "
                            "out")
        opts.pop("seq_len", None)
        return cls, opts

    @classmethod
    def takes_prefix_tokens(cls) -> bool:
        """LiSA mixes a full token grid: no class token (`num_prefix_tokens` is accepted and must be 0)."""
        return False

    def __init__(self, dim: int, num_heads: int = 8, D: int = 8, input_size: Sequence[int] | None = None,
                 qkv_bias: bool = True, shared_kernel_b: bool = False, local_kernel: int | None = None,
                 boundary: str = "circular", d_chunk: int | None = None, kernel_resize: str = "pad",
                 normalize_v: bool = False, checkpoint_kernels: bool = False, proj_drop: float = 0.0,
                 num_prefix_tokens: int = 0, fft_dims: str = "2d", form: str = "fft", shared_rpe: bool = False,
                 device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = check_heads(dim, num_heads, "structure_aware attention")
        if not isinstance(D, int) or D < 1:
            raise ValueError(f"structure_aware: D (structural-pattern size) must be an int >= 1, got {D!r}")
        if boundary not in ("circular", "zero"):
            raise ValueError(f"structure_aware: boundary must be 'circular' or 'zero', got {boundary!r}")
        if kernel_resize not in ("pad", "interp"):
            raise ValueError(f"structure_aware: kernel_resize must be 'pad' or 'interp', got {kernel_resize!r}")
        if local_kernel is not None and (local_kernel < 1 or local_kernel % 2 == 0):
            raise ValueError(f"structure_aware: local_kernel must be an odd int >= 1 or None, got {local_kernel!r}")
        if fft_dims not in ("2d", "1d"):
            raise ValueError(f"structure_aware: fft_dims must be '2d' (the token grid) or '1d', got {fft_dims!r}")
        if fft_dims == "1d" and local_kernel is not None:
            raise ValueError("structure_aware: local_kernel needs the token grid (fft_dims='2d'), got fft_dims='1d'")
        if form not in _FORMS:
            raise ValueError(f"structure_aware: form must be one of {_FORMS}, got {form!r}")
        if shared_rpe and form != "eq8":
            raise ValueError(f"structure_aware: shared_rpe is the single RPE of form='eq8', got form={form!r}")
        if form == "eq8" and shared_kernel_b:
            raise ValueError("structure_aware: form='eq8' has no kernel_b; share its RPE with shared_rpe=True")
        if form != "fft" and (d_chunk is not None or checkpoint_kernels):
            raise ValueError(f"structure_aware: d_chunk/checkpoint_kernels tile the FFT form only, got form={form!r}")
        if d_chunk is not None and d_chunk < 1:
            raise ValueError(f"structure_aware: d_chunk must be >= 1 or None, got {d_chunk!r}")
        if num_prefix_tokens:
            raise ValueError(f"structure_aware: num_prefix_tokens={num_prefix_tokens} is not supported (LiSA mixes "
                             "a full token grid; use class_token=False / global_pool='avg')")
        self.D = D
        self.input_size = _as_grid(input_size if input_size is not None else (14, 14), "input_size")
        self.ndim_grid = len(self.input_size)
        self.shared_kernel_b = shared_kernel_b
        self.local_kernel = local_kernel
        self.boundary = boundary
        self.d_chunk = d_chunk
        self.kernel_resize = kernel_resize
        self.normalize_v = normalize_v
        self.checkpoint_kernels = checkpoint_kernels
        self.fft_dims = fft_dims
        self.form = form
        self.shared_rpe = shared_rpe
        # Grid the kernels live on: the token grid, or its raster-order flattening for fft_dims='1d'.
        self.kernel_grid = self.input_size if fft_dims == "2d" else (math.prod(self.input_size),)
        if local_kernel is not None:
            ksize = (local_kernel,) * self.ndim_grid
        elif boundary == "circular":
            ksize = self.kernel_grid
        else:
            ksize = tuple(2 * g - 1 for g in self.kernel_grid)
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias, **dd)
        if form == "eq8":
            for name in ("kernel_a", "kernel_b", "struct_proj"):
                self.register_parameter(name, None)
            self.rpe = nn.Parameter(torch.empty(1 if shared_rpe else num_heads, 1, *ksize, **dd))
        else:
            self.kernel_a = nn.Parameter(torch.empty(num_heads if form == "eq9" else dim, D, *ksize, **dd))
            self.kernel_b = nn.Parameter(torch.empty(1 if shared_kernel_b else num_heads, D, *ksize, **dd))
            self.struct_proj = nn.Parameter(torch.empty(dim, D, **dd))
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        # Eval-only cache of the kernel spectra: key -> (spectrum_a, spectrum_b). Not state (not saved).
        self._spectra_cache: dict = {}
        self.caps = dataclasses.replace(type(self).caps, sequence=False)
        self._register()
        if not self.qkv.weight.is_meta:
            self.reset_parameters()

    def _register(self) -> None:
        """Make this module findable by `subquad::lisa_core` (at construction, unpickling and deep copy), which
        then uses its spectra cache for its own kernels; kernels of a module it cannot find are transformed on the
        call."""
        _MIXERS[id(self)] = self

    def __setstate__(self, state):
        super().__setstate__(state)
        self._register()

    def _kernel_params(self) -> list[torch.Tensor]:
        """The token-domain kernels of this form: [kernel_a, kernel_b], or [rpe] for form='eq8'."""
        return [self.rpe] if self.form == "eq8" else [self.kernel_a, self.kernel_b]

    def reset_parameters(self) -> None:
        extra = [] if self.form == "eq8" else [self.struct_proj]
        for p in (*self._kernel_params(), *extra, self.qkv.weight, self.proj.weight):
            trunc_normal_(p, std=0.02)
        for b in (self.qkv.bias, self.proj.bias):
            if b is not None:
                nn.init.zeros_(b)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, D={self.D}, input_size={self.input_size}, "
                f"local_kernel={self.local_kernel}, boundary={self.boundary!r}"
                + (f", form={self.form!r}" if self.form != "fft" else ""))

    def _grid(self, x: torch.Tensor, hw) -> tuple[int, ...]:
        who = f"{type(self).__name__} ('structure_aware')"
        check_tokens(x, self.dim, who)
        if hw is None:
            raise ValueError(f"{who} is spatial and needs hw={'(T, H, W)' if self.ndim_grid == 3 else '(H, W)'} "
                             f"for x of shape {tuple(x.shape)}")
        grid = sizes(hw)
        if len(grid) != self.ndim_grid or min(grid) < 1:
            form = "(T, H, W) (3-D video form)" if self.ndim_grid == 3 else "(H, W) (2-D form)"
            raise ValueError(f"{who}: hw must be {form} for input_size={self.input_size}, got hw={tuple(hw)}")
        if math.prod(grid) != x.shape[1]:
            raise ValueError(f"{who}: grid hw={'x'.join(map(str, grid))} makes {math.prod(grid)} tokens but x has "
                             f"N={x.shape[1]} (shape {tuple(x.shape)})")
        return grid if self.fft_dims == "2d" else (math.prod(grid),)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, N, C) -> q-bar, k-bar, v (B, h, N, d) in the compute dtype (float32, or float64)."""
        B, N, C = x.shape
        # Channel-major projection, (B, 3C, N) = W x^T + b: the FFTs run over the token axis, so q, k, v are
        # returned as (B, h, N, d) views of (B, h, d, N) storage (no transposed copies downstream).
        if isinstance(self.qkv, Int8DynamicLinear):  # `quantize_int8`: the int8 GEMM, output in the core's dtype
            qkv = self.qkv.channel_major(x, compute_dtype(x.dtype))
        else:
            qkv = _channel_major_linear(x, self.qkv.weight, self.qkv.bias)
        cdt = compute_dtype(qkv.dtype)
        q, k, v = qkv.to(cdt).reshape(B, 3, self.num_heads, self.head_dim, N).unbind(1)  # each (B, h, d, N)
        q, k = _normalize_channels(q), _normalize_channels(k)
        if self.normalize_v:
            v = _normalize_channels(v)
        return q.transpose(-1, -2), k.transpose(-1, -2), v.transpose(-1, -2)

    def kernels(self, grid: Sequence[int], dtype: torch.dtype | None = None,
                params: Sequence[torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
        """kernel_a, kernel_b (or (rpe,) for form='eq8') resampled for `grid` (token-domain; identity at
        `input_size` and for local kernels); `params`: those kernels given instead of the module's own."""
        ks = list(params) if params is not None else self._kernel_params()
        if dtype is not None:
            ks = [w.to(dtype) for w in ks]
        # known_equal: a traced (symbolic) grid always resamples, which is the identity at input_size.
        if self.local_kernel is None and not known_equal(tuple(grid), self.kernel_grid):
            target = tuple(grid) if self.boundary == "circular" else tuple(2 * g - 1 for g in grid)
            ks = [resize_kernel(w, target, self.kernel_resize) for w in ks]
        return tuple(ks)

    def _spectra(self, grid: tuple[int, ...], dtype: torch.dtype,
                 params: Sequence[torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
        """`kernel_spectra` of both kernels on the FFT grid; cached per grid in eval mode without autograd, with
        kernel_b's inverse transform as a third element (see `lisa_fft`'s spectra). Given `params` (kernel_a,
        kernel_b other than the module's own) they are transformed, never cached."""
        use_cache = not self.training and not torch.is_grad_enabled() and not tracing() and params is None
        key = (grid, dtype, self.kernel_a.device, self.kernel_a._version, self.kernel_b._version,
               id(self.kernel_a), id(self.kernel_b))
        if use_cache and key in self._spectra_cache:
            return self._spectra_cache[key]
        ka, kb = self.kernels(grid, dtype, params)
        fft_grid = grid
        if self.boundary == "zero":
            ka, kb = toeplitz_to_circular(ka, grid), toeplitz_to_circular(kb, grid)
            fft_grid = tuple(2 * g for g in grid)
        out = kernel_spectra(ka, kb, fft_grid)
        if use_cache:
            # With kernel_b back in space, for the dense kernel path (one inverse transform per grid, not per call).
            out = (*out, _kernel_from_spectra(out[1], len(fft_grid), dtype))
            self._spectra_cache.clear()
            self._spectra_cache[key] = out
        return out

    def train(self, mode: bool = True):
        self._spectra_cache.clear()
        return super().train(mode)

    def _mix(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grid: tuple[int, ...],
             params: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """q-bar, k-bar, v (B, h, N, d) -> (B, h, N, d) by the fast path of this configuration. `params`
        (kernel_a, kernel_b, struct_proj of the global FFT form): tensors to use instead of the module's own."""
        if self.form != "fft":
            return self._mix_dense(q, k, v, grid)
        ka_p, kb_p, sp_p = params if params is not None else (self.kernel_a, self.kernel_b, self.struct_proj)
        given = None if params is None else (ka_p, kb_p)
        bproj = sp_p.to(q.dtype)
        d_chunk = self.d_chunk
        if self.local_kernel is not None:
            ka, kb = self.kernels(grid, q.dtype, given)
            return lisa_local(q, k, v, ka, kb, bproj, grid, d_chunk=d_chunk)
        # The real-DFT form for ONNX only. (Taking it inside torch.compile too, since Inductor generates no code for
        # complex operators, made lisanet_s 2x slower at 224 x 224: its 56 x 56 grids make the DFT matmuls costly.)
        if real_dft_active():
            ka, kb = self.kernels(grid, q.dtype, given)
            return lisa_dft(q, k, v, ka, kb, bproj, grid, self.boundary)
        return lisa_fft(q, k, v, ka_p, kb_p, bproj, grid, self.boundary, d_chunk,
                        spectra=self._spectra(grid, q.dtype, given),
                        checkpoint_chunks=self.checkpoint_kernels)

    def forward(self, x: torch.Tensor, hw: Sequence[int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is not None:
            raise ValueError("structure_aware does not support masks; pass mask=None")
        grid = self._grid(x, hw)
        # The FFT core always runs in fp32 (fp64 for fp64 input). The q/k/v GEMM is pinned to fp32 too on the CPU
        # schedule when the autocast dtype is slow on this CPU (fp16, or bf16 without native bf16); otherwise it runs
        # in the autocast dtype (subquad.backend.fast_gemm_dtype).
        if cpu_schedules(x.device) and not (torch.is_autocast_enabled("cpu")
                                            and fast_gemm_dtype(torch.get_autocast_dtype("cpu"), "cpu")):
            with no_autocast(x):  # a low-precision x (from an autocast conv stage) is lifted to the weights' dtype
                q, k, v = self._qkv(x.to(self.qkv.weight.dtype))
        else:
            q, k, v = self._qkv(x)
        with no_autocast(x):
            if self._core_as_operator(q, k, v):
                o = _lisa_core_op(q, k, v, self.kernel_a, self.kernel_b, self.struct_proj, list(grid),
                                  self.boundary, self.kernel_resize, -1 if self.d_chunk is None else self.d_chunk)
            else:
                o = self._mix(q, k, v, grid)
        # Back to the input dtype; under autocast `proj` then runs in the autocast dtype.
        return self.proj_drop(self.proj(merge_heads(o).to(x.dtype)))

    def _core_as_operator(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
        """Whether the FFT core runs as the opaque operator `subquad::lisa_core`: while `torch.compile` (not
        `torch.export`, not the ONNX real-DFT form) traces an inference call of the global FFT form on the CPU
        schedule. The operator runs `_mix` as in eager mode, with the CPU tiles, the reused workspaces, the dense
        kernel path and the spectra cache, which tracing turns off; Inductor generates no code for the complex
        operators of the traced core anyway (traced, `lisanet_s` compiled at 512 x 512 ran 0.95x fp32 eager in bf16,
        1.38-1.43x with the operator; docs/benchmarks.md, "LiSA under torch.compile")."""
        if not torch.compiler.is_compiling() or torch.compiler.is_exporting() or real_dft_active():
            return False
        if self.form != "fft" or self.local_kernel is not None or q.device.type != "cpu":
            return False
        if eager_schedule(q.device) != "cpu":
            return False  # the plain schedule asked for
        return not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, *self._kernel_params(),
                                                                              self.struct_proj)))

    def _ref_kernels(self, grid: tuple[int, ...], dtype: torch.dtype) -> tuple[list[torch.Tensor], str]:
        """The kernels as dense-form operands (local kernels embedded in Toeplitz ones) and their boundary."""
        ks = self.kernels(grid, dtype)
        if self.local_kernel is not None:
            return [local_to_toeplitz(w, grid) for w in ks], "zero"
        return list(ks), self.boundary

    def _mix_dense(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grid: tuple[int, ...]) -> torch.Tensor:
        """The dense forms 'eq8', 'eq9', 'eq10' (trainable; O(N^2) memory)."""
        ks, boundary = self._ref_kernels(grid, q.dtype)
        if self.form == "eq8":
            return lisa_eq8_ref(q, k, v, ks[0][:, 0], grid, boundary)
        bproj = self.struct_proj.to(q.dtype)
        fn = lisa_eq9_ref if self.form == "eq9" else lisa_eq10_dense
        return fn(q, k, v, ks[0], ks[1], bproj, grid, boundary)

    def forward_ref(self, x: torch.Tensor, hw: Sequence[int] | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
        """Explicit reference of `forward`: Eq. 10 with materialised RPE tensors (O(N^2 C D) memory). The dense forms
        'eq8' and 'eq9' are their own references (`lisa_eq8_ref`, `lisa_eq9_ref`)."""
        grid = self._grid(x, hw)
        q, k, v = self._qkv(x)
        if self.form in ("eq8", "eq9"):
            o = self._mix_dense(q, k, v, grid)
        else:
            (ka, kb), boundary = self._ref_kernels(grid, q.dtype)
            o = lisa_eq10_ref(q, k, v, ka, kb, self.struct_proj.to(q.dtype), grid, boundary)
        return self.proj(merge_heads(o).to(x.dtype))

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw: Sequence[int] | None = None) -> torch.Tensor:
        """(B, N, C) -> (B, h, N, N): A-hat, the equivalent token-mixing map of the kernel path (Y_attn = A-hat V
        per head). The feature path S B^T mixes no tokens beyond S and is not part of this map."""
        grid = self._grid(x, hw)
        q, k, v = self._qkv(x)
        ks, boundary = self._ref_kernels(grid, q.dtype)
        if self.form in ("eq8", "eq9"):  # the map applied to V: A-bar * R (Eq. 8) or A-hat of Eq. 9
            attn = q @ k.transpose(-2, -1)
            if self.form == "eq8":
                return attn * rpe_matrix(ks[0][:, 0], grid, boundary)
            s = torch.einsum("bhin,hdin->bhid", attn, rpe_matrix(ks[0], grid, boundary))
            return torch.einsum("bhid,hdij->bhij", s, rpe_matrix(ks[1], grid, boundary).expand(self.num_heads,
                                                                                                -1, -1, -1))
        ka, kb = ks
        _, _, a_hat = lisa_eq10_ref(q, k, v, ka, kb, self.struct_proj.to(q.dtype), grid, boundary,
                                    return_structure=True)
        return a_hat


def _kernel_owner(kernel_a: torch.Tensor, kernel_b: torch.Tensor, struct_proj: torch.Tensor, boundary: str,
                  kernel_resize: str, d_chunk: int | None) -> StructureAwareAttention | None:
    """The registered global-FFT module whose own parameters these are, with this configuration, or None."""
    def owns(m) -> bool:
        return (m is not None and getattr(m, "kernel_a", None) is kernel_a and m.kernel_b is kernel_b
                and m.struct_proj is struct_proj and m.form == "fft" and m.local_kernel is None
                and m.boundary == boundary and m.kernel_resize == kernel_resize and m.d_chunk == d_chunk)

    key = (id(kernel_a), id(kernel_b), id(struct_proj))  # checked by identity on every hit: a reused id misses
    m = _OWNERS.get(key)
    if owns(m):
        return m
    m = next((m for m in list(_MIXERS.values()) if owns(m)), None)
    if m is not None:
        _OWNERS[key] = m
    return m


@torch.library.custom_op("subquad::lisa_core", mutates_args=())
def _lisa_core_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel_a: torch.Tensor, kernel_b: torch.Tensor,
                  struct_proj: torch.Tensor, grid: list[int], boundary: str, kernel_resize: str,
                  d_chunk: int) -> torch.Tensor:
    """LiSA's global FFT core on q-bar, k-bar, v (B, h, N, d) with the kernels the graph passes, run eagerly inside a
    compiled graph (see `StructureAwareAttention._core_as_operator`): (B, h, N, d), contiguous. The graph carries the
    configuration (boundary, kernel_resize, d_chunk; -1 = automatic tiles), not its module, so Inductor's on-disk
    cache serves it across processes. Where the kernels are a registered module's own parameters, that module runs
    the core with its cached spectra; other tensors (`torch.func.functional_call`, a kernel changed earlier in the
    same graph, a copy that did not register) are resized and transformed on the call, as `StructureAwareAttention`
    does."""
    grid_t, chunk = tuple(grid), None if d_chunk < 0 else d_chunk
    with torch.autocast(q.device.type, enabled=False):
        module = _kernel_owner(kernel_a, kernel_b, struct_proj, boundary, kernel_resize, chunk)
        if module is not None:
            out = module._mix(q, k, v, grid_t)
        else:
            target = grid_t if boundary == "circular" else tuple(2 * g - 1 for g in grid_t)
            ka, kb = (w.to(q.dtype) for w in (kernel_a, kernel_b))
            ka, kb = (w if tuple(w.shape[2:]) == target else resize_kernel(w, target, kernel_resize) for w in (ka, kb))
            out = lisa_fft(q, k, v, ka, kb, struct_proj.to(q.dtype), grid_t, boundary, chunk)
    return out.contiguous()


@_lisa_core_op.register_fake
def _(q, k, v, kernel_a, kernel_b, struct_proj, grid, boundary, kernel_resize, d_chunk):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


class StructureAwareAttention1d(StructureAwareAttention):
    """LiSA on 1-D token sequences (ours: LiSA defines it on image and video grids): the same operator with the
    relative-position kernels indexed by the 1-D token offset, i.e. the grid form on a 1 x L grid with the FFT over
    the sequence (`fft_dims='1d'`). `build_attention("structure_aware", C, h)` without `input_size` builds it.

    Shapes: x (B, L, C) -> (B, L, C); hw None (a grid hw is refused: build with input_size); no masks, no prefix
    tokens.
    Paper: LiSA (arXiv 2211.16289), Eq. 8-13, with 1-D relative positions.
    Official: none published.
    Symbols: as `StructureAwareAttention`; the kernels are (C, D, K) and (h or 1, D, K) with K = seq_len
        (circular) or 2 seq_len - 1 (boundary='zero').

    Length: the kernels are stored on `seq_len` tokens (default 512) and resized by the grid form's 'pad' rule: each
    offset keeps its weight in token units; at longer sequences the offsets beyond the stored ones get weight 0, at
    shorter ones the kernel is cropped around offset 0. With boundary='circular' the convolution wraps around the
    sequence ends (Eq. 13's circulant approximation); boundary='zero' does not.

    Args:
        seq_len: the length the kernels are stored on.
        other: as `StructureAwareAttention` (no local kernels, kernel_resize 'pad' only).
    """

    caps = AttentionCaps(bidirectional=True, causal=False, needs_hw=False, supports_mask=False,
                         complexity="O(N log N)", sequence=True, notes="LiSA over 1-D token offsets")
    name = "structure_aware"

    def __init__(self, dim: int, num_heads: int = 8, D: int = 8, seq_len: int | None = None, qkv_bias: bool = True,
                 shared_kernel_b: bool = False, boundary: str = "circular", d_chunk: int | None = None,
                 normalize_v: bool = False, checkpoint_kernels: bool = False, proj_drop: float = 0.0,
                 num_prefix_tokens: int = 0, form: str = "fft", shared_rpe: bool = False,
                 input_size: None = None, device=None, dtype=None) -> None:
        seq_len = 512 if seq_len is None else seq_len
        if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
            raise UserError(f"structure_aware (1-D): seq_len={seq_len!r} must be an int >= 1")
        super().__init__(dim, num_heads, D, (1, seq_len), qkv_bias, shared_kernel_b, None, boundary, d_chunk, "pad",
                         normalize_v, checkpoint_kernels, proj_drop, num_prefix_tokens, "1d", form, shared_rpe,
                         device, dtype)
        self.seq_len = seq_len
        self.caps = type(self).caps

    def _check_sequence(self, x: torch.Tensor, hw: Sequence[int] | None) -> None:
        """x is (B, L, C); a grid hw is refused (this form has no grid: build with input_size)."""
        check_tokens(x, self.dim, "StructureAwareAttention1d ('structure_aware')")
        check_sequence_hw(x, hw, "structure_aware (1-D)")

    def forward(self, x: torch.Tensor, hw: Sequence[int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        self._check_sequence(x, hw)
        return super().forward(x, (1, x.shape[1]), mask)

    def forward_ref(self, x: torch.Tensor, hw: Sequence[int] | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
        """Explicit reference of `forward` (Eq. 10 with materialised 1-D RPE tensors)."""
        self._check_sequence(x, hw)
        if mask is not None:
            raise ValueError("structure_aware does not support masks; pass mask=None")
        return super().forward_ref(x, (1, x.shape[1]))

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw: Sequence[int] | None = None) -> torch.Tensor:
        self._check_sequence(x, hw)
        return super().attention_matrix(x, (1, x.shape[1]))
