"""Strict TSV reading for LRA files: a malformed line raises a UserError naming the file and the line number."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ...errors import UserError

__all__ = ["read_tsv"]


def read_tsv(path: str | os.PathLike, columns: int, header: Sequence[str] | None = None,
             limit: int | None = None) -> list[list[str]]:
    """Read a tab-separated file with exactly `columns` fields per line.

    Args:
        path: the file.
        columns: fields per line.
        header: the expected first line (e.g. ("Source", "Target")), or None for files without a header.
        limit: stop after this many data rows.

    Returns:
        The data rows (header excluded), each a list of `columns` strings. Empty trailing lines are ignored.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    rows: list[list[str]] = []
    with open(path, encoding="utf-8", newline="") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            if lineno == 1 and header is not None:
                if line.split("\t") != list(header):
                    raise UserError(f"{path}:1: expected the header {chr(9).join(header)!r}, got {line[:80]!r}")
                continue
            if not line:
                continue
            fields = line.split("\t")
            if len(fields) != columns:
                raise UserError(f"{path}:{lineno}: malformed line: expected {columns} tab-separated fields, got "
                                f"{len(fields)} ({line[:60]!r})")
            rows.append(fields)
            if limit is not None and len(rows) >= limit:
                break
    return rows
