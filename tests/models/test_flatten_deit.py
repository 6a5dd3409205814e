"""FLatten-DeiT / L2ViT-DeiT variants of the ViT host: per-block mechanisms, CLS rule, layout, resolution."""

from __future__ import annotations

import pytest
import timm
import torch

import subquad


def test_flatten_deit_every_block_focused_with_cls_slot():
    m = subquad.create_model("flatten_deit_tiny", device="meta")
    assert m.attn_names == ("focused_linear",) * 12
    for blk in m.blocks:
        a = blk.attn
        assert a.num_prefix_tokens == 1 and tuple(a.pe_hw) == (14, 14)
        assert tuple(a.positional_encoding.shape) == (1, 1 + 196, 192)
        assert tuple(a.dwc.weight.shape) == (64, 1, 5, 5)


def test_l2vit_deit_tiny_alternation():
    """L2ViT Tab. 11: blocks 2, 4, ..., 12 (1-based) enhanced linear, the others softmax."""
    m = subquad.create_model("l2vit_deit_tiny", device="meta")
    assert m.attn_names == ("softmax", "enhanced_linear") * 6


@pytest.mark.parametrize("name", ["flatten_deit_tiny", "l2vit_deit_tiny"])
def test_timm_deit_layout_except_mechanism_params(name):
    """Every DeiT-T key is present with its shape; the extra keys are the mechanisms' own parameters."""
    ours = {k: tuple(v.shape) for k, v in subquad.create_model(name, device="meta").state_dict().items()}
    deit = {k: tuple(v.shape) for k, v in timm.create_model("deit_tiny_patch16_224", device="meta")
            .state_dict().items()}
    assert all(ours.get(k) == s for k, s in deit.items())
    extra = {k.split(".")[-1] for k in set(ours) - set(deit)}
    assert extra == ({"scale", "positional_encoding", "weight", "bias"} if name.startswith("flatten")
                     else {"temperature"})


def test_cls_token_takes_part():
    """The class token is a key of the focused attention (patch outputs depend on it) and the head reads it."""
    m = subquad.create_model("flatten_deit_micro", num_classes=3).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        a, maps_a = m(x), m.forward_intermediates(x, intermediates_only=True)
        m.cls_token.add_(torch.randn_like(m.cls_token))
        b, maps_b = m(x), m.forward_intermediates(x, intermediates_only=True)
    assert not torch.allclose(a, b)
    assert not torch.allclose(maps_a[0], maps_b[0])


def test_timm_deit_weights_initialise_all_but_focused_params():
    from timm.models.vision_transformer import VisionTransformer

    # A timm ViT with the micro sizes (the DeiT layout), loaded into a FLatten-DeiT built at another size.
    deit = VisionTransformer(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=2, mlp_ratio=2.0,
                             num_classes=10)
    m = subquad.create_model("flatten_deit_micro", num_classes=10, img_size=48)
    from subquad.models.flatten_deit import remap_official

    res = m.load_state_dict(remap_official({"model": deit.state_dict()}, m), strict=False)
    assert not res.unexpected_keys
    assert {k.split(".")[-1] for k in res.missing_keys} <= {"scale", "positional_encoding", "weight", "bias"}
    assert all(".attn." in k for k in res.missing_keys)
    torch.testing.assert_close(m.blocks[0].mlp.fc1.weight, deit.blocks[0].mlp.fc1.weight)
    assert m.pos_embed.shape == (1, 1 + 144, 64)


@pytest.mark.parametrize("hw", [(32, 48), (24, 40)])
def test_micro_any_size(hw):
    m = subquad.create_model("flatten_deit_micro", num_classes=5).eval()
    with torch.no_grad():
        out = m(torch.randn(1, 3, *hw))
        maps = m.forward_intermediates(torch.randn(1, 3, *hw), intermediates_only=True)
    assert out.shape == (1, 5) and torch.isfinite(out).all()
    assert all(t.shape[-2:] == (hw[0] // 4, hw[1] // 4) for t in maps)


def test_image_smaller_than_patch():
    m = subquad.create_model("flatten_deit_micro")
    with pytest.raises(ValueError, match="flatten_deit_micro: image 3x32 is smaller than the model's total stride 4"):
        m(torch.randn(1, 3, 3, 32))
