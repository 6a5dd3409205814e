"""Does accuracy survive the fast CPU paths? Top-1 of trained checkpoints on their held-out split in every path.

Paths (`--paths`, `<precision>-<backend>`):
- `fp32-eager`: the reference every other row is compared with (always run);
- `bf16-eager`: `torch.autocast("cpu", torch.bfloat16)` through `subquad.backend.precision_context` (the fp32 islands
  of the precision policy in place), as `subquad eval --precision bf16` runs it;
- `int8-eager`: `subquad.layers.int8.quantize_int8(model)`, every `nn.Linear` as a dynamic int8 GEMM (per-token
  activation and per-channel weight scales, `torch._int_mm`), the rest in fp32, as `subquad eval --precision int8`
  runs it;
- `fp32-compile`, `bf16-compile`, `int8-compile`: the same under `torch.compile` (inductor; a full last batch, padded,
  so one graph);
- `fp32-onnxruntime`: the ONNX file `subquad export --format onnx` writes, in ONNX Runtime;
- `int8-onnxruntime`: that file after `subquad export --quantize int8`'s dynamic quantization of MatMul / Gemm,
  one row per weight scheme of `--int8-weights` (`subquad.export.INT8_WEIGHTS`: 7 or 8 bits, per tensor or per
  output channel; default `subquad export`'s), named in the row's `int8_weights`.

Each row: top-1 in the path, its change from fp32 eager in points (`top1_delta`), the share of images whose top-1
label equals fp32 eager's (`agreement`, %), the largest and mean absolute logit difference from fp32 eager, and
`status`: `ok`, `flagged: top-1 drops by more than 0.5 points` (the threshold of the CPU-speed work), or why the path
did not run. A path that skips (bf16 on a CPU without native bf16, a missing ONNX extra) says so in its row.

This measures accuracy, not speed: the numbers do not depend on the machine's load, only on its arithmetic (bf16
rounding is the same on every CPU with native bf16; int8 kernels differ between VNNI and non-VNNI CPUs, so the CSV
names the CPU, its family and model, and its flags: on an x86 CPU without VNNI, 8-bit weights are clipped in
ONNX Runtime, `subquad.backend.int8_saturates`).

Usage (from the repository root; checkpoints are `subquad train` run folders or weights files with their sidecar):
    python benchmarks/precision_accuracy.py --checkpoint docs/analyze-fmnist/softmax/run \
        --out benchmarks/results/precision-accuracy-<cpu>.csv
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from subquad.errors import UserError  # noqa: E402

PATHS = ("fp32-eager", "bf16-eager", "int8-eager", "fp32-compile", "bf16-compile", "int8-compile", "fp32-onnxruntime",
         "int8-onnxruntime")
MAX_DROP = 0.5  # points of top-1: a path that loses more is flagged
COLUMNS = ["checkpoint", "model", "data", "split", "images", "precision", "backend", "top1", "top1_delta",
           "agreement", "max_abs_logit_err", "mean_abs_logit_err", "status", "seconds", "cpu", "cpu_bf16",
           "cpu_vnni", "threads", "torch", "onnxruntime", "subquad", "int8_weights", "cpu_family", "cpu_model",
           "int8_saturates"]


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", nargs="+", required=True, help="run folders or weights files (with sidecars)")
    p.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)} "
                   "(fp32-eager always runs: it is the reference)")
    p.add_argument("--int8-weights", default=None,
                   help="comma-separated weight schemes of the int8-onnxruntime path (subquad.export.INT8_WEIGHTS; "
                   "default: subquad export's), one row each")
    p.add_argument("--limit", type=int, default=0, help="a seeded subset of this many held-out images (0: all)")
    p.add_argument("-b", "--batch-size", type=int, default=256)
    p.add_argument("--threads", type=int, default=None, help="torch / ONNX Runtime threads (default: torch's)")
    p.add_argument("--out", required=True, help="CSV to write (an existing file is refused)")
    return p.parse_args(argv)


def _check(args: argparse.Namespace) -> tuple[list[tuple[str, str]], Path]:
    """(path, int8 weight scheme or '') pairs to measure, fp32 eager first, and the output file."""
    from subquad.engine.checkpoint import check_output_file, resolve_checkpoint
    from subquad.export import DEFAULT_INT8_WEIGHTS, check_int8_weights

    paths = [s.strip() for s in args.paths.split(",") if s.strip()]
    bad = [s for s in paths if s not in PATHS]
    if bad:
        raise UserError(f"--paths: unknown {', '.join(bad)}; choose from {', '.join(PATHS)}")
    for flag, value, low in (("--limit", args.limit, 0), ("--batch-size", args.batch_size, 1),
                             ("--threads", args.threads, 1)):
        if value is not None and value < low:
            raise UserError(f"{flag} must be >= {low}, got {value}")
    for c in args.checkpoint:
        resolve_checkpoint(c)
    if args.int8_weights is not None and "int8-onnxruntime" not in paths:
        raise UserError(f"--int8-weights {args.int8_weights} applies to the int8-onnxruntime path; add it to --paths")
    given = DEFAULT_INT8_WEIGHTS if args.int8_weights is None else args.int8_weights
    schemes = [s.strip() for s in given.split(",") if s.strip()]
    for scheme in schemes:
        check_int8_weights(scheme)
    if not schemes:
        raise UserError("--int8-weights needs at least one scheme")
    out = check_output_file(args.out, (".csv",), tuple(args.checkpoint), "--out", overwrite=False)
    jobs = [(s, "") for s in ["fp32-eager"] + [s for s in paths if s != "fp32-eager"]]
    return [(p, w) for p, _ in jobs for w in (schemes if p == "int8-onnxruntime" else [""])], out


def _held_out(checkpoint: str, batch_size: int, limit: int):
    """(name, model, data spec, split, images, labels) of a checkpoint, as `subquad eval` reads them."""
    from subquad.data.registry import open_source
    from subquad.engine.checkpoint import load_checkpointed_model
    from subquad.engine.classify import eval_loader

    name, model, sidecar, dcfg, _ = load_checkpointed_model(checkpoint, None, None, torch.device("cpu"))
    spec = (sidecar.get("args") or {}).get("data")
    if not spec:
        raise UserError(f"{checkpoint}: its sidecar names no data")
    source = open_source(spec, need_val=False)
    split = source.test_split or source.val_split
    xs, ys = zip(*eval_loader(source, split, dcfg, batch_size, 0, limit))
    return name, model.eval(), spec, split, torch.cat(xs), torch.cat(ys)


def _batched(fn, x: torch.Tensor, batch_size: int, pad: bool = False) -> torch.Tensor:
    """fn over `x` in batches; with `pad` the last batch is padded to full size (one compiled graph)."""
    outs = []
    for i in range(0, len(x), batch_size):
        xb = x[i:i + batch_size]
        n = len(xb)
        if pad and n < batch_size:
            xb = torch.cat([xb, xb[-1:].expand(batch_size - n, *xb.shape[1:])])
        with torch.no_grad():
            outs.append(fn(xb)[:n].float())
    return torch.cat(outs)


def _int8_or_float(model, precision: str):
    """The int8 copy of the model for the int8 torch paths (`quantize_int8`), else the model itself."""
    from subquad.layers.int8 import quantize_int8

    return quantize_int8(model) if precision == "int8" else model


def _eager(model, precision: str):
    from subquad.backend import precision_context

    model = _int8_or_float(model, precision)

    def run(x: torch.Tensor) -> torch.Tensor:
        with precision_context(precision, "cpu"):
            return model(x)

    return run


def _compiled(model, precision: str):
    from subquad.backend import precision_context

    torch._dynamo.reset()
    compiled = torch.compile(_int8_or_float(model, precision))

    def run(x: torch.Tensor) -> torch.Tensor:
        with precision_context(precision, "cpu"):
            return compiled(x)

    return run


def _onnx(model, name: str, x: torch.Tensor, precision: str, tmp: Path, weights: str = ""):
    import onnxruntime as ort

    from subquad.export import export_model, quantize_int8

    fp32 = tmp / f"{name}.onnx"
    if not fp32.exists():
        export_model(model, "onnx", fp32, img_size=tuple(x.shape[-2:]), name=name, log=lambda *_: None)
    path = fp32
    if precision == "int8":
        path = tmp / f"{name}-int8-{weights}.onnx"
        if not path.exists():
            quantize_int8(fp32, path, weights)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0].name
    return lambda xb: torch.from_numpy(sess.run(None, {inp: xb.numpy()})[0])


def _skip_reason(precision: str, backend: str) -> str | None:
    import importlib.util

    from subquad.backend import cpu_features
    from subquad.export import EXTRA

    if precision == "bf16" and not cpu_features().bf16:
        return "skipped: this CPU has no native bf16 arithmetic (bf16 would run as fp32)"
    if backend == "onnxruntime":
        missing = [m for m in EXTRA["onnx"] if importlib.util.find_spec(m) is None]
        if missing:
            return f"skipped: needs the export extra (missing {', '.join(missing)})"
    return None


def _top1(logits: torch.Tensor, y: torch.Tensor) -> float:
    return 100.0 * float((logits.argmax(1) == y).double().mean())


def changed_labels(ref: torch.Tensor, logits: torch.Tensor) -> str:
    """Where the top-1 labels of `logits` differ from the reference's: each such image's rank among all images by its
    reference top-two logit gap (1: the closest call), and the median gap. Near-ties (low ranks) mean the labels
    flipped on images the reference itself barely decided; high ranks mean the path's numerics moved real margins."""
    top2 = ref.double().topk(2, dim=1).values
    gap = top2[:, 0] - top2[:, 1]
    rank = gap.argsort().argsort() + 1
    changed = (logits.argmax(1) != ref.argmax(1)).nonzero().flatten()
    if not len(changed):
        return "no label changed"
    ranks = sorted(int(rank[i]) for i in changed)
    gaps = ", ".join(f"{float(gap[i]):.3g}" for i in changed[rank[changed].argsort()])
    return (f"labels changed on {len(ranks)} images, ranked {', '.join(map(str, ranks))} of {len(gap)} by the "
            f"reference's top-two logit gap ({gaps}; median {float(gap.median()):.3g})")


def measure(checkpoint: str, paths: list[tuple[str, str]], batch_size: int, limit: int, env: dict,
            log=print) -> list[dict]:
    """One row per (path, int8 weight scheme) for one checkpoint (fp32 eager first: the reference)."""
    name, model, spec, split, x, y = _held_out(checkpoint, batch_size, limit)
    base = {"checkpoint": checkpoint, "model": name, "data": spec, "split": split, "images": len(y), **env}
    rows, ref = [], None
    with tempfile.TemporaryDirectory(prefix="precision-accuracy-") as tmp:
        for path, weights in paths:
            precision, backend = path.split("-", 1)
            row = {**base, "precision": precision, "backend": backend, "int8_weights": weights}
            path = f"{path} ({weights} weights)" if weights else path
            reason = _skip_reason(precision, backend)
            if reason:
                rows.append({**row, "status": reason})
                log(f"{name} {path}: {reason}")
                continue
            t0 = time.perf_counter()
            if backend == "eager":
                fn, pad = _eager(model, precision), False
            elif backend == "compile":
                fn, pad = _compiled(model, precision), True
            else:
                fn, pad = _onnx(model, name, x[:2], precision, Path(tmp), weights), False
            logits = _batched(fn, x, batch_size, pad)
            seconds = time.perf_counter() - t0
            if not bool(torch.isfinite(logits).all()):
                rows.append({**row, "status": "flagged: non-finite logits", "seconds": f"{seconds:.1f}"})
                log(f"{name} {path}: non-finite logits")
                continue
            top1 = _top1(logits, y)
            if ref is None:
                ref, ref_top1 = logits, top1
            diff = (logits.double() - ref.double()).abs()
            delta = top1 - ref_top1
            agree = 100.0 * float((logits.argmax(1) == ref.argmax(1)).double().mean())
            status = "ok" if delta >= -MAX_DROP else f"flagged: top-1 drops by more than {MAX_DROP} points"
            rows.append({**row, "top1": f"{top1:.2f}", "top1_delta": f"{delta:+.2f}", "agreement": f"{agree:.2f}",
                         "max_abs_logit_err": f"{float(diff.max()):.3g}",
                         "mean_abs_logit_err": f"{float(diff.mean()):.3g}", "status": status,
                         "seconds": f"{seconds:.1f}"})
            log(f"{name} {path}: top-1 {top1:.2f} % ({delta:+.2f}), agreement {agree:.2f} %, max |dlogit| "
                f"{float(diff.max()):.3g} [{status}]")
            if status != "ok":
                log(f"{name} {path}: {changed_labels(ref, logits)}")
        torch._dynamo.reset()
    return rows


def main(argv: list[str] | None = None) -> int:
    import importlib.metadata

    import subquad  # noqa: F401  (registers the models)
    from subquad.backend import cpu_features, int8_saturates
    from subquad.bench.sweep import _cpu_name, cpuinfo_field, write_csv
    from subquad.version import __version__

    args = _args(argv)
    try:
        if args.threads:
            torch.set_num_threads(args.threads)
        paths, out = _check(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        ort_version = importlib.metadata.version("onnxruntime")
    except importlib.metadata.PackageNotFoundError:
        ort_version = ""
    feats = cpu_features()
    env = {"cpu": _cpu_name(), "cpu_bf16": int(feats.bf16), "cpu_vnni": int(feats.int8_dot), "threads":
           torch.get_num_threads(), "torch": torch.__version__, "onnxruntime": ort_version, "subquad": __version__,
           "cpu_family": cpuinfo_field("cpu family"), "cpu_model": cpuinfo_field("model"),
           "int8_saturates": int(int8_saturates())}
    rows = []
    for ckpt in args.checkpoint:
        rows += measure(ckpt, paths, args.batch_size, args.limit, env)
        tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
        write_csv(rows, tmp, COLUMNS)  # the CSV grows per checkpoint, each version written whole then renamed
        os.replace(tmp, out)
    flagged = [f"{r['model']} {r['precision']}-{r['backend']}" + (f" ({r['int8_weights']})" if r["int8_weights"]
                                                                   else "")
               for r in rows if r["status"].startswith("flagged")]
    print(f"wrote {out}: {len(rows)} rows" + (f"; flagged: {', '.join(flagged)}" if flagged else "; none flagged"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
