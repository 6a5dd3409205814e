"""FLatten focused linear attention on 1-D sequences: the bidirectional and causal forms (conv1d DWC, no PE)
against their dense float64 reference on outputs and every gradient, at odd lengths; causality through the linear
part and the DWC; the tie to the grid operator."""

from __future__ import annotations

import pytest
import torch

import subquad
from subquad.attention import Request, check, get_attention_cls
from subquad.attention.focused_linear import FocusedLinearAttention, FocusedLinearAttention1d
from subquad.attention.functional.focused import (
    depthwise_conv_matrix_1d,
    focused_linear_attention_1d,
    focused_linear_attention_1d_ref,
    focused_linear_attention_ref,
)
from subquad.errors import UserError
from tests._tol import assert_close, compare_fn, compare_module
from tests.attention._grid_hw import assert_refuses_grid_hw


def _inputs(L: int, C: int = 12, d: int = 4, k: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, kk, v = (torch.randn(2, L, C, generator=g) for _ in range(3))
    scale = torch.randn(1, 1, C, generator=g) * 0.5
    w, b = torch.randn(d, 1, k, generator=g) * 0.3, torch.randn(d, generator=g)
    return [q, kk, v, scale, w, b]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("L,causal,normaliser,prefix,chunk", [
    (1, False, "mean", 0, 64), (7, False, "mean", 0, 64), (23, False, "sum", 1, 64), (37, True, "mean", 0, 8),
    (37, True, "sum", 0, 5), (40, True, "mean", 0, 64), (3, True, "mean", 0, 2)])
def test_functional_1d_vs_ref(L, causal, normaliser, prefix, chunk, dtype):
    kw = dict(num_heads=3, p=3.0, normaliser=normaliser, prefix=prefix, causal=causal, chunk_size=chunk)
    compare_fn(lambda *a: focused_linear_attention_1d(*a, **kw), lambda *a: focused_linear_attention_1d_ref(*a, **kw),
               _inputs(L, seed=L), dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_module_1d_vs_ref(causal, dtype):
    m = subquad.build_attention("focused_linear", 24, 3, causal=causal, chunk_size=8)
    assert isinstance(m, FocusedLinearAttention1d) and m.causal == causal
    with torch.no_grad():  # away from the zero init, so every parameter matters
        m.scale.normal_(0, 0.5)
    x = torch.randn(2, 29, 24)
    compare_module(m, lambda mm, t: mm(t), lambda mm, t: mm.forward_ref(t), [x], dtype)


def test_bidirectional_1d_is_the_grid_operator_on_a_one_row_grid():
    """On a 1 x L grid the official operator's k x k DWC reads only its middle kernel row (the others meet the zero
    padding): the 1-D form with that row is the same function."""
    q, k, v, scale, _, b = _inputs(19)
    w2 = torch.randn(4, 1, 5, 5, dtype=torch.float64)
    q, k, v, scale = (t.double() for t in (q, k, v, scale))
    grid = focused_linear_attention_ref(q, k, v, scale, w2, b.double(), hw=(1, 19), num_heads=3)
    seq = focused_linear_attention_1d(q, k, v, scale, w2[:, :, 2], b.double(), num_heads=3)
    assert_close(seq, grid, name="1-D form vs the grid operator on (1, L)")


def test_causal_mean_normaliser_is_the_prefix_mean():
    """The last token sees every key: its causal output is the bidirectional one (no DWC); the first token's is
    its own value (one key)."""
    q, k, v, scale, _, _ = (t.double() for t in _inputs(17))
    # positive q, k: every kernel value far above eps (a head whose ReLU features all vanish reads ~0 instead)
    q, k = q.abs() + 0.5, k.abs() + 0.5
    kw = dict(num_heads=3, normaliser="mean")
    bi = focused_linear_attention_1d(q, k, v, scale, None, **kw)
    ca = focused_linear_attention_1d(q, k, v, scale, None, causal=True, chunk_size=4, **kw)
    assert_close(ca[:, -1], bi[:, -1], name="last token")
    # one key: out_0 = v_0 a / (a + eps), eps = 1e-6 against a kernel value a of order 1
    torch.testing.assert_close(ca[:, 0], v[:, 0], rtol=0, atol=1e-5)
    assert not torch.allclose(ca[:, :-1], bi[:, :-1])


def test_causal_form_does_not_leak_the_future():
    m = subquad.build_attention("focused_linear", 16, 2, causal=True, chunk_size=4).double().eval()
    with torch.no_grad():
        m.scale.normal_(0, 0.5)
    x = torch.randn(2, 21, 16, dtype=torch.float64)
    for t in (0, 5, 11, 20):
        x2 = x.clone()
        x2[:, t] += 1.0
        y, y2 = m(x), m(x2)
        assert torch.equal(y[:, :t], y2[:, :t]), t
        assert not torch.allclose(y[:, t], y2[:, t])
    p = m.attention_matrix(x)
    assert p.shape == (2, 2, 21, 21) and not p.triu(1).any(), "weight on future tokens"


@pytest.mark.parametrize("causal", [False, True])
def test_dwc_padding_decides_what_a_value_reaches(causal):
    """Only v moves at t (q, k fixed): the linear part moves every output that sees t, the DWC t - 2 .. t + 2
    (same) or t .. t + 4 (causal, k = 5); with the causal padding nothing before t moves."""
    q, k, v, scale, w, b = (t.double() for t in _inputs(16))
    v2 = v.clone()
    v2[:, 9] += 1.0
    kw = dict(num_heads=3, causal=causal, chunk_size=4)
    conv = [focused_linear_attention_1d(q, k, vv, scale, w, b, **kw)
            - focused_linear_attention_1d(q, k, vv, scale, None, **kw) for vv in (v, v2)]
    moved = ((conv[1] - conv[0]).abs().amax(dim=(0, 2)) > 1e-12).nonzero().flatten().tolist()
    assert moved == (list(range(9, 14)) if causal else list(range(7, 12)))
    y, y2 = (focused_linear_attention_1d(q, k, vv, scale, w, b, **kw) for vv in (v, v2))
    assert torch.equal(y[:, :9], y2[:, :9]) == causal
    m = depthwise_conv_matrix_1d(w, 16, causal)
    assert (not m.triu(1).any()) == causal and m[0].count_nonzero() == (80 - 10 if causal else 80 - 6)


def test_forms_build_refuse_and_run_at_other_lengths():
    m = subquad.build_attention("focused_linear", 16, 2)
    assert isinstance(m, FocusedLinearAttention1d) and not m.causal
    for L in (8, 33, 130):
        assert m(torch.randn(1, L, 16)).shape == (1, L, 16)
    grid = subquad.build_attention("focused_linear", 16, 2, input_size=(3, 4))
    assert isinstance(grid, FocusedLinearAttention) and grid.caps.needs_hw and not grid.caps.sequence
    with pytest.raises(UserError, match="causal=True is a 1-D form"):
        subquad.build_attention("focused_linear", 16, 2, input_size=(3, 4), causal=True)
    with pytest.raises(UserError, match="num_prefix_tokens"):
        subquad.build_attention("focused_linear", 16, 2, causal=True, num_prefix_tokens=1)
    with pytest.raises(UserError, match="kernel_size"):
        subquad.build_attention("focused_linear", 16, 2, kernel_size=4)
    with pytest.raises(ValueError, match="sr_ratio"):
        subquad.build_attention("focused_linear", 16, 2, sr_ratio=2)
    caps = get_attention_cls("focused_linear").caps
    assert not check(caps, Request(sequence=True)) and not check(caps, Request(sequence=True, causal=True))
    assert check(subquad.build_attention("focused_linear", 16, 2, causal=True).caps, Request()) == ["is causal only"]
    assert {n for n, _ in m.named_parameters()} == {"qkv.weight", "qkv.bias", "scale", "dwc.weight", "dwc.bias",
                                                    "proj.weight", "proj.bias"}


@pytest.mark.parametrize("causal", [False, True])
def test_1d_form_refuses_a_grid_hw(causal):
    """Built without input_size, the 1-D form cannot mix a 2-D grid: hw=(H, W) is refused in one line that names
    input_size (it used to be ignored, so every grid gave the same output); hw=None and hw=(L,) run as before."""
    m = subquad.build_attention("focused_linear", 16, 2, causal=causal)
    x = torch.randn(1, 117, 16)
    assert_refuses_grid_hw(m, x)
