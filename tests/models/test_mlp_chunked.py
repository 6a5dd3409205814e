"""The chunked inference path of the MLPs (subquad.layers.mlp) equals their plain forward."""

from __future__ import annotations

import pytest
import timm
import torch

import subquad
import subquad.layers.mlp as mlp_mod
from subquad.layers.mlp import ConvMlp, Mlp


@pytest.fixture
def small_chunks(monkeypatch):
    """Bands of a few tokens, so that small inputs take the chunked path (with a ragged last band)."""
    monkeypatch.setattr(mlp_mod, "CHUNK_ELEMS", 40)


def test_mlp_chunked_equals_plain_and_keeps_timm_keys(small_chunks):
    m = Mlp(6, 10, out_features=5).eval()
    ref = timm.layers.Mlp(6, 10, out_features=5).eval()
    ref.load_state_dict(m.state_dict())
    assert list(m.state_dict()) == list(ref.state_dict())
    x = torch.randn(2, 23, 6)
    want = ref(x)  # grad enabled: plain path
    with torch.no_grad():
        assert mlp_mod._chunked(2 * 23 * 10)
        got = m(x)
    torch.testing.assert_close(got, want.detach())
    assert got.shape == (2, 23, 5)


@pytest.mark.parametrize("hw", [(7, 5), (1, 9), (6, 6)])
def test_conv_mlp_bands_with_halo_equal_plain(small_chunks, hw):
    m = ConvMlp(4, 8).eval()
    with torch.no_grad():
        m.dwconv.dwconv.weight.normal_()
        m.dwconv.dwconv.bias.normal_()
    x = torch.randn(2, hw[0] * hw[1], 4)
    want = m(x, hw)  # grad enabled: plain path
    with torch.no_grad():
        assert mlp_mod._chunked(x.shape[0] * x.shape[1] * 8)  # the banded path runs below
        got = m(x, hw)
    torch.testing.assert_close(got, want.detach())


def test_plain_path_when_small_or_with_autograd():
    assert not mlp_mod._chunked(mlp_mod.CHUNK_ELEMS)  # one band's worth: plain
    with torch.no_grad():
        assert mlp_mod._chunked(3 * mlp_mod.CHUNK_ELEMS)
    assert not mlp_mod._chunked(3 * mlp_mod.CHUNK_ELEMS)  # autograd on


@pytest.mark.parametrize("name", ["flatten_pvt_v2_micro", "flatten_swin_micro", "l2vit_micro", "vil_ls_micro"])
def test_model_logits_unchanged_by_chunked_mlps(small_chunks, name):
    torch.manual_seed(0)
    m = subquad.create_model(name).eval()
    x = torch.randn(1, 3, 64, 48)
    want = m(x)
    with torch.no_grad():
        got = m(x)
    torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-5)


def test_gmacs_count_the_architecture_not_the_bands(monkeypatch):
    want = subquad.count_macs("flatten_pvt_v2_micro", 64)["gmacs"]
    monkeypatch.setattr(mlp_mod, "CHUNK_ELEMS", 40)  # banded ConvMlps would recompute halo rows
    assert subquad.count_macs("flatten_pvt_v2_micro", 64)["gmacs"] == want
    with mlp_mod.plain_mlps(), torch.no_grad():
        assert not mlp_mod._chunked(10 ** 9)
    with torch.no_grad():
        assert mlp_mod._chunked(10 ** 9)
