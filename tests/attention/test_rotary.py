"""Rotary position embedding: fast form vs the explicit rotation matrices, relative-position invariance, and the
`rope` option of softmax attention (module vs its reference on outputs and every gradient, the host's positions)."""

from __future__ import annotations

import pytest
import torch

import subquad
from subquad.attention.functional.rotary import rotary, rotary_ref
from subquad.attention.softmax import MultiHeadAttention as SoftmaxAttention
from tests._tol import compare_fn, compare_module


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("n,d", [(1, 2), (13, 6), (40, 16)])
def test_fast_vs_rotation_matrices(n, d, dtype):
    compare_fn(rotary, rotary_ref, [torch.randn(2, 3, n, d)], dtype=dtype)


def test_scores_depend_on_relative_position_only():
    torch.manual_seed(0)
    d, n = 8, 12
    q1, k1 = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    # the same query/key vectors placed at every position: score(s, t) must depend on s - t only
    q, k = rotary(q1.expand(n, d).clone()), rotary(k1.expand(n, d).clone())
    s = q @ k.T
    for off in range(-n + 1, n):
        diag = torch.diagonal(s, off)
        torch.testing.assert_close(diag, diag[:1].expand_as(diag))
    # and it is not position-blind
    assert not torch.allclose(torch.diagonal(s, 0)[0], torch.diagonal(s, 3)[0])


def test_odd_head_dim_refused():
    with pytest.raises(ValueError, match="even head dim"):
        rotary(torch.randn(1, 4, 5))
    with pytest.raises(ValueError, match="rope=True"):
        SoftmaxAttention(15, num_heads=3, rope=True)
    with pytest.raises(ValueError, match="rope=True"):
        SoftmaxAttention(16, num_heads=2, rope=True, sr_ratio=2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_softmax_rope_fast_vs_ref_all_gradients(causal, dtype):
    torch.manual_seed(1)
    m = SoftmaxAttention(24, num_heads=2, rope=True, causal=causal)
    x = torch.randn(2, 17, 24)
    compare_module(m, lambda mod, t: mod(t), lambda mod, t: mod.forward_ref(t), [x], dtype=dtype)


def test_rope_marks_relative_positions_and_the_lm_adds_none():
    m = subquad.build_attention("softmax", 16, 2, rope=True, causal=True)
    assert m.caps.relative_positions and not SoftmaxAttention.caps.relative_positions
    from subquad.sequence import CharLM

    assert CharLM(256, 16, 1, 2, attention="softmax", rope=True).pos_embed == "none"
    assert CharLM(256, 16, 1, 2, attention="softmax").pos_embed == "sinusoid"


def test_rope_changes_nothing_when_off():
    torch.manual_seed(2)
    a = SoftmaxAttention(16, num_heads=2)
    b = SoftmaxAttention(16, num_heads=2, rope=False)
    b.load_state_dict(a.state_dict())
    x = torch.randn(1, 9, 16)
    assert torch.equal(a(x), b(x))
