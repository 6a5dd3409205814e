"""Leaderboard, plots and claim checks of an arena run directory.

`leaderboard.csv` has one row per mechanism; its first columns are fixed (LEADERBOARD_COLUMNS): accuracies are the
final test accuracy in percent of the checkpoint validation selected, `std_acc` is the sample standard deviation
over seeds (ddof = 1), `train_per_sec` is training images (or sequences) per second of one thread's CPU time (robust
on a shared machine; `train_per_wall_sec` is the wall-clock figure), `eval_per_sec` the test pass's wall-clock rate,
`peak_mem_mb` the largest growth of a cell's peak RSS, `wall_s` the cells' summed wall time.

A claim (in the task file) says that mechanism `a` beats mechanism `b`. `check_claims` takes the per-seed
differences a - b over the seeds both have (cells of one seed share data order and subset), and a 95 % Student-t
interval of their mean: the claim *holds* when the interval lies above 0, *does not hold* when it lies below 0, and
is *inconclusive* otherwise (or with fewer than two paired seeds).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from ..engine.checkpoint import atomic_write
from ..errors import UserError

__all__ = ["LEADERBOARD_COLUMNS", "write_leaderboard", "read_leaderboard", "leaderboard_markdown", "check_claims",
           "cell_rows"]

LEADERBOARD_COLUMNS = ["task", "attention", "options", "seeds", "n_seeds", "mean_acc", "std_acc", "best_acc",
                       "params", "gmacs", "train_per_sec", "eval_per_sec", "peak_mem_mb", "wall_s", "subquad",
                       "torch"]
EXTRA_COLUMNS = ["mechanism", "status", "reason", "mean_val_acc", "train_per_wall_sec"]


def cell_rows(out: Path) -> list[dict[str, Any]]:
    """Every finished cell's cell.json under `out`."""
    rows = []
    for p in sorted((Path(out) / "cells").glob("*/seed*/cell.json")):
        rows.append(json.loads(p.read_text()))
    return rows


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _std(xs: list[float]) -> float | None:
    if not xs:
        return None
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _r(x: float | None, nd: int) -> Any:
    return "" if x is None else round(float(x), nd)


def write_leaderboard(out: Path, task: Any, labels: list[str], seeds: list[int],
                      skipped: dict[str, str]) -> list[dict[str, Any]]:
    """Aggregate the cells of `labels` over `seeds` into leaderboard.csv (+ the two plots)."""
    import torch

    from ..version import __version__

    by_label: dict[str, list[dict[str, Any]]] = {}
    for r in cell_rows(out):
        if r["attention"] in labels and r["seed"] in seeds:
            by_label.setdefault(r["attention"], []).append(r)
    board = []
    from .tasks import options_text

    for label in labels:
        cells = sorted(by_label.get(label, []), key=lambda r: r["seed"])
        entry = task.mechanism(label)
        accs = [float(c["test_acc"]) for c in cells]
        row = {"task": task.name, "attention": label, "options": options_text(entry, task.name_key),
               "seeds": ";".join(str(c["seed"]) for c in cells), "n_seeds": len(cells),
               "mean_acc": _r(_mean(accs), 3), "std_acc": _r(_std(accs), 3),
               "best_acc": _r(max(accs) if accs else None, 3),
               "params": cells[0]["params"] if cells else "", "gmacs": _r(cells[0]["gmacs"], 6) if cells else "",
               "train_per_sec": _r(_mean([c["train_per_sec"] for c in cells]), 2),
               "eval_per_sec": _r(_mean([c["eval_per_sec"] for c in cells]), 2),
               "peak_mem_mb": _r(max((c["peak_mem_mb"] for c in cells), default=None), 1),
               "wall_s": _r(sum(c["wall_s"] for c in cells) if cells else None, 1),
               "subquad": __version__, "torch": torch.__version__, "mechanism": entry[task.name_key],
               "status": "skipped" if label in skipped else ("ok" if len(cells) == len(seeds) else "incomplete"),
               "reason": skipped.get(label, "" if len(cells) == len(seeds) else
                                     f"{len(cells)} of {len(seeds)} seeds finished"),
               "mean_val_acc": _r(_mean([c["best_val_acc"] for c in cells]), 3),
               "train_per_wall_sec": _r(_mean([c.get("train_per_wall_sec") for c in cells]), 2)}
        board.append(row)

    def _w(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=LEADERBOARD_COLUMNS + EXTRA_COLUMNS)
            w.writeheader()
            w.writerows(board)

    atomic_write(Path(out) / "leaderboard.csv", _w)
    _plots(Path(out), task, board, by_label)
    return board


def _plots(out: Path, task: Any, board: list[dict[str, Any]], by_label: dict[str, list[dict[str, Any]]]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are optional (pip install subquad[plot])
        return
    done = [r for r in board if r["n_seeds"]]
    if not done:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in done:
        ax.errorbar(r["train_per_sec"], r["mean_acc"], yerr=r["std_acc"], fmt="o", capsize=3)
        ax.annotate(r["attention"], (r["train_per_sec"], r["mean_acc"]), textcoords="offset points", xytext=(4, 4),
                    fontsize=7)
    ax.set_xlabel("training throughput (images or sequences per CPU-second, 1 thread)")
    ax.set_ylabel("test accuracy (%), mean ± std over seeds")
    ax.set_title(f"arena {task.name}: accuracy vs training speed", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "leaderboard.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in done:
        curves = [c["curve"] for c in by_label[r["attention"]] if c.get("curve")]
        if not curves:
            continue
        key = "epoch" if "epoch" in curves[0][0] else "step"
        n = min(len(c) for c in curves)
        xs = [curves[0][i][key] for i in range(n)]
        ys = [sum(c[i]["val_acc"] for c in curves) / len(curves) for i in range(n)]
        ax.plot(xs, ys, marker=".", label=r["attention"])
    ax.set_xlabel(key)
    ax.set_ylabel("validation accuracy (%), mean over seeds")
    ax.set_title(f"arena {task.name}: validation curves", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=120)
    plt.close(fig)


def read_leaderboard(out: str | Path) -> list[dict[str, str]]:
    path = Path(out) / "leaderboard.csv"
    if not path.is_file():
        raise UserError(f"{out} holds no leaderboard.csv (run `subquad arena run --out {out}` first)")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    missing = [c for c in LEADERBOARD_COLUMNS if rows and c not in rows[0]]
    if missing:
        raise UserError(f"{path} is not an arena leaderboard (missing {', '.join(missing)})")
    return rows


def leaderboard_markdown(out: str | Path) -> str:
    """The leaderboard as a Markdown table, best mean accuracy first, skipped mechanisms last."""
    rows = read_leaderboard(out)
    rows.sort(key=lambda r: -float(r["mean_acc"]) if r["mean_acc"] else math.inf)
    lines = ["| attention | options | test acc (%) | best | seeds | params | GMACs | train/s | eval/s | peak MiB |"
             " status |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = f"{float(r['mean_acc']):.2f} ± {float(r['std_acc']):.2f}" if r["mean_acc"] else "-"
        best = f"{float(r['best_acc']):.2f}" if r["best_acc"] else "-"
        params = f"{int(r['params']) / 1e6:.3f} M" if r["params"] else "-"
        gm = f"{float(r['gmacs']):.4f}" if r["gmacs"] else "-"
        status = r.get("status", "")
        if r.get("reason"):
            status += f" ({r['reason']})"
        lines.append(f"| `{r['attention']}` | {r['options'] or '-'} | {acc} | {best} | {r['n_seeds']} | {params} | "
                     f"{gm} | {r['train_per_sec'] or '-'} | {r['eval_per_sec'] or '-'} | {r['peak_mem_mb'] or '-'} "
                     f"| {status} |")
    return "\n".join(lines)


def _t975(df: int) -> float:
    from scipy.stats import t

    return float(t.ppf(0.975, df))


def check_claims(out: str | Path, task: Any) -> list[dict[str, Any]]:
    """Each claim of `task` on the cells in `out`: both means, the paired difference, its 95 % interval, a verdict."""
    by: dict[str, dict[int, float]] = {}
    for r in cell_rows(Path(out)):
        by.setdefault(r["attention"], {})[int(r["seed"])] = float(r["test_acc"])
    results = []
    for claim in task.claims:
        a, b = claim["a"], claim["b"]
        common = sorted(set(by.get(a, {})) & set(by.get(b, {})))
        res: dict[str, Any] = {"id": claim.get("id", f"{a} > {b}"), "source": claim.get("source", ""), "a": a,
                               "b": b, "n": len(common), "mean_a": _mean(list(by.get(a, {}).values())),
                               "mean_b": _mean(list(by.get(b, {}).values())), "diff": None, "lo": None, "hi": None}
        if len(common) < 2:
            missing = [x for x in (a, b) if not by.get(x)]
            res["verdict"] = "inconclusive"
            res["why"] = (f"no finished cells for {', '.join(missing)}" if missing else
                          f"{len(common)} paired seed(s); an interval needs 2")
        else:
            d = [by[a][s] - by[b][s] for s in common]
            m, sd = sum(d) / len(d), _std(d)
            half = _t975(len(d) - 1) * sd / math.sqrt(len(d))
            res.update(diff=m, lo=m - half, hi=m + half, why="")
            res["verdict"] = "holds" if m - half > 0 else ("does not hold" if m + half < 0 else "inconclusive")
        results.append(res)
    return results


def claims_text(results: list[dict[str, Any]]) -> str:
    lines = []
    for r in results:
        ma = "-" if r["mean_a"] is None else f"{r['mean_a']:.2f}"
        mb = "-" if r["mean_b"] is None else f"{r['mean_b']:.2f}"
        head = f"{r['source']}: {r['a']} > {r['b']}: {ma} vs {mb}"
        if r["diff"] is None:
            lines.append(f"{head}: {r['verdict']} ({r['why']})")
        else:
            lines.append(f"{head}, diff {r['diff']:+.2f} [95 % CI {r['lo']:+.2f}, {r['hi']:+.2f}] over {r['n']} "
                         f"paired seeds: {r['verdict']}")
    return "\n".join(lines)
