"""bf16 softmax attention under torch.compile on a CPU: written out (GEMMs and a float32 softmax) against the fused
kernel, per attention shape the Tiny/Small models call.

`subquad.attention.functional.softmax.sdpa` is compiled once per shape; the same compiled function runs both sides,
with the written-out form (`subquad.backend.decompose_attention`, backend 'auto') and under
`subquad.backend.use_backend("plain")` (torch's fused `scaled_dot_product_attention`), the sides alternating every
round (order flipping) so that a drifting machine reaches both alike. Inputs are bf16 and the calls run under
`torch.no_grad()`, as inference does. With a bool mask the library keeps the fused kernel, so both sides of a
bool-mask row run it; `--force-bool` times those rows' written-out side through `sdpa_written_out` directly (the
measurement behind that rule).

Columns: shape (B x h x N x n x d), mask (none, float, bool), what (the model and call it stands for), logits
(B*h*N*n), written_ms, fused_ms (medians over `--rounds`), fused_over_written (> 1: written out is faster), rounds,
threads, cpu, cpu_family, torch.

Usage (from the repository root, on a quiet machine: `uptime`):
    python benchmarks/attention_written_out.py --out benchmarks/results/attention-written-out-zen4/shapes.csv
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from subquad.bench.sweep import interleaved_times  # noqa: E402
from subquad.errors import UserError  # noqa: E402

COLUMNS = ["shape", "mask", "what", "logits", "written_ms", "fused_ms", "fused_over_written", "rounds", "threads",
           "cpu", "cpu_family", "torch"]
# (B, h, N, n, d), mask, what: the attention calls of the Tiny models at 224 and 512 px, batch 1.
SHAPES = [
    ((1, 3, 1025, 1025, 64), "none", "vit_attn_tiny 512 px"),
    ((1, 6, 1025, 1025, 64), "none", "vit_attn_small 512 px"),
    ((1, 3, 197, 197, 64), "none", "vit_attn_tiny 224 px"),
    ((128, 1, 128, 128, 32), "none", "CSwin-T stage 1 stripes, 512 px"),
    ((32, 2, 128, 128, 32), "none", "CSwin-T stage 2 stripes, 512 px"),
    ((5, 4, 224, 224, 32), "bool", "CSwin-T stage 3 padded stripes, 512 px"),
    ((1, 16, 256, 256, 32), "none", "CSwin-T stage 4, 512 px"),
    ((256, 3, 49, 49, 32), "float", "Swin-T stage 1 windows, 512 px (bias and shift mask)"),
    ((64, 6, 49, 49, 32), "float", "Swin-T stage 2 windows, 512 px"),
    ((1, 2, 9, 16384, 32), "float", "Agent-CSwin-T stage 1 agents over keys, 512 px"),
    ((1, 2, 16384, 9, 32), "float", "Agent-CSwin-T stage 1 queries over agents, 512 px"),
]


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="CSV to write (refused if it exists)")
    p.add_argument("--rounds", type=int, default=30, help="timed rounds (one call of each side per round)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--force-bool", action="store_true",
                   help="time bool-mask calls written out as well (the library keeps the fused kernel for them)")
    return p.parse_args(argv)


def _inputs(shape, mask: str, seed: int = 0):
    B, h, N, n, d = shape
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, m, d, generator=g).bfloat16() for m in (N, n, n))
    if mask == "bool":
        attn = torch.rand(B, 1, N, n, generator=g) > 0.1
    elif mask == "float":
        attn = torch.randn(1, h, N, n, generator=g).bfloat16()
    else:
        attn = None
    return q, k, v, attn


def measure(shape, mask: str, rounds: int, warmup: int, force_bool: bool = False) -> dict:
    """One shape: median written-out and fused times of the compiled call (see the module docstring)."""
    from subquad import backend
    from subquad.attention.functional.softmax import sdpa, sdpa_written_out

    q, k, v, attn = _inputs(shape, mask)
    written_fn = sdpa_written_out if (force_bool and mask == "bool") else sdpa

    def call(q, k, v, attn):
        return sdpa(q, k, v, attn_mask=attn)

    def call_written(q, k, v, attn):
        return written_fn(q, k, v, attn)

    torch._dynamo.reset()
    fused_c, written_c = torch.compile(call), torch.compile(call_written)

    def fused():
        with backend.use_backend("plain"):
            return fused_c(q, k, v, attn)

    sides = {"written": lambda: written_c(q, k, v, attn), "fused": fused}
    with torch.no_grad():
        times = interleaved_times(sides, rounds, warmup)
    w, f = (statistics.median(times[s]) for s in ("written", "fused"))
    B, h, N, n, d = shape
    return dict(shape="x".join(map(str, shape)), mask=mask, logits=B * h * N * n, written_ms=round(w, 4),
                fused_ms=round(f, 4), fused_over_written=round(f / w, 3), rounds=rounds)


def main(argv=None) -> int:
    from subquad.bench.sweep import _cpu_name, cpuinfo_field, new_output, write_csv

    args = _args(argv)
    out = new_output(args.out)
    if args.rounds < 1 or args.warmup < 0 or (args.threads is not None and args.threads < 1):
        raise UserError("--rounds and --threads must be positive and --warmup >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    env = dict(threads=torch.get_num_threads(), cpu=_cpu_name(), cpu_family=cpuinfo_field("cpu family"),
               torch=torch.__version__)
    rows = []
    for shape, mask, what in SHAPES:
        row = measure(shape, mask, args.rounds, args.warmup, args.force_bool)
        row.update(what=what, **env)
        print({k: row[k] for k in ("shape", "mask", "what", "written_ms", "fused_ms", "fused_over_written")},
              flush=True)
        rows.append(row)
    write_csv(rows, out, COLUMNS)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from subquad.bench.sweep import run_script

    run_script(main, "attention_written_out")
