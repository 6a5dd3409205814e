"""Atomic, pickle-free checkpoint files.

Weights are safetensors with a string-dict header; every file is written to a temporary name in the same folder and
renamed over the target, so a crash mid-write leaves the previous file intact.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["atomic_write", "save_weights", "write_json", "read_json", "sidecar_path", "save_state", "load_state"]


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


def check_output_file(path: str | os.PathLike, suffixes: tuple[str, ...], protect: tuple = (),
                      what: str = "output", overwrite_if=None) -> Path:
    """Refuse an output path that would destroy something: a wrong suffix, one of the `protect`ed inputs, or an
    existing file that `overwrite_if(path)` does not recognise as an earlier output of the same kind."""
    from ..errors import UserError

    p = Path(path)
    if p.suffix.lower() not in suffixes:
        raise UserError(f"{what} {p} must end in {' or '.join(suffixes)}")
    resolved = p.resolve()
    for q in protect:
        if q is not None and Path(q).resolve() == resolved:
            raise UserError(f"{what} {p} is one of the inputs; choose another path (nothing was written)")
    if p.exists() and (p.is_dir() or (overwrite_if is not None and not overwrite_if(p))):
        raise UserError(f"{what} {p} exists and is not an earlier {what}; choose another path (nothing was written)")
    return p


def save_weights(model: nn.Module | dict[str, torch.Tensor], path: str | os.PathLike,
                 metadata: dict[str, str] | None = None) -> Path:
    """Write a model's state dict as safetensors (shared tensors are cloned), atomically."""
    from safetensors.torch import save_file

    sd = model.state_dict() if isinstance(model, nn.Module) else model
    sd = {k: v.detach().cpu().contiguous().clone() for k, v in sd.items()}
    meta = {k: str(v) for k, v in (metadata or {}).items()}
    return atomic_write(path, lambda tmp: save_file(sd, tmp, metadata=meta))


def write_json(obj: Any, path: str | os.PathLike) -> Path:
    def _w(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, default=str)
            f.write("\n")

    return atomic_write(path, _w)


def read_json(path: str | os.PathLike) -> Any:
    with open(path) as f:
        return json.load(f)


def sidecar_path(weights: str | os.PathLike) -> Path:
    """`best.safetensors` -> `best.json`."""
    p = Path(weights)
    return p.with_suffix(".json")


def save_state(state: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write training state (tensors and plain containers only) with torch.save, atomically."""
    return atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_state(path: str | os.PathLike) -> dict[str, Any]:
    """Read a training-state file with `torch.load(weights_only=True)`: nothing but tensors and plain containers.

    Raises:
        UserError: the file is missing, or holds anything else (a pickle that would run code is refused unrun).
    """
    import pickle

    from ..errors import UserError

    path = Path(path)
    if not path.is_file():
        raise UserError(f"training state not found: {path}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "unsupported content"
        raise UserError(f"refusing to load {path}: it holds objects other than tensors and plain containers "
                        f"({first})") from None
    except (RuntimeError, EOFError, ValueError) as e:
        raise UserError(f"cannot read training state {path}: {str(e).splitlines()[0] if str(e) else e!r}") from None
    if not isinstance(obj, dict):
        raise UserError(f"training state {path} is not a dict")
    return obj
