"""LiSA's derivation chain as trainable forms (`form='eq8' | 'eq9' | 'eq10'` beside the default 'fft'; LiSA
arXiv 2211.16289 Eq. 8-13, Tab. 3(b)): each dense form against the FFT form or an explicit loop, on outputs and
every gradient at odd non-square grids, their parameters, their MAC counts, a micro LiSANet step, the refusals."""

from __future__ import annotations

import math

import pytest
import torch

import subquad
from subquad._shapes import merge_heads
from subquad.bench.flops import count_module_macs
from tests._tol import assert_close, compare_module


def _module(dim=12, heads=2, **kw):
    kw.setdefault("input_size", (5, 7))
    kw.setdefault("D", 3)
    m = subquad.build_attention("structure_aware", dim, heads, **kw)
    with torch.no_grad():  # O(1) kernels, so every path contributes visibly to the output
        for name, p in m.named_parameters():
            if name in ("kernel_a", "kernel_b", "rpe", "struct_proj"):
                p.normal_(0, 1)
    return m


def _use_fft(m, x, hw):
    """The same module computed by the FFT form (float64 reference side)."""
    m.form = "fft"
    return m(x, hw)


EQ10_CASES = {
    "circular_5x7": (dict(), (5, 7)),
    "zero_5x7": (dict(boundary="zero"), (5, 7)),
    "circular_other_grid_3x5": (dict(), (3, 5)),
    "local3_5x7": (dict(local_kernel=3), (5, 7)),
    "video_2x3x5": (dict(input_size=(2, 3, 5)), (2, 3, 5)),
    "shared_b_zero_7x5": (dict(shared_kernel_b=True, boundary="zero", input_size=(7, 5)), (7, 5)),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(EQ10_CASES))
def test_eq10_form_equals_fft_form(case, dtype):
    """Same parameters, same function: output, input and every parameter gradient."""
    kw, hw = EQ10_CASES[case]
    m = _module(form="eq10", **kw)
    assert set(m.state_dict()) == set(_module(**kw).state_dict())
    x = torch.randn(2, math.prod(hw), 12)
    compare_module(m, lambda mm, x: mm(x, hw), lambda mm, x: _use_fft(mm, x, hw), [x], dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kw,hw", [(dict(), (5, 7)), (dict(boundary="zero"), (3, 5)),
                                   (dict(shared_kernel_b=True, D=1), (5, 7))])
def test_eq9_form_equals_fft_form_with_head_shared_kernel_a(kw, hw, dtype):
    """Eq. 9 is Eq. 10 with W^a equal over the channels of a head: the FFT module with kernel_a repeated per channel
    gives the same output and gradients; its kernel_a gradient summed over a head's channels is Eq. 9's."""
    torch.manual_seed(0)
    m9 = _module(form="eq9", **kw).double()
    mf = _module(**kw).double()
    dh = m9.head_dim
    sd = m9.state_dict()
    sd["kernel_a"] = sd["kernel_a"].repeat_interleave(dh, 0)
    mf.load_state_dict(sd)
    m9 = m9.to(dtype)
    x = torch.randn(2, math.prod(hw), 12, dtype=torch.float64)
    x9, xf = x.to(dtype).clone().requires_grad_(), x.clone().requires_grad_()
    y9, yf = m9(x9, hw), mf(xf, hw)
    assert_close(y9, yf, dtype, "eq9 vs fft output")
    cot = torch.randn_like(yf)
    y9.backward(cot.to(dtype))
    yf.backward(cot)
    assert_close(x9.grad, xf.grad, dtype, "grad of x")
    pf = dict(mf.named_parameters())
    for name, p in m9.named_parameters():
        ref = pf[name].grad
        if name == "kernel_a":
            ref = ref.reshape(m9.num_heads, dh, *ref.shape[1:]).sum(1)
        assert_close(p.grad, ref, dtype, f"grad of {name}")


def _eq8_loop(q, k, v, rpe, grid, boundary):
    """Eq. 8 by explicit pairs: y_i = sum_n (q_i . k_n) e[offset(n - i)] v_n, offsets from 2-D coordinates."""
    H, W = grid
    pos = [(a, b) for a in range(H) for b in range(W)]
    e = rpe[:, 0]  # (h or 1, *K)
    rows = []
    for yi, xi in pos:
        acc = 0
        for n, (yn, xn) in enumerate(pos):
            dy, dx = yn - yi, xn - xi
            idx = (dy % H, dx % W) if boundary == "circular" else (dy + H - 1, dx + W - 1)
            w = (q[:, :, len(rows)] * k[:, :, n]).sum(-1) * e[:, idx[0], idx[1]]  # (B, h)
            acc = acc + w[..., None] * v[:, :, n]
        rows.append(acc)
    return torch.stack(rows, 2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kw,hw", [(dict(input_size=(3, 5)), (3, 5)),
                                   (dict(input_size=(3, 5), boundary="zero", shared_rpe=True), (3, 5))])
def test_eq8_form_equals_explicit_loop(kw, hw, dtype):
    """The trainable Eq. 8 form against a pair-by-pair loop: output, input and every parameter gradient."""
    m = _module(form="eq8", **kw)
    x = torch.randn(2, math.prod(hw), 12)

    def loop(mm, x):
        q, k, v = mm._qkv(x)
        return mm.proj(merge_heads(_eq8_loop(q, k, v, mm.rpe, hw, mm.boundary)))

    compare_module(m, lambda mm, x: mm(x, hw), loop, [x], dtype)


def test_parameters_of_each_form_and_default_unchanged():
    C, h, D, grid = 12, 2, 3, (5, 7)
    fft = _module(C, h, D=D)
    assert {k: tuple(v.shape) for k, v in fft.state_dict().items()} == {
        "qkv.weight": (3 * C, C), "qkv.bias": (3 * C,), "kernel_a": (C, D, *grid), "kernel_b": (h, D, *grid),
        "struct_proj": (C, D), "proj.weight": (C, C), "proj.bias": (C,)}
    assert fft.form == "fft"
    n = {f: sum(p.numel() for p in _module(C, h, D=D, form=f).parameters()) for f in ("fft", "eq10", "eq9", "eq8")}
    n_lin = 4 * C * C + 4 * C
    N = math.prod(grid)
    assert n["eq10"] == n["fft"]
    assert n["fft"] - n["eq9"] == (C - h) * D * N  # Hadamard: W^a per channel instead of per head
    assert n["eq8"] == n_lin + h * N
    eq8 = _module(C, h, form="eq8", shared_rpe=True, boundary="zero")
    assert set(eq8.state_dict()) == {"qkv.weight", "qkv.bias", "rpe", "proj.weight", "proj.bias"}
    assert tuple(eq8.rpe.shape) == (1, 1, 9, 13)


def test_dense_form_macs():
    """MACs of the dense forms as counted (batch 1, no kernel FFTs): projections 4NC^2 plus
    eq8: 2 N^2 C (q k^T and A V); eq9: 2 N^2 C + 2 N^2 h D (S and A-hat) + N C D (S B^T);
    eq10: N^2 C D (dense G^a) + N^2 h D (A-hat) + N^2 C (A-hat V) + N C D (S B^T)."""
    C, h, D, grid = 12, 2, 3, (5, 7)
    N = math.prod(grid)
    x = torch.randn(1, N, C)
    proj = 4 * N * C * C
    want = {"eq8": 2 * N * N * C, "eq9": 2 * N * N * C + 2 * N * N * h * D + N * C * D,
            "eq10": N * N * C * D + N * N * h * D + N * N * C + N * C * D}
    for form, macs in want.items():
        got = count_module_macs(_module(C, h, D=D, form=form), x, grid)["gmacs"] * 1e9
        assert round(got) == proj + macs, form


@pytest.mark.parametrize("form", ["eq8", "eq9", "eq10"])
def test_micro_lisanet_trains_with_each_form(form):
    torch.manual_seed(0)
    model = subquad.create_model("lisanet_micro", num_classes=3, attn_kwargs=dict(form=form, boundary="zero"))
    ref = subquad.create_model("lisanet_micro", num_classes=3)
    extra = set(model.state_dict()) ^ set(ref.state_dict())
    if form == "eq8":
        assert extra and all(k.endswith((".attn.rpe", ".attn.kernel_a", ".attn.kernel_b", ".attn.struct_proj"))
                             for k in extra)
    else:
        assert not extra
    x = torch.randn(2, 3, 64, 48)
    out = model(x)
    assert out.shape == (2, 3) and torch.isfinite(out).all()
    out.logsumexp(-1).sum().backward()
    attn = [m for m in model.modules() if getattr(m, "form", None) == form]
    assert attn, "no LiSA layer took the form"
    for m in attn:
        for name, p in m.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_forms_reach_attention_matrix():
    """The map applied to V of each dense form: Y (before proj) = map @ V, plus S B^T for eq9 (eq8 has no feature
    path)."""
    hw = (3, 5)
    for form in ("eq8", "eq9"):
        m = _module(form=form, input_size=hw).double()
        x = torch.randn(1, 15, 12, dtype=torch.float64)
        a = m.attention_matrix(x, hw)
        with torch.no_grad():
            q, k, v = m._qkv(x)
            y = m._mix_dense(q, k, v, hw)
            if form == "eq9":
                y = y - _feature_path(m, q, k, hw)
        assert_close(a @ v, y, torch.float64, f"{form} map")


def _feature_path(m, q, k, hw):
    attn = q @ k.transpose(-2, -1)
    from subquad.attention.functional.structure_aware import rpe_matrix
    s = torch.einsum("bhin,hdin->bhid", attn, rpe_matrix(m.kernel_a, hw, m.boundary))
    return torch.einsum("bhid,hcd->bhic", s, m.struct_proj.reshape(m.num_heads, m.head_dim, -1))


def test_bad_form_options_refused():
    with pytest.raises(ValueError, match="form must be one of"):
        _module(form="eq7")
    with pytest.raises(ValueError, match="shared_rpe"):
        _module(shared_rpe=True)
    with pytest.raises(ValueError, match="shared_rpe=True"):
        _module(form="eq8", shared_kernel_b=True)
    with pytest.raises(ValueError, match="FFT form only"):
        _module(form="eq10", d_chunk=2)
