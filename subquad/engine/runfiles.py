"""The run directory every trainer shares: its place, args.yaml and summary.csv (written atomically,
engine.checkpoint)."""

from __future__ import annotations

import csv
import dataclasses
import time
from pathlib import Path
from typing import Any

import yaml

from ..files import atomic_write

__all__ = ["write_args", "write_csv", "read_csv", "prepare_output"]


def write_args(out: Path, cfg: Any) -> None:
    """The resolved config dataclass as `out/args.yaml`."""
    atomic_write(out / "args.yaml", lambda tmp: Path(tmp).write_text(
        yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False)))


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """`rows` as CSV; the columns are every key in order of first appearance (nothing is written for no rows)."""
    if not rows:
        return
    fields = list(dict.fromkeys(k for r in rows for k in r))

    def _w(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)

    atomic_write(path, _w)


def read_csv(path: Path) -> list[dict[str, Any]]:
    """The rows of a CSV file ([] when there is none)."""
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def prepare_output(cfg: Any) -> Path:
    """The run directory of an epoch trainer's config (`resume`, `output`, `model`): the resumed one, or a new one
    that holds no run (default runs/<time>-<model>)."""
    from ..errors import UserError

    if cfg.resume:
        return Path(cfg.resume)
    out = Path(cfg.output or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{cfg.model}")
    if out.exists() and not out.is_dir():
        raise UserError(f"--output {out} exists and is not a directory")
    if (out / "last.safetensors").exists() or (out / "last_state.pth").exists():
        raise UserError(f"--output {out} already holds a run; continue it with --resume {out} or choose another "
                        "--output (nothing was overwritten)")
    if (out / "best.safetensors").exists():  # a kept model whose resumable state was removed
        raise UserError(f"--output {out} already holds a run's model (best.safetensors, no resumable state to "
                        "continue); choose another --output (nothing was overwritten)")
    return out

