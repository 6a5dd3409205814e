"""LRA Text (IMDb sentiment, byte level) from user-supplied files.

Accepted inputs, in order of preference:
    (a) the public `aclImdb` layout: `train/{pos,neg}/*.txt`, `test/{pos,neg}/*.txt` (`train/unsup` ignored);
        label 1 = pos, 0 = neg; ROOT may be `aclImdb` itself or its parent;
    (b) TSVs with the header `Source<TAB>Target` (LRA's column names): `train.tsv`, `test.tsv` (and optionally
        `val.tsv`), one review per line, Target 0/1.
Processing: UTF-8 bytes + 1 (0 = padding), truncated to `truncate` = 4000 bytes (LRA), padded to `max_len` = 4096
(Transformer-LS appended zeros to reach 4096). LRA validates on the test split: split "val" reads test unless a
`val.tsv` exists (recorded as `val=test`).

Official: google-research/long-range-arena lra_benchmarks/text_classification/input_pipeline.py (recipe facts).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ...errors import UserError
from ._bytes import BYTE_VOCAB, encode_bytes, pad_ids
from ._tsv import read_tsv

__all__ = ["TextDataset", "BYTE_VOCAB"]


def _imdb_root(root: Path) -> Path | None:
    for cand in (root, root / "aclImdb"):
        if (cand / "train" / "pos").is_dir() and (cand / "train" / "neg").is_dir():
            return cand
    return None


class TextDataset(Dataset):
    """IMDb reviews as dicts {tokens (max_len,) int64, mask (max_len,) bool, label () int64}.

    Args:
        root: aclImdb folder (or its parent), or a folder with train.tsv / test.tsv.
        split: train, val or test (val = test unless val.tsv exists).
        max_len: padded length (Transformer-LS 4096).
        truncate: bytes kept per review (LRA 4000).
        limit: keep only the first `limit` reviews (in file order: neg then pos for aclImdb, sorted by name).
    """

    def __init__(self, root: str | os.PathLike, split: str = "train", max_len: int = 4096, truncate: int = 4000,
                 limit: int | None = None) -> None:
        if split not in ("train", "val", "test"):
            raise UserError(f"unknown Text split {split!r}; allowed: train, val, test")
        root = Path(root)
        if not root.is_dir():
            raise UserError(f"Text data folder {root} does not exist")
        self.max_len = max_len
        cap, truncate = truncate, min(truncate, max_len)
        imdb = _imdb_root(root)
        self.val_is_test = split == "val" and not (root / "val.tsv").is_file()
        file_split = "test" if self.val_is_test else split
        self.docs: list[np.ndarray] = []
        labels, full = [], []
        if imdb is not None and not (root / f"{file_split}.tsv").is_file():
            if file_split == "val":
                raise UserError(f"{imdb} has no val split; use test (LRA validates on test)")
            for label, sub in ((0, "neg"), (1, "pos")):
                d = imdb / file_split / sub
                if not d.is_dir():
                    raise UserError(f"{d} not found (expected the aclImdb layout {file_split}/{{pos,neg}}/*.txt)")
                for f in sorted(d.glob("*.txt")):
                    raw = f.read_bytes()
                    self.docs.append(encode_bytes(raw, truncate))
                    full.append(min(len(raw), cap))
                    labels.append(label)
        else:
            path = root / f"{file_split}.tsv"
            if not path.is_file():
                raise UserError(f"no Text data in {root}: expected the aclImdb layout (train/pos, train/neg, ...) "
                                f"or {file_split}.tsv with header Source<TAB>Target")
            for i, (src, tgt) in enumerate(read_tsv(path, 2, header=("Source", "Target"), limit=limit)):
                try:
                    label = int(float(tgt))
                except ValueError:
                    raise UserError(f"{path}:{i + 2}: Target must be 0 or 1, got {tgt!r}") from None
                if label not in (0, 1):
                    raise UserError(f"{path}:{i + 2}: Target must be 0 or 1, got {tgt!r}")
                raw = src.encode("utf-8")
                self.docs.append(encode_bytes(raw, truncate))
                full.append(min(len(raw), cap))
                labels.append(label)
        if limit is not None:
            self.docs, labels, full = self.docs[:limit], labels[:limit], full[:limit]
        if not self.docs:
            raise UserError(f"no Text examples found for split {split!r} in {root}")
        self.labels = np.asarray(labels, dtype=np.int64)
        self._lengths = np.asarray(full, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.docs)

    def lengths(self) -> np.ndarray:
        """Token counts per review before the cut to `max_len` (after the one to `truncate` bytes)."""
        return self._lengths

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        tokens, mask = pad_ids(self.docs[i], self.max_len)
        return {"tokens": tokens, "mask": mask, "label": torch.tensor(int(self.labels[i]))}
