"""Softmax attention with PVT spatial reduction (sr_ratio) and PVTv2's pooled reduction (linear_sr)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import subquad
from subquad.attention.functional.softmax import adaptive_pool_2d, adaptive_pool_matrix, spatial_reduction_ref
from subquad.attention.softmax import MultiHeadAttention
from tests._tol import assert_close, compare_module


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kw,hw", [(dict(sr_ratio=2), (7, 9)), (dict(sr_ratio=3), (6, 4)),
                                   (dict(linear_sr=True), (5, 9)), (dict(linear_sr=True, pool_size=3), (10, 7))])
def test_fast_vs_reference(kw, hw, dtype):
    m = MultiHeadAttention(24, 3, **kw)
    x = torch.randn(2, hw[0] * hw[1], 24)
    compare_module(m, lambda mm, x: mm(x, hw), lambda mm, x: mm.forward_ref(x, hw), [x], dtype)


def test_reduction_refs_equal_torch_layers():
    x = torch.randn(2, 5, 7, 9, dtype=torch.float64)
    conv = torch.nn.Conv2d(5, 4, 2, 2).double()
    want = conv(x).flatten(2).transpose(1, 2)
    assert_close(spatial_reduction_ref(x, conv.weight, conv.bias, 2), want, torch.float64)
    for out in [(7, 7), (3, 4)]:
        pooled = F.adaptive_avg_pool2d(x, out).flatten(2).transpose(1, 2)
        m = adaptive_pool_matrix((7, 9), out, dtype=torch.float64)
        assert_close(torch.einsum("mn,bnc->bmc", m, x.flatten(2).transpose(1, 2)), pooled, torch.float64)


def test_pvt_layout_and_official_forward():
    """Key names of PVT / PVTv2 `Attention`, and the official forward written out."""
    m = subquad.build_attention("softmax", 16, 2, sr_ratio=2).double()
    assert set(m.state_dict()) == {f"{a}.{b}" for a in ("q", "kv", "sr", "norm", "proj") for b in ("weight", "bias")}
    lin = subquad.build_attention("softmax", 16, 2, linear_sr=True)
    assert set(lin.state_dict()) == set(m.state_dict()) and lin.sr.kernel_size == (1, 1)
    assert set(subquad.build_attention("softmax", 16, 2).state_dict()) == {"qkv.weight", "qkv.bias", "proj.weight",
                                                                          "proj.bias"}
    H, W = 6, 8
    x = torch.randn(2, H * W, 16, dtype=torch.float64)
    q = m.q(x).reshape(2, H * W, 2, 8).permute(0, 2, 1, 3)
    x_ = m.norm(m.sr(x.permute(0, 2, 1).reshape(2, 16, H, W)).reshape(2, 16, -1).permute(0, 2, 1))
    kv = m.kv(x_).reshape(2, -1, 2, 2, 8).permute(2, 0, 3, 1, 4)
    attn = (q @ kv[0].transpose(-2, -1) * 8 ** -0.5).softmax(-1)
    out = m.proj((attn @ kv[1]).transpose(1, 2).reshape(2, H * W, 16))
    assert_close(m(x, (H, W)), out, torch.float64)


def test_gradcheck_tiny():
    m = MultiHeadAttention(2, 1, sr_ratio=2).double()
    x = torch.randn(1, 8, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: m(x, (2, 4)), (x,), fast_mode=True)


@pytest.mark.parametrize("kw", [dict(sr_ratio=2), dict(linear_sr=True, pool_size=2)])
def test_attention_matrix(kw):
    m = MultiHeadAttention(16, 2, **kw)
    a = m.attention_matrix(torch.randn(2, 35, 16), (5, 7))
    assert a.shape == (2, 2, 35, 35)
    torch.testing.assert_close(a.sum(-1), torch.ones(2, 2, 35))
    if "sr_ratio" in kw:
        # The dropped last row (H = 5, sr = 2) is read by nobody.
        assert (a[..., 28:] == 0).all()


def test_bad_inputs():
    m = MultiHeadAttention(16, 2, sr_ratio=2)
    with pytest.raises(ValueError, match="mask"):
        m(torch.randn(1, 16, 16), (4, 4), torch.ones(1, 16, dtype=torch.bool))
    with pytest.raises(ValueError, match="hw"):
        m(torch.randn(1, 16, 16))
    with pytest.raises(ValueError, match="hw"):
        m(torch.randn(1, 16, 16), (4, 5))
    with pytest.raises(ValueError, match="sr_ratio"):
        m(torch.randn(1, 9, 16), (1, 9))
    with pytest.raises(ValueError, match="sr_ratio"):
        MultiHeadAttention(16, 2, sr_ratio=0)
    with pytest.raises(ValueError, match="causal"):
        MultiHeadAttention(16, 2, sr_ratio=2, causal=True)
    with pytest.raises(ValueError, match="num_heads"):
        MultiHeadAttention(18, 4, sr_ratio=2)


def _export_hw(fn, example_hw, low: int = 4):
    """torch.export of fn over a map (B, C, H, W) with H and W symbolic: the program as a callable."""

    class Wrap(torch.nn.Module):
        def forward(self, x):
            return fn(x)

    dims = {"x": {2: torch.export.Dim("H", min=low, max=64), 3: torch.export.Dim("W", min=low, max=64)}}
    return torch.export.export(Wrap(), (torch.randn(2, 6, *example_hw),), dynamic_shapes=dims, strict=False).module()


def test_exported_adaptive_pooling_equals_eager_at_every_size():
    """Inside torch.export the pooling is two products with bin matrices over the symbolic sides (torch.onnx's graph
    of adaptive_avg_pool2d over symbolic sides computes other bins, or runs out of bounds, off the traced size)."""
    prog = _export_hw(lambda x: adaptive_pool_2d(x, (3, 4)), (10, 13))
    assert "adaptive_avg_pool" not in str(prog.graph)
    for hw in [(10, 13), (7, 29), (4, 4), (64, 5)]:
        x = torch.randn(2, 6, *hw)
        torch.testing.assert_close(prog(x), F.adaptive_avg_pool2d(x, (3, 4)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("attn", ["softmax", "focused_linear"])
def test_exported_pvt_v2_pooled_keys_equal_eager_at_every_size(attn):
    """PVTv2's pooled keys (linear_sr) in an exported program: the 7 x 7 pooling follows the symbolic grid."""
    torch.manual_seed(0)
    m = subquad.build_attention(attn, 6, 2, input_size=(9, 11), linear_sr=True).eval()

    def run(x):
        B, C, H, W = x.shape
        return m(x.flatten(2).transpose(1, 2), (H, W))

    with torch.no_grad():
        prog = _export_hw(run, (9, 11), low=8)
        assert "adaptive_avg_pool" not in str(prog.graph)
        for hw in [(9, 11), (8, 23), (30, 13)]:
            x = torch.randn(2, 6, *hw)
            torch.testing.assert_close(prog(x), run(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("hw,out", [((7, 11), (3, 4)), ((5, 3), (7, 7)), ((13, 9), (7, 2))])
def test_export_form_of_adaptive_pooling_matches_torch_outputs_and_gradients(hw, out, monkeypatch):
    """The bin-matrix form adaptive_pool_2d takes inside torch.export, run eagerly in float64 (odd, non-square maps,
    overlapping bins where out > hw): outputs and input gradients equal F.adaptive_avg_pool2d's."""
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    x = torch.randn(2, 3, *hw, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 3, *out, dtype=torch.float64)
    (gx,) = torch.autograd.grad((adaptive_pool_2d(x, out) * g).sum(), x)
    (want_gx,) = torch.autograd.grad((F.adaptive_avg_pool2d(x, out) * g).sum(), x)
    assert_close(adaptive_pool_2d(x, out), F.adaptive_avg_pool2d(x, out), torch.float64)
    assert_close(gx, want_gx, torch.float64)
