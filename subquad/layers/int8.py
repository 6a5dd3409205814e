"""Dynamic int8 inference for `nn.Linear` on the CPU: int8 x int8 -> int32 GEMMs (`torch._int_mm`), which CPUs with
int8 dot products (x86 AVX512-VNNI / AVX-VNNI / AMX, Arm dot-product) run several times faster than fp32 GEMMs.

Scheme (symmetric, no zero points):
- weights: per output channel, scale_w[o] = max_i |W[o, i]| / 127, W_q = round(W / scale_w) in [-127, 127], computed
  once when a layer is converted (again when its weight changes in place, or after `load_state_dict`);
- activations: per token (row of the flattened input), scale_x[t] = max_i |x[t, i]| / 127, x_q = round(x / scale_x),
  computed on every call ("dynamic");
- y[t, o] = scale_x[t] * scale_w[o] * sum_i x_q[t, i] W_q[o, i] + b[o]: the sum is exact in int32, so the only
  error is the two roundings to int8 (about 1 % of a layer's output norm on Gaussian data).

`quantize_int8(model)` returns a copy of the model whose `nn.Linear` layers (exactly that type) are
`Int8DynamicLinear`; everything else is untouched, so convolutions, normalisations and the attention cores keep
their float path (under `torch.autocast` they run as they would in bf16). The layers keep their float `weight` and
`bias` (state dicts stay those of the float model, and code that reads `layer.weight` still computes in float).
Inference only: a layer refuses to run where autograd would need its gradients.

The tests compare it with a float64 reference of the same quantized function (the int8 operands and their scales,
dequantized and multiplied in float64).
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

__all__ = ["Int8DynamicLinear", "quantize_int8", "quantize_rows", "precision_model"]

_QMAX = 127
_TINY = torch.finfo(torch.float32).tiny


def quantize_rows(x: torch.Tensor, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization with one scale per slice along `dim`: x ~= q * scale.

    Shapes: x (..., K, ...) float -> q int8 like x, scale float32 (or float64 for float64 x) with `dim` kept as 1.
    scale = max |x| / 127 over `dim` (an all-zero slice gets the smallest normal float, so q = 0 there)."""
    magnitude = x.abs()
    amax = magnitude.amax(dim, keepdim=True).to(torch.promote_types(x.dtype, torch.float32))
    scale = amax.clamp_min_(_TINY).div_(_QMAX)
    # No clamp needed: |x| / scale <= 127 (1 + 2^-23) < 127.5, which rounds to at most 127. The quotient reuses the
    # buffer of |x| where the dtypes allow (one allocation fewer per call).
    out = magnitude if (magnitude.dtype == scale.dtype and magnitude.is_contiguous()
                        and not (x.requires_grad and torch.is_grad_enabled())) else None
    return torch.div(x, scale, out=out).round_().to(torch.int8), scale


class Int8DynamicLinear(nn.Linear):
    """`nn.Linear` computed with dynamic int8 quantization on the CPU (see the module docstring).

    Built from a float layer by `from_float` (sharing its weight and bias). The int8 weight and its per-channel
    scales are non-persistent buffers: the state dict is the float layer's."""

    wq: torch.Tensor
    scale_w: torch.Tensor

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self._setup_int8()

    def _setup_int8(self) -> None:
        device = self.weight.device
        self.register_buffer("wq", torch.empty(0, dtype=torch.int8, device=device), persistent=False)
        self.register_buffer("scale_w", torch.empty(0, device=device), persistent=False)
        self._quantized_version = -1
        self.register_load_state_dict_post_hook(lambda module, keys: module.requantize())
        if not self.weight.is_meta:
            self.requantize()

    @classmethod
    def from_float(cls, layer: nn.Linear) -> Int8DynamicLinear:
        """An int8 layer sharing `layer`'s weight and bias Parameters (no copy)."""
        q = cls.__new__(cls)
        nn.Module.__init__(q)
        q.in_features, q.out_features = layer.in_features, layer.out_features
        q.weight, q.bias = layer.weight, layer.bias
        q._setup_int8()
        q.train(layer.training)
        return q

    @torch.no_grad()
    def requantize(self) -> None:
        """Quantize the current float weight again (done automatically when it changed in place, outside
        torch.compile, and after `load_state_dict`)."""
        self.wq, scale = quantize_rows(self.weight.detach().float(), 1)  # (out, in) int8, (out, 1)
        self.scale_w = scale[:, 0]
        self._quantized_version = self.weight._version

    def _check(self, x: torch.Tensor) -> None:
        if x.device.type != "cpu":
            raise RuntimeError(f"{type(self).__name__} runs on the CPU (torch._int_mm with dynamic scales); got "
                               f"input on {x.device}. Use the float model there")
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            raise RuntimeError(f"{type(self).__name__} is inference-only (int8 rounding has no gradient): run it "
                               "under torch.no_grad() or torch.inference_mode(), or train the float model")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"{type(self).__name__}: input has {x.shape[-1]} features in its last dim, the layer "
                             f"takes {self.in_features}")
        if not torch.compiler.is_compiling() and self.weight._version != self._quantized_version:
            self.requantize()

    def _out_dtype(self, x: torch.Tensor) -> torch.dtype:
        """What nn.Linear would return: the autocast dtype inside an enabled CPU autocast region (for float32 and
        bf16 input), else x's dtype."""
        if x.dtype in (torch.float32, torch.bfloat16, torch.float16) and torch.is_autocast_enabled("cpu"):
            return torch.get_autocast_dtype("cpu")
        return x.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x)
        return _int8_linear(x, self.wq, self.scale_w, _detached(self.bias), False, self._out_dtype(x))

    def channel_major(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """(W x^T + b) per batch item: x (B, N, in) -> (B, out, N), for callers that want channel-major output
        (`structure_aware`'s q/k/v), in `out_dtype` (default: as `forward`). Same numbers as
        `forward(x).transpose(1, 2)`."""
        self._check(x)
        if x.dim() != 3:
            raise ValueError(f"{type(self).__name__}.channel_major takes (B, N, in), got shape {tuple(x.shape)}")
        return _int8_linear(x, self.wq, self.scale_w, _detached(self.bias), True, out_dtype or self._out_dtype(x))

    def extra_repr(self) -> str:
        return super().extra_repr() + ", int8 dynamic (per-token activations, per-channel weights)"


def _detached(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach()


def _dequantize(acc: torch.Tensor, sx: torch.Tensor, sw: torch.Tensor, bias: torch.Tensor | None,
                dtype: torch.dtype) -> torch.Tensor:
    """int32 products -> float: acc * sx * sw + bias in `dtype` (sx, sw and bias broadcast against acc)."""
    # The cast first, then the scale in place: `acc * sw` (int32 times float32) runs slower than the two, up to 1.7x
    # on a (1024, 1536) product on a Zen 4 EPYC (the same numbers).
    scaled = acc.to(sw.dtype).mul_(sw)
    y = torch.mul(scaled, sx) if bias is None else torch.addcmul(bias, scaled, sx)
    return y.to(dtype)


def _int8_linear_impl(x: torch.Tensor, wq: torch.Tensor, scale_w: torch.Tensor, bias: torch.Tensor | None,
                      channel_major: bool, out_dtype: torch.dtype) -> torch.Tensor:
    """x (..., in) -> (..., out); with `channel_major` x (B, N, in) -> (B, out, N), each batch item's product taken
    as W_q x_q^T so the output is written channel-major (no transposed copy)."""
    out_features = wq.shape[0]
    if not channel_major:
        lead = x.shape[:-1]
        xq, sx = quantize_rows(x.reshape(-1, x.shape[-1]))
        return _dequantize(torch._int_mm(xq, wq.t()), sx, scale_w, bias, out_dtype).reshape(*lead, out_features)
    B, N, _ = x.shape
    if B == 0:
        return x.new_empty(0, out_features, N, dtype=out_dtype)
    xq, sx = quantize_rows(x)  # (B, N, in), (B, N, 1)
    sw, b = scale_w[:, None], None if bias is None else bias[:, None]
    outs = [_dequantize(torch._int_mm(wq, xq[i].t()), sx[i].t(), sw, b, out_dtype) for i in range(B)]
    return outs[0][None] if B == 1 else torch.stack(outs)


# Under torch.compile the layer is one opaque operator: Inductor (torch 2.14.1) miscompiles graphs around
# torch._int_mm. It returned wrong products for _int_mm on a selected one-row slice of an int8 tensor made in the
# graph (LiSA's q/k/v on a 1 x 1 token map), and a compiled mlla_micro block (2 x 2 map) corrupted the heap. The
# operator runs the eager code above; the rest of the model is still compiled around it.
@torch.library.custom_op("subquad::int8_linear", mutates_args=())
def _int8_linear_op(x: torch.Tensor, wq: torch.Tensor, scale_w: torch.Tensor, bias: torch.Tensor | None,
                    channel_major: bool, out_dtype: torch.dtype) -> torch.Tensor:
    return _int8_linear_impl(x, wq, scale_w, bias, channel_major, out_dtype)


@_int8_linear_op.register_fake
def _(x, wq, scale_w, bias, channel_major, out_dtype):
    if channel_major:
        return x.new_empty(x.shape[0], wq.shape[0], x.shape[1], dtype=out_dtype)
    return x.new_empty(*x.shape[:-1], wq.shape[0], dtype=out_dtype)


def _int8_linear(x: torch.Tensor, wq: torch.Tensor, scale_w: torch.Tensor, bias: torch.Tensor | None,
                 channel_major: bool, out_dtype: torch.dtype) -> torch.Tensor:
    """The eager code in eager mode (no operator dispatch), the opaque operator while compiling."""
    fn = _int8_linear_op if torch.compiler.is_compiling() else _int8_linear_impl
    return fn(x, wq, scale_w, bias, channel_major, out_dtype)


def quantize_int8(model: nn.Module, inplace: bool = False) -> nn.Module:
    """The model with every `nn.Linear` (exactly that type) replaced by `Int8DynamicLinear`, for CPU inference.

    Returns a copy (the float model is left as it was) whose parameters need no gradients, so it runs without
    `torch.no_grad()`; `inplace=True` converts `model` itself and leaves its requires_grad flags alone (then run it
    under torch.no_grad() or torch.inference_mode()). The copy is put in eval mode."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"quantize_int8 takes an nn.Module, got {type(model).__name__}")
    if not inplace:
        model = copy.deepcopy(model).eval().requires_grad_(False)
    if type(model) is nn.Linear:
        return Int8DynamicLinear.from_float(model)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, Int8DynamicLinear.from_float(child))
    return model


def precision_model(model: nn.Module, name: str) -> nn.Module:
    """The model a resolved precision (`subquad.backend.resolve_precision`) runs: for 'int8' the `quantize_int8` copy
    (inference only), for 'fp32' and 'bf16' (an autocast region, `subquad.backend.precision_context`) `model` itself."""
    from ..backend import PRECISIONS
    from ..errors import UserError

    if name not in PRECISIONS:
        raise UserError(f"unknown precision {name!r}; choose one of {', '.join(PRECISIONS)}")
    return quantize_int8(model) if name == "int8" else model
