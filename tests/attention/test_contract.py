"""Registry-driven contract: every registered mechanism, with no per-mechanism code here."""

from __future__ import annotations

import pytest
import torch

import subquad
from subquad.attention import get_attention_cls

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


def _changed(m, x: torch.Tensor, hw, at, mask=None) -> torch.Tensor:
    """Which outputs (per token, any channel or batch) change when the tokens at `at` move."""
    x2 = x.clone()
    x2[:, at] += 1.0
    with torch.no_grad():
        return (m(x, hw, mask) - m(x2, hw, mask)).abs().amax(dim=(0, 2)) > 1e-6


def _caps_mismatches(name: str) -> list[str]:
    """Where the declared `caps` of `name` disagree with what its module does (empty: they agree).

    Each capability is checked by running the mechanism: `bidirectional` (the last token moves an earlier output),
    `needs_hw` (hw=None refused), `supports_mask` (a mask is taken, and a masked key moves no other output; else it
    is refused), `sequence` (runs on a 1-D sequence of another length, built without a grid; else fails), `causal`
    (builds with causal=True, and no output moves with a later token; else refused), `grid_ndims` (3 in it: runs on
    a (T, H, W) grid) and the floating `dtypes` float64 / bfloat16 (outputs in that dtype, finite)."""
    caps, bad = get_attention_cls(name).caps, []
    if not caps.complexity.startswith("O("):
        bad.append(f"complexity {caps.complexity!r} is not O(...)")
    m = _build(name).eval()
    x = torch.randn(2, HW[0] * HW[1], DIM)
    if bool(_changed(m, x, HW, -1)[:-1].any()) != caps.bidirectional:
        bad.append(f"bidirectional={caps.bidirectional}, but the last token does "
                   f"{'not ' if caps.bidirectional else ''}move an earlier output")
    try:
        with torch.no_grad():
            m(x, None)
        runs = True
    except Exception:  # noqa: BLE001 - any refusal (a module that declares no grid but needs one crashes)
        runs = False
    if runs == caps.needs_hw:
        bad.append(f"needs_hw={caps.needs_hw}, but hw=None {'runs' if runs else 'is refused'}")
    mask = torch.ones(2, x.shape[1], dtype=torch.bool)
    mask[:, -1] = False
    try:
        moved = _changed(m, x, HW, -1, mask)
        takes = True
    except Exception:  # noqa: BLE001 - any refusal
        takes = False
    if takes != caps.supports_mask:
        bad.append(f"supports_mask={caps.supports_mask}, but a mask is {'taken' if takes else 'refused'}")
    elif takes and moved[:-1].any():
        bad.append("a masked key moves other outputs")
    try:
        with torch.no_grad():
            y = subquad.build_attention(name, DIM, HEADS).eval()(torch.randn(2, 13, DIM), None)
        seq = y.shape == (2, 13, DIM)
    except Exception:  # noqa: BLE001 - any refusal
        seq = False
    if seq != caps.sequence:
        bad.append(f"sequence={caps.sequence}, but a 1-D sequence {'runs' if seq else 'fails'}")
    try:
        mc = subquad.build_attention(name, DIM, HEADS, causal=True).eval()
    except (ValueError, TypeError):
        mc = None
    if (mc is not None) != caps.causal:
        bad.append(f"causal={caps.causal}, but causal=True is {'taken' if mc is not None else 'refused'}")
    elif mc is not None and _changed(mc, torch.randn(2, 13, DIM), None, slice(7, None))[:7].any():
        bad.append("causal=True, but an output moves with a later token")
    if 3 in caps.grid_ndims:
        try:
            with torch.no_grad():
                y = subquad.build_attention(name, DIM, HEADS, input_size=(2, 3, 4)).eval()(torch.randn(1, 24, DIM),
                                                                                          (2, 3, 4))
            assert y.shape == (1, 24, DIM), tuple(y.shape)
        except Exception as e:  # noqa: BLE001 - reported, with the others
            bad.append(f"grid_ndims has 3, but a (2, 3, 4) grid fails: {type(e).__name__}: {e}")
    for dtype in (torch.float64, torch.bfloat16):
        if dtype in caps.dtypes:
            with torch.no_grad():
                y = _build(name).eval().to(dtype)(x.to(dtype), HW)
            if y.dtype != dtype or not torch.isfinite(y).all():
                bad.append(f"dtypes has {dtype}, but it gives {y.dtype} (finite: {bool(torch.isfinite(y).all())})")
    return bad


@pytest.mark.parametrize("name", NAMES)
def test_caps_declared(name):
    """What a mechanism declares (`caps`) is what it does."""
    assert _caps_mismatches(name) == []


@pytest.mark.parametrize("name,field,value,word", [
    ("linear_l1", "causal", True, "causal=True"), ("softmax", "causal", False, "causal=False"),
    ("sliding_window", "bidirectional", True, "bidirectional"), ("window", "grid_ndims", (2, 3), "grid_ndims"),
    ("linear_relu", "sequence", False, "sequence"),
])
def test_caps_check_finds_a_false_declaration(name, field, value, word, monkeypatch):
    """The check above can fail: a declaration that is not true of the module is reported."""
    import dataclasses

    cls = get_attention_cls(name)
    monkeypatch.setattr(cls, "caps", dataclasses.replace(cls.caps, **{field: value}))
    assert any(word in b for b in _caps_mismatches(name)), _caps_mismatches(name)


def test_caps_check_finds_an_ignored_mask(monkeypatch):
    """A mechanism that declares masks but drops them is reported (the mask changes no output)."""
    cls = get_attention_cls("linear_relu")
    forward = cls.forward
    monkeypatch.setattr(cls, "forward", lambda self, x, hw=None, mask=None: forward(self, x, hw, None))
    assert "a masked key moves other outputs" in _caps_mismatches("linear_relu")


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
