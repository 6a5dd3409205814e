"""Atomic file writing, the lowest layer of the package (imports nothing from it): every file subquad writes goes
to a temporary name in the target's folder and is renamed over the target, so a crash mid-write leaves the previous
file intact."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_write", "atomic_write_text", "atomic_savefig"]


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call `write(tmp_path)` then rename tmp_path over `path` (same folder, fsync'd)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        # mkstemp creates 0600 files: give the result the usual permissions (0666 minus the umask).
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """`Path(path).write_text(text)`, atomically."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def atomic_savefig(fig, path: str | os.PathLike, **kwargs) -> Path:
    """`fig.savefig(path, **kwargs)` for a matplotlib figure, atomically (the format is taken from path's suffix)."""
    fmt = Path(path).suffix.lstrip(".") or "png"
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt, **kwargs))
