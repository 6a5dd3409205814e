"""ViL-LS: official key layout (committed fixtures), remap, parameter counts, table resizing, official no-decay rule,
and (marker `parity`) equality with the official MsViT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import subquad
from subquad.errors import UserError
from subquad.models import CARDS
from subquad.models.vil_ls import ViLFullAttention, remap_official, resize_rel_table
from tests._official import load_msvit

FIXTURES = Path(__file__).parents[1] / "_fixtures"
OFFICIAL = ["vil_ls_medium", "vil_ls_base", "vil_ls_medium_384"]


@pytest.mark.parametrize("name", OFFICIAL)
def test_official_keys_remap_exactly(name):
    """An official MsViT state dict (DDP-wrapped as the official Checkpointer saves it) maps key-for-key and
    shape-for-shape onto our model; parameter counts equal the official ones."""
    fx = json.loads((FIXTURES / f"{name}_keys.json").read_text())
    m = subquad.create_model(name, device="meta")
    sd = {"module." + k: torch.empty(v, device="meta") for k, v in fx["keys"].items()}
    remapped = remap_official({"net": sd, "arch": "msvit"}, m)
    ours = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in remapped.items()} == ours
    assert sum(p.numel() for p in m.parameters()) == fx["num_params"] == CARDS[name].ref_params


def test_remap_loads_strictly_and_resizes_full_attention_tables():
    src = subquad.create_model("vil_ls_micro", img_size=64)
    dst = subquad.create_model("vil_ls_micro", img_size=32)
    sd = remap_official({"module." + k: v for k, v in src.state_dict().items()}, dst)
    dst.load_state_dict(sd, strict=True)
    x = torch.randn(1, 3, 32, 32)
    assert torch.isfinite(dst.eval()(x)).all()


def test_table_resize_rule():
    t = torch.randn(7 * 7, 3)
    assert resize_rel_table(t, (4, 4), (4, 4)) is t
    r = resize_rel_table(t, (4, 4), (6, 3))
    assert r.shape == (11 * 5, 3) and torch.isfinite(r).all()
    # a constant table stays constant under bicubic resizing
    c = torch.full((49, 2), 0.5)
    torch.testing.assert_close(resize_rel_table(c, (4, 4), (5, 6)), torch.full((9 * 11, 2), 0.5))


def test_full_attention_bias_layout():
    """Global-to-global, global-to-local and local tables land where the official code puts them."""
    a = ViLFullAttention(8, 2, (2, 3), nglo=1)
    b = a.bias((2, 3))
    assert b.shape == (2, 7, 7)
    torch.testing.assert_close(b[:, 0, 0], a.g2g_relative_position_bias[:, 0, 0])
    torch.testing.assert_close(b[:, 0, 1:], a.g2l_relative_position_bias[0, :, 0:1].expand(2, 6))
    torch.testing.assert_close(b[:, 1:, 0], a.g2l_relative_position_bias[1, :, 0:1].expand(2, 6))
    # local pair (0, 0) -> (1, 2): dy = -1, dx = -2 -> row (dy + 1) * 5 + (dx + 2)
    torch.testing.assert_close(b[:, 1, 1 + 5], a.local_relative_position_bias_table[0])


def test_no_weight_decay_follows_official_substring_rule():
    m = subquad.create_model("vil_ls_micro")
    nwd = m.no_weight_decay()
    assert "layer1.0.cls_token" in nwd and "layer1.0.norm_embed.weight" in nwd and "head.bias" in nwd
    assert "layer1.1.attn.local_relative_position_bias_table" in nwd and "norm.weight" in nwd
    assert "layer1.1.norm.weight" in nwd
    assert "layer1.1.attn.dual_ln_full.weight" not in nwd and "layer1.1.attn.qkv.bias" not in nwd


def test_softmax_baselines_differ_only_in_attention():
    ls = subquad.create_model("vil_ls_medium", device="meta")
    full = subquad.create_model("vil_medium", device="meta")
    assert {k for k in ls.state_dict() if k.startswith("layer3")} == \
        {k for k in full.state_dict() if k.startswith("layer3")}
    assert any("to_dynamic_projection" in k for k in ls.state_dict())
    assert not any("to_dynamic_projection" in k for k in full.state_dict())


@pytest.mark.parity
def test_parity_official_msvit(official_root):
    try:
        msvit = load_msvit(official_root)
    except UserError as e:
        pytest.skip(str(e))
    arch = ("l1,h2,d16,n1,s1,g1,p4,f2,a0,r2_l2,h2,d24,n2,s1,g1,p2,f2,a0,r2_"
            "l3,h2,d32,n1,s0,g1,p2,f2,a0,r2_l4,h2,d48,n1,s0,g0,p2,f2,a0,r2")
    off = msvit.MsViT(arch, img_size=64, num_classes=10, norm_embed=True, attn_type="ls", ln_eps=1e-6).eval()
    ours = subquad.create_model("vil_ls_micro", img_size=64, num_classes=10, depths=(1, 2, 1, 1),
                                num_heads=(2, 2, 2, 2)).eval()
    ours.load_state_dict(remap_official(off.state_dict(), ours), strict=True)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), off(x), rtol=1e-4, atol=1e-5)
