"""Agent attention: fast (SDPA) vs dense reference on outputs and every gradient (functional and module, odd and
non-square grids, PVT reduction, class token), the bias tables at and away from the construction grid, agent
pooling, the equivalent map and errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import subquad
from subquad.attention.agent import AgentAttention, AgentCore
from subquad.attention.functional.agent import (
    agent_attention,
    agent_attention_ref,
    agent_biases,
    pool_matrix,
    resize_axis,
)
from subquad.errors import UserError
from tests._tol import assert_close, compare_fn, compare_module

FUNC_CASES = {
    "plain_5x7_agents3x3": dict(hw=(5, 7), agent_hw=(3, 3)),
    "agents_exceed_grid_3x2": dict(hw=(3, 2), agent_hw=(4, 4)),
    "sr_9x6_to_4x3_prefix": dict(hw=(9, 6), kv_hw=(4, 3), agent_hw=(2, 2), prefix=1),
    "nonsquare_agents_prefix2": dict(hw=(7, 5), agent_hw=(2, 3), prefix=2),
}


@pytest.mark.parametrize("case", list(FUNC_CASES))
def test_functional_fast_equals_reference(case):
    c = FUNC_CASES[case]
    hw, agent_hw, P = c["hw"], c["agent_hw"], c.get("prefix", 0)
    kv_hw = c.get("kv_hw", hw)
    B, h, d = 2, 3, 4
    C, N, n, A = h * d, P + hw[0] * hw[1], P + kv_hw[0] * kv_hw[1], agent_hw[0] * agent_hw[1]
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, L, C, generator=g, dtype=torch.float64) for L in (N, n, n))
    b1 = torch.randn(h, A, n, generator=g, dtype=torch.float64) * 0.5
    b2 = torch.randn(h, N, A, generator=g, dtype=torch.float64) * 0.5
    w = torch.randn(C, 1, 3, 3, generator=g, dtype=torch.float64) * 0.3
    bias = torch.randn(C, generator=g, dtype=torch.float64) * 0.1
    kw = dict(hw=hw, kv_hw=kv_hw, agent_hw=agent_hw, num_heads=h, prefix=P)
    compare_fn(lambda *t: agent_attention(*t, **kw), lambda *t: agent_attention_ref(*t, **kw),
               [q, k, v, b1, b2, w, bias])


def _randomise(m: AgentAttention | AgentCore) -> AgentAttention | AgentCore:
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("_bias"):
                p.normal_(0, 0.5)
        (m.get_v if isinstance(m, AgentCore) else m.dwc).bias.normal_(0, 0.1)
    return m


MODULE_CASES = {
    # (construction grid, run grid, options)
    "construction_5x7": ((5, 7), (5, 7), {}),
    "other_grid_6x4": ((5, 7), (6, 4), {}),
    "sr2_9x7_run_7x11": ((9, 7), (7, 11), dict(sr_ratio=2, agent_num=9)),
    "cls_token_4x6_run_5x3": ((4, 6), (5, 3), dict(num_prefix_tokens=1, agent_num=4)),
    "cls_sr2_6x6": ((6, 6), (6, 6), dict(num_prefix_tokens=1, sr_ratio=2, agent_num=16)),
}


@pytest.mark.parametrize("case", list(MODULE_CASES))
def test_module_fast_equals_reference(case):
    grid, hw, opts = MODULE_CASES[case]
    torch.manual_seed(0)
    m = _randomise(AgentAttention(24, 3, input_size=grid, **opts))
    P = m.num_prefix_tokens
    x = torch.randn(2, P + hw[0] * hw[1], 24)
    compare_module(m, lambda mm, t: mm(t, hw), lambda mm, t: mm.forward_ref(t, hw), [x])


def test_float32_fast_path_within_tolerance():
    torch.manual_seed(0)
    m = _randomise(AgentAttention(24, 3, input_size=(6, 5), sr_ratio=2, num_prefix_tokens=1, agent_num=9))
    x = torch.randn(2, 1 + 30, 24)
    compare_module(m, lambda mm, t: mm(t, (6, 5)), lambda mm, t: mm.forward_ref(t, (6, 5)), [x],
                   dtype=torch.float32)


def test_biases_at_construction_grid_follow_the_official_sum():
    """At the construction grid B_1 = interp(an, key grid) + ah + aw and B_2 = interp(na, grid)^T + ha + wa, each
    broadcast over the other grid axis (the sums in the official `AgentAttention.forward`)."""
    torch.manual_seed(0)
    m = _randomise(AgentAttention(12, 2, input_size=(6, 9), sr_ratio=3, agent_num=4, num_prefix_tokens=1)).double()
    h, A = 2, 4
    b1, b2 = m.biases((6, 9), (2, 3))
    an = F.interpolate(m.an_bias, size=(2, 3), mode="bilinear", align_corners=False)  # (h, A, 2, 3)
    exp1 = an + m.ah_bias[0] + m.aw_bias[0]  # (h, A, 2, 3): ah varies with rows, aw with columns
    exp1 = torch.cat([m.ac_bias[0], exp1.reshape(h, A, 6)], dim=-1)
    na = F.interpolate(m.na_bias, size=(6, 9), mode="bilinear", align_corners=False).permute(0, 2, 3, 1)
    exp2 = na + m.ha_bias[0] + m.wa_bias[0]  # (h, 6, 9, A)
    exp2 = torch.cat([m.ca_bias[0], exp2.reshape(h, 54, A)], dim=-2)
    torch.testing.assert_close(b1, exp1, rtol=0, atol=1e-14)
    torch.testing.assert_close(b2, exp2, rtol=0, atol=1e-14)


def test_bias_tables_resize_linearly_at_other_grids():
    """Away from the construction grid the 1-D tables are resized linearly (align_corners False): constant tables
    stay constant, a linear ramp stays a ramp of the same end slope ratio, and the size is the run grid's."""
    t = torch.arange(5, dtype=torch.float64).reshape(1, 1, 1, 5, 1).expand(1, 2, 3, 5, 1)
    r = resize_axis(t, 10, 3)
    assert r.shape == (1, 2, 3, 10, 1)
    torch.testing.assert_close(r[0, 1, 2, :, 0], F.interpolate(torch.arange(5.0, dtype=torch.float64)[None, None],
                                                                size=10, mode="linear", align_corners=False)[0, 0])
    assert resize_axis(t, 5, 3) is t
    h, A = 2, 4
    ones = {n: torch.full(s, 0.25, dtype=torch.float64) for n, s in {
        "an": (h, A, 7, 7), "na": (h, A, 7, 7), "ah": (1, h, A, 3, 1), "aw": (1, h, A, 1, 5), "ha": (1, h, 3, 1, A),
        "wa": (1, h, 1, 5, A)}.items()}
    b1, b2 = agent_biases(ones["an"], ones["na"], ones["ah"], ones["aw"], ones["ha"], ones["wa"], None, None,
                          (7, 4), (11, 2))
    assert b1.shape == (h, A, 22) and b2.shape == (h, 28, A)
    torch.testing.assert_close(b1, torch.full_like(b1, 0.75))
    torch.testing.assert_close(b2, torch.full_like(b2, 0.75))


@pytest.mark.parametrize("n_in,n_out", [(7, 3), (5, 5), (2, 4), (9, 2), (43, 7), (1, 3)])
def test_pool_matrix_is_adaptive_average_pooling(n_in, n_out):
    x = torch.randn(3, n_in, dtype=torch.float64)
    torch.testing.assert_close(x @ pool_matrix(n_in, n_out).T, F.adaptive_avg_pool1d(x[:, None], n_out)[:, 0])


def test_attention_matrix_reproduces_output_per_channel():
    torch.manual_seed(0)
    m = _randomise(AgentAttention(12, 2, input_size=(6, 4), sr_ratio=2, agent_num=4, num_prefix_tokens=1)).double()
    hw = (5, 7)
    x = torch.randn(2, 1 + 35, 12, dtype=torch.float64)
    with torch.no_grad():
        q, k, v, kv_hw = m._project(x, hw)
        b1, b2 = m.biases(hw, kv_hw)
        out = agent_attention_ref(q, k, v, b1, b2, m.dwc.weight, m.dwc.bias, hw=hw, kv_hw=kv_hw, agent_hw=(2, 2),
                                  num_heads=2, prefix=1)
    d = 6
    for c in (0, 5):
        mat = m.attention_matrix(x, hw, channel=c)  # (B, h, N, n)
        for head in range(2):
            ch = head * d + c
            pred = mat[:, head] @ v[:, :, ch:ch + 1]
            pred[:, 1:] += m.dwc.bias[ch]
            assert_close(pred[..., 0], out[:, :, ch], name=f"channel {ch}")


def test_registered_and_class_token_needs_no_extra_agents():
    m = subquad.build_attention("agent", 32, 4, input_size=(7, 7), agent_num=16, num_prefix_tokens=1)
    assert isinstance(m, AgentAttention) and m.agent_hw == (4, 4)
    assert m.ac_bias.shape == (1, 4, 16, 1) and m.ca_bias.shape == (1, 4, 1, 16)
    names = {n for n, _ in subquad.build_attention("agent", 32, 4, input_size=(8, 8), sr_ratio=2).named_parameters()}
    assert {"sr.weight", "norm.weight", "qkv.weight", "dwc.weight", "ah_bias"} <= names
    assert "ac_bias" not in names
    assert subquad.build_attention("agent", 32, 4, input_size=(8, 8), sr_ratio=2).ah_bias.shape == (1, 4, 49, 4, 1)


@pytest.mark.parametrize("opts,word", [
    (dict(agent_num=10), "agent_num=10"), (dict(dwc_kernel_size=4), "dwc_kernel_size=4"),
    (dict(sr_ratio=0), "sr_ratio"),
    (dict(input_size=(2, 9), sr_ratio=3), "smaller than sr_ratio"),
])
def test_bad_options_are_one_line_user_errors(opts, word):
    kw = dict(input_size=(8, 8)) | opts
    with pytest.raises(UserError, match=word) as e:
        subquad.build_attention("agent", 32, 4, **kw)
    assert "\n" not in str(e.value)


def test_needs_a_grid_and_no_mask():
    m = subquad.build_attention("agent", 32, 4, input_size=(4, 4))
    with pytest.raises(ValueError, match="hw"):
        m(torch.randn(1, 16, 32), None)
    with pytest.raises(ValueError, match="mask"):
        m(torch.randn(1, 16, 32), (4, 4), torch.ones(1, 16, dtype=torch.bool))


def test_host_qkv_form_fast_equals_reference():
    """The host-projected form (Agent-CSwin's blocks): fast vs dense reference on outputs and every gradient, at
    the construction grid and at another, non-square grid."""
    torch.manual_seed(0)
    m = subquad.build_attention("agent", 24, 3, input_size=(6, 5), agent_num=4, host_qkv=True)
    assert isinstance(m, AgentCore) and not hasattr(m, "qkv") and m.get_v.groups == 24
    _randomise(m)
    for hw in ((6, 5), (7, 3)):
        q, k, v = torch.randn(3, 2, hw[0] * hw[1], 24)
        compare_module(m, lambda mm, a, b, c, g=hw: mm.forward_qkv(a, b, c, g),
                       lambda mm, a, b, c, g=hw: mm.forward_qkv(a, b, c, g, fused=False), [q, k, v])
    with pytest.raises(ValueError, match="forward_qkv"):
        m(torch.randn(1, 30, 24), (6, 5))
    # With a class token (CvT-style hosts that project q, k, v): its own biases, no LePE row.
    mc = _randomise(subquad.build_attention("agent", 24, 3, input_size=(4, 5), agent_num=4, host_qkv=True,
                                            num_prefix_tokens=1))
    assert mc.ac_bias.shape == (1, 3, 4, 1)
    q, k, v = torch.randn(3, 2, 1 + 4 * 5, 24)
    compare_module(mc, lambda mm, a, b, c: mm.forward_qkv(a, b, c, (4, 5)),
                   lambda mm, a, b, c: mm.forward_qkv(a, b, c, (4, 5), fused=False), [q, k, v])
