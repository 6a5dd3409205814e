"""Fashion-MNIST read from IDX files: the Debian package `dataset-fashion-mnist`, a user directory, or a
torchvision download (opt-in, needs internet).

Where the data are looked for: the directory given (`--data fashion-mnist:DIR`); else $SUBQUAD_FASHION_MNIST_DIR when
it is set (and then only there: it names the data for every process, e.g. the arena's cells); else the Debian
package's /usr/share/datasets/fashion-mnist, then $SUBQUAD_DATA/fashion-mnist. A directory holds the four files of
the original release, `train-images-idx3-ubyte.gz`, `train-labels-idx1-ubyte.gz`, `t10k-images-idx3-ubyte.gz`,
`t10k-labels-idx1-ubyte.gz` (gzip IDX, or the same names without .gz; also under FashionMNIST/raw or raw/).

Splits: `val` = 500 images per class chosen by a seeded permutation (seed 0) of each class's
training indices, `train` = the remaining 55,000, `test` = t10k. `train_full` = all 60,000 training images.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import UserError
from .idx import IMAGES_MAGIC, LABELS_MAGIC, read_idx

__all__ = ["FASHION_MNIST_CLASSES", "DEBIAN_DIR", "DEBIAN_PACKAGE", "ENV_DIR", "FILES", "MEAN", "STD",
           "find_fashion_mnist", "fashion_mnist_arrays", "download_fashion_mnist"]

FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                         "Ankle boot"]
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
DEBIAN_PACKAGE = "dataset-fashion-mnist"
# The environment variable naming the directory of the IDX files (overrides the default places).
ENV_DIR = "SUBQUAD_FASHION_MNIST_DIR"
# Statistics of the training pixels / 255.
MEAN, STD = 0.2860, 0.3530

_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
          "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
# The file names of the original release (and of the Debian package).
FILES = tuple(f"{stem}.gz" for pair in _FILES.values() for stem in pair)


def _locate(root: Path, stem: str) -> Path | None:
    for sub in ("", "FashionMNIST/raw", "raw"):
        for suffix in (".gz", ""):
            p = root / sub / f"{stem}{suffix}"
            if p.is_file():
                return p
    return None


def _data_home() -> Path:
    return Path(os.environ.get("SUBQUAD_DATA", Path.home() / ".cache" / "subquad" / "data")) / "fashion-mnist"


def _default_roots() -> list[Path]:
    env = os.environ.get(ENV_DIR)
    if env:
        return [Path(env)]
    return [DEBIAN_DIR, _data_home()]


def find_fashion_mnist(root: str | os.PathLike | None = None) -> Path:
    """Return the directory holding the four IDX files: `root`, else $SUBQUAD_FASHION_MNIST_DIR, else the Debian
    package's directory or $SUBQUAD_DATA/fashion-mnist. Raises a one-line UserError that says how to get them."""
    env = os.environ.get(ENV_DIR)
    roots = [Path(root)] if root else _default_roots()
    for r in roots:
        if all(_locate(r, stem) for pair in _FILES.values() for stem in pair):
            return r
    files = ", ".join(FILES)
    if root or env:
        where = f"fashion-mnist directory {root}" if root else f"{ENV_DIR}={env}"
        if not roots[0].is_dir():
            raise UserError(f"{where}: directory not found (it must hold the Fashion-MNIST files {files}, or install "
                            f"the Debian package: apt-get install {DEBIAN_PACKAGE})")
        missing = [f for f in FILES if not _locate(roots[0], f[:-3])]
        lacks = "holds none of" if len(missing) == len(FILES) else f"lacks {', '.join(missing)} of"
        other = "name another folder" if root else "unset it"
        raise UserError(f"{where} {lacks} the Fashion-MNIST files {files} (gzip IDX as released, or the same names "
                        f"without .gz); put them there, or {other} and install the Debian package (apt-get install "
                        f"{DEBIAN_PACKAGE})")
    raise UserError(f"Fashion-MNIST not found in {DEBIAN_DIR} or {_data_home()}: install the Debian package "
                    f"(apt-get install {DEBIAN_PACKAGE}), or put {files} in a folder DIR and pass --data "
                    f"fashion-mnist:DIR or set {ENV_DIR}=DIR (or add --dataset-download, needs internet)")


def download_fashion_mnist(root: str | os.PathLike | None = None) -> Path:
    """Download through torchvision into `root` (default $SUBQUAD_FASHION_MNIST_DIR when set, else
    $SUBQUAD_DATA/fashion-mnist); only on explicit request."""
    from torchvision.datasets import FashionMNIST

    root = Path(root) if root else Path(os.environ.get(ENV_DIR) or _data_home())
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
