"""The causal forms a language model needs: chunked causal linear attention, causal sliding-window softmax and the
causal long-short attention without DualLN, each against its plain float64 reference (outputs and all gradients)
at odd lengths."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import subquad
from subquad.attention import Request, check, get_attention_cls
from subquad.attention.functional.linear import (
    causal_linear_attention_chunked,
    causal_linear_attention_ref,
    feature_map,
)
from subquad.attention.functional.softmax import (
    sliding_window_attention,
    sliding_window_attention_ref,
    softmax_attention_ref,
)
from tests._tol import assert_close, compare_fn, compare_module


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("n,chunk", [(1, 4), (7, 64), (37, 8), (37, 5), (40, 8)])
def test_chunked_causal_linear_vs_ref(n, chunk, dtype):
    g = torch.Generator().manual_seed(n * 100 + chunk)
    q, k = (torch.randn(2, 3, n, 5, generator=g) for _ in range(2))
    qf, kf = feature_map("elu1", q, k)
    v = torch.randn(2, 3, n, 6, generator=g)
    # eps comparable to the kernel sums: with a tiny eps a one-token prefix gives out = v (1 - O(eps)), whose
    # q/k gradients are O(eps) and all cancellation
    compare_fn(lambda a, b, c: causal_linear_attention_chunked(a, b, c, eps=0.5, chunk_size=chunk),
               lambda a, b, c: causal_linear_attention_ref(a, b, c, eps=0.5), [qf, kf, v], dtype)


def test_chunked_causal_linear_no_leak():
    q, k, v = torch.rand(1, 2, 23, 4), torch.rand(1, 2, 23, 4), torch.randn(1, 2, 23, 3)
    out = causal_linear_attention_chunked(q, k, v, chunk_size=4)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 13:] += 1
    v2[:, :, 13:] -= 2
    out2 = causal_linear_attention_chunked(q, k2, v2, chunk_size=4)
    assert torch.equal(out[:, :, :13], out2[:, :, :13])
    assert not torch.allclose(out[:, :, 13:], out2[:, :, 13:])
    with pytest.raises(ValueError, match="chunk_size"):
        causal_linear_attention_chunked(q, k, v, chunk_size=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["linear_elu1", "linear_relu"])
def test_causal_linear_module_vs_ref(name, dtype):
    m = subquad.build_attention(name, 24, 3, causal=True, chunk_size=8)
    if name == "linear_relu":
        # ReLU features may vanish for a whole prefix (0 / eps); positive biases keep the test about the
        # implementation, not about that conditioning.
        with torch.no_grad():
            m.qkv.bias[:48] = 1.0
    x = torch.randn(2, 29, 24)
    compare_module(m, lambda mm, t: mm(t), lambda mm, t: mm.forward_ref(t), [x], dtype)


def test_causal_linear_module_is_causal_and_refuses_what_it_cannot_do():
    m = subquad.build_attention("linear_elu1", 16, 2, causal=True, chunk_size=4).double().eval()
    x = torch.randn(1, 19, 16, dtype=torch.float64)
    x2 = x.clone()
    x2[:, 11] += 1
    y, y2 = m(x), m(x2)
    assert torch.equal(y[:, :11], y2[:, :11]) and not torch.allclose(y[:, 11:], y2[:, 11:])
    # the module's own float64 formula: out_t = sum_{j<=t} (phi(q_t).phi(k_j)) v_j / (sum_{j<=t} phi(q_t).phi(k_j))
    q, k, v = m._qkv(x)
    qf, kf = nn.functional.elu(q) + 1, nn.functional.elu(k) + 1
    a = torch.einsum("bhtd,bhjd->bhtj", qf, kf) * torch.ones(19, 19, dtype=torch.float64).tril()
    o = torch.einsum("bhtj,bhjd->bhtd", a / (a.sum(-1, keepdim=True) + m.eps), v)
    assert_close(y, m.proj(o.transpose(1, 2).reshape(1, 19, 16)), name="causal elu1 vs explicit formula")
    p = m.attention_matrix(x)
    assert not p.triu(1).any(), "weight on future keys"
    assert_close(p @ v, o, name="attention_matrix @ v")
    with pytest.raises(ValueError, match="masks"):
        m(x, mask=torch.ones(1, 19, dtype=torch.bool))
    with pytest.raises(ValueError, match="no causal form"):
        subquad.build_attention("linear_l1", 16, 2, causal=True)
    assert get_attention_cls("linear_elu1").caps.causal and not get_attention_cls("linear_cosformer").caps.causal
    assert check(m.caps, Request(causal=False)) == ["is causal only"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("n,w,block", [(1, 3, None), (5, 1, None), (37, 3, None), (37, 8, 5), (50, 16, None),
                                       (23, 64, None)])
def test_sliding_window_vs_ref(n, w, block, dtype):
    g = torch.Generator().manual_seed(n * 100 + w)
    q, k, v = torch.randn(2, 3, n, 4, generator=g), torch.randn(2, 3, n, 4, generator=g), \
        torch.randn(2, 3, n, 5, generator=g)
    compare_fn(lambda a, b, c: sliding_window_attention(a, b, c, w, 0.4, block),
               lambda a, b, c: sliding_window_attention_ref(a, b, c, w, 0.4), [q, k, v], dtype)


def test_sliding_window_reference_is_the_band():
    q, k, v = (torch.randn(1, 2, 13, 4, dtype=torch.float64) for _ in range(3))
    # w >= T: full causal softmax; w = 1: each token reads its own value
    full = softmax_attention_ref(q, k, v, None, torch.ones(13, 13, dtype=torch.bool).tril())
    assert_close(sliding_window_attention(q, k, v, 13), full, name="w = T")
    assert_close(sliding_window_attention(q, k, v, 40), full, name="w > T")
    assert_close(sliding_window_attention(q, k, v, 1), v, name="w = 1")


def test_sliding_window_module():
    m = subquad.build_attention("sliding_window", 24, 3, causal=True, window_size=6)
    x = torch.randn(2, 31, 24)
    for dtype in (torch.float64, torch.float32):
        compare_module(m, lambda mm, t: mm(t), lambda mm, t: mm.forward_ref(t), [x], dtype)
    md = m.double().eval()
    xd = x.double()
    x2 = xd.clone()
    x2[:, 10] += 1
    changed = (md(xd) - md(x2)).abs().amax(dim=(0, 2)) > 0
    assert changed.nonzero().flatten().tolist() == list(range(10, 16))  # only t = 10 ... 10 + w - 1
    p = md.attention_matrix(xd)
    assert_close(p.sum(-1), torch.ones(2, 3, 31, dtype=torch.float64), name="rows sum to 1")
    with pytest.raises(ValueError, match="causal only"):
        subquad.build_attention("sliding_window", 24, 3, causal=False)
    with pytest.raises(ValueError, match="window_size"):
        subquad.build_attention("sliding_window", 24, 3, window_size=0)


def test_causal_long_short_without_dual_ln():
    kw = dict(window_size=5, chunk_size=3, rank=2, causal=True)
    torch.manual_seed(0)
    on = subquad.build_attention("long_short", 16, 2, **kw).double()
    off = subquad.build_attention("long_short", 16, 2, dual_ln=False, **kw).double()
    assert not any("dual_ln" in k for k in off.state_dict())
    off.load_state_dict({k: v for k, v in on.state_dict().items() if "dual_ln" not in k}, strict=True)
    x = torch.randn(2, 17, 16, dtype=torch.float64)
    assert not torch.allclose(on(x), off(x))
    on.dual_ln_win, on.dual_ln_dproj = nn.Identity(), nn.Identity()
    assert_close(off(x), on(x), name="no-DualLN = DualLN with identity norms")
    # dconv_1.bias only shifts a softmax over each chunk: its gradient is zero in exact arithmetic (rounding noise
    # is not compared), as in test_long_short.py
    off.dconv_1.bias.requires_grad_(False)
    for dtype in (torch.float64, torch.float32):
        compare_module(off, lambda mm, t: mm(t), lambda mm, t: mm.forward_ref(t), [x], dtype)
    # decoding in blocks equals the parallel pass without DualLN too
    with torch.no_grad():
        cache = off.init_cache(2)
        out = torch.cat([off(x[:, i:i + 4], cache=cache) for i in range(0, 17, 4)], dim=1)
    assert_close(out, off(x), name="no-DualLN cached decoding")
    assert off.caps.relative_positions and not get_attention_cls("softmax").caps.relative_positions
