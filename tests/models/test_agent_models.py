"""Agent-Attention families: official key layouts load strictly through `remap_official`, a resized load equals
running the source model at the new size, the variants' mechanism lists and agent counts follow the official cfgs,
and the micro model trains on odd, non-square inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm
import torch

import subquad
from subquad.attention.agent import AgentAttention
from subquad.models.agent_deit import remap_official as remap_deit

from .test_remap import random_state_dict

FIXTURES = Path(__file__).resolve().parents[1] / "_fixtures"
DEIT = json.loads((FIXTURES / "agent_deit_keys.json").read_text())["models"]

# Loading into a meta model is a no-op per tensor, and torch says so for each one.
pytestmark = pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter:UserWarning")


@pytest.mark.parametrize("name", sorted(DEIT))
def test_official_deit_layout_loads_strictly(tmp_path, name):
    sd = random_state_dict(DEIT[name])
    path = tmp_path / "official.pth"
    torch.save({"model": sd, "max_accuracy": 80.0, "epoch": 299}, path)
    real = name == "agent_deit_tiny"
    m = subquad.create_model(name, checkpoint_path=str(path), device=None if real else "meta")
    own = m.state_dict()
    assert set(own) == set(sd)
    if real:
        for k, v in own.items():
            assert torch.equal(v, sd[k]), k


def test_variants_follow_official_cfgs():
    assert set(timm.list_models("agent_deit_*")) == {"agent_deit_micro", "agent_deit_tiny", "agent_deit_small",
                                                     "agent_deit_small_448", "agent_deit_base"}
    m = subquad.create_model("agent_deit_base", device="meta")
    kinds = [type(b.attn).__name__ for b in m.blocks]
    assert kinds[:4] == ["AgentAttention"] * 4 and "AgentAttention" not in kinds[4:]
    assert {b.attn.agent_num for b in m.blocks[:4]} == {81}
    t = subquad.create_model("agent_deit_small_448", device="meta")
    assert all(isinstance(b.attn, AgentAttention) and b.attn.agent_num == 49 for b in t.blocks)
    assert t.blocks[0].attn.ah_bias.shape == (1, 6, 49, 28, 1) and t.blocks[0].attn.ac_bias.shape == (1, 6, 49, 1)
    for tag in ("agent_deit_tiny.in1k", "agent_deit_base.in1k", "agent_deit_small_448.in1k"):
        cfg = timm.models.get_pretrained_cfg(tag)
        assert cfg.url.startswith("https://cloud.tsinghua.edu.cn/f/") and "top-1" in cfg.notes


def _randomise(m: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("_bias") and "attn" in n or "pos_embed" in n:
                p.normal_(0, 0.3)
    return m


def test_resized_load_equals_runtime_resize():
    """A micro checkpoint (grid 8 x 8) loaded into a model built at 48 px (grid 12 x 12) gives the logits of the
    source model run at 48 px: the load-time resize of `pos_embed` and the agent tables is the run-time rule."""
    torch.manual_seed(0)
    src = _randomise(subquad.create_model("agent_deit_micro", num_classes=5)).eval()
    dst = subquad.create_model("agent_deit_micro", num_classes=5, img_size=48).eval()
    assert dst.blocks[0].attn.ah_bias.shape[3] == 12
    dst.load_state_dict(remap_deit({"model": src.state_dict()}, dst), strict=True)
    x = torch.randn(2, 3, 48, 48)
    with torch.no_grad():
        torch.testing.assert_close(dst(x), src(x), rtol=1e-5, atol=1e-5)


def test_micro_trains_on_odd_non_square_inputs():
    torch.manual_seed(0)
    m = subquad.create_model("agent_deit_micro", num_classes=3).train()
    x = torch.randn(2, 3, 36, 20)
    y = m(x)
    assert y.shape == (2, 3) and torch.isfinite(y).all()
    y.square().sum().backward()
    missing = [n for n, p in m.named_parameters() if p.grad is None]
    assert not missing, missing
