"""The helpers of subquad._shapes against their plain meaning: ceil_div, round_up, crop_index (traced sizes) and
split_packed_heads (the q/k/v head split)."""

from __future__ import annotations

import math

import torch

from subquad._shapes import ceil_div, crop_index, round_up, split_packed_heads


def test_ceil_div_and_round_up():
    for a in range(1, 40):
        for b in range(1, 12):
            assert ceil_div(a, b) == math.ceil(a / b)
            assert round_up(a, b) == math.ceil(a / b) * b
    assert round_up(13, 13) == 13


def test_crop_index_equals_the_slice():
    """Flattened padded map + crop_index == map[:H, :W] flattened, on odd, non-square sizes."""
    for (H, W), (Hp, Wp) in [((5, 7), (8, 9)), ((3, 10), (3, 14)), ((7, 2), (9, 2)), ((1, 1), (4, 5))]:
        x = torch.randn(2, Hp, Wp, 3)
        got = x.reshape(2, Hp * Wp, 3).index_select(1, crop_index((H, W), (Hp, Wp)))
        torch.testing.assert_close(got, x[:, :H, :W].reshape(2, H * W, 3), rtol=0, atol=0)


def test_split_packed_heads_equals_slicing_by_part_and_head():
    """(B, N, parts * h * d) -> parts tensors (B, h, N, d): part p, head i is channel block p * C + i * d (odd,
    unequal sizes)."""
    B, N, h, d = 2, 7, 3, 5
    C = h * d
    for parts in (2, 3):
        x = torch.randn(B, N, parts * C)
        got = split_packed_heads(x, parts, h)
        assert len(got) == parts
        for p, t in enumerate(got):
            want = torch.stack([x[:, :, p * C + i * d: p * C + (i + 1) * d] for i in range(h)], dim=1)
            torch.testing.assert_close(t, want, rtol=0, atol=0)
