from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import subquad
from subquad.attention.functional.window import (
    relative_position_index,
    window_attention,
    window_attention_ref,
    window_geometry,
    window_partition,
    window_reverse,
)
from subquad.attention.window import WindowAttention
from tests._tol import assert_close, compare_fn, compare_module

# (hw, window, shift, pad_mode): non-square, non-divisible, shifted, zero-padded, map smaller than the window.
CASES = [
    ((7, 9), 4, 2, "mask"),
    ((13, 5), 4, 0, "mask"),
    ((13, 9), 7, 3, "mask"),
    ((7, 9), 4, 0, "zero"),
    ((3, 5), 7, 0, "zero"),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("hw,window,shift,pad_mode", CASES)
def test_module_fast_vs_dense_reference(hw, window, shift, pad_mode, dtype):
    m = WindowAttention(24, 3, window, shift, rel_pos_bias=pad_mode == "mask", pad_mode=pad_mode)
    x = torch.randn(2, hw[0] * hw[1], 24)
    compare_module(m, lambda mm, x: mm(x, hw), lambda mm, x: mm.forward_ref(x, hw), [x], dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("hw,window,shift,pad_mode", CASES[:4])
def test_functional_fast_vs_reference(hw, window, shift, pad_mode, dtype):
    h, d = 2, 5
    N = hw[0] * hw[1]
    q, k, v = (torch.randn(2, h, N, d) for _ in range(3))
    table = torch.randn((2 * window - 1) ** 2, h) * 0.5
    fill = (torch.randn(h, d), torch.randn(h, d))

    def run(fn):
        def f(q, k, v, table, kf, vf):
            return fn(q, k, v, hw, window, shift, table, window, pad_mode, True, None, (kf, vf))
        return f

    compare_fn(run(window_attention), run(window_attention_ref), [q, k, v, table, *fill], dtype)


def test_gradcheck_tiny():
    hw, w, s = (3, 4), 2, 1
    q, k, v = (torch.randn(1, 1, 12, 2, dtype=torch.float64, requires_grad=True) for _ in range(3))
    table = torch.randn(9, 1, dtype=torch.float64, requires_grad=True)
    fn = lambda q, k, v, t: window_attention(q, k, v, hw, w, s, t)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v, table), fast_mode=True)


def _official_style_swin(m: WindowAttention, x: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """Swin as the official block computes it on a divisible map (slices for the mask, -100, official index)."""
    B, N, C = x.shape
    w, s, h = m.window_size, m.shift_size, m.num_heads
    xm = x.view(B, H, W, C)
    if s:
        xm = torch.roll(xm, (-s, -s), (1, 2))
    xw = window_partition(xm, w)
    qkv = m.qkv(xw).reshape(-1, w * w, 3, h, C // h).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0] * m.scale, qkv[1], qkv[2]
    attn = q @ k.transpose(-2, -1)
    coords = torch.stack(torch.meshgrid(torch.arange(w), torch.arange(w), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (w - 1)
    index = rel[..., 0] * (2 * w - 1) + rel[..., 1]
    attn = attn + m.relative_position_bias_table[index.view(-1)].view(w * w, w * w, -1).permute(2, 0, 1)[None]
    if s:
        img = torch.zeros(1, H, W, 1, dtype=x.dtype)
        cnt = 0
        for hs in (slice(0, -w), slice(-w, -s), slice(-s, None)):
            for ws in (slice(0, -w), slice(-w, -s), slice(-s, None)):
                img[:, hs, ws, :] = cnt
                cnt += 1
        mw = window_partition(img, w).view(-1, w * w)
        am = (mw[:, None, :] - mw[:, :, None]).ne(0).to(x.dtype) * -100.0
        nW = am.shape[0]
        attn = (attn.view(B, nW, h, w * w, w * w) + am[None, :, None]).view(-1, h, w * w, w * w)
    o = (attn.softmax(-1) @ v).transpose(1, 2).reshape(-1, w * w, C)
    o = window_reverse(m.proj(o), w, H, W)
    if s:
        o = torch.roll(o, (s, s), (1, 2))
    return o.reshape(B, N, C)


@pytest.mark.parametrize("hw,shift", [((8, 12), 2), ((12, 8), 0)])
def test_matches_official_swin_on_divisible_maps(hw, shift):
    m = WindowAttention(16, 2, 4, shift).double()
    x = torch.randn(2, hw[0] * hw[1], 16, dtype=torch.float64)
    assert_close(m(x, hw), _official_style_swin(m, x, *hw), torch.float64)


def test_mask_padding_equals_attention_on_cropped_windows():
    """No shift, pad_mode='mask': each (possibly cut) window attends over its real tokens only."""
    hw, w = (7, 9), 4
    m = WindowAttention(16, 2, w, 0).double()
    x = torch.randn(1, 63, 16, dtype=torch.float64)
    q, k, v = m._qkv(x)
    table_bias = m.relative_position_bias_table
    out = torch.zeros_like(q)
    for r0 in range(0, 7, w):
        for c0 in range(0, 9, w):
            rows = [(r, c) for r in range(r0, min(r0 + w, 7)) for c in range(c0, min(c0 + w, 9))]
            idx = torch.tensor([r * 9 + c for r, c in rows])
            pos = torch.tensor(rows)
            rel = pos[:, None] - pos[None, :] + (w - 1)
            bias = table_bias[rel[..., 0] * (2 * w - 1) + rel[..., 1]].permute(2, 0, 1)
            logits = (q[:, :, idx] * m.scale) @ k[:, :, idx].transpose(-2, -1) + bias
            out[:, :, idx] = logits.softmax(-1) @ v[:, :, idx]
    ref = m.proj(out.transpose(1, 2).reshape(1, 63, 16))
    assert_close(m(x, hw), ref, torch.float64)


def test_l2vit_zero_padding_vs_explicit_zero_pad():
    """pad_mode='zero' equals: zero-pad the (normalised) map, plain softmax per window, no mask, crop."""
    hw, w = (5, 11), 4
    m = WindowAttention(16, 2, w, 0, rel_pos_bias=False, pad_mode="zero").double()
    nn_bias = m.qkv.bias
    assert nn_bias is not None and m.relative_position_bias_table is None
    x = torch.randn(2, 55, 16, dtype=torch.float64)
    xm = F.pad(x.view(2, 5, 11, 16), (0, 0, 0, 1, 0, 3))  # (2, 8, 12, 16)
    wins = window_partition(xm, w)
    qkv = m.qkv(wins).reshape(-1, w * w, 3, 2, 8).permute(2, 0, 3, 1, 4)
    o = ((qkv[0] * m.scale) @ qkv[1].transpose(-2, -1)).softmax(-1) @ qkv[2]
    o = window_reverse(m.proj(o.transpose(1, 2).reshape(-1, w * w, 16)), w, 8, 12)[:, :5, :11].reshape(2, 55, 16)
    assert_close(m(x, hw), o, torch.float64)
    assert_close(m.forward_ref(x, hw), o, torch.float64)


def test_window_clipping_rules():
    m = WindowAttention(16, 2, 7, 3, input_size=(7, 7))
    assert (m.window_size, m.shift_size) == (7, 0)
    assert m.relative_position_bias_table.shape == (13 * 13, 2)
    small = WindowAttention(16, 2, 7, 3, input_size=(4, 6))
    assert (small.window_size, small.shift_size) == (4, 0)
    assert small.relative_position_bias_table.shape == (7 * 7, 2)
    assert window_geometry((5, 20), 7, 3).window == 5 and window_geometry((5, 20), 7, 3).shift == 0
    # L2ViT: no clipping, the map is padded up to the window.
    assert window_geometry((3, 5), 7, 0, clip=False).padded == (7, 7)


def test_runtime_clip_uses_central_table_offsets():
    """A w=7 module on a 4 x 9 map runs 4 x 4 windows with the central (7 x 7) offsets of its 13 x 13 table."""
    big = WindowAttention(16, 2, 7, 0).double()
    small = WindowAttention(16, 2, 4, 0).double()
    small.qkv.load_state_dict(big.qkv.state_dict())
    small.proj.load_state_dict(big.proj.state_dict())
    t = big.relative_position_bias_table.detach().view(13, 13, 2)[3:10, 3:10].reshape(49, 2)
    small.relative_position_bias_table.data.copy_(t)
    x = torch.randn(1, 36, 16, dtype=torch.float64)
    assert_close(big(x, (4, 9)), small(x, (4, 9)), torch.float64)
    assert relative_position_index(4, 7).max() < 169


def test_attention_matrix_reproduces_forward():
    m = WindowAttention(16, 2, 4, 2).double().eval()
    x = torch.randn(2, 63, 16, dtype=torch.float64)
    a = m.attention_matrix(x, (7, 9))
    assert a.shape == (2, 2, 63, 63)
    torch.testing.assert_close(a.sum(-1), torch.ones(2, 2, 63, dtype=torch.float64))
    _, _, v = m._qkv(x)
    y = m.proj((a @ v).transpose(1, 2).reshape(2, 63, 16))
    assert_close(m(x, (7, 9)), y, torch.float64)
    # Locality: no weight outside the own window (no shift here: 0..3 vs 4..8 in the first row).
    a0 = WindowAttention(16, 2, 4, 0).attention_matrix(torch.randn(1, 63, 16), (7, 9))
    assert (a0[0, :, 0, 4] == 0).all() and (a0[0, :, 0, 1] > 0).all()


def test_build_by_name_and_meta():
    m = subquad.build_attention("window", 32, 4, window_size=5, shift_size=2, device="meta")
    assert m.relative_position_bias_table.is_meta
    lwa = subquad.build_attention("window", 32, 4, rel_pos_bias=False, pad_mode="zero")
    assert {n for n, _ in lwa.named_parameters()} == {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"}


def test_bad_inputs():
    with pytest.raises(ValueError, match="num_heads"):
        WindowAttention(30, 4)
    with pytest.raises(ValueError, match="window_size"):
        WindowAttention(32, 4, window_size=0)
    with pytest.raises(ValueError, match="shift_size"):
        WindowAttention(32, 4, window_size=4, shift_size=4)
    with pytest.raises(ValueError, match="pad_mode"):
        WindowAttention(32, 4, pad_mode="reflect")
    m = WindowAttention(32, 4)
    with pytest.raises(ValueError, match="hw"):
        m(torch.randn(1, 35, 32), (6, 7))
    with pytest.raises(ValueError, match="hw"):
        m(torch.randn(1, 35, 32))


def test_bfloat16_autocast_close_to_fp64():
    m = WindowAttention(32, 4, 4, 2)
    x = torch.randn(2, 63, 32)
    ref = WindowAttention(32, 4, 4, 2).double()
    ref.load_state_dict(m.state_dict())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(x, (7, 9))
    assert_close(y, ref(x.double(), (7, 9)), torch.bfloat16)


def test_inference_mask_cache_follows_table_updates():
    m = WindowAttention(16, 2, 4, 2).double().eval()
    x = torch.randn(1, 63, 16, dtype=torch.float64)
    with torch.no_grad():
        m(x, (7, 9))
        m.relative_position_bias_table.add_(torch.randn_like(m.relative_position_bias_table))
        y = m(x, (7, 9))
        assert_close(y, m.forward_ref(x, (7, 9)), torch.float64)
        x2 = torch.randn(1, 20, 16, dtype=torch.float64)
        assert_close(m(x2, (4, 5)), m.forward_ref(x2, (4, 5)), torch.float64)
