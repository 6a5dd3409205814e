"""Parity of `agent` attention and the Agent-DeiT family with the official Agent-Attention code (loaded by file
path through `tests/_official.py`; needs SUBQUAD_OFFICIAL_ROOT with an `Agent-Attention/` checkout).

Module level: the official `AgentAttention` of `agent_swin.py` (plain), `agent_pvt.py` (PVT reduction, q + kv),
`agent_deit.py` (class token) and `agent_cswin.py` (host-projected, LePE) with random weights and biases, loaded into
ours. Model level: random official Agent-DeiT / -PVT / -Swin / -CSwin weights loaded through `remap_official`, logits
compared in float32 (relative RMS < 1e-5).
"""

from __future__ import annotations

import pytest
import torch

import subquad
from subquad.attention.agent import AgentAttention, AgentCore
from subquad.attention.focused_linear import remap_q_kv
from tests._official import build_official, load_agent
from tests._tol import assert_close, rel_rms

pytestmark = pytest.mark.parity


def _randomise(m: torch.nn.Module) -> torch.nn.Module:
    """Bias tables at a scale where they move the softmaxes (the official init is trunc_normal(0.02))."""
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(("an_bias", "na_bias", "ah_bias", "aw_bias", "ha_bias", "wa_bias", "ac_bias",
                              "ca_bias")):
                p.normal_(0, 0.5)
    return m


def test_agent_swin_module(official_root):
    off = load_agent(official_root, "agent_swin")
    o = _randomise(off.AgentAttention(96, (14, 14), 3, agent_num=16)).eval()
    ours = AgentAttention(96, 3, input_size=(14, 14), agent_num=16).eval()
    ours.load_state_dict(o.state_dict(), strict=True)
    x = torch.randn(2, 196, 96)
    with torch.no_grad():
        assert_close(ours(x, (14, 14)), o(x), torch.float32, "agent (swin) vs official")


@pytest.mark.parametrize("sr_ratio", [1, 2])
def test_agent_pvt_module(official_root, sr_ratio):
    off = load_agent(official_root, "agent_pvt")
    o = _randomise(off.AgentAttention(64, 14 * 14, 2, qkv_bias=True, sr_ratio=sr_ratio, agent_num=9)).eval()
    ours = AgentAttention(64, 2, input_size=(14, 14), sr_ratio=sr_ratio, agent_num=9).eval()
    ours.load_state_dict(remap_q_kv(o.state_dict()), strict=True)  # official q + kv -> our fused qkv
    x = torch.randn(2, 196, 64)
    with torch.no_grad():
        assert_close(ours(x, (14, 14)), o(x, 14, 14), torch.float32, "agent (pvt) vs official")


def test_agent_deit_module_class_token(official_root):
    off = load_agent(official_root, "agent_deit")
    o = _randomise(off.AgentAttention(96, 3, qkv_bias=True, agent_num=49, window=14)).eval()
    ours = AgentAttention(96, 3, input_size=(14, 14), agent_num=49, num_prefix_tokens=1).eval()
    ours.load_state_dict(o.state_dict(), strict=True)
    x = torch.randn(2, 197, 96)
    with torch.no_grad():
        assert_close(ours(x, (14, 14)), o(x), torch.float32, "agent (deit) vs official")


def test_agent_cswin_core(official_root):
    off = load_agent(official_root, "agent_cswin")
    o = _randomise(off.AgentAttention(64, 14, -1, split_size=14, num_heads=2, agent_num=16)).eval()
    ours = AgentCore(64, 2, input_size=(14, 14), agent_num=16).eval()
    ours.load_state_dict(o.state_dict(), strict=True)
    q, k, v = torch.randn(3, 2, 196, 64)
    with torch.no_grad():
        assert_close(ours.forward_qkv(q, k, v, (14, 14)), o(torch.stack([q, k, v])), torch.float32,
                     "agent (cswin) vs official")


@pytest.mark.parametrize("name", ["agent_deit_tiny", "agent_deit_base", "agent_pvt_tiny", "agent_swin_tiny",
                                  "agent_swin_base", "agent_cswin_tiny"])
def test_agent_logits(official_root, name):
    off = _randomise(build_official(official_root, name)).eval()
    ours = subquad.create_model(name).eval()
    family = name.rsplit("_", 1)[0]
    remap = __import__(f"subquad.models.{family}", fromlist=["remap_official"]).remap_official
    ours.load_state_dict(remap({"model": off.state_dict()}, ours), strict=True)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        a, b = ours(x), off(x)
    err = rel_rms(a, b)
    assert err < 1e-5, f"{name}: logits relative RMS error {err:.2e}"
