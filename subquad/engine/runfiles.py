"""The files every run directory shares: args.yaml and summary.csv, written atomically (engine.checkpoint)."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import Any

import yaml

from .checkpoint import atomic_write

__all__ = ["write_args", "write_csv", "read_csv"]


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
