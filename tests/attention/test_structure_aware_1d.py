"""LiSA on 1-D sequences: the FFT path vs the explicit Eq. 10 reference (outputs and every gradient) at odd lengths
and at lengths other than the stored one, the tie to the grid form on a 1 x L grid, the length rule and the refused
causal form."""

from __future__ import annotations

import pytest
import torch

import subquad
from subquad.attention.structure_aware import StructureAwareAttention, StructureAwareAttention1d
from subquad.errors import UserError
from tests._tol import assert_close, compare_module
from tests.attention._grid_hw import assert_refuses_grid_hw


def _module(**kw):
    kw.setdefault("D", 3)
    kw.setdefault("seq_len", 16)
    m = subquad.build_attention("structure_aware", 8, 2, **kw)
    with torch.no_grad():  # O(1) kernels, so the kernel paths contribute visibly to the output
        m.kernel_a.normal_(0, 1)
        m.kernel_b.normal_(0, 1)
    return m


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("L,boundary", [(16, "circular"), (13, "circular"), (37, "circular"), (5, "circular"),
                                        (16, "zero"), (23, "zero")])
def test_fft_equals_eq10_reference(L, boundary, dtype):
    m = _module(boundary=boundary)
    assert isinstance(m, StructureAwareAttention1d) and m.kernel_a.shape[-1] == (16 if boundary == "circular" else 31)
    x = torch.randn(2, L, 8)
    compare_module(m, lambda mm, t: mm(t), lambda mm, t: mm.forward_ref(t), [x], dtype)


def test_1d_form_is_the_grid_form_on_one_row():
    m1 = _module().double()
    m2 = subquad.build_attention("structure_aware", 8, 2, D=3, input_size=(1, 16), fft_dims="1d").double()
    assert isinstance(m2, StructureAwareAttention) and not isinstance(m2, StructureAwareAttention1d)
    m2.load_state_dict(m1.state_dict(), strict=True)
    x = torch.randn(2, 16, 8, dtype=torch.float64)
    assert_close(m1(x), m2(x, (1, 16)), name="1-D vs 1 x L grid")
    # and the 2-D FFT over a 1 x L grid is the same circulant
    m3 = subquad.build_attention("structure_aware", 8, 2, D=3, input_size=(1, 16)).double()
    m3.load_state_dict({k: v.reshape(m3.state_dict()[k].shape) for k, v in m1.state_dict().items()}, strict=True)
    assert_close(m1(x), m3(x, (1, 16)), name="1-D vs 2-D FFT on 1 x L")


def test_longer_sequences_keep_each_offset_weight():
    """'pad': at 2x the stored length the kernel keeps every stored offset and is 0 beyond them."""
    m = _module().double()
    ka = m.kernels((32,), torch.float64)[0]  # (C, D, 32)
    k0 = m.kernel_a.detach()
    for delta in range(-8, 8):
        torch.testing.assert_close(ka[..., delta % 32], k0[..., delta % 16])
    assert not ka[..., 8:24].any()  # offsets 8 .. 15 and -16 .. -9
    assert m(torch.randn(1, 64, 8, dtype=torch.float64)).shape == (1, 64, 8)


def test_forms_and_refusals():
    m = subquad.build_attention("structure_aware", 8, 2)
    assert m.seq_len == 512 and not m.caps.needs_hw and m.caps.sequence
    grid = subquad.build_attention("structure_aware", 8, 2, input_size=(4, 5))
    assert grid.caps.needs_hw and not grid.caps.sequence
    with pytest.raises(UserError, match="no causal form"):
        subquad.build_attention("structure_aware", 8, 2, causal=True)
    with pytest.raises(UserError, match="seq_len"):
        subquad.build_attention("structure_aware", 8, 2, seq_len=0)
    with pytest.raises(UserError, match="seq_len"):
        subquad.build_attention("structure_aware", 8, 2, input_size=(4, 5), seq_len=8)
    with pytest.raises(ValueError, match="unknown option"):
        subquad.build_attention("structure_aware", 8, 2, local_kernel=3)
    with pytest.raises(ValueError, match="num_prefix_tokens"):
        subquad.build_attention("structure_aware", 8, 2, num_prefix_tokens=1)
    a = _module().attention_matrix(torch.randn(1, 11, 8))
    assert a.shape == (1, 2, 11, 11)


def test_1d_form_refuses_a_grid_hw():
    """Built without input_size, the 1-D form cannot mix a 2-D grid: hw=(H, W) is refused in one line that names
    input_size (it used to be ignored, so every grid gave the same output); hw=None and hw=(L,) run as before."""
    m = _module()
    x = torch.randn(1, 117, 8)
    assert_refuses_grid_hw(m, x)
