"""Calibrate an associative-recall arena task (`recall`, `recall_causal`) on the validation split, before any other
cell runs: the rule and the ladder are the task YAML's `calibration:` entry (subquad/configs/arena/<task>.yaml).

    OMP_NUM_THREADS=1 python benchmarks/recall_calibrate.py --task recall \
        --out benchmarks/results/arena/recall-calibration/attempt2

For each rung (seq_len, kv) of the ladder: the calibration mechanism (softmax) at the task's `default` recipe with
seq_len, kv and batch_size = batch_size x 128 / seq_len, at the calibration lr and seed; the test split is never
scored. Writes OUT/rung-<seq_len>x<kv>.json per finished rung (a rerun skips them: resumable) and OUT/calibration.csv
(one row per rung: best validation query accuracy, its step, CPU seconds, passed) when every rung has finished.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

COLUMNS = ["task", "seq_len", "kv", "batch_size", "steps", "lr", "seed", "best_val_acc", "best_step", "train_cpu_s",
           "threshold", "passed", "commit", "cpu"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", required=True, choices=("recall", "recall_causal"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--rungs", default="", help="only these rungs, e.g. 128x8,256x16 (default: the whole ladder)")
    args = ap.parse_args(argv)

    import torch

    from subquad.arena.recall import cell_config, train_recall
    from subquad.arena.runner import provenance
    from subquad.arena.tasks import load_task
    from subquad.bench.sweep import _cpu_name as cpu_name

    torch.set_num_threads(1)
    out = Path(args.out)
    if (out / "calibration.csv").exists():
        raise SystemExit(f"{out / 'calibration.csv'} exists; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    task = load_task(args.task)
    cal = _calibration(args.task)
    ladder = [tuple(r) for r in cal["ladder"]]
    if args.rungs:
        want = {tuple(int(x) for x in r.split("x")) for r in args.rungs.split(",")}
        ladder = [r for r in ladder if r in want]
    base = task.recipe("default")
    rows = []
    for seq_len, kv in ladder:
        path = out / f"rung-{seq_len}x{kv}.json"
        if not path.is_file():
            train = {**base, "seq_len": seq_len, "kv": kv, "batch_size": base["batch_size"] * 128 // seq_len}
            cfg = cell_config(train, {"attention": cal["mechanism"]})
            t0 = time.perf_counter()

            def log(p: dict, seq_len=seq_len, kv=kv, t0=t0) -> None:
                print(f"[{args.task} {seq_len}x{kv}] step {p['step']}/{p['steps']} val {p['val_acc']:.2f} % "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)

            res = train_recall(cfg, int(cal["seed"]), float(cal["lr"]), log)
            row = {"task": args.task, "seq_len": seq_len, "kv": kv, "batch_size": cfg.batch_size, "steps": cfg.steps,
                   "lr": cal["lr"], "seed": cal["seed"], "best_val_acc": round(res["best_val_acc"], 3),
                   "best_step": res["best_step"], "train_cpu_s": round(res["train_cpu_s"], 1),
                   "threshold": cal["threshold"], "passed": res["best_val_acc"] >= float(cal["threshold"]),
                   "commit": provenance()["commit"], "cpu": cpu_name(), "curve": res["curve"]}
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(row, indent=1) + "\n")
            os.replace(tmp, path)
        rows.append(json.loads(path.read_text()))
    if not args.rungs:
        with open(out / "calibration.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
    for r in rows:
        print(f"{r['seq_len']}x{r['kv']}: best val {r['best_val_acc']:.2f} % at step {r['best_step']} "
              f"({r['train_cpu_s']:.0f} CPU s): {'pass' if r['passed'] else 'fail'}")
    return 0


def _calibration(task: str) -> dict:
    from subquad.arena.tasks import CONFIG_DIR
    from subquad_cli.recipes import load_yaml

    return load_yaml(CONFIG_DIR / f"{task}.yaml")["calibration"]


if __name__ == "__main__":
    sys.exit(main())
