"""PolaFormer polarity-aware linear attention: the reference against an explicit per-query transcription of the
equations, fast vs dense reference (outputs and every gradient) on odd and non-square grids and odd head widths,
PE resize, the Pola-PVT key remap, precision and errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import subquad
from subquad.attention.functional.polarity import (
    polarity_attention_maps,
    polarity_features,
    polarity_linear_attention_kv,
    polarity_linear_attention_ref,
)
from subquad.attention.polarity import PolarityLinearAttention, remap_qg_kv
from subquad.errors import UserError
from tests._tol import assert_close, compare_fn, compare_module


def _randomise(m: PolarityLinearAttention) -> PolarityLinearAttention:
    with torch.no_grad():
        m.scale.normal_(0, 1)
        m.power.normal_(0, 1)
        m.positional_encoding.normal_(0, 0.5)
        if m.dwc is not None:
            m.dwc.bias.normal_(0, 0.1)
    return m


def _func_inputs(hw, B=2, C=12, h=3, dwc=True, dtype=torch.float64, ksize=5):
    d = C // h
    N = hw[0] * hw[1]
    inputs = [torch.randn(B, N, C, dtype=dtype) for _ in range(4)]  # q, k, v, g
    inputs += [torch.randn(1, 1, C, dtype=dtype), torch.randn(1, h, 1, d, dtype=dtype)]
    dw = [torch.randn(d, 1, ksize, ksize, dtype=dtype) * 0.2, torch.randn(d, dtype=dtype) * 0.1]
    inputs += dw if dwc else [None, None]
    return inputs, dict(hw=hw, num_heads=h, alpha=4.0)


def test_reference_is_the_paper_equations_per_query():
    """An independent loop over queries: o_i = [sum_j s_ij v1_j / sum_j s_ij, sum_j t_ij v2_j / sum_j t_ij] with
    s_ij = phi+(q_i).phi+(k_j) + phi-(q_i).phi-(k_j) (same sign) and t_ij = phi-(q_i).phi+(k_j) +
    phi+(q_i).phi-(k_j) (opposite sign), plus the shared DWC, times the gate (arXiv 2501.15061 Eq. 6-9)."""
    hw, C, h = (3, 4), 10, 2  # d = 5: odd head width, v1 has 3 channels and v2 2
    (q, k, v, g, scale, power, dw, db), kw = _func_inputs(hw, B=1, C=C, h=h)
    out = polarity_linear_attention_ref(q, k, v, g, scale, power, dw, db, **kw)
    s = F.softplus(scale)[0, 0]
    N, d = 12, C // h
    want = torch.zeros(N, C, dtype=torch.float64)
    conv = F.conv2d(v[0].T.reshape(C, 1, *hw).transpose(0, 1), torch.cat([dw] * h), torch.cat([db] * h), padding=2,
                    groups=C)[0].reshape(C, N).T
    for head in range(h):
        sl = slice(head * d, head * d + d)
        p = 1 + 4 * torch.sigmoid(power[0, head, 0])
        qs, ks = q[0, :, sl] / s[sl], k[0, :, sl] / s[sl]
        qp, qn, kp, kn = qs.clamp(min=0) ** p, (-qs).clamp(min=0) ** p, ks.clamp(min=0) ** p, (-ks).clamp(min=0) ** p
        for i in range(N):
            sim = (qp[i] * kp).sum(-1) + (qn[i] * kn).sum(-1)  # (N,)
            opp = (qn[i] * kp).sum(-1) + (qp[i] * kn).sum(-1)
            v1, v2 = v[0, :, head * d: head * d + 3], v[0, :, head * d + 3: head * d + d]
            want[i, head * d: head * d + 3] = (sim[:, None] * v1).sum(0) / (sim.sum() + 1e-6 * N)
            want[i, head * d + 3: head * d + d] = (opp[:, None] * v2).sum(0) / (opp.sum() + 1e-6 * N)
    want = (want + conv) * g[0]
    assert_close(out[0], want, torch.float64, "output")


def test_features_split_the_signs():
    x = torch.randn(2, 9, 8, dtype=torch.float64)
    power = torch.randn(1, 2, 1, 4, dtype=torch.float64)
    pos, neg = polarity_features(x, torch.zeros(1, 1, 8, dtype=torch.float64), power, 4.0, 2)
    assert (pos >= 0).all() and (neg >= 0).all() and not (pos * neg).any()
    xs = (x / F.softplus(torch.zeros(())).item()).reshape(2, 9, 2, 4).transpose(1, 2)
    p = 1 + 4 * torch.sigmoid(power)
    torch.testing.assert_close(pos - neg, xs.sign() * xs.abs() ** p)
    assert ((p > 1) & (p < 5)).all()


@pytest.mark.parametrize("exporting", [False, True])
def test_fast_features_equal_the_reference_features(exporting, monkeypatch):
    """The fast path's features (each power as exp(p log t) in an exported program) equal `polarity_features`,
    exact zeros included (0, not NaN)."""
    from subquad.attention.functional.polarity import _polarity_features_fast

    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: exporting)
    x = torch.randn(2, 9, 8, dtype=torch.float64)
    x[0, :3] = 0.0
    scale, power = torch.randn(1, 1, 8, dtype=torch.float64), torch.randn(1, 2, 1, 4, dtype=torch.float64)
    with torch.no_grad():
        got, want = _polarity_features_fast(x, scale, power, 4.0, 2), polarity_features(x, scale, power, 4.0, 2)
    for a, b in zip(got, want):
        assert torch.isfinite(a).all() and (a[0, :, :3] == 0).all()
        assert_close(a, b, torch.float64, "feature")


def test_traced_training_form_equals_the_one_product_form(monkeypatch):
    """Under tracing with autograd on, the fast path takes two linear cores (as the reference) instead of one product
    over Q_sim; both agree, on outputs and every gradient, with an odd head width."""
    import subquad.attention.functional.polarity as fp

    inputs, kw = _func_inputs((5, 3), C=15, h=3)
    inputs = [t.requires_grad_(True) for t in inputs]
    out = polarity_linear_attention_kv(*inputs, **kw)
    grads = torch.autograd.grad(out.pow(2).sum(), inputs)
    monkeypatch.setattr(fp, "tracing", lambda: True)
    calls = []
    real = fp.linear_attention
    monkeypatch.setattr(fp, "linear_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    out2 = polarity_linear_attention_kv(*inputs, **kw)
    grads2 = torch.autograd.grad(out2.pow(2).sum(), inputs)
    assert len(calls) == 2
    assert_close(out2, out, torch.float64, "output")
    for a, b in zip(grads2, grads):
        assert_close(a, b, torch.float64, "grad")


FUNC_CASES = {"7x9": dict(hw=(7, 9)), "odd_d_5x3": dict(hw=(5, 3), C=15, h=3), "no_dwc_4x6": dict(hw=(4, 6), dwc=False)}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(FUNC_CASES))
def test_functional_fast_vs_ref(case, dtype):
    inputs, kw = _func_inputs(**FUNC_CASES[case])
    compare_fn(lambda *a: polarity_linear_attention_kv(*a, **kw), lambda *a: polarity_linear_attention_ref(*a, **kw),
               inputs, dtype)


@pytest.mark.parametrize("case", list(FUNC_CASES))
def test_export_form_equals_reference(case, monkeypatch):
    """The functional fast path as an exported program computes it, run eagerly against the float64 reference: an
    inference program's output (the powers as exp-log), and a training program's output and every gradient (traced,
    so two linear cores and `pow`)."""
    import subquad.attention.functional.polarity as fp

    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    inputs, kw = _func_inputs(**FUNC_CASES[case])
    with torch.no_grad():
        assert_close(polarity_linear_attention_kv(*inputs, **kw), polarity_linear_attention_ref(*inputs, **kw),
                     torch.float64, "inference output")
    monkeypatch.setattr(fp, "tracing", lambda: True)  # an export traces: torch.compiler.is_compiling() is True
    compare_fn(lambda *a: polarity_linear_attention_kv(*a, **kw), lambda *a: polarity_linear_attention_ref(*a, **kw),
               inputs, torch.float64)


def test_gradcheck_tiny():
    inputs, kw = _func_inputs((2, 3), B=1, C=4, h=2, ksize=3)
    inputs = [t.double().requires_grad_(True) for t in inputs]
    # q, k away from 0, where ReLU(x)^p has a kink the finite differences would straddle
    with torch.no_grad():
        for t in inputs[:2]:
            t.add_(t.sign() * 0.3)
    assert torch.autograd.gradcheck(lambda *a: polarity_linear_attention_kv(*a, **kw), inputs, fast_mode=True)


MODULE_CASES = {
    "construction_grid_7x9": dict(kw={}, hw=(7, 9)),
    "pe_resized_13x5": dict(kw={}, hw=(13, 5)),
    "odd_head_width_5x6": dict(kw=dict(heads=5), hw=(5, 6)),
    "alpha2_k3": dict(kw=dict(alpha=2.0, kernel_size=3), hw=(6, 7)),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(MODULE_CASES))
def test_module_fast_vs_ref(case, dtype):
    c = MODULE_CASES[case]
    kw = dict(c["kw"])
    m = _randomise(PolarityLinearAttention(30 if "heads" in kw else 24, kw.pop("heads", 3), input_size=(7, 9), **kw))
    hw = c["hw"]
    x = torch.randn(2, hw[0] * hw[1], m.dim)
    compare_module(m, lambda mm, x: mm(x, hw), lambda mm, x: mm.forward_ref(x, hw), [x], dtype)


def test_pe_resize_rule_and_identity_at_construction_grid():
    m = _randomise(PolarityLinearAttention(16, 2, input_size=(4, 6))).double()
    x = torch.randn(1, 24, 16, dtype=torch.float64)
    with torch.no_grad():
        base = m(x, (4, 6))
        # the PE enters as k + PE: folding it into the key bias of a PE-free copy gives the same output
        m2 = PolarityLinearAttention(16, 2, input_size=(4, 6)).double()
        m2.load_state_dict(m.state_dict())
        m2.positional_encoding.zero_()
        q, k, v, g = m2.qkvg(x).reshape(1, 24, 4, 16).unbind(2)
        k = k + m.positional_encoding
        o = polarity_linear_attention_ref(q, k, v, g, m.scale, m.power, m.dwc.weight, m.dwc.bias, hw=(4, 6),
                                          num_heads=2)
        assert_close(base, m.proj(o), torch.float64, "output")
        y = m(torch.randn(1, 15, 16, dtype=torch.float64), (3, 5))  # a smaller non-square grid
    assert y.shape == (1, 15, 16) and torch.isfinite(y).all()


def test_resized_pe_cached_in_eval_and_invalidated():
    """Eval without autograd reuses the PE resized to a new grid (Pola-PVT at 512 px resized it in every block); an
    in-place edit recomputes it; grad-enabled calls and training never use the cache."""
    m = _randomise(PolarityLinearAttention(16, 2, input_size=(7, 7))).eval()
    x = torch.randn(1, 99, 16)
    with torch.no_grad():
        y = m(x, (9, 11))
        cached = m._pe_cache[1]
        assert cached.shape == (1, 99, 16)
        assert torch.equal(m(x, (9, 11)), y) and m._pe_cache[1] is cached
        m.positional_encoding.add_(0.5)
        y2 = m(x, (9, 11))
        assert m._pe_cache[1] is not cached and not torch.allclose(y2, y)
        assert torch.equal(m.attention_matrix(x, (9, 11)), m.attention_matrix(x, (9, 11)))
        m(torch.randn(1, 49, 16), (7, 7))  # the construction grid: the PE itself
    assert torch.equal(m(x, (9, 11)).detach(), y2)
    m.train()
    assert m._pe_cache is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_finite(dtype):
    m = _randomise(PolarityLinearAttention(32, 4, input_size=(7, 7)))
    x = torch.randn(1, 49, 32) * 30
    with torch.autocast("cpu", dtype=dtype):
        y = m(x, (7, 7))
    assert torch.isfinite(y).all()
    ref = m.double().forward_ref(x.double(), (7, 7))
    rel = ((y.double() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
    assert rel < (5e-2 if dtype == torch.bfloat16 else 1e-2)


def test_parameter_names_init_and_pvt_remap():
    m = PolarityLinearAttention(32, 4, input_size=(8, 8))
    assert {n for n, _ in m.named_parameters()} == {"qkvg.weight", "qkvg.bias", "proj.weight", "proj.bias",
                                                    "dwc.weight", "dwc.bias", "power", "scale",
                                                    "positional_encoding"}
    assert m.power.shape == (1, 4, 1, 8) and m.dwc.weight.shape == (8, 1, 5, 5)
    assert not m.power.any() and not m.scale.any() and not m.positional_encoding.any()
    # the official Pola-PVT layout: qg = [q; g], kv = [k; v]
    host = torch.nn.Sequential(m)
    sd = {k: v for k, v in host.state_dict().items() if ".qkvg." not in k}
    w, b = m.qkvg.weight.detach(), m.qkvg.bias.detach()
    sd.update({"0.qg.weight": torch.cat([w[:32], w[96:]]), "0.kv.weight": w[32:96],
               "0.qg.bias": torch.cat([b[:32], b[96:]]), "0.kv.bias": b[32:96]})
    out = remap_qg_kv(sd, host)
    assert torch.equal(out["0.qkvg.weight"], w) and torch.equal(out["0.qkvg.bias"], b)
    assert "0.qg.weight" not in out and "0.kv.bias" not in out
    assert remap_qg_kv(host.state_dict(), host).keys() == host.state_dict().keys()
    with pytest.raises(UserError, match="must both be present"):
        remap_qg_kv({"0.qg.weight": w[:64]}, host)
    assert subquad.build_attention("polarity", 32, 4, input_size=(8, 8), device="meta").power.is_meta


def test_bad_inputs():
    with pytest.raises(UserError, match="input_size"):
        PolarityLinearAttention(32, 4)
    with pytest.raises(UserError, match="kernel_size"):
        PolarityLinearAttention(32, 4, input_size=8, kernel_size=4)
    with pytest.raises(UserError, match="alpha"):
        PolarityLinearAttention(32, 4, input_size=8, alpha=0)
    with pytest.raises(UserError, match="la_sr_ratio"):
        PolarityLinearAttention.stage_kwargs(dict(grid=(8, 8), la_sr_ratio=2))
    m = PolarityLinearAttention(32, 4, input_size=8)
    with pytest.raises(ValueError, match="hw"):
        m(torch.randn(1, 64, 32), (8, 7))
    with pytest.raises(ValueError, match="hw"):
        m(torch.randn(1, 64, 32))
    with pytest.raises(ValueError, match="mask"):
        m(torch.randn(1, 64, 32), (8, 8), torch.ones(1, 64, dtype=torch.bool))
    assert not subquad.attention.get_attention_cls("polarity").caps.sequence


@pytest.mark.parametrize("hw", [(5, 7), (4, 3)])
def test_attention_maps_reproduce_the_reference(hw):
    """The analysis maps: A_sim @ v1 and A_opp @ v2 (each head's two value halves, an odd head width included),
    times the gate, are the reference without DWC; `attention_matrix` is their mean on the module's own q and k
    (positional encoding added): non-negative rows summing to 1 up to the normaliser's eps."""
    (q, k, v, g, scale, power, _, _), kw = _func_inputs(hw, C=10, h=2, dwc=False)
    a_sim, a_opp = polarity_attention_maps(q, k, scale, power, num_heads=2, alpha=4.0)
    vh = v.reshape(*v.shape[:2], 2, 5).transpose(1, 2)
    o = torch.cat([a_sim @ vh[..., :3], a_opp @ vh[..., 3:]], -1).transpose(1, 2).reshape(v.shape) * g
    assert_close(o, polarity_linear_attention_ref(q, k, v, g, scale, power, None, None, **kw), torch.float64)
    m = _randomise(PolarityLinearAttention(10, 2, input_size=hw)).double()
    a = m.attention_matrix(torch.randn(1, hw[0] * hw[1], 10, dtype=torch.float64), hw)
    assert a.shape == (1, 2, hw[0] * hw[1], hw[0] * hw[1]) and bool((a >= 0).all())
    rows = a.sum(-1)
    assert bool((rows <= 1).all()) and bool((rows > 0.99).all()), rows
