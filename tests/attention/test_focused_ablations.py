"""FLatten Tab. 4 ablation `kernel_size=0` (the focused function without the DWC, "+ f_p"): fast path vs the dense
reference on outputs and every gradient at odd non-square sizes, equality with a zeroed DWC, the equivalent map,
the parameters it removes, a micro FLatten-DeiT step, and the refusals."""

from __future__ import annotations

import pytest
import torch

import subquad
from subquad.attention.focused_linear import FocusedLinearAttention
from subquad.attention.functional.focused import focused_linear_attention_kv, focused_linear_attention_ref
from subquad.errors import UserError
from tests._tol import assert_close, compare_fn, compare_module


def _randomise(m: FocusedLinearAttention) -> FocusedLinearAttention:
    with torch.no_grad():
        m.scale.normal_(0, 1)
        m.positional_encoding.normal_(0, 0.5)
    return m


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", [dict(hw=(7, 5)), dict(hw=(5, 7), kv_hw=(2, 3), prefix=1),
                                  dict(hw=(6, 5), lepe=True)])
def test_functional_without_dwc_fast_vs_ref(case, dtype):
    hw, kv_hw, P, C, h = case["hw"], case.get("kv_hw", case["hw"]), case.get("prefix", 0), 12, 3
    q = torch.randn(2, P + hw[0] * hw[1], C)
    k, v = torch.randn(2, P + kv_hw[0] * kv_hw[1], C), torch.randn(2, P + kv_hw[0] * kv_hw[1], C)
    inputs = [q, k, v, torch.randn(1, 1, C)]
    lepe = [torch.randn(C, 1, 3, 3) * 0.3, torch.randn(C) * 0.1] if case.get("lepe") else []
    kw = dict(hw=hw, kv_hw=kv_hw, num_heads=h, prefix=P)
    compare_fn(lambda q, k, v, s, *lp: focused_linear_attention_kv(q, k, v, s, None, None, *lp, **kw),
               lambda q, k, v, s, *lp: focused_linear_attention_ref(q, k, v, s, None, None, *lp, **kw),
               inputs + lepe, dtype)


MODULE_CASES = {
    "qkv_7x9": (dict(), (7, 9)),
    "prefix_deit_5x6": (dict(num_prefix_tokens=1), (5, 6)),
    "q_kv_sr2_7x9": (dict(sr_ratio=2), (7, 9)),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(MODULE_CASES))
def test_module_without_dwc_fast_vs_ref(case, dtype):
    kw, hw = MODULE_CASES[case]
    m = _randomise(FocusedLinearAttention(24, 3, input_size=(7, 9), kernel_size=0, **kw))
    assert m.dwc is None
    x = torch.randn(2, m.num_prefix_tokens + hw[0] * hw[1], 24)
    compare_module(m, lambda mm, x: mm(x, hw), lambda mm, x: mm.forward_ref(x, hw), [x], dtype)


def test_kernel0_equals_zeroed_dwc_and_removes_only_the_dwc():
    torch.manual_seed(0)
    full = _randomise(FocusedLinearAttention(24, 3, input_size=(5, 7), num_prefix_tokens=1)).double()
    fp = FocusedLinearAttention(24, 3, input_size=(5, 7), num_prefix_tokens=1, kernel_size=0).double()
    sd = full.state_dict()
    assert set(sd) - set(fp.state_dict()) == {"dwc.weight", "dwc.bias"}
    assert set(fp.state_dict()) < set(sd)
    fp.load_state_dict({k: v for k, v in sd.items() if not k.startswith("dwc.")})
    with torch.no_grad():
        full.dwc.weight.zero_()
        full.dwc.bias.zero_()
    x = torch.randn(2, 1 + 5 * 7, 24, dtype=torch.float64)
    assert_close(fp(x, (5, 7)), full(x, (5, 7)), name="kernel_size=0 vs zeroed DWC")
    d = 8
    n_full, n_fp = (sum(p.numel() for p in m.parameters()) for m in (full, fp))
    assert n_full - n_fp == d * 5 * 5 + d


def test_kernel0_attention_matrix_is_the_whole_map():
    m = _randomise(FocusedLinearAttention(16, 2, input_size=(5, 3), kernel_size=0)).double()
    x = torch.randn(1, 15, 16, dtype=torch.float64)
    a = m.attention_matrix(x, (5, 3))  # (1, h, N, N)
    with torch.no_grad():
        q, k, v, kv_hw = m._project(x, (5, 3))
        core = m._core(q, k, v, (5, 3), kv_hw, True)  # before proj
    vh = v.reshape(1, 15, 2, 8).transpose(1, 2)
    assert_close((a @ vh).transpose(1, 2).reshape(1, 15, 16), core, name="map @ v vs core")


def test_flatten_deit_without_dwc_params_and_step():
    tiny = subquad.create_model("flatten_deit_tiny", attn_kwargs={"kernel_size": 0}, device="meta")
    n = sum(p.numel() for p in tiny.parameters())
    # the card's 6,193,576 minus 12 blocks x (64 x 5 x 5 + 64) DWC parameters
    assert n == 6_193_576 - 12 * (64 * 25 + 64)
    m = subquad.create_model("flatten_deit_micro", num_classes=3, attn_kwargs={"kernel_size": 0})
    assert not any(".dwc." in k for k in m.state_dict())
    x = torch.randn(2, 3, 32, 32)
    loss = m(x).logsumexp(-1).mean()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters() if p.requires_grad)
    default = subquad.create_model("flatten_deit_micro", num_classes=3)
    assert sum(".dwc." in k for k in default.state_dict()) == 2 * 4


@pytest.mark.parametrize("bad", [-1, 2, 4, 1.0])
def test_bad_kernel_size_refused(bad):
    with pytest.raises(UserError, match="kernel_size"):
        FocusedLinearAttention(16, 2, input_size=(4, 4), kernel_size=bad)
