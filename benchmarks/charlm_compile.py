"""Does `torch.compile` make a charlm arena cell cheaper? One training step (forward, backward, AdamW) of the task's
host at its context, eager against compiled, side by side in one process per mechanism.

    OMP_NUM_THREADS=1 python benchmarks/charlm_compile.py --out benchmarks/results/charlm_compile.csv \
        softmax long_short sliding_window linear_elu1

Host and options: `subquad/configs/arena/charlm.yaml` (default budget: d 64, 2 layers, batch 8 x 1,024 tokens) and
each mechanism's `attn_kw` there; softmax with rotary positions as in the calibration attempts 3-4. Random bytes:
the cost of a step does not depend on the text. Columns: `mechanism, eager_sec_per_step, compiled_sec_per_step,
ratio_compiled_over_eager, compile_seconds, steps, threads`; times are the median of `--steps` steps after
`--warmup` untimed ones (the first compiled calls, which compile, are timed separately as `compile_seconds`).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

MECH_KW = {"softmax": {"rope": True},
           "long_short": {"window_size": 128, "chunk_size": 16, "rank": 1},
           "sliding_window": {"window_size": 128},
           "linear_elu1": {}}


def _steps(step, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        out.append(time.perf_counter() - t0)
    return out


def one(mech: str, steps: int, warmup: int) -> dict:
    from subquad.arena.tasks import load_task
    from subquad.engine.sequence import LMConfig, build_lm

    train = load_task("charlm").recipe("default")
    cfg = LMConfig(attention=mech, attn_kw={mech: MECH_KW[mech]}, dim=train["dim"], depth=train["depth"],
                   num_heads=train["num_heads"], ffn_dim=train["ffn_dim"], dropout=0.0, residual=train["residual"],
                   seq_len=train["seq_len"])
    B, T = train["batch_size"], train["seq_len"]
    result = {"mechanism": mech, "steps": steps, "threads": torch.get_num_threads()}
    for mode in ("eager", "compiled"):
        torch.manual_seed(0)
        model = build_lm(256, cfg)
        opt = torch.optim.AdamW(model.parameters(), 2e-3)
        fwd = torch.compile(model) if mode == "compiled" else model
        x = torch.randint(0, 256, (B, T + 1))

        def step(fwd=fwd, x=x, opt=opt):
            loss = torch.nn.functional.cross_entropy(fwd(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        t0 = time.perf_counter()
        _steps(step, warmup)
        if mode == "compiled":
            result["compile_seconds"] = round(time.perf_counter() - t0, 1)
        result[f"{mode}_sec_per_step"] = round(statistics.median(_steps(step, steps)), 4)
    result["ratio_compiled_over_eager"] = round(result["compiled_sec_per_step"] / result["eager_sec_per_step"], 3)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mechanisms", nargs="+", choices=sorted(MECH_KW))
    ap.add_argument("--out", required=True, help="CSV to write (refused if it exists)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(one(args.mechanisms[0], args.steps, args.warmup)))
        return 0
    out = Path(args.out)
    if out.exists():
        raise SystemExit(f"{out} exists; choose another --out")
    rows = []
    for mech in args.mechanisms:  # one process each: a compiled model's caches do not leak into the next
        res = subprocess.run([sys.executable, __file__, mech, "--out", os.devnull, "--child", "--steps",
                              str(args.steps), "--warmup", str(args.warmup)], check=True, capture_output=True,
                             text=True)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["mechanism", "eager_sec_per_step", "compiled_sec_per_step",
                                          "ratio_compiled_over_eager", "compile_seconds", "steps", "threads"])
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
