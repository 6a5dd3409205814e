"""Transformer-LS Tab. 1 ablations (arXiv 2107.02192): rank=0 (window attention only) and window_size=0 (dynamic
projection only), in 1-D, 2-D and causal. Fast paths vs the dense references on outputs and every gradient at odd
sizes, the window-only form vs plain window attention written out independently, decoding, causality, the
parameters each form builds, and the refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import subquad
from subquad.errors import UserError
from tests._tol import assert_close, compare_module
from tests.attention.test_long_short import _mask  # the same padding pattern as the main long-short tests

C, H = 12, 3
DTYPES = [torch.float64, torch.float32]
_SHIFT_INVARIANT = ("to_dynamic_projection.bias", "dconv_1.bias")


def _build(layout: str = "vision", **kw):
    """`layout` names the official form of a case: "lra" = the LRA code's global-token rule (same parameter names)."""
    if layout == "lra":
        kw.setdefault("global_token_rule", "lra")
    m = subquad.build_attention("long_short", C, H, **kw)
    for n, p in m.named_parameters():
        if n in _SHIFT_INVARIANT:  # shifts a softmax over the sequence: zero gradient in exact arithmetic
            p.requires_grad_(False)
    return m


CASES_1D = [
    # (w, r, n, prefix, layout, masked)
    (3, 0, 13, 0, "vision", True),
    (5, 0, 17, 1, "vision", False),
    (4, 0, 11, 1, "lra", True),
    (0, 3, 13, 0, "vision", True),
    (0, 2, 15, 1, "vision", True),
    (0, 5, 9, 1, "lra", False),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("w,r,n,prefix,layout,masked", CASES_1D)
def test_1d_ablation_fast_equals_reference(w, r, n, prefix, layout, masked, dtype):
    m = _build(window_size=w, rank=r, num_prefix_tokens=prefix, layout=layout)
    x = torch.randn(2, n, C)
    mask = _mask(2, n, prefix) if masked else None
    compare_module(m, lambda m, x: m(x, None, mask), lambda m, x: m.forward_ref(x, None, mask), [x], dtype)


CASES_2D = [
    # (w, r, hw, prefix, rpe, masked)
    (3, 0, (5, 7), 1, True, False),
    (2, 0, (7, 3), 0, False, True),
    (0, 4, (5, 3), 1, False, True),
    (0, 2, (3, 7), 0, False, False),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("w,r,hw,prefix,rpe,masked", CASES_2D)
def test_2d_ablation_fast_equals_reference(w, r, hw, prefix, rpe, masked, dtype):
    m = _build(window_size=w, rank=r, dims=2, num_prefix_tokens=prefix, rpe=rpe)
    N = prefix + hw[0] * hw[1]
    x = torch.randn(2, N, C)
    mask = _mask(2, N, prefix) if masked else None
    compare_module(m, lambda m, x: m(x, hw, mask), lambda m, x: m.forward_ref(x, hw, mask), [x], dtype)


def _heads(t: torch.Tensor) -> torch.Tensor:
    B, N, _ = t.shape
    return t.reshape(B, N, H, C // H).transpose(1, 2)


def _plain_window(m, x: torch.Tensor, allowed) -> torch.Tensor:
    """Softmax attention of each query over the keys `allowed(i, j)` says, written out (float64, no library
    functional code): q, k, v from the module's qkv, LN_L on k and v, output projection."""
    q, k, v = m.qkv(x).chunk(3, dim=-1)
    k, v = m.dual_ln_full(k), m.dual_ln_full(v)
    q, k, v = _heads(q), _heads(k), _heads(v)
    N = x.shape[1]
    out = torch.zeros_like(q)
    for i in range(N):
        js = [j for j in range(N) if allowed(i, j)]
        logits = (q[:, :, i:i + 1] * m.scale) @ k[:, :, js].transpose(-2, -1)
        out[:, :, i] = (logits.softmax(-1) @ v[:, :, js])[:, :, 0]
    return m.proj(out.transpose(1, 2).reshape(x.shape))


def test_rank0_1d_is_plain_window_attention():
    w, n = 4, 15
    ext = max(w // 2, 1)
    m = _build(window_size=w, rank=0).double()
    x = torch.randn(2, n, C, dtype=torch.float64)

    def allowed(i, j):
        start = (i // w) * w
        return start - ext <= j < start + w + ext

    assert_close(m(x), _plain_window(m, x, allowed), name="rank=0 fast vs plain window attention")
    assert_close(m.forward_ref(x), _plain_window(m, x, allowed), name="rank=0 reference vs plain window")


def test_rank0_2d_is_plain_window_attention():
    w, (Hh, Ww) = 3, (5, 7)
    ext = max(w // 2, 1)
    m = _build(window_size=w, rank=0, dims=2, rpe=False).double()
    x = torch.randn(2, Hh * Ww, C, dtype=torch.float64)

    def allowed(i, j):
        (yi, xi), (yj, xj) = divmod(i, Ww), divmod(j, Ww)
        ty, tx = (yi // w) * w, (xi // w) * w
        return ty - ext <= yj < ty + w + ext and tx - ext <= xj < tx + w + ext

    assert_close(m(x, (Hh, Ww)), _plain_window(m, x, allowed), name="2-D rank=0 vs plain window attention")


def test_window0_is_attention_over_projected_keys_only():
    """w = 0: softmax(q LN_G(P K)^T) LN_G(P V), P = softmax over the sequence of x W^P (paper Eq. 3), written out."""
    r, n = 3, 11
    m = _build(window_size=0, rank=r).double()
    x = torch.randn(2, n, C, dtype=torch.float64)
    q, k, v = m.qkv(x).chunk(3, dim=-1)
    p = m.to_dynamic_projection(x).reshape(2, n, H, r).permute(0, 2, 3, 1).softmax(-1)  # (B, h, r, n)
    kbar = m.dual_ln_dp((p @ _heads(k)).transpose(1, 2).reshape(2, r, C))
    vbar = m.dual_ln_dp((p @ _heads(v)).transpose(1, 2).reshape(2, r, C))
    att = ((_heads(q) * m.scale) @ _heads(kbar).transpose(-2, -1)).softmax(-1) @ _heads(vbar)
    expect = m.proj(att.transpose(1, 2).reshape(2, n, C))
    assert_close(m(x), expect, name="w=0 vs projected-key attention")
    assert not any(n.startswith("dual_ln_full.") for n, _ in m.named_parameters())


CASES_CAUSAL = [
    # (w, l, r, T)
    (3, 4, 0, 13),
    (1, 2, 0, 9),
    (0, 3, 2, 14),
    (0, 2, 1, 11),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("w,l,r,T", CASES_CAUSAL)
def test_causal_ablation_fast_equals_reference(w, l, r, T, dtype):
    m = _build(causal=True, window_size=w, rank=r, chunk_size=l)
    if w == 0:
        # with chunk vectors as the only keys, the bias of R_chunk adds q . b to every logit of a row: a softmax
        # shift, zero gradient in exact arithmetic (rounding noise is not comparable relatively)
        m.r_net_chunk.bias.requires_grad_(False)
    x = torch.randn(2, T, C)
    compare_module(m, lambda m, x: m(x), lambda m, x: m.forward_ref(x), [x], dtype)


@pytest.mark.parametrize("w,l,r,T", CASES_CAUSAL)
def test_causal_ablation_decoding_and_causality(w, l, r, T):
    m = _build(causal=True, window_size=w, rank=r, chunk_size=l).eval().double()
    x = torch.randn(2, T, C, dtype=torch.float64)
    with torch.no_grad():
        full = m(x)
        for block in sorted({1, l, 5}):
            cache = m.init_cache(2)
            out = torch.cat([m(x[:, i:i + block], cache=cache) for i in range(0, T, block)], dim=1)
            assert_close(out, full, name=f"blocks of {block}")
        for t in (0, T // 2, T - 1):
            x2 = x.clone()
            x2[:, t] += 1.0
            y2 = m(x2)
            assert torch.equal(y2[:, :t], full[:, :t]), f"perturbing token {t} changed an earlier output"
        a = m.attention_matrix(x[:1])
        assert a.triu(1).abs().max() == 0
    if w == 0:
        # the first chunk sees no key: its outputs are the output-projection bias (zero here: no qkv bias)
        assert full[:, :l].abs().max() == 0
        rows = a.sum(-1)[0, :, l:]
    else:
        rows = a.sum(-1)[0]
    torch.testing.assert_close(rows, torch.ones_like(rows))


def test_causal_rank0_is_plain_banded_attention():
    """r = 0: each query attends to exactly its w latest tokens with the Transformer-XL terms, written out."""
    w, T = 3, 10
    m = _build(causal=True, window_size=w, rank=0, chunk_size=4).double()
    x = torch.randn(1, T, C, dtype=torch.float64)
    d = C // H
    q = _heads(m.proj_query(x))[0]
    k, v = _heads(m.dual_ln_win(m.proj_key(x)))[0], _heads(m.dual_ln_win(m.proj_val(x)))[0]
    pos = torch.arange(w, dtype=torch.float64)
    inv = 1.0 / (10000 ** (torch.arange(0, C, 2, dtype=torch.float64) / C))
    rel = m.r_net(torch.cat([(pos[:, None] * inv).sin(), (pos[:, None] * inv).cos()], -1)).reshape(w, H, d)
    u, vb = m.r_w_bias.reshape(H, d), m.r_r_bias.reshape(H, d)
    out = torch.zeros_like(q)
    for t in range(T):
        js = list(range(max(0, t - w + 1), t + 1))
        qs = q[:, t] * m.scale
        logit = torch.stack([((qs + u) * k[:, j]).sum(-1) + ((qs + vb) * rel[t - j]).sum(-1) for j in js],
                            -1)  # (h, |js|)
        out[:, t] = (logit.softmax(-1)[:, :, None] * v[:, js]).sum(1)
    expect = m.proj_out(out.transpose(0, 1).reshape(1, T, C))
    assert_close(m(x), expect, name="causal rank=0 vs written-out banded attention")


def test_ablation_parameters_and_defaults_unchanged():
    def count(m):
        return sum(p.numel() for p in m.parameters())

    full = subquad.build_attention("long_short", C, H, window_size=4, rank=3)
    keys = set(full.state_dict())
    assert keys == {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias", "to_dynamic_projection.weight",
                    "to_dynamic_projection.bias", "dual_ln_dp.weight", "dual_ln_dp.bias", "dual_ln_full.weight",
                    "dual_ln_full.bias"}
    assert count(full) == 3 * C * C + 3 * C + C * C + C + (C * H * 3 + H * 3) + 4 * C
    win = subquad.build_attention("long_short", C, H, window_size=4, rank=0)
    assert set(win.state_dict()) == keys - {"to_dynamic_projection.weight", "to_dynamic_projection.bias",
                                            "dual_ln_dp.weight", "dual_ln_dp.bias"}
    dp = subquad.build_attention("long_short", C, H, window_size=0, rank=3)
    assert set(dp.state_dict()) == keys - {"dual_ln_full.weight", "dual_ln_full.bias"}
    # a global token under the "vision" rule still takes LN_L, under the "lra" rule LN_G
    assert "dual_ln_full.weight" in subquad.build_attention("long_short", C, H, window_size=0, rank=2,
                                                            num_prefix_tokens=1).state_dict()
    assert "dual_ln_dp.weight" in subquad.build_attention("long_short", C, H, window_size=4, rank=0,
                                                          global_token_rule="lra",
                                                         num_prefix_tokens=1).state_dict()
    causal_keys = set(subquad.build_attention("long_short", C, H, causal=True, window_size=4, rank=2,
                                              chunk_size=2).state_dict())
    assert causal_keys == {"proj_query.weight", "proj_key.weight", "proj_val.weight", "proj_out.weight",
                           "dconv_1.weight", "dconv_1.bias", "r_net.weight", "r_net_chunk.weight",
                           "r_net_chunk.bias", "r_r_bias", "r_w_bias", "dual_ln_dproj.weight", "dual_ln_dproj.bias",
                           "dual_ln_win.weight", "dual_ln_win.bias"}
    c_win = subquad.build_attention("long_short", C, H, causal=True, window_size=4, rank=0, chunk_size=2)
    assert not {n.split(".")[0] for n in c_win.state_dict()} & {"dconv_1", "r_net_chunk", "dual_ln_dproj"}
    c_dp = subquad.build_attention("long_short", C, H, causal=True, window_size=0, rank=2, chunk_size=2)
    assert not {n.split(".")[0] for n in c_dp.state_dict()} & {"r_net", "r_r_bias", "r_w_bias", "dual_ln_win"}


@pytest.mark.parametrize("causal", [False, True])
def test_both_zero_and_negative_refused(causal):
    kw = {"causal": True, "chunk_size": 2} if causal else {}
    with pytest.raises(UserError, match="window_size=0 and rank=0"):
        subquad.build_attention("long_short", C, H, window_size=0, rank=0, **kw)
    with pytest.raises(UserError, match="rank must be an int >= 0"):
        subquad.build_attention("long_short", C, H, window_size=2, rank=-1, **kw)
    with pytest.raises(UserError, match="window_size must be an int >= 0"):
        subquad.build_attention("long_short", C, H, window_size=-3, rank=1, **kw)


def test_refusals_specific_to_one_branch():
    with pytest.raises(ValueError, match="rpe"):
        subquad.build_attention("long_short", C, H, dims=2, window_size=0, rank=2, rpe=True)
    with pytest.raises(UserError, match="causal_form='paper'"):
        subquad.build_attention("long_short", C, H, causal=True, window_size=0, rank=2, chunk_size=2,
                                causal_form="paper")


def test_window0_training_step_with_dropout():
    """Forward/backward in training mode (attention dropout on) for every w = 0 / r = 0 form."""
    for kw, hw, n in (({"window_size": 0, "rank": 2}, None, 9), ({"window_size": 3, "rank": 0}, None, 9),
                      ({"window_size": 0, "rank": 2, "dims": 2}, (3, 5), 15),
                      ({"window_size": 0, "rank": 2, "causal": True, "chunk_size": 3}, None, 10),
                      ({"window_size": 3, "rank": 0, "causal": True, "chunk_size": 3}, None, 10)):
        m = subquad.build_attention("long_short", C, H, attn_drop=0.1, **kw).train()
        x = torch.randn(2, n, C, requires_grad=True)
        y = m(x, hw)
        F.mse_loss(y, torch.zeros_like(y)).backward()
        assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0, kw
