"""Small offline image data sets that ship inside Python wheels.

`digits`: scikit-learn's 1,797 handwritten digits (8 x 8 gray, values 0-16, 10 classes, real scans). Split:
per class, a seeded permutation (seed 0); the first floor(0.8 n_c) go to train, the rest to
test. There is no validation split. Pixels are scaled to uint8 as round(v * 255 / 16) so that they go through the
same PIL transforms as every other source.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import os
from pathlib import Path

import numpy as np

from ..errors import UserError

__all__ = ["DIGITS_CLASSES", "digits_arrays", "save_digits_image"]

DIGITS_CLASSES = [str(i) for i in range(10)]


@functools.lru_cache(maxsize=1)
def _digits_raw() -> tuple[np.ndarray, np.ndarray]:
    """(images (1797, 8, 8) float 0-16, labels) read from the wheel's digits.csv.gz without importing sklearn
    (whose import pulls in scipy and takes seconds)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("data 'digits' needs scikit-learn (pip install scikit-learn)")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():
        from sklearn.datasets import load_digits

        d = load_digits()
        return d.images, d.target
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float64)
    return table[:, :64].reshape(-1, 8, 8), table[:, 64].astype(np.int64)


def digits_arrays(seed: int = 0, train_fraction: float = 0.8) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Return {"train": (images, labels), "test": (images, labels)}; images (n, 8, 8) uint8, labels (n,) int64."""
    raw_images, raw_labels = _digits_raw()
    images = np.rint(raw_images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    labels = raw_labels.astype(np.int64)
    rng = np.random.RandomState(seed)
    train_idx, test_idx = [], []
    for c in range(10):
        idx = np.flatnonzero(labels == c)
        idx = idx[rng.permutation(len(idx))]
        k = int(np.floor(train_fraction * len(idx)))
        train_idx.append(idx[:k])
        test_idx.append(idx[k:])
    tr, te = np.sort(np.concatenate(train_idx)), np.sort(np.concatenate(test_idx))
    return {"train": (images[tr], labels[tr]), "test": (images[te], labels[te])}


def save_digits_image(path: str | os.PathLike, index: int = 0, split: str = "test", size: int = 32) -> int:
    """Write digit `index` of `split` as a PNG (upscaled to `size`) and return its label; used by `make demo`."""
    from PIL import Image

    images, labels = digits_arrays()[split]
    if not 0 <= index < len(labels):
        raise ValueError(f"index must be in [0, {len(labels)}), got {index}")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(images[index], mode="L").resize((size, size), Image.BILINEAR).save(path)
    return int(labels[index])
