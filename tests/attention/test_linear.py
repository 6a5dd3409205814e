"""Shared linear-attention core and the generic `linear` family: fast vs dense reference, feature-map properties,
masks, causal references, precision and errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import subquad
from subquad.attention.functional.linear import (
    FEATURE_MAPS,
    causal_linear_attention,
    causal_linear_attention_ref,
    feature_map,
    linear_attention,
    linear_attention_matrix,
    linear_attention_ref,
)
from subquad.attention.linear import LinearAttention
from tests._tol import compare_fn, compare_module

MAPS = sorted(FEATURE_MAPS)

CORE_CASES = {
    "sum_eps": dict(normaliser="sum", eps=1e-6),
    "mean_eps": dict(normaliser="mean", eps=1e-3),
    "none": dict(normaliser="none"),
    "clamp_scale": dict(normaliser="sum", clamp_min=3.0, scale=True),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
# order="qk" is the dense (Q K^T) V product, i.e. the reference itself: only the K-first path is compared.
@pytest.mark.parametrize("order", ["kv", "auto"])
@pytest.mark.parametrize("case", list(CORE_CASES))
def test_core_fast_vs_ref(case, order, dtype):
    kw = dict(CORE_CASES[case])
    scale = kw.pop("scale", False)
    q, k = torch.rand(2, 3, 13, 5), torch.rand(2, 3, 11, 5)
    v = torch.randn(2, 3, 11, 4)
    inputs = [q, k, v] + ([torch.rand(3, 1, 1) + 0.5] if scale else [])

    def fast(q, k, v, s=None):
        return linear_attention(q, k, v, kv_scale=s, order=order, **kw)

    def ref(q, k, v, s=None):
        return linear_attention_ref(q, k, v, kv_scale=s, **kw)

    compare_fn(fast, ref, inputs, dtype)


def test_core_auto_order_picks_cheaper(monkeypatch):
    import subquad.attention.functional.linear as lin

    calls = []
    real_ref = lin.linear_attention_ref
    monkeypatch.setattr(lin, "linear_attention_ref", lambda *a, **k: calls.append(1) or real_ref(*a, **k))
    # Few tokens, wide heads: (Q K^T) V is cheaper and gives the same result.
    q, k, v = torch.rand(1, 1, 3, 64, dtype=torch.float64), torch.rand(1, 1, 4, 64, dtype=torch.float64), \
        torch.randn(1, 1, 4, 64, dtype=torch.float64)
    torch.testing.assert_close(lin.linear_attention(q, k, v, order="auto"), lin.linear_attention(q, k, v, order="kv"))
    assert calls == [1], "auto must take the (Q K^T) V order for 3 queries x 4 keys x 64 channels"
    # Many tokens, narrow heads: K-first.
    q, k, v = (torch.rand(1, 1, 64, 4, dtype=torch.float64) for _ in range(3))
    lin.linear_attention(q, k, v, order="auto")
    assert calls == [1], "auto must take the K-first order for 64 tokens x 4 channels"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_causal_cumsum_vs_dense(dtype):
    q, k, v = torch.rand(2, 2, 9, 4), torch.rand(2, 2, 9, 4), torch.randn(2, 2, 9, 3)
    compare_fn(lambda *a: causal_linear_attention(*a, eps=1e-6), lambda *a: causal_linear_attention_ref(*a, eps=1e-6),
               [q, k, v], dtype)
    # No leak: the first outputs ignore later keys.
    out = causal_linear_attention(q, k, v)
    v2 = v.clone()
    v2[:, :, 5:] += 1
    assert torch.equal(out[:, :, :5], causal_linear_attention(q, k, v2)[:, :, :5])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", MAPS)
def test_module_fast_vs_ref_with_mask(name, dtype):
    m = subquad.build_attention(f"linear_{name}", 24, 3)
    if name == "leaky_relu":
        # Leaky-ReLU features can be negative, so q_i . sum_j k_j can approach 0 and the problem becomes
        # ill-conditioned; positive q/k biases keep the comparison about the implementation, not the conditioning.
        with torch.no_grad():
            m.qkv.bias[:48] = 1.0
    x = torch.randn(2, 5 * 7, 24) * 3
    mask = torch.rand(2, 35) > 0.3
    compare_module(m, lambda mm, x: mm(x, None, mask), lambda mm, x: mm.forward_ref(x, None, mask), [x], dtype)


@pytest.mark.parametrize("name", MAPS)
def test_gradcheck_tiny(name):
    q, k, v = (torch.randn(1, 1, 4, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))

    def fn(q, k, v):
        qf, kf = feature_map(name, q, k)
        normaliser = "none" if name in ("l1", "softmax", "hydra") else "sum"
        return linear_attention(qf, kf, v, normaliser, 1e-3 if name == "leaky_relu" else 1e-6)

    if name == "leaky_relu":
        # Keep the denominator away from 0 (leaky ReLU features can be negative).
        q, k = (t.detach().abs().requires_grad_(True) for t in (q, k))
    assert torch.autograd.gradcheck(fn, (q, k, v))


@pytest.mark.parametrize("name", ["l1", "cosformer"])
def test_mask_equals_truncation_for_token_normalised_maps(name):
    """SimA and cosFormer normalise over the token axis: padded tokens are left out, so real rows equal the
    unpadded run (queries and keys of padding never enter a norm or the length M)."""
    m = subquad.build_attention(f"linear_{name}", 16, 2).double().eval()
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[0, 8:] = False
    with torch.no_grad():
        out = m(x, None, mask)
        torch.testing.assert_close(out[:1, :8], m(x[:1, :8]))
        torch.testing.assert_close(out[1:], m(x[1:]))


@pytest.mark.parametrize("name", [n for n in MAPS if n not in ("cosformer", "l1")])
def test_mask_equals_dropping_keys(name):
    m = subquad.build_attention(f"linear_{name}", 16, 2).double().eval()
    x = torch.randn(1, 12, 16, dtype=torch.float64)
    mask = torch.ones(1, 12, dtype=torch.bool)
    mask[:, 8:] = False
    with torch.no_grad():
        q, k, v = m._qkv(x)
        if name == "hydra":
            ref = linear_attention(q, k[:, :, :8], v[:, :, :8], "none")
        else:
            qf, kf = feature_map(name, q, k[:, :, :8])
            normaliser = "none" if name == "softmax" else "sum"
            ref = linear_attention(qf, kf, v[:, :, :8], normaliser, m.eps)
        want = m.proj(ref.transpose(1, 2).reshape(1, 12, -1))
        torch.testing.assert_close(m(x, None, mask), want)


def test_feature_map_properties():
    q, k = torch.randn(2, 3, 7, 4, dtype=torch.float64), torch.randn(2, 3, 9, 4, dtype=torch.float64)
    # Efficient Attention: rows of phi(q) sum to 1, columns of phi(k) sum to 1 over tokens -> P rows sum to 1.
    qf, kf = feature_map("softmax", q, k)
    torch.testing.assert_close(linear_attention_matrix(qf, kf, "none").sum(-1), torch.ones(2, 3, 7, dtype=q.dtype))
    # SimA: each channel of phi(k) has unit L1 norm over tokens.
    _, kf = feature_map("l1", q, k)
    torch.testing.assert_close(kf.abs().sum(-2), torch.ones(2, 3, 4, dtype=q.dtype))
    # elu + 1 is positive; hydra rows have unit norm.
    assert (feature_map("elu1", q, k)[0] > 0).all()
    torch.testing.assert_close(feature_map("hydra", q, k)[0].norm(dim=-1), torch.ones(2, 3, 7, dtype=q.dtype))
    # cosFormer: phi(q_i).phi(k_j) = relu(q_i).relu(k_j) cos(pi/2 (i - j) / M), i, j = 1.. and M = max(N, n).
    qf, kf = feature_map("cosformer", q, k)
    i, j = torch.arange(1, 8, dtype=q.dtype)[:, None], torch.arange(1, 10, dtype=q.dtype)[None]
    want = (F.relu(q) @ F.relu(k).transpose(-2, -1)) * torch.cos(math.pi / 2 * (i - j) / 9)
    torch.testing.assert_close(qf @ kf.transpose(-2, -1), want)


@pytest.mark.parametrize("name", MAPS)
def test_attention_matrix_exact(name):
    m = subquad.build_attention("linear", 16, 2, feature_map=name).double()
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    a = m.attention_matrix(x)
    q, k, v = m._qkv(x)
    got = (a @ v).transpose(1, 2).reshape(2, 10, 16)
    torch.testing.assert_close(m.proj(got), m(x))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["relu", "elu1", "softmax", "cosformer"])
def test_low_precision_large_inputs_finite(name, dtype):
    m = subquad.build_attention(f"linear_{name}", 32, 4)
    x = torch.randn(1, 49, 32) * 1000
    with torch.autocast("cpu", dtype=dtype):
        y = m(x)
    assert torch.isfinite(y).all()
    assert torch.isfinite(m.to(dtype)(x.to(dtype))).all()


def test_registry_names_and_bad_inputs():
    names = subquad.list_attention("linear*")
    assert "linear" in names and all(f"linear_{n}" in names for n in MAPS)
    m = subquad.build_attention("linear_elu1", 32, 4)
    assert isinstance(m, LinearAttention) and m.feature_map == "elu1"
    assert {n for n, _ in m.named_parameters()} == {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"}
    with pytest.raises(ValueError, match="feature_map"):
        subquad.build_attention("linear", 32, 4, feature_map="gelu")
    with pytest.raises(ValueError, match="feature_map"):
        subquad.build_attention("linear_relu", 32, 4, feature_map="elu1")
    q = torch.rand(1, 2, 5, 4)
    with pytest.raises(ValueError, match="normaliser"):
        linear_attention(q, q, q, normaliser="max")
    with pytest.raises(ValueError, match="order"):
        linear_attention(q, q, q, order="vk")
    with pytest.raises(ValueError, match="incompatible"):
        linear_attention(q, q, torch.rand(1, 2, 6, 4))
    with pytest.raises(ValueError, match="mask"):
        m(torch.randn(2, 9, 32), mask=torch.ones(2, 8, dtype=torch.bool))


@pytest.mark.parametrize("name", MAPS)
def test_all_padding_sample_is_finite(name):
    m = subquad.build_attention(f"linear_{name}", 16, 2).eval()
    x = torch.randn(2, 9, 16)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1] = False
    with torch.no_grad():
        y = m(x, None, mask)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y[:1], m(x[:1]))


def test_incompatible_core_shapes_raise():
    q, k, v = torch.rand(2, 3, 5, 4), torch.rand(1, 3, 6, 4), torch.rand(1, 3, 6, 4)
    with pytest.raises(ValueError, match="incompatible"):
        linear_attention(q, k, v)
