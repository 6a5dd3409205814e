"""Page faults per step against step time, under glibc's malloc settings (why LiSA models are sometimes slow on CPU).

LiSA's FFTs (arXiv 2211.16289, Eq. 13) allocate tens of MiB per step. glibc hands freed memory at the top of the
heap back to the system (and serves the largest buffers with `mmap`), so the next step faults those pages in again.
Whether it does depends on thresholds that glibc adapts as a process runs, which is why one process can be fast
and the next slow. Each configuration below runs in a fresh process with its environment variables set, builds the
model, takes `--warmup` steps and then times `--steps` forward steps, counting the minor page faults the process
took during them (`resource.getrusage`). The config `SUBQUAD_KEEP_FREED_MIB=256` is the library's remedy
(`subquad.backend.keep_freed_memory`, which the `subquad` command applies at start); 'default' leaves glibc as it is.

Columns: model, img_size, precision, config (the environment variables set, 'default' for none), step_ms (median),
minor_faults_per_step, threads, cpu, libc (glibc's version).

Usage (from the repository root, on a quiet machine: `uptime`):
    python benchmarks/page_faults.py --out benchmarks/results/page-faults-<hw>-pt<torch>.csv
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from subquad.errors import UserError  # noqa: E402

COLUMNS = ["model", "img_size", "precision", "config", "step_ms", "minor_faults_per_step", "threads", "cpu", "libc"]
BIG = "4294967296"
CONFIGS = ["default", f"MALLOC_TRIM_THRESHOLD_={BIG}", f"MALLOC_MMAP_THRESHOLD_={BIG}",
           f"MALLOC_MMAP_THRESHOLD_={BIG} MALLOC_TRIM_THRESHOLD_={BIG}", "MALLOC_TOP_PAD_=1073741824",
           "SUBQUAD_KEEP_FREED_MIB=256"]


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="CSV to write (refused if it exists)")
    p.add_argument("--model", nargs="+", default=["lisanet_i"])
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--config", nargs="+", default=CONFIGS,
                   help="'default' or space-separated NAME=VALUE environment settings, one process each")
    p.add_argument("--runs", type=int, default=2, help="fresh processes per (model, precision, config)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    return p.parse_args(argv)


def measure(model: str, img_size: int, precision: str, steps: int, warmup: int, threads: int) -> dict:
    """In this process: median step time and minor page faults per step of `model`'s forward."""
    import resource
    import statistics
    import time

    import torch

    import subquad
    from subquad.backend import keep_freed_memory_from_env

    keep_freed_memory_from_env(default_mib=0)  # config SUBQUAD_KEEP_FREED_MIB=256: what the `subquad` command does
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    net = subquad.create_model(model).eval()
    x = torch.randn(1, 3, img_size, img_size)
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
        for _ in range(warmup):
            net(x)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            net(x)
            times.append((time.perf_counter() - t0) * 1e3)
        f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    return {"step_ms": round(statistics.median(times), 3), "minor_faults_per_step": round((f1 - f0) / steps, 1)}


def _env(config: str) -> dict[str, str]:
    # each config starts from glibc's defaults: no malloc tunables and no SUBQUAD_KEEP_FREED_MIB from the caller
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "SUBQUAD_KEEP_FREED_MIB"}
    if config == "default":
        return env
    for item in config.split():
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise UserError(f"--config {config!r}: expected 'default' or NAME=VALUE settings separated by spaces")
        env[name] = value
    return env


def main(argv=None) -> int:
    import torch

    from subquad.bench.sweep import _cpu_name, write_csv

    args = _args(argv)
    from subquad.bench.sweep import new_output

    out = new_output(args.out)
    if min(args.runs, args.steps, args.img_size) < 1 or args.warmup < 0:
        raise UserError("--runs, --steps and --img-size must be positive and --warmup not negative")
    envs = {c: _env(c) for c in args.config}  # refuse a bad --config before anything runs
    threads = args.threads or torch.get_num_threads()
    rows = []
    for model in args.model:
        for precision in args.precision:
            for config, env in envs.items():
                for _ in range(args.runs):
                    call = json.dumps([model, args.img_size, precision, args.steps, args.warmup, threads])
                    root = str(ROOT)
                    code = (f"import json, sys; sys.path.insert(0, {root!r}); from benchmarks.page_faults import "
                            f"measure; print(json.dumps(measure(*json.loads({call!r}))))")
                    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                         check=True)
                    r = json.loads(res.stdout.strip().splitlines()[-1])
                    r.update(model=model, img_size=args.img_size, precision=precision, config=config,
                             threads=threads, cpu=_cpu_name(), libc=" ".join(platform.libc_ver()))
                    print({k: r[k] for k in ("model", "precision", "config", "step_ms", "minor_faults_per_step")},
                          flush=True)
                    rows.append(r)
    write_csv(rows, out, COLUMNS)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from subquad.bench.sweep import run_script

    run_script(main, "page_faults")
