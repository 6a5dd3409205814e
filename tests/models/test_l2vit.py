"""L2ViT host: block layout (LWA/LGA alternation, CPE placement), init, interface, parity with the official class."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch
from torch import nn

import subquad
from subquad.models.l2vit import LGABlock, LWABlock


def test_block_alternation_and_cpe_placement():
    m = subquad.create_model("l2vit_tiny", device="meta")
    assert [len(s) for s in m.stages] == [2, 2, 6, 2]
    for stage in m.stages:
        for j, blk in enumerate(stage):
            if j % 2 == 0:
                assert isinstance(blk, LWABlock) and len(blk.cpe) == 2
                assert blk.attn.name == "window" and blk.attn.window_size == 7
                assert blk.attn.shift_size == 0 and blk.attn.pad_mode == "zero"
                assert getattr(blk.attn, "relative_position_bias_table", None) is None
            else:
                assert isinstance(blk, LGABlock) and len(blk.cpe) == 1
                assert blk.attn.name == "enhanced_linear"
                assert blk.local_mp.conv1.kernel_size == (7, 7)
    assert subquad.create_model("l2vit_base_384", device="meta").stages[2][0].attn.window_size == 12
    assert [f["reduction"] for f in m.feature_info] == [4, 8, 16, 32]
    assert [f["module"] for f in m.feature_info] == [f"stages.{i}" for i in range(4)]


def test_baseline_one_keyword_away():
    """The LWA/LGA mechanisms are plain keywords (e.g. global softmax everywhere as an ablation)."""
    m = subquad.create_model("l2vit_micro", attn="softmax", num_classes=3).eval()
    assert {type(b.attn).__name__ for s in m.stages for b in s} == {"MultiHeadAttention"}
    with torch.no_grad():
        assert m(torch.randn(1, 3, 32, 32)).shape == (1, 3)


def test_official_init():
    m = subquad.create_model("l2vit_micro", dims=(64, 64, 64, 64), num_heads=(2, 2, 2, 2))
    for name, mod in m.named_modules():
        if isinstance(mod, (nn.Conv2d, nn.Linear)):
            if mod.bias is not None:
                assert torch.all(mod.bias == 0), name
            if mod.weight.numel() >= 4096:
                assert abs(mod.weight.std().item() - 0.02) < 0.004, name
        if isinstance(mod, (nn.LayerNorm, nn.BatchNorm2d)):
            assert torch.all(mod.weight == 1) and torch.all(mod.bias == 0), name
    t = m.stages[0][1].attn.temperature
    torch.testing.assert_close(t, torch.full_like(t, 32 ** -0.5))
    assert m.no_weight_decay() == set()


def test_group_matcher_covers_every_parameter():
    from timm.models._manipulate import group_parameters

    m = subquad.create_model("l2vit_micro")
    groups = group_parameters(m, m.group_matcher())
    assert sum(len(v) for v in groups.values()) == len(list(m.named_parameters()))


def test_features_only_strides():
    import timm

    f = timm.create_model("l2vit_micro", features_only=True).eval()
    assert f.feature_info.reduction() == [2, 4, 8, 16]
    with torch.no_grad():
        maps = f(torch.randn(1, 3, 32, 48))
    assert [tuple(t.shape) for t in maps] == [(1, 32, 16, 24), (1, 64, 8, 12), (1, 96, 4, 6), (1, 128, 2, 3)]


@pytest.mark.parity
def test_matches_official_model(official_root):
    """Official L2ViT (small dims) with randomised BN statistics and temperatures: same logits at odd sizes."""
    from tests._official import load_l2vit

    off_mod = load_l2vit(official_root)
    with contextlib.redirect_stdout(io.StringIO()):
        off = off_mod.L2ViT(depths=[2, 2, 2, 2], dims=[32, 64, 96, 128], num_heads=[1, 2, 3, 4],
                            block_type="mix_local_enhanced_vit", conv_stem=True, num_classes=10).eval()
    with torch.no_grad():
        for n, b in off.named_buffers():
            if n.endswith("running_var"):
                b.uniform_(0.5, 2.0)
            elif n.endswith("running_mean"):
                b.normal_()
        for n, p in off.named_parameters():
            if n.endswith("temperature"):
                p.uniform_(0.05, 0.5)
    ours = subquad.create_model("l2vit_tiny", dims=(32, 64, 96, 128), depths=(2, 2, 2, 2), num_heads=(1, 2, 3, 4),
                                num_classes=10).eval()
    ours.load_state_dict(off.state_dict(), strict=True)
    for hw in [(224, 224), (225, 300), (64, 96)]:
        x = torch.randn(2, 3, *hw)
        with torch.no_grad():
            ref, out = off(x), ours(x)
        rel = ((out - ref).norm() / ref.norm()).item()
        assert rel < 1e-5, f"{hw}: relative error {rel:.2e}"
