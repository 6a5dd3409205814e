"""Small offline image data sets that ship inside Python wheels.

`digits`: scikit-learn's 1,797 handwritten digits (8 x 8 gray, values 0-16, 10 classes, real scans). Splits: per
class, a seeded permutation (seed 0); the first floor(0.8 n_c) are the training part, the rest are `test` (364
digits). A fixed held-out 15 % of each class's training part (`holdout_split`, seed 0) is `val` (the split that
selects checkpoints); the remaining 1,225 digits are `train`. Pixels are scaled to uint8 as round(v * 255 / 16) so that
they go through the same PIL transforms as every other source.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import os
from pathlib import Path

import numpy as np

from ..errors import UserError

__all__ = ["DIGITS_CLASSES", "digits_arrays", "save_digits_image", "holdout_split"]

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


def holdout_split(labels: np.ndarray, fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per class, a seeded permutation; the last ceil(fraction * n_c) indices are held out.

    Returns (keep, held_out): sorted index arrays into `labels`. The same labels, fraction and seed always give the
    same split, so a validation part carved from a training split never changes between runs.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    labels = np.asarray(labels)
    rng = np.random.RandomState(seed)
    keep, held = [], []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        idx = idx[rng.permutation(len(idx))]
        k = len(idx) - int(np.ceil(fraction * len(idx)))
        keep.append(idx[:k])
        held.append(idx[k:])
    return np.sort(np.concatenate(keep)), np.sort(np.concatenate(held))


def digits_arrays(seed: int = 0, train_fraction: float = 0.8,
                  val_fraction: float = 0.15) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Return {"train", "val", "test"} -> (images (n, 8, 8) uint8, labels (n,) int64); "train_full" = train + val."""
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
    keep, held = holdout_split(labels[tr], val_fraction, seed)
    return {"train": (images[tr[keep]], labels[tr[keep]]), "val": (images[tr[held]], labels[tr[held]]),
            "test": (images[te], labels[te]), "train_full": (images[tr], labels[tr])}


def save_digits_image(path: str | os.PathLike, index: int = 0, split: str = "test", size: int = 32) -> int:
    """Write digit `index` of `split` as a PNG (upscaled to `size`) and return its label; used by `make demo`."""
    from PIL import Image

    images, labels = digits_arrays()[split]
    if not 0 <= index < len(labels):
        raise ValueError(f"index must be in [0, {len(labels)}), got {index}")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(images[index], mode="L").resize((size, size), Image.BILINEAR).save(path)
    return int(labels[index])
