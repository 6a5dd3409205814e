"""Registry-driven contract: every registered mechanism, with no per-mechanism code here."""

from __future__ import annotations

import pytest
import torch

import subquad
from subquad.attention import Request, check, get_attention_cls

NAMES = subquad.list_attention()
DIM, HEADS, HW = 32, 2, (5, 7)


def _build(name, **kw):
    return subquad.build_attention(name, DIM, HEADS, input_size=HW, **kw)


@pytest.mark.parametrize("name", NAMES)
def test_shape_grads_finite(name):
    m = _build(name).train()
    x = torch.randn(2, HW[0] * HW[1], DIM, requires_grad=True)
    y = m(x, HW)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert torch.isfinite(y).all()
    y.square().mean().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    missing = [n for n, p in m.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"{name}: no gradient reaches {missing}"
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", NAMES)
def test_batch_independence_and_determinism(name):
    m = _build(name).eval()
    hw = (6, 4)  # another non-square grid than input_size
    x = torch.randn(3, hw[0] * hw[1], DIM)
    with torch.no_grad():
        full = m(x, hw)
        single = m(x[1:2], hw)
        again = m(x, hw)
    torch.testing.assert_close(full[1:2], single, rtol=1e-4, atol=1e-5)
    assert torch.equal(full, again)


@pytest.mark.parametrize("name", NAMES)
def test_caps_declared(name):
    cls = get_attention_cls(name)
    caps = cls.caps
    assert caps.complexity.startswith("O(")
    assert check(caps, Request(causal=False)) == [] or not caps.bidirectional
    if not caps.causal:
        assert check(caps, Request(causal=True))


@pytest.mark.parametrize("name", NAMES)
def test_bad_input_clear_errors(name):
    with pytest.raises(ValueError, match="num_heads"):
        subquad.build_attention(name, 30, 4, input_size=HW)
    m = _build(name)
    if m.caps.needs_hw:
        with pytest.raises(ValueError, match="hw"):
            m(torch.randn(1, 35, DIM), (6, 7))


def test_unknown_mechanism_suggests():
    with pytest.raises(ValueError, match="softmax"):
        subquad.build_attention("softmx", 32, 2)
