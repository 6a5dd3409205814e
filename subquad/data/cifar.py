"""CIFAR-10 / CIFAR-100 from the python-pickle release the user already has, read without running arbitrary code.

The release's batch files are pickled dicts of numpy arrays and lists. They are read with a restricted unpickler that
resolves only the few globals numpy needs to rebuild an array (`numpy.core.multiarray._reconstruct`, `ndarray`,
`dtype`, `_codecs.encode`); any other global (e.g. `os.system`) is refused before anything in the file runs.

Layout: `cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}` and
`cifar-100-python/{train, test, meta}`; PATH may be that folder or its parent.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError

__all__ = ["safe_unpickle", "cifar_arrays", "CIFAR_MEAN", "CIFAR_STD"]

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)

# The only globals a pickled numpy array (plus plain containers) needs.
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    # Protocol-2 pickles written by Python 3 store bytes as _codecs.encode(str, "latin1").
    ("_codecs", "encode"),
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed (only numpy arrays and plain "
                                     "containers are)")


def safe_unpickle(path: str | os.PathLike) -> Any:
    """Unpickle `path` allowing only numpy arrays, numbers, strings, bytes, lists, tuples and dicts.

    Raises:
        UserError: the file is missing, not a pickle, or references any other global (nothing in it is run).
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"CIFAR file not found: {path}")
    data = path.read_bytes()
    try:
        return _RestrictedUnpickler(io.BytesIO(data), encoding="latin1").load()
    except pickle.UnpicklingError as e:
        raise UserError(f"refusing to load {path}: {e}") from None
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as e:
        raise UserError(f"cannot read {path} as a CIFAR pickle: {type(e).__name__}: {e}") from None


def _get(d: dict, key: str) -> Any:
    for k in (key, key.encode()):
        if k in d:
            return d[k]
    raise UserError(f"CIFAR batch lacks the key {key!r}")


def _batch(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    d = safe_unpickle(path)
    if not isinstance(d, dict):
        raise UserError(f"{path} does not hold a CIFAR batch dict")
    data = np.asarray(_get(d, "data"), dtype=np.uint8)
    labels = np.asarray(_get(d, label_key), dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3072 or len(data) != len(labels):
        raise UserError(f"{path}: expected data (N, 3072) and N labels, got {data.shape} and {labels.shape}")
    # Rows are R, G, B planes of 32 x 32: (N, 3, 32, 32) -> (N, 32, 32, 3).
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy(), labels


def _names(meta: Any, key: str) -> list[str]:
    names = _get(meta, key)
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


def cifar_arrays(root: str | os.PathLike, num_classes: int = 10) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]],
                                                                          list[str]]:
    """Return ({"train": (images (n, 32, 32, 3) uint8, labels), "test": ...}, class names)."""
    root = Path(root)
    if not root.exists():
        raise UserError(f"CIFAR directory not found: {root}")
    sub = "cifar-10-batches-py" if num_classes == 10 else "cifar-100-python"
    if (root / sub).is_dir():
        root = root / sub
    if num_classes == 10:
        train_files = [root / f"data_batch_{i}" for i in range(1, 6)]
        test_file, meta_file, label_key, names_key = root / "test_batch", root / "batches.meta", "labels", \
            "label_names"
    else:
        train_files = [root / "train"]
        test_file, meta_file, label_key, names_key = root / "test", root / "meta", "fine_labels", "fine_label_names"
    missing = [p.name for p in [*train_files, test_file, meta_file] if not p.is_file()]
    if missing:
        raise UserError(f"{root} is not a CIFAR-{num_classes} python release: missing {', '.join(missing)}")
    parts = [_batch(p, label_key) for p in train_files]
    train = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    test = _batch(test_file, label_key)
    classes = _names(safe_unpickle(meta_file), names_key)
    if len(classes) != num_classes:
        raise UserError(f"{meta_file} lists {len(classes)} classes; expected {num_classes}")
    return {"train": train, "test": test}, classes
