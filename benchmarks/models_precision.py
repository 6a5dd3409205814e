"""Every Tiny/Small model in every CPU path: fp32/bf16/int8 eager, fp32/bf16/int8 `torch.compile`, fp32/int8 ONNX
Runtime.

A resumable front-end over `subquad bench model --precision fp32,bf16,int8 --backend eager,compile,onnxruntime`
for a sweep that takes hours: each model is measured in its own process into `--parts DIR/<model>.csv` (written
under a temporary name and renamed when the model is done, with `DIR/<model>.json` holding the load average before
and after and the seconds it took), and a model whose part exists is not measured again. When every selected model
has its part, `--out` gets them merged in selection order (an existing file is refused), and `--table` prints the
Markdown table of `docs/benchmarks.md` from such a file: per model and size, fp32 eager latency, each path's
speed-up over it, and the fastest path.

Usage (from the repository root, on a quiet machine: `uptime`):
    python benchmarks/models_precision.py \
        --out benchmarks/results/bench-model-precision-<hw>-pt<torch>.csv     # resumable: run it again
    python benchmarks/models_precision.py --list
    python benchmarks/models_precision.py --table benchmarks/results/bench-model-precision-<hw>-pt<torch>.csv

The selection is `benchmarks/models.py`'s (registered names ending in _tiny/_small and the papers' small sizes),
without timm's baselines; `--model` replaces it. `--img-size` (default 224,512), `--threads`, `--repeats` and
`--warmup` pass through to `subquad bench model`, and so do `--precision` and `--backend` (default: every path) for a
quicker sweep of fewer paths (e.g. `--backend eager` on a new CPU).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from subquad.errors import UserError  # noqa: E402
from subquad_cli.export import DEFAULT_INT8_WEIGHTS  # noqa: E402  (torch-free, equal to subquad.export's)

PRECISIONS = "fp32,bf16,int8"
BACKENDS = "eager,compile,onnxruntime"
PATHS = [("fp32", "compile"), ("bf16", "eager"), ("bf16", "compile"), ("int8", "eager"), ("int8", "compile"),
         ("fp32", "onnxruntime"), ("int8", "onnxruntime")]  # each beside fp32 eager, in this column order
TARGET = 1.5  # the fastest path's speed-up over fp32 eager asked of every model
MAX_DROP = 0.5  # top-1 points the fastest path may lose against fp32 on trained weights
MICRO = {"l2vit_deit_tiny": "l2vit_micro"}  # micro siblings the name rule below does not find
NOISY_SPREAD = 20.0  # percent: a model whose timed steps spread wider is measured once more (the second run stays)


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="benchmarks/results/bench-model-precision-parts",
                   help="folder of the per-model CSVs (resumable; commit each part as it lands)")
    p.add_argument("--out", help="merged CSV, written once every selected model has its part (refused if it exists)")
    p.add_argument("--model", nargs="+", help="models (default: benchmarks/models.py's Tiny/Small selection)")
    p.add_argument("--img-size", default="224,512")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--precision", default=PRECISIONS, help=f"passed to `subquad bench model` (default {PRECISIONS})")
    p.add_argument("--backend", default=BACKENDS,
                   help=f"passed to `subquad bench model` (default {BACKENDS}); the table shows '-' for a path "
                        "not measured")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--list", action="store_true", help="print the selected models and exit")
    p.add_argument("--table", metavar="CSV", help="print the Markdown table of a merged CSV and exit")
    p.add_argument("--accuracy", metavar="CSV", nargs="+",
                   help="with --table: `benchmarks/precision_accuracy.py` CSVs of micro models (a later file's row of "
                        "the same model and path replaces an earlier one); adds the top-1 change of each model's "
                        "fastest path on its micro sibling (same blocks and mechanism)")
    return p.parse_args(argv)


def selected(args: argparse.Namespace) -> list[str]:
    if args.model:
        return [m for arg in args.model for m in arg.split(",") if m]
    from benchmarks.models import BASELINES, selected_models

    return [m for m in selected_models() if m not in BASELINES]


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def max_spread(path: Path) -> float:
    """The widest `time_spread_pct` (interquartile range of the timed steps, in % of their median) of a part's
    measured rows."""
    with open(path, newline="") as f:
        return max((float(r["time_spread_pct"]) for r in csv.DictReader(f)
                    if r["status"] == "ok" and r["time_spread_pct"]), default=0.0)


def measure(model: str, args: argparse.Namespace, parts: Path) -> Path:
    """One model's rows into parts/<model>.csv (skipped when that exists); a failed run leaves no part. A run whose
    steps spread more than NOISY_SPREAD % (something else took the CPU) is repeated once, and the repeat is kept."""
    part = parts / f"{model}.csv"
    if part.exists():
        return part
    tmp, spreads = _run(model, args, parts), []
    spreads.append(max_spread(tmp))
    if spreads[-1] > NOISY_SPREAD:
        print(f"[{model}] steps spread {spreads[-1]:.1f} % > {NOISY_SPREAD} %: measuring it once more", flush=True)
        tmp = _run(model, args, parts)
        spreads.append(max_spread(tmp))
    meta = json.loads((parts / f".{model}.partial.json").read_text())
    meta["max_spread_pct"] = spreads
    (parts / f".{model}.partial.json").write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(parts / f".{model}.partial.json", parts / f"{model}.json")
    os.replace(tmp, part)
    return part


def _run(model: str, args: argparse.Namespace, parts: Path) -> Path:
    """One `subquad bench model` process into parts/.<model>.partial.csv, its load and seconds beside it."""
    tmp = parts / f".{model}.partial.csv"
    tmp.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "subquad_cli", "bench", "model", "--model", model, "--img-size", args.img_size,
           "--precision", args.precision, "--backend", args.backend, "--repeats", str(args.repeats),
           "--warmup", str(args.warmup), "--no-plot", "--out", str(tmp)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    before, t0 = _load(), time.monotonic()
    print(f"[{model}] load {before}: {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    meta = {"model": model, "load_before": before, "load_after": _load(),
            "seconds": round(time.monotonic() - t0, 1), "command": cmd[1:]}
    (parts / f".{model}.partial.json").write_text(json.dumps(meta, indent=1) + "\n")
    return tmp


def merge(parts: list[Path], out: Path) -> Path:
    """The parts' rows, in order, into `out` (written under a temporary name, then renamed)."""
    rows, fields = [], None
    for p in parts:
        with open(p, newline="") as f:
            r = csv.DictReader(f)
            if fields is not None and r.fieldnames != fields:
                raise UserError(f"{p}: its columns differ from {parts[0]}'s; measure both with the same subquad")
            fields = r.fieldnames
            rows += list(r)
    tmp = out.with_name(f".{out.name}.partial")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, out)
    return out


def micro_sibling(model: str, known: set[str]) -> str | None:
    """The micro model sharing `model`'s blocks and mechanism: its name without the size suffix, + '_micro'
    (agent_swin_small -> agent_swin_micro, flatten_pvt_v2_b1 -> flatten_pvt_v2_micro), or MICRO's entry."""
    if model in MICRO:
        return MICRO[model] if MICRO[model] in known else None
    stem = model.rsplit("_", 1)[0]
    return f"{stem}_micro" if f"{stem}_micro" in known else None


def table(path: str | Path, accuracy: str | Path | list[str | Path] | None = None) -> str:
    """Markdown: per (model, size), fp32 eager ms, each path's speed-up over it, the fastest path, whether it
    reaches TARGET, and the widest spread of the timed steps among its paths (`time_spread_pct`: interquartile
    range, % of the median). A path that did not run shows its reason's first words.

    With `accuracy` (precision_accuracy.py CSVs, later ones overriding earlier rows), the fastest path whose top-1
    on the model's micro sibling drops by at most MAX_DROP points (its change beside it) takes the place of the
    fastest path in the TARGET column: a path whose accuracy was not measured does not count."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    deltas: dict[tuple[str, str, str], float] = {}
    if accuracy is not None:
        for acc in [accuracy] if isinstance(accuracy, (str, Path)) else accuracy:
            with open(acc, newline="") as f:
                for r in csv.DictReader(f):
                    # int8 ONNX Runtime rows of another weight scheme than the one `bench model` and `subquad
                    # export` use (older CSVs have no int8_weights column: their files were 8-bit per tensor)
                    if r.get("int8_weights") not in (None, "", DEFAULT_INT8_WEIGHTS):
                        continue
                    if r["top1_delta"]:  # measured: 'ok' or flagged for its drop
                        deltas[(r["model"], r["precision"], r["backend"])] = float(r["top1_delta"])
    known = {m for m, _, _ in deltas}
    groups: dict[tuple[str, str], dict[tuple[str, str], dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["infer_img_size"]), {})[(r["precision"], r["backend"])] = r
    head = ["model", "px", "fp32 eager (ms)"] + [f"{p} {b}" for p, b in PATHS] + ["fastest"]
    if accuracy is not None:
        head += ["fastest keeping top-1 (change on the micro model)", f">= {TARGET}x, drop <= {MAX_DROP}"]
    else:
        head += [f">= {TARGET}x"]
    head += ["spread"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (model, size), by in groups.items():
        base = by.get(("fp32", "eager"), {})
        cells, speed = [], {("fp32", "eager"): 1.0}
        for key in PATHS:
            r = by.get(key, {})
            s = r.get("speedup_vs_fp32_eager", "")
            if s:
                cells.append(f"{float(s):.2f}x")
                speed[key] = float(s)
            else:
                cells.append("-" if not r else (r.get("status", "") or "-").split(":")[0])
        ms = base.get("infer_step_time", "")
        line = [f"`{model}`", size, f"{float(ms):.1f}" if ms else (base.get("status") or "-")] + cells
        best = max(speed, key=speed.get)
        line += [f"{' '.join(best)} ({speed[best]:.2f}x)"]
        ok = speed[best] >= TARGET
        if accuracy is not None:
            micro = micro_sibling(model, known)
            kept = {k: v for k, v in speed.items() if micro and deltas.get((micro, *k), -1e9) >= -MAX_DROP}
            if kept:
                k = max(kept, key=kept.get)
                line += [f"{' '.join(k)} ({kept[k]:.2f}x, {deltas[(micro, *k)]:+.2f} on `{micro}`)"]
            else:
                line += ["- (no micro model measured)" if not micro else "- (every path drops)"]
            ok = bool(kept) and max(kept.values()) >= TARGET
        spread = max((float(r["time_spread_pct"]) for r in by.values() if r.get("time_spread_pct")), default=None)
        line += ["yes" if ok else "**no**", "-" if spread is None else f"{spread:.0f} %"]
        lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.table:
        print(table(args.table, args.accuracy))
        return 0
    models = selected(args)
    if args.list:
        print("\n".join(models))
        return 0
    from subquad.bench.sweep import new_output

    out = new_output(args.out) if args.out else None
    parts = Path(args.parts)
    parts.mkdir(parents=True, exist_ok=True)
    done = [measure(m, args, parts) for m in models]
    print(f"{len(done)} models measured into {parts}")
    if out is not None:
        print(f"wrote {merge(done, out)}")
    return 0


if __name__ == "__main__":
    from subquad.bench.sweep import run_script

    run_script(main, "models_precision")
