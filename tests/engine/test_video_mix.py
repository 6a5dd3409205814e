"""Mixup/CutMix on clips: one spatial box per clip (every frame alike), never a box over time; image-only
augmentations are refused for video data."""

from __future__ import annotations

import pytest
import torch
from timm.data import Mixup

from subquad.engine.classify import _refuse_image_only_aug, mix_batch
from subquad.errors import UserError
from subquad_cli.runconfig import TrainConfig


def test_cutmix_on_clips_boxes_space_not_time():
    torch.manual_seed(0)
    B, C, T, H, W = 4, 3, 5, 16, 12
    x = torch.arange(B, dtype=torch.float32).view(B, 1, 1, 1, 1).expand(B, C, T, H, W).clone()
    cut = Mixup(mixup_alpha=0.0, cutmix_alpha=1.0, prob=1.0, num_classes=4, label_smoothing=0.0)
    out, y = mix_batch(cut, x.clone(), torch.arange(B))
    assert out.shape == (B, C, T, H, W) and y.shape == (B, 4)
    pasted = out != x  # where clip b got clip B-1-b's pixels
    assert pasted.any(), "cutmix pasted nothing"
    # the same box in every frame and channel: time is never cut
    assert torch.equal(pasted, pasted[:, :1, :1].expand_as(pasted))
    # the label weight equals the unpasted area fraction
    keep = 1 - pasted[0, 0, 0].float().mean()
    assert torch.allclose(y[0, 0], keep) and torch.allclose(y[0, 3], 1 - keep)


def test_mixup_on_images_unchanged():
    torch.manual_seed(1)
    x = torch.randn(4, 3, 8, 8)
    mix = Mixup(mixup_alpha=0.8, cutmix_alpha=0.0, prob=1.0, num_classes=3)
    torch.manual_seed(2)
    import numpy as np

    np.random.seed(0)
    a, ya = mix_batch(mix, x.clone(), torch.tensor([0, 1, 2, 0]))
    np.random.seed(0)
    b, yb = mix(x.clone(), torch.tensor([0, 1, 2, 0]))
    assert torch.equal(a, b) and torch.equal(ya, yb)


@pytest.mark.parametrize("opts", [{"aa": "rand-m9-mstd0.5"}, {"reprob": 0.25}])
def test_image_only_augmentations_refused_for_video(opts):
    with pytest.raises(UserError, match="images only"):
        _refuse_image_only_aug(TrainConfig(**opts))
    _refuse_image_only_aug(TrainConfig())
