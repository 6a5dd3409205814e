from __future__ import annotations

import gzip
import hashlib
import struct

import numpy as np
import pytest

from subquad.data.fashion_mnist import DEBIAN_DIR as fm_debian
from subquad.data.idx import IMAGES_MAGIC, LABELS_MAGIC, read_idx
from subquad.errors import UserError


def _idx_bytes(arr: np.ndarray, magic: int | None = None) -> bytes:
    magic = magic if magic is not None else (0x0800 | arr.ndim)
    return struct.pack(">I", magic) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.astype(">u1").tobytes()


@pytest.mark.parametrize("compressed", [False, True])
def test_read_idx_roundtrip(tmp_path, compressed):
    imgs = np.random.RandomState(0).randint(0, 256, size=(5, 3, 4)).astype(np.uint8)
    raw = _idx_bytes(imgs)
    p = tmp_path / ("x.gz" if compressed else "x")
    p.write_bytes(gzip.compress(raw) if compressed else raw)
    out = read_idx(p, IMAGES_MAGIC)
    assert out.shape == (5, 3, 4) and out.dtype == np.uint8
    np.testing.assert_array_equal(out, imgs)
    labels = np.arange(7, dtype=np.uint8)
    (tmp_path / "l").write_bytes(_idx_bytes(labels))
    np.testing.assert_array_equal(read_idx(tmp_path / "l", LABELS_MAGIC), labels)


def test_read_idx_rejects_wrong_magic(tmp_path):
    p = tmp_path / "l"
    p.write_bytes(_idx_bytes(np.arange(4, dtype=np.uint8)))
    with pytest.raises(UserError, match="magic"):
        read_idx(p, IMAGES_MAGIC)
    p.write_bytes(struct.pack(">I", 0x12345678) + b"\0" * 8)
    with pytest.raises(UserError, match="magic"):
        read_idx(p)


@pytest.mark.parametrize("delta", [-1, 3])
def test_read_idx_rejects_size_mismatch(tmp_path, delta):
    raw = _idx_bytes(np.zeros((2, 3, 3), np.uint8))
    p = tmp_path / "x"
    p.write_bytes(raw[:delta] if delta < 0 else raw + b"\0" * delta)
    with pytest.raises(UserError, match="bytes"):
        read_idx(p)


def test_read_idx_missing_and_truncated_header(tmp_path):
    with pytest.raises(UserError, match="not found"):
        read_idx(tmp_path / "nope")
    p = tmp_path / "x"
    p.write_bytes(struct.pack(">I", IMAGES_MAGIC) + b"\0\0")
    with pytest.raises(UserError, match="truncated"):
        read_idx(p)


def test_fashion_mnist_splits(fashion_mnist_dir):
    """The reader on files in the release's format and names (written by the test): 500 images a class carved out of
    train as val by a seeded permutation, train the rest, train_full all of them, test the t10k files."""
    from subquad.data.fashion_mnist import FASHION_MNIST_CLASSES, fashion_mnist_arrays, find_fashion_mnist

    assert find_fashion_mnist() == fashion_mnist_dir  # named by $SUBQUAD_FASHION_MNIST_DIR
    arrays = fashion_mnist_arrays()
    sizes = {"train": 200, "val": 5000, "test": 100, "train_full": 5200}
    for split, n in sizes.items():
        x, y = arrays[split]
        assert x.shape == (n, 28, 28) and x.dtype == np.uint8 and y.shape == (n,) and y.dtype == np.int64, split
        assert np.bincount(y, minlength=10).tolist() == [n // 10] * 10, split
    full = {x.tobytes() for x in arrays["train_full"][0]}
    tr, va = ({x.tobytes() for x in arrays[k][0]} for k in ("train", "val"))
    assert not tr & va and tr | va == full
    again = fashion_mnist_arrays(fashion_mnist_dir)  # the same directory given explicitly: the same seeded split
    np.testing.assert_array_equal(again["val"][1], arrays["val"][1])
    assert len(FASHION_MNIST_CLASSES) == 10


def test_fashion_mnist_absent_says_how_to_get_it(tmp_path, monkeypatch):
    """Without the data: one line that names the Debian package, the four file names and the ways to point at them."""
    from subquad.data import fashion_mnist as fm

    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.delenv(fm.ENV_DIR, raising=False)
    monkeypatch.setattr(fm, "DEBIAN_DIR", empty / "debian")
    monkeypatch.setenv("SUBQUAD_DATA", str(empty))
    with pytest.raises(UserError) as e:
        fm.find_fashion_mnist()
    msg = str(e.value)
    assert "\n" not in msg and "apt-get install dataset-fashion-mnist" in msg and "fashion-mnist:DIR" in msg
    assert all(f in msg for f in fm.FILES) and fm.ENV_DIR in msg
    monkeypatch.setenv(fm.ENV_DIR, str(empty))  # the variable names the only place looked at
    with pytest.raises(UserError, match=f"{fm.ENV_DIR}=.* holds none of the Fashion-MNIST files "
                                        "train-images-idx3-ubyte.gz, .*apt-get install dataset-fashion-mnist"):
        fm.find_fashion_mnist()
    with pytest.raises(UserError, match="fashion-mnist directory .*/nope: directory not found"):
        fm.find_fashion_mnist(tmp_path / "nope")


def test_fashion_mnist_one_missing_file_is_named(tmp_path, fashion_mnist_dir, monkeypatch):
    from subquad.data import fashion_mnist as fm

    part = tmp_path / "part"
    part.mkdir()
    for f in fm.FILES[:3]:
        (part / f).write_bytes((fashion_mnist_dir / f).read_bytes())
    with pytest.raises(UserError, match="lacks t10k-labels-idx1-ubyte.gz of the Fashion-MNIST files"):
        fm.find_fashion_mnist(part)


# The bytes of the Debian package dataset-fashion-mnist (the original release): checked only where it is installed.
# This test is about those files themselves; the reader and its splits are tested above on files the test writes.
_SHA = {
    "train-images-idx3-ubyte.gz": "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
    "train-labels-idx1-ubyte.gz": "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
    "t10k-images-idx3-ubyte.gz": "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
    "t10k-labels-idx1-ubyte.gz": "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
}


@pytest.mark.data
def test_debian_fashion_mnist_files_and_splits():
    missing = [f for f in _SHA if not (fm_debian / f).is_file()]
    assert not missing, f"{missing} absent: apt-get install dataset-fashion-mnist (this test is about its bytes)"
    from subquad.data.fashion_mnist import fashion_mnist_arrays

    for name, sha in _SHA.items():
        assert hashlib.sha256((fm_debian / name).read_bytes()).hexdigest() == sha, name
    arrays = fashion_mnist_arrays(fm_debian)
    sizes = {"train": 55000, "val": 5000, "test": 10000, "train_full": 60000}
    for split, n in sizes.items():
        x, y = arrays[split]
        assert x.shape == (n, 28, 28) and x.dtype == np.uint8 and y.shape == (n,), split
        assert np.bincount(y, minlength=10).tolist() == [n // 10] * 10, split
    tr, va = arrays["train"][0], arrays["val"][0]
    # val is carved out of train: together they are the 60,000 training images.
    assert len(tr) + len(va) == 60000
    mean = arrays["train_full"][0].mean() / 255
    assert abs(mean - 0.2860) < 5e-4
