"""LiSA's inverse transforms on the CPU: fp32 complex FFTs (what `lisa_fft` runs) against the same 2-D inverse DFT
as two bf16 GEMMs (an alternative that was measured and not adopted; see docs/benchmarks.md).

LiSA's correlations (arXiv 2211.16289, Eq. 13) end in batched 2-D inverse FFTs over the token grid, `transforms`
of them per call (one per channel and pattern pair). torch has no bf16 FFT on the CPU, so under bf16 autocast they
stay fp32. A 2-D inverse DFT can also run as matrix products, one grid axis at a time, in bf16 where bf16 GEMMs are
native. This script times, per (grid, transforms):
- `fft_ms`: `torch.fft.ifftn` of a complex64 tensor (a new output per call, as in `lisa_fft`);
- `gemm_bf16_ms` / `gemm_fp32_ms`: the GEMM form from the same complex64 spectrum: rounding to the dtype, the
  W-axis product (rows of interleaved (re, im) pairs times a (2W, 2W) real matrix), a transposed copy, the H-axis
  product; every buffer preallocated (no page faults counted against it);
- `gemm_bf16_vs_fft` = fft_ms / gemm_bf16_ms (above 1: the GEMM form is faster), and `bf16_rel_err`, the relative
  RMS error of the bf16 form against a float64 FFT;
- `fft_faults`: the minor page faults of one FFT call (median). Its new output faults in when glibc has handed
  that memory back, which depends on what ran before; then the FFT takes about twice as long.
The three are timed interleaved, in an order that rotates each round, `--rounds` times each; medians.

Defaults: the four grids of `lisanet_s` at 224 x 224 with its transform counts (56 x 56 x 256, 28 x 28 x 512,
14 x 14 x 1280, 7 x 7 x 2048 per correlation).

Columns: grid, transforms, fft_ms, gemm_bf16_ms, gemm_fp32_ms, gemm_bf16_vs_fft, bf16_rel_err, fft_faults,
bf16_native, threads, cpu, torch.

Usage (from the repository root, on a quiet machine: `uptime`):
    python benchmarks/lisa_idft.py --out benchmarks/results/lisa-idft/run<n>.csv
"""

from __future__ import annotations

import argparse
import math
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from subquad.errors import UserError  # noqa: E402

COLUMNS = ["grid", "transforms", "fft_ms", "gemm_bf16_ms", "gemm_fp32_ms", "gemm_bf16_vs_fft", "bf16_rel_err",
           "fft_faults", "bf16_native", "threads", "cpu", "torch"]
DEFAULT = ["56x256", "28x512", "14x1280", "7x2048"]


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="CSV to write (refused if it exists)")
    p.add_argument("--cases", nargs="+", default=DEFAULT, metavar="SIDExTRANSFORMS",
                   help="square grid side and transform count per call (default: lisanet_s at 224 px)")
    p.add_argument("--rounds", type=int, default=20, help="timed calls per form (interleaved)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    return p.parse_args(argv)


def idft_matrix(n: int, planar_out: bool, dtype: torch.dtype) -> torch.Tensor:
    """The length-n inverse DFT as a real (2n, 2n) matrix for rows of interleaved (re, im) pairs: row @ M gives
    x[m] = (1/n) sum_k z[k] exp(2 pi i k m / n), interleaved or (planar_out) as (re[0..n), im[0..n))."""
    k = torch.arange(n, dtype=torch.float64)
    ang = 2 * math.pi * torch.outer(k, k).remainder(n) / n
    a, b = torch.cos(ang) / n, torch.sin(ang) / n
    mat = torch.empty(n, 2, 2, n, dtype=torch.float64)  # (k, input re/im, output re/im, m)
    mat[:, 0, 0], mat[:, 1, 0], mat[:, 0, 1], mat[:, 1, 1] = a, -b, b, a
    if not planar_out:
        mat = mat.transpose(2, 3)
    return mat.reshape(2 * n, 2 * n).to(dtype)


class GemmIdft:
    """The 2-D inverse DFT of (n, H, W) complex64 as two GEMMs in `dtype`, into preallocated buffers. The output
    is (n, W, H, 2): grid transposed, (re, im) interleaved."""

    def __init__(self, n: int, side: int, dtype: torch.dtype):
        self.n, self.s, self.dtype = n, side, dtype
        self.mat_w, self.mat_h = idft_matrix(side, True, dtype), idft_matrix(side, False, dtype)
        self.z = torch.empty(n * side, 2 * side, dtype=dtype)
        self.y = torch.empty(n * side, 2 * side, dtype=dtype)
        self.yt = torch.empty(n, side, 2 * side, dtype=dtype)
        self.out = torch.empty(n * side, 2 * side, dtype=dtype)

    def __call__(self, spec: torch.Tensor) -> torch.Tensor:
        n, s = self.n, self.s
        self.z.view(-1, 2).copy_(torch.view_as_real(spec).reshape(-1, 2))
        torch.mm(self.z, self.mat_w, out=self.y)  # W axis: rows (h), columns (re/im, w)
        self.yt.copy_(self.y.view(n, 2 * s, s).transpose(1, 2))  # rows (w), columns (h, re/im)
        torch.mm(self.yt.view(n * s, 2 * s), self.mat_h, out=self.out)  # H axis
        return self.out.view(n, s, s, 2)

    def as_complex(self, spec: torch.Tensor) -> torch.Tensor:
        """The result as (n, H, W) complex128 (for the error check)."""
        o = self(spec).double().transpose(1, 2)
        return torch.complex(o[..., 0], o[..., 1])


def _case(text: str) -> tuple[int, int]:
    side, sep, count = text.lower().partition("x")
    if not sep or not side.isdecimal() or not count.isdecimal() or int(side) < 1 or int(count) < 1:
        raise UserError(f"--cases {text!r}: expected SIDExTRANSFORMS with positive integers, e.g. 56x256")
    return int(side), int(count)


def measure(side: int, count: int, rounds: int) -> dict:
    """Medians of the three forms on one (grid, transforms) case, and the bf16 form's error."""
    g = torch.Generator().manual_seed(0)
    spec = torch.complex(torch.randn(count, side, side, generator=g), torch.randn(count, side, side, generator=g))
    forms = {"fft": lambda: torch.fft.ifftn(spec, dim=(-2, -1)),
             "gemm_bf16": GemmIdft(count, side, torch.bfloat16), "gemm_fp32": GemmIdft(count, side, torch.float32)}
    runs = {k: (f if k == "fft" else (lambda f=f: f(spec))) for k, f in forms.items()}
    for f in runs.values():  # warm-up
        f()
    times: dict[str, list[float]] = {k: [] for k in runs}
    faults: list[int] = []
    names = list(runs)
    for r in range(rounds):
        for k in names[r % 3:] + names[:r % 3]:  # the order rotates: no form always follows the same one
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            runs[k]()
            times[k].append((time.perf_counter() - t0) * 1e3)
            if k == "fft":
                faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    med = {k: statistics.median(v) for k, v in times.items()}
    ref = torch.fft.ifftn(spec.to(torch.complex128), dim=(-2, -1))
    err = ((forms["gemm_bf16"].as_complex(spec) - ref).abs().pow(2).mean().sqrt() / ref.abs().pow(2).mean().sqrt())
    return {"fft_ms": round(med["fft"], 4), "gemm_bf16_ms": round(med["gemm_bf16"], 4),
            "gemm_fp32_ms": round(med["gemm_fp32"], 4),
            "gemm_bf16_vs_fft": round(med["fft"] / med["gemm_bf16"], 3), "bf16_rel_err": float(f"{err.item():.3g}"),
            "fft_faults": statistics.median(faults)}


def main(argv=None) -> int:
    from subquad.backend import cpu_features
    from subquad.bench.sweep import _cpu_name, new_output, write_csv

    args = _args(argv)
    out = new_output(args.out)
    if args.rounds < 1 or (args.threads is not None and args.threads < 1):
        raise UserError(f"--rounds and --threads must be positive, got {args.rounds} and {args.threads}")
    cases = [_case(c) for c in args.cases]  # refuse a bad case before anything runs
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for side, count in cases:
        r = measure(side, count, args.rounds)
        r.update(grid=f"{side}x{side}", transforms=count, bf16_native=int(cpu_features().bf16),
                 threads=torch.get_num_threads(), cpu=_cpu_name(), torch=torch.__version__)
        print({k: r[k] for k in ("grid", "transforms", "fft_ms", "gemm_bf16_ms", "gemm_bf16_vs_fft")}, flush=True)
        rows.append(r)
    write_csv(rows, out, COLUMNS)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from subquad.bench.sweep import run_script

    run_script(main, "lisa_idft")
