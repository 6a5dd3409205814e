"""Linear-angular attention (Castling-ViT, arXiv 2211.10526): keys-first core vs the dense float64 reference, the
module vs its reference on outputs and every gradient, the exact attention matrix, and errors."""

from __future__ import annotations

import math

import pytest
import torch

import subquad
from subquad.attention.functional.linear_angular import linear_angular, linear_angular_matrix, linear_angular_ref
from subquad.attention.linear_angular import LinearAngularAttention
from tests._tol import compare_fn, compare_module


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
# (N = 1 is degenerate: the output row is v / |v| whatever q and k are, so their gradients are rounding noise.)
@pytest.mark.parametrize("n,d,e", [(13, 5, 4), (2, 3, 3), (37, 8, 6)])
def test_core_fast_vs_ref(n, d, e, dtype):
    q, k, v = torch.randn(2, 3, n, d), torch.randn(2, 3, n, d), torch.randn(2, 3, n, e)
    compare_fn(linear_angular, linear_angular_ref, [q, k, v], dtype=dtype)


def test_core_is_the_taylor_form_of_the_angular_kernel():
    # A_ij = 1/2 [i == j] + cos(theta_ij) / pi, and x = A v is normalised row by row (the official form).
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 1, 6, 4, dtype=torch.float64), torch.randn(1, 1, 6, 4, dtype=torch.float64), \
        torch.randn(1, 1, 6, 3, dtype=torch.float64)
    cos = torch.nn.functional.cosine_similarity(q[0, 0, :, None], k[0, 0, None, :], dim=-1)
    a = 0.5 * torch.eye(6, dtype=torch.float64) + cos / math.pi
    torch.testing.assert_close(linear_angular_matrix(q, k)[0, 0], a)
    x = a @ v[0, 0]
    torch.testing.assert_close(linear_angular(q, k, v)[0, 0], x / x.norm(dim=-1, keepdim=True))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("n", [7, 50])
def test_module_fast_vs_ref_all_gradients(n, dtype):
    torch.manual_seed(1)
    m = LinearAngularAttention(24, num_heads=3, qkv_bias=True, res_kernel_size=5)
    torch.nn.init.normal_(m.dconv.weight)
    x = torch.randn(2, n, 24)
    compare_module(m, lambda mod, t: mod(t), lambda mod, t: mod.forward_ref(t), [x], dtype=dtype)


def test_attention_matrix_reproduces_the_output():
    torch.manual_seed(2)
    m = LinearAngularAttention(16, num_heads=2, res_kernel_size=3).double().eval()
    torch.nn.init.normal_(m.dconv.weight)
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    p = m.attention_matrix(x)
    assert p.shape == (2, 2, 11, 11)
    _, _, v = m._qkv(x)
    pre = (p @ v).transpose(1, 2).reshape(2, 11, 16)
    torch.testing.assert_close(m.proj(pre), m(x))


def test_official_parameter_names_and_shapes():
    m = subquad.build_attention("linear_angular", 32, 4)
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert shapes == {"qkv.weight": (96, 32), "dconv.weight": (4, 1, 9, 1), "proj.weight": (32, 32),
                      "proj.bias": (32,)}


def test_value_convolution_runs_along_tokens():
    # With a zero kernel matrix contribution removed (v = 0 except one token), the DWConv spreads that token's value
    # to its neighbours only within res_kernel_size // 2 positions.
    m = LinearAngularAttention(4, num_heads=1, res_kernel_size=3).double()
    with torch.no_grad():
        m.dconv.weight.fill_(1.0)
    v = torch.zeros(1, 1, 9, 4, dtype=torch.float64)
    v[0, 0, 4] = 1.0
    out = m.dconv(v)[0, 0, :, 0]
    assert out.nonzero().flatten().tolist() == [3, 4, 5]


@pytest.mark.parametrize("bad", [0, 4, -1, 2.0])
def test_bad_kernel_size(bad):
    with pytest.raises(ValueError, match="res_kernel_size"):
        LinearAngularAttention(8, num_heads=2, res_kernel_size=bad)


def test_refuses_masks_and_causal():
    m = LinearAngularAttention(8, num_heads=2)
    with pytest.raises(ValueError, match="mask"):
        m(torch.randn(1, 5, 8), mask=torch.ones(1, 5, dtype=torch.bool))
    assert subquad.attention.check(m.caps, subquad.attention.Request(causal=True))
