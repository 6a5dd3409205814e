"""MLLA attention (arXiv 2405.16605): the 2-D RoPE, the keys-first core and the module against their dense float64
references on outputs and every gradient (odd and non-square grids), the attention matrix, and errors."""

from __future__ import annotations

import pytest
import torch

import subquad
from subquad.attention.functional.mlla import (
    lepe_ref,
    mlla_attention,
    mlla_attention_ref,
    rope_2d,
    rope_2d_angles,
    rope_2d_ref,
)
from subquad.attention.mlla import MllaAttention
from subquad.errors import UserError
from tests._tol import compare_fn, compare_module

GRIDS = [(3, 5), (7, 4), (1, 6), (5, 5)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("hw", GRIDS)
def test_rope_fast_vs_ref(hw, dtype):
    x = torch.randn(2, hw[0] * hw[1], 12)
    compare_fn(lambda t: rope_2d(t, hw), lambda t: rope_2d_ref(t, hw), [x], dtype=dtype)


def test_rope_angles_follow_the_official_layout():
    # Pair m < C/4 turns by row * theta_m, pair m >= C/4 by col * theta_(m - C/4), theta_k = 10000^(-k / (C/4)).
    C, hw = 16, (3, 4)
    ang = rope_2d_angles(hw, C, dtype=torch.float64).reshape(3, 4, C // 2)
    theta = 10000.0 ** (-torch.arange(C // 4, dtype=torch.float64) / (C // 4))
    for i in range(3):
        for j in range(4):
            torch.testing.assert_close(ang[i, j], torch.cat([i * theta, j * theta]))
    # As complex numbers: the interleaved pairs (2m, 2m + 1) times exp(i * angle).
    x = torch.randn(1, 12, C, dtype=torch.float64)
    z = torch.view_as_complex(x.reshape(1, 12, C // 2, 2)) * torch.polar(torch.ones_like(ang), ang).reshape(12, -1)
    torch.testing.assert_close(rope_2d(x, hw), torch.view_as_real(z).reshape(1, 12, C))


def test_rope_scores_depend_on_the_offset_only():
    C, hw = 8, (6, 7)
    q, k = torch.randn(C, dtype=torch.float64), torch.randn(C, dtype=torch.float64)
    rq = rope_2d(q.expand(1, 42, C), hw)[0].reshape(6, 7, C)
    rk = rope_2d(k.expand(1, 42, C), hw)[0].reshape(6, 7, C)
    s1 = rq[1, 2] @ rk[3, 6]
    s2 = rq[2, 0] @ rk[4, 4]  # the same (2, 4) offset
    torch.testing.assert_close(s1, s2)


def test_lepe_ref_is_a_depthwise_convolution():
    v, w, b = torch.randn(2, 15, 6, dtype=torch.float64), torch.randn(6, 1, 3, 3, dtype=torch.float64), \
        torch.randn(6, dtype=torch.float64)
    conv = torch.nn.functional.conv2d(v.transpose(1, 2).reshape(2, 6, 3, 5), w, b, padding=1, groups=6)
    torch.testing.assert_close(lepe_ref(v, (3, 5), w, b), conv.flatten(2).transpose(1, 2))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("hw,C,h", [((3, 5), 12, 3), ((7, 4), 8, 1), ((1, 6), 16, 2), ((5, 5), 12, 2)])
def test_core_fast_vs_ref(hw, C, h, dtype):
    N = hw[0] * hw[1]
    q, k, v = torch.randn(2, N, C), torch.randn(2, N, C), torch.randn(2, N, C)
    w, b = torch.randn(C, 1, 3, 3), torch.randn(C)

    def fast(q, k, v, w, b):
        return mlla_attention(q, k, v, w, b, hw, h)

    def ref(q, k, v, w, b):
        return mlla_attention_ref(q, k, v, w, b, hw, h)

    compare_fn(fast, ref, [q, k, v, w, b], dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("hw", [(3, 5), (4, 4), (6, 1)])
def test_module_fast_vs_ref_all_gradients(hw, dtype):
    torch.manual_seed(1)
    m = MllaAttention(24, num_heads=3, input_size=(4, 4))
    torch.nn.init.normal_(m.qk.weight, std=0.3)
    x = torch.randn(2, hw[0] * hw[1], 24)
    compare_module(m, lambda mod, t: mod(t, hw), lambda mod, t: mod.forward_ref(t, hw), [x], dtype=dtype)


def test_denominator_is_unrotated_and_numerator_rotated():
    # With hw = (1, 1) nothing rotates; moving a token changes the numerator through RoPE but never the
    # denominator, which is phi(q_i) . mean_j phi(k_j): check both against an explicit loop on a 2 x 3 grid.
    torch.manual_seed(3)
    C, hw, N = 8, (2, 3), 6
    q, k, v = (torch.randn(1, N, C, dtype=torch.float64) for _ in range(3))
    w, b = torch.zeros(C, 1, 3, 3, dtype=torch.float64), torch.zeros(C, dtype=torch.float64)
    out = mlla_attention(q, k, v, w, b, hw, 1)
    pq, pk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    rq, rk = rope_2d_ref(pq, hw), rope_2d_ref(pk, hw)
    for i in range(N):
        num = sum((rq[0, i] @ rk[0, j]) * v[0, j] for j in range(N)) / N
        den = pq[0, i] @ pk[0].mean(0) + 1e-6
        torch.testing.assert_close(out[0, i], num / den)


def test_attention_matrix_reproduces_the_output():
    torch.manual_seed(2)
    m = MllaAttention(16, num_heads=2).double().eval()
    with torch.no_grad():  # one LePE filter per head: the band matrix is then exact
        m.lepe.weight.copy_(torch.randn(2, 1, 1, 3, 3).expand(2, 8, 1, 3, 3).reshape(16, 1, 3, 3))
    hw = (3, 4)
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    p = m.attention_matrix(x, hw)
    assert p.shape == (2, 2, 12, 12)
    xh = x.reshape(2, 12, 2, 8).transpose(1, 2)
    pre = (p @ xh).transpose(1, 2).reshape(2, 12, 16) + m.lepe.bias
    torch.testing.assert_close(pre, m(x, hw))


def test_official_parameter_names_and_shapes():
    m = subquad.build_attention("mlla", 32, 4, input_size=(7, 7))
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert shapes == {"qk.weight": (64, 32), "qk.bias": (64,), "lepe.weight": (32, 1, 3, 3), "lepe.bias": (32,)}


def test_any_grid_after_construction():
    m = MllaAttention(16, num_heads=2, input_size=(7, 7)).eval()
    for hw in ((7, 7), (3, 9), (10, 2)):
        y = m(torch.randn(1, hw[0] * hw[1], 16), hw)
        assert y.shape == (1, hw[0] * hw[1], 16) and torch.isfinite(y).all()


def test_errors_and_caps():
    with pytest.raises(UserError, match="multiple of 4"):
        MllaAttention(18, num_heads=3)
    with pytest.raises(ValueError, match="num_heads"):
        MllaAttention(16, num_heads=3)
    m = MllaAttention(8, num_heads=2)
    with pytest.raises(ValueError, match="mask"):
        m(torch.randn(1, 6, 8), (2, 3), mask=torch.ones(1, 6, dtype=torch.bool))
    with pytest.raises(ValueError):
        m(torch.randn(1, 6, 8), (2, 2))
    caps = subquad.attention.get_attention_cls("mlla").caps
    assert caps.needs_hw and not caps.sequence and not caps.causal
    assert subquad.attention.check(caps, subquad.attention.Request(sequence=True))
    assert subquad.attention.check(caps, subquad.attention.Request(causal=True))
