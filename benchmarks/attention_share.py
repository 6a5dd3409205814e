"""How much of a softmax backbone's time is its attention core, and what that bounds (Amdahl).

A subquadratic mechanism can only speed up the token-mixing core (softmax(QK^T)V); the rest of the network (patch
embedding, norms, qkv/proj projections, MLPs, window partition and shifts, patch merging, head) runs either way. If
that rest takes a fraction r of a softmax model's step, no replacement of the core can make the model faster than
1 / r. This benchmark measures r directly: it times each timm baseline as is and with the core of every
attention module skipped (`free_core`: qkv and proj still run, out = proj(v)), interleaved per round, and beside it
the subquad model the issue compares (`flatten_swin_tiny` for Swin-T by default).

Columns: model, baseline, img_size, batch_size, ours_ms, baseline_ms, baseline_no_core_ms (medians over rounds),
speedup (baseline / ours), core_share (1 - no_core / baseline), amdahl_bound (baseline / no_core: the largest
speedup any core replacement can give), threads, device, torch.

Usage (from the repository root):
    python benchmarks/attention_share.py                      # Swin-T pair at 224 and 1024
    python benchmarks/attention_share.py --img-size 224 512 1024 --rounds 5 --out results/x.csv
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

FIELDS = ["model", "baseline", "img_size", "batch_size", "ours_ms", "baseline_ms", "baseline_no_core_ms", "speedup",
          "core_share", "amdahl_bound", "threads", "device", "torch"]
PAIRS = {"flatten_swin_tiny": "swin_tiny_patch4_window7_224"}


@contextlib.contextmanager
def free_core(model: torch.nn.Module):
    """Inside the block, every attention module of `model` (one with `qkv`, `proj` and `num_heads`, as timm's
    WindowAttention and Attention) keeps its projections but skips the core: out = proj(v). Relative-position
    bias, masks, softmax(QK^T) and attn @ v cost nothing, so the measured time is an upper bound on what any
    replacement of the core leaves."""
    patched = []

    def stand_in(self, x, *args, **kwargs):
        C = x.shape[-1]
        v = self.qkv(x)[..., 2 * C:]
        return self.proj_drop(self.proj(v))

    for m in model.modules():
        if all(hasattr(m, a) for a in ("qkv", "proj", "num_heads")):
            m.forward = stand_in.__get__(m)
            patched.append(m)
    if not patched:
        raise SystemExit(f"attention_share: {type(model).__name__} has no attention module with qkv/proj to patch")
    try:
        yield len(patched)
    finally:
        for m in patched:
            del m.forward


def measure(ours: str, baseline: str, img_size: int, batch_size: int = 1, rounds: int = 3) -> dict:
    """Median forward times (ms) of ours, the baseline, and the baseline without its attention core."""
    import timm

    import subquad
    from subquad.bench.sweep import _model_kwargs

    torch.manual_seed(0)
    ours_m = subquad.create_model(ours).eval()
    base_m = timm.create_model(baseline, **_model_kwargs(baseline, img_size)).eval()
    x = torch.randn(batch_size, 3, img_size, img_size)
    from subquad.bench.timing import time_interleaved

    def no_core():
        with free_core(base_m):
            return base_m(x)

    with torch.no_grad():
        times = time_interleaved({"ours": lambda: ours_m(x), "base": lambda: base_m(x), "free": no_core}, rounds)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {"model": ours, "baseline": baseline, "img_size": img_size, "batch_size": batch_size,
            "ours_ms": round(med["ours"], 2), "baseline_ms": round(med["base"], 2),
            "baseline_no_core_ms": round(med["free"], 2), "speedup": round(med["base"] / med["ours"], 3),
            "core_share": round(1 - med["free"] / med["base"], 3),
            "amdahl_bound": round(med["base"] / med["free"], 3), "threads": torch.get_num_threads(),
            "device": "cpu", "torch": torch.__version__}


def main(argv: list[str] | None = None) -> int:
    from subquad.bench.sweep import default_result_path
    from subquad.engine.checkpoint import atomic_write, check_output_file

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", nargs="+", default=list(PAIRS), choices=sorted(PAIRS))
    p.add_argument("--img-size", nargs="+", type=int, default=[224, 1024])
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    for flag, values, low in (("--img-size", a.img_size, 32), ("--batch-size", [a.batch_size], 1),
                              ("--rounds", [a.rounds], 1)):
        bad = [v for v in values if v < low]
        if bad:
            p.error(f"{flag} must be >= {low}, got {bad[0]}")
    out = Path(a.out) if a.out else default_result_path("attn-share", "cpu", ROOT / "benchmarks" / "results")
    check_output_file(out, (".csv",), what="result file",
                      overwrite_if=lambda q: q.read_text().split("\n", 1)[0].strip() == ",".join(FIELDS))
    rows = []
    for ours in a.model:
        for size in a.img_size:
            row = measure(ours, PAIRS[ours], size, a.batch_size, a.rounds)
            print(", ".join(f"{k}={v}" for k, v in row.items()), flush=True)
            rows.append(row)

    def write(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, FIELDS)
            w.writeheader()
            w.writerows(rows)

    atomic_write(out, write)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
