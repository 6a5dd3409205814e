"""Calibrate the arena task `charlm` on the valid split only, before any other mechanism trains.

The rule written in subquad/configs/arena/charlm.yaml: train softmax at the task's 1,024-token context and softmax at
a 128-token context (`softmax_ctx128`), seed 0, with the task's `default` budget; the test split is never scored
(LMConfig.final_test=False). The calibration passes when softmax's valid bpc is lower than softmax_ctx128's by at
least --min-gap (registered before the runs: 0.03 bpc, 1.5x the non-inferiority margin of the task's claims).

    python benchmarks/charlm_calibrate.py --out benchmarks/results/arena/charlm-calibration [--override k=v ...]

Writes OUT/<mechanism>/ (train_lm's run folder) and OUT/calibration.csv (one row per mechanism: valid bpc of the
checkpoint selected by the periodic valid evaluations, on `final_eval_tokens` valid targets). Refuses an existing
OUT/calibration.csv; a killed run restarts its unfinished mechanism from scratch.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path

MECHS = ("softmax", "softmax_ctx128")


def _parse_override(text: str) -> tuple[str, object]:
    import yaml

    key, sep, value = text.partition("=")
    if not sep:
        raise SystemExit(f"--override takes key=value, got {text!r}")
    return key, yaml.safe_load(value)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--data-root", default=None, help="where the byte corpus is built or found (default: OUT/data)")
    ap.add_argument("--min-gap", type=float, default=0.03)
    ap.add_argument("--override", action="append", default=[], help="train setting key=value (a recalibration)")
    ap.add_argument("--mechanisms", default=",".join(MECHS),
                    help="train only these (comma-separated; two processes can share one --out); the verdict is "
                         "written when both have finished")
    args = ap.parse_args(argv)

    from subquad.arena.lm import cell_config, prepare_data
    from subquad.arena.tasks import load_task
    from subquad.engine.sequence import train_lm

    out = Path(args.out)
    if (out / "calibration.csv").exists():
        raise SystemExit(f"{out / 'calibration.csv'} exists; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    task = load_task("charlm")
    train = task.recipe("default")
    train.update(dict(_parse_override(o) for o in args.override))
    train["data"] = os.fspath(prepare_data(task.as_dict(), args.data_root or out / "data", "default"))
    rows = []
    wanted = [m.strip() for m in args.mechanisms.split(",") if m.strip()]
    if not set(wanted) <= set(MECHS):
        raise SystemExit(f"--mechanisms takes {', '.join(MECHS)}, got {args.mechanisms!r}")
    for name in MECHS:
        if name not in wanted and not (out / name / "results.json").is_file():
            continue
        cell = out / name
        cfg = cell_config(train, task.mechanism(name), 0, os.fspath(cell))
        cfg = dataclasses.replace(cfg, final_test=False)
        if not (cell / "results.json").is_file():
            if cell.exists():
                shutil.rmtree(cell)
            t0 = time.time()
            train_lm(cfg, log=lambda s, n=name: print(f"[{n}] {s}", flush=True))
            print(f"[{name}] {time.time() - t0:.0f} s", flush=True)
        res = json.loads((cell / "results.json").read_text())
        rows.append({"mechanism": name, "context": cfg.seq_len, "valid_bpc": res["valid_bpc"],
                     "best_step": res["best_step"], "steps": res["steps"], "params": res["params"],
                     "train_cpu_seconds": res["train_cpu_seconds"], "overrides": " ".join(args.override)})
    if len(rows) < len(MECHS):
        print(f"trained {', '.join(r['mechanism'] for r in rows)}; the verdict needs both", flush=True)
        return 0
    gap = rows[1]["valid_bpc"] - rows[0]["valid_bpc"]
    for r in rows:
        r["gap_ctx128_minus_softmax"] = gap
        r["passes"] = gap >= args.min_gap
    tmp = out / "calibration.csv.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, out / "calibration.csv")
    print(f"softmax {rows[0]['valid_bpc']:.4f}  softmax_ctx128 {rows[1]['valid_bpc']:.4f}  gap {gap:.4f}  "
          f"{'PASSES' if gap >= args.min_gap else 'FAILS'} (min gap {args.min_gap})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
