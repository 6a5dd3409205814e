"""CvT*-LS [unofficial] and the CvT softmax baselines: attention paths, convolutional projections, counts."""

from __future__ import annotations

import torch

import subquad
from subquad.models.cvt_ls import ConvProjAttention
from tests._tol import compare_module


def test_conv_proj_long_short_fast_equals_reference():
    """The long-short core behind CvT's convolutional projections (host-projected q/k/v, conv W^P): SDPA path == dense
    reference, output and every gradient, with a class token and a non-square, non-divisible grid."""
    m = ConvProjAttention(16, 2, "long_short", num_prefix_tokens=1, window_size=3, rank=4).eval()
    # shift-invariant softmax: its gradient is zero in exact arithmetic
    m.mixer.to_dynamic_projection.bias.requires_grad_(False)
    hw = (5, 4)
    x = torch.randn(2, 1 + 20, 16)

    def fast(mod, x):
        return mod(x, hw)

    def ref(mod, x):
        mod.mixer.fused = False
        try:
            return mod(x, hw)
        finally:
            mod.mixer.fused = True

    for dtype in (torch.float64, torch.float32):
        compare_module(m, fast, ref, [x], dtype)


def test_softmax_baseline_uses_strided_keys():
    m = ConvProjAttention(16, 2, "softmax", num_prefix_tokens=1)
    assert m.conv_proj_k.conv.stride == (2, 2) and m.conv_proj_q.conv.stride == (1, 1)
    out = m(torch.randn(1, 1 + 35, 16), (5, 7))
    assert out.shape == (1, 36, 16) and torch.isfinite(out).all()


def test_long_short_projection_is_weight_standardised():
    m = ConvProjAttention(8, 2, "long_short", window_size=2, rank=2)
    assert type(m.mixer.dp_conv).__name__ == "StdConv2d" and m.mixer.dp_conv.groups == 8
    assert m.conv_proj_q.conv.stride == m.conv_proj_k.conv.stride == (1, 1)


def test_hosts_are_one_keyword_apart():
    ls = subquad.create_model("cvt_ls_13", device="meta")
    sm = subquad.create_model("cvt_13", device="meta")
    extra = set(ls.state_dict()) - set(sm.state_dict())
    assert extra and all(".attn.mixer." in k for k in extra)
    assert "stage2.cls_token" in ls.state_dict() and "stage1.cls_token" not in ls.state_dict()


def test_prune_drops_dead_stages():
    """prune_intermediate_layers keeps the stages up to the last taken one, parameters included."""
    m = subquad.create_model("cvt_ls_micro").eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        want = m.forward_intermediates(x, indices=[1], intermediates_only=True)
        assert m.prune_intermediate_layers([1]) == [1]
        got = m.forward_intermediates(x, indices=[1], intermediates_only=True)
    assert not any(n.startswith("stage2.") for n, _ in m.named_parameters())
    torch.testing.assert_close(got, want)
