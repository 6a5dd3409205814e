"""L2ViT enhanced linear attention and LCM: fast vs dense reference, clamp regimes, precision, errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import subquad
from subquad.attention.enhanced_linear import EnhancedLinearAttention, LocalConcentrationModule
from subquad.attention.functional.linear import (
    enhanced_linear_attention_kv,
    enhanced_linear_attention_ref,
    linear_attention,
    linear_attention_ref,
)
from tests._tol import compare_fn, compare_module


def _qkv(B=2, h=3, N=37, d=8, scale=1.0, dtype=torch.float64):
    return [torch.randn(B, h, N, d, dtype=dtype) * scale for _ in range(3)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("scale", [0.3, 6.0], ids=["clamped", "unclamped"])
def test_functional_kv_vs_ref(dtype, scale):
    q, k, v = _qkv(scale=scale)
    temp = torch.rand(3, 1, 1) + 0.1
    compare_fn(enhanced_linear_attention_kv, enhanced_linear_attention_ref, [q, k, v, temp], dtype)


def test_regimes_really_differ():
    # The two scales above exercise both sides of the clamp (all rows clamped; almost all rows free).
    shares = []
    for scale in (0.3, 6.0):
        q, k, _ = _qkv(scale=scale)
        den = F.relu(q) @ F.relu(k).sum(-2, keepdim=True).transpose(-2, -1)
        shares.append((den < 100).double().mean().item())
    assert shares[0] == 1.0 and shares[1] < 0.1


def test_clamp_behaviour_exact():
    q, k, v = _qkv(N=11, scale=0.2)
    temp = torch.full((3, 1, 1), 0.5, dtype=torch.float64)
    out = enhanced_linear_attention_kv(q, k, v, temp)
    qr, kr = F.relu(q), F.relu(k)
    # Clamped regime: out = s * q (k^T v) / 100.
    torch.testing.assert_close(out, 0.5 * qr @ (kr.transpose(-2, -1) @ v) / 100.0)
    # clamp_min=0 is the plain ReLU linear attention (where no denominator is zero).
    out0 = enhanced_linear_attention_kv(q, k, v, temp, clamp_min=0.0)
    torch.testing.assert_close(out0, 0.5 * linear_attention(qr, kr, v, "sum"))
    # The clamp acts on the token sum, not the mean: repeating every key/value doubles the clamped output
    # (with a mean the output would not change).
    q2, k2, v2 = _qkv(N=9, scale=3.0)
    den1 = F.relu(q2) @ F.relu(k2).sum(-2, keepdim=True).transpose(-2, -1)
    kk, vv = torch.cat([k2, k2], -2), torch.cat([v2, v2], -2)
    out_a = enhanced_linear_attention_kv(q2, k2, v2, 1.0, clamp_min=float(den1.max()) * 2.5)
    out_b = enhanced_linear_attention_kv(q2, kk, vv, 1.0, clamp_min=float(den1.max()) * 2.5)
    torch.testing.assert_close(out_b, 2 * out_a)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_module_fast_vs_ref(dtype):
    m = EnhancedLinearAttention(24, 3)
    with torch.no_grad():
        m.temperature.uniform_(0.1, 1.0)
    x = torch.randn(3, 7 * 9, 24) * 4
    compare_module(m, lambda mm, x: mm(x, (7, 9)), lambda mm, x: mm.forward_ref(x, (7, 9)), [x], dtype)


def test_module_matches_official_formula():
    # The official forward written out step by step (kv first, clamp of the token sum, temperature on K^T V).
    m = EnhancedLinearAttention(16, 2).double()
    x = torch.randn(2, 13 * 5, 16, dtype=torch.float64) * 5
    B, N, C = x.shape
    qkv = m.qkv(x).reshape(B, N, 3, 2, 8).permute(2, 0, 3, 1, 4)
    q, k, v = F.relu(qkv[0]), F.relu(qkv[1]), qkv[2]
    denom = torch.clamp(q @ k.transpose(-2, -1).sum(dim=-1, keepdim=True), 1e2)
    attn = (q @ ((k.transpose(-2, -1) @ v) * m.temperature)) / denom
    want = m.proj(attn.transpose(1, 2).reshape(B, N, C))
    torch.testing.assert_close(m(x, (13, 5)), want, rtol=1e-12, atol=1e-12)


def test_attention_matrix_exact():
    m = EnhancedLinearAttention(16, 2).double()
    x = torch.randn(2, 20, 16, dtype=torch.float64) * 3
    a = m.attention_matrix(x)
    assert a.shape == (2, 2, 20, 20)
    q, k, v = m._qkv(x)
    torch.testing.assert_close(a @ v, enhanced_linear_attention_ref(q, k, v, m.temperature))


def test_gradcheck_tiny():
    q, k, v = (torch.randn(1, 2, 5, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    t = torch.rand(2, 1, 1, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: enhanced_linear_attention_kv(*a, clamp_min=1.0), (q, k, v, t))
    assert torch.autograd.gradcheck(lambda *a: enhanced_linear_attention_kv(*a, clamp_min=100.0), (q, k, v, t))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_large_inputs_finite(dtype):
    m = EnhancedLinearAttention(32, 4)
    x = torch.randn(1, 49, 32) * 300
    with torch.autocast("cpu", dtype=dtype):
        y = m(x)
    assert y.dtype == dtype and torch.isfinite(y).all()
    # A module cast to the low dtype as a whole: the core still runs in float32.
    y2 = m.to(dtype)(x.to(dtype))
    assert torch.isfinite(y2).all()
    ref = m.double().forward_ref(x.double())
    rel = (y2.double() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()
    assert rel < (5e-2 if dtype == torch.bfloat16 else 5e-3)


def test_generic_core_is_shared():
    # enhanced = the shared core with normaliser 'sum', clamp and kv_scale.
    q, k, v = _qkv(N=10)
    t = torch.rand(3, 1, 1, dtype=torch.float64)
    torch.testing.assert_close(enhanced_linear_attention_ref(q, k, v, t),
                               linear_attention_ref(F.relu(q), F.relu(k), v, "sum", 0.0, 100.0, t))


def test_registry_and_param_names():
    m = subquad.build_attention("enhanced_linear", 48, 6, input_size=(7, 7))
    names = {n for n, _ in m.named_parameters()}
    assert names == {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias", "temperature"}
    assert m.temperature.shape == (6, 1, 1)
    torch.testing.assert_close(m.temperature, torch.full((6, 1, 1), 8 ** -0.5))
    meta = subquad.build_attention("enhanced_linear", 48, 6, device="meta")
    assert meta.temperature.is_meta


def test_bad_inputs():
    with pytest.raises(ValueError, match="num_heads"):
        EnhancedLinearAttention(30, 4)
    with pytest.raises(ValueError, match="clamp_min"):
        EnhancedLinearAttention(32, 4, clamp_min=-1.0)
    m = EnhancedLinearAttention(32, 4)
    with pytest.raises(ValueError, match="channels"):
        m(torch.randn(1, 9, 16))


def test_lcm_forward_and_layout():
    lcm = LocalConcentrationModule(12, 7).eval()
    with torch.no_grad():
        lcm.bn.running_mean.uniform_(-1, 1)
        lcm.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 7 * 9, 12)
    y = lcm(x, (7, 9))
    xm = x.transpose(1, 2).reshape(2, 12, 7, 9)
    want = lcm.conv2(lcm.bn(F.gelu(lcm.conv1(xm)))).flatten(2).transpose(1, 2)
    torch.testing.assert_close(y, want)
    assert {n for n, _ in lcm.named_parameters()} == {
        "conv1.weight", "conv1.bias", "bn.weight", "bn.bias", "conv2.weight", "conv2.bias"}
    with pytest.raises(ValueError, match="hw"):
        lcm(x, (8, 8))
    with pytest.raises(ValueError, match="kernel_size"):
        LocalConcentrationModule(12, 4)


def test_lcm_equivalent_matrix_is_jacobian():
    lcm = LocalConcentrationModule(3, 3).double().eval()
    with torch.no_grad():
        lcm.bn.weight.uniform_(0.5, 2)
        lcm.bn.running_var.uniform_(0.5, 2)
    hw = (4, 5)
    x = torch.randn(1, 20, 3, dtype=torch.float64)
    jac = torch.autograd.functional.jacobian(lambda t: lcm(t, hw), x)  # (1, 20, 3, 1, 20, 3)
    for c in range(3):
        torch.testing.assert_close(lcm.equivalent_matrix(x, hw, channel=c)[0], jac[0, :, c, 0, :, c])
    mean = torch.stack([jac[0, :, c, 0, :, c] for c in range(3)]).mean(0)
    torch.testing.assert_close(lcm.equivalent_matrix(x, hw)[0], mean)
