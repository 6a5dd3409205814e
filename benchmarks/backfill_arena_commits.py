"""Give every committed arena cell that lacks one the git commit its code was most likely at (reproducible).

Cells trained before cell.json recorded `commit` (subquad.arena.runner.provenance) have no record of their code.
Their files hold no timestamps, so the time each cell trained is bounded from git history alone:

- earliest: the run's start, `created` in the run's arena.json (no cell started before it);
- latest:   the committer time of the commit that first added the cell's cell.json, minus the cell's `wall_s`
            (a cell ran for at least wall_s before its result was committed).

The checkout that trained the cells followed the first-parent line of the branch, so the code at a time t is the
newest first-parent commit of HEAD committed at or before t. The cell gets `commit` = the code at the latest bound
(the newest code that can have trained it), `tree_clean: null` (unknown), and `commit_source` saying how, including
whether subquad/ differs between the code at the two bounds (when it does not, the commit is exact as far as
subquad/ goes; when it does, the number of commits that changed subquad/ in between is given, and `commit_earliest`
names the code at the earliest bound).

    python benchmarks/backfill_arena_commits.py [--dry-run] [RUN_DIR ...]   (default: the committed fmnist and
                                                                             listops runs)

Cells that already have `commit` are never touched.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RUNS = [ROOT / "benchmarks/results/arena/fmnist", ROOT / "benchmarks/results/arena/listops"]


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout.strip()


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S +0000")


def code_at(t: datetime) -> str:
    """The newest first-parent commit of HEAD committed at or before t."""
    return git("rev-list", "-1", "--first-parent", f"--before={_iso(t)}", "HEAD")


def added_by(path: Path) -> tuple[str, datetime]:
    """The commit that first added `path`, and its committer time."""
    rel = path.relative_to(ROOT).as_posix()
    lines = git("log", "--diff-filter=A", "--format=%H %cI", "--", rel).splitlines()
    if not lines:
        raise SystemExit(f"{rel} is not committed; commit the cell first")
    sha, when = lines[-1].split(" ", 1)
    return sha, datetime.fromisoformat(when)


def reconstruct(cell_json: Path, created: datetime) -> dict[str, object]:
    row = json.loads(cell_json.read_text())
    add_sha, add_time = added_by(cell_json)
    latest_t = add_time - timedelta(seconds=float(row.get("wall_s") or 0.0))
    if latest_t < created:  # committed sooner than its wall time after the run began: the run's start bounds it
        latest_t = created
    latest, earliest = code_at(latest_t), code_at(created)
    changed = git("rev-list", "--count", "--first-parent", f"{earliest}..{latest}", "--", "subquad")
    how = (f"reconstructed from git history: the cell trained between its run's start ({_iso(created)}, "
           f"arena.json created) and {_iso(latest_t)} (commit {add_sha[:10]}, which first added its cell.json, "
           f"minus its wall_s); commit is the first-parent code at the later time")
    if earliest == latest or changed == "0":
        how += f"; subquad/ is the same at {earliest[:10]} (the run's start), so the code is exact"
    else:
        how += (f"; {changed} first-parent commit(s) changed subquad/ after {earliest[:10]} (the code at the run's "
                "start, commit_earliest), so the cell's code is one of the first-parent commits from "
                "commit_earliest to commit")
    out: dict[str, object] = {"commit": latest, "tree_clean": None, "commit_source": how}
    if not (earliest == latest or changed == "0"):
        out["commit_earliest"] = earliest
    return out


def backfill(run: Path, dry_run: bool) -> int:
    meta = json.loads((run / "arena.json").read_text())
    created = datetime.strptime(meta["created"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
    n = 0
    for cell_json in sorted(run.glob("cells/*/seed*/cell.json")):
        row = json.loads(cell_json.read_text())
        if row.get("commit"):
            continue
        row.update(reconstruct(cell_json, created))
        n += 1
        rel = cell_json.relative_to(ROOT)
        print(f"{rel}: {row['commit'][:10]}" + (" (range)" if "commit_earliest" in row else " (exact)"))
        if not dry_run:
            tmp = cell_json.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(row, indent=2, default=str) + "\n")
            tmp.replace(cell_json)
    return n


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="*", type=Path, default=DEFAULT_RUNS)
    p.add_argument("--dry-run", action="store_true", help="print what would be written, write nothing")
    args = p.parse_args(argv)
    total = sum(backfill(r.resolve(), args.dry_run) for r in args.runs)
    print(f"{total} cell(s) {'would be ' if args.dry_run else ''}backfilled")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
