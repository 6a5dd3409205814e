"""Fashion-MNIST read from IDX files: the Debian package `dataset-fashion-mnist`, a user directory, or a
torchvision download (opt-in, needs internet).

Splits: `val` = 500 images per class chosen by a seeded permutation (seed 0) of each class's
training indices, `train` = the remaining 55,000, `test` = t10k. `train_full` = all 60,000 training images.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import UserError
from .idx import IMAGES_MAGIC, LABELS_MAGIC, read_idx

__all__ = ["FASHION_MNIST_CLASSES", "DEBIAN_DIR", "MEAN", "STD", "find_fashion_mnist", "fashion_mnist_arrays",
           "download_fashion_mnist"]

FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                         "Ankle boot"]
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
# Statistics of the training pixels / 255.
MEAN, STD = 0.2860, 0.3530

_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
          "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def _locate(root: Path, stem: str) -> Path | None:
    for sub in ("", "FashionMNIST/raw", "raw"):
        for suffix in (".gz", ""):
            p = root / sub / f"{stem}{suffix}"
            if p.is_file():
                return p
    return None


def _default_roots() -> list[Path]:
    data_home = Path(os.environ.get("SUBQUAD_DATA", Path.home() / ".cache" / "subquad" / "data"))
    return [DEBIAN_DIR, data_home / "fashion-mnist"]


def find_fashion_mnist(root: str | os.PathLike | None = None) -> Path:
    """Return the directory holding the four IDX files (`root`, or the Debian package, or $SUBQUAD_DATA)."""
    roots = [Path(root)] if root else _default_roots()
    for r in roots:
        if all(_locate(r, stem) for pair in _FILES.values() for stem in pair):
            return r
    if root:
        if not Path(root).exists():
            raise UserError(f"fashion-mnist directory not found: {root}")
        raise UserError(f"fashion-mnist directory {root} lacks the IDX files "
                        f"({', '.join(s for pair in _FILES.values() for s in pair)}, optionally .gz)")
    raise UserError("Fashion-MNIST not found; install it with `apt-get install dataset-fashion-mnist`, pass "
                    "--data fashion-mnist:DIR, or add --dataset-download (needs internet)")


def download_fashion_mnist(root: str | os.PathLike | None = None) -> Path:
    """Download through torchvision into `root` (default $SUBQUAD_DATA/fashion-mnist); only on explicit request."""
    from torchvision.datasets import FashionMNIST

    root = Path(root) if root else _default_roots()[1]
    for train in (True, False):
        FashionMNIST(os.fspath(root), train=train, download=True)
    return root


def fashion_mnist_arrays(root: str | os.PathLike | None = None, seed: int = 0,
                         val_per_class: int = 500) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Return {split: (images (n, 28, 28) uint8, labels (n,) int64)} for train, val, test and train_full."""
    base = find_fashion_mnist(root)
    out = {}
    for split, (img_stem, lab_stem) in _FILES.items():
        images = read_idx(_locate(base, img_stem), IMAGES_MAGIC)
        labels = read_idx(_locate(base, lab_stem), LABELS_MAGIC).astype(np.int64)
        if len(images) != len(labels):
            raise UserError(f"fashion-mnist {split}: {len(images)} images but {len(labels)} labels in {base}")
        out[split] = (images, labels)
    images, labels = out["train"]
    rng = np.random.RandomState(seed)
    val_idx = []
    for c in range(len(FASHION_MNIST_CLASSES)):
        idx = np.flatnonzero(labels == c)
        val_idx.append(idx[rng.permutation(len(idx))[:val_per_class]])
    val_idx = np.sort(np.concatenate(val_idx))
    keep = np.ones(len(labels), dtype=bool)
    keep[val_idx] = False
    out["train_full"] = out["train"]
    out["train"] = (images[keep], labels[keep])
    out["val"] = (images[val_idx], labels[val_idx])
    return out
