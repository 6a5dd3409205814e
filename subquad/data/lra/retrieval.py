"""LRA Retrieval (AAN document matching, byte level) from the user-supplied LRA release TSVs.

Files: `new_aan_pairs.train.tsv`, `new_aan_pairs.eval.tsv`, `new_aan_pairs.test.tsv`
(in the release archive under `lra_release/tsv_data/`; ROOT may be that folder or one of its parents). Tab-separated,
no header, no quoting; columns `label` (0/1 written as a float), `id1`, `id2`, `text1`, `text2`. Each document is
UTF-8 bytes + 1 (0 = padding), truncated to `truncate` and padded to `max_len` (Transformer-LS: 4096 / 4096; LRA
truncated at 4000). The model encodes both documents with shared weights (two-tower head).

Official: google-research/long-range-arena lra_benchmarks/matching/input_pipeline.py (recipe facts).
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

__all__ = ["RetrievalDataset", "BYTE_VOCAB", "FILES"]

FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}


def _find(root: Path, name: str) -> Path:
    for cand in (root, root / "tsv_data", root / "lra_release" / "tsv_data"):
        if (cand / name).is_file():
            return cand / name
    raise UserError(f"{name} not found under {root} (expected the LRA release files {', '.join(FILES.values())})")


class RetrievalDataset(Dataset):
    """Document pairs as dicts {tokens, mask, tokens_1, mask_1 (max_len,), label () int64}.

    Args:
        root: folder with the new_aan_pairs.*.tsv files.
        split: train, val (the release's eval file) or test.
        max_len: padded length per document.
        truncate: bytes kept per document (default max_len; LRA 4000).
        limit: keep only the first `limit` pairs.
    """

    def __init__(self, root: str | os.PathLike, split: str = "train", max_len: int = 4096,
                 truncate: int | None = None, limit: int | None = None) -> None:
        if split not in FILES:
            raise UserError(f"unknown Retrieval split {split!r}; allowed: {', '.join(FILES)}")
        root = Path(root)
        if not root.is_dir():
            raise UserError(f"Retrieval data folder {root} does not exist")
        self.path = _find(root, FILES[split])
        self.max_len = max_len
        cap, truncate = truncate, min(truncate or max_len, max_len)
        rows = read_tsv(self.path, 5, header=None, limit=limit)
        self.docs0, self.docs1 = [], []
        labels, full = np.empty(len(rows), dtype=np.int64), np.empty(len(rows), dtype=np.int64)
        for i, (label, _id1, _id2, text1, text2) in enumerate(rows):
            try:
                y = float(label)
            except ValueError:
                raise UserError(f"{self.path}:{i + 1}: label must be 0 or 1 (e.g. 1.0), got {label!r}") from None
            if y not in (0.0, 1.0):
                raise UserError(f"{self.path}:{i + 1}: label must be 0 or 1, got {label!r}")
            labels[i] = int(y)
            raw1, raw2 = text1.encode("utf-8"), text2.encode("utf-8")
            self.docs0.append(encode_bytes(raw1, truncate))
            self.docs1.append(encode_bytes(raw2, truncate))
            longest = max(len(raw1), len(raw2))
            full[i] = min(longest, cap) if cap else longest
        if not rows:
            raise UserError(f"{self.path} holds no document pairs")
        self.labels, self._lengths = labels, full

    def __len__(self) -> int:
        return len(self.labels)

    def lengths(self) -> np.ndarray:
        """Token counts per pair (its longer document) before the cut to `max_len` (after the one to `truncate`)."""
        return self._lengths

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        t0, m0 = pad_ids(self.docs0[i], self.max_len)
        t1, m1 = pad_ids(self.docs1[i], self.max_len)
        return {"tokens": t0, "mask": m0, "tokens_1": t1, "mask_1": m1, "label": torch.tensor(int(self.labels[i]))}
