"""Small offline image data sets that ship inside Python packages.

`load_digits_split`: scikit-learn's 1,797 handwritten digits (8 x 8, 10 classes, real scans), with a fixed stratified
80/20 train/test split (seed 0), resized to the requested size and replicated to the requested channels.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["load_digits_split", "DIGITS_CLASSES"]

DIGITS_CLASSES = [str(i) for i in range(10)]


def _prepare(images: np.ndarray, img_size: tuple[int, int], in_chans: int) -> torch.Tensor:
    x = torch.from_numpy(images.astype(np.float32) / 16.0)[:, None]  # (n, 1, 8, 8) in [0, 1]
    x = F.interpolate(x, size=img_size, mode="bilinear", align_corners=False)
    x = (x - 0.5) / 0.5
    return x.expand(-1, in_chans, -1, -1).contiguous()


def load_digits_split(img_size: tuple[int, int] = (32, 32), in_chans: int = 3, test_fraction: float = 0.2,
                      seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return (x_train, y_train, x_test, y_test); images (n, in_chans, H, W) normalised to [-1, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    idx_train, idx_test = train_test_split(np.arange(len(d.target)), test_size=test_fraction, random_state=seed,
                                           stratify=d.target)
    images = d.images
    y = torch.from_numpy(d.target.astype(np.int64))
    return (_prepare(images[idx_train], img_size, in_chans), y[idx_train],
            _prepare(images[idx_test], img_size, in_chans), y[idx_test])
