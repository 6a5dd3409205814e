"""Dynamic int8 linear layers (`subquad.layers.int8`): the int8 GEMM path against its float64 reference (same int8
operands, dequantized in float64), its error against the float layer, and the module's contract."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from subquad import create_model
from subquad.layers.int8 import Int8DynamicLinear, quantize_int8, quantize_rows
from tests._tol import assert_close, rel_rms


def int8_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Float64 reference of `Int8DynamicLinear`: the same int8 operands and scales (`quantize_rows`: per token, per
    output channel), dequantized and multiplied in float64. x (..., in), weight (out, in) -> (..., out)."""
    wq, sw = quantize_rows(weight.detach().float(), 1)
    xq, sx = quantize_rows(x.detach().float(), -1)
    y = (xq.double() * sx.double()) @ (wq.double() * sw.double()).t()
    return y if bias is None else y + bias.detach().double()


def _layer(i: int, o: int, bias: bool = True, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(i, o, bias=bias)


@pytest.mark.parametrize("shape,i,o,bias", [((7, 37), 37, 23, True), ((2, 5, 33), 33, 9, False),
                                           ((1, 1, 3), 3, 5, True)])
def test_int8_linear_equals_its_float64_reference(shape, i, o, bias):
    lin = _layer(i, o, bias)
    q = quantize_int8(lin)
    x = torch.randn(*shape)
    y = q(x)
    assert y.dtype == torch.float32 and y.shape == (*shape[:-1], o)
    # The int32 sum is exact: the fast path differs from the float64 dequantized product by float32 scaling only.
    assert_close(y, int8_linear_ref(x, lin.weight, lin.bias), torch.float32, "output")


def test_float64_input_without_bias_and_quantize_rows_under_autograd():
    """float64 input keeps float64 scales and output (no bias: the scale-only dequantize); quantize_rows of a tensor
    autograd tracks still returns its int8 form (no out= buffer under autograd)."""
    lin = _layer(13, 6, bias=False)
    q = quantize_int8(lin)
    x = torch.randn(5, 3, 13, dtype=torch.float64)
    y = q(x)
    assert y.dtype == torch.float64
    assert_close(y, int8_linear_ref(x, lin.weight), torch.float32, "float64 input")
    leaf = torch.randn(4, 9, requires_grad=True)
    qa, sa = quantize_rows(leaf)
    qb, sb = quantize_rows(leaf.detach())
    assert torch.equal(qa, qb) and torch.equal(sa.detach(), sb)


def test_empty_input():
    q = quantize_int8(_layer(8, 4))
    assert q(torch.randn(3, 0, 8)).shape == (3, 0, 4)
    assert q.channel_major(torch.randn(0, 5, 8)).shape == (0, 4, 5)


def test_int8_error_against_the_float_layer_is_the_rounding():
    lin = _layer(256, 384)
    x = torch.randn(3, 50, 256)
    err = rel_rms(quantize_int8(lin)(x), lin(x).detach().double())
    # Two roundings to 8 bits (per-token and per-channel scales) on Gaussian data: about 1 %; far from float.
    assert 1e-3 < err < 2e-2, err


def test_quantize_rows_scales_and_zero_rows():
    x = torch.tensor([[0.0, 0.0, 0.0], [1.0, -2.0, 0.5], [3.0, 3.0, -3.0]])
    q, s = quantize_rows(x)
    assert q.dtype == torch.int8 and s.shape == (3, 1)
    assert q[0].eq(0).all() and q[1].tolist() == [64, -127, 32] and q[2].tolist() == [127, 127, -127]
    assert torch.allclose(s[1:, 0], torch.tensor([2.0, 3.0]) / 127)


def test_channel_major_is_the_transposed_forward():
    lin = _layer(24, 3 * 24)
    q = quantize_int8(lin)
    x = torch.randn(2, 11, 24)
    cm = q.channel_major(x)
    assert cm.shape == (2, 72, 11)
    torch.testing.assert_close(cm, q(x).transpose(1, 2), rtol=0, atol=0)
    assert q.channel_major(x, torch.float64).dtype == torch.float64


def test_autocast_output_dtype_and_bf16_input():
    lin = _layer(16, 8)
    q = quantize_int8(lin)
    x = torch.randn(4, 16)
    with torch.autocast("cpu", torch.bfloat16):
        assert q(x).dtype == torch.bfloat16
    y = q(x.bfloat16())
    assert y.dtype == torch.bfloat16
    assert_close(y, int8_linear_ref(x.bfloat16(), lin.weight, lin.bias), torch.bfloat16, "bf16 input")


def test_copy_leaves_the_float_model_and_keeps_the_state_dict():
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    q = quantize_int8(model)
    assert [type(m) for m in model] == [nn.Linear, nn.GELU, nn.Linear]
    assert isinstance(q[0], Int8DynamicLinear) and isinstance(q[2], Int8DynamicLinear)
    assert list(q.state_dict()) == list(model.state_dict())
    assert all(p.requires_grad for p in model.parameters()) and not any(p.requires_grad for p in q.parameters())
    q(torch.randn(2, 8))  # runs without no_grad: the copy needs no gradients


def test_inference_only_and_cpu_only_errors():
    lin = _layer(8, 4)
    q = Int8DynamicLinear.from_float(lin)  # shares the float layer's weight, which requires grad
    with pytest.raises(RuntimeError, match="inference-only"):
        q(torch.randn(2, 8))  # the shared weight requires grad and autograd is on
    with torch.no_grad():
        q(torch.randn(2, 8))
    with pytest.raises(ValueError, match="takes 8"):
        with torch.no_grad():
            q(torch.randn(2, 7))
    with pytest.raises(TypeError, match="nn.Module"):
        quantize_int8(torch.randn(3))
    m = Int8DynamicLinear(4, 4, device="meta")
    with pytest.raises(RuntimeError, match="runs on the CPU"), torch.no_grad():
        m(torch.randn(2, 4, device="meta"))


def test_weights_changed_after_quantizing_are_quantized_again():
    lin = _layer(12, 6)
    q = quantize_int8(lin)
    x = torch.randn(5, 12)
    with torch.no_grad():
        q.weight.mul_(2)  # in place: the version counter moves
    assert_close(q(x), int8_linear_ref(x, q.weight, q.bias), torch.float32, "after an in-place change")
    new = _layer(12, 6, seed=3)
    q.load_state_dict(new.state_dict())
    assert_close(q(x), int8_linear_ref(x, new.weight, new.bias), torch.float32, "after load_state_dict")


def test_quantized_model_stays_close_and_lisa_uses_the_int8_qkv():
    model = create_model("lisanet_micro", num_classes=10).eval()
    q = quantize_int8(model)
    attn = [m for m in q.modules() if type(m).__name__ == "StructureAwareAttention"]
    assert attn and all(isinstance(a.qkv, Int8DynamicLinear) for a in attn)
    calls = []
    hook = type(attn[0].qkv).channel_major

    def spy(self, *a, **k):
        calls.append(1)
        return hook(self, *a, **k)

    x = torch.randn(2, 3, 40, 56)  # a non-square input
    try:
        type(attn[0].qkv).channel_major = spy
        with torch.inference_mode():
            y, ref = q(x), model(x)
    finally:
        type(attn[0].qkv).channel_major = hook
    assert len(calls) == len(attn)
    assert rel_rms(y, ref) < 0.1
