"""Why ONNX Runtime's fp32 model rows reach a `gemm_fraction` above 1 (docs/benchmarks.md, "bf16 and int8: speed
per model").

`gemm_fraction` divides a model's achieved rate (2 x its eager GMACs / step time) by one 1024^3 `torch.matmul`.
ONNX Runtime's fp32 rows reach up to 1.6 of that. Two explanations are measured side by side, in one process and
in interleaved rounds, with the same threads:
    - `gemm` rows: the products themselves, `torch.matmul` against an ONNX Runtime MatMul with the same operands
      (B a constant initializer, as a Linear weight is in an exported model), at 1024^3 and at the shapes of the
      Linear layers of the models measured (tokens x in x out). If ONNX Runtime's rate is higher on the same
      product, its GEMM (MLAS) is faster and the model rows follow from that.
    - `model` rows: the whole model in eager fp32, in ONNX Runtime with its default graph optimizations and with
      all of them off (`ORT_DISABLE_ALL`: no constant folding, no fusion). If the speed stays when nothing is folded
      or fused, folding parameter-only subgraphs is not what makes ONNX Runtime fast. `const_nodes` counts the nodes
      of the exported graph that depend on nothing but initializers (what constant folding could remove).
Both kinds also time engine `torch_onednn`: the same product or model in torch with its fp32 Linear layers run
through oneDNN (`torch.utils.mkldnn.MkldnnLinear`) instead of torch's default BLAS, which tells whether the gap is
ONNX Runtime's or torch's default GEMM's.

Usage (from the repository root, on a quiet machine: `uptime`):
    python benchmarks/ort_fp32_rate.py --out benchmarks/results/ort-fp32-rate-<hw>-pt<torch>.csv
    python benchmarks/ort_fp32_rate.py --model flatten_deit_tiny --img-size 224 --out runs/try.csv

Columns: kind ('gemm' or 'model'), name (shape M x K x N, or the model), img_size, engine, ms (median of the
rounds), gflops (2 x MACs / ms), ratio_vs_torch (torch's ms / this ms on the same row kind and name: > 1 is faster),
gmacs, const_nodes, nodes, threads, cpu.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from subquad.errors import UserError  # noqa: E402

COLUMNS = ["kind", "name", "img_size", "engine", "ms", "gflops", "ratio_vs_torch", "gmacs", "const_nodes", "nodes",
           "threads", "cpu"]
# Products: 1024^3 (the gemm_fraction reference), DeiT-S's Linear layers (197 tokens; qkv, fc1, fc2) and Swin-S's
# first-stage ones (3136 tokens at 224 px; qkv, fc1, fc2).
SHAPES = [(1024, 1024, 1024), (197, 384, 1152), (197, 384, 1536), (197, 1536, 384), (3136, 96, 288),
          (3136, 96, 384), (3136, 384, 96)]


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="CSV to write (refused if it exists)")
    p.add_argument("--model", nargs="+", default=["flatten_deit_small", "flatten_swin_small", "agent_deit_small"])
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES),
                   help="comma-separated MxKxN products (empty: none)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds; each times every engine once")
    p.add_argument("--min-time", type=float, default=0.5, help="seconds of calls per engine and round")
    p.add_argument("--threads", type=int, default=None, help="torch and ONNX Runtime threads (default: torch's)")
    return p.parse_args(argv)


def _options(level: str, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                     "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}[level]
    return opts


def _per_call(fn, min_time: float) -> float:
    """Seconds per call: the mean over as many calls as fill `min_time` (at least one)."""
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        dt = time.perf_counter() - t0
        if dt >= min_time:
            return dt / n


def interleaved(engines: dict, rounds: int, min_time: float) -> dict[str, float]:
    """Median ms per call of each engine, the engines alternating within every round (one warm-up call each)."""
    for fn in engines.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(rounds):
        for k, fn in engines.items():
            times[k].append(_per_call(fn, min_time))
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def const_nodes(path: Path) -> tuple[int, int]:
    """(nodes whose inputs all come from initializers, constants or such nodes; all nodes) of an ONNX file's main
    graph."""
    import onnx

    g = onnx.load(str(path), load_external_data=False).graph
    known = {i.name for i in g.initializer}
    count = 0
    for node in g.node:
        ins = [i for i in node.input if i]
        if node.op_type == "Constant" or (ins and all(i in known for i in ins)):
            known.update(node.output)
            count += node.op_type != "Constant"
    return count, len(g.node)


def onednn_linears(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of `module` whose fp32 `nn.Linear` layers run through oneDNN (`torch.utils.mkldnn.MkldnnLinear`,
    weights packed once) instead of torch's default BLAS; inference only. Everything else is unchanged."""
    import copy

    from torch.utils.mkldnn import MkldnnLinear

    module = copy.deepcopy(module)
    if type(module) is torch.nn.Linear:
        return MkldnnLinear(module, torch.float)
    for parent in list(module.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, child_name, MkldnnLinear(child, torch.float))
    return module


def gemm_rows(shape: tuple[int, int, int], args) -> list[dict]:
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    m, k, n = shape
    g = np.random.default_rng(0)
    a, b = g.standard_normal((m, k), dtype=np.float32), g.standard_normal((k, n), dtype=np.float32)
    init = helper.make_tensor("B", TensorProto.FLOAT, [k, n], b.tobytes(), raw=True)
    graph = helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["Y"])], "gemm",
                              [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])], [init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(model.SerializeToString(), _options("all", args.threads),
                                providers=["CPUExecutionProvider"])
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    got = torch.from_numpy(sess.run(None, {"A": a})[0])
    if not torch.allclose(got, ta @ tb, rtol=1e-4, atol=1e-3):
        raise AssertionError(f"ONNX Runtime's MatMul {shape} differs from torch.matmul")
    lin = torch.nn.Linear(k, n, bias=False)
    lin.weight.data = tb.t().contiguous()
    onednn = onednn_linears(lin)
    with torch.no_grad():
        if not torch.allclose(onednn(ta), ta @ tb, rtol=1e-4, atol=1e-3):
            raise AssertionError(f"oneDNN's Linear {shape} differs from torch.matmul")

    def onednn_call():
        with torch.no_grad():
            onednn(ta)

    ms = interleaved({"torch": lambda: torch.matmul(ta, tb), "torch_onednn": onednn_call,
                      "onnxruntime": lambda: sess.run(None, {"A": a})}, args.rounds, args.min_time)
    name = "x".join(map(str, shape))
    return [{"kind": "gemm", "name": name, "engine": e, "ms": t, "gmacs": m * k * n / 1e9} for e, t in ms.items()]


def model_rows(name: str, args, folder: Path) -> list[dict]:
    import onnxruntime as ort

    import subquad
    from subquad.bench.flops import count_macs
    from subquad.export import export_model

    torch.manual_seed(0)
    model = subquad.create_model(name).eval()
    size = args.img_size
    path = folder / f"{name}.onnx"
    export_model(model, "onnx", path, (size, size), log=lambda *_: None)
    x = torch.randn(1, 3, size, size)
    sessions = {level: ort.InferenceSession(str(path), _options(level, args.threads),
                                            providers=["CPUExecutionProvider"]) for level in ("all", "none")}
    inp = sessions["all"].get_inputs()[0].name
    onednn = onednn_linears(model)
    with torch.no_grad():
        ref = model(x)
        if (onednn(x) - ref).abs().max() > 1e-3 * ref.abs().max():
            raise AssertionError(f"{name}: logits with oneDNN Linear layers differ from eager")
    for level, s in sessions.items():
        got = torch.from_numpy(s.run(None, {inp: x.numpy()})[0])
        if (got - ref).abs().max() > 1e-3 * ref.abs().max():
            raise AssertionError(f"{name}: ONNX Runtime ({level}) logits differ from eager")

    def eager():
        with torch.no_grad():
            model(x)

    def eager_onednn():
        with torch.no_grad():
            onednn(x)

    engines = {"torch": eager, "torch_onednn": eager_onednn}
    engines.update({f"onnxruntime_opt_{lv}": (lambda s=s: s.run(None, {inp: x.numpy()})) for lv, s in sessions.items()})
    ms = interleaved(engines, args.rounds, args.min_time)
    gmacs = count_macs(name, size)["gmacs"]
    const, nodes = const_nodes(path)
    return [{"kind": "model", "name": name, "img_size": size, "engine": e, "ms": t, "gmacs": gmacs,
             "const_nodes": const if e.startswith("onnx") else "", "nodes": nodes if e.startswith("onnx") else ""}
            for e, t in ms.items()]


def finish(rows: list[dict], threads: int) -> list[dict]:
    """gflops, ratio_vs_torch, threads and cpu on every row; numbers rounded."""
    from subquad.bench.sweep import _cpu_name

    torch_ms = {(r["kind"], r["name"]): r["ms"] for r in rows if r["engine"] == "torch"}
    for r in rows:
        r["gflops"] = float(f"{2 * r['gmacs'] / (r['ms'] / 1e3):.5g}")  # significant digits: tiny test shapes stay > 0
        r["ratio_vs_torch"] = round(torch_ms[(r["kind"], r["name"])] / r["ms"], 3)
        r["ms"], r["gmacs"] = float(f"{r['ms']:.6g}"), float(f"{r['gmacs']:.6g}")
        r.update(threads=threads, cpu=_cpu_name())
    return rows


def main(argv=None) -> int:
    args = _args(argv)
    from subquad.bench.sweep import new_output

    out = new_output(args.out)
    args.threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    except ValueError:
        raise UserError(f"--shapes {args.shapes!r}: give MxKxN products separated by commas, "
                        "e.g. 1024x1024x1024") from None
    if any(len(s) != 3 or min(s) < 1 for s in shapes):
        raise UserError(f"--shapes {args.shapes!r}: each product is three positive sizes MxKxN")
    rows: list[dict] = []
    for s in shapes:
        rows += gemm_rows(s, args)
        print(rows[-1]["name"], {r["engine"]: round(r["ms"], 3) for r in rows[-3:]}, flush=True)
    with tempfile.TemporaryDirectory() as folder:
        for name in args.model:
            rows += model_rows(name, args, Path(folder))
            print(name, {r["engine"]: round(r["ms"], 2) for r in rows[-4:]}, flush=True)
    from subquad.bench.sweep import write_csv

    write_csv(finish(rows, args.threads), out, COLUMNS)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from subquad.bench.sweep import run_script

    run_script(main, "ort_fp32_rate")
