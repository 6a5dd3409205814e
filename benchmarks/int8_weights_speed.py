"""Speed of `subquad export --quantize int8`'s weight schemes in ONNX Runtime, beside fp32 eager and fp32 ONNX Runtime.

The schemes (`--int8-weights`, `subquad.export.INT8_WEIGHTS`) differ in the range of the int8 weights (7 or 8 bits)
and in the extent of their scales (one per tensor or one per output channel). ONNX Runtime runs all of them with the
same uint8 x int8 GEMM kernels; per-channel scales change only the dequantization after each GEMM. This measures
whether that costs time, and what each scheme gains over fp32 eager on this CPU.

Sides, batch 1, no autograd, in one process: fp32 eager PyTorch, the fp32 ONNX file `subquad export --format onnx`
writes, and that file quantized in each scheme (`--weights`, default all four), each in its own ONNX Runtime session
with the run's threads. The sides alternate in blocks (the order flipping every round): each block runs one untimed
step, then `--block` timed steps whose mean is the block's time. Single steps alternating between six thread pools
(torch's and five sessions', each spinning a while after its work) fought over the cores: on a 2-core machine one
side's steps then spread 4x between rounds. One row per (model, size, side): median_ms, min_ms, max_ms (of the
blocks' means), speedup_vs_fp32_eager (the fp32 eager median over the side's), int8_saturates (whether this CPU clips
8-bit weights, `subquad.backend.int8_saturates`: the timing is the same, the products are not), then the environment
columns of `subquad.bench.sweep.script_setup`.

Usage (from the repository root, on a quiet machine: `uptime`):
    python benchmarks/int8_weights_speed.py --out benchmarks/results/int8-weights-<hw>/run<n>.csv
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from subquad.bench.sweep import (  # noqa: E402
    check_interleaved_args,
    interleaved_parser,
    interleaved_times,
    new_output,
    script_setup,
    write_csv,
)

COLUMNS = ["model", "img_size", "side", "rounds", "block", "median_ms", "min_ms", "max_ms", "speedup_vs_fp32_eager",
           "int8_saturates", "kept_freed_mib", "threads", "cpu", "cpu_family", "torch"]
MODELS = ["vit_attn_tiny", "flatten_deit_tiny", "flatten_swin_tiny"]


def _session(path: Path):
    import onnxruntime as ort

    from subquad.bench.precision import _ort_options

    sess = ort.InferenceSession(str(path), _ort_options(), providers=["CPUExecutionProvider"])
    return sess, sess.get_inputs()[0].name


def measure(name: str, img_size: int, weights: list[str], rounds: int, warmup: int, folder: Path,
            block: int = 3) -> list[dict]:
    import subquad
    from subquad.backend import int8_saturates
    from subquad.export import export_model, quantize_int8

    torch.manual_seed(0)
    net = subquad.create_model(name).eval()
    x = torch.randn(1, 3, img_size, img_size)
    fp32 = folder / f"{name}-{img_size}.onnx"
    export_model(net, "onnx", fp32, (img_size, img_size), log=lambda *_: None)
    files = {"fp32 onnxruntime": fp32}
    for w in weights:
        files[f"int8 onnxruntime {w}"] = folder / f"{name}-{img_size}-{w}.onnx"
        quantize_int8(fp32, files[f"int8 onnxruntime {w}"], w)
    xn = x.numpy()
    sides = {"fp32 eager": lambda: net(x)}
    for side, path in files.items():
        sess, inp = _session(path)
        sides[side] = (lambda s, i: lambda: s.run(None, {i: xn}))(sess, inp)
    with torch.no_grad():
        times = interleaved_times(sides, rounds, warmup, block)
    base = statistics.median(times["fp32 eager"])
    return [dict(model=name, img_size=img_size, side=side, rounds=rounds, block=block,
                 median_ms=round(statistics.median(t), 3), min_ms=round(min(t), 3), max_ms=round(max(t), 3),
                 speedup_vs_fp32_eager=round(base / statistics.median(t), 3), int8_saturates=int(int8_saturates()))
            for side, t in times.items()]


def main(argv=None) -> int:
    from subquad.errors import UserError
    from subquad.export import INT8_WEIGHTS, check_int8_weights

    p = interleaved_parser(__doc__, MODELS, rounds=7, per_round="one block of each side per round")
    p.add_argument("--block", type=int, default=3, help="timed steps per block (after one untimed step)")
    p.add_argument("--weights", default=",".join(INT8_WEIGHTS),
                   help=f"comma-separated schemes (default {','.join(INT8_WEIGHTS)})")
    args = p.parse_args(argv)
    out = new_output(args.out)
    check_interleaved_args(args, ("block",))
    weights = [w.strip() for w in args.weights.split(",") if w.strip()]
    if not weights:
        raise UserError("--weights needs at least one scheme")
    for w in weights:
        check_int8_weights(w, "--weights")
    env = script_setup(args.model, args.threads)
    rows = []
    with tempfile.TemporaryDirectory(prefix="int8-weights-") as tmp:
        for name in args.model:
            for size in args.img_size:
                for row in measure(name, size, weights, args.rounds, args.warmup, Path(tmp), args.block):
                    rows.append({**row, **env})
                    print(rows[-1], flush=True)
    write_csv(rows, out, COLUMNS)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from subquad.bench.sweep import run_script

    run_script(main, "int8_weights_speed")
