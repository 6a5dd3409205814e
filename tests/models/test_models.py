"""Registry-driven tests over every tiny `*_micro` model beyond timm's contract (test_contract.py): non-square
inputs, input errors, checkpoints, pruning."""

from __future__ import annotations

import pytest
import timm
import torch

import subquad

MICRO = subquad.list_models("*_micro")


def _size(name):
    return tuple(timm.models.get_pretrained_cfg(name).input_size)


def _input(name, b=2, hw=None):
    c, h, w = _size(name)
    return torch.randn(b, c, *(hw or (h, w)))


@pytest.mark.parametrize("name", MICRO)
def test_non_square_input(name):
    m = subquad.create_model(name).eval()
    c, h, w = _size(name)
    smallest = timm.models.get_pretrained_cfg(name).min_input_size[-1]  # every model refuses less (its stride)
    with torch.no_grad():
        out = m(_input(name, 1, (h + h // 2, max(w - w // 4, smallest))))
    assert out.shape == (1, m.num_classes) and torch.isfinite(out).all()


@pytest.mark.parametrize("name", MICRO)
def test_bad_channels_clear_error(name):
    m = subquad.create_model(name)
    c, h, w = _size(name)
    with pytest.raises(ValueError, match="channels"):
        m(torch.randn(1, c + 1, h, w))


def test_unknown_model_suggests():
    with pytest.raises(ValueError, match="vit_attn_tiny"):
        subquad.create_model("vit_attn_tinny")


def test_timm_sees_our_models():
    assert timm.is_model("vit_attn_micro")
    m = timm.create_model("vit_attn_micro")
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 1000)


def test_vit_host_loads_timm_deit_state_dict():
    """Key layout equals timm's DeiT: a timm DeiT's state dict loads strictly, and our host then computes the same
    logits (two blocks at 64 x 48 pixels: the position table is resampled as timm resamples it)."""
    kw = dict(depth=2, img_size=64, num_classes=5)
    theirs = timm.create_model("deit_tiny_patch16_224", dynamic_img_size=True, **kw).eval()
    with torch.no_grad():
        for p in theirs.parameters():  # no zero or constant tensor: every value matters
            p.add_(torch.randn_like(p) * 0.02)
    ours = subquad.create_model("vit_attn_tiny", **kw).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    sd_ours, sd_theirs = ours.state_dict(), theirs.state_dict()
    assert all(torch.equal(sd_ours[k], sd_theirs[k]) for k in sd_theirs)
    x = torch.randn(2, 3, 64, 48)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-4, atol=1e-5)


def test_checkpoint_roundtrip_and_wrong_arch(tmp_path):
    from subquad.engine.checkpoint import save_weights

    m = subquad.create_model("vit_attn_micro", num_classes=5)
    p = save_weights(m, tmp_path / "w.safetensors")
    m2 = subquad.create_model("vit_attn_micro", num_classes=5, checkpoint_path=str(p))
    for (k, a), (_, b) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert torch.equal(a, b), k
    with pytest.raises(ValueError, match="does not fit model"):
        subquad.create_model("vit_attn_micro", num_classes=5, embed_dim=32, checkpoint_path=str(p))


def test_malicious_pickle_refused(tmp_path):
    import pickle

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    p = tmp_path / "evil.pth"
    with open(p, "wb") as f:
        pickle.dump({"model": Evil()}, f)
    with pytest.raises(ValueError, match="refusing"):
        subquad.create_model("vit_attn_micro", checkpoint_path=str(p))
    assert not marker.exists()


@pytest.mark.parametrize("name", MICRO)
def test_features_only_out_indices_and_checkpoint(name, tmp_path):
    from subquad.engine.checkpoint import save_weights

    m = subquad.create_model(name).eval()
    p = save_weights(m, tmp_path / "w.safetensors")
    f = subquad.create_model(name, features_only=True, out_indices=(1,), checkpoint_path=str(p)).eval()
    x = _input(name, 1)
    out = f(x)
    assert len(out) == 1
    ref = m.forward_intermediates(x, indices=[1], intermediates_only=True)[0]
    torch.testing.assert_close(out[0], ref)


@pytest.mark.parametrize("name,kw", [("vit_attn_micro", {}),
                                     ("lisanet_i", dict(depth=4, embed_dim=64, num_heads=2, D=2))])
def test_isotropic_prune_keeps_taken_blocks(name, kw):
    """prune_intermediate_layers on isotropic hosts: blocks after the last taken index go, the head becomes an
    identity, the norm goes with prune_norm, and the kept intermediates are unchanged."""
    torch.manual_seed(0)
    m = subquad.create_model(name, **kw).eval()
    size = m.pretrained_cfg["input_size"][-1]
    x = torch.randn(1, 3, size, size)
    with torch.no_grad():
        want = m.forward_intermediates(x, indices=[1], intermediates_only=True)
        assert m.prune_intermediate_layers([1], prune_norm=True) == [1]
        assert len(m.blocks) == 2 and isinstance(m.norm, torch.nn.Identity)
        assert isinstance(m.get_classifier(), torch.nn.Identity)
        got = m.forward_intermediates(x, indices=[1], intermediates_only=True)
    torch.testing.assert_close(got, want)
