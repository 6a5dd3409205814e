"""LRA Image: CIFAR-10 as grayscale pixel sequences (32 x 32 = 1024 tokens, ids = intensities 0-255, 10 classes).

Reads the user's CIFAR-10 python release (`cifar-10-batches-py`) through `subquad.data.cifar` (restricted unpickler).
Grayscale = round(0.2989 R + 0.5870 G + 0.1140 B) (tf.image.rgb_to_grayscale weights). Splits as LRA's image
pipeline: train = first 90 % of the CIFAR train set, val = last 10 %, test = the test set. Every token is real (mask
all True; pixel value 0 is a token here, not padding).

Official: google-research/long-range-arena lra_benchmarks/image/input_pipeline.py (recipe facts).
"""

from __future__ import annotations

import os

import numpy as np
import torch
from torch.utils.data import Dataset

from ...errors import UserError

__all__ = ["CifarGrayDataset", "to_gray"]


def to_gray(images: np.ndarray) -> np.ndarray:
    """(n, H, W, 3) uint8 -> (n, H * W) uint8 grayscale."""
    w = np.array([0.2989, 0.5870, 0.1140])
    g = np.rint(images.astype(np.float64) @ w).clip(0, 255).astype(np.uint8)
    return g.reshape(len(images), -1)


class CifarGrayDataset(Dataset):
    """CIFAR-10 grayscale sequences as dicts {tokens (1024,) int64, mask (1024,) bool, label () int64}."""

    def __init__(self, root: str | os.PathLike, split: str = "train", limit: int | None = None) -> None:
        from ..cifar import cifar_arrays

        if split not in ("train", "val", "test"):
            raise UserError(f"unknown image split {split!r}; allowed: train, val, test")
        arrays, _ = cifar_arrays(root, 10)
        x, y = arrays["test" if split == "test" else "train"]
        if split != "test":
            cut = len(x) * 9 // 10
            x, y = (x[:cut], y[:cut]) if split == "train" else (x[cut:], y[cut:])
        if limit:
            x, y = x[:limit], y[:limit]
        self.pixels = to_gray(x)
        self.labels = y.astype(np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        tokens = torch.from_numpy(self.pixels[i].astype(np.int64))
        return {"tokens": tokens, "mask": torch.ones_like(tokens, dtype=torch.bool),
                "label": torch.tensor(int(self.labels[i]))}
