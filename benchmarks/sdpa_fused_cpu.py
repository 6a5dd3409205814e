"""Agent attention's SDPA calls on torch's fused CPU kernel against the unfused math path they took, in one process.

Agent attention (Agent Attention, arXiv 2312.08874) adds an (h, A, N) position bias to the logits of its two softmax
attentions, and its agent tokens, pooled from the query map, can be strided in their channel dim. torch's fused CPU
SDPA kernel takes no mask of lower rank than q and no operand strided in its last dim, and falls back to its unfused
math path (3-4x slower per call at the agent models' sizes, plus a safe-softmax pass);
`subquad.attention.functional.softmax.sdpa` now lifts the mask to q's rank (the same broadcast) and copies a strided
operand.

Sides, batch 1, no autograd, alternating in one process (the order flipping every round): fp32, fp32_before (the
same model with agent attention's SDPA called as before), and, where this CPU has native bf16,
bf16 and bf16_before inside one bf16 autocast region as `subquad predict`, `eval` and `bench model` hold it.
Columns: model, img_size, rounds, fp32_ms, fp32_before_ms, bf16_ms, bf16_before_ms (medians), gain_fp32
(fp32_before / fp32), gain_bf16, math_calls_before (SDPA calls on the math path per fp32 step before; after:
`math_calls`), max_abs_diff (fp32 logits of the two sides), then the environment columns of
`subquad.bench.sweep.script_setup`.

Usage (from the repository root, on a quiet machine: `uptime`):
    python benchmarks/sdpa_fused_cpu.py --out benchmarks/results/sdpa-fused-cpu-<hw>/run<n>.csv
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from subquad.bench.sweep import (  # noqa: E402
    check_interleaved_args,
    interleaved_parser,
    interleaved_times,
    new_output,
    script_setup,
    write_csv,
)
from subquad.errors import UserError  # noqa: E402

COLUMNS = ["model", "img_size", "rounds", "fp32_ms", "fp32_before_ms", "bf16_ms", "bf16_before_ms", "gain_fp32",
           "gain_bf16", "math_calls", "math_calls_before", "max_abs_diff", "kept_freed_mib", "threads", "cpu",
           "cpu_family", "torch"]
MODELS = ["agent_deit_tiny", "agent_deit_small", "agent_pvt_tiny", "agent_pvt_small", "agent_swin_tiny",
          "agent_swin_small", "agent_cswin_tiny", "agent_cswin_small"]
MATH = "aten::_scaled_dot_product_attention_math"


def sdpa_before(q, k, v, attn_mask=None, dropout_p=0.0, scale=None):
    """SDPA as agent attention called it before: the mask at its own rank, the operands as they come."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)


def math_calls(fn) -> int:
    from torch.profiler import profile

    with profile() as p:
        fn()
    return sum(e.count for e in p.key_averages() if e.key == MATH)


def measure(name: str, img_size: int, rounds: int, warmup: int, bf16: bool) -> dict:
    import subquad
    from subquad.attention.functional import agent

    torch.manual_seed(0)
    net = subquad.create_model(name).eval()
    x = torch.randn(1, 3, img_size, img_size)
    lifted = agent.sdpa

    def before(fn):
        def run():
            agent.sdpa = sdpa_before
            try:
                return fn()
            finally:
                agent.sdpa = lifted
        return run

    def fp32():
        with torch.autocast("cpu", enabled=False):
            return net(x)

    sides = {"fp32": fp32, "fp32_before": before(fp32)}
    if bf16:
        sides.update(bf16=lambda: net(x), bf16_before=before(lambda: net(x)))
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
        diff = float((sides["fp32"]() - sides["fp32_before"]()).abs().max())
        times = interleaved_times(sides, rounds, warmup)
        calls = (math_calls(sides["fp32"]), math_calls(sides["fp32_before"]))
    med = {k: statistics.median(v) for k, v in times.items()}
    row = dict(model=name, img_size=img_size, rounds=rounds, fp32_ms=round(med["fp32"], 3),
               fp32_before_ms=round(med["fp32_before"], 3), gain_fp32=round(med["fp32_before"] /
                                                                                   med["fp32"], 3),
               math_calls=calls[0], math_calls_before=calls[1], max_abs_diff=f"{diff:.2e}")
    if bf16:
        row.update(bf16_ms=round(med["bf16"], 3), bf16_before_ms=round(med["bf16_before"], 3),
                   gain_bf16=round(med["bf16_before"] / med["bf16"], 3))
    return row


def main(argv=None) -> int:
    from subquad import backend

    p = interleaved_parser(__doc__, MODELS, rounds=11)
    args = p.parse_args(argv)
    out = new_output(args.out)
    check_interleaved_args(args)
    if not all(m.startswith("agent_") for m in args.model):
        raise UserError("--model: only agent attention models (agent_*) called SDPA on its math path")
    env = script_setup(args.model, args.threads)
    bf16 = backend.cpu_features().bf16
    rows = []
    for name in args.model:
        for size in args.img_size:
            rows.append({**measure(name, size, args.rounds, args.warmup, bf16), **env})
            print({k: rows[-1].get(k) for k in COLUMNS[:12]}, flush=True)
    write_csv(rows, out, COLUMNS)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from subquad.bench.sweep import run_script

    run_script(main, "sdpa_fused_cpu")
