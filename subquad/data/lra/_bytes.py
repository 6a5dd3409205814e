"""Byte encoding shared by the LRA Text and Retrieval loaders: id = UTF-8 byte + 1, 0 = padding (257 ids in use)."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["encode_bytes", "pad_ids", "BYTE_VOCAB"]

# Ids in use: padding 0 and the 256 byte values shifted by one (tfds ByteTextEncoder's offset).
BYTE_VOCAB = 257


def encode_bytes(text: str | bytes, truncate: int) -> np.ndarray:
    """UTF-8 bytes of `text` + 1 as uint16, truncated to `truncate` ids."""
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return np.frombuffer(raw[:truncate], dtype=np.uint8).astype(np.uint16) + 1


def pad_ids(ids: np.ndarray, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens (max_len,) int64 zero-padded, mask (max_len,) bool)."""
    tokens = torch.zeros(max_len, dtype=torch.int64)
    n = min(len(ids), max_len)
    tokens[:n] = torch.from_numpy(ids[:n].astype(np.int64))
    mask = torch.zeros(max_len, dtype=torch.bool)
    mask[:n] = True
    return tokens, mask
