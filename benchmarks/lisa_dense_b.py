"""LiSA's kernel path on the CPU: FFT correlations against the dense product A-hat V, per grid and per whole model.

`lisa_fft` (arXiv 2211.16289, Eq. 13) computes both of Eq. 10's correlations with FFTs. Without autograd on the
CPU it computes the second one (the kernel path, Y = sum_d S_d (kernel_b[d] * V)) as the dense product of Eq. 10
instead when the grid is small: A-hat = S kernel_b read at each (query, key) offset, then A-hat V
(`subquad.attention.functional.structure_aware.DENSE_B_TOKENS_PER_PATTERN`). This script measures both sides of
that choice, in one process, timed interleaved (the order alternates each round), medians:

- `--grids` rows (kind `grid`): one `lisa_fft` call without autograd at batch 1 with `--heads`, `--head-dim`,
  `--patterns` (default: `lisanet_s`'s stage shapes), `dense_b=False` against `dense_b=True`;
- `--models` rows (kind `model`): a whole forward step of each model in fp32 and under bf16 autocast, with the
  dense path at its default limit against the limit set to 0 (FFT everywhere).

Columns: kind, name (grid `HxW` or model), img_size, precision, heads, head_dim, patterns, tokens, fft_ms,
dense_ms, dense_vs_fft (fft_ms / dense_ms: above 1 the dense path is faster), rel_diff (relative RMS difference of
the two outputs), kept_freed_mib, threads, cpu, torch.

Usage (from the repository root, on a quiet machine: `uptime`):
    python benchmarks/lisa_dense_b.py --out benchmarks/results/lisa-dense-b/run<n>.csv
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from subquad.errors import UserError  # noqa: E402

COLUMNS = ["kind", "name", "img_size", "precision", "heads", "head_dim", "patterns", "tokens", "fft_ms", "dense_ms",
           "dense_vs_fft", "rel_diff", "kept_freed_mib", "threads", "cpu", "torch"]
GRIDS = ["7x7", "14x14", "16x16", "20x20", "28x28"]
MODELS = ["lisanet_s", "hylisanet_s", "lisanet_i"]


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="CSV to write (refused if it exists)")
    p.add_argument("--grids", nargs="*", default=GRIDS, metavar="HxW", help="grids of the per-call rows")
    p.add_argument("--heads", type=int, default=5)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--patterns", type=int, default=8, help="structural patterns D")
    p.add_argument("--models", nargs="*", default=MODELS, metavar="NAME", help="models of the whole-step rows")
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=9, help="timed rounds per side (interleaved)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    return p.parse_args(argv)


def _grid(text: str) -> tuple[int, int]:
    h, sep, w = text.partition("x")
    if not (sep and h.isdigit() and w.isdigit() and int(h) > 0 and int(w) > 0):
        raise UserError(f"--grids: {text!r} is not HxW with positive H and W")
    return int(h), int(w)


def _median_ms(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _interleaved(a, b, rounds: int) -> tuple[float, float]:
    """Median ms of a() and b(), one call each per round, the order alternating, after one warm-up call each."""
    a(), b()
    ta, tb = [], []
    for r in range(rounds):
        for fn, acc in ((a, ta), (b, tb)) if r % 2 == 0 else ((b, tb), (a, ta)):
            t0 = time.perf_counter()
            fn()
            acc.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ta), statistics.median(tb)


def _rel(x: torch.Tensor, y: torch.Tensor) -> float:
    return float((x.double() - y.double()).norm() / y.double().norm().clamp_min(1e-30))


def grid_row(grid: tuple[int, int], heads: int, head_dim: int, D: int, rounds: int) -> dict:
    from subquad.attention.functional.structure_aware import kernel_spectra, lisa_fft

    g = torch.Generator().manual_seed(0)
    N, C = math.prod(grid), heads * head_dim
    q, k, v = (torch.nn.functional.normalize(torch.randn(1, heads, N, head_dim, generator=g), dim=-1)
               for _ in range(3))
    ka, kb = torch.randn(C, D, *grid, generator=g) * 0.1, torch.randn(heads, D, *grid, generator=g) * 0.1
    sp = torch.randn(C, D, generator=g)
    spectra = kernel_spectra(ka, kb, grid)
    with torch.no_grad():
        def run(dense):
            return lambda: lisa_fft(q, k, v, ka, kb, sp, grid, spectra=spectra, dense_b=dense)
        fft_ms, dense_ms = _interleaved(run(False), run(True), rounds)
        diff = _rel(run(True)(), run(False)())
    return dict(kind="grid", name=f"{grid[0]}x{grid[1]}", heads=heads, head_dim=head_dim, patterns=D, tokens=N,
                fft_ms=round(fft_ms, 4), dense_ms=round(dense_ms, 4), rel_diff=f"{diff:.2e}")


def model_rows(name: str, img_size: int, rounds: int) -> list[dict]:
    import subquad
    from subquad.attention.functional import structure_aware as fsa

    default = fsa.DENSE_B_TOKENS_PER_PATTERN
    torch.manual_seed(0)
    net = subquad.create_model(name).eval()
    x = torch.randn(1, 3, img_size, img_size)
    rows = []
    for precision in ("fp32", "bf16"):
        def step(limit, precision=precision):
            def run():
                fsa.DENSE_B_TOKENS_PER_PATTERN = limit
                with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
                    return net(x)
            return run
        try:
            fft_ms, dense_ms = _interleaved(step(0), step(default), rounds)
            diff = _rel(step(default)(), step(0)())
        finally:
            fsa.DENSE_B_TOKENS_PER_PATTERN = default
        rows.append(dict(kind="model", name=name, img_size=img_size, precision=precision, fft_ms=round(fft_ms, 3),
                         dense_ms=round(dense_ms, 3), rel_diff=f"{diff:.2e}"))
    return rows


def main(argv=None) -> int:
    from subquad.backend import keep_freed_memory_from_env, kept_freed_memory
    from subquad.bench.sweep import _cpu_name, new_output, write_csv

    args = _args(argv)
    out = new_output(args.out)
    if min(args.rounds, args.heads, args.head_dim, args.patterns, args.img_size) < 1 or (
            args.threads is not None and args.threads < 1):
        raise UserError("--rounds, --heads, --head-dim, --patterns, --img-size and --threads must be positive")
    grids = [_grid(g) for g in args.grids]  # refuse a bad grid before anything runs
    keep_freed_memory_from_env()  # as the `subquad` command does (SUBQUAD_KEEP_FREED_MIB)
    if args.threads:
        torch.set_num_threads(args.threads)
    env = dict(kept_freed_mib=kept_freed_memory() // 2 ** 20, threads=torch.get_num_threads(), cpu=_cpu_name(),
               torch=torch.__version__)
    rows = [grid_row(g, args.heads, args.head_dim, args.patterns, args.rounds) for g in grids]
    for name in args.models:
        rows += model_rows(name, args.img_size, args.rounds)
    for r in rows:
        r.update(env, dense_vs_fft=round(r["fft_ms"] / r["dense_ms"], 3))
        print({k: r.get(k) for k in ("kind", "name", "precision", "fft_ms", "dense_ms", "dense_vs_fft")}, flush=True)
    write_csv(rows, out, COLUMNS)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from subquad.bench.sweep import run_script

    run_script(main, "lisa_dense_b")
