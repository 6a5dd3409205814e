from __future__ import annotations

import pytest
import torch

import subquad
from subquad.bench.flops import count_module_macs


@pytest.mark.parametrize("name,ref", [("deit_tiny_patch16_224", 1.25), ("swin_tiny_patch4_window7_224", 4.49)])
def test_timm_baselines(name, ref):
    g = subquad.count_macs(name, 224)["gmacs"]
    assert abs(g - ref) / ref < 0.01, f"{name}: {g:.4f} GMACs, expected {ref}"


def test_fft_and_complex_mul_counted():
    class M(torch.nn.Module):
        def forward(self, x):
            f = torch.fft.rfft2(x)
            return torch.fft.irfft2(f * f, s=x.shape[-2:])

    r = count_module_macs(M(), torch.empty(2, 8, 16, 16, device="meta"))
    n = 256
    fft = 2.5 * n * 8 * 16  # per direction: 2.5 n log2 n per transform, 16 transforms
    cmul = 6 * 16 * 16 * 9
    assert r["gmacs"] * 2e9 == pytest.approx(2 * fft + cmul)


def test_cpu_sdpa_counted_on_real_tensors():
    m = subquad.build_attention("softmax", 64, 2)
    real = count_module_macs(m, torch.randn(1, 100, 64))["gmacs"]
    meta = count_module_macs(m.to("meta"), torch.empty(1, 100, 64, device="meta"))["gmacs"]
    assert real == pytest.approx(meta)
    assert real * 1e9 == pytest.approx(100 * 64 * 64 * 4 + 2 * 100 * 100 * 64)


def test_video_models_counted_on_clips():
    """A video model is counted on a clip (B, C, T, H, W): more work than its image twin on one frame."""
    image = subquad.count_macs("hylisanet_s", 64)["gmacs"]
    video = subquad.count_macs("hylisanet_s_video", 64)["gmacs"]
    assert video > 4 * image


def test_timm_models_are_counted_at_the_size_asked():
    """A timm model whose input size is fixed at construction (ViT position tables) is built at the size asked:
    count_macs('deit_tiny_patch16_224', (32, 48)) used to fail inside timm ("Input height (32) doesn't match model
    (224)"). It equals the count of the model built at that size by hand; a model that takes no img_size (PVTv2) is
    built as it is."""
    import timm

    got = subquad.count_macs("deit_tiny_patch16_224", (32, 48))
    own = timm.create_model("deit_tiny_patch16_224", img_size=(32, 48), device="meta")
    want = subquad.count_macs(own, (32, 48))
    assert got == want and got["img_size"] == (32, 48)
    assert got["gmacs"] < subquad.count_macs("deit_tiny_patch16_224", 224)["gmacs"]
    assert subquad.count_macs("pvt_v2_b0", (64, 96))["gmacs"] > 0
