from __future__ import annotations

import pytest
import torch

from subquad.attention.functional.softmax import softmax_attention, softmax_attention_ref
from subquad.attention.softmax import MultiHeadAttention
from tests._tol import assert_close, compare_fn, compare_module


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_sdpa_matches_reference(dtype):
    q, k, v = torch.randn(2, 3, 13, 8), torch.randn(2, 3, 11, 8), torch.randn(2, 3, 11, 8)
    compare_fn(softmax_attention, softmax_attention_ref, [q, k, v], dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_masked_rows_zero_never_nan(dtype):
    q, k, v = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 6, 4), torch.randn(2, 2, 6, 4)
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[0, ..., 3:] = False
    mask[1] = False  # every key masked

    def fast(q, k, v):
        return softmax_attention(q, k, v, mask=mask)

    def ref(q, k, v):
        return softmax_attention_ref(q, k, v, mask=mask)

    compare_fn(fast, ref, [q, k, v], dtype)
    assert (softmax_attention(q, k, v, mask=mask)[1] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_module_fast_vs_ref_with_mask(dtype):
    m = MultiHeadAttention(24, 3)
    x = torch.randn(2, 35, 24)
    mask = torch.rand(2, 35) > 0.3
    compare_module(m, lambda mm, x: mm(x, (5, 7), mask), lambda mm, x: mm.forward_ref(x, (5, 7), mask), [x], dtype)


def test_attention_matrix_rows_sum_to_one():
    m = MultiHeadAttention(16, 2)
    a = m.attention_matrix(torch.randn(1, 9, 16))
    assert a.shape == (1, 2, 9, 9)
    torch.testing.assert_close(a.sum(-1), torch.ones(1, 2, 9))


def test_gradcheck_tiny():
    q, k, v = (torch.randn(1, 1, 4, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(softmax_attention, (q, k, v))


def test_bad_mask_shape():
    m = MultiHeadAttention(16, 2)
    with pytest.raises(ValueError, match="mask"):
        m(torch.randn(2, 9, 16), mask=torch.ones(2, 8, dtype=torch.bool))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_causal_fast_vs_ref_and_no_leak(dtype):
    m = MultiHeadAttention(16, 2, causal=True)
    x = torch.randn(2, 11, 16)
    compare_module(m, lambda mm, x: mm(x), lambda mm, x: mm.forward_ref(x), [x], dtype)
    y = m(x)
    x2 = x.clone()
    x2[:, 6] += 1.0
    y2 = m(x2)
    assert torch.equal(y[:, :6], y2[:, :6]) and not torch.allclose(y[:, 6:], y2[:, 6:])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("with_mask", [False, True])
def test_bias_path_vs_reference(dtype, with_mask):
    """Float bias (learnable, e.g. relative position bias) merged with a bool mask, including an empty row."""
    q, k, v = torch.randn(2, 2, 5, 4), torch.randn(2, 2, 6, 4), torch.randn(2, 2, 6, 4)
    bias = torch.randn(2, 5, 6)
    mask = None
    if with_mask:
        mask = torch.ones(2, 1, 5, 6, dtype=torch.bool)
        mask[0, :, :, 4:] = False
        mask[1, :, 2] = False  # query row 2 of sample 1 sees no key

    def fast(q, k, v, b):
        return softmax_attention(q, k, v, mask=mask, bias=b)

    def ref(q, k, v, b):
        return softmax_attention_ref(q, k, v, mask=mask, bias=b)

    compare_fn(fast, ref, [q, k, v, bias], dtype)


def test_spatial_reduction_caps_refuse_masks():
    from subquad.attention import Request, check

    m = MultiHeadAttention(32, 2, sr_ratio=2)
    assert check(m.caps, Request(mask=True)) and check(m.caps, Request(causal=True))
    assert m.caps.needs_hw and not MultiHeadAttention.caps.needs_hw


def test_fractional_hw_refused():
    from subquad._shapes import as_hw

    with pytest.raises(ValueError, match="whole numbers"):
        as_hw((5.5, 7))
    with pytest.raises(ValueError, match="whole numbers"):
        as_hw(True)


@pytest.mark.parametrize("mask_kind", ["float", "bool"])
def test_sdpa_lower_rank_mask_takes_the_fused_kernel(mask_kind):
    """A mask of lower rank than q (agent attention's (h, A, N) bias) broadcasts as before; with it and a q strided
    in its last dim, SDPA without autograd reaches torch's fused CPU kernel, not its unfused math path. Outputs equal
    the float64 reference on 7 queries x 9 keys, and so does every gradient where autograd runs (the float bias's
    too: torch takes the math path for a mask that requires grad)."""
    from torch.profiler import profile

    from subquad.attention.functional.softmax import sdpa

    g = torch.Generator().manual_seed(3)
    # q strided in its last dim (agent attention's pooled agent tokens at some sizes).
    q = torch.randn(2, 3, 4, 7, generator=g).transpose(-1, -2)
    k, v = torch.randn(2, 3, 9, 4, generator=g), torch.randn(2, 3, 9, 4, generator=g)
    mask = torch.randn(3, 7, 9, generator=g) if mask_kind == "float" else torch.rand(3, 7, 9, generator=g) > 0.3
    if mask_kind == "bool":
        mask[..., 0] = True  # every query keeps a key (the fused kernel and the reference differ on empty rows)

    def ref(q, k, v, *m):
        logits = q @ k.transpose(-1, -2) / 2.0
        bias = m[0] if m else mask
        logits = logits + bias if bias.dtype != torch.bool else logits.masked_fill(~bias, float("-inf"))
        return logits.softmax(-1) @ v

    with torch.no_grad(), profile() as p:
        out = sdpa(q, k, v, attn_mask=mask)
    keys = {e.key for e in p.key_averages()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in keys
    assert "aten::_scaled_dot_product_attention_math" not in keys
    assert_close(out, ref(q.double(), k.double(), v.double(), *([mask.double()] if mask_kind == "float" else [])),
                 torch.float32, "no-grad output")
    inputs = [q, k, v] + ([mask] if mask_kind == "float" else [])
    compare_fn(lambda q, k, v, *m: sdpa(q, k, v, attn_mask=m[0] if m else mask), ref, inputs, torch.float32)
