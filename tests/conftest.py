"""Test environment: seed 0, few threads (CI has 2 cores; xdist runs 2 workers), markers, official-code root, and a
small Fashion-MNIST written by the tests (`fashion_mnist_dir`)."""

from __future__ import annotations

import os

import pytest
import torch

# Two xdist workers share the 2 cores: one thread each; a plain run uses both.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def official_root():
    """Path of official checkouts (SUBQUAD_OFFICIAL_ROOT); tests that need it are marked `parity`."""
    root = os.environ.get("SUBQUAD_OFFICIAL_ROOT")
    if not root:
        pytest.skip("SUBQUAD_OFFICIAL_ROOT is not set (parity tests need the official repositories)")
    return root


def write_fashion_mnist(root, train_per_class: int = 520, test_per_class: int = 10, seed: int = 0):
    """Write the four files of a small Fashion-MNIST into `root` in the real format: gzip IDX (magic 0x803 images
    (N, 28, 28) uint8, 0x801 labels (N,) uint8) under the release's names. Each class is a bright band at its own
    rows over faint noise, so a model can learn it. 520 training images a class leave 20 after the reader's 500-a-class
    validation split."""
    import gzip
    import struct
    from pathlib import Path

    import numpy as np

    from subquad.data.fashion_mnist import FILES

    rng = np.random.RandomState(seed)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)

    def split(per_class):
        labels = np.repeat(np.arange(10, dtype=np.uint8), per_class)
        labels = labels[rng.permutation(len(labels))]
        images = rng.randint(0, 32, size=(len(labels), 28, 28)).astype(np.uint8)
        for c in range(10):
            images[labels == c, 2 * c + 4: 2 * c + 8] += 200
        return images, labels

    def idx(arr, magic):
        return struct.pack(">I", magic) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.astype(">u1").tobytes()

    (tr_x, tr_y), (te_x, te_y) = split(train_per_class), split(test_per_class)
    for name, arr, magic in zip(FILES, (tr_x, tr_y, te_x, te_y), (0x803, 0x801, 0x803, 0x801)):
        (root / name).write_bytes(gzip.compress(idx(arr, magic), compresslevel=1))
    return root


@pytest.fixture(scope="session")
def _fashion_mnist_files(tmp_path_factory):
    return write_fashion_mnist(tmp_path_factory.mktemp("fashion-mnist"))


@pytest.fixture
def fashion_mnist_dir(_fashion_mnist_files, monkeypatch):
    """A small Fashion-MNIST written by the test (the real file names and format), named by
    $SUBQUAD_FASHION_MNIST_DIR for this process and its subprocesses (the arena's cells): tests never depend on, nor
    skip for, the Debian package dataset-fashion-mnist."""
    from subquad.data.fashion_mnist import ENV_DIR

    monkeypatch.setenv(ENV_DIR, str(_fashion_mnist_files))
    return _fashion_mnist_files


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A small prepared byte corpus (`subquad lm prepare` of 120 generated lines) for the LM resume tests."""
    from subquad.data.char import prepare_corpus

    root = tmp_path_factory.mktemp("lmcorpus")
    (root / "doc.txt").write_text("".join(f"line {i}: the quick brown fox {i * 7 % 13} jumps.\n" for i in range(120)))
    prepare_corpus(root / "doc.txt", root / "prep")
    return root / "prep"

