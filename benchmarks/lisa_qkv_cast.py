"""LiSA's q/k/v projection under bf16 autocast: the broadcast-weight GEMM it had against the leaf-weight GEMM it has.

LiSA's q/k/v projection is written channel-major, (B, 3C, N) = W x^T + b. Until this change it ran as one
`baddbmm` on `W.expand(B, ...)` and `b[:, None].expand(B, -1, N)`: under autocast those broadcast views are cast to
bf16 on every call (autocast keeps cast weights only for leaf tensors), which copies every q/k/v weight each step and
writes the bias out per token. Now one image takes one `addmm` on the module's own weight and bias, so autocast casts
them once per region (`subquad.attention.structure_aware._channel_major_linear`).

Sides, batch 1, no autograd, alternating in one process (the order flipping every round), all inside one bf16
autocast region as `subquad predict`, `eval` and `bench model` hold it: fp32 (autocast off inside), bf16 (the code as
it is) and bf16_broadcast (the same model with the earlier `baddbmm` on broadcast views put back for the run).
Columns: model, img_size, rounds, fp32_ms, bf16_ms, bf16_broadcast_ms (medians), speedup_vs_fp32_eager (fp32 / bf16),
broadcast_speedup_vs_fp32_eager (fp32 / bf16_broadcast), gain (bf16_broadcast / bf16), copy_ms_bf16,
copy_ms_bf16_broadcast (profiled self CPU time of aten::copy_ in one step), max_abs_diff (bf16 against bf16_broadcast
logits), then the environment columns of `subquad.bench.sweep.script_setup`.

Usage (from the repository root, on a quiet machine: `uptime`):
    python benchmarks/lisa_qkv_cast.py --out benchmarks/results/lisa-qkv-cast-<hw>/run<n>.csv
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from subquad.bench.sweep import (  # noqa: E402
    check_interleaved_args,
    interleaved_parser,
    interleaved_times,
    new_output,
    script_setup,
    write_csv,
)

COLUMNS = ["model", "img_size", "rounds", "fp32_ms", "bf16_ms", "bf16_broadcast_ms", "speedup_vs_fp32_eager",
           "broadcast_speedup_vs_fp32_eager", "gain", "copy_ms_bf16", "copy_ms_bf16_broadcast", "max_abs_diff",
           "kept_freed_mib", "threads", "cpu", "cpu_family", "torch"]
MODELS = ["lisanet_s", "hylisanet_s", "lisanet_i"]


def broadcast_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """The projection as it was: one batched GEMM on broadcast views of the weight and bias."""
    B, N, _ = x.shape
    w = w.expand(B, *w.shape)
    xt = x.transpose(1, 2)
    return torch.bmm(w, xt) if b is None else torch.baddbmm(b[:, None].expand(B, -1, N), w, xt)


def copy_ms(fn) -> float:
    from torch.profiler import profile

    with profile() as p:
        fn()
    return sum(e.self_cpu_time_total for e in p.key_averages() if e.key == "aten::copy_") / 1e3


def measure(name: str, img_size: int, rounds: int, warmup: int) -> dict:
    import subquad
    from subquad.attention import structure_aware

    torch.manual_seed(0)
    net = subquad.create_model(name).eval()
    x = torch.randn(1, 3, img_size, img_size)
    leaf = structure_aware._channel_major_linear

    def fp32():
        with torch.autocast("cpu", enabled=False):
            return net(x)

    def bf16():
        return net(x)

    def bf16_broadcast():
        structure_aware._channel_major_linear = broadcast_linear
        try:
            return net(x)
        finally:
            structure_aware._channel_major_linear = leaf

    sides = {"fp32": fp32, "bf16": bf16, "bf16_broadcast": bf16_broadcast}
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        diff = float((bf16().float() - bf16_broadcast().float()).abs().max())
        times = interleaved_times(sides, rounds, warmup)
        copies = {side: copy_ms(sides[side]) for side in ("bf16", "bf16_broadcast")}
    med = {k: statistics.median(v) for k, v in times.items()}
    return dict(model=name, img_size=img_size, rounds=rounds, fp32_ms=round(med["fp32"], 3),
                bf16_ms=round(med["bf16"], 3), bf16_broadcast_ms=round(med["bf16_broadcast"], 3),
                speedup_vs_fp32_eager=round(med["fp32"] / med["bf16"], 3),
                broadcast_speedup_vs_fp32_eager=round(med["fp32"] / med["bf16_broadcast"], 3),
                gain=round(med["bf16_broadcast"] / med["bf16"], 3), copy_ms_bf16=round(copies["bf16"], 3),
                copy_ms_bf16_broadcast=round(copies["bf16_broadcast"], 3), max_abs_diff=f"{diff:.2e}")


def main(argv=None) -> int:
    p = interleaved_parser(__doc__, MODELS, rounds=15)
    args = p.parse_args(argv)
    out = new_output(args.out)
    check_interleaved_args(args)
    env = script_setup(args.model, args.threads)
    rows = []
    for name in args.model:
        for size in args.img_size:
            rows.append({**measure(name, size, args.rounds, args.warmup), **env})
            print(rows[-1], flush=True)
    write_csv(rows, out, COLUMNS)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from subquad.bench.sweep import run_script

    run_script(main, "lisa_qkv_cast")
