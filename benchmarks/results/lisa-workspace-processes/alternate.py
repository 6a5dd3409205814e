"""One fresh process: a model's fp32 and bf16 eager forward (batch 1), alternating step by step; medians.

Usage: python alternate.py MODEL IMG_SIZE ROUNDS LABEL
Prints one line: LABEL, the fp32 and bf16 medians (ms) and their ratio.
"""

import statistics
import sys
import time

import timm
import torch

import subquad  # noqa: F401  (registers the models with timm)


def main() -> None:
    name, size, rounds, label = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(2)
    model = timm.create_model(name, img_size=size).eval()
    x = torch.randn(1, 3, size, size)

    def step(bf16: bool) -> float:
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            t0 = time.perf_counter()
            model(x)
            return (time.perf_counter() - t0) * 1e3

    for _ in range(3):
        step(False)
        step(True)
    fp32, bf16 = [], []
    for _ in range(rounds):
        fp32.append(step(False))
        bf16.append(step(True))
    a, b = statistics.median(fp32), statistics.median(bf16)
    print(f"{label} fp32 {a:.1f} bf16 {b:.1f} ratio {a / b:.3f}", flush=True)


if __name__ == "__main__":
    main()
