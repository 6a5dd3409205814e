"""Time and peak memory of one LRA training step at the paper's ListOps shape (batch 32, 2048 tokens).

    OMP_NUM_THREADS=1 python benchmarks/lra_step.py softmax linear long_short [--batch 32 --tokens 2048]

One process per mechanism is the fair way to read the peak RSS growth on CPU (CUDA: max allocated); prints CSV rows
`attention,sec_per_train_step,peak_mem_mb` (best of the steps after the first). The model is the papers' LRA
encoder (2 layers, d = 64, 2 heads, FFN 128, CLS in the last layer); tokens after `--valid` are padding.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

import torch


def one(attention: str, batch: int, tokens: int, valid: int, steps: int, device: str) -> tuple[float, float]:
    from subquad.engine.sequence import LRAConfig, build_lra_model

    cfg = LRAConfig(attention=attention, max_len=tokens,
                    attn_kw={"long_short": {"layout": "lra", "window_size": 8, "rank": 32}},
                    cls_attn_kw={"long_short": {"num_prefix_tokens": 1}})
    dev = torch.device(device)
    model = build_lra_model(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), 1e-4, eps=1e-6)
    mask = torch.ones(batch, tokens, dtype=torch.bool, device=dev)
    mask[:, valid:] = False
    x = torch.randint(1, 15, (batch, tokens), device=dev) * mask
    y = torch.randint(0, 10, (batch,), device=dev)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x, mask), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    if dev.type == "cuda":
        peak = torch.cuda.max_memory_allocated(dev) / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - rss0
    return min(times[1:] or times), peak


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("attention", nargs="+")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--valid", type=int, default=1500, help="real tokens per sequence (the rest is padding)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        t, m = one(a.attention[0], a.batch, a.tokens, a.valid, a.steps, a.device)
        sys.stdout.write(f"{a.attention[0]},{t:.3f},{m:.0f}\n")
        return 0
    sys.stdout.write("attention,sec_per_train_step,peak_mem_mb\n")
    for name in a.attention:
        cmd = [sys.executable, __file__, name, "--child", "--batch", str(a.batch), "--tokens", str(a.tokens),
               "--valid", str(a.valid), "--steps", str(a.steps), "--device", a.device]
        sys.stdout.write(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
