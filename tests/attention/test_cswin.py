"""CSwin stripe attention with LePE: fast path vs dense reference, official-style check, padding semantics."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import subquad
from subquad.attention.cswin import CSWinAttention, LePEAttention
from subquad.attention.functional.cswin import cswin_attention, cswin_attention_gathered, cswin_attention_ref
from tests._tol import assert_close, compare_fn, compare_module


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("hw,stripe", [((7, 9), (7, 4)), ((13, 5), (4, 5)), ((5, 6), (5, 6)), ((6, 8), (2, 8))])
def test_functional_fast_vs_reference(hw, stripe, dtype):
    h, d = 2, 3
    N = hw[0] * hw[1]
    q, k, v = (torch.randn(2, h, N, d) for _ in range(3))
    w, b = torch.randn(h * d, 1, 3, 3) * 0.3, torch.randn(h * d)

    def run(fn):
        return lambda q, k, v, w, b: fn(q, k, v, hw, stripe, w, b)

    compare_fn(run(cswin_attention), run(cswin_attention_ref), [q, k, v, w, b], dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("hw,kw", [((7, 9), dict(split_size=2)), ((9, 4), dict(split_size=3)),
                                   ((5, 7), dict(last_stage=True))])
def test_module_fast_vs_reference(hw, kw, dtype):
    m = CSWinAttention(24, 4, **kw)
    x = torch.randn(2, hw[0] * hw[1], 24)
    compare_module(m, lambda mm, x: mm(x, hw), lambda mm, x: mm.forward_ref(x, hw), [x], dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("hw,stripe", [((7, 9), (7, 4)), ((13, 5), (4, 5)), ((5, 6), (5, 6)), ((6, 8), (2, 8)),
                                       ((3, 10), (3, 7)), ((9, 2), (4, 2))])
def test_gathered_form_vs_reference(hw, stripe, dtype):
    """The gather form (what a dynamic-size export traces): padded stripes, LePE on the whole map with the
    cross-stripe taps removed; outputs and all gradients against the dense reference."""
    h, d = 2, 3
    N = hw[0] * hw[1]
    q, k, v = (torch.randn(2, h, N, d) for _ in range(3))
    w, b = torch.randn(h * d, 1, 3, 3) * 0.3, torch.randn(h * d)

    def gathered(q, k, v, w, b):
        B = q.shape[0]
        qkv = torch.stack([q, k, v], dim=2).view(B, h, 3, *hw, d).permute(0, 3, 4, 2, 1, 5)
        return cswin_attention_gathered(qkv, stripe, w, b).reshape(B, N, h, d).transpose(1, 2)

    compare_fn(gathered, lambda q, k, v, w, b: cswin_attention_ref(q, k, v, hw, stripe, w, b), [q, k, v, w, b],
               dtype)


@pytest.mark.parametrize("form", ["packed", "gathered"])
@pytest.mark.parametrize("hw,stripe", [((7, 9), (7, 4)), ((13, 5), (4, 5)), ((3, 10), (3, 7))])
def test_exported_form_masks_by_addition(form, hw, stripe, monkeypatch):
    """In an exported program the padded stripes' mask is additive (0 / -inf; ONNX's bool-mask attention zeroes NaN
    rows with a Where over every probability): SDPA gets a float mask, and outputs and all gradients still match
    the dense reference on padded maps."""
    import subquad.attention.functional.cswin as fc

    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    seen = []
    real = fc.sdpa
    monkeypatch.setattr(fc, "sdpa", lambda *a, attn_mask=None, **k: seen.append(attn_mask.dtype) or real(
        *a, attn_mask=attn_mask, **k))
    h, d = 2, 3
    N = hw[0] * hw[1]
    q, k, v = (torch.randn(2, h, N, d) for _ in range(3))
    w, b = torch.randn(h * d, 1, 3, 3) * 0.3, torch.randn(h * d)
    fn = fc.cswin_attention_packed if form == "packed" else cswin_attention_gathered

    def run(q, k, v, w, b):
        B = q.shape[0]
        qkv = torch.stack([q, k, v], dim=2).view(B, h, 3, *hw, d).permute(0, 3, 4, 2, 1, 5)
        return fn(qkv, stripe, w, b).reshape(B, N, h, d).transpose(1, 2)

    compare_fn(run, lambda q, k, v, w, b: cswin_attention_ref(q, k, v, hw, stripe, w, b), [q, k, v, w, b],
               torch.float64)
    assert seen and set(seen) == {torch.float64}, seen


def test_export_mask_is_additive_only_while_exporting(monkeypatch):
    from subquad.attention.functional.softmax import export_mask

    m = torch.tensor([[True, False], [True, True]])
    assert export_mask(m, torch.float32) is m
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    got = export_mask(m, torch.float32)
    assert got.dtype == torch.float32 and got.tolist() == [[0.0, float("-inf")], [0.0, 0.0]]
    f = torch.zeros(2, 2)
    assert export_mask(f, torch.float32) is f  # a float mask is already additive


def test_gradcheck_tiny():
    hw, stripe = (2, 3), (2, 2)
    q, k, v = (torch.randn(1, 1, 6, 2, dtype=torch.float64, requires_grad=True) for _ in range(3))
    w = torch.randn(2, 1, 3, 3, dtype=torch.float64, requires_grad=True)
    fn = lambda q, k, v, w: cswin_attention(q, k, v, hw, stripe, w, None)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v, w), fast_mode=True)


def _official_branch(br: LePEAttention, q, k, v, res: int):
    """The official LePEAttention.forward on a square res x res map (img2windows / get_lepe / windows2img)."""
    B, L, C = q.shape
    hsp, wsp = (res, br.split_size) if br.idx == 0 else ((br.split_size, res) if br.idx == 1 else (res, res))
    nh = br.num_heads

    def img2win(t):
        t = t.transpose(-2, -1).reshape(B, C, res, res).view(B, C, res // hsp, hsp, res // wsp, wsp)
        return t.permute(0, 2, 4, 3, 5, 1).reshape(-1, hsp * wsp, C)

    qs = img2win(q).reshape(-1, hsp * wsp, nh, C // nh).permute(0, 2, 1, 3)
    ks = img2win(k).reshape(-1, hsp * wsp, nh, C // nh).permute(0, 2, 1, 3)
    vm = v.transpose(-2, -1).reshape(B, C, res, res).view(B, C, res // hsp, hsp, res // wsp, wsp)
    vm = vm.permute(0, 2, 4, 1, 3, 5).reshape(-1, C, hsp, wsp)
    lepe = br.get_v(vm).reshape(-1, nh, C // nh, hsp * wsp).permute(0, 1, 3, 2)
    vs = vm.reshape(-1, nh, C // nh, hsp * wsp).permute(0, 1, 3, 2)
    attn = ((qs * br.scale) @ ks.transpose(-2, -1)).softmax(-1)
    x = ((attn @ vs) + lepe).transpose(1, 2).reshape(-1, hsp * wsp, C)
    x = x.view(B, res // hsp, res // wsp, hsp, wsp, C).permute(0, 1, 3, 2, 4, 5).reshape(B, res * res, C)
    return x


@pytest.mark.parametrize("idx", [0, 1, -1])
def test_matches_official_branch_on_square_divisible_map(idx):
    br = LePEAttention(8, 2, idx, split_size=2).double()
    q, k, v = (torch.randn(2, 36, 8, dtype=torch.float64) for _ in range(3))
    assert_close(br(q, k, v, (6, 6)), _official_branch(br, q, k, v, 6), torch.float64)


def test_padding_equals_cut_stripes():
    """Non-divisible map: each real token sees exactly its cut stripe (attention and LePE with zero padding)."""
    br = LePEAttention(8, 2, 0, split_size=3).double()
    H, W = 5, 7
    q, k, v = (torch.randn(1, H * W, 8, dtype=torch.float64) for _ in range(3))
    got = br(q, k, v, (H, W)).view(1, H, W, 8)
    for c0 in range(0, W, 3):
        cols = list(range(c0, min(c0 + 3, W)))
        sub = [t.view(1, H, W, 8)[:, :, cols].reshape(1, -1, 8) for t in (q, k, v)]
        qs, ks, vs = (t.view(1, -1, 2, 4).transpose(1, 2) for t in sub)
        o = ((qs * br.scale) @ ks.transpose(-2, -1)).softmax(-1) @ vs
        vmap = sub[2].transpose(1, 2).reshape(1, 8, H, len(cols))
        lepe = F.conv2d(vmap, br.get_v.weight, br.get_v.bias, padding=1, groups=8).flatten(2).transpose(1, 2)
        want = o.transpose(1, 2).reshape(1, -1, 8) + lepe
        assert_close(got[:, :, cols].reshape(1, -1, 8), want, torch.float64)


def test_key_layout_and_branches():
    m = subquad.build_attention("cswin", 32, 4, split_size=7)
    assert len(m.attns) == 2 and m.attns[0].dim == 16 and m.attns[1].idx == 1
    assert {n.split(".weight")[0].split(".bias")[0] for n in m.state_dict()} == {"qkv", "proj", "attns.0.get_v",
                                                                                "attns.1.get_v"}
    assert len(CSWinAttention(32, 4, split_size=7, input_size=(7, 7)).attns) == 1
    assert len(CSWinAttention(24, 3, last_stage=True).attns) == 1
    a = m.attention_matrix(torch.randn(1, 35, 32), (5, 7))
    assert a.shape == (1, 4, 35, 35)
    torch.testing.assert_close(a.sum(-1), torch.ones(1, 4, 35))


def test_bad_inputs():
    with pytest.raises(ValueError, match="num_heads"):
        CSWinAttention(30, 4)
    with pytest.raises(ValueError, match="num_heads"):
        CSWinAttention(24, 3)
    with pytest.raises(ValueError, match="split_size"):
        CSWinAttention(24, 2, split_size=0)
    with pytest.raises(ValueError, match="idx"):
        LePEAttention(8, 2, idx=2)
    with pytest.raises(ValueError, match="hw"):
        CSWinAttention(24, 2)(torch.randn(1, 35, 24), (6, 7))
