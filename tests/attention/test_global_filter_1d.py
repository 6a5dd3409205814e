"""The global filter over 1-D sequences: rfft fast path vs the dense circulant reference (outputs and gradients,
odd lengths, resized filters), the resize rule at 2x / 4x the stored length, the tie to the grid form, and the
refused causal form."""

from __future__ import annotations

import pytest
import torch

import subquad
from subquad.attention.functional.global_filter import global_filter_1d_fft, global_filter_fft
from subquad.attention.global_filter import GlobalFilter, GlobalFilter1d
from subquad.errors import UserError
from tests._tol import assert_close, compare_module
from tests.attention._grid_hw import assert_refuses_grid_hw


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("L", [1, 15, 16, 17, 32, 64, 41])
def test_fft_equals_dense_circulant(L, dtype):
    """Output, input and filter gradients; lengths other than seq_len (16) exercise the resampled filter."""
    m = subquad.build_attention("global_filter", 8, 2, seq_len=16)
    assert isinstance(m, GlobalFilter1d)
    x = torch.randn(2, L, 8)
    compare_module(m, lambda mm, t: mm(t), lambda mm, t: mm.forward_ref(t), [x], dtype)


def test_is_a_circular_convolution_with_the_impulse_response():
    m = subquad.build_attention("global_filter", 4, 1, seq_len=12).double()
    x = torch.randn(2, 12, 4, dtype=torch.float64)
    k = torch.fft.irfft(torch.view_as_complex(m.complex_weight.detach().contiguous()).T, n=12)  # (C, L)
    expect = sum(k[:, s] * torch.roll(x, s, 1) for s in range(12))
    assert_close(m(x), expect, name="roll-sum convolution")


def test_resize_keeps_every_stored_bin_at_2x_and_4x():
    m = subquad.build_attention("global_filter", 6, 1, seq_len=20)
    w = m.complex_weight.detach()
    assert m.filter_for(20) is m.complex_weight and m.filter_for(21) is m.complex_weight  # same bins
    for f in (2, 4):
        r = m.filter_for(20 * f).detach()
        assert r.shape == (10 * f + 1, 6, 2)
        torch.testing.assert_close(r[::f], w, rtol=1e-6, atol=1e-7)
        # between stored bins: the linear interpolation of its neighbours
        torch.testing.assert_close(r[f // 2::f], (w[:-1] + w[1:]) / 2, rtol=1e-6, atol=1e-7)
    x = torch.randn(1, 80, 6)
    assert m(x).shape == (1, 80, 6)


def test_1d_form_is_the_grid_form_on_one_row():
    x = torch.randn(2, 13, 5, dtype=torch.float64)
    w = torch.randn(7, 5, 2, dtype=torch.float64)
    assert_close(global_filter_1d_fft(x, w), global_filter_fft(x, w[None], (1, 13)), name="1-D vs (1, L) grid")


def test_forms_and_refusals():
    grid = subquad.build_attention("global_filter", 8, 2, input_size=(3, 5))
    assert isinstance(grid, GlobalFilter) and grid.caps.needs_hw and not grid.caps.sequence
    m = subquad.build_attention("global_filter", 8, 2)
    assert m.seq_len == 512 and m.complex_weight.shape == (257, 8, 2) and not m.caps.needs_hw
    with pytest.raises(UserError, match="no causal form"):
        subquad.build_attention("global_filter", 8, 2, causal=True)
    with pytest.raises(UserError, match="seq_len"):
        subquad.build_attention("global_filter", 8, 2, seq_len=0)
    with pytest.raises(UserError, match="seq_len"):
        subquad.build_attention("global_filter", 8, 2, input_size=(3, 5), seq_len=16)
    with pytest.raises(ValueError, match="num_heads"):
        subquad.build_attention("global_filter", 6, 4)
    a = m.attention_matrix(torch.randn(1, 9, 8))
    assert a.shape == (1, 2, 9, 9)


def test_1d_form_refuses_a_grid_hw():
    """Built without input_size, the 1-D form cannot filter a 2-D grid: hw=(H, W) is refused in one line that names
    input_size (it used to be ignored, so every grid gave the same output); hw=None and hw=(L,) run as before."""
    m = subquad.build_attention("global_filter", 8, 2, seq_len=16)
    x = torch.randn(1, 117, 8)
    assert_refuses_grid_hw(m, x)
