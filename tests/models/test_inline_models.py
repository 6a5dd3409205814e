"""InLine backbones: every official checkpoint layout (key-name fixtures) loads strictly through the family's remap,
InLine-Swin's per-block stage spelling, and InLine-CSwin's token mean from the block input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import subquad
from subquad.attention.inline import InLineCore
from subquad.errors import UserError

FIXTURES = Path(__file__).resolve().parents[1] / "_fixtures"
FAMILIES = ("inline_deit", "inline_pvt", "inline_swin", "inline_cswin")
CASES = [(fam, name) for fam in FAMILIES
         for name in json.loads((FIXTURES / f"{fam}_keys.json").read_text())["models"]]
# Buffers the official Swin blocks save and we recompute.
RECOMPUTED = (".relative_position_index", ".attn_mask")


@pytest.mark.parametrize("family,name", CASES)
def test_official_layout_loads_strictly(family, name):
    keys = json.loads((FIXTURES / f"{family}_keys.json").read_text())["models"][name]
    sd = {k: torch.zeros(shape, device="meta") for k, shape in keys.items()}
    m = subquad.create_model(name, device="meta")
    out = sys.modules[f"subquad.models.{family}"].remap_official({"model": sd}, m)
    own = {k: list(v.shape) for k, v in m.state_dict().items()}
    assert {k: list(v.shape) for k, v in out.items()} == own
    # nothing is dropped but recomputed buffers; PVT's q + kv are folded into qkv
    folded = {k for k in keys if k.endswith((".attn.q.weight", ".attn.q.bias", ".attn.kv.weight", ".attn.kv.bias"))}
    assert set(keys) - set(own) - folded == {k for k in keys if k.endswith(RECOMPUTED)}
    m.load_state_dict(out, strict=True)


def test_every_release_has_a_tag():
    import timm

    tags = timm.list_pretrained("inline_*")
    assert len(tags) == 13 and all(t.endswith(".in1k") for t in tags)
    for t in tags:
        cfg = timm.models.get_pretrained_cfg(t)
        assert cfg.url.startswith("https://cloud.tsinghua.edu.cn/f/") and cfg.url.endswith("/?dl=1"), t


def test_swin_per_block_stage():
    m = subquad.create_model("inline_swin_micro")
    kinds = [type(b.attn).__name__ for b in m.layers[2].blocks]
    assert kinds == ["InLineAttention", "WindowAttention"]
    assert m.attn_names[2] == ("inline", "window")
    y = m(torch.randn(2, 3, 64, 48))
    assert y.shape == (2, 1000) and torch.isfinite(y).all()
    with pytest.raises(UserError, match="one per block"):
        subquad.create_model("inline_swin_micro", attn=("inline", "inline", ("inline",), "window"))


def test_cswin_token_mean_from_block_input():
    """The InLine form of InLine-CSwin reads the block input before norm1 (official), not the normed tokens."""
    m = subquad.create_model("inline_cswin_micro").eval()
    blk = m.stage1[0]
    assert isinstance(blk.mixer, InLineCore)
    seen = {}
    real = blk.mixer.forward_qkv

    def spy(q, k, v, hw, x=None, **kw):
        seen["x"] = x
        return real(q, k, v, hw, x=x, **kw)

    blk.mixer.forward_qkv = spy
    x = torch.randn(2, 16 * 12, 32) * 3 + 1
    with torch.no_grad():
        blk(x, (16, 12))
    assert seen["x"] is x
