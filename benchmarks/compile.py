"""Deployment paths on this CPU: eager PyTorch against `torch.compile` and against ONNX Runtime, per Tiny model, in
one run.

Protocol (defaults): each model is randomly initialised (seed 0), in eval mode, batch 1, fp32, 224 x 224, under
`torch.no_grad()`, with the thread count pinned (`--threads`, default 2) for PyTorch and ONNX Runtime alike.
- eager: the module as built.
- compiled: `torch.compile(model)` (inductor, default mode). The first call compiles and is reported as
  `compile_s`; the timing starts after it.
- onnxrt: the file `subquad.export.export_model` writes (torch.onnx.export(dynamo=True), static size), checked
  against eager there, run by ONNX Runtime's CPU provider with intra-op spinning off. Spinning threads would steal
  the cores from whatever is timed next.
The three are timed one after another, not interleaved, for the same reason. Each latency is the median of
`--repeats` calls after `--warmup` untimed ones (subquad.bench.timing.time_fn). The ratio columns divide the eager
latency by the other path's (> 1: that path is faster).

Usage (from the repository root, on a quiet machine; about 2-3 minutes per model):
    python benchmarks/compile.py                   # -> benchmarks/results/compile-<cpu>-pt<v>.csv
    python benchmarks/compile.py --models l2vit_tiny lisanet_s --repeats 5
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODELS = ["l2vit_tiny", "flatten_deit_tiny", "flatten_pvt_tiny", "flatten_pvt_v2_b1", "flatten_swin_tiny",
          "flatten_cswin_tiny", "lisanet_s", "vil_ls_medium", "cvt_ls_13"]
FIELDS = ["model", "img_size", "batch_size", "eager_ms", "compiled_ms", "onnxrt_ms", "eager_vs_compiled",
          "eager_vs_onnxrt", "compile_s", "onnx_rel_err", "status", "threads", "device", "torch", "subquad"]


def _ort_session(path: str, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def run(models: list[str], size: int, repeats: int, warmup: int, threads: int) -> list[dict]:
    import torch

    from subquad.bench.sweep import device_tag
    from subquad.bench.timing import time_fn
    from subquad.export import export_model
    from subquad.models import create_model
    from subquad.version import __version__

    torch.set_num_threads(threads)
    rows = []
    for name in models:
        torch.manual_seed(0)
        model = create_model(name).eval()
        x = torch.randn(1, 3, size, size)
        row = {"model": name, "img_size": size, "batch_size": 1, "threads": threads, "device": device_tag("cpu"),
               "torch": torch.__version__, "subquad": __version__}
        status = []

        def eager(model=model, x=x):
            with torch.no_grad():
                return model(x)

        row["eager_ms"] = round(time_fn(eager, "cpu", warmup=warmup, repeats=repeats).median * 1e3, 2)
        try:
            compiled = torch.compile(model)
            t0 = time.perf_counter()
            with torch.no_grad():
                compiled(x)
            row["compile_s"] = round(time.perf_counter() - t0, 1)

            def comp(compiled=compiled, x=x):
                with torch.no_grad():
                    return compiled(x)

            row["compiled_ms"] = round(time_fn(comp, "cpu", warmup=warmup, repeats=repeats).median * 1e3, 2)
            row["eager_vs_compiled"] = round(row["eager_ms"] / row["compiled_ms"], 3)
        except Exception as e:  # noqa: BLE001 - reported in the row
            status.append(f"compile error: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
        try:
            with tempfile.TemporaryDirectory() as d:
                f = str(Path(d) / f"{name}.onnx")
                res = export_model(model, "onnx", f, (size, size), log=lambda *a: None)
                row["onnx_rel_err"] = f"{res['checks'][0]['rel_err']:.1e}"
                sess = _ort_session(f, threads)
                feed = {sess.get_inputs()[0].name: x.numpy()}
                row["onnxrt_ms"] = round(time_fn(lambda s=sess, f=feed: s.run(None, f), "cpu", warmup=warmup,
                                                 repeats=repeats).median * 1e3, 2)
                row["eager_vs_onnxrt"] = round(row["eager_ms"] / row["onnxrt_ms"], 3)
        except Exception as e:  # noqa: BLE001 - reported in the row
            status.append(f"onnx error: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
        row["status"] = "; ".join(status) or "ok"
        print(f"{name}: eager {row['eager_ms']} ms, compiled {row.get('compiled_ms', '-')} ms "
              f"(x{row.get('eager_vs_compiled', '-')}), onnxrt {row.get('onnxrt_ms', '-')} ms "
              f"(x{row.get('eager_vs_onnxrt', '-')}) [{row['status']}]", flush=True)
        rows.append(row)
        torch._dynamo.reset()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=MODELS)
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2, help="untimed calls first")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="CSV (default benchmarks/results/compile-<cpu>-pt<v>.csv)")
    args = p.parse_args(argv)
    from subquad.bench.sweep import device_tag, torch_tag, write_csv

    rows = run(args.models, args.img_size, args.repeats, args.warmup, args.threads)
    out = Path(args.out) if args.out else \
        ROOT / "benchmarks" / "results" / f"compile-{device_tag('cpu')}-{torch_tag()}.csv"
    print(f"wrote {write_csv(rows, out, FIELDS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
