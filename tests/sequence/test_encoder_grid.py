"""LRA encoder with a token grid: 2-D mechanisms on image-like sequences (Pathfinder), hw reaches every block."""

from __future__ import annotations

import pytest
import torch

import subquad
from subquad.attention import ATTENTION_REGISTRY
from subquad.errors import UserError
from subquad.sequence import create_sequence_model

# Mechanisms whose grid form needs the grid (some also have a 1-D form, built without input_size).
SPATIAL = [n for n in subquad.list_attention() if ATTENTION_REGISTRY.get(n).builder.caps.needs_hw]
# Options so that windows / stripes / filters fit a 4 x 8 grid.
SMALL_KW = {"window": {"window_size": 4}, "cswin": {"split_size": 2}, "long_short": {"window_size": 2, "rank": 3},
            "structure_aware": {"D": 4}}


def _model(attention, grid=(4, 8), pool="mean", **kw):
    args = dict(vocab_size=20, num_classes=2, dim=16, depth=2, num_heads=2, mlp_dim=24, max_len=32,
                attention=attention, attn_kw=SMALL_KW.get(attention, {}), pool=pool, grid=grid)
    args.update(kw)
    return create_sequence_model("lra_encoder", **args)


def test_spatial_mechanisms_exist():
    assert {"structure_aware", "focused_linear", "window", "global_filter", "cswin"} <= set(SPATIAL)


@pytest.mark.parametrize("attention", [*SPATIAL, "long_short"])
def test_spatial_mechanisms_train_on_a_grid(attention):
    m = _model(attention)
    tokens = torch.randint(0, 20, (3, 32))
    logits = m(tokens, torch.ones(3, 32, dtype=torch.bool))
    assert logits.shape == (3, 2) and torch.isfinite(logits).all()
    logits.square().sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_grid_reaches_the_mechanism():
    # The same weights on a 4 x 8 and on an 8 x 4 grid: a 4 x 4 window mixes other tokens, so the outputs differ;
    # softmax ignores hw, so its outputs are equal with and without a grid.
    torch.manual_seed(0)
    a = _model("window", grid=(4, 8)).eval()
    b = _model("window", grid=(8, 4)).eval()
    b.load_state_dict(a.state_dict())
    tokens = torch.randint(0, 20, (2, 32))
    assert not torch.allclose(a(tokens), b(tokens))
    s = _model("softmax", grid=(4, 8)).eval()
    s1 = _model("softmax", grid=None).eval()
    s1.load_state_dict(s.state_dict())
    assert torch.equal(s(tokens), s1(tokens))
    assert a.model.transformer_0.mha.window_size == 4
    assert _model("global_filter").model.transformer_1.mha.input_size == (4, 8)


def test_lcm_branch():
    m = _model("enhanced_linear", lcm_kernel_size=3)
    assert m.model.transformer_0.lcm is not None and "model.transformer_1.lcm.conv1.weight" in m.state_dict()
    assert torch.isfinite(m(torch.randint(0, 20, (2, 32)))).all()
    with pytest.raises(UserError, match="needs a token grid"):
        _model("enhanced_linear", grid=None, lcm_kernel_size=3)


def test_grid_refusals_are_one_line_at_build_time():
    with pytest.raises(UserError, match="class token"):
        _model("structure_aware", pool="cls_last")
    with pytest.raises(UserError, match="cannot encode 1-D sequences"):
        _model("window", grid=None)
    with pytest.raises(UserError, match="more than max_len"):
        _model("window", grid=(8, 8))
    with pytest.raises(UserError, match="two positive integers"):
        _model("window", grid=(4, 0))
    # Non-spatial mechanisms keep their class token with a grid.
    assert _model("softmax", pool="cls_last")(torch.randint(0, 20, (1, 32))).shape == (1, 2)
    with pytest.raises(ValueError, match="needs sequences of 32 tokens"):
        _model("window")(torch.randint(0, 20, (1, 16)))


def test_odd_blocks_get_their_options():
    m = _model("window", grid=(8, 8), max_len=64, odd_attn_kw={"shift_size": 2}, depth=3)
    shifts = [getattr(m.model, f"transformer_{i}").mha.shift_size for i in range(3)]
    assert shifts == [0, 2, 0]
    assert torch.isfinite(m(torch.randint(0, 20, (2, 64)))).all()
