"""GFNet-style global filter: rfft2 fast path vs the dense circulant reference, resizing, errors."""

from __future__ import annotations

import pytest
import torch

import subquad
from subquad.attention.functional.global_filter import global_filter_kernel
from tests._tol import assert_close, compare_module


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("hw", [(5, 7), (6, 6), (6, 4)])
def test_fft_equals_dense_circulant(hw, dtype):
    """Output, input and filter gradients; (6, 4) also exercises the frequency-grid resampling."""
    m = subquad.build_attention("global_filter", 8, 2, input_size=(5, 7))
    x = torch.randn(2, hw[0] * hw[1], 8)
    compare_module(m, lambda m, x: m(x, hw), lambda m, x: m.forward_ref(x, hw), [x], dtype)


def test_is_a_circular_convolution_with_the_impulse_response():
    m = subquad.build_attention("global_filter", 4, 1, input_size=(4, 5)).double()
    x = torch.randn(1, 20, 4, dtype=torch.float64)
    k = global_filter_kernel(m.complex_weight, (4, 5))  # (C, H, W)
    xm = x.transpose(1, 2).reshape(1, 4, 4, 5)
    expect = torch.zeros_like(xm)
    for dy in range(4):
        for dx in range(5):
            expect += k[None, :, dy, dx, None, None] * torch.roll(xm, (dy, dx), (-2, -1))
    assert_close(m(x, (4, 5)), expect.flatten(2).transpose(1, 2), torch.float64, "roll-sum convolution")


def test_attention_matrix_and_errors():
    """With one filter shared by the channels of the head, attention_matrix @ x equals the forward."""
    m = subquad.build_attention("global_filter", 4, 1, input_size=(4, 5)).double()
    with torch.no_grad():
        m.complex_weight.copy_(m.complex_weight[:, :, :1].expand_as(m.complex_weight))
    x = torch.randn(2, 20, 4, dtype=torch.float64)
    a = m.attention_matrix(x, (4, 5))
    assert a.shape == (2, 1, 20, 20)
    assert_close(a[:, 0] @ x, m(x, (4, 5)), torch.float64, "attention_matrix @ x")
    with pytest.raises(ValueError, match="hw"):
        m(x, (5, 5))
    with pytest.raises(ValueError, match="num_heads"):
        subquad.build_attention("global_filter", 6, 4)
