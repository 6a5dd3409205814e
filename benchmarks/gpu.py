"""GPU check: the attention sweep and the Tiny models, forward and forward + backward, in fp32 and bf16 on CUDA,
beside SDPA softmax attention and the timm counterparts, in one run.

Protocol (defaults):
- attention: every registered bidirectional mechanism (taken from the registry at run time) and `softmax` (SDPA),
  C = 192, 6 heads, batch 8, token grids 14^2, 28^2, 56^2 and 112^2; forward, and forward + backward of
  `out.square().mean()`; the ratio column divides the mechanism's time by softmax's at the same grid and dtype.
- models: the Tiny models of each family and timm's `deit_tiny_patch16_224`, `swin_tiny_patch4_window7_224` and
  `pvt_v2_b1`, batch 32 at 224 x 224, eval-mode forward and a train-mode step (cross-entropy, backward).
- fp32 is plain fp32 (TF32 off); bf16 is `torch.autocast("cuda", torch.bfloat16)` around the call.
- every time is the median of `--repeats` calls after `--warmup` untimed ones, each bracketed by
  `torch.cuda.synchronize` (subquad.bench.timing.time_fn); peak memory is `torch.cuda.max_memory_allocated` over
  one call after a reset. A configuration that fails (out of memory, a non-finite output) gets a row whose `status`
  says why; the run goes on.
- the device schedule is the one `subquad.backend.schedule` picks for CUDA (the plain batched paths).

Usage (on a machine with a CUDA GPU, from the repository root; about 5 minutes on an H100-class GPU):
    python benchmarks/gpu.py                        # -> benchmarks/results/gpu-<gpu>-pt<v>.csv
    python benchmarks/gpu.py --quick                # 2 grids, 2 models, 1 repeat: a smoke run
    python benchmarks/gpu.py --out /tmp/gpu.csv --dtypes bf16
Without CUDA it exits with one line saying so (nothing written).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

OURS = ["l2vit_tiny", "flatten_deit_tiny", "flatten_pvt_tiny", "flatten_pvt_v2_b1", "flatten_swin_tiny",
        "flatten_cswin_tiny", "lisanet_s", "hylisanet_s", "vil_ls_medium", "cvt_ls_13"]
TIMM = ["deit_tiny_patch16_224", "swin_tiny_patch4_window7_224", "pvt_v2_b1"]
GRIDS = [14, 28, 56, 112]
FIELDS = ["kind", "name", "dtype", "pass", "size", "batch_size", "ms", "ratio_to_baseline", "baseline", "peak_mem_mb",
          "params_m", "status", "device", "torch", "subquad"]


DEVICE = "cuda"  # `--device cpu` runs the same code on the CPU: a smoke test of this script, not a benchmark


def _autocast(dtype: str):
    import contextlib

    import torch

    return torch.autocast(DEVICE, dtype=torch.bfloat16) if dtype == "bf16" else contextlib.nullcontext()


def _measure(fn, device, warmup: int, repeats: int) -> tuple[float, float]:
    """(median ms, peak MiB) of fn() on CUDA (peak NaN on the CPU)."""
    import torch

    from subquad.bench.timing import time_fn

    peak = float("nan")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) / 2 ** 20
    t = time_fn(fn, device, warmup=warmup, repeats=repeats)
    return t.median * 1e3, peak


def _checked(fn, device, warmup: int, repeats: int) -> tuple[float, float]:
    """Run fn once (its output must be finite), then `_measure` it."""
    import torch

    if not bool(torch.isfinite(fn()).all()):
        raise FloatingPointError("non-finite output")
    return _measure(fn, device, warmup, repeats)


def _failed(e: Exception, **kw) -> dict:
    """The row of a configuration that raised (out of memory, non-finite output): the reason in `status`."""
    return _row(**kw, status=f"{type(e).__name__}: {str(e)[:120]}")


def _release() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def _row(**kw) -> dict:
    import torch

    from subquad.version import __version__

    row = {k: "" for k in FIELDS}
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (smoke run)"
    row.update(kw, device=name, torch=torch.__version__, subquad=__version__)
    return row


def attention_rows(dtypes, grids, batch, warmup, repeats, log) -> list[dict]:
    import torch

    from subquad.attention import build_attention
    from subquad.bench.sweep import attention_candidates

    dev = torch.device(DEVICE)
    names = ["softmax"] + [n for n in attention_candidates() if n != "softmax"]
    rows = []
    for dtype in dtypes:
        for g in grids:
            base: dict[str, float] = {}
            for name in names:
                for pas in ("forward", "forward+backward"):
                    key = dict(kind="attention", name=name, dtype=dtype, size=f"{g}x{g}", batch_size=batch,
                               **{"pass": pas})
                    try:
                        torch.manual_seed(0)
                        m = build_attention(name, 192, 6, input_size=(g, g)).to(dev)
                        x = torch.randn(batch, g * g, 192, device=dev, requires_grad=pas != "forward")
                        m.train(pas != "forward")

                        def fwd(m=m, x=x, g=g, dtype=dtype):
                            with torch.no_grad(), _autocast(dtype):
                                return m(x, (g, g))

                        def step(m=m, x=x, g=g, dtype=dtype):
                            with _autocast(dtype):
                                out = m(x, (g, g))
                            out.float().square().mean().backward()
                            return out

                        ms, peak = _checked(fwd if pas == "forward" else step, dev, warmup, repeats)
                        if name == "softmax":
                            base[pas] = ms
                        ratio = ms / base[pas] if pas in base else float("nan")
                        rows.append(_row(**key, ms=round(ms, 4), ratio_to_baseline=round(ratio, 3),
                                         baseline="softmax (SDPA)", peak_mem_mb=round(peak, 1), status="ok"))
                    except Exception as e:  # noqa: BLE001 - recorded in the row, the sweep goes on
                        rows.append(_failed(e, **key))
                    finally:
                        _release()
                    log(rows[-1])
    return rows


def model_rows(dtypes, models, batch, size, warmup, repeats, log) -> list[dict]:
    import timm
    import torch
    import torch.nn.functional as F

    import subquad  # noqa: F401  (registers the models with timm)

    dev = torch.device(DEVICE)
    rows = []
    for dtype in dtypes:
        for name in models:
            for pas in ("forward", "forward+backward"):
                key = dict(kind="model", name=name, dtype=dtype, size=f"{size}x{size}", batch_size=batch,
                           **{"pass": pas})
                try:
                    torch.manual_seed(0)
                    m = timm.create_model(name, num_classes=1000).to(dev)
                    m.train(pas != "forward")
                    x = torch.randn(batch, 3, size, size, device=dev)
                    y = torch.randint(0, 1000, (batch,), device=dev)

                    def fwd(m=m, x=x, dtype=dtype):
                        with torch.no_grad(), _autocast(dtype):
                            return m(x)

                    def step(m=m, x=x, y=y, dtype=dtype):
                        with _autocast(dtype):
                            out = m(x)
                        F.cross_entropy(out.float(), y).backward()
                        return out

                    ms, peak = _checked(fwd if pas == "forward" else step, dev, warmup, repeats)
                    params = sum(p.numel() for p in m.parameters()) / 1e6
                    rows.append(_row(**key, ms=round(ms, 3), peak_mem_mb=round(peak, 1), params_m=round(params, 2),
                                     status="ok"))
                except Exception as e:  # noqa: BLE001 - recorded in the row, the sweep goes on
                    rows.append(_failed(e, **key))
                finally:
                    _release()
                log(rows[-1])
    # Ratio of each model to the timm counterpart of its family, same dtype and pass.
    counterpart = {"swin": "swin_tiny_patch4_window7_224", "cswin": "swin_tiny_patch4_window7_224",
                   "pvt": "pvt_v2_b1", "deit": "deit_tiny_patch16_224"}
    ref = {(r["name"], r["dtype"], r["pass"]): r["ms"] for r in rows if r["status"] == "ok"}
    for r in rows:
        if r["kind"] != "model" or r["name"] in TIMM or r["status"] != "ok":
            continue
        base = next((v for k, v in counterpart.items() if k in r["name"]), "deit_tiny_patch16_224")
        b = ref.get((base, r["dtype"], r["pass"]))
        if b:
            r["baseline"], r["ratio_to_baseline"] = base, round(r["ms"] / b, 3)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtypes", default="fp32,bf16", help="comma-separated: fp32, bf16")
    p.add_argument("--grids", default=",".join(map(str, GRIDS)), help="token grid sides of the attention sweep")
    p.add_argument("--attn-batch", type=int, default=8)
    p.add_argument("--models", nargs="*", default=OURS + TIMM)
    p.add_argument("--model-batch", type=int, default=32)
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="grids 14,28, two models, one repeat (a smoke run)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: a smoke run of this script (tests), never a result")
    p.add_argument("--out", default="", help="CSV path (default benchmarks/results/gpu-<gpu>-pt<torch>.csv)")
    a = p.parse_args(argv)
    import torch

    global DEVICE
    DEVICE = a.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu.py needs a CUDA GPU (torch.cuda.is_available() is False); nothing written",
              file=sys.stderr)
        return 2
    dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in ("fp32", "bf16")]
    if bad:
        print(f"--dtypes: unknown {bad}; allowed: fp32, bf16", file=sys.stderr)
        return 2
    grids = [int(g) for g in a.grids.split(",")]
    models = a.models
    if a.quick:
        grids, models, a.warmup, a.repeats = grids[:2], ["l2vit_tiny", "deit_tiny_patch16_224"], 1, 1
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    from subquad.backend import schedule
    from subquad.bench.sweep import torch_tag

    if DEVICE == "cpu" and not a.out:
        print("--device cpu is a smoke run: give --out (it never writes under benchmarks/results)", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    slug = "".join(c if c.isalnum() else "-" for c in gpu.lower()).strip("-")
    out = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / f"gpu-{slug}-{torch_tag()}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"device {gpu}, schedule {schedule(DEVICE)!r}, torch {torch.__version__}", flush=True)
    t0 = time.time()

    def log(r):
        print(f"{r['kind']:9s} {r['name']:32s} {r['dtype']:4s} {r['pass']:16s} {r['size']:9s} "
              f"{r['ms'] if r['status'] == 'ok' else r['status']} ms  ({time.time() - t0:.0f}s)", flush=True)

    rows = attention_rows(dtypes, grids, a.attn_batch, a.warmup, a.repeats, log)
    rows += model_rows(dtypes, models, a.model_batch, a.img_size, a.warmup, a.repeats, log)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()})
    os.replace(tmp, out)
    print(f"wrote {out} ({len(rows)} rows, {time.time() - t0:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
