"""Give every committed recall / recall_causal cell the learning-rate sweep its `lr` came from (reproducible).

A recall cell sweeps its learning rates on the sweep seed (0); a cell of another seed trains at the rate that sweep
chose. Cells written before `subquad.arena.recall.run_cell` recorded the sweep on every seed have `lr_sweep: {}` on
seeds 1 and 2. This fills in, from the sweep seed's own cell.json of the same mechanism:

- `lr_sweep`: the sweep seed's {lr: best val accuracy} (only where the cell's `lr` is the rate it chose; otherwise
  the script stops with the mismatch);
- `lr_sweep_seed`: the seed that ran it;
- `lr_sweep_source`: that it was filled in afterwards, and from which file.

The sweep seed's own cells get `lr_sweep_seed` only. Nothing a cell measured changes; cells that already have
`lr_sweep_seed` are never touched.

    python benchmarks/backfill_arena_lr_sweeps.py [--dry-run] [RUN_DIR ...]   (default: the committed recall and
                                                                              recall_causal runs)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from subquad.files import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RUNS = [ROOT / "benchmarks/results/arena/recall", ROOT / "benchmarks/results/arena/recall_causal"]
SWEEP_SEED = 0  # subquad.arena.recall.RecallConfig.sweep_seed; the committed recipes do not override it


def fill(cell_json: Path) -> dict[str, object] | None:
    """The keys to add to `cell_json`, or None when it has them already."""
    row = json.loads(cell_json.read_text())
    if "lr_sweep_seed" in row:
        return None
    seed = int(row["seed"])
    if seed == SWEEP_SEED:
        if not row.get("lr_sweep"):
            raise SystemExit(f"{cell_json}: the sweep seed's cell has no lr_sweep")
        return {"lr_sweep_seed": SWEEP_SEED}
    src = cell_json.parent.parent / f"seed{SWEEP_SEED}" / "cell.json"
    if not src.is_file():
        raise SystemExit(f"{cell_json}: no sweep seed cell {src} to take the sweep from")
    swept = json.loads(src.read_text())
    if float(swept["lr"]) != float(row["lr"]) or not swept.get("lr_sweep"):
        raise SystemExit(f"{cell_json}: lr {row['lr']} is not the rate {src} chose ({swept['lr']}), or that cell "
                         "has no sweep")
    return {"lr_sweep": swept["lr_sweep"], "lr_sweep_seed": SWEEP_SEED,
            "lr_sweep_source": f"filled in afterwards from {src.relative_to(src.parents[3]).as_posix()} "
                               "(benchmarks/backfill_arena_lr_sweeps.py)"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path, default=DEFAULT_RUNS)
    ap.add_argument("--dry-run", action="store_true", help="print what would change, write nothing")
    args = ap.parse_args(argv)
    # Every cell is checked before any is written: a mismatch leaves all of them as they were.
    todo = [(cell_json, add) for run in args.runs for cell_json in sorted(run.glob("cells/*/seed*/cell.json"))
            if (add := fill(cell_json)) is not None]
    for cell_json, add in todo:
        print(f"{cell_json}: {sorted(add)}")
        if not args.dry_run:
            row = json.loads(cell_json.read_text())
            row.update(add)
            atomic_write_text(cell_json, json.dumps(row, indent=2) + "\n")
    print(f"{len(todo)} cell(s) {'would change' if args.dry_run else 'changed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
