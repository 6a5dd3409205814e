"""InLine attention: fast (K^T V + grouped conv) vs dense reference on outputs and every gradient, every kernel,
odd and non-square grids, class tokens; the injectivity / row-sum facts; the official formula; errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import subquad
from subquad.attention.functional.inline import (
    KERNELS,
    inline_attention_kv,
    inline_attention_matrix,
    inline_attention_ref,
)
from subquad.attention.inline import InLineAttention
from subquad.errors import UserError
from tests._tol import assert_close, compare_fn, compare_module

FUNC_CASES = {
    "identity_7x9": dict(hw=(7, 9)),
    "relu_5x3": dict(hw=(5, 3), kernel="relu"),
    "leakyrelu_4x6": dict(hw=(4, 6), kernel="leakyrelu"),
    "exp_3x5": dict(hw=(3, 5), kernel="exp"),
    "prefix_5x7": dict(hw=(5, 7), prefix=1),
    "no_local_6x5": dict(hw=(6, 5), local=False),
}


def _func_inputs(case, B=2, C=12, h=3, dtype=torch.float64):
    hw, P = case["hw"], case.get("prefix", 0)
    N = P + hw[0] * hw[1]
    q, k, v = (torch.randn(B, N, C, dtype=dtype) for _ in range(3))
    inputs = [q, k, v, torch.randn(B, C, 3, 3, dtype=dtype) * 0.3 if case.get("local", True) else None]
    kw = dict(hw=hw, num_heads=h, kernel=case.get("kernel", "identity"), prefix=P)
    return inputs, kw


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(FUNC_CASES))
def test_functional_fast_vs_ref(case, dtype):
    inputs, kw = _func_inputs(FUNC_CASES[case])
    compare_fn(lambda *a: inline_attention_kv(*a, **kw), lambda *a: inline_attention_ref(*a, **kw), inputs, dtype)


@pytest.mark.parametrize("case", ["identity_7x9", "prefix_5x7", "relu_5x3"])
def test_export_form_fast_vs_ref(case, monkeypatch):
    """Inside torch.export the per-sample 3 x 3 conv is a sum of shifted maps (ONNX's Conv cannot take a group count
    that depends on the symbolic batch): the same function, outputs and every gradient, in float64."""
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    inputs, kw = _func_inputs(FUNC_CASES[case])
    compare_fn(lambda *a: inline_attention_kv(*a, **kw), lambda *a: inline_attention_ref(*a, **kw), inputs,
               torch.float64)


def test_gradcheck_tiny():
    inputs, kw = _func_inputs(dict(hw=(2, 3), prefix=1), B=1, C=4, h=2)
    inputs = [t.requires_grad_(True) for t in inputs]
    assert torch.autograd.gradcheck(lambda *a: inline_attention_kv(*a, **kw), inputs)


def _official_formula(q, k, v, w, hw, h):
    """The official line-by-line computation (LeapLabTHU/InLine `inline_pvt.py` `InLineAttention.forward`,
    identity kernel, no class token), rewritten with an explicit (H, W) grid."""
    b, n, c = q.shape
    d = c // h
    scale = d ** -0.5
    q, k, v = (t.reshape(b, n, h, d).permute(0, 2, 1, 3) for t in (q, k, v))
    kv = (k.transpose(-2, -1) * (scale / n) ** 0.5) @ (v * (scale / n) ** 0.5)
    x = q @ kv + (1 - q @ k.mean(dim=2, keepdim=True).transpose(-2, -1) * scale) * v.mean(dim=2, keepdim=True)
    x = x.transpose(1, 2).reshape(b, n, c)
    vm = v.transpose(1, 2).reshape(b, hw[0], hw[1], c).permute(0, 3, 1, 2).reshape(1, b * c, hw[0], hw[1])
    res = F.conv2d(vm, w.reshape(b * c, 1, 3, 3), None, padding=(1, 1), groups=b * c)
    return x + res.reshape(b, c, n).permute(0, 2, 1)


def test_matches_official_formula():
    inputs, kw = _func_inputs(dict(hw=(6, 6)))
    assert_close(inline_attention_kv(*inputs, **kw), _official_formula(*inputs, (6, 6), 3), torch.float64)


@pytest.mark.parametrize("kernel", KERNELS)
def test_rows_sum_to_one_and_constant_v_passes(kernel):
    q, k = torch.randn(2, 23, 8, dtype=torch.float64), torch.randn(2, 23, 8, dtype=torch.float64)
    a = inline_attention_matrix(q, k, num_heads=2, kernel=kernel)
    torch.testing.assert_close(a.sum(-1), torch.ones(2, 2, 23, dtype=torch.float64), rtol=0, atol=1e-12)
    # Injectivity (paper Prop. 2): queries that differ by a scale get different maps (plain linear attention,
    # normalised by the row sum, maps q and 2q to the same row).
    if kernel == "identity":
        a2 = inline_attention_matrix(2 * q, k, num_heads=2, kernel=kernel)
        assert (a2 - a).abs().amax() > 1e-3


MODULE_CASES = {
    "identity_7x9": dict(kw={}, hw=(7, 9)),
    "relu_odd_5x3": dict(kw=dict(kernel_func="relu"), hw=(5, 3)),
    "exp_9x4": dict(kw=dict(kernel_func="exp"), hw=(9, 4)),
    "leakyrelu_prefix_deit": dict(kw=dict(kernel_func="leakyrelu", num_prefix_tokens=1), hw=(5, 6)),
    "no_local_bias_off": dict(kw=dict(local_residual=False, qkv_bias=False), hw=(4, 7)),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(MODULE_CASES))
def test_module_fast_vs_ref(case, dtype):
    c = MODULE_CASES[case]
    m = InLineAttention(24, 3, input_size=(7, 9), **c["kw"])
    with torch.no_grad():
        if m.qkv.bias is not None:
            m.qkv.bias.normal_(0, 0.1)
    hw = c["hw"]
    x = torch.randn(2, m.num_prefix_tokens + hw[0] * hw[1], 24)
    compare_module(m, lambda mm, x: mm(x, hw), lambda mm, x: mm.forward_ref(x, hw), [x], dtype)


def test_prefix_rule():
    """The class row gets no local term (changing the predicted kernels leaves it), and the class token enters the
    token mean that predicts the kernels."""
    m = InLineAttention(16, 2, num_prefix_tokens=1).double()
    x = torch.randn(1, 1 + 30, 16, dtype=torch.float64)
    y1 = m(x, (5, 6))
    with torch.no_grad():
        m.residual[2].bias.add_(1.0)
    y2 = m(x, (5, 6))
    torch.testing.assert_close(y1[:, 0], y2[:, 0])
    assert not torch.allclose(y1[:, 1:], y2[:, 1:])
    x2 = x.clone()
    x2[:, 0] += 3.0
    with torch.no_grad():
        assert not torch.allclose(m.local_kernels(x2), m.local_kernels(x))


def test_attention_matrix_reproduces_output():
    m = InLineAttention(16, 2, num_prefix_tokens=1).double()
    hw = (4, 5)
    x = torch.randn(2, 1 + 20, 16, dtype=torch.float64)
    a = m.attention_matrix(x, hw, channel=3)
    with torch.no_grad():
        q, k, v = m.qkv(x).reshape(2, 21, 3, 16).unbind(2)
        core = inline_attention_kv(q, k, v, m.local_kernels(x), hw=hw, num_heads=2, prefix=1)
    vh = v.reshape(2, 21, 2, 8).transpose(1, 2)  # (B, h, N, d)
    out = (a @ vh[..., 3:4])[..., 0]  # channel 3 of each head
    assert_close(out, core.reshape(2, 21, 2, 8)[..., 3].transpose(1, 2), torch.float64)
    assert m.attention_matrix(x, hw).shape == (2, 2, 21, 21)


def test_residual_layout_matches_official():
    """Keys and shapes of the official module (`qkv`, `residual.0`, `residual.2`, `proj`)."""
    m = InLineAttention(32, 4)
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert shapes == {"qkv.weight": (96, 32), "qkv.bias": (96,), "residual.0.weight": (32, 8, 1),
                      "residual.0.bias": (32,), "residual.2.weight": (288, 8, 1), "residual.2.bias": (288,),
                      "proj.weight": (32, 32), "proj.bias": (32,)}


def test_registry_and_low_precision():
    m = subquad.build_attention("inline", 32, 4, input_size=(6, 7))
    assert isinstance(m, InLineAttention)
    x = torch.randn(2, 42, 32)
    ref = m.double().forward_ref(x.double(), (6, 7))
    y = m.float().to(torch.bfloat16)(x.to(torch.bfloat16), (6, 7))
    assert y.dtype == torch.bfloat16
    assert_close(y, ref, torch.bfloat16)


def test_errors():
    with pytest.raises(UserError, match="kernel_func"):
        InLineAttention(16, 2, kernel_func="softmax")
    with pytest.raises(ValueError, match="multiple|divis"):
        InLineAttention(15, 2)
    m = InLineAttention(16, 2)
    with pytest.raises(ValueError):
        m(torch.randn(1, 30, 16), (5, 5))
    with pytest.raises(ValueError, match="kernel="):
        inline_attention_kv(*(torch.randn(1, 4, 4) for _ in range(3)), hw=(2, 2), num_heads=2, kernel="x")
    with pytest.raises(ValueError, match="local_weight"):
        inline_attention_kv(*(torch.randn(1, 4, 4) for _ in range(3)), torch.randn(1, 4, 2, 2), hw=(2, 2),
                            num_heads=2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_host_qkv_form_fast_vs_ref(dtype):
    """The CSwin form (`host_qkv=True`): InLine + local residual + LePE on the host's q, k, v; x predicts the
    kernels."""
    m = subquad.build_attention("inline", 16, 2, input_size=(7, 5), host_qkv=True, lepe=True)
    assert not hasattr(m, "qkv") and not hasattr(m, "proj") and m.get_v is not None
    with torch.no_grad():
        m.get_v.bias.normal_(0, 0.1)
    q, k, v, x = (torch.randn(2, 35, 16) for _ in range(4))
    compare_module(m, lambda mm, *t: mm.forward_qkv(*t[:3], (7, 5), x=t[3]),
                   lambda mm, *t: mm.forward_qkv(*t[:3], (7, 5), x=t[3], fused=False), [q, k, v, x], dtype)
    with pytest.raises(ValueError, match="forward_qkv"):
        m(q, (7, 5))
    with pytest.raises(ValueError, match="token mean"):
        m.forward_qkv(q, k, v, (7, 5))


def test_host_qkv_form_prefix_tokens():
    """With a class token (CvT hosts): fast vs reference; the class row gets neither local term nor LePE."""
    m = subquad.build_attention("inline", 16, 2, host_qkv=True, lepe=True, num_prefix_tokens=1).double()
    q, k, v, x = (torch.randn(2, 1 + 20, 16, dtype=torch.float64) for _ in range(4))
    compare_module(m, lambda mm, *t: mm.forward_qkv(*t[:3], (4, 5), x=t[3]),
                   lambda mm, *t: mm.forward_qkv(*t[:3], (4, 5), x=t[3], fused=False), [q, k, v, x], torch.float64)
    y1 = m.forward_qkv(q, k, v, (4, 5), x=x)
    with torch.no_grad():
        m.get_v.bias.add_(1.0)
    y2 = m.forward_qkv(q, k, v, (4, 5), x=x)
    torch.testing.assert_close(y1[:, 0], y2[:, 0])
    assert not torch.allclose(y1[:, 1:], y2[:, 1:])
