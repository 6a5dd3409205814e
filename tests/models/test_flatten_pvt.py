"""FLatten-PVT / FLatten-PVTv2 hosts: per-stage mechanisms, softmax baseline, pos-embed resize, init, parity."""

from __future__ import annotations

import contextlib
import io
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import subquad


@pytest.mark.parametrize("name", ["flatten_pvt_tiny", "flatten_pvt_v2_b1"])
def test_focused_stages_as_released(name):
    m = subquad.create_model(name, device="meta")
    for i in range(4):
        for blk in getattr(m, f"block{i + 1}"):
            a = blk.attn
            assert a.name == "focused_linear" and a.sr_ratio == 1
            # one set of names: the official q + kv are concatenated into qkv by remap_official
            assert hasattr(a, "qkv") and not hasattr(a, "q") and not hasattr(a, "kv")
            assert tuple(a.pe_hw) == m.grids[i]
    assert m.grids == [(56, 56), (28, 28), (14, 14), (7, 7)]


@pytest.mark.parametrize("name", ["flatten_pvt_micro", "flatten_pvt_v2_micro"])
def test_softmax_baseline_one_keyword_away(name):
    """attn='softmax' gives the PVT spatial-reduction attention with sr_ratios (8, 4, 2, 1)."""
    m = subquad.create_model(name, attn="softmax", sr_ratios=(4, 2, 1, 1), num_classes=3).eval()
    a1, a4 = m.block1[0].attn, m.block4[0].attn
    assert a1.name == "softmax" and hasattr(a1, "sr") and a1.sr.stride == (4, 4)
    assert not hasattr(a4, "sr")
    with torch.no_grad():
        assert m(torch.randn(1, 3, 32, 40)).shape == (1, 3)


def test_mixed_stage_tuple_and_errors():
    m = subquad.create_model("flatten_pvt_v2_micro", attn=("focused_linear", "focused_linear", "softmax",
                                                            "softmax"), sr_ratios=(8, 4, 2, 1)).eval()
    assert [getattr(m, f"block{i}")[0].attn.name for i in range(1, 5)] == ["focused_linear"] * 2 + ["softmax"] * 2
    with torch.no_grad():
        assert torch.isfinite(m(torch.randn(1, 3, 36, 28))).all()
    with pytest.raises(ValueError, match="4 names"):
        subquad.create_model("flatten_pvt_micro", attn=("softmax",) * 3)
    with pytest.raises(ValueError, match="4 stages"):
        subquad.create_model("flatten_pvt_micro", depths=(1, 1, 1))
    with pytest.raises(ValueError, match="nope"):
        subquad.create_model("flatten_pvt_micro", attn=("nope",) * 4)


def test_pos_embed_bilinear_resize_as_pvt():
    """Stage pos-embeds are resized bilinearly (align_corners False) from the construction grid, as PVT does."""
    m = subquad.create_model("flatten_pvt_micro").eval()
    seen = {}
    m.block2[0].register_forward_pre_hook(lambda mod, args: seen.update(x=args[0]))
    x = torch.randn(1, 3, 48, 40)
    with torch.no_grad():
        m(x)
        t, hw = m.patch_embed1(x)
        t = m.block1[0](t + F.interpolate(m.pos_embed1.reshape(1, 16, 16, -1).permute(0, 3, 1, 2), size=hw,
                                          mode="bilinear", align_corners=False).flatten(2).transpose(1, 2), hw)
        t2, hw2 = m.patch_embed2(t.transpose(1, 2).reshape(1, -1, *hw))
        pos2 = F.interpolate(m.pos_embed2.reshape(1, 8, 8, -1).permute(0, 3, 1, 2), size=hw2, mode="bilinear",
                             align_corners=False).flatten(2).transpose(1, 2)
    assert hw == (24, 20) and hw2 == (12, 10)
    torch.testing.assert_close(seen["x"], t2 + pos2)


def test_pvt_init():
    m = subquad.create_model("flatten_pvt_micro")
    for name, mod in m.named_modules():
        if isinstance(mod, nn.Linear) and mod.bias is not None:
            assert torch.all(mod.bias == 0), name
        if isinstance(mod, nn.LayerNorm):
            assert torch.all(mod.weight == 1) and torch.all(mod.bias == 0), name
    assert abs(m.pos_embed1.std().item() - 0.02) < 0.003
    a = m.block1[0].attn
    assert torch.all(a.scale == 0) and torch.all(a.positional_encoding == 0)
    assert m.no_weight_decay() == set()


def test_pvt_v2_conv_init():
    m = subquad.create_model("flatten_pvt_v2_micro", embed_dims=(64, 64, 64, 64), num_heads=(1, 1, 1, 1))
    for name, mod in m.named_modules():
        if isinstance(mod, nn.Conv2d):
            fan_out = mod.kernel_size[0] * mod.kernel_size[1] * mod.out_channels // mod.groups
            if mod.weight.numel() >= 1000:
                rel = mod.weight.std().item() / math.sqrt(2.0 / fan_out)
                assert 0.85 < rel < 1.15, (name, rel)
            assert mod.bias is None or torch.all(mod.bias == 0), name


def test_prune_and_features_only():
    import timm

    f = timm.create_model("flatten_pvt_v2_micro", features_only=True, out_indices=(1, 3)).eval()
    assert f.feature_info.reduction() == [4, 16]
    with torch.no_grad():
        maps = f(torch.randn(2, 3, 32, 32))
    assert [tuple(t.shape) for t in maps] == [(2, 64, 8, 8), (2, 128, 2, 2)]
    m = subquad.create_model("flatten_pvt_micro")
    m.prune_intermediate_layers((0, 1))
    assert m.num_stages == 2 and not hasattr(m, "block3") and isinstance(m.head, nn.Identity)


@pytest.mark.parity
@pytest.mark.parametrize("family", ["flatten_pvt", "flatten_pvt_v2"])
def test_matches_official_model(official_root, family):
    """Official FLatten-PVT(v2) with randomised scale/PE (small dims, built at 128): same logits."""
    from functools import partial

    from tests._official import load_flatten

    mod = load_flatten(official_root, family)
    cls = mod.PyramidVisionTransformer if family == "flatten_pvt" else mod.PyramidVisionTransformerV2
    dims = dict(embed_dims=[32, 64, 96, 128], num_heads=[1, 2, 3, 4], mlp_ratios=[2, 2, 2, 2], depths=[1, 1, 1, 1])
    with contextlib.redirect_stdout(io.StringIO()):
        off = cls(img_size=128, patch_size=4, qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6),
                  la_sr_ratios="1111", num_classes=10, **dims).eval()
    with torch.no_grad():
        for n, p in off.named_parameters():
            if n.endswith(("scale", "positional_encoding")):
                p.normal_(0, 0.5)
    name = "flatten_pvt_tiny" if family == "flatten_pvt" else "flatten_pvt_v2_b0"
    ours = subquad.create_model(name, img_size=128, num_classes=10,
                                **{k: tuple(v) for k, v in dims.items()}).eval()
    remap = __import__(f"subquad.models.{family}", fromlist=["remap_official"]).remap_official
    ours.load_state_dict(remap({"model": off.state_dict()}, ours), strict=True)
    x = torch.randn(2, 3, 128, 128)
    with torch.no_grad():
        ref, out = off(x), ours(x)
    rel = ((out - ref).norm() / ref.norm()).item()
    assert rel < 1e-5, f"relative error {rel:.2e}"
