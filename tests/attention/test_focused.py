"""FLatten focused linear attention: feature map properties, fast vs dense reference for every layout and option,
PE resize, equivalent map, precision and errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import subquad
from subquad.attention.focused_linear import FocusedLinearAttention, FocusedLinearCore
from subquad.attention.functional.focused import (
    focused_feature_map,
    focused_linear_attention_kv,
    focused_linear_attention_ref,
    resize_pe,
)
from subquad.attention.functional.linear import linear_attention
from tests._tol import assert_close, compare_fn, compare_module


def _randomise(m: FocusedLinearAttention) -> FocusedLinearAttention:
    with torch.no_grad():
        m.scale.normal_(0, 1)
        m.positional_encoding.normal_(0, 0.5)
        m.dwc.bias.normal_(0, 0.1)
    return m


def test_feature_map_preserves_norm_and_p1_is_scaled_relu():
    x = torch.randn(3, 11, 24, dtype=torch.float64) * 2
    scale = torch.randn(1, 1, 24, dtype=torch.float64)
    t = (F.relu(x) + 1e-6) / F.softplus(scale)
    for p in (2, 3, 4.5):
        phi = focused_feature_map(x, scale, p)
        torch.testing.assert_close(phi.norm(dim=-1), t.norm(dim=-1), rtol=1e-12, atol=0)
        assert (phi > 0).all()
    torch.testing.assert_close(focused_feature_map(x, scale, 1), t, rtol=1e-14, atol=0)
    # Focusing sharpens: the largest coordinate gains share of the norm.
    phi3 = focused_feature_map(x, scale, 3)
    assert ((phi3.amax(-1) / phi3.norm(dim=-1)) >= (t.amax(-1) / t.norm(dim=-1)) - 1e-12).all()


def test_mean_normaliser_is_sum_with_eps_times_n():
    q, k, v = (torch.rand(2, 2, 9, 4, dtype=torch.float64) for _ in range(3))
    n = 9
    torch.testing.assert_close(linear_attention(q, k, v, "mean", 1e-3), linear_attention(q, k, v, "sum", 1e-3 * n))


FUNC_CASES = {
    "plain_7x9": dict(hw=(7, 9)),
    "sr2_bilinear_13x5": dict(hw=(13, 5), kv_hw=(6, 2)),
    "sr2_flat1d_7x9": dict(hw=(7, 9), kv_hw=(3, 4), sr_mode="flat1d"),
    "prefix_sum": dict(hw=(5, 7), prefix=1, normaliser="sum"),
    "lepe": dict(hw=(6, 5), lepe=True),
}


def _func_inputs(case, B=2, C=12, h=3, dtype=torch.float64):
    hw, kv_hw, P = case["hw"], case.get("kv_hw", case["hw"]), case.get("prefix", 0)
    d = C // h
    q = torch.randn(B, P + hw[0] * hw[1], C, dtype=dtype)
    k = torch.randn(B, P + kv_hw[0] * kv_hw[1], C, dtype=dtype)
    v = torch.randn_like(k)
    inputs = [q, k, v, torch.randn(1, 1, C), torch.randn(d, 1, 5, 5) * 0.2, torch.randn(d) * 0.1]
    if case.get("lepe"):
        inputs += [torch.randn(C, 1, 3, 3) * 0.3, torch.randn(C) * 0.1]
    kw = dict(hw=hw, kv_hw=kv_hw, num_heads=h, prefix=P, normaliser=case.get("normaliser", "mean"),
              sr_mode=case.get("sr_mode", "bilinear"))
    return inputs, kw


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(FUNC_CASES))
def test_functional_fast_vs_ref(case, dtype):
    inputs, kw = _func_inputs(FUNC_CASES[case])
    compare_fn(lambda *a: focused_linear_attention_kv(*a, **kw), lambda *a: focused_linear_attention_ref(*a, **kw),
               inputs, dtype)


def test_gradcheck_tiny():
    inputs, kw = _func_inputs(dict(hw=(2, 2), kv_hw=(2, 2), prefix=1), B=1, C=4, h=2)
    inputs = [t.double().requires_grad_(True) for t in inputs]
    assert torch.autograd.gradcheck(lambda *a: focused_linear_attention_kv(*a, **kw), inputs)


MODULE_CASES = {
    "qkv_7x9": dict(kw={}, hw=(7, 9)),
    "qkv_pe_resized_13x5": dict(kw={}, hw=(13, 5)),
    "q_kv_sr2_odd_7x9": dict(kw=dict(sr_ratio=2), hw=(7, 9)),
    "q_kv_sr3_flat1d": dict(kw=dict(sr_ratio=3, sr_mode="flat1d"), hw=(9, 6)),
    "q_kv_linear_sr": dict(kw=dict(linear_sr=True, dwc_init="pvt_v2"), hw=(8, 5)),
    "prefix_deit": dict(kw=dict(num_prefix_tokens=1), hw=(5, 6)),
    "prefix_sr2": dict(kw=dict(sr_ratio=2, num_prefix_tokens=1), hw=(6, 5)),
    "lepe_sum": dict(kw=dict(lepe=True, normaliser="sum"), hw=(7, 9)),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(MODULE_CASES))
def test_module_fast_vs_ref(case, dtype):
    c = MODULE_CASES[case]
    m = _randomise(FocusedLinearAttention(24, 3, input_size=(7, 9), **c["kw"]))
    hw = c["hw"]
    x = torch.randn(2, m.num_prefix_tokens + hw[0] * hw[1], 24)
    compare_module(m, lambda mm, x: mm(x, hw), lambda mm, x: mm.forward_ref(x, hw), [x], dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_host_qkv_forward_qkv(dtype):
    m = _randomise(FocusedLinearCore(16, 2, input_size=(6, 6), lepe=True))
    assert not hasattr(m, "proj") and not hasattr(m, "qkv")
    q, k, v = (torch.randn(2, 35, 16) for _ in range(3))
    compare_module(m, lambda mm, *t: mm.forward_qkv(*t, (7, 5)), lambda mm, *t: mm.forward_qkv(*t, (7, 5), fused=False),
                   [q, k, v], dtype)
    with pytest.raises(ValueError, match="forward_qkv"):
        m(q, (7, 5))


def test_prefix_rule_and_pe_slots():
    m = _randomise(FocusedLinearAttention(16, 2, input_size=(4, 4), num_prefix_tokens=1)).double()
    assert m.positional_encoding.shape == (1, 17, 16)
    x = torch.randn(1, 1 + 30, 16, dtype=torch.float64)
    with torch.no_grad():
        q, k, v, kv_hw = m._project(x, (5, 6))
        pe = m._pe(kv_hw)
    # The cls slot is never resized.
    assert pe.shape == (1, 31, 16) and torch.equal(pe[:, 0], m.positional_encoding[:, 0])
    # The DWC term of the cls row is zero: changing the DWC leaves the cls output unchanged.
    y1 = m(x, (5, 6))
    with torch.no_grad():
        m.dwc.weight.mul_(3)
        m.dwc.bias.add_(1)
    y2 = m(x, (5, 6))
    torch.testing.assert_close(y1[:, 0], y2[:, 0])
    assert not torch.allclose(y1[:, 1:], y2[:, 1:])


def test_pe_resize_equals_official_loader_rule():
    pe = torch.randn(1, 1 + 7 * 7, 8)
    out = resize_pe(pe, (7, 7), (10, 12), prefix=1)
    grid = pe[:, 1:].reshape(1, 7, 7, 8).permute(0, 3, 1, 2)
    want = F.interpolate(grid, size=(10, 12), mode="bicubic", align_corners=False).permute(0, 2, 3, 1).reshape(1, -1, 8)
    torch.testing.assert_close(out, torch.cat([pe[:, :1], want], 1))
    assert resize_pe(pe, (7, 7), (7, 7), 1) is pe


@pytest.mark.parametrize("pe_hw,hw,prefix", [((7, 7), (10, 12), 0), ((9, 5), (4, 13), 1), ((6, 8), (6, 3), 0)])
def test_pe_resize_is_the_bicubic_kernel(pe_hw, hw, prefix):
    """The separable two-GEMM resize equals F.interpolate's bicubic kernel (up- and downsampling, non-square), in
    float32 and float64, also under bf16 autocast (where it stays in the PE's dtype), on outputs and the PE's
    gradient."""
    for dtype in (torch.float32, torch.float64):
        pe = torch.randn(1, prefix + pe_hw[0] * pe_hw[1], 6, dtype=dtype)
        grid = pe[:, prefix:].reshape(1, *pe_hw, 6).permute(0, 3, 1, 2)
        want = F.interpolate(grid, size=hw, mode="bicubic", align_corners=False).permute(0, 2, 3, 1).reshape(1, -1, 6)
        want = torch.cat([pe[:, :prefix], want], 1)
        assert_close(resize_pe(pe, pe_hw, hw, prefix), want, dtype, "resized PE")
        with torch.autocast("cpu", torch.bfloat16):
            got = resize_pe(pe, pe_hw, hw, prefix)
        assert got.dtype == dtype
        assert_close(got, want, dtype, "resized PE under autocast")
        # the PE is trained at other grids: its gradient through the resize equals the bicubic kernel's
        pe.requires_grad_(True)
        w = torch.randn_like(want)
        g_got, = torch.autograd.grad((resize_pe(pe, pe_hw, hw, prefix) * w).sum(), pe)
        grid = pe[:, prefix:].reshape(1, *pe_hw, 6).permute(0, 3, 1, 2)
        ref = F.interpolate(grid, size=hw, mode="bicubic", align_corners=False).permute(0, 2, 3, 1).reshape(1, -1, 6)
        g_want, = torch.autograd.grad((torch.cat([pe[:, :prefix], ref], 1) * w).sum(), pe)
        assert_close(g_got, g_want, dtype, "PE gradient")


def test_resized_pe_cached_in_eval_and_invalidated():
    """Eval without autograd reuses the resized PE; an in-place PE edit (as load_state_dict does) or another grid
    recomputes it; training and grad-enabled calls never use the cache."""
    m = _randomise(FocusedLinearAttention(16, 2, input_size=(7, 7))).eval()
    x = torch.randn(1, 99, 16)
    with torch.no_grad():
        y = m(x, (9, 11))
        assert m._pe_cache is not None and m._pe_cache[1].shape == (1, 99, 16)
        cached = m._pe_cache[1]
        assert torch.equal(m(x, (9, 11)), y) and m._pe_cache[1] is cached
        m.positional_encoding.add_(0.5)
        y2 = m(x, (9, 11))
        assert m._pe_cache[1] is not cached and not torch.allclose(y2, y)
        torch.testing.assert_close(m._pe_cache[1], resize_pe(m.positional_encoding, (7, 7), (9, 11)))
        m(torch.randn(1, 64, 16), (8, 8))
        assert m._pe_cache[1].shape == (1, 64, 16)
    assert torch.equal(m(x, (9, 11)).detach(), y2)  # grad enabled: recomputed, same values
    m.train()
    assert m._pe_cache is None


def test_module_at_construction_grid_equals_module_built_there():
    a = _randomise(FocusedLinearAttention(16, 2, input_size=(7, 7)))
    b = FocusedLinearAttention(16, 2, input_size=(9, 11))
    sd = dict(a.state_dict())
    sd["positional_encoding"] = resize_pe(sd["positional_encoding"], (7, 7), (9, 11))
    b.load_state_dict(sd)
    x = torch.randn(1, 99, 16)
    torch.testing.assert_close(a(x, (9, 11)), b(x, (9, 11)))


def test_sr_modes_differ_and_match_official_1d():
    m = _randomise(FocusedLinearAttention(16, 2, input_size=(6, 6), sr_ratio=2))
    x = torch.randn(1, 36, 16)
    y_bil = m(x, (6, 6))
    m.sr_mode = "flat1d"
    y_flat = m(x, (6, 6))
    assert not torch.allclose(y_bil, y_flat)
    # Official 1-D rule written out: interpolate along the flattened key tokens to N, then view as (H, W).
    with torch.no_grad():
        q, k, v, kv_hw = m._project(x, (6, 6))
        vt = F.interpolate(v.transpose(1, 2), size=36, mode="linear", align_corners=False)  # (B, C, N)
        vm = vt.reshape(1, 2, 8, 6, 6).reshape(2, 8, 6, 6)
        dwc = m.dwc(vm).reshape(1, 16, 36).transpose(1, 2)
        m.dwc.weight.zero_()
        m.dwc.bias.zero_()
        lin = m(x, (6, 6))
        torch.testing.assert_close(y_flat, lin + dwc @ m.proj.weight.T, rtol=1e-5, atol=1e-6)


def test_attention_matrix_exact_per_channel_and_rank():
    m = _randomise(FocusedLinearAttention(16, 2, input_size=(8, 8), lepe=True)).double()
    x = torch.randn(1, 64, 16, dtype=torch.float64)
    with torch.no_grad():
        q, k, v, _ = m._project(x, (8, 8))
        core = m._core(q, k, v, (8, 8), (8, 8), True)  # (B, N, C) before proj
    vh = v.reshape(1, 64, 2, 8).transpose(1, 2)  # (B, h, N, d)
    for c in (0, 5):
        a = m.attention_matrix(x, (8, 8), channel=c)
        assert a.shape == (1, 2, 64, 64)
        for head in range(2):
            want = core[0, :, head * 8 + c] - m.dwc.bias[c] - m.get_v.bias[head * 8 + c]
            torch.testing.assert_close(a[0, head] @ vh[0, head, :, c], want)
    # FLatten Fig. 5: the linear part has rank <= d = 8; with the DWC the map is (near) full rank.
    m2 = _randomise(FocusedLinearAttention(16, 2, input_size=(8, 8))).double()
    full = torch.linalg.matrix_rank(m2.attention_matrix(x, (8, 8))[0, 0]).item()
    with torch.no_grad():
        m2.dwc.weight.zero_()
    low = torch.linalg.matrix_rank(m2.attention_matrix(x, (8, 8))[0, 0]).item()
    assert low <= 8 < full


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_large_inputs_finite(dtype):
    m = _randomise(FocusedLinearAttention(32, 4, input_size=(7, 7)))
    x = torch.randn(1, 49, 32) * 2000
    with torch.autocast("cpu", dtype=dtype):
        y = m(x, (7, 7))
    assert torch.isfinite(y).all()
    y2 = m.to(dtype)(x.to(dtype), (7, 7))
    assert y2.dtype == dtype and torch.isfinite(y2).all()
    ref = m.double().forward_ref(x.to(dtype).double(), (7, 7))
    rel = ((y2.double() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
    assert rel < (5e-2 if dtype == torch.bfloat16 else 1e-2)


def test_one_set_of_parameter_names_and_init():
    def names(**kw):
        return {n for n, _ in FocusedLinearAttention(32, 4, input_size=(8, 8), **kw).named_parameters()}

    common = {"scale", "positional_encoding", "dwc.weight", "dwc.bias"}
    assert names() == common | {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"}
    assert names(sr_ratio=2) == names() | {"sr.weight", "sr.bias", "norm.weight", "norm.bias"}
    assert names(linear_sr=True) == names(sr_ratio=2)
    # a host that projects q, k, v itself gets no projection layers
    core = subquad.build_attention("focused_linear", 32, 4, input_size=(8, 8), host_qkv=True, lepe=True)
    assert type(core) is FocusedLinearCore
    assert {n for n, _ in core.named_parameters()} == common | {"get_v.weight", "get_v.bias"}
    m = FocusedLinearAttention(32, 4, input_size=(8, 8), sr_ratio=2, dwc_init="pvt_v2")
    assert m.positional_encoding.shape == (1, 16, 32) and m.dwc.weight.shape == (8, 1, 5, 5)
    assert (m.scale == 0).all() and (m.positional_encoding == 0).all() and (m.dwc.bias == 0).all()
    std = FocusedLinearAttention(64, 1, input_size=(8, 8), dwc_init="pvt_v2").dwc.weight.std().item()
    assert abs(std - math.sqrt(2 / 25)) < 0.03
    built = subquad.build_attention("focused_linear", 32, 4, input_size=(8, 8), device="meta")
    assert built.positional_encoding.is_meta


def test_bad_inputs():
    with pytest.raises(ValueError, match="input_size"):
        FocusedLinearAttention(32, 4)
    with pytest.raises(TypeError, match="qkv_layout"):
        FocusedLinearAttention(32, 4, input_size=8, qkv_layout="q_kv")
    with pytest.raises(ValueError, match="sr_ratio"):
        FocusedLinearAttention(32, 4, input_size=8, sr_ratio=0)
    with pytest.raises(ValueError, match="sr_mode"):
        FocusedLinearAttention(32, 4, input_size=8, sr_mode="nearest")
    with pytest.raises(ValueError, match="normaliser"):
        FocusedLinearAttention(32, 4, input_size=8, normaliser="max")
    with pytest.raises(ValueError, match="kernel_size"):
        FocusedLinearAttention(32, 4, input_size=8, kernel_size=4)
    m = FocusedLinearAttention(32, 4, input_size=8, sr_ratio=4)
    with pytest.raises(ValueError, match="sr_ratio"):
        m(torch.randn(1, 6, 32), (2, 3))
    with pytest.raises(ValueError, match="hw"):
        m(torch.randn(1, 64, 32), (8, 7))
    with pytest.raises(ValueError, match="hw"):
        m(torch.randn(1, 64, 32))
    e = FocusedLinearCore(32, 4, input_size=8)
    with pytest.raises(ValueError, match="same shape"):
        e.forward_qkv(torch.randn(1, 64, 32), torch.randn(1, 63, 32), torch.randn(1, 64, 32), (8, 8))
