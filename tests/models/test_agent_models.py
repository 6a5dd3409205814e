"""Agent-Attention families (Agent-DeiT, -PVT, -Swin, -CSwin): official key layouts load strictly through
`remap_official`, a resized load equals running the source model at the new size, the variants' mechanism lists and
agent counts follow the official cfgs, and the micro models train on odd, non-square inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm
import torch

import subquad
from subquad.attention.agent import AgentAttention, AgentCore
from subquad.models.agent_cswin import remap_official as remap_cswin
from subquad.models.agent_deit import remap_official as remap_deit
from subquad.models.agent_pvt import remap_official as remap_pvt
from subquad.models.agent_swin import remap_official as remap_swin

from .test_remap import random_state_dict

FIXTURES = Path(__file__).resolve().parents[1] / "_fixtures"
DEIT = json.loads((FIXTURES / "agent_deit_keys.json").read_text())["models"]
PVT = json.loads((FIXTURES / "agent_pvt_keys.json").read_text())["models"]
# The Swin fixture lists the official buffers too (`relative_position_index`, `attn_mask`: recomputed, dropped).
SWIN = json.loads((FIXTURES / "agent_swin_keys.json").read_text())["models"]
CSWIN = json.loads((FIXTURES / "agent_cswin_keys.json").read_text())["models"]
OFFICIAL = {**DEIT, **PVT, **SWIN, **CSWIN}

# Loading into a meta model is a no-op per tensor, and torch says so for each one.
pytestmark = pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter:UserWarning")


def _fold_q_kv(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The official PVT `q` + `kv` as our fused `qkv` (row concatenation), other keys as they are."""
    out = {}
    for k, v in sd.items():
        if ".attn.kv." in k:
            continue
        if ".attn.q." in k:
            out[k.replace(".attn.q.", ".attn.qkv.")] = torch.cat([v, sd[k.replace(".attn.q.", ".attn.kv.")]])
        else:
            out[k] = v
    return out


@pytest.mark.parametrize("name", sorted(OFFICIAL))
def test_official_layout_loads_strictly(tmp_path, name):
    sd = random_state_dict(OFFICIAL[name])
    path = tmp_path / "official.pth"
    torch.save({"model": sd, "max_accuracy": 80.0, "epoch": 299}, path)
    real = name in ("agent_deit_tiny", "agent_pvt_tiny")
    m = subquad.create_model(name, checkpoint_path=str(path), device=None if real else "meta")
    own = m.state_dict()
    expected = {k: v for k, v in _fold_q_kv(sd).items() if not k.endswith(("relative_position_index", "attn_mask"))}
    assert set(own) == set(expected)
    if real:
        for k, v in own.items():
            assert torch.equal(v, expected[k]), k


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
    p = subquad.create_model("agent_pvt_medium_256", device="meta")
    assert [p._stage(i)[1][0].attn.agent_num for i in range(4)] == [9, 16, 49, 49]
    assert all(p._stage(i)[1][0].attn.sr_ratio == 1 for i in range(4))
    assert p.block1[0].attn.ha_bias.shape == (1, 1, 64, 1, 9)
    sw = subquad.create_model("agent_swin_tiny", device="meta")
    assert [type(st.blocks[0].attn).__name__ for st in sw.layers] == ["AgentAttention"] * 3 + ["WindowAttention"]
    assert [st.blocks[0].attn.agent_num for st in sw.layers[:3]] == [9, 16, 49]
    small = subquad.create_model("agent_swin_small_288", device="meta")
    assert small.layers[1].blocks[0].attn.ah_bias.shape == (1, 6, 16, 36, 1)
    kinds = [type(st.blocks[0].attn).__name__ for st in small.layers]
    assert kinds == ["AgentAttention"] * 2 + ["WindowAttention"] * 2
    # Agent-Swin-B (AAMB2): stage 3's first 2 blocks agent, the other 16 window; 'B' window 12 at 384
    for name, w in (("agent_swin_base", 7), ("agent_swin_base_384", 12)):
        b = subquad.create_model(name, device="meta")
        kinds = [type(blk.attn).__name__ for blk in b.layers[2].blocks]
        assert kinds == ["AgentAttention"] * 2 + ["WindowAttention"] * 16, (name, kinds)
        assert b.attn_names[2] == ("agent",) * 2 + ("window",) * 16 and b.attn_names[3] == "window"
        assert [blk.attn.agent_num for blk in b.layers[2].blocks[:2]] == [49, 49]
        assert b.layers[2].blocks[2].attn.window_size == w and b.layers[2].blocks[3].attn.shift_size == w // 2
    cs = subquad.create_model("agent_cswin_small", device="meta")
    assert [len(getattr(cs, f"stage{i}")) for i in range(1, 5)] == [3, 6, 29, 2]
    kinds = [isinstance(getattr(cs, f"stage{i}")[0].mixer, AgentCore) for i in range(1, 5)]
    assert kinds == [True, True, False, False]
    assert cs.stage2[0].attns[0].agent_num == 16
    assert cs.stage1[0].attns[0].ah_bias.shape == (1, 2, 9, 56, 1)
    for tag in ("agent_cswin_tiny.in1k", "agent_cswin_small.in1k", "agent_cswin_base.in1k",
                "agent_cswin_base_384.in1k", "agent_swin_tiny.in1k", "agent_swin_small.in1k",
                "agent_swin_small_288.in1k", "agent_swin_base.in1k", "agent_swin_base_384.in1k",
                "agent_deit_tiny.in1k", "agent_deit_base.in1k", "agent_deit_small_448.in1k",
                *(f"agent_pvt_{s}.in1k" for s in ("tiny", "small", "medium", "medium_256", "large"))):
        cfg = timm.models.get_pretrained_cfg(tag)
        assert cfg.url.startswith("https://cloud.tsinghua.edu.cn/f/") and "top-1" in cfg.notes


def _randomise(m: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("_bias") and "attn" in n or "pos_embed" in n:
                p.normal_(0, 0.3)
    return m


@pytest.mark.parametrize("name,remap", [("agent_deit_micro", remap_deit), ("agent_pvt_micro", remap_pvt),
                                        ("agent_swin_micro", remap_swin), ("agent_cswin_micro", remap_cswin)])
def test_resized_load_equals_runtime_resize(name, remap):
    """A micro checkpoint (32 px) loaded into a model built at 48 px gives the logits of the source model run at
    48 px: the load-time resize of the position tables and the agent tables is the run-time rule."""
    torch.manual_seed(0)
    # Swin / CSwin micro from 128 px (stage grids 32/16/8/4), so no 'window' stage is clipped at either size.
    swin = name in ("agent_swin_micro", "agent_cswin_micro")
    src = _randomise(subquad.create_model(name, num_classes=5, **(dict(img_size=128) if swin else {}))).eval()
    size = 192 if swin else 48
    dst = subquad.create_model(name, num_classes=5, img_size=size).eval()
    first = [next(m for m in net.modules() if isinstance(m, (AgentAttention, AgentCore))) for net in (src, dst)]
    assert first[1].ah_bias.shape[3] == first[0].ah_bias.shape[3] * 3 // 2
    dst.load_state_dict(remap({"model": src.state_dict()}, dst), strict=True)
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        torch.testing.assert_close(dst(x), src(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["agent_deit_micro", "agent_pvt_micro", "agent_swin_micro", "agent_cswin_micro"])
def test_micro_trains_on_odd_non_square_inputs(name):
    torch.manual_seed(0)
    m = subquad.create_model(name, num_classes=3).train()
    x = torch.randn(2, 3, 70, 45) if name.endswith("swin_micro") else torch.randn(2, 3, 36, 20)
    y = m(x)
    assert y.shape == (2, 3) and torch.isfinite(y).all()
    y.square().sum().backward()
    missing = [n for n, p in m.named_parameters() if p.grad is None]
    assert not missing, missing
