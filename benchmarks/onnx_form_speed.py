"""Two ONNX files of one model (say, exported before and after a change of its export form) timed side by side in
ONNX Runtime, alternating with the model in fp32 eager PyTorch, in one process.

A change to the form a mechanism takes in an exported graph (`torch.compiler.is_exporting()` branches) is measured
here as the ratio of the two files' step times, each against fp32 eager, under the same machine state: the sides
alternate in blocks (a pause, one untimed step when `--block` > 1, `--block` timed steps) with the order flipped
every round, and each ratio is of the medians. The two files run on the same random input; `max_rel_diff` is
max |after - before| / max |before| of their outputs. It checks the change only when both files hold the same
weights (exported from one checkpoint; for two int8 files it then includes their different activation rounding):
`subquad export --model M` without a checkpoint exports the model's random initial weights, different in each
process, and the eager side here has its own. Timing does not depend on the weights' values.

Usage (from the repository root, on a quiet machine: `uptime`):
    git worktree add /tmp/before <commit>
    (cd /tmp/before && python -m subquad export --model M --format onnx --quantize int8 --img-size 224 \\
        --out /tmp/M-before.onnx)
    python -m subquad export --model M --format onnx --quantize int8 --img-size 224 --out /tmp/M-after.onnx
    python benchmarks/onnx_form_speed.py --model M --img-size 224 --before /tmp/M-before.onnx \\
        --after /tmp/M-after.onnx --threads 2 --out benchmarks/results/<name>.csv

Columns: model, img_size, before, after (the file names), fp32_eager_ms, before_ms, after_ms (medians of the rounds),
before_vs_fp32_eager, after_vs_fp32_eager (fp32 eager ms / the file's ms: > 1 is faster), after_vs_before (before
ms / after ms), after_vs_before_min, after_vs_before_max (the range of the per-round ratios), max_rel_diff, rounds,
block, threads, cpu.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from subquad.errors import UserError  # noqa: E402

COLUMNS = ["model", "img_size", "before", "after", "fp32_eager_ms", "before_ms", "after_ms", "before_vs_fp32_eager",
           "after_vs_fp32_eager", "after_vs_before", "after_vs_before_min", "after_vs_before_max", "max_rel_diff",
           "rounds", "block", "threads", "cpu"]


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="CSV to write (refused if it exists)")
    p.add_argument("--model", required=True, help="registered model the two files were exported from")
    p.add_argument("--img-size", required=True, help="the files' input size: S or HxW")
    p.add_argument("--before", required=True, help="the first ONNX file")
    p.add_argument("--after", required=True, help="the second ONNX file")
    p.add_argument("--rounds", type=int, default=9, help="timed rounds (each times every side once)")
    p.add_argument("--block", type=int, default=3, help="timed steps per side and round")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--pause", type=float, default=0.1, help="seconds slept before each side's turn")
    p.add_argument("--threads", type=int, default=None, help="torch and ONNX Runtime threads (default: torch's)")
    return p.parse_args(argv)


def _session(path: Path):
    """An ONNX Runtime CPU session of `path` at torch's threads (`main` set them to --threads)."""
    import onnxruntime as ort

    from subquad.bench.precision import _ort_options

    try:
        sess = ort.InferenceSession(str(path), _ort_options(), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - ONNX Runtime's load errors have no common type
        raise UserError(f"{path}: ONNX Runtime cannot load it ({str(e).splitlines()[0]})") from None
    return sess


def _sig(ms: float) -> float:
    """Five significant digits (a handmade test graph's step is ~0.02 ms)."""
    return float(f"{ms:.5g}")


def measure(args) -> dict:
    import timm

    import subquad  # noqa: F401  (registers the models)
    from subquad.bench.sweep import _model_kwargs, check_model_names, image_size, interleaved_times

    hw = image_size(args.img_size)
    check_model_names([args.model])
    model = timm.create_model(args.model, **_model_kwargs(args.model, hw)).eval()
    x = torch.randn(1, model.pretrained_cfg["input_size"][0], *hw, generator=torch.Generator().manual_seed(0))
    sides = {}
    outs = {}
    for key in ("before", "after"):
        path = Path(getattr(args, key))
        if not path.is_file():
            raise UserError(f"--{key} {path}: no such file")
        sess = _session(path)
        inp = sess.get_inputs()[0]
        shape = [d if isinstance(d, int) else None for d in inp.shape]
        if len(shape) != 4 or any(d is not None and d != want for d, want in zip(shape, x.shape)):
            raise UserError(f"--{key} {path}: its input is {inp.shape}, not {list(x.shape)} (--img-size "
                            f"{args.img_size})")
        feed = {inp.name: x.numpy()}
        outs[key] = torch.from_numpy(sess.run(None, feed)[0])
        sides[key] = (lambda s, f: lambda: s.run(None, f))(sess, feed)

    def eager():
        with torch.no_grad():
            return model(x)

    sides = {"fp32_eager": eager, **sides}
    times = interleaved_times(sides, args.rounds, args.warmup, args.block, args.pause)
    med = {k: statistics.median(v) for k, v in times.items()}
    per_round = [b / a for a, b in zip(times["after"], times["before"])]
    if outs["before"].shape != outs["after"].shape:
        raise UserError(f"the files' outputs differ in shape: {list(outs['before'].shape)} (--before) and "
                        f"{list(outs['after'].shape)} (--after): not two forms of one model")
    before = outs["before"].double()
    return dict(model=args.model, img_size=args.img_size, before=Path(args.before).name, after=Path(args.after).name,
                fp32_eager_ms=_sig(med["fp32_eager"]), before_ms=_sig(med["before"]), after_ms=_sig(med["after"]),
                before_vs_fp32_eager=round(med["fp32_eager"] / med["before"], 3),
                after_vs_fp32_eager=round(med["fp32_eager"] / med["after"], 3),
                after_vs_before=round(med["before"] / med["after"], 3),
                after_vs_before_min=round(min(per_round), 3), after_vs_before_max=round(max(per_round), 3),
                max_rel_diff=float(f"{(outs['after'].double() - before).abs().max() / before.abs().max():.3g}"),
                rounds=args.rounds, block=args.block)


def main(argv=None) -> int:
    args = _args(argv)
    from subquad.bench.sweep import _cpu_name, new_output, write_csv

    out = new_output(args.out)
    for flag in ("rounds", "block"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag} must be positive, got {getattr(args, flag)}")
    if args.warmup < 0 or not args.pause >= 0:
        raise UserError("--warmup and --pause must be zero or positive")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be positive, got {args.threads}")
    args.threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(args.threads)
    row = measure(args)
    row.update(threads=args.threads, cpu=_cpu_name())
    print({k: row[k] for k in ("model", "img_size", "fp32_eager_ms", "before_ms", "after_ms", "after_vs_before")},
          flush=True)
    write_csv([row], out, COLUMNS)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from subquad.bench.sweep import run_script

    run_script(main, "onnx_form_speed")
