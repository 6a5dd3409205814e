"""Leaderboard, plots and claim checks of an arena run directory.

`leaderboard.csv` has one row per mechanism; its first columns are fixed (LEADERBOARD_COLUMNS), then EXTRA_COLUMNS.
The score columns hold the task's metric (`metric` column; accuracy in percent unless the task file declares
another, e.g. `metric: {name: bpc, goal: min}` for bits per byte, lower is better), on the test split, measured once
per cell for the checkpoint the validation split selected:

- `mean_acc`, `best_acc`: the mean and the best (by the metric's goal) over seeds; `mean_val_acc`: the mean of the
  best validation scores.
- `std_acc`: the sample standard deviation over seeds (ddof = 1); empty with fewer than 2 seeds, where it is
  undefined.
- `train_per_sec`: training examples (images or sequences) per second of the cell process's CPU time (one thread
  per cell, so robust on a shared machine); `train_per_wall_sec` is the same per wall-clock second.
- `eval_per_sec`: test examples per wall-clock second of the one test pass (the selected checkpoint, no
  gradients, the trainer's evaluation batch size), the same on every task.
- `peak_mem_mb`: on CPU the growth of the cell process's peak resident set size (MiB) from the start of its
  training function (before its data and model are built) to the end of its test pass; on CUDA the largest memory
  allocated by tensors (`torch.cuda.max_memory_allocated`). For a resumed cell, that of its last process.
- `wall_s`: the cells' summed wall time (training, evaluations and the test pass).

A claim (in the task file) says that mechanism `a` beats mechanism `b` (`test: superior`, the default), or that `a`
is not worse than `b` by more than `margin` (`test: noninferior`). `check_claims` takes the per-seed differences
a - b over the seeds both have (cells of one seed share data order and subset), turned to "improvement" units
(negated when lower is better), and a 95 % Student-t interval of their mean: the claim *holds* when the interval
lies above the bound (0, or -margin), *does not hold* when it lies below it, and is *inconclusive* otherwise (or
with fewer than two paired seeds).

Beside each raw verdict stands a Holm-Bonferroni-adjusted one over the task's claims that have >= 2 paired seeds.
Each claim has two one-sided paired t-tests: p_hold (H0: improvement <= bound) and its mirror p_not (H0:
improvement >= bound). A claim's p is 2 * min(p_hold, p_not): each direction is tested at 0.025, so that a raw
verdict is exactly "p < 0.05" and the Holm verdict (family-wise alpha 0.05 over the m claims: the i-th smallest p
is compared with 0.05 / (m - i + 1), stopping at the first that fails) is never more liberal than the raw one. The
Holm-adjusted p is max over j <= i of min(1, (m - j + 1) p_(j)); it reads in the direction of the smaller one-sided
p.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from ..errors import UserError
from ..files import atomic_savefig, atomic_write

__all__ = ["LEADERBOARD_COLUMNS", "write_leaderboard", "read_leaderboard", "leaderboard_markdown", "check_claims",
           "claims_text", "method_text", "check_run_claims", "cell_rows", "replot", "SERIES_STYLES", "HOLM_ALPHA",
           "smoke_note"]

LEADERBOARD_COLUMNS = ["task", "attention", "options", "seeds", "n_seeds", "mean_acc", "std_acc", "best_acc",
                       "params", "gmacs", "train_per_sec", "eval_per_sec", "peak_mem_mb", "wall_s", "subquad",
                       "torch"]
EXTRA_COLUMNS = ["mechanism", "status", "reason", "mean_val_acc", "train_per_wall_sec", "metric"]
# Markdown headings of the kinds' own leaderboard columns (the recall kind's REPORT_COLUMNS).
EXTRA_HEADS = {"mean_acc_inside": "inside", "mean_acc_beyond": "beyond", "mean_acc_len2x": "2x len",
               "mean_acc_len4x": "4x len", "mean_acc_kv2x": "2x kv", "mean_step_ms_train_len": "step ms",
               "mean_step_ms_4096": "step ms 4096", "lr": "lr"}
HOLM_ALPHA = 0.05
SMOKE_LINE = ("**Smoke test** (budget `quick`: a few steps on a tiny subset): these numbers check that the cells "
              "run, and say nothing about the mechanisms.")

# 20 distinct colours (tab10, then the dark and light halves of tab20b / tab20c that differ from it) and 13 markers:
# series i gets colour i % 20 and marker i % 13, so no two of the first 20 series share a colour and no two of the
# first 260 share both.
_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
            "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354",
            "#756bb1", "#636363"]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">", "p", "d"]
SERIES_STYLES = [(_COLOURS[i % len(_COLOURS)], _MARKERS[i % len(_MARKERS)]) for i in range(len(_COLOURS))]


def series_style(i: int) -> tuple[str, str]:
    """(colour, marker) of the i-th series of a plot."""
    return _COLOURS[i % len(_COLOURS)], _MARKERS[i % len(_MARKERS)]


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
    """Sample standard deviation (ddof 1); None with fewer than two values, where it is undefined."""
    if len(xs) < 2:
        return None
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _r(x: float | None, nd: int) -> Any:
    return "" if x is None else round(float(x), nd)


def _run_meta(out: Path) -> dict[str, Any]:
    try:
        return json.loads((Path(out) / "arena.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def stale_note(out: str | Path) -> str | None:
    """A note when finished cells are missing from leaderboard.csv (a run still training, or trained by an older
    runner), since `report` prints the CSV and `check` reads the cells; None when the CSV holds every cell."""
    out = Path(out)
    try:
        rows = read_leaderboard(out)
    except UserError:  # no readable leaderboard: report says so itself
        return None
    listed = {(r["attention"], int(s)) for r in rows for s in (r.get("seeds") or "").split(";") if s.strip()}
    cells = {(c["attention"], int(c["seed"])) for c in cell_rows(out)}
    missing = sorted(cells - listed)
    if not missing:
        return None
    return (f"note: {len(missing)} finished cell(s) are not in leaderboard.csv yet (e.g. {missing[0][0]} seed "
            f"{missing[0][1]}); `subquad arena check` reads them; run the task's `arena run` again (nothing trains "
            "for finished cells) to rebuild the leaderboard")


def smoke_note(out: str | Path, markdown: bool = True) -> str | None:
    """The smoke-test caveat of a `--budget quick` run (None for any other budget): `report` puts it above the
    leaderboard, `check` above the verdicts."""
    if _run_meta(Path(out)).get("budget") != "quick":
        return None
    return SMOKE_LINE if markdown else SMOKE_LINE.replace("**", "")


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

    best = min if task.lower_is_better else max
    from .tasks import kind_module

    extra_keys = list(getattr(kind_module(task.kind), "REPORT_COLUMNS", ()))
    for label in labels:
        cells = sorted(by_label.get(label, []), key=lambda r: r["seed"])
        entry = task.mechanism(label)
        accs = [float(c["test_acc"]) for c in cells]
        row = {"task": task.name, "attention": label, "options": options_text(entry, task.name_key),
               "seeds": ";".join(str(c["seed"]) for c in cells), "n_seeds": len(cells),
               "mean_acc": _r(_mean(accs), 3), "std_acc": _r(_std(accs), 3),
               "best_acc": _r(best(accs) if accs else None, 3),
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
               "train_per_wall_sec": _r(_mean([c.get("train_per_wall_sec") for c in cells]), 2),
               "metric": task.metric["name"]}
        for key in extra_keys:
            row[key] = _r(_mean([c.get(key.removeprefix("mean_")) for c in cells]), 3)
        if "lr" in extra_keys:
            row["lr"] = ";".join(sorted({f"{c['lr']:g}" for c in cells if c.get("lr") is not None}))
        board.append(row)

    def _w(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=LEADERBOARD_COLUMNS + EXTRA_COLUMNS + extra_keys)
            w.writeheader()
            w.writerows(board)

    atomic_write(Path(out) / "leaderboard.csv", _w)
    write_plots(Path(out), task, board, by_label)
    return board


def _metric_label(task: Any) -> str:
    name = task.metric["name"]
    unit = "accuracy (%)" if name == "acc" else name
    return f"test {unit}, {'lower' if task.lower_is_better else 'higher'} is better"


def write_plots(out: Path, task: Any, board: list[dict[str, Any]],
                by_label: dict[str, list[dict[str, Any]]]) -> list[Path]:
    """leaderboard.png (score vs training throughput, mean and std over seeds) and curves.png (validation curves:
    the mean over seeds per epoch, or for step curves one thin line per seed), one colour and marker per mechanism,
    names in a legend (no labels on the points, which overlap), the task's `reference_levels` as dashed lines.
    Returns the files written (none without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are optional (pip install subquad[plot])
        return []
    done = [r for r in board if r["n_seeds"]]
    if not done:
        return []
    styles = {r["attention"]: series_style(i) for i, r in enumerate(done)}
    levels = sorted(getattr(task, "reference_levels", {}).items(), key=lambda kv: kv[1])
    level_styles = ["--", ":", "-.", (0, (5, 1, 1, 1))]

    def draw_levels(ax) -> None:
        for i, (name, value) in enumerate(levels):
            ax.axhline(value, color="0.35", lw=1.0, ls=level_styles[i % len(level_styles)],
                       label=f"{name} ({value:g})", zorder=0)

    def finish(fig, ax, path: Path) -> None:
        n = len(ax.get_legend_handles_labels()[1])
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), ncol=1 if n <= 18 else 2,
                  frameon=False)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        atomic_savefig(fig, path, dpi=120, bbox_inches="tight")
        plt.close(fig)

    written = []
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in done:
        colour, marker = styles[r["attention"]]
        yerr = r["std_acc"] if r["std_acc"] != "" else None
        ax.errorbar(r["train_per_sec"], r["mean_acc"], yerr=yerr, fmt=marker, color=colour, capsize=3, ms=6,
                    label=r["attention"])
    draw_levels(ax)
    ax.set_xlabel("training throughput (examples per CPU-second, 1 thread)")
    ax.set_ylabel(f"{_metric_label(task)}\nmean ± std over seeds")
    ax.set_title(f"arena {task.name}: score vs training speed", fontsize=10)
    finish(fig, ax, out / "leaderboard.png")
    written.append(out / "leaderboard.png")

    fig, ax = plt.subplots(figsize=(8, 4.5))
    key = "step"
    for r in done:
        colour, marker = styles[r["attention"]]
        curves = [c["curve"] for c in sorted(by_label[r["attention"]], key=lambda c: c["seed"]) if c.get("curve")]
        if not curves:
            continue
        key = "epoch" if "epoch" in curves[0][0] else "step"
        if key == "step":  # one thin line per seed: a seed that collapses stays visible
            for j, c in enumerate(curves):
                ax.plot([p[key] for p in c], [p["val_acc"] for p in c], color=colour, marker=marker, ms=3, lw=0.8,
                        alpha=0.85, label=r["attention"] if j == 0 else None)
        else:
            n = min(len(c) for c in curves)
            xs = [curves[0][i][key] for i in range(n)]
            ys = [sum(c[i]["val_acc"] for c in curves) / len(curves) for i in range(n)]
            ax.plot(xs, ys, color=colour, marker=marker, ms=5, lw=1.2, label=r["attention"])
    draw_levels(ax)
    ax.set_xlabel(key)
    name = "accuracy (%)" if task.metric["name"] == "acc" else task.metric["name"]
    ax.set_ylabel(f"validation {name}, " + ("one line per seed" if key == "step" else "mean over seeds"))
    ax.set_title(f"arena {task.name}: validation curves", fontsize=10)
    finish(fig, ax, out / "curves.png")
    written.append(out / "curves.png")
    from .tasks import kind_module

    extra = getattr(kind_module(task.kind), "write_plots", None)
    if extra is not None:
        written += extra(out, task, done, by_label, styles)
    return written


def replot(out: str | Path, task: Any = None) -> list[Path]:
    """Rewrite leaderboard.png and curves.png of the run in `out` from its leaderboard.csv and cells (nothing is
    trained; leaderboard.csv is left as it is). Returns the files written."""
    out = Path(out)
    task = _task_or_none(out, task)
    if task is None:
        raise UserError(f"{out} is not an arena run directory (no arena.json)")

    def num(x: str) -> Any:
        return "" if x in ("", None) else float(x)

    board = [{**r, "n_seeds": int(r["n_seeds"] or 0), "mean_acc": num(r["mean_acc"]), "std_acc": num(r["std_acc"]),
              "train_per_sec": num(r["train_per_sec"])} for r in read_leaderboard(out)]
    labels = {r["attention"] for r in board}
    by_label: dict[str, list[dict[str, Any]]] = {}
    for c in cell_rows(out):
        if c["attention"] in labels:
            by_label.setdefault(c["attention"], []).append(c)
    return write_plots(out, task, board, by_label)


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


def _task_or_none(out: Path, task: Any) -> Any:
    if task is not None:
        return task
    if not (Path(out) / "arena.json").is_file():
        return None
    from .tasks import task_of_run

    return task_of_run(out)


def leaderboard_markdown(out: str | Path, task: Any = None) -> str:
    """The leaderboard as a Markdown table, best mean score first (by the task's metric goal), skipped mechanisms
    last; preceded by a smoke-test line for a `--budget quick` run. `task` defaults to the run's (arena.json)."""
    rows = read_leaderboard(out)
    task = _task_or_none(Path(out), task)
    lower = bool(task is not None and task.lower_is_better)
    metric = task.metric["name"] if task is not None else (rows[0].get("metric") or "acc") if rows else "acc"
    rows.sort(key=lambda r: ((float(r["mean_acc"]) if lower else -float(r["mean_acc"])) if r["mean_acc"]
                             else math.inf))
    col = "test acc (%)" if metric == "acc" else f"test {metric} ({'lower' if lower else 'higher'} is better)"
    lines = []
    if smoke_note(out):
        lines += [SMOKE_LINE, ""]
    # A kind's own columns (the recall tasks' accuracy by distance, length and kv, step times, learning rate).
    extra = [k for k in (rows[0] if rows else {}) if k not in LEADERBOARD_COLUMNS + EXTRA_COLUMNS]
    heads = [EXTRA_HEADS.get(k, k) for k in extra]
    lines += [f"| attention | options | {col} | best | seeds | params | GMACs | train/s | eval/s | peak MiB | "
              + "".join(f"{h} | " for h in heads) + "status |",
              "|---" * (11 + len(extra)) + "|"]
    for r in rows:
        if not r["mean_acc"]:
            acc = "-"
        elif r["std_acc"] != "" and int(r["n_seeds"] or 0) >= 2:
            acc = f"{float(r['mean_acc']):.2f} ± {float(r['std_acc']):.2f}"
        else:
            acc = f"{float(r['mean_acc']):.2f}"
        best = f"{float(r['best_acc']):.2f}" if r["best_acc"] else "-"
        params = f"{int(r['params']) / 1e6:.3f} M" if r["params"] else "-"
        gm = f"{float(r['gmacs']):.4f}" if r["gmacs"] else "-"
        status = r.get("status", "")
        if r.get("reason"):
            status += f" ({r['reason']})"
        lines.append(f"| `{r['attention']}` | {r['options'] or '-'} | {acc} | {best} | {r['n_seeds']} | {params} | "
                     f"{gm} | {_cell(r['train_per_sec'])} | {_cell(r['eval_per_sec'])} | {_cell(r['peak_mem_mb'])} | "
                     + "".join(f"{_cell(r.get(k, ''), None if k == 'lr' else 2)} | " for k in extra) + f"{status} |")
    return "\n".join(lines)


def _cell(v: str, nd: int | None = None) -> str:
    """A CSV value for the Markdown table: '-' where it is empty or not measured (nan), else as written, or
    rounded to `nd` decimals where it is a number."""
    if v in ("", None) or v.lower() == "nan":
        return "-"
    if nd is None:
        return v
    try:
        return f"{float(v):.{nd}f}"
    except ValueError:
        return v


def _t975(df: int) -> float:
    from scipy.stats import t

    return float(t.ppf(0.975, df))


def _one_sided(m: float, sd: float, n: int, bound: float) -> tuple[float, float]:
    """(p_hold, p_not): paired one-sided t-tests of H0 mean <= bound and of its mirror H0 mean >= bound."""
    if sd == 0:
        if m == bound:
            return 0.5, 0.5
        return (0.0, 1.0) if m > bound else (1.0, 0.0)
    from scipy.stats import t

    stat = (m - bound) / (sd / math.sqrt(n))
    return float(t.sf(stat, n - 1)), float(t.cdf(stat, n - 1))


def holm(ps: list[float], alpha: float = HOLM_ALPHA) -> tuple[list[float], list[bool]]:
    """Holm-Bonferroni step-down over `ps`: the adjusted p-values and which hypotheses are rejected at `alpha`."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    adj = [1.0] * m
    rejected = [False] * m
    running, stop = 0.0, False
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adj[i] = running
        if not stop and ps[i] < alpha / (m - rank):
            rejected[i] = True
        else:
            stop = True
    return adj, rejected


def check_claims(out: str | Path, task: Any) -> list[dict[str, Any]]:
    """Each claim of `task` on the cells in `out`: both means, the paired difference a - b with its 95 % interval,
    the raw verdict, the one-sided p-values and the Holm-adjusted verdict (see the module docstring)."""
    rows = cell_rows(Path(out))
    sign = -1.0 if getattr(task, "lower_is_better", False) else 1.0
    results = []
    for claim in task.claims:
        a, b = claim["a"], claim["b"]
        score = claim.get("score", "test_acc")
        by: dict[str, dict[int, float]] = {}
        for r in rows:
            if r.get(score) is not None:
                by.setdefault(r["attention"], {})[int(r["seed"])] = float(r[score])
        test = claim.get("test", "superior")
        margin = float(claim.get("margin", 0.0)) if test == "noninferior" else 0.0
        common = sorted(set(by.get(a, {})) & set(by.get(b, {})))
        res: dict[str, Any] = {"id": claim.get("id", f"{a} vs {b}"), "source": claim.get("source", ""), "a": a,
                               "b": b, "score": score, "test": test, "margin": margin, "lower_is_better": sign < 0,
                               "metric": (getattr(task, "metric", None) or {}).get("name", "acc"),
                               "n": len(common), "mean_a": _mean(list(by.get(a, {}).values())),
                               "mean_b": _mean(list(by.get(b, {}).values())), "diff": None, "lo": None, "hi": None,
                               "p_hold": None, "p_not": None, "p": None, "p_holm": None}
        if len(common) < 2:
            missing = [x for x in (a, b) if not by.get(x)]
            res["verdict"] = res["verdict_holm"] = "inconclusive"
            res["why"] = (f"no finished cells for {', '.join(missing)}" if missing else
                          f"{len(common)} paired seed(s); an interval needs 2")
        else:
            # Improvement of a over b in the metric's direction; the claim's bound is -margin (0 for superior).
            d = [sign * (by[a][s] - by[b][s]) for s in common]
            m, sd = sum(d) / len(d), _std(d)
            half = _t975(len(d) - 1) * sd / math.sqrt(len(d))
            lo, hi = m - half, m + half
            raw = (lo, hi) if sign > 0 else (-hi, -lo)  # the interval of a - b itself
            res.update(diff=sign * m, lo=raw[0], hi=raw[1], why="")
            res["verdict"] = "holds" if lo > -margin else ("does not hold" if hi < -margin else "inconclusive")
            p_hold, p_not = _one_sided(m, sd, len(d), -margin)
            res.update(p_hold=p_hold, p_not=p_not, p=min(1.0, 2 * min(p_hold, p_not)))
        results.append(res)
    tested = [r for r in results if r["p"] is not None]
    adj, rejected = holm([r["p"] for r in tested])
    for r, pa, rej in zip(tested, adj, rejected, strict=True):
        r["p_holm"] = pa
        r["n_holm"] = len(tested)
        r["verdict_holm"] = ("holds" if r["p_hold"] <= r["p_not"] else "does not hold") if rej else "inconclusive"
    return results


def _claim_head(r: dict[str, Any]) -> str:
    lt = r.get("lower_is_better")
    if r.get("test") == "noninferior":
        rel = f"{r['a']} <= {r['b']} + {r['margin']:g}" if lt else f"{r['a']} >= {r['b']} - {r['margin']:g}"
    else:
        rel = f"{r['a']} < {r['b']}" if lt else f"{r['a']} > {r['b']}"
    from .tasks import metric_text

    metric = r.get("metric", "acc")
    on = "" if r.get("score", "test_acc") == "test_acc" else f" on {r['score']}"
    return (f"{r['source']}: {rel}{on}: {metric_text(r['mean_a'], metric)} vs "
            f"{metric_text(r['mean_b'], metric)}")


def claims_text(results: list[dict[str, Any]]) -> str:
    """One line per claim: both means, a - b with its 95 % interval, the raw verdict and the Holm-adjusted one."""
    lines = []
    for r in results:
        head = _claim_head(r)
        if r["diff"] is None:
            lines.append(f"{head}: {r['verdict']} ({r['why']})")
        else:
            lines.append(f"{head}, diff {r['diff']:+.2f} [95 % CI {r['lo']:+.2f}, {r['hi']:+.2f}] over {r['n']} "
                         f"paired seeds: {r['verdict']}; Holm: {r['verdict_holm']} (p {r['p']:.3g}, adjusted "
                         f"{r['p_holm']:.3g})")
    return "\n".join(lines)


def method_text(results: list[dict[str, Any]]) -> str:
    """The line `arena check` prints first: which test the verdicts come from."""
    n = sum(r["p"] is not None for r in results)
    return (f"test: paired t over seeds, one-sided (0.025 each direction, the 95 % interval), Holm over {n} claims "
            f"with >= 2 paired seeds at family-wise alpha {HOLM_ALPHA:g}")


def check_run_claims(out: str | Path, task: Any) -> str | None:
    """Refuse (UserError) a task whose claims (or metric) differ from those the run in `out` was started with, as
    recorded in its fingerprint; returns a note when the run's fingerprint predates recorded claims, else None."""
    meta = _run_meta(Path(out))
    try:
        recorded = json.loads(meta.get("fingerprint") or "")
    except (TypeError, json.JSONDecodeError):
        recorded = None
    if not isinstance(recorded, dict) or "claims" not in recorded:
        return (f"note: {Path(out) / 'arena.json'} predates recorded claims; the task file's claims are checked "
                "as they are now")
    now = json.loads(task.fingerprint(meta.get("budget", "default")))
    if recorded["claims"] != now["claims"] or recorded.get("metric") != now.get("metric"):
        raise UserError(f"{out}: the claims (or metric) of task {task.name!r} differ from those this run was "
                        "started with (they are fixed before a run); check it with the task file it was started "
                        "with, or start another --out")
    return None
