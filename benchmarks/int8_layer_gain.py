"""What the int8 layers gain at a model's own shapes, and what gain 1.5x over fp32 eager would need.

`subquad.layers.int8.quantize_int8` turns every `nn.Linear` into `Int8DynamicLinear`: per call, a quantize pass
over the input (per-token scales), one `torch._int_mm`, and a dequantize pass (scales and bias) over the output,
each a separate eager kernel. `precision_interleaved.py --int8` bounds the int8 step with those GEMMs at the
machine's int8 rate on one 1024³ product and nothing else; this script measures the layer at the model's real
calls instead.

For each model and size: one step of the int8 copy records every int8 linear call (input shape, weight shape,
channel-major or not, bias). The calls are then replayed in step order on random operands of their shapes, each
call with its own weights (a step streams all of its weights from memory, 4x fewer bytes in int8; replaying one
call alone would keep its weights in cache and flatter fp32), three sides alternating for `--rounds` rounds
(medians of the whole sequence):
- fp32: what the float model runs for that call (`F.linear`, or for LiSA's channel-major q/k/v the `torch.baddbmm`
  it takes, `subquad.attention.structure_aware`);
- int8_layer: the int8 layer's code (quantize, `torch._int_mm`, dequantize; `_int8_linear_impl`);
- int_mm: `torch._int_mm` alone on pre-quantized operands (the GEMM with free quantization).
The whole fp32 and int8 steps alternate too (`--rounds` rounds, medians).

Columns: model, img_size, rounds, calls, fp32_step_ms, int8_step_ms, int8_speedup_vs_fp32_eager (their ratio),
fp32_linear_ms, int8_layer_ms, int_mm_ms (the replayed sequences), quant_dequant_ms (int8_layer_ms - int_mm_ms),
layer_gain (fp32_linear_ms / int8_layer_ms), int_mm_gain (fp32_linear_ms / int_mm_ms), linear_share_fp32
(fp32_linear_ms / fp32_step_ms), predicted_speedup (Amdahl: the fp32 step with its linear calls at int8_layer_ms),
bound_int_mm_only (the same at int_mm_ms: quantize and dequantize free), layer_gain_for_1p5 (the layer gain at which
the prediction reaches 1.5x; empty when even free linear calls stay below it), kept_freed_mib, threads, cpu,
cpu_family, torch. The sequences leave out the work between the calls (whose cache traffic the step has), so the
predictions are estimates of the step; compare them with the timed ratio in the same row.

Usage (from the repository root, on a quiet machine: `uptime`):
    python benchmarks/int8_layer_gain.py --model lisanet_i --img-size 224 512 --out <dir>/gain.csv
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from subquad.errors import UserError  # noqa: E402

COLUMNS = ["model", "img_size", "rounds", "calls", "fp32_step_ms", "int8_step_ms", "int8_speedup_vs_fp32_eager",
           "fp32_linear_ms", "int8_layer_ms", "int_mm_ms", "quant_dequant_ms", "layer_gain", "int_mm_gain",
           "linear_share_fp32", "predicted_speedup", "bound_int_mm_only", "layer_gain_for_1p5", "kept_freed_mib",
           "threads", "cpu", "cpu_family", "torch"]
TARGET = 1.5


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="CSV to write (refused if it exists)")
    p.add_argument("--model", nargs="+", default=["lisanet_i", "hylisanet_s", "lisanet_s"], metavar="NAME")
    p.add_argument("--img-size", type=int, nargs="+", default=[224, 512])
    p.add_argument("--rounds", type=int, default=15, help="timed rounds per call and per step")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    return p.parse_args(argv)


def record_calls(model: torch.nn.Module, x: torch.Tensor) -> list[tuple]:
    """Every int8 linear call of one step of `model` (an int8 copy): (x shape, weight shape, channel_major, bias)."""
    from subquad.layers import int8

    calls, real = [], int8._int8_linear_impl

    def spy(x, wq, scale_w, bias, channel_major, out_dtype):
        calls.append((tuple(x.shape), tuple(wq.shape), channel_major, bias is not None))
        return real(x, wq, scale_w, bias, channel_major, out_dtype)

    int8._int8_linear_impl = spy
    try:
        with torch.no_grad():
            model(x)
    finally:
        int8._int8_linear_impl = real
    return calls


def _sides(call: tuple, gen: torch.Generator) -> dict:
    """The three sides of one recorded call, as closures over random operands of its shapes."""
    from subquad.layers.int8 import _int8_linear_impl, quantize_rows

    x_shape, w_shape, channel_major, has_bias = call
    x = torch.randn(x_shape, generator=gen)
    w = torch.randn(w_shape, generator=gen) * w_shape[1] ** -0.5
    b = torch.randn(w_shape[0], generator=gen) if has_bias else None
    wq, sw = quantize_rows(w, 1)
    sw = sw[:, 0]
    if channel_major:
        B, N = x_shape[0], x_shape[1]
        wb = w.expand(B, *w_shape)
        xt = x.transpose(1, 2)
        fp32 = (lambda: torch.baddbmm(b[:, None].expand(B, -1, N), wb, xt)) if has_bias else (lambda: torch.bmm(wb, xt))
        xq = quantize_rows(x)[0]

        def int_mm():
            return [torch._int_mm(wq, xq[i].t()) for i in range(B)]
    else:
        fp32 = lambda: F.linear(x, w, b)  # noqa: E731
        xq, wt = quantize_rows(x.reshape(-1, x_shape[-1]))[0], wq.t()
        int_mm = lambda: torch._int_mm(xq, wt)  # noqa: E731
    layer = lambda: _int8_linear_impl(x, wq, sw, b, channel_major, torch.float32)  # noqa: E731
    return {"fp32": fp32, "int8_layer": layer, "int_mm": int_mm}


def _in_order(fns: list[Callable[[], object]]) -> Callable[[], None]:
    """One side's calls of a whole step, one after the other."""
    def run():
        for fn in fns:
            fn()
    return run


def interleaved(sides: dict, rounds: int, warmup: int = 2) -> dict:
    """Median seconds per side, the sides alternating (order flipped every round)."""
    from subquad.bench.sweep import interleaved_times

    with torch.no_grad():
        times = interleaved_times(sides, rounds, warmup)
    return {k: statistics.median(v) / 1e3 for k, v in times.items()}


def measure(name: str, size: int, rounds: int) -> dict:
    import subquad
    from subquad.layers.int8 import quantize_int8

    torch.manual_seed(0)
    model = subquad.create_model(name, img_size=size).eval()
    q = quantize_int8(model)
    x = torch.randn(1, 3, size, size)
    calls = record_calls(q, x)
    if not calls:
        raise UserError(f"{name} has no nn.Linear layer for quantize_int8 to convert: nothing to measure")
    gen = torch.Generator().manual_seed(0)
    per_call = [_sides(call, gen) for call in calls]  # each call its own operands, as the step has its own weights
    sums = interleaved({k: _in_order([c[k] for c in per_call]) for k in ("fp32", "int8_layer", "int_mm")}, rounds)
    steps = interleaved({"fp32": lambda: model(x), "int8": lambda: q(x)}, rounds)
    fp32_step, lin, layer, mm = steps["fp32"], sums["fp32"], sums["int8_layer"], sums["int_mm"]
    rest = max(fp32_step - lin, 0.0)
    room = fp32_step / TARGET - rest
    return dict(model=name, img_size=size, rounds=rounds, calls=len(calls), fp32_step_ms=round(fp32_step * 1e3, 3),
                int8_step_ms=round(steps["int8"] * 1e3, 3),
                int8_speedup_vs_fp32_eager=round(fp32_step / steps["int8"], 3),
                fp32_linear_ms=round(lin * 1e3, 3), int8_layer_ms=round(layer * 1e3, 3), int_mm_ms=round(mm * 1e3, 3),
                quant_dequant_ms=round((layer - mm) * 1e3, 3), layer_gain=round(lin / layer, 3),
                int_mm_gain=round(lin / mm, 3), linear_share_fp32=round(lin / fp32_step, 4),
                predicted_speedup=round(fp32_step / (rest + layer), 3),
                bound_int_mm_only=round(fp32_step / (rest + mm), 3),
                layer_gain_for_1p5=round(lin / room, 3) if room > 0 else "")


def main(argv=None) -> int:
    from subquad.bench.sweep import new_output, script_setup, write_csv

    args = _args(argv)
    out = new_output(args.out)
    if min(args.rounds, *args.img_size) < 1 or (args.threads is not None and args.threads < 1):
        raise UserError("--rounds, --img-size and --threads must be positive")
    env = script_setup(args.model, args.threads)
    rows = []
    for name in args.model:
        for size in args.img_size:
            row = measure(name, size, args.rounds)
            row.update(env)
            print({k: row[k] for k in ("model", "img_size", "int8_speedup_vs_fp32_eager", "layer_gain", "int_mm_gain",
                                       "linear_share_fp32", "predicted_speedup", "bound_int_mm_only",
                                       "layer_gain_for_1p5")}, flush=True)
            rows.append(row)
    write_csv(rows, out, COLUMNS)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from subquad.bench.sweep import run_script

    run_script(main, "int8_layer_gain")
