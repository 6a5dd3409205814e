"""Any input resolution: full models on the meta device (shapes through every pad/resize), tiny models for real.

Stage maps follow each family's rule: L2ViT pads (ceil), PVT v1 floors, PVTv2's padded convs give
floor((H - 1) / s) + 1; the ViT hosts pad to the patch. Real 1024 x 1024 runs of full models are `slow`.
"""

from __future__ import annotations

import pytest
import torch

import subquad

# 224 x 224 runs for every model in the card GMACs test (slow); here the non-square sizes of the issue.
SIZES = [(256, 320), (320, 192)]
FULL = ["l2vit_tiny", "flatten_pvt_tiny", "flatten_pvt_v2_b0", "flatten_deit_tiny"]
FULL_SLOW = ["l2vit_base_384", "flatten_pvt_v2_b1", "l2vit_deit_tiny"]
LINEAR = ["l2vit_tiny", "flatten_pvt_tiny", "flatten_pvt_v2_b0"]
PYRAMIDS = ["l2vit_micro", "flatten_pvt_micro", "flatten_pvt_v2_micro"]


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def expected_maps(name: str, h: int, w: int) -> list[tuple[int, int]]:
    """The official stage-grid rule of each family."""
    if name.startswith("l2vit"):
        s0 = 2 if name.endswith("micro") else 4
        g = [(_ceil(h, s0), _ceil(w, s0))]
        for _ in range(3):
            g.append((_ceil(g[-1][0], 2), _ceil(g[-1][1], 2)))
    elif name.startswith("flatten_pvt_v2"):
        s0 = 2 if name.endswith("micro") else 4
        g = [((h - 1) // s0 + 1, (w - 1) // s0 + 1)]
        for _ in range(3):
            g.append(((g[-1][0] - 1) // 2 + 1, (g[-1][1] - 1) // 2 + 1))
    else:
        s0 = 2 if name.endswith("micro") else 4
        g = [(h // s0, w // s0)]
        for _ in range(3):
            g.append((g[-1][0] // 2, g[-1][1] // 2))
    return g


def _any_size_on_meta(name, hw):
    m = subquad.create_model(name, device="meta").eval()
    x = torch.empty(1, 3, *hw, device="meta")
    out = m(x)
    assert out.shape == (1, 1000)
    if not name.startswith(("flatten_deit", "l2vit_deit")):
        maps = m.forward_intermediates(x, intermediates_only=True)
        assert [tuple(t.shape[-2:]) for t in maps] == expected_maps(name, *hw)
        assert [t.shape[1] for t in maps] == [f["num_chs"] for f in m.feature_info]


@pytest.mark.parametrize("name", FULL)
@pytest.mark.parametrize("hw", SIZES)
def test_full_models_any_size_on_meta(name, hw):
    _any_size_on_meta(name, hw)


@pytest.mark.slow
@pytest.mark.parametrize("name", FULL_SLOW)
@pytest.mark.parametrize("hw", [(224, 224), *SIZES])
def test_more_models_any_size_on_meta(name, hw):
    _any_size_on_meta(name, hw)


@pytest.mark.parametrize("name", LINEAR)
def test_linear_models_1024_on_meta(name):
    m = subquad.create_model(name, device="meta").eval()
    assert m(torch.empty(1, 3, 1024, 1024, device="meta")).shape == (1, 1000)


@pytest.mark.parametrize("name", PYRAMIDS)
@pytest.mark.parametrize("hw", [(40, 56), (17, 33)])
def test_micro_maps_and_strides(name, hw):
    m = subquad.create_model(name, num_classes=4).eval()
    x = torch.randn(2, 3, *hw)
    with torch.no_grad():
        final, maps = m.forward_intermediates(x)
        logits = m(x)
    assert logits.shape == (2, 4) and torch.isfinite(logits).all()
    assert [tuple(t.shape[-2:]) for t in maps] == expected_maps(name, *hw)
    assert [f["reduction"] for f in m.feature_info] == [2, 4, 8, 16]
    # The pooled final tokens are what the head sees.
    torch.testing.assert_close(m.forward_head(final), logits)


@pytest.mark.parametrize("name", PYRAMIDS)
def test_image_smaller_than_total_stride(name):
    m = subquad.create_model(name)
    with pytest.raises(ValueError, match=rf"{name}: image 12x40 is smaller than the model's total stride 16"):
        m(torch.randn(1, 3, 12, 40))


def test_full_model_small_image_error_names_stride():
    m = subquad.create_model("l2vit_tiny", device="meta")
    with pytest.raises(ValueError, match="total stride 32"):
        m(torch.empty(1, 3, 31, 224, device="meta"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["l2vit_tiny", "flatten_pvt_v2_b1", "flatten_pvt_tiny", "flatten_deit_tiny"])
def test_linear_models_1024_real(name):
    m = subquad.create_model(name).eval()
    with torch.no_grad():
        out = m(torch.randn(1, 3, 1024, 1024))
    assert out.shape == (1, 1000) and torch.isfinite(out).all()


@pytest.mark.slow
@pytest.mark.parametrize("name", FULL + FULL_SLOW)
def test_full_models_non_square_real(name):
    m = subquad.create_model(name).eval()
    with torch.no_grad():
        out = m(torch.randn(1, 3, 256, 320))
    assert out.shape == (1, 1000) and torch.isfinite(out).all()
