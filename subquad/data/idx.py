"""Reader for the IDX format of (Fashion-)MNIST, gzip-compressed or raw, without torchvision.

Layout: a big-endian uint32 magic whose third byte is the element type (0x08 = ubyte) and whose low byte is the
number of dimensions, then one big-endian uint32 per dimension, then the values in row-major order.
Images are magic 0x00000803 (N, rows, cols); labels are 0x00000801 (N,).
"""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np

from ..errors import UserError

__all__ = ["read_idx", "IMAGES_MAGIC", "LABELS_MAGIC"]

IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801

# IDX element-type byte -> numpy big-endian dtype.
_DTYPES = {0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
           0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def read_idx(path: str | os.PathLike, expect_magic: int | None = None) -> np.ndarray:
    """Read an IDX file (`.gz` or raw) into a numpy array.

    Args:
        path: the file; names ending in `.gz` are decompressed in memory.
        expect_magic: if given, the magic number the file must carry (IMAGES_MAGIC or LABELS_MAGIC).

    Returns:
        The array, shape as the header says (images (N, rows, cols) uint8, labels (N,) uint8), native byte order.

    Raises:
        UserError: missing file, wrong magic, unknown element type, or a payload size that disagrees with the header.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"IDX file not found: {path}")
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise UserError(f"cannot read IDX file {path}: {e}") from None
    if len(raw) < 4:
        raise UserError(f"IDX file {path} is too short ({len(raw)} bytes) to hold a header")
    (magic,) = struct.unpack(">I", raw[:4])
    if expect_magic is not None and magic != expect_magic:
        raise UserError(f"IDX file {path} has magic 0x{magic:08x}; expected 0x{expect_magic:08x}")
    if magic >> 16 != 0 or (magic >> 8) & 0xFF not in _DTYPES or magic & 0xFF == 0:
        raise UserError(f"IDX file {path} has an invalid magic 0x{magic:08x} (expected 0x000008NN for ubyte data)")
    ndim = magic & 0xFF
    dtype = _DTYPES[(magic >> 8) & 0xFF]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise UserError(f"IDX file {path} is truncated inside its header")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise UserError(f"IDX file {path}: header says {dims} ({expected} bytes of data) but the file holds "
                        f"{len(raw) - header} bytes")
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    return data.astype(dtype.newbyteorder("="), copy=True)
