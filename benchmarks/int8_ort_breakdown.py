"""Where an int8 ONNX Runtime step spends its time, and the speed-up over fp32 eager it could reach at best.

`subquad export --quantize int8` makes the weight GEMMs (MatMul / Gemm with a constant weight) uint8 x int8 products
with dynamic activation scales; everything else in the graph (attention's own products, softmax or kernel maps,
normalisations, convolutions, reshapes) stays fp32. So the int8 step's speed-up over fp32 eager is bounded by the
time it spends outside its weight GEMMs. This script measures that share and states the bounds for a model and
size whose fastest path misses a target (`--target`, default the 1.5x of `benchmarks/models_precision.py`).

Per (model, size), batch 1, no autograd, in one process:
1. fp32 eager PyTorch, the fp32 ONNX file `subquad export --format onnx` writes and that file quantized in the
   default scheme (`subquad.export.DEFAULT_INT8_WEIGHTS`) alternate in blocks (`subquad.bench.sweep
   .interleaved_times`: a pause of `--pause` seconds, one untimed step, then `--block` timed steps per side and
   round, the order flipping every round). The medians are the blocks' means. Without the pause, ONNX Runtime's
   threads still spinning after its turn slowed the fp32 eager steps after it (on a 2-core machine by up to 2x).
2. Then each ONNX file runs `--profile-steps` steps in a session of its own with ONNX Runtime's profiler on. The
   session's optimised graph (after ONNX Runtime's fusions) tells which kernels are weight GEMMs: a MatMul, Gemm,
   FusedMatMul, MatMulInteger, DynamicQuantizeMatMul or MatMulIntegerToFloat node whose second input is a constant,
   and the DynamicQuantizeLinear nodes that feed them. Shares are of the profiled step's wall time; `between_share`
   is the part no kernel accounts for (ONNX Runtime's scheduling between nodes).

Columns per (model, size): the three medians (ms) and the int8 speed-up over fp32 eager; the weight-GEMM share of
the fp32 and int8 ONNX Runtime steps; `gemm_gain`, the fp32 weight GEMMs' kernel time over the int8 ones' (what the
int8 GEMMs achieved in this model); `peak_gemm_gain`, this CPU's int8 over fp32 GEMM rate on 1024^3 products
(ONNX Runtime's MatMulInteger against its fp32 MatMul, alternating, the fastest blocks, once per run);
`rest_top`, the largest kernels outside the weight GEMMs in the int8 step; and two bounds on the int8 step's
speed-up over fp32 eager, from its measured non-GEMM time:
- `bound_free_gemm`: were the weight GEMMs free;
- `bound_peak_gemm`: were they to run at the fp32 ones' kernel time over `peak_gemm_gain`.
`verdict`: `reaches` (the measured int8 step is at --target), `out of reach` (bound_free_gemm below it: no int8
GEMM could bring this runtime's step there), `needs GEMMs above the int8 peak` (bound_peak_gemm below it) or
`within reach` (the int8 GEMMs fall short of this CPU's rate in this model). The environment columns of
`subquad.bench.sweep.script_setup` follow.

Usage (from the repository root, on a quiet machine: `uptime`):
    python benchmarks/int8_ort_breakdown.py --model vit_attn_tiny --img-size 224 \
        --out benchmarks/results/int8-ort-breakdown-<hw>/run<n>.csv
    python benchmarks/int8_ort_breakdown.py --table benchmarks/results/int8-ort-breakdown-<hw>/*.csv
    python benchmarks/int8_ort_breakdown.py --summary [--sweep benchmarks/results/bench-model-precision-<hw>-parts] \
        benchmarks/results/int8-ort-breakdown-<hw>/*.csv     # verdicts over processes (`summary`)
"""

from __future__ import annotations

import collections
import json
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

COLUMNS = ["model", "img_size", "rounds", "block", "pause", "profile_steps", "fp32_eager_ms", "fp32_ort_ms",
           "int8_ort_ms", "int8_speedup", "fp32_ort_gemm_share", "int8_gemm_share", "int8_between_share", "gemm_gain",
           "peak_gemm_gain", "bound_free_gemm", "bound_peak_gemm", "target", "verdict", "rest_top", "int8_weights",
           "int8_saturates", "kept_freed_mib", "threads", "cpu", "cpu_family", "torch"]
MODELS = ["vit_attn_tiny"]
GEMM_OPS = {"MatMul", "Gemm", "FusedMatMul", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}


def weight_gemm_nodes(graph) -> set[str]:
    """Names of the nodes of an (optimised) ONNX graph that are weight GEMMs: a GEMM op whose second input is an
    initializer, the DynamicQuantizeLinear nodes whose outputs feed one, and the Add of a constant (the bias) right
    after one (ONNX Runtime fuses the bias into an int8 GEMM, not always into an fp32 one)."""
    consts = {t.name for t in graph.initializer}
    gemms = [n for n in graph.node if n.op_type in GEMM_OPS and len(n.input) > 1 and n.input[1] in consts]
    fed = {i for n in gemms for i in n.input}
    made = {o for n in gemms for o in n.output}
    quant = [n for n in graph.node if n.op_type == "DynamicQuantizeLinear" and any(o in fed for o in n.output)]
    bias = [n for n in graph.node if n.op_type == "Add" and len(n.input) == 2 and made & set(n.input)
            and consts & set(n.input)]
    return {n.name for n in gemms + quant + bias}


def profile(path: Path, x, steps: int, folder: Path) -> dict:
    """Kernel time of the weight GEMMs and of every other op type, and the wall time, per step of the ONNX file
    `path` (ms), from ONNX Runtime's profiler over `steps` steps after two (whose events are left out: the first
    steps of a session allocate its buffers)."""
    import onnx
    import onnxruntime as ort

    from subquad.bench.precision import _ort_options

    opts = _ort_options()
    opts.optimized_model_filepath = str(folder / (path.stem + "-optimised.onnx"))
    opts.enable_profiling = True
    opts.profile_file_prefix = str(folder / path.stem)
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    gemm_nodes = weight_gemm_nodes(onnx.load(opts.optimized_model_filepath, load_external_data=False).graph)
    feed = {sess.get_inputs()[0].name: x}
    for _ in range(2 + steps):
        sess.run(None, feed)
    events = json.loads(Path(sess.end_profiling()).read_text())
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("cat") == "Session" and e.get("name") == "model_run")
    if len(runs) != 2 + steps:
        raise RuntimeError(f"ONNX Runtime's profile of {path.name} holds {len(runs)} runs, expected {2 + steps}")
    runs = runs[2:]
    ops: collections.Counter = collections.Counter()
    gemm = 0.0
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        if not any(t0 <= e["ts"] <= t1 for t0, t1 in runs):
            continue
        if e["name"][: -len("_kernel_time")] in gemm_nodes:
            gemm += e["dur"]
        else:
            ops[e["args"]["op_name"]] += e["dur"]
    if not gemm:
        raise RuntimeError(f"no weight GEMM kernel found in the profile of {path.name}")
    per = 1e3 * steps  # microseconds summed over the steps -> ms per step
    return dict(wall=sum(t1 - t0 for t0, t1 in runs) / per, gemm=gemm / per, ops={k: v / per for k, v in ops.items()})


def bounds(eager_ms: float, int8_ms: float, int8_gemm_share: float, gemm_gain: float, peak_gemm_gain: float,
           target: float) -> tuple[float, float, str]:
    """(bound_free_gemm, bound_peak_gemm, verdict) of an int8 step of `int8_ms` whose weight GEMMs take
    `int8_gemm_share` of it and achieve `gemm_gain` over fp32's, on a CPU whose int8 GEMMs run `peak_gemm_gain`
    times fp32's: the speed-up over fp32 eager (`eager_ms`) with those GEMMs free, and at the peak gain."""
    rest = int8_ms * (1 - int8_gemm_share)
    gemm = int8_ms * int8_gemm_share
    free = eager_ms / rest
    peak = eager_ms / (rest + gemm * gemm_gain / peak_gemm_gain)
    if eager_ms / int8_ms >= target:
        verdict = "reaches"
    elif free < target:
        verdict = "out of reach"
    elif peak < target:
        verdict = "needs GEMMs above the int8 peak"
    else:
        verdict = "within reach"
    return free, peak, verdict


def measure(name: str, img_size: int, rounds: int, warmup: int, block: int, steps: int, target: float,
            peak_gemm_gain: float, folder: Path, pause: float = 0.1) -> dict:
    import onnxruntime as ort

    import subquad
    from subquad.backend import int8_saturates
    from subquad.bench.precision import _ort_options
    from subquad.export import DEFAULT_INT8_WEIGHTS, export_model, quantize_int8

    torch.manual_seed(0)
    net = subquad.create_model(name).eval()
    x = torch.randn(1, 3, img_size, img_size)
    xn = x.numpy()
    files = {"fp32": folder / f"{name}-{img_size}.onnx", "int8": folder / f"{name}-{img_size}-int8.onnx"}
    export_model(net, "onnx", files["fp32"], (img_size, img_size), log=lambda *_: None)
    quantize_int8(files["fp32"], files["int8"], DEFAULT_INT8_WEIGHTS)
    sides = {"fp32 eager": lambda: net(x)}
    for prec, path in files.items():
        sess = ort.InferenceSession(str(path), _ort_options(), providers=["CPUExecutionProvider"])
        sides[f"{prec} ort"] = (lambda s, i: lambda: s.run(None, {i: xn}))(sess, sess.get_inputs()[0].name)
    with torch.no_grad():
        times = interleaved_times(sides, rounds, warmup, block, pause)
    med = {side: statistics.median(t) for side, t in times.items()}
    del sides
    prof = {prec: profile(path, xn, steps, folder) for prec, path in files.items()}
    fp32_share = prof["fp32"]["gemm"] / prof["fp32"]["wall"]
    int8_share = prof["int8"]["gemm"] / prof["int8"]["wall"]
    between = 1 - (prof["int8"]["gemm"] + sum(prof["int8"]["ops"].values())) / prof["int8"]["wall"]
    gain = prof["fp32"]["gemm"] / prof["int8"]["gemm"]
    free, peak, verdict = bounds(med["fp32 eager"], med["int8 ort"], int8_share, gain, peak_gemm_gain, target)
    top = collections.Counter(prof["int8"]["ops"]).most_common(4)
    rest_top = "; ".join(f"{op} {100 * ms / prof['int8']['wall']:.1f}%" for op, ms in top)
    return dict(model=name, img_size=img_size, rounds=rounds, block=block, pause=pause, profile_steps=steps,
                fp32_eager_ms=round(med["fp32 eager"], 3), fp32_ort_ms=round(med["fp32 ort"], 3),
                int8_ort_ms=round(med["int8 ort"], 3), int8_speedup=round(med["fp32 eager"] / med["int8 ort"], 3),
                fp32_ort_gemm_share=round(fp32_share, 3), int8_gemm_share=round(int8_share, 3),
                int8_between_share=round(between, 3), gemm_gain=round(gain, 3),
                peak_gemm_gain=round(peak_gemm_gain, 3), bound_free_gemm=round(free, 3),
                bound_peak_gemm=round(peak, 3), target=target, verdict=verdict, rest_top=rest_top,
                int8_weights=DEFAULT_INT8_WEIGHTS, int8_saturates=int(int8_saturates()))


def _fp32_ort_gemm(n: int):
    """One n^3 fp32 MatMul with a constant weight in an ONNX Runtime session, as a callable."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from subquad.bench.precision import _ort_options

    g = np.random.default_rng(0)
    b = numpy_helper.from_array(g.standard_normal((n, n)).astype(np.float32), "B")
    graph = helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["Y"])], "gemm",
                              [helper.make_tensor_value_info("A", TensorProto.FLOAT, [n, n])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [n, n])], [b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    sess = ort.InferenceSession(model.SerializeToString(), _ort_options(), providers=["CPUExecutionProvider"])
    a = g.standard_normal((n, n)).astype(np.float32)
    return lambda: sess.run(None, {"A": a})


def peak_gemm_gain(rounds: int = 15, n: int = 1024, pause: float = 0.1) -> float:
    """This CPU's int8 over fp32 GEMM rate in ONNX Runtime: a MatMulInteger (what the int8 files run) against an
    fp32 MatMul on n^3 products, alternating (`interleaved_times`), the ratio of each side's fastest block (the
    peak: on a shared machine the medians wander more than the best)."""
    from subquad.bench.precision import _int8_gemm

    times = interleaved_times({"fp32": _fp32_ort_gemm(n), "int8": _int8_gemm(n)}, rounds, 2, 3, pause)
    return min(times["fp32"]) / min(times["int8"])


def table(paths: list[str]) -> str:
    """The Markdown table of docs/benchmarks.md from CSVs this script wrote (rows in file order)."""
    from subquad.bench.sweep import read_csv
    from subquad.errors import UserError

    if not paths:
        raise UserError("--table needs the CSVs this script wrote")
    rows = []
    for path in paths:
        if not Path(path).is_file():
            raise UserError(f"--table: {path} is not a file")
        got = read_csv(path)
        if not got or list(got[0]) != COLUMNS:
            raise UserError(f"--table: {path} is not a CSV of this script (its columns differ)")
        rows += got
    lines = ["| model | px | fp32 eager (ms) | int8 ORT speed-up | weight-GEMM share (int8) | GEMM gain (peak) | "
             "bound, GEMMs free | bound, GEMMs at peak | verdict | largest other kernels (int8) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['model']}` | {r['img_size']} | {float(r['fp32_eager_ms']):.1f} | "
                     f"{float(r['int8_speedup']):.2f}x | {100 * float(r['int8_gemm_share']):.0f} % | "
                     f"{float(r['gemm_gain']):.2f} ({float(r['peak_gemm_gain']):.2f}) | "
                     f"{float(r['bound_free_gemm']):.2f}x | {float(r['bound_peak_gemm']):.2f}x | {r['verdict']} | "
                     f"{r['rest_top']} |")
    return "\n".join(lines)


def summary(paths: list[str], sweep_parts: str | None = None, target: float = 1.5) -> str:
    """Per (model, size), over every CSV of this script in `paths` (processes) and the int8 ONNX Runtime rows of
    `benchmarks/models_precision.py`'s parts in `sweep_parts` (one more process, where present): the verdict of the
    README tables. A pair reaches `target` when the median of its int8 speed-ups (sweep and interleaved) or of its
    fp32 ONNX Runtime ones (interleaved) does; a pair that misses is out of reach for int8 weights when every
    interleaved process puts `bound_peak_gemm` below `target`, and within reach of the peak otherwise. Two tables:
    the pairs the sweep measured, then the others."""
    from subquad.bench.sweep import read_csv
    from subquad.errors import UserError

    table(paths)  # the same refusals
    runs: dict = {}
    for path in paths:
        for r in read_csv(path):
            runs.setdefault((r["model"], int(r["img_size"])), []).append(r)
    sweep = {}
    if sweep_parts is not None:
        if not Path(sweep_parts).is_dir():
            raise UserError(f"--sweep: {sweep_parts} is not a folder of models_precision.py parts")
        for part in sorted(Path(sweep_parts).glob("*.csv")):
            for r in read_csv(part):
                if (r.get("precision"), r.get("backend")) == ("int8", "onnxruntime") and r["speedup_vs_fp32_eager"]:
                    sweep[(r["model"], int(r["infer_img_size"].split("x")[0]))] = float(r["speedup_vs_fp32_eager"])
    with_sweep = ["| model | px | int8 ORT: sweep; interleaved | median | fp32 ORT (interleaved) | "
                  "bound at peak GEMMs | verdict |", "|---|---|---|---|---|---|---|"]
    without = ["| model | px | int8 ORT | fp32 ORT | bound at peak GEMMs | verdict | largest other kernels (int8) |",
               "|---|---|---|---|---|---|---|"]
    for (model, size), rows in sorted(runs.items()):
        int8 = [float(r["int8_speedup"]) for r in rows]
        fp32 = [float(r["fp32_eager_ms"]) / float(r["fp32_ort_ms"]) for r in rows]
        peak = [float(r["bound_peak_gemm"]) for r in rows]
        swept = sweep.get((model, size))
        median = statistics.median(([swept] if swept is not None else []) + int8)
        if max(median, statistics.median(fp32)) >= target:
            verdict = "reaches"
        elif max(peak) < target:
            verdict = "out of reach by int8 weights"
        else:
            verdict = "misses (within reach at peak)"
        if swept is None and len(rows) == 1:
            without.append(f"| `{model}` | {size} | {int8[0]:.2f}x | {fp32[0]:.2f}x | {peak[0]:.2f}x | {verdict} | "
                           f"{rows[0]['rest_top']} |")
            continue
        first = f"{swept:.2f}; " if swept is not None else ""
        with_sweep.append(f"| `{model}` | {size} | {first}{', '.join(f'{x:.2f}' for x in int8)} | {median:.2f}x | "
                          f"{', '.join(f'{x:.2f}' for x in fp32)} | {', '.join(f'{x:.2f}' for x in peak)} | "
                          f"{verdict} |")
    return "\n".join(with_sweep) + "\n\n" + "\n".join(without)


def main(argv=None) -> int:
    from subquad.errors import UserError

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--table"]:
        print(table(argv[1:]))
        return 0
    if argv[:1] == ["--summary"]:
        sweep = None
        rest = argv[1:]
        if rest[:1] == ["--sweep"]:
            if len(rest) < 2:
                raise UserError("--summary --sweep needs the folder of models_precision.py parts")
            sweep, rest = rest[1], rest[2:]
        print(summary(rest, sweep))
        return 0
    p = interleaved_parser(__doc__, MODELS, rounds=7, per_round="one block of each side per round")
    p.add_argument("--block", type=int, default=3, help="timed steps per block (after one untimed step)")
    p.add_argument("--profile-steps", type=int, default=5, help="profiled steps of each ONNX file")
    p.add_argument("--target", type=float, default=1.5, help="speed-up over fp32 eager the verdict is about")
    p.add_argument("--pause", type=float, default=0.1, help="seconds slept before each side's turn (untimed)")
    args = p.parse_args(argv)
    out = new_output(args.out)
    check_interleaved_args(args, ("block", "profile_steps"))
    if not args.target > 0 or not args.pause >= 0:
        raise UserError(f"--target must be positive and --pause >= 0 "
                        f"(got --target {args.target}, --pause {args.pause})")
    env = script_setup(args.model, args.threads)
    peak = peak_gemm_gain(pause=args.pause)
    rows = []
    with tempfile.TemporaryDirectory(prefix="int8-breakdown-") as tmp:
        for name in args.model:
            for size in args.img_size:
                row = measure(name, size, args.rounds, args.warmup, args.block, args.profile_steps, args.target,
                              peak, Path(tmp), args.pause)
                rows.append({**row, **env})
                print(rows[-1], flush=True)
    write_csv(rows, out, COLUMNS)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from subquad.bench.sweep import run_script

    run_script(main, "int8_ort_breakdown")
