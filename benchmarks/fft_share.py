"""How much of a LiSA model's CPU step is its FFTs, and what that bounds for the bf16 path (Amdahl).

LiSA's structure-aware attention (arXiv 2211.16289, Eq. 13) evaluates its correlations with FFTs over the token
grid. torch's CPU FFTs run in fp32 or fp64 only (there is no bf16 kernel), so under bf16 autocast they stay fp32
while the projections, MLPs and convolutions run in bf16. If the FFTs take `fft_ms` of a step, no precision change
of the rest can make the step shorter than `fft_ms`: `bound_vs_fp32_eager` = fp32 eager step / fft_ms. For the
1.5x asked of every model the rest of the step has to shrink by `rest_speedup_needed`, against `rest_speedup_bf16`
measured under bf16 autocast in the same process.

Shares come from torch's profiler (self CPU time of the aten::_fft_* ops over the profiled steps); steps are timed
without the profiler: `--rounds` steps of fp32, then of bf16 (a model per precision).

Columns: model, img_size, fp32_ms, bf16_ms (medians over the timed steps), fft_ms_fp32 / fft_ms_bf16 (FFT time per step,
profiled, scaled to the unprofiled step), fft_share_fp32, bound_vs_fp32_eager, rest_speedup_bf16,
rest_speedup_needed (for 1.5x over fp32 eager, with the FFTs at their fp32 time; 'inf' when the FFTs alone exceed
fp32_ms / 1.5; rest_speedup_bf16 uses the FFT time measured under bf16), dft_fp32_ms and
dft_vs_fft_fp32 (the fp32 step in the real-DFT form that ONNX exports run, `subquad.backend.real_dft`, and its ratio
to the FFT form's), bf16_fft (whether
torch.fft accepts a bf16 tensor on this CPU), threads, cpu.

Usage (from the repository root, on a quiet machine: `uptime`):
    python benchmarks/fft_share.py --out benchmarks/results/fft-share-<hw>-pt<torch>.csv
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

COLUMNS = ["model", "img_size", "fp32_ms", "bf16_ms", "fft_ms_fp32", "fft_ms_bf16", "fft_share_fp32",
           "bound_vs_fp32_eager", "rest_speedup_bf16", "rest_speedup_needed", "dft_fp32_ms", "dft_vs_fft_fp32",
           "bf16_fft", "threads", "cpu"]
TARGET = 1.5


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="CSV to write (refused if it exists)")
    p.add_argument("--model", nargs="+", default=["lisanet_i", "lisanet_s", "hylisanet_s"])
    p.add_argument("--img-size", type=int, nargs="+", default=[224, 512])
    p.add_argument("--rounds", type=int, default=9, help="timed steps per precision")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    return p.parse_args(argv)


def bf16_fft_supported() -> bool:
    """Whether torch.fft runs on a bf16 CPU tensor (it raises where no kernel exists)."""
    try:
        torch.fft.fft(torch.ones(8, dtype=torch.bfloat16))
    except RuntimeError:
        return False
    return True


def _step(model, x, bf16: bool):
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        model(x)


def fft_fraction(model, x, bf16: bool, steps: int = 2) -> float:
    """The profiled share of the step's self CPU time spent in aten::_fft_* ops."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            _step(model, x, bf16)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    fft = sum(e.self_cpu_time_total for e in events if e.key.startswith("aten::_fft_"))
    return fft / total if total else 0.0


def row(name: str, size: int, rounds: int) -> dict:
    import subquad
    from subquad.backend import real_dft

    torch.manual_seed(0)
    # One precision after the other, each on its own copy of the model, as a user runs them (in one trial,
    # alternating fp32 and bf16 step by step took lisanet_i's fp32 step at 224 px from about 107 to 286 ms).
    x = torch.randn(1, 3, size, size)
    models, times = {}, {}
    for bf16 in (False, True):
        models[bf16] = subquad.create_model(name).eval()
        for _ in range(2):  # warm-up: caches, allocator
            _step(models[bf16], x, bf16)
        times[bf16] = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            _step(models[bf16], x, bf16)
            times[bf16].append((time.perf_counter() - t0) * 1e3)
    fp32_ms, bf16_ms = statistics.median(times[False]), statistics.median(times[True])
    # The real-DFT form the ONNX export runs (no complex tensors there), in torch fp32 on the fp32 copy.
    with real_dft():
        _step(models[False], x, False)
        dft = []
        for _ in range(max(1, rounds // 3)):
            t0 = time.perf_counter()
            _step(models[False], x, False)
            dft.append((time.perf_counter() - t0) * 1e3)
    dft_ms = statistics.median(dft)
    fft32 = fft_fraction(models[False], x, False) * fp32_ms
    fft16 = fft_fraction(models[True], x, True) * bf16_ms
    return {"model": name, "img_size": size, **bounds(fp32_ms, bf16_ms, fft32, fft16),
            "dft_fp32_ms": round(dft_ms, 3), "dft_vs_fft_fp32": round(dft_ms / fp32_ms, 3)}


def bounds(fp32_ms: float, bf16_ms: float, fft32: float, fft16: float) -> dict:
    """The step times, the FFT times in each precision and what they bound (the CSV's columns from fp32_ms to
    rest_speedup_needed)."""
    budget = fp32_ms / TARGET - fft32  # what the rest may take for TARGET, with the FFTs as they are in fp32
    return {"fp32_ms": round(fp32_ms, 3), "bf16_ms": round(bf16_ms, 3),
            "fft_ms_fp32": round(fft32, 3), "fft_ms_bf16": round(fft16, 3),
            "fft_share_fp32": round(fft32 / fp32_ms, 4),
            "bound_vs_fp32_eager": round(fp32_ms / fft32, 3) if fft32 else "inf",
            "rest_speedup_bf16": round((fp32_ms - fft32) / (bf16_ms - fft16), 3) if bf16_ms > fft16 else "inf",
            "rest_speedup_needed": round((fp32_ms - fft32) / budget, 3) if budget > 0 else "inf"}


def main(argv=None) -> int:
    from subquad.bench.sweep import _cpu_name, write_csv

    args = _args(argv)
    from subquad.bench.sweep import new_output

    out = new_output(args.out)
    if args.rounds < 1 or any(s < 1 for s in args.img_size):
        raise UserError(f"--rounds and --img-size must be positive, got {args.rounds} and {args.img_size}")
    args.threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(args.threads)
    bf16_fft = bf16_fft_supported()
    rows = []
    for name in args.model:
        for size in args.img_size:
            r = row(name, size, args.rounds)
            r.update(bf16_fft=int(bf16_fft), threads=args.threads, cpu=_cpu_name())
            print({k: r[k] for k in ("model", "img_size", "fft_share_fp32", "bound_vs_fp32_eager",
                                     "rest_speedup_bf16", "rest_speedup_needed")}, flush=True)
            rows.append(r)
    write_csv(rows, out, COLUMNS)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from subquad.bench.sweep import run_script

    run_script(main, "fft_share")
