"""LiSANet / HyLiSANet: isotropic variant, video variants, 2-D -> 3-D inflation, errors (unofficial configs)."""

from __future__ import annotations

import pytest
import timm
import torch

import subquad
from subquad.models.lisanet import _HYBRID, _MICRO, inflate_image_weights
from tests._tol import assert_close

_VIDEO_MICRO = dict(_MICRO, stage_types=_HYBRID, num_frames=4)


def _isotropic_small(**kw):
    return subquad.create_model("lisanet_i", img_size=32, patch_size=8, embed_dim=32, depth=4, num_heads=2, D=2,
                                **kw)


def test_isotropic_forward_backward_features():
    m = _isotropic_small(num_classes=5)
    assert tuple(m.blocks[0].attn.kernel_a.shape) == (32, 2, 4, 4)
    x = torch.randn(2, 3, 32, 40)  # 4 x 5 tokens: kernels resampled from 4 x 4
    out = m(x)
    assert out.shape == (2, 5) and torch.isfinite(out).all()
    out.logsumexp(-1).mean().backward()
    assert all(p.grad is not None for p in m.parameters())
    m.eval()
    final, inter = m.forward_intermediates(x)
    assert len(inter) == 4 and all(t.shape == (2, 32, 4, 5) for t in inter)
    feats = timm.create_model("lisanet_i", features_only=True, img_size=32, patch_size=8, embed_dim=32, depth=4,
                              num_heads=2, D=2).eval()(x)
    assert len(feats) == 4 and all(f.dim() == 4 for f in feats)
    ref = m(x)
    m.set_grad_checkpointing(True)
    torch.testing.assert_close(m(x), ref)


def test_video_model_shapes_and_intermediates():
    m = subquad.create_model("hylisanet_s_video", num_classes=3, **_VIDEO_MICRO)
    x = torch.randn(2, 3, 4, 64, 48)
    out = m(x)
    assert out.shape == (2, 3) and torch.isfinite(out).all()
    out.sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    inter = m.forward_intermediates(x, intermediates_only=True)
    assert [tuple(t.shape) for t in inter] == [(2, 16, 2, 16, 12), (2, 32, 2, 8, 6), (2, 48, 2, 4, 3),
                                               (2, 64, 2, 2, 2)]
    # 3-D LiSA kernels (C, D, T0, H0, W0) with T0 = num_frames / 2.
    assert tuple(m.stages[2].blocks[0].attn.kernel_a.shape) == (48, 2, 2, 4, 4)


@pytest.mark.parametrize("mode", ["center", "average"])
def test_inflation_loads_strict(mode):
    img = subquad.create_model("hylisanet_micro")
    vid = subquad.create_model("hylisanet_s_video", **_VIDEO_MICRO)
    vid.load_state_dict(inflate_image_weights(img.state_dict(), vid, mode), strict=True)


def test_center_inflation_is_framewise_image_model():
    """Exact property (eval mode): with 'center' inflation, for ANY clip x (B, 3, T, H, W) and every stage s and
    temporal token t, video.forward_intermediates(x)[s][:, :, t] == image.forward_intermediates(x[:, :, 2t])[s]
    (the stem's temporal stride 2 takes the centre frame 2t of its window; every later op is frame-wise), and the
    video logits equal the mean over t of the image logits of frames 2t. A clip of identical frames therefore
    gives exactly the image model's features (replicated over t) and logits."""
    img = subquad.create_model("hylisanet_micro", num_classes=5).eval()
    vid = subquad.create_model("hylisanet_s_video", num_classes=5, **_VIDEO_MICRO).eval()
    # Non-trivial BN statistics, so the BN inflation is exercised.
    for mod in img.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 1.5)
    vid.load_state_dict(inflate_image_weights(img.state_dict(), vid, "center"))
    x = torch.randn(2, 3, 4, 64, 64)
    with torch.no_grad():
        v_inter = vid.forward_intermediates(x, intermediates_only=True)
        frames = [img.forward_intermediates(x[:, :, 2 * t], intermediates_only=True) for t in range(2)]
        for s in range(4):
            for t in range(2):
                assert_close(v_inter[s][:, :, t], frames[t][s], torch.float32, f"stage {s} frame {t}")
        assert_close(vid(x), (img(x[:, :, 0]) + img(x[:, :, 2])) / 2, torch.float32, "logits")
        same = x[:, :, :1].expand(-1, -1, 4, -1, -1)
        assert_close(vid(same), img(x[:, :, 0]), torch.float32, "identical frames")


def test_bad_inputs_clear_errors():
    img = subquad.create_model("lisanet_micro")
    with pytest.raises(ValueError, match=r"expected images \(B, C, H, W\).*video"):
        img(torch.randn(1, 3, 4, 64, 64))
    vid = subquad.create_model("hylisanet_s_video", **_VIDEO_MICRO).eval()
    with pytest.raises(ValueError, match=r"expected video clips \(B, C, T, H, W\)"):
        vid(torch.randn(1, 3, 64))
    # an image is a one-frame clip (timm's model tests feed images to every model)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(vid(x), vid(x[:, :, None]))
    with pytest.raises(ValueError, match="D .*>= 1, got 0"):
        subquad.create_model("lisanet_micro", D=0)
    with pytest.raises(ValueError, match="stage type"):
        subquad.create_model("lisanet_micro", stage_types=("lisa", "lisa", "mlp", "lisa"))
    block = img.stages[0].blocks[0]
    with pytest.raises(ValueError, match="makes 12 tokens but x has N=16"):
        block.attn(torch.randn(1, 16, 16), (3, 4))


def test_cards_are_unofficial_and_sized():
    from subquad.models import CARDS

    for name in ("lisanet_i", "lisanet_s", "lisanet_b", "hylisanet_s", "hylisanet_b", "hylisanet_s_video",
                 "hylisanet_b_video"):
        card = CARDS[name]
        assert card.status == "unofficial" and "unofficial" in card.notes and card.ref_params
        assert "unofficial" in timm.models.get_pretrained_cfg(name).notes
    # Exact counts of our definition (the cards' ref_params; the configuration is ours, docs/deviations.md).
    assert CARDS["hylisanet_s"].ref_params == 26_458_344 and CARDS["lisanet_i"].ref_params == 36_956_008
    assert CARDS["hylisanet_b"].top1 == 85.0


def test_checkpoint_at_another_size_resizes_kernels(tmp_path):
    """A checkpoint made at 64 px loads strictly into the model built at 96 px (kernels 'pad'-resized at load), and
    that model equals the 64-px model run at 96 px (which resizes its kernels at run time by the same rule)."""
    from subquad.engine.checkpoint import save_weights

    m64 = subquad.create_model("lisanet_micro", num_classes=4).eval()
    path = save_weights(m64, tmp_path / "m64.safetensors")
    m96 = subquad.create_model("lisanet_micro", num_classes=4, img_size=96, checkpoint_path=str(path)).eval()
    assert tuple(m96.stages[0].blocks[0].attn.kernel_a.shape[-2:]) == (24, 24)
    x = torch.randn(1, 3, 96, 96)
    with torch.no_grad():
        assert_close(m96(x), m64(x), torch.float32, "96-px model vs 64-px model at 96 px")


def test_video_model_gives_image_shaped_maps_for_an_image():
    """timm's image contract for the video models (its test_model_default_cfgs feeds the cfg's image size): an image
    (a one-frame clip) gives (B, C, H', W') features and intermediates, H' x W' = the cfg's pool_size, equal to the
    clip's maps at its single temporal position; clips keep (B, C, T', H', W')."""
    vid = subquad.create_model("hylisanet_s_video", **_VIDEO_MICRO).eval()
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        feats, clip = vid.forward_features(x), vid.forward_features(x[:, :, None])
        assert feats.shape == (1, 64, 2, 3) and clip.shape == (1, 64, 1, 2, 3)
        assert torch.equal(feats, clip[:, :, 0])
        final, inter = vid.forward_intermediates(x)
        assert torch.equal(final, feats) and [t.dim() for t in inter] == [4] * 4
        assert [t.dim() for t in vid.forward_intermediates(x, intermediates_only=True)] == [4] * 4
        vid.reset_classifier(0, "")
        assert vid(x).shape == feats.shape
    for name in ("hylisanet_s_video", "hylisanet_b_video"):
        cfg = timm.create_model(name, pretrained=False, device="meta").pretrained_cfg
        assert tuple(cfg["pool_size"]) == (7, 7) and tuple(cfg["input_size"]) == (3, 224, 224)


# LiSA Tab. 3(b) softmax rungs in the LiSANet hosts: SA without RPE is the 'softmax' mechanism; SA with RPE is the
# 'window' mechanism with one window covering the token grid (Swin's relative position bias table, padded keys
# masked, no clipping), i.e. global softmax attention plus a learned bias per head and 2-D offset.
def _sa_rpe(side: int) -> dict:
    return dict(attn="window", attn_kwargs=dict(window_size=side, clip_window=False))


@pytest.mark.parametrize("rpe", [False, True], ids=["sa", "sa_rpe"])
def test_tab3b_softmax_rungs_in_the_lisanet_hosts(rpe):
    """Both rungs build in the isotropic and the hierarchical host (one window covers the largest grid: 4 x 5
    tokens, resp. 16 x 12 in stage 1) and train at a non-square size."""
    iso = _isotropic_small(num_classes=3, **(_sa_rpe(5) if rpe else dict(attn="softmax")))
    hier = subquad.create_model("lisanet_micro", num_classes=3, **(_sa_rpe(16) if rpe else dict(attn="softmax")))
    want = "WindowAttention" if rpe else "MultiHeadAttention"
    for m, x in ((iso, torch.randn(2, 3, 32, 40)), (hier, torch.randn(2, 3, 64, 48))):
        blocks = list(m.blocks) if hasattr(m, "blocks") else [b for s in m.stages for b in s.blocks]
        assert all(type(b.attn).__name__ == want for b in blocks)
        if rpe:
            assert all(b.attn.relative_position_bias_table is not None and b.attn.shift_size == 0 for b in blocks)
        assert not any(k.endswith(("kernel_a", "kernel_b")) for k in m.state_dict())
        out = m(x)
        assert out.shape == (2, 3) and torch.isfinite(out).all()
        out.logsumexp(-1).mean().backward()
        for n, p in m.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), n


def test_tab3b_sa_rpe_is_global_softmax_plus_a_relative_bias():
    """The SA-with-RPE rung, explicitly: on a 4 x 5 grid inside one 5 x 5 window every query attends to every real
    token with softmax(q k^T / sqrt(d) + b_h[dy, dx]), b_h read from the table at the 2-D offset; with a zero table it
    is the 'softmax' mechanism with the same weights."""
    torch.manual_seed(0)
    C, h, (H, W), w = 16, 2, (4, 5), 5
    rpe = subquad.build_attention("window", C, h, **_sa_rpe(w)["attn_kwargs"], input_size=(H, W)).double()
    with torch.no_grad():
        rpe.relative_position_bias_table.normal_()
    x = torch.randn(2, H * W, C, dtype=torch.float64)
    q, k, _ = rpe.qkv(x).view(2, H * W, 3, h, C // h).permute(2, 0, 3, 1, 4)
    ys, xs = torch.arange(H).repeat_interleave(W), torch.arange(W).repeat(H)
    idx = (ys[:, None] - ys[None, :] + w - 1) * (2 * w - 1) + (xs[:, None] - xs[None, :] + w - 1)
    bias = rpe.relative_position_bias_table[idx].permute(2, 0, 1)  # (h, N, N)
    expect = (q @ k.transpose(-2, -1) * (C // h) ** -0.5 + bias).softmax(-1)
    assert_close(rpe.attention_matrix(x, (H, W)), expect, torch.float64, "SA + RPE probabilities")
    sa = subquad.build_attention("softmax", C, h).double()
    sa.load_state_dict({k: v for k, v in rpe.state_dict().items() if not k.startswith("relative_position")})
    with torch.no_grad():
        rpe.relative_position_bias_table.zero_()
        assert_close(rpe(x, (H, W)), sa(x), torch.float64, "SA + zero RPE vs SA")
