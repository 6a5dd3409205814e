"""bf16 eager over fp32 eager per model, timed alternately in one process: a ratio that holds on a noisy machine.

`subquad bench model --precision fp32,bf16` times each path as a block of steps, one after the other; where the
machine's speed drifts between the blocks (a shared host), so does the ratio. Here one fp32 step and one bf16 step
alternate (the order flipping every round) on the same model and input, so drift reaches both sides alike and the
ratio of the medians (`speedup_vs_fp32_eager`) is the path's own.

Sides, all batch 1 and without autograd:
- fp32: plain eager;
- bf16: eager under `torch.autocast("cpu", torch.bfloat16)` held around all the steps under `torch.no_grad()`, as
  `subquad predict`, `eval` and `bench model` hold it: autocast casts each weight once and keeps it (its weight cache);
- bf16_inference_mode: the same steps under `torch.inference_mode()`, where autocast keeps no cast weights (torch
  2.14), so every weight is cast again each step: what a serving loop written with inference_mode pays.
The fp32 steps run in a nested `torch.autocast(enabled=False)` region, which leaves the weight cache intact.

Columns: model, img_size, rounds, fp32_ms, bf16_ms, bf16_inference_mode_ms (medians), speedup_vs_fp32_eager
(fp32_ms / bf16_ms), inference_mode_vs_no_grad (bf16_inference_mode_ms / bf16_ms), rel_diff (relative RMS of the
bf16 logits against fp32), bf16_native (the CPU's bf16 flag, `subquad.backend.cpu_features`), kept_freed_mib,
threads, cpu, cpu_family (from /proc/cpuinfo: AMD family 25 is Zen 3/4, 26 Zen 5), torch.

Usage (from the repository root, on a quiet machine: `uptime`):
    python benchmarks/precision_interleaved.py --out benchmarks/results/precision-interleaved-<hw>/run<n>.csv
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from subquad.errors import UserError  # noqa: E402

COLUMNS = ["model", "img_size", "rounds", "fp32_ms", "bf16_ms", "bf16_inference_mode_ms", "speedup_vs_fp32_eager",
           "inference_mode_vs_no_grad", "rel_diff", "bf16_native", "kept_freed_mib", "threads", "cpu", "cpu_family",
           "torch"]
MODELS = ["lisanet_s", "hylisanet_s", "lisanet_i"]


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="CSV to write (refused if it exists)")
    p.add_argument("--model", nargs="+", default=MODELS, metavar="NAME")
    p.add_argument("--img-size", type=int, nargs="+", default=[224, 512])
    p.add_argument("--rounds", type=int, default=15, help="timed rounds (one step of each side per round)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    return p.parse_args(argv)


def cpu_family() -> str:
    """The 'cpu family' field of /proc/cpuinfo ('' where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("cpu family"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def measure(name: str, img_size: int, rounds: int, warmup: int) -> dict:
    """One model at one size: the three sides timed alternately (see the module docstring)."""
    import subquad

    torch.manual_seed(0)
    net = subquad.create_model(name).eval()
    x = torch.randn(1, 3, img_size, img_size)
    times = {"fp32": [], "bf16": [], "bf16_inference_mode": []}

    def fp32():
        with torch.autocast("cpu", enabled=False):
            return net(x)

    def bf16_inference_mode():
        with torch.inference_mode():
            return net(x)

    sides = {"fp32": fp32, "bf16": lambda: net(x), "bf16_inference_mode": bf16_inference_mode}
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        ref, low = fp32().float(), net(x).float()
        for r in range(warmup + rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for side in order:
                t0 = time.perf_counter()
                sides[side]()
                if r >= warmup:
                    times[side].append((time.perf_counter() - t0) * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    diff = float((low.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))
    return dict(model=name, img_size=img_size, rounds=rounds, fp32_ms=round(med["fp32"], 3),
                bf16_ms=round(med["bf16"], 3), bf16_inference_mode_ms=round(med["bf16_inference_mode"], 3),
                speedup_vs_fp32_eager=round(med["fp32"] / med["bf16"], 3),
                inference_mode_vs_no_grad=round(med["bf16_inference_mode"] / med["bf16"], 3), rel_diff=f"{diff:.2e}")


def main(argv=None) -> int:
    from subquad import backend
    from subquad.bench.sweep import _cpu_name, new_output, write_csv

    args = _args(argv)
    out = new_output(args.out)
    if min(args.rounds, *args.img_size) < 1 or args.warmup < 0 or (args.threads is not None and args.threads < 1):
        raise UserError("--rounds, --img-size and --threads must be positive and --warmup >= 0")
    from subquad.models import list_models  # refuse an unknown name before anything runs

    unknown = [m for m in args.model if m not in list_models()]
    if unknown:
        raise UserError(f"--model: unknown model(s) {', '.join(unknown)} (`subquad list` names them)")
    backend.keep_freed_memory_from_env()  # as the `subquad` command does (SUBQUAD_KEEP_FREED_MIB)
    if args.threads:
        torch.set_num_threads(args.threads)
    env = dict(bf16_native=int(backend.cpu_features().bf16), kept_freed_mib=backend.kept_freed_memory() // 2 ** 20,
               threads=torch.get_num_threads(), cpu=_cpu_name(), cpu_family=cpu_family(), torch=torch.__version__)
    rows = []
    for name in args.model:
        for size in args.img_size:
            row = measure(name, size, args.rounds, args.warmup)
            row.update(env)
            print({k: row[k] for k in ("model", "img_size", "fp32_ms", "bf16_ms", "speedup_vs_fp32_eager",
                                       "inference_mode_vs_no_grad")}, flush=True)
            rows.append(row)
    write_csv(rows, out, COLUMNS)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from subquad.bench.sweep import run_script

    run_script(main, "precision_interleaved")
