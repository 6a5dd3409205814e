"""High-resolution detection: Mask R-CNN inference latency and peak memory with a linear-attention backbone beside
the same detector with timm's softmax Swin-T, at 800 x 1333 and 1024 x 1024, in one run.

Protocol (defaults): torchvision Mask R-CNN + FPN (256 channels, the papers' heads) built by
`subquad.dense.build_detector`, 80 classes, randomly initialised, eval mode, batch 1, fp32, `torch.no_grad()`; the
image is given at exactly the benchmark size (min_size / max_size set so that the model does not resize it; the batch
is padded to a multiple of 32). Backbones: `l2vit_tiny` and `flatten_swin_tiny` (subquad) and timm's
`swin_tiny_patch4_window7_224` built with `strict_img_size=False` (timm pads every window). Latency is the median of
`--repeats` timed calls after `--warmup` untimed ones (default 1; subquad.bench.timing.time_fn); peak memory is the
allocator probe of one call (subquad.bench.memory.peak_memory: bytes held beyond the weights and the input). Each
ratio column divides by the Swin-T row at the same size. Untrained detectors keep up to 100 detections above score
0.05, so the heads' post-processing cost is included and is about the same for every backbone.

Usage (from the repository root):
    python benchmarks/dense.py                        # -> benchmarks/results/dense-<hw>-pt<v>.csv
    python benchmarks/dense.py --repeats 1 --sizes 800x1333 --backbones l2vit_tiny swin_tiny_patch4_window7_224
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BASELINE = "swin_tiny_patch4_window7_224"
BACKBONES = ["l2vit_tiny", "flatten_swin_tiny", BASELINE]
SIZES = ["800x1333", "1024x1024"]
FIELDS = ["detector", "backbone", "img_size", "batch_size", "latency_ms", "peak_mem_mb", "param_count",
          "latency_ratio_vs_swin_t", "mem_ratio_vs_swin_t", "status", "device", "torch", "subquad"]


def _size(s: str) -> tuple[int, int]:
    h, _, w = s.lower().partition("x")
    return int(h), int(w)


def run(backbones: list[str], sizes: list[str], repeats: int, device: str, kind: str, warmup: int = 1) -> list[dict]:
    import torch

    from subquad.bench.memory import peak_memory
    from subquad.bench.sweep import device_tag
    from subquad.bench.timing import time_fn
    from subquad.dense import build_detector
    from subquad.version import __version__

    dev = torch.device(device)
    rows = []
    for size in sizes:
        h, w = _size(size)
        for name in backbones:
            extra = {"strict_img_size": False} if name == BASELINE else {}
            torch.manual_seed(0)
            model = build_detector(kind, name, 80, min_size=min(h, w), max_size=max(h, w),
                                   backbone_kwargs=extra).to(dev).eval()
            x = [torch.rand(3, h, w, device=dev)]
            row = {"detector": kind, "backbone": name, "img_size": f"{h}x{w}", "batch_size": 1,
                   "param_count": sum(p.numel() for p in model.parameters()), "device": device_tag(dev),
                   "torch": torch.__version__, "subquad": __version__}

            def step(model=model, x=x):
                with torch.no_grad():
                    return model(x)

            try:
                t = time_fn(step, dev, warmup=warmup, repeats=repeats)
                mem = peak_memory(step, dev)
                row.update(latency_ms=round(t.median * 1e3, 1), peak_mem_mb=round(mem / 2**20, 1), status="ok")
            except (RuntimeError, MemoryError) as e:
                row.update(status=f"error: {str(e).splitlines()[0][:80]}")
            print(f"{kind} {name} {h}x{w}: {row.get('latency_ms', '-')} ms, {row.get('peak_mem_mb', '-')} MB "
                  f"({row['status']})", flush=True)
            rows.append(row)
            del model
    for r in rows:
        base = next((b for b in rows if b["backbone"] == BASELINE and b["img_size"] == r["img_size"]
                     and b["status"] == "ok"), None)
        if base is not None and r["status"] == "ok":
            r["latency_ratio_vs_swin_t"] = round(r["latency_ms"] / base["latency_ms"], 3)
            r["mem_ratio_vs_swin_t"] = round(r["peak_mem_mb"] / base["peak_mem_mb"], 3)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backbones", nargs="+", default=BACKBONES)
    p.add_argument("--sizes", nargs="+", default=SIZES, help="HxW")
    p.add_argument("--kind", default="maskrcnn", choices=("maskrcnn", "fasterrcnn", "retinanet"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1, help="untimed calls first")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=None, help="CSV (default benchmarks/results/dense-<hw>-pt<v>.csv)")
    args = p.parse_args(argv)
    import torch

    from subquad.bench.sweep import device_tag, torch_tag

    rows = run(args.backbones, args.sizes, args.repeats, args.device, args.kind, args.warmup)
    out = Path(args.out) if args.out else \
        ROOT / "benchmarks" / "results" / f"dense-{device_tag(torch.device(args.device))}-{torch_tag()}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=FIELDS)
        wr.writeheader()
        wr.writerows(rows)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
