"""Transformer-LS long-short attention: SDPA tile paths vs the dense references (outputs and every gradient),
padding and CLS rules, causal decoding with a cache, causality, bad input, and (marker `parity`) the official
modules."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

import subquad
from subquad.attention.functional.long_short import (
    dynamic_projection,
    long_short_1d_sdpa,
    long_short_2d_sdpa,
    long_short_ref,
    window_mask_1d,
    window_mask_2d,
    xl_sinusoid,
)
from subquad.attention.long_short import remap_lra_official
from tests._tol import assert_close, compare_fn, compare_module

C, H = 16, 2
DTYPES = [torch.float64, torch.float32]
# The projection-score bias only shifts a softmax over the sequence: its gradient is zero in exact arithmetic, so a
# relative comparison of rounding noise is meaningless. It is frozen in the gradient comparisons below.
_SHIFT_INVARIANT = ("to_dynamic_projection.bias", "dconv_1.bias")


def _build(layout: str = "vision", **kw):
    """`layout` names the official form of a case: "lra" = the LRA code's global-token rule (same parameter names)."""
    if layout == "lra":
        kw.setdefault("global_token_rule", "lra")
    m = subquad.build_attention("long_short", C, H, **kw)
    for n, p in m.named_parameters():
        if n in _SHIFT_INVARIANT:
            p.requires_grad_(False)
    return m


def _mask(B: int, N: int, prefix: int = 0) -> torch.Tensor:
    """Trailing padding in sample 1 and interior padding in sample 0."""
    m = torch.ones(B, N, dtype=torch.bool)
    m[1, N - 3:] = False
    m[0, prefix + 2] = False
    return m


CASES_1D = [
    # (w, r, n, prefix, layout, masked)
    (1, 1, 9, 0, "vision", False),
    (2, 32, 13, 0, "vision", True),
    (7, 1, 14, 0, "vision", True),
    pytest.param(7, 3, 17, 1, "vision", True, marks=pytest.mark.slow),
    (8, 32, 19, 1, "lra", True),
    pytest.param(8, 4, 16, 0, "lra", False, marks=pytest.mark.slow),
    (3, 2, 21, 1, "lra", False),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("w,r,n,prefix,layout,masked", CASES_1D)
def test_1d_fast_equals_reference(w, r, n, prefix, layout, masked, dtype):
    m = _build(window_size=w, rank=r, num_prefix_tokens=prefix, layout=layout)
    x = torch.randn(2, n, C)
    mask = _mask(2, n, prefix) if masked else None
    compare_module(m, lambda m, x: m(x, None, mask), lambda m, x: m.forward_ref(x, None, mask), [x], dtype)


CASES_2D = [
    # (w, r, hw, prefix, rpe, masked)
    pytest.param(7, 8, (14, 14), 0, True, False, marks=pytest.mark.slow),
    (3, 4, (5, 7), 1, True, False),
    pytest.param(2, 3, (7, 4), 0, False, True, marks=pytest.mark.slow),
    (4, 2, (6, 9), 1, True, True),
    (1, 2, (3, 5), 1, False, False),
]


@pytest.mark.parametrize("w,r,hw,prefix,rpe,masked", [c for c in CASES_2D if not hasattr(c, "marks")]
                         + [(2, 0, (7, 4), 0, False, True), (3, 2, (8, 3), 0, False, True)])
def test_2d_export_gather_form_equals_reference(w, r, hw, prefix, rpe, masked, monkeypatch):
    """The form an exported program takes (`long_short_2d_gather`: queries, key sets and output gathered by row
    indices) run eagerly here: outputs and every gradient against the float64 reference, on odd, non-square maps,
    with and without global keys, padding masks and the relative-position bias."""
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    m = _build(window_size=w, rank=r, dims=2, num_prefix_tokens=prefix, rpe=rpe)
    N = prefix + hw[0] * hw[1]
    x = torch.randn(2, N, C)
    mask = _mask(2, N, prefix) if masked else None
    compare_module(m, lambda m, x: m(x, hw, mask), lambda m, x: m.forward_ref(x, hw, mask), [x], torch.float64)


@pytest.mark.parametrize("masked", [False, True])
def test_2d_gather_form_exports_without_global_keys(masked):
    """With no global keys (rank 0, no class token) a tile whose keys are all padding has empty rows: the gather
    form zeroes them inside the graph, so torch.export traces it (a data-dependent check would stop the trace), and
    the program equals eager, an all-padding tile included."""
    from subquad.attention.functional.long_short import long_short_2d_gather

    hw, w = (7, 5), 2
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 35, 4, generator=g) for _ in range(3))
    kg = vg = torch.zeros(2, 2, 0, 4)
    valid = torch.ones(2, 35, dtype=torch.bool)
    if masked:
        valid[1, :] = False  # sample 1: every key padding, every row empty
        valid[0, :3] = False

    class Attn(torch.nn.Module):
        def forward(self, q, k, v, valid):
            return long_short_2d_sdpa(q, k, v, kg, vg, hw, w, valid)

    prog = torch.export.export(Attn(), (q, k, v, valid), strict=False)
    got = prog.module()(q, k, v, valid)
    want = long_short_2d_gather(q, k, v, kg, vg, hw, w, valid)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want)
    if masked:
        assert (got[1] == 0).all()
    ref = long_short_ref(q.double(), k.double(), v.double(), kg.double(), vg.double(), window_mask_2d(hw, w), valid)
    assert_close(want, ref.float(), torch.float32, "output")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("w,r,hw,prefix,rpe,masked", CASES_2D)
def test_2d_fast_equals_reference(w, r, hw, prefix, rpe, masked, dtype):
    m = _build(window_size=w, rank=r, dims=2, num_prefix_tokens=prefix, rpe=rpe)
    N = prefix + hw[0] * hw[1]
    x = torch.randn(2, N, C)
    mask = _mask(2, N, prefix) if masked else None
    compare_module(m, lambda m, x: m(x, hw, mask), lambda m, x: m.forward_ref(x, hw, mask), [x], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_functional_1d_tiles_equal_dense(dtype):
    """The functional pair alone (q, k, v, global keys and every gradient), several tile groupings."""
    B, h, n, d, G, w = 2, 2, 23, 4, 3, 4
    q, k, v = (torch.randn(B, h, n, d) for _ in range(3))
    kg, vg = torch.randn(B, h, G, d), torch.randn(B, h, G, d)
    valid = _mask(B, n)
    for group in (1, 2, 5):
        compare_fn(lambda *a, g=group: long_short_1d_sdpa(*a, w, valid, None, g),
                   lambda *a: long_short_ref(*a, window_mask_1d(n, w), valid), [q, k, v, kg, vg], dtype)


def test_dense_window_definition():
    """Segment s holds queries s*w ... s*w+w-1 and sees keys s*w-ext ... s*w+w+ext-1 (official get_tiles_v2)."""
    m = window_mask_1d(10, 4)
    assert m[0].nonzero().flatten().tolist() == list(range(0, 6))
    assert m[5].nonzero().flatten().tolist() == list(range(2, 10))
    assert window_mask_1d(5, 1)[2].nonzero().flatten().tolist() == [1, 2, 3]


def test_padded_queries_give_output_bias_and_padding_is_inert():
    m = _build(window_size=4, rank=3, layout="lra").eval()
    x = torch.randn(2, 10, C)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[:, 7:] = False
    with torch.no_grad():
        y = m(x, None, mask)
        torch.testing.assert_close(y[:, 7:], m.proj.bias.expand(2, 3, C), rtol=0, atol=1e-6)
        # appending more padding leaves the real positions unchanged
        x2 = torch.cat([x, torch.randn(2, 5, C)], dim=1)
        mask2 = torch.cat([mask, torch.zeros(2, 5, dtype=torch.bool)], dim=1)
        torch.testing.assert_close(m(x2, None, mask2)[:, :7], y[:, :7], rtol=1e-5, atol=1e-6)


def test_all_padding_rows_are_finite():
    m = _build(window_size=3, rank=2, num_prefix_tokens=1).eval()
    x = torch.randn(2, 9, C)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1] = False
    with torch.no_grad():
        for fn in (m, m.forward_ref):
            assert torch.isfinite(fn(x, None, mask)).all()
        assert torch.isfinite(dynamic_projection(torch.randn(2, 9, 4), 2, 2, mask)).all()


def test_any_length_matches_divisible_prefix():
    """Internal padding: a length that is not a multiple of w equals the reference on the same tokens."""
    m = _build(window_size=5, rank=2).eval().double()
    x = torch.randn(1, 12, C, dtype=torch.float64)
    with torch.no_grad():
        assert_close(m(x), m.forward_ref(x))


def test_attention_matrix_rows_sum_to_one():
    for kw, hw, N in [(dict(window_size=3, rank=2), None, 11), (dict(window_size=2, rank=3, dims=2), (3, 5), 15),
                      (dict(window_size=2, rank=2, num_prefix_tokens=1), None, 8),
                      (dict(window_size=2, rank=2, num_prefix_tokens=1, layout="lra"), None, 8)]:
        m = _build(**kw).eval().double()
        a = m.attention_matrix(torch.randn(2, N, C, dtype=torch.float64), hw)
        assert a.shape == (2, H, N, N)
        torch.testing.assert_close(a.sum(-1), torch.ones(2, H, N, dtype=torch.float64))


def test_attention_matrix_window_support_without_projection_weight():
    """With the projection branch muted (its keys pushed to -inf), the map is exactly the window pattern."""
    m = _build(window_size=3, rank=1).eval().double()
    x = torch.randn(1, 10, C, dtype=torch.float64)
    with torch.no_grad():
        m.dual_ln_dp.weight.zero_()
        m.dual_ln_dp.bias.fill_(-1e3)
        m.qkv.weight[:C] = torch.eye(C)
        a = m.attention_matrix(torch.randn(1, 10, C, dtype=torch.float64).abs() + x.abs())
    outside = ~window_mask_1d(10, 3)
    assert a[..., outside].abs().max() < 1e-12


def test_dispatch_and_defaults():
    m1 = subquad.build_attention("long_short", C, H)
    assert (m1.window_size, m1.rank, m1.rpe) == (8, 32, False)
    m2 = subquad.build_attention("long_short", C, H, input_size=(5, 7))
    assert (m2.window_size, m2.rank, m2.rpe) == (7, 8, True)
    x = torch.randn(1, 35, C)
    assert m2(x, (5, 7)).shape == x.shape and m2(x).shape == x.shape
    mc = subquad.build_attention("long_short", C, H, causal=True, window_size=4, chunk_size=2)
    assert type(mc).__name__ == "ChunkedLongShortAttention" and mc.name == "long_short"
    assert {"proj_query", "dconv_1", "r_net", "r_net_chunk", "dual_ln_win"} <= {n.split(".")[0] for n, _ in
                                                                              mc.named_parameters()}
    # one set of names whatever the global-token rule: the LRA form differs in behaviour only
    lra = subquad.build_attention("long_short", C, H, global_token_rule="lra")
    assert {n.split(".")[0] for n, _ in lra.named_parameters()} == {"qkv", "proj", "to_dynamic_projection",
                                                                   "dual_ln_dp", "dual_ln_full"}
    assert subquad.build_attention("long_short", C, H, device="meta").qkv.weight.is_meta


def test_bad_input_clear_errors():
    with pytest.raises(ValueError, match="window_size"):
        subquad.build_attention("long_short", C, H, window_size=-1)
    with pytest.raises(ValueError, match="rank"):
        subquad.build_attention("long_short", C, H, rank=-2)
    with pytest.raises(ValueError, match="chunk_size"):
        subquad.build_attention("long_short", C, H, causal=True, chunk_size=0)
    with pytest.raises(ValueError, match="rpe"):
        subquad.build_attention("long_short", C, H, dims=2, window_size=1, rpe=True)
    m = _build(window_size=3, rank=2)
    with pytest.raises(ValueError, match="mask"):
        m(torch.randn(2, 9, C), None, torch.ones(2, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="mask"):
        m(torch.randn(2, 9, C), None, torch.ones(2, 9))
    with pytest.raises(ValueError, match="hw"):
        _build(dims=2)(torch.randn(1, 12, C))
    a = _build(causal=True, window_size=4, rank=1, chunk_size=2)
    b = _build(causal=True, window_size=4, rank=1, chunk_size=2)
    with pytest.raises(ValueError, match="another module"):
        a(torch.randn(1, 3, C), cache=b.init_cache(1))
    with pytest.raises(ValueError, match="batch"):
        a(torch.randn(2, 3, C), cache=a.init_cache(1))
    with pytest.raises(ValueError, match="mask"):
        a(torch.randn(1, 3, C), None, torch.ones(1, 3, dtype=torch.bool))


CASES_CAUSAL = [
    # (w, l, r, T, form)
    (4, 4, 2, 23, "official"),
    pytest.param(3, 2, 1, 17, "official", marks=pytest.mark.slow),
    (1, 3, 2, 10, "official"),
    pytest.param(5, 2, 3, 13, "paper", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("w,l,r,T,form", CASES_CAUSAL)
def test_causal_fast_equals_reference(w, l, r, T, form, dtype):
    m = _build(causal=True, window_size=w, rank=r, chunk_size=l, causal_form=form)
    x = torch.randn(2, T, C)
    compare_module(m, lambda m, x: m(x), lambda m, x: m.forward_ref(x), [x], dtype)


@pytest.mark.parametrize("w,l,r,T,form", CASES_CAUSAL)
def test_causal_parallel_equals_cached_decoding(w, l, r, T, form):
    m = _build(causal=True, window_size=w, rank=r, chunk_size=l, causal_form=form).eval().double()
    x = torch.randn(2, T, C, dtype=torch.float64)
    with torch.no_grad():
        full = m(x)
        for block in sorted({1, l, w, 2 * w, 5}):
            cache = m.init_cache(2)
            out = torch.cat([m(x[:, i:i + block], cache=cache) for i in range(0, T, block)], dim=1)
            assert_close(out, full, name=f"blocks of {block}")
            assert cache.t == T


@pytest.mark.parametrize("w,l,r,T,form", CASES_CAUSAL)
def test_causal_no_future_leak(w, l, r, T, form):
    m = _build(causal=True, window_size=w, rank=r, chunk_size=l, causal_form=form).eval().double()
    x = torch.randn(1, T, C, dtype=torch.float64)
    with torch.no_grad():
        y = m(x)
        for t in (0, T // 2, T - 1):
            x2 = x.clone()
            x2[:, t] += torch.randn(C, dtype=torch.float64)
            y2 = m(x2)
            assert torch.equal(y2[:, :t], y[:, :t]), f"perturbing token {t} changed an earlier output"
            assert not torch.equal(y2[:, t], y[:, t])


def test_causal_attention_matrix_is_lower_triangular():
    m = _build(causal=True, window_size=3, rank=2, chunk_size=2).eval().double()
    a = m.attention_matrix(torch.randn(1, 11, C, dtype=torch.float64))
    assert a.shape == (1, H, 11, 11)
    assert a.triu(1).abs().max() == 0
    torch.testing.assert_close(a.sum(-1), torch.ones(1, H, 11, dtype=torch.float64))


def test_xl_sinusoid_layout():
    e = xl_sinusoid(torch.tensor([0.0, 2.0]), 4)
    torch.testing.assert_close(e[0], torch.tensor([0.0, 0.0, 1.0, 1.0]))
    torch.testing.assert_close(e[1, :2], torch.tensor([2.0, 0.02]).sin())


def _load(path: Path, name: str):
    if not path.is_file():
        pytest.skip(f"official file not found: {path}")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _ls_root(official_root: str) -> Path:
    root = Path(official_root)
    return root / "transformer-ls" if (root / "transformer-ls").is_dir() else root


@pytest.mark.parity
def test_parity_official_imagenet(official_root):
    mod = _load(_ls_root(official_root) / "imagenet/models/layers/transformer_ls.py", "_official_ls_imagenet")
    for w, nglo in [(7, 1), (7, 0), (4, 1)]:
        off = mod.AttentionLS(24, 3, qkv_bias=True, rpe=True, nglo=nglo, dp_rank=5, w=w).eval()
        ours = subquad.build_attention("long_short", 24, 3, window_size=w, rank=5, dims=2,
                                       num_prefix_tokens=nglo).eval()
        ours.load_state_dict({k: v for k, v in off.state_dict().items() if k != "relative_position_index"})
        assert torch.equal(ours.relative_position_index, off.relative_position_index)
        x = torch.randn(2, nglo + 4 * w * w, 24)
        with torch.no_grad():
            assert_close(ours(x, (2 * w, 2 * w)), off(x, 2 * w, 2 * w).double(), torch.float32)


@pytest.mark.parity
def test_parity_official_lra(official_root):
    mod = _load(_ls_root(official_root) / "lra/attention_transformer_ls.py", "_official_ls_lra")
    for w, r, cls in [(8, 4, False), (8, 4, True), (1, 3, True)]:
        cfg = types.SimpleNamespace(pooling_mode="mean", cls_token=False, num_head=2, head_dim=8, num_landmarks=r,
                                    max_seq_len=40, transformer_dim=16, attention_dropout=0.0, window_size=w,
                                    fp32_attn=False)
        off = mod.AttentionLS(cfg).eval()
        ours = subquad.build_attention("long_short", 16, 2, window_size=w, rank=r, global_token_rule="lra",
                                       num_prefix_tokens=int(cls)).eval()
        ours.load_state_dict(remap_lra_official(off.state_dict()), strict=True)
        X, mask = torch.randn(2, 40, 16), torch.ones(2, 40)
        mask[1, 30:] = 0
        ce = torch.randn(2, 1, 16) if cls else None
        with torch.no_grad():
            ref = off(X, mask, ce)
            xin = torch.cat([ce, X], 1) if cls else X
            mk = torch.cat([torch.ones(2, 1), mask], 1).bool() if cls else mask.bool()
            assert_close(ours(xin, None, mk), ref.double(), torch.float32)


@pytest.mark.parity
def test_parity_official_autoregressive(official_root, monkeypatch):
    # the official layer imports fairseq only for its LayerNorm (a plain LayerNorm on CPU) and pdb
    fake = types.ModuleType("fairseq.modules.layer_norm")
    fake.LayerNorm = lambda d, export=False: torch.nn.LayerNorm(d)
    for name in ("fairseq", "fairseq.modules"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "fairseq.modules.layer_norm", fake)
    mod = _load(_ls_root(official_root) / "autoregressive/model_lib/layer.py", "_official_ls_ar")
    for w, l, r, M, L in [(8, 4, 2, 16, 8), (4, 2, 2, 4, 4)]:
        off = mod.ChunkedLSAttention(16, 2, l, r, w, 0.0).eval()
        for p in (off.r_r_bias, off.r_w_bias):
            torch.nn.init.normal_(p, std=0.1)
        ours = subquad.build_attention("long_short", 16, 2, causal=True, window_size=w, rank=r, chunk_size=l).eval()
        ours.load_state_dict(off.state_dict(), strict=True)
        h, mem = torch.randn(2, M, 16), torch.randn(2, L, 16)
        klen = M + L
        chunk_mask = torch.triu(torch.ones(M // l, klen // l, dtype=torch.bool), diagonal=L // l)
        chunk_mask = chunk_mask[None, None, :, None, :, None].expand(-1, -1, -1, -1, -1, r).reshape(
            1, 1, -1, 1, klen // l * r)
        key_pe = xl_sinusoid(torch.arange(klen // l * r - 1, -1, -1.0), 16)[None]
        pos_win = xl_sinusoid(torch.arange(w - 1, -1, -1.0), 16)[None]
        with torch.no_grad():
            ref = off(h, mem, key_pe, pos_win, chunk_mask).double()
            assert_close(ours(h, memory=mem), ref, torch.float32)
            assert_close(ours.forward_ref(h, memory=mem), ref, torch.float32)
