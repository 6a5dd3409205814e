"""1-D long-sequence benchmark of Transformer-LS long-short attention (arXiv 2107.02192).

Part 1, attention: d = 256, 4 heads, B = 1, lengths 1k / 4k / 16k / 64k; median forward time and peak memory of
"long_short" (bidirectional, w = 8, r = 32, the LRA setting) vs "softmax" (SDPA) and the linear-attention mechanism
("linear" when registered, else "enhanced_linear"). Softmax beyond --softmax-max-len is skipped (time budget).
speedup_vs_softmax = softmax time / mechanism time at the same length (> 1 is faster).
Part 2, causal LM: CharLM tokens/s of a training step (forward + backward) and of cached generation at context 4k,
long_short (causal, w, l = 16, r = 1) vs softmax (causal SDPA; no incremental cache, so generation recomputes the
context).

Usage:
    python benchmarks/long_short_1d.py --out benchmarks/results/long-short-1d-cpu.csv
    python benchmarks/long_short_1d.py --lengths 1024 4096 --skip-lm   # quick
"""

from __future__ import annotations

import argparse
import csv
import platform
import sys
import time
from pathlib import Path

import torch

import subquad
from subquad.bench.memory import peak_memory
from subquad.bench.timing import time_fn
from subquad.sequence import CharLM

FIELDS = ["part", "name", "seq_len", "median_ms", "peak_mem_mb", "tokens_per_s", "speedup_vs_softmax", "device",
          "torch", "notes"]


def _linear_name() -> str | None:
    names = subquad.list_attention()
    return "linear" if "linear" in names else ("enhanced_linear" if "enhanced_linear" in names else None)


def bench_attention(args: argparse.Namespace, device: torch.device) -> list[dict]:
    rows = []
    names = ["long_short", "softmax"] + ([_linear_name()] if _linear_name() else [])
    for n in args.lengths:
        base = None
        for name in names:
            row = dict(part="attention_fwd", name=name, seq_len=n, device=device.type, torch=torch.__version__)
            if name == "softmax" and n > args.softmax_max_len:
                rows.append({**row, "notes": f"skipped: longer than --softmax-max-len {args.softmax_max_len}"})
                continue
            kw = dict(window_size=args.window, rank=args.rank) if name == "long_short" else {}
            m = subquad.build_attention(name, args.dim, args.heads, **kw).to(device).eval()
            x = torch.randn(1, n, args.dim, device=device)

            def step(m=m, x=x):
                with torch.no_grad():
                    return m(x, None)

            t = time_fn(step, device, warmup=1, repeats=args.repeats, budget_s=args.budget_s)
            mem = peak_memory(step, device) / 2**20
            ms = t.median * 1e3
            if name == "softmax":
                base = ms
            notes = f"w={args.window}, r={args.rank}" if name == "long_short" else ""
            rows.append({**row, "median_ms": f"{ms:.2f}", "peak_mem_mb": f"{mem:.1f}",
                         "tokens_per_s": f"{n / t.median:.0f}", "notes": notes})
            print(f"attention {name:16s} n={n:6d}  {ms:10.2f} ms  peak {mem:9.1f} MiB", flush=True)
        for r in rows:
            if r["seq_len"] == n and base and r.get("median_ms"):
                r["speedup_vs_softmax"] = f"{base / float(r['median_ms']):.2f}"
    return rows


def bench_lm(args: argparse.Namespace, device: torch.device) -> list[dict]:
    rows = []
    T = args.lm_context
    for name in ("long_short", "softmax"):
        kw = dict(window_size=args.lm_window, chunk_size=16, rank=1) if name == "long_short" else {}
        m = CharLM(256, args.lm_dim, args.lm_depth, args.heads, attention=name, **kw).to(device)
        tok = torch.randint(0, 256, (1, T + 1), device=device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)

        def train_step(m=m, tok=tok, opt=opt):
            logits = m(tok[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), tok[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        m.train()
        t = time_fn(train_step, device, warmup=1, repeats=args.repeats, budget_s=args.budget_s)
        base = dict(name=name, seq_len=T, device=device.type, torch=torch.__version__)
        rows.append({**base, "part": "lm_train", "median_ms": f"{t.median * 1e3:.1f}",
                     "tokens_per_s": f"{T / t.median:.0f}",
                     "notes": f"d={args.lm_dim}, depth={args.lm_depth}, heads={args.heads}" +
                              (f", w={args.lm_window}, l=16, r=1" if name == "long_short" else "")})
        print(f"lm train   {name:12s} T={T}  {T / t.median:10.0f} tokens/s", flush=True)
        m.eval()
        new = args.lm_new if name == "long_short" else max(1, args.lm_new // 4)
        with torch.no_grad():
            cache = m.init_cache(1)
            m(tok[:, :T], cache=cache)
            nxt = tok[:, T:T + 1]
            t0 = time.perf_counter()
            for _ in range(new):
                logits = m(nxt, cache=cache)
                nxt = logits[:, -1].argmax(-1, keepdim=True)
            dt = time.perf_counter() - t0
        note = "cached incremental decoding" if name == "long_short" else "no incremental cache: recomputes context"
        rows.append({**base, "part": "lm_generate", "median_ms": f"{dt / new * 1e3:.1f}",
                     "tokens_per_s": f"{new / dt:.1f}", "notes": f"{note}; {new} new tokens after {T}"})
        print(f"lm generate {name:11s} T={T}  {new / dt:10.1f} tokens/s", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--window", type=int, default=8)
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--softmax-max-len", type=int, default=16384)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=20.0)
    p.add_argument("--skip-lm", action="store_true")
    p.add_argument("--lm-context", type=int, default=4096)
    p.add_argument("--lm-dim", type=int, default=256)
    p.add_argument("--lm-depth", type=int, default=4)
    p.add_argument("--lm-window", type=int, default=256)
    p.add_argument("--lm-new", type=int, default=64)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--out", default=None, help="CSV file (default: print only)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, threads "
          f"{torch.get_num_threads()}, device {device}", flush=True)
    rows = bench_attention(args, device)
    if not args.skip_lm:
        rows += bench_lm(args, device)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            w.writeheader()
            for r in rows:
                w.writerow({k: r.get(k, "") for k in FIELDS})
    return 0


if __name__ == "__main__":
    sys.exit(main())
