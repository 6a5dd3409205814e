"""LiSA structure-aware attention: fast paths vs the explicit Eq. 8-10 references, chunking, resizing, video."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import subquad
from subquad.attention.functional import structure_aware as fsa
from tests._tol import assert_close, compare_fn, compare_module

GRIDS = [(5, 7), (6, 6), (3, 4, 5)]


def _operands(grid, B=2, h=2, dh=3, D=3, shared_b=False, ksize=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    N, C = math.prod(grid), h * dh
    ksize = tuple(grid) if ksize is None else tuple(ksize)

    def r(*s):
        return torch.randn(*s, generator=g, dtype=torch.float64)

    q = F.normalize(r(B, h, N, dh), dim=-1)
    k = F.normalize(r(B, h, N, dh), dim=-1)
    return [q, k, r(B, h, N, dh), r(C, D, *ksize), r(1 if shared_b else h, D, *ksize), r(C, D)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("grid", GRIDS)
def test_fft_equals_circulant_ref(grid, dtype):
    """Eq. 13 (packed FFTs) == Eq. 10 with explicit circulant RPE: output and every input gradient."""
    ops = _operands(grid, h=2, D=3, shared_b=len(grid) == 3)
    compare_fn(lambda *a: fsa.lisa_fft(*a, grid), lambda *a: fsa.lisa_circulant_ref(*a, grid), ops, dtype)


def test_fft_chunked_equals_unchunked_and_checkpointed():
    grid = (5, 7)
    ops = _operands(grid, D=5)
    compare_fn(lambda *a: fsa.lisa_fft(*a, grid, d_chunk=2, checkpoint_chunks=True),
               lambda *a: fsa.lisa_fft(*a, grid), ops, torch.float64)
    compare_fn(lambda *a: fsa.lisa_fft(*a, grid, d_chunk=1), lambda *a: fsa.lisa_fft(*a, grid), ops, torch.float32)


@pytest.mark.parametrize("grid", [(4, 5), (2, 3, 4)])
def test_zero_boundary_fft_equals_toeplitz_ref(grid):
    ksize = tuple(2 * s - 1 for s in grid)
    ops = _operands(grid, D=2, ksize=ksize)
    compare_fn(lambda *a: fsa.lisa_fft(*a, grid, boundary="zero"), lambda *a: fsa.lisa_toeplitz_ref(*a, grid), ops)


@pytest.mark.parametrize("shared_b", [False, True])
@pytest.mark.parametrize("boundary", ["circular", "zero"])
@pytest.mark.parametrize("grid", [(5, 7), (2, 3, 4)])
def test_dense_kernel_path_equals_reference(grid, boundary, shared_b):
    """The kernel path as dense GEMMs (`dense_b`: A-hat from S kernel_b read at each pair's offset, then A-hat V)
    equals Eq. 10 with explicit RPE tensors: outputs and every gradient with it forced on under autograd, in float64
    and float32, with pattern tiles (D=5, d_chunk=2: the last tile holds one pattern)."""
    ksize = grid if boundary == "circular" else tuple(2 * s - 1 for s in grid)
    ops = _operands(grid, h=3, D=5, ksize=ksize, shared_b=shared_b)
    ref = fsa.lisa_circulant_ref if boundary == "circular" else fsa.lisa_toeplitz_ref
    for dtype in (torch.float64, torch.float32):
        compare_fn(lambda *a: fsa.lisa_fft(*a, grid, boundary, d_chunk=2, dense_b=True), lambda *a: ref(*a, grid),
                   ops, dtype)


def test_dense_kernel_path_after_inference_mode_trains():
    """The dense path's cached offset index, first built under torch.inference_mode(), is a normal tensor: a later
    call with autograd (a model served, then fine-tuned, in one process) saves it for backward without error."""
    grid = (3, 5)  # a size no other test uses first, so the cache entry is built here
    fsa._offset_index.cache_clear()
    ops = _operands(grid, h=2, D=2)
    with torch.inference_mode():
        served = fsa.lisa_fft(*ops, grid, dense_b=True)
    leaves = [t.detach().requires_grad_(True) for t in ops]
    out = fsa.lisa_fft(*leaves, grid, dense_b=True)
    out.square().sum().backward()
    assert all(t.grad is not None for t in leaves)
    torch.testing.assert_close(out.detach(), served)


def test_dense_kernel_path_takes_kernel_b_with_the_spectra(monkeypatch):
    """Spectra with a third element (kernel_b back in space, as the module caches them) spare the dense path its
    inverse transform and give the same output; a third element of another dtype is not used. The module caches
    that element with its spectra in eval mode without autograd."""
    grid = (5, 7)
    ops = _operands(grid, h=2, D=2)
    spectra = fsa.kernel_spectra(ops[3], ops[4], grid)
    kernel = fsa._kernel_from_spectra(spectra[1], len(grid), torch.float64)
    inverted = []
    real = fsa._kernel_from_spectra
    monkeypatch.setattr(fsa, "_kernel_from_spectra", lambda *a: inverted.append(a[2]) or real(*a))
    with torch.no_grad():
        plain = fsa.lisa_fft(*ops, grid, spectra=spectra, dense_b=True)
        assert inverted == [torch.float64]
        kept = fsa.lisa_fft(*ops, grid, spectra=(*spectra, kernel), dense_b=True)
        assert inverted == [torch.float64], "the kernel given with the spectra was inverted again"
        fsa.lisa_fft(*ops, grid, spectra=(*spectra, kernel.float()), dense_b=True)
        assert inverted == [torch.float64] * 2, "a kernel of another dtype was used"
    torch.testing.assert_close(kept, plain, rtol=0, atol=0)
    assert_close(kept, fsa.lisa_circulant_ref(*ops, grid), torch.float64, "kernel given with the spectra")
    attn = subquad.build_attention("structure_aware", 12, 2, D=2, input_size=(5, 7)).eval()
    with torch.no_grad():
        cached = attn._spectra((5, 7), torch.float32)
    assert len(cached) == 3
    torch.testing.assert_close(cached[2], real(cached[1], 2, torch.float32), rtol=0, atol=0)
    assert len(attn.train()._spectra((5, 7), torch.float32)) == 2


@pytest.mark.parametrize("grid", [(5, 7), (2, 3, 4)])
def test_dense_kernel_path_given_kernel_b_keeps_every_gradient(grid):
    """Under autograd a kernel_b given with the spectra (detached, as a stale cache entry would be) is not used:
    the gradient reaches kernel_b through its spectra, outputs and every gradient as the reference's."""
    ops = _operands(grid, h=2, D=3)

    def fn(q, k, v, ka, kb, sp):
        spectra = fsa.kernel_spectra(ka, kb, grid)
        kept = fsa._kernel_from_spectra(spectra[1], len(grid), q.dtype).detach()
        return fsa.lisa_fft(q, k, v, ka, kb, sp, grid, spectra=(*spectra, kept), dense_b=True)

    for dtype in (torch.float64, torch.float32):
        compare_fn(fn, lambda *a: fsa.lisa_circulant_ref(*a, grid), ops, dtype)


def test_dense_kernel_path_is_taken_without_autograd_on_small_grids(monkeypatch):
    """Without autograd on the CPU schedule lisa_fft takes the dense kernel path up to N = DENSE_B_TOKENS_PER_PATTERN
    * D tokens and the FFT correlations above; either way it equals the reference, and the FFT form stays
    reachable (`dense_b=False`) with the same result."""
    calls = []
    real = fsa._dense_kernel_path
    monkeypatch.setattr(fsa, "_dense_kernel_path", lambda *a: calls.append(a[0].shape) or real(*a))
    grid = (5, 7)  # N = 35
    ops = _operands(grid, h=2, D=2)  # dense up to 32 * 2 = 64 tokens
    big, big_ops = (9, 8), _operands((9, 8), h=2, D=2)  # N = 72: FFT
    with torch.no_grad():
        dense = fsa.lisa_fft(*ops, grid)
        assert calls == [(2, 2, 2, 35)], calls
        fft = fsa.lisa_fft(*ops, grid, dense_b=False)
        above = fsa.lisa_fft(*big_ops, big)
    assert len(calls) == 1, "the dense path ran above its size limit or when turned off"
    assert_close(dense, fsa.lisa_circulant_ref(*ops, grid), torch.float64, "dense, no autograd")
    assert_close(fft, fsa.lisa_circulant_ref(*ops, grid), torch.float64, "fft, no autograd")
    assert_close(above, fsa.lisa_circulant_ref(*big_ops, big), torch.float64, "above the limit")
    with torch.enable_grad():
        fsa.lisa_fft(*[t.clone().requires_grad_(True) for t in ops], grid)
    assert len(calls) == 1, "the dense path was taken under autograd without being asked for"


@pytest.mark.parametrize("B,h,N,F_,tile", [(4, 3, 35, 35, 2 ** 21), (4, 3, 35, 35, 35 * 35 * 2),
                                             (4, 3, 35, 130, 35 * 130 - 1), (5, 2, 12, 40, 12 * 40 * 2 * 3)])
def test_dense_blocks_bound_the_block(B, h, N, F_, tile):
    """Each dense block holds at most `tile_elems` floats of its (., N, max(N, F)) intermediates unless one head of one
    item is already larger, fills heads before batch items, and the blocks cover every (item, head)."""
    b, hb = fsa.dense_blocks(B, h, N, F_, tile)
    per_head = N * max(N, F_)
    assert 1 <= b <= B and 1 <= hb <= h
    assert b * hb * per_head <= tile or (b, hb) == (1, 1)
    assert b == 1 or hb == h, "batch items were blocked before all heads were"
    if hb < h:  # as many heads as fit
        assert (hb + 1) * per_head > tile
    elif b < B:
        assert (b + 1) * h * per_head > tile


@pytest.mark.parametrize("shared_b", [False, True])
@pytest.mark.parametrize("tile", [1, 35 * 35 * 2, 35 * 35 * 3 * 2])
def test_dense_kernel_path_in_blocks_equals_reference(tile, shared_b):
    """The dense kernel path run in blocks of heads and batch items (small `tile_elems`: one head at a time, two heads,
    whole items two at a time, the last block short) equals Eq. 10 with explicit RPE on a 5 x 7 grid, with a per-head
    and a shared kernel_b: the output without autograd, and output and every gradient with it forced on under
    autograd, in float64 and float32."""
    grid = (5, 7)
    ops = _operands(grid, B=3, h=3, D=2, shared_b=shared_b)
    with torch.no_grad():
        got = fsa.lisa_fft(*ops, grid, dense_b=True, tile_elems=tile)
    assert_close(got, fsa.lisa_circulant_ref(*ops, grid), torch.float64, f"dense in blocks, tile_elems={tile}")
    for dtype in (torch.float64, torch.float32):
        compare_fn(lambda *a: fsa.lisa_fft(*a, grid, dense_b=True, tile_elems=tile),
                   lambda *a: fsa.lisa_circulant_ref(*a, grid), ops, dtype)


@pytest.mark.parametrize("grid,tile", [((3, 4, 5), 60 * 60), ((4, 7), 1)])
def test_dense_kernel_path_in_blocks_zero_boundary_and_3d(grid, tile):
    """Blocks on a 3-D grid (one head per block) and on the zero boundary (F = 2 x grid, one item and head per block)
    equal the references: outputs and every gradient."""
    boundary = "zero" if len(grid) == 2 else "circular"
    ksize = grid if boundary == "circular" else tuple(2 * g - 1 for g in grid)
    ops = _operands(grid, B=2, h=3, D=3, ksize=ksize)
    ref = fsa.lisa_circulant_ref if boundary == "circular" else fsa.lisa_toeplitz_ref
    assert fsa.dense_blocks(2, 3, math.prod(grid), math.prod(grid) * (4 if boundary == "zero" else 1), tile) == (1, 1)
    compare_fn(lambda *a: fsa.lisa_fft(*a, grid, boundary, dense_b=True, tile_elems=tile), lambda *a: ref(*a, grid),
               ops)


@pytest.mark.parametrize("dense_b", [None, True, False])
def test_empty_batch_gives_an_empty_output(dense_b):
    """B = 0 (torch's FFTs refuse zero-length batches) returns the (0, h, N, dh) output, with and without autograd."""
    grid = (5, 7)
    ops = _operands(grid, B=0)
    with torch.no_grad():
        assert fsa.lisa_fft(*ops, grid, dense_b=dense_b).shape == (0, 2, 35, 3)
    q = ops[0].clone().requires_grad_(True)
    y = fsa.lisa_fft(q, *ops[1:], grid, dense_b=dense_b)
    y.sum().backward()
    assert y.shape == (0, 2, 35, 3) and q.grad.shape == q.shape


@pytest.mark.parametrize("bad", [1, 0, "yes", 1.0])
def test_dense_b_must_be_a_bool_or_none(bad):
    grid = (5, 7)
    with pytest.raises(TypeError, match="dense_b must be True, False or None"):
        fsa.lisa_fft(*_operands(grid), grid, dense_b=bad)


@pytest.mark.parametrize("boundary,resize", [("circular", "pad"), ("circular", "interp"), ("zero", "pad")])
def test_module_dense_kernel_path_at_another_size_than_its_kernels(boundary, resize):
    """A module whose kernels are stored at 5 x 7 and run on 6 x 4 and 3 x 9 tokens without autograd (the dense
    kernel path, its kernel read back from the resized kernels' spectra) gives the explicit reference's output."""
    m = _module(dim=8, heads=2, D=3, input_size=(5, 7), boundary=boundary, kernel_resize=resize).double().eval()
    for hw in ((6, 4), (3, 9)):
        x = torch.randn(2, math.prod(hw), 8, dtype=torch.float64)
        with torch.no_grad():
            assert_close(m(x, hw), m.forward_ref(x, hw), torch.float64, f"{boundary}/{resize} at {hw}")


def test_toeplitz_vs_circulant_agree_away_from_wrap_and_differ_at_border():
    """Kernels supported on |delta| <= 1: queries at distance >= 1 from every border see the same keys in both
    forms (exact agreement); border queries differ because the circulant form wraps in keys from the opposite
    border. The border difference is the effect of the FFT form's circular boundary (docs/mechanisms.md, LiSA;
    `boundary="zero"` is the Toeplitz form without it)."""
    grid, r = (6, 7), 1
    q, k, v, ka, kb, bp = _operands(grid, ksize=(3, 3))
    tka, tkb = fsa.local_to_toeplitz(ka, grid), fsa.local_to_toeplitz(kb, grid)
    # The same local kernels as circular kernels: offset delta at delta mod grid.
    cka = fsa.resize_kernel(torch.roll(ka, (-1, -1), (-2, -1)), grid)
    ckb = fsa.resize_kernel(torch.roll(kb, (-1, -1), (-2, -1)), grid)
    yt = fsa.lisa_toeplitz_ref(q, k, v, tka, tkb, bp, grid)
    yc = fsa.lisa_circulant_ref(q, k, v, cka, ckb, bp, grid)
    ys, xs = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    inner = ((ys >= r) & (ys < grid[0] - r) & (xs >= r) & (xs < grid[1] - r)).flatten()
    assert_close(yc[:, :, inner], yt[:, :, inner], torch.float64, "interior queries")
    border_err = fsa_rel(yc[:, :, ~inner], yt[:, :, ~inner])
    assert border_err > 1e-2, f"border queries should differ (wrap-around), rel diff {border_err:.2e}"
    # Also the FFT local path (conv) equals the Toeplitz form.
    assert_close(fsa.lisa_local(q, k, v, ka, kb, bp, grid), yt, torch.float64, "local conv vs Toeplitz")


def fsa_rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_relative_index_uses_grid_coordinates():
    """rpe_matrix indexes offsets by (y, x) coordinates, checked against an explicit loop (circular and Toeplitz)."""
    grid = (3, 4)
    kc = torch.randn(3, 4)
    kt = torch.randn(5, 7)
    rc, rt = fsa.rpe_matrix(kc, grid), fsa.rpe_matrix(kt, grid, "zero")
    pos = [(y, x) for y in range(3) for x in range(4)]
    for i, (yi, xi) in enumerate(pos):
        for n, (yn, xn) in enumerate(pos):
            assert rc[i, n] == kc[(yn - yi) % 3, (xn - xi) % 4]
            assert rt[i, n] == kt[yn - yi + 2, xn - xi + 3]


def test_eq8_matches_loop():
    grid = (3, 4)
    q, k, v, *_ = _operands(grid, B=1, h=2)
    e = torch.randn(2, 5, 7, dtype=torch.float64)
    y = fsa.lisa_eq8_ref(q, k, v, e, grid, "zero")
    pos = [(a, b) for a in range(3) for b in range(4)]
    ref = torch.zeros_like(y)
    for i, (yi, xi) in enumerate(pos):
        for n, (yn, xn) in enumerate(pos):
            w = (q[:, :, i] * k[:, :, n]).sum(-1) * e[:, yn - yi + 2, xn - xi + 3]  # (B, h)
            ref[:, :, i] += w[..., None] * v[:, :, n]
    assert_close(y, ref, torch.float64, "Eq. 8 vs loop")


def test_eq10_reduces_to_eq9_for_channel_shared_kernels():
    """The Hadamard correlation (Eq. 10) with W^a equal over the channels of a head is the dot-product
    correlation (Eq. 9): sum_c q_c k_c R_d = (q . k) R_d."""
    grid = (4, 5)
    q, k, v, _, kb, bp = _operands(grid, h=2, dh=3, D=2)
    ka_head = torch.randn(2, 2, *grid, dtype=torch.float64)
    ka = ka_head.repeat_interleave(3, dim=0)  # (C, D, H, W), channel c uses head c // dh
    assert_close(fsa.lisa_eq10_ref(q, k, v, ka, kb, bp, grid), fsa.lisa_eq9_ref(q, k, v, ka_head, kb, bp, grid),
                 torch.float64, "Eq. 10 vs Eq. 9")


def _module(dim=8, heads=2, **kw):
    kw.setdefault("input_size", (5, 7))
    kw.setdefault("D", 3)
    return subquad.build_attention("structure_aware", dim, heads, **kw)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("hw,D,heads,shared", [((4, 5), 1, 1, False), ((7, 7), 3, 2, True), ((6, 10), 8, 2, False)])
def test_module_fast_equals_ref(hw, D, heads, shared, dtype):
    """Whole module (qkv, normalisation, kernels, struct_proj, proj): every parameter gradient included."""
    m = _module(dim=8, heads=heads, D=D, input_size=hw, shared_kernel_b=shared)
    x = torch.randn(2, math.prod(hw), 8)
    compare_module(m, lambda m, x: m(x, hw), lambda m, x: m.forward_ref(x, hw), [x], dtype)


@pytest.mark.parametrize("mode", ["pad", "interp"])
def test_module_other_grid_fast_equals_ref(mode):
    """At a grid other than input_size the resampled kernels feed both paths (gradients reach the stored ones)."""
    m = _module(input_size=(5, 7), kernel_resize=mode)
    hw = (6, 4)
    compare_module(m, lambda m, x: m(x, hw), lambda m, x: m.forward_ref(x, hw), [torch.randn(2, 24, 8)],
                   torch.float32)


def test_module_local_kernel_equals_explicit_local_form():
    m = _module(local_kernel=3, input_size=(5, 7))
    assert tuple(m.kernel_a.shape) == (8, 3, 3, 3)
    for hw in [(5, 7), (4, 6)]:
        compare_module(m, lambda m, x, hw=hw: m(x, hw), lambda m, x, hw=hw: m.forward_ref(x, hw),
                       [torch.randn(2, math.prod(hw), 8)], torch.float64)


def test_module_zero_boundary_and_video_equal_ref():
    m = _module(boundary="zero", input_size=(4, 5))
    compare_module(m, lambda m, x: m(x, (4, 5)), lambda m, x: m.forward_ref(x, (4, 5)), [torch.randn(2, 20, 8)])
    mv = _module(input_size=(3, 4, 5))
    compare_module(mv, lambda m, x: m(x, (3, 4, 5)), lambda m, x: m.forward_ref(x, (3, 4, 5)),
                   [torch.randn(2, 60, 8)], torch.float32)


def test_module_d_chunk_equals_unchunked():
    m = _module(D=6)
    x = torch.randn(2, 35, 8)
    y = m(x, (5, 7))
    for c in (1, 4):
        m.d_chunk = c
        assert_close(m(x, (5, 7)), y, torch.float32, f"d_chunk={c}")
    m.checkpoint_kernels = True
    x.requires_grad_(True)
    m(x, (5, 7)).sum().backward()
    assert torch.isfinite(x.grad).all() and m.kernel_a.grad is not None


def test_plan_tiles():
    # 14^2 tokens, C=192 (6 heads of 32), D=8: everything in one tile.
    assert fsa.plan_tiles(1, 6, 32, 8, 14 * 14) == (6, 8)
    # 112^2: one head with all of D is 3.2M floats > 2^21 -> D in chunks of 4, one head per tile.
    assert fsa.plan_tiles(1, 6, 32, 8, 112 * 112) == (1, 4)
    # Patterns travel in pairs: d_chunk=1 rounds up to 2 (one complex transform), and 2 heads fit.
    assert fsa.plan_tiles(1, 6, 32, 8, 112 * 112, d_chunk=1) == (2, 2)
    assert fsa.plan_tiles(1, 6, 32, 5, 112 * 112, d_chunk=4) == (1, 4)
    assert fsa.plan_tiles(1, 6, 32, 1, 112 * 112) == (2, 1)
    grid = (5, 7)
    ops = _operands(grid, h=3, D=4)
    ref = fsa.lisa_fft(*ops, grid)
    for budget in (1, 300, 2 ** 10):
        assert_close(fsa.lisa_fft(*ops, grid, tile_elems=budget), ref, torch.float64, f"tile budget {budget}")


def test_attention_matrix_is_the_kernel_path():
    """With B = 0 (no feature path), forward == proj(A-hat V) per head."""
    m = _module().double()
    with torch.no_grad():
        m.struct_proj.zero_()
    x = torch.randn(2, 35, 8, dtype=torch.float64)
    a = m.attention_matrix(x, (5, 7))
    assert a.shape == (2, 2, 35, 35)
    _, _, v = m._qkv(x)
    expect = m.proj(subquad._shapes.merge_heads(a @ v))
    assert_close(m(x, (5, 7)), expect, torch.float64, "A-hat V")


def test_resize_kernel_pad_rules():
    k = torch.randn(2, 3, 5, 6)
    assert torch.equal(fsa.resize_kernel(k, (5, 6)), k)
    assert torch.equal(fsa.resize_kernel(fsa.resize_kernel(k, (9, 11)), (5, 6)), k)
    # Kernel supported on |delta| <= 1: the same offsets carry the same weights at the larger grid, zero elsewhere.
    small = torch.zeros(1, 1, 5, 6)
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            small[..., dy % 5, dx % 6] = torch.randn(())
    big = fsa.resize_kernel(small, (9, 11))
    for dy in range(-4, 5):
        for dx in range(-5, 6):
            expect = small[..., dy % 5, dx % 6] if abs(dy) <= 1 and abs(dx) <= 1 else torch.zeros(1, 1)
            assert torch.equal(big[..., dy % 9, dx % 11], expect)


def test_resize_kernel_interp_keeps_dc_gain():
    k = torch.full((2, 1, 5, 5), 0.3, dtype=torch.float64)
    r = fsa.resize_kernel(k, (9, 8), "interp")
    assert r.shape == (2, 1, 9, 8)
    torch.testing.assert_close(r.sum((-2, -1)), k.sum((-2, -1)))


def test_video_t1_equals_2d_and_center_inflation_is_framewise():
    m2 = _module(input_size=(5, 7)).eval()
    m3 = _module(input_size=(4, 5, 7)).eval()
    m1 = _module(input_size=(1, 5, 7)).eval()
    sd = m2.state_dict()
    for mod in (m3, m1):
        T = mod.input_size[0]
        mod.load_state_dict({**sd, "kernel_a": fsa.inflate_kernel(sd["kernel_a"], T),
                             "kernel_b": fsa.inflate_kernel(sd["kernel_b"], T)})
    video = torch.randn(2, 4, 35, 8)
    with torch.no_grad():
        y3 = m3(video.reshape(2, 140, 8), (4, 5, 7)).reshape(2, 4, 35, 8)
        framewise = torch.stack([m2(video[:, t], (5, 7)) for t in range(4)], 1)
        assert_close(y3, framewise, torch.float32, "center-inflated 3-D vs frame-wise 2-D")
        assert_close(m1(video[:, 0], (1, 5, 7)), m2(video[:, 0], (5, 7)), torch.float32, "T=1 vs 2-D")
    avg = fsa.inflate_kernel(sd["kernel_a"], 4, "average")
    torch.testing.assert_close(avg.sum(-3), sd["kernel_a"])


def test_eval_spectra_cache_is_invalidated_by_updates():
    m = _module().eval()
    x = torch.randn(1, 35, 8)
    with torch.no_grad():
        y0 = m(x, (5, 7))
        assert m._spectra_cache
        assert torch.equal(m(x, (5, 7)), y0)
        m.kernel_b.mul_(2.0)
        y1 = m(x, (5, 7))
    assert not torch.allclose(y0, y1)
    m.train()
    assert_close(m(x, (5, 7)).detach(), y1, torch.float32, "train vs cached eval")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_runs_core_in_fp32(dtype, monkeypatch):
    """Under autocast the FFT core receives float32 q, k, v and kernels (the fp32 island), output is finite."""
    import subquad.attention.structure_aware as mod

    seen = []

    def spy(*args, **kw):
        seen.extend(a.dtype for a in args[:6] if isinstance(a, torch.Tensor))
        return fsa.lisa_fft(*args, **kw)

    monkeypatch.setattr(mod, "lisa_fft", spy)
    m = _module()
    x = torch.randn(2, 35, 8)
    with torch.autocast("cpu", dtype=dtype):
        y = m(x, (5, 7))
    assert torch.isfinite(y).all() and y.dtype == dtype
    assert seen and all(d == torch.float32 for d in seen), seen
    assert_close(y.float(), m(x, (5, 7)), dtype, "autocast vs fp32")


@pytest.mark.parametrize("B", [1, 3])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_channel_major_qkv_projection_equals_linear(B, bias, dtype):
    """The channel-major q/k/v GEMM (one addmm for one image, a batched GEMM otherwise) is F.linear transposed, on
    outputs and every gradient (x, weight, bias), on 13 tokens of 5 channels into 9."""
    from subquad.attention.structure_aware import _channel_major_linear

    g = torch.Generator().manual_seed(B)
    inputs = [torch.randn(B, 13, 5, generator=g), torch.randn(9, 5, generator=g)]
    inputs += [torch.randn(9, generator=g)] if bias else []
    compare_fn(lambda x, w, *b: _channel_major_linear(x, w, b[0] if b else None),
               lambda x, w, *b: F.linear(x, w, b[0] if b else None).transpose(1, 2), inputs, dtype)


@pytest.mark.parametrize("B", [0, 1, 3])
def test_channel_major_qkv_projection_under_autocast_and_empty(B):
    """Under bf16 autocast the projection runs in bf16 with the numbers of the batched GEMM on broadcast views it
    replaced (the weight and bias cast once, not per batch item or token); an empty batch gives an empty output."""
    from subquad.attention.structure_aware import _channel_major_linear

    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(B, 11, 6, generator=g), torch.randn(10, 6, generator=g), torch.randn(10, generator=g)
    with torch.autocast("cpu", torch.bfloat16):
        y = _channel_major_linear(x, w, b)
        ref = torch.baddbmm(b[:, None].expand(B, -1, 11), w.expand(B, *w.shape), x.transpose(1, 2))
    assert y.shape == (B, 10, 11) and y.dtype == torch.bfloat16
    if B == 0:
        return
    assert_close(y.float(), ref.float(), torch.bfloat16, "autocast projection")
    assert_close(y.double(), F.linear(x.double(), w.double(), b.double()).transpose(1, 2), torch.bfloat16,
                 "autocast projection vs float64")


def test_bad_inputs_clear_errors():
    with pytest.raises(ValueError, match="D .*>= 1, got 0"):
        _module(D=0)
    with pytest.raises(ValueError, match="local_kernel"):
        _module(local_kernel=4)
    m = _module()
    with pytest.raises(ValueError, match="hw=6x7 makes 42 tokens but x has N=35"):
        m(torch.randn(1, 35, 8), (6, 7))
    with pytest.raises(ValueError, match=r"\(T, H, W\)"):
        _module(input_size=(2, 5, 7))(torch.randn(1, 35, 8), (5, 7))
    with pytest.raises(ValueError, match="num_prefix_tokens"):
        _module(num_prefix_tokens=1)


@pytest.mark.parametrize("D", [1, 2, 5])
@pytest.mark.parametrize("grid,fft_grid", [((5, 7), (5, 7)), ((3, 4), (6, 8)), ((2, 3, 4), (2, 3, 4))])
def test_kernel_spectra_are_correlation_spectra(grid, fft_grid, D):
    """Definition check, independent of lisa_fft: for a real signal x, ifft(fft(x) * spectrum) of pattern pair e
    is corr(w_2e, x) + i corr(w_2e+1, x) (kernel_a), and of pattern d is corr(w_d, x) (kernel_b), where
    corr(w, x)[i] = sum_n w[n - i] x[n] on the circular fft_grid, written out with explicit index sums."""
    nd = len(grid)
    dims = tuple(range(-nd, 0))
    g = torch.Generator().manual_seed(1)
    ka = torch.randn(2, D, *grid, generator=g, dtype=torch.float64)
    kb = torch.randn(1, D, *grid, generator=g, dtype=torch.float64)
    x = torch.randn(*fft_grid, generator=g, dtype=torch.float64)
    wa, wb = fsa.kernel_spectra(ka, kb, fft_grid)
    assert wa.shape == (2, (D + 1) // 2, *fft_grid) and wb.shape == (1, D, *fft_grid)
    n_all = list(itertools.product(*[range(s) for s in fft_grid]))

    def corr(w):  # w (*grid) zero-padded to fft_grid
        wp = torch.zeros(fft_grid, dtype=w.dtype)
        wp[tuple(slice(0, s) for s in grid)] = w
        out = torch.zeros(fft_grid, dtype=torch.float64)
        for i in n_all:
            out[i] = sum(wp[tuple((n[a] - i[a]) % fft_grid[a] for a in range(nd))] * x[n] for n in n_all)
        return out

    fx = torch.fft.fftn(x, dim=dims)
    for e in range(wa.shape[1]):
        got = torch.fft.ifftn(fx * wa[0, e], dim=dims)
        assert_close(got.real, corr(ka[0, 2 * e]), torch.float64, f"pair {e} real part")
        want_im = corr(ka[0, 2 * e + 1]) if 2 * e + 1 < D else torch.zeros(fft_grid, dtype=torch.float64)
        assert torch.allclose(got.imag, want_im, atol=1e-10), f"pair {e} imaginary part"
    for d in range(D):
        got = torch.fft.ifftn(fx * wb[0, d], dim=dims)
        assert_close(got.real, corr(kb[0, d]), torch.float64, f"kernel_b pattern {d}")
        assert got.imag.abs().max() < 1e-10


@pytest.mark.slow
def test_peak_memory_bounded_by_tiling():
    """Allocator probe (CPU): forward+backward at 112^2 tokens (C=192, 6 heads, D=8) stays under 1 GiB, and a
    smaller D chunk lowers the forward peak."""
    from subquad.bench.memory import peak_memory

    m = subquad.build_attention("structure_aware", 192, 6, D=8, input_size=(112, 112))
    x = torch.randn(1, 112 * 112, 192, requires_grad=True)
    assert peak_memory(lambda: m(x, (112, 112)).sum().backward()) < 2 ** 30
    # With an unlimited tile budget every head joins one tile, so the D chunk alone sets the Ga/Gb tile size.
    grid = (56, 56)
    ops = _operands(grid, B=1, h=6, dh=32, D=8)
    ops = [t.float() for t in ops]
    peaks = {}
    with torch.no_grad():
        for c in (8, 1):
            peaks[c] = peak_memory(lambda c=c: fsa.lisa_fft(*ops, grid, d_chunk=c, tile_elems=2 ** 30))
    assert peaks[1] < peaks[8], peaks


def test_module_fft_dims_1d_equals_ref():
    """fft_dims='1d' (ablation): one circulant over the raster-order sequence, kernels (C, D, N0)."""
    m = _module(fft_dims="1d", input_size=(5, 7))
    assert tuple(m.kernel_a.shape) == (8, 3, 35)
    for hw in [(5, 7), (6, 4)]:
        compare_module(m, lambda m, x, hw=hw: m(x, hw), lambda m, x, hw=hw: m.forward_ref(x, hw),
                       [torch.randn(2, math.prod(hw), 8)], torch.float64)
    with pytest.raises(ValueError, match="fft_dims"):
        _module(fft_dims="3d")


@pytest.mark.parametrize("dense_b", [None, False])
@pytest.mark.parametrize("boundary", ["circular", "zero"])
def test_inference_workspaces_equal_autograd_path(boundary, dense_b):
    """Without autograd lisa_fft reuses workspaces across tiles and works in place: same values as the autograd
    path, with tiles of different sizes (D=5: the last tile is smaller) and the inputs left untouched; with the
    kernel path dense (the default at this size) and as FFT correlations."""
    grid = (5, 7)
    ksize = grid if boundary == "circular" else tuple(2 * s - 1 for s in grid)
    ops = _operands(grid, h=3, D=5, ksize=ksize)
    before = [t.clone() for t in ops]
    want = fsa.lisa_fft(*[t.clone().requires_grad_(True) for t in ops], grid, boundary, d_chunk=2)
    with torch.no_grad():
        got = fsa.lisa_fft(*ops, grid, boundary, d_chunk=2, tile_elems=300, dense_b=dense_b)
    assert_close(got, want.detach(), torch.float64, "no-grad workspaces vs autograd")
    for a, b in zip(ops, before):
        assert torch.equal(a, b)


def _slots():
    import threading

    return fsa._thread_slots.get(threading.current_thread(), {})


def _ptrs(slots):
    return {b.untyped_storage().data_ptr() for b in slots.values()}


def test_inference_workspaces_persist_across_calls_without_aliasing_results():
    """The inference workspaces outlive a call (one buffer per slot and thread, grown to the largest call):
    - no result shares memory with a kept buffer, and a later call of the same size with other operands leaves an
      earlier result as it was;
    - a smaller call reuses the grown buffer;
    - inference_mode and no_grad keep separate buffers (an inference tensor may not be written in place outside
      inference_mode);
    - another thread gets buffers of its own;
    - release_workspaces() frees the calling thread's buffers, or every thread's."""
    import threading

    fsa.release_workspaces(all_threads=True)
    small, large = (4, 5), (7, 6)
    ops_s, ops_s2 = _operands(small, h=2, D=4), _operands(small, h=2, D=4, seed=2)
    ops_l = _operands(large, h=3, D=5, seed=1)
    with torch.no_grad():
        got_s = fsa.lisa_fft(*ops_s, small)
        kept = dict(_slots())
        assert kept, "no workspace was kept after the call"
        first = got_s.clone()
        got_s2 = fsa.lisa_fft(*ops_s2, small)  # same size, other operands
        got_l = fsa.lisa_fft(*ops_l, large)
        grown = dict(_slots())
        got_s3 = fsa.lisa_fft(*ops_s, small)  # smaller than the last call
    assert torch.equal(got_s, first), "an earlier result changed: it shares memory with a workspace"
    assert_close(got_s, fsa.lisa_circulant_ref(*ops_s, small), torch.float64, "first call")
    assert_close(got_s2, fsa.lisa_circulant_ref(*ops_s2, small), torch.float64, "second call, same size")
    assert_close(got_l, fsa.lisa_circulant_ref(*ops_l, large), torch.float64, "larger call")
    assert torch.equal(got_s3, first), "a smaller call after a larger one read stale values"
    for y in (got_s, got_s2, got_l, got_s3):
        assert y.untyped_storage().data_ptr() not in _ptrs(_slots())
    assert set(grown) == set(kept) and all(_slots()[k] is grown[k] for k in grown), "the grown buffer was not reused"
    assert all(grown[k].numel() >= kept[k].numel() for k in kept)
    with torch.inference_mode():
        got_i = fsa.lisa_fft(*ops_l, large)
    with torch.no_grad():  # would raise if it reused a buffer made under inference_mode
        got_n = fsa.lisa_fft(*ops_l, large)
    assert torch.equal(got_i, got_n)
    assert {k[-1] for k in _slots()} == {False, True}

    mine = _ptrs(_slots())
    out = {}

    def other():
        out["before"] = dict(_slots())
        with torch.no_grad():
            out["y"] = fsa.lisa_fft(*ops_l, large)
        out["ptrs"] = _ptrs(_slots())

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert out["before"] == {}, "a new thread saw another thread's workspaces"
    assert out["ptrs"] and not out["ptrs"] & mine, "two threads share a workspace buffer"
    assert_close(out["y"], fsa.lisa_circulant_ref(*ops_l, large), torch.float64, "other thread")
    assert _ptrs(_slots()) == mine
    fsa.release_workspaces()
    assert not _slots()


def test_inference_workspaces_keep_only_cpu_buffers_up_to_a_size(monkeypatch):
    """A request above WORKSPACE_KEEP_BYTES (a large batch) gets a buffer for that call only, and the values are
    the same; the kept ones stay within the bound."""
    fsa.release_workspaces()
    grid = (5, 7)
    ops = _operands(grid, h=2, D=4)
    with torch.no_grad():
        want = fsa.lisa_fft(*ops, grid)
        assert _slots()
        fsa.release_workspaces()
        monkeypatch.setattr(fsa, "WORKSPACE_KEEP_BYTES", 64)
        got = fsa.lisa_fft(*ops, grid)
    assert not _slots(), "a buffer above the bound was kept"
    assert torch.equal(got, want)
    assert fsa._workspace("x", (4, 4), torch.float32, torch.device("meta")).device.type == "meta"
    assert not _slots(), "a non-CPU buffer was kept"


@pytest.mark.parametrize("shape,fft_grid", [((2, 3, 5, 7), (5, 7)), ((2, 6, 6), (6, 6)), ((2, 3, 4, 5), (3, 4, 5)),
                                            ((1, 4, 5), (8, 10)), ((2, 5), (5,)), ((2, 3), (6,))])
def test_fft_of_real_equals_fftn(shape, fft_grid):
    """rfftn + Hermitian completion == torch.fft.fftn (zero-padded), outputs and input gradients."""
    x = torch.randn(*shape, dtype=torch.float64)
    dims = tuple(range(-len(fft_grid), 0))
    compare_fn(lambda t: torch.view_as_real(fsa._fft_of_real(t, fft_grid)),
               lambda t: torch.view_as_real(torch.fft.fftn(t, s=fft_grid, dim=dims)), [x])


def test_qkv_channel_major_equals_linear_then_normalize():
    """The module's channel-major projection and rsqrt normalisation == qkv Linear + F.normalize over the head dim
    (values and gradients of x and of the qkv weights), on an odd token count."""
    m = _module().double()
    x = torch.randn(2, 35, 8, dtype=torch.float64)

    def plain(t):
        q, k, v = m.qkv(t).reshape(2, 35, 3, m.num_heads, m.head_dim).unbind(2)
        q, k = F.normalize(q, dim=-1, eps=1e-6), F.normalize(k, dim=-1, eps=1e-6)
        return torch.cat([z.transpose(1, 2) for z in (q, k, v)], -1)

    compare_fn(lambda t: torch.cat(m._qkv(t), -1), plain, [x])
    m.zero_grad(set_to_none=True)  # compare_fn's two backward passes accumulated into the weights
    xg = x.clone().requires_grad_(True)
    torch.cat(m._qkv(xg), -1).pow(2).sum().backward()
    g_fast = (xg.grad.clone(), m.qkv.weight.grad.clone())
    xg.grad = None
    m.qkv.weight.grad = None
    plain(xg).pow(2).sum().backward()
    torch.testing.assert_close(g_fast[0], xg.grad)
    torch.testing.assert_close(g_fast[1], m.qkv.weight.grad)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("grid, boundary", [((5, 7), "circular"), ((4, 5), "zero"), ((2, 3, 4), "circular")])
def test_real_dft_form_equals_ref(grid, boundary, dtype):
    """`lisa_dft` (real DFT matrices, the ONNX form) == Eq. 10 with explicit RPE tensors: output and all gradients."""
    ksize = grid if boundary == "circular" else tuple(2 * s - 1 for s in grid)
    ops = _operands(grid, h=2, D=3, ksize=ksize, shared_b=len(grid) == 3)
    ref = fsa.lisa_circulant_ref if boundary == "circular" else fsa.lisa_toeplitz_ref
    compare_fn(lambda *a: fsa.lisa_dft(*a, grid, boundary), lambda *a: ref(*a, grid), ops, dtype)


def test_real_dft_tables_equal_torch_fft():
    from subquad.attention.functional.dft import irdft_real, rdft

    x = torch.randn(2, 3, 5, 7, dtype=torch.float64)
    for s in [(5, 7), (10, 14), (6, 9)]:
        re, im = rdft(x, s)
        ref = torch.fft.fftn(x, s=s, dim=(-2, -1))
        assert_close(re, ref.real, name="re")
        assert_close(im, ref.imag, name="im")
        assert_close(irdft_real(re, im, (5, 7)), torch.fft.ifftn(ref, dim=(-2, -1)).real[..., :5, :7], name="inverse")


def test_module_under_real_dft_switch_equals_ref(monkeypatch):
    """Inside `subquad.backend.real_dft()` the module takes the real-DFT form (no complex tensor), at another grid."""
    import subquad.attention.structure_aware as sa_mod
    from subquad.backend import real_dft, real_dft_active

    seen = []

    def spy(*a, **k):
        seen.append(real_dft_active())
        return fsa.lisa_dft(*a, **k)

    monkeypatch.setattr(sa_mod, "lisa_dft", spy)
    m = _module(input_size=(5, 7))
    with real_dft():
        compare_module(m, lambda m, x: m(x, (6, 4)), lambda m, x: m.forward_ref(x, (6, 4)), [torch.randn(2, 24, 8)],
                       torch.float32)
    assert seen and all(seen) and not real_dft_active()


@pytest.mark.parametrize("dtype,native_bf16,pinned", [(torch.bfloat16, True, False), (torch.bfloat16, False, True),
                                                       (torch.float16, True, True)])
def test_qkv_gemm_runs_in_autocast_dtype_only_where_that_is_fast(dtype, native_bf16, pinned, monkeypatch):
    """On the CPU schedule the q/k/v GEMM leaves autocast (fp32) only when the autocast dtype is slow on this CPU:
    fp16, or bf16 without native bf16. The FFT core gets fp32 either way; output and every gradient stay within the
    dtype's tolerance of the float64 module."""
    import subquad.attention.structure_aware as mod
    import subquad.backend as backend

    monkeypatch.setattr(backend, "cpu_features", lambda: backend.CpuFeatures(bf16=native_bf16, int8_dot=False,
                                                                              amx=False, source="test"))
    autocast_at_gemm, core = [], []
    real_baddbmm = torch.baddbmm

    def spy_gemm(*args, **kw):
        autocast_at_gemm.append(torch.is_autocast_enabled("cpu"))
        return real_baddbmm(*args, **kw)

    def spy_core(*args, **kw):
        core.extend(a.dtype for a in args[:3])
        return fsa.lisa_fft(*args, **kw)

    import copy

    m = _module()
    m64 = copy.deepcopy(m).double()  # the float64 reference: same weights, every step in float64
    x = torch.randn(2, 35, 8)  # a 5 x 7 grid: odd and not square
    x64 = x.double().requires_grad_()
    ref = m64(x64, (5, 7))
    ref.backward(torch.ones_like(ref))
    monkeypatch.setattr(mod, "lisa_fft", spy_core)
    monkeypatch.setattr(torch, "baddbmm", spy_gemm)
    x = x.requires_grad_()
    with torch.autocast("cpu", dtype=dtype):
        y = m(x, (5, 7))
    y.float().backward(torch.ones_like(y, dtype=torch.float32))
    assert autocast_at_gemm == [not pinned]
    assert core and set(core) == {torch.float32}
    assert_close(y.float(), ref.float(), dtype, "autocast vs float64")
    assert_close(x.grad, x64.grad.float(), dtype, "input gradient")
    for (name, p), p64 in zip(m.named_parameters(), m64.parameters()):
        assert p.grad is not None, name
        assert_close(p.grad, p64.grad.float(), dtype, f"{name} gradient")
