"""bf16 eager over fp32 eager per model, timed alternately in one process: a ratio that holds on a noisy machine.

`subquad bench model --precision fp32,bf16` times each path as a block of steps, one after the other; where the
machine's speed drifts between the blocks (a shared host), so does the ratio. Here one fp32 step and one bf16 step
alternate (the order flipping every round) on the same model and input, so drift reaches both sides alike and the
ratio of the medians (`speedup_vs_fp32_eager`) is the path's own.

Sides, all batch 1 and without autograd:
- fp32: plain eager;
- bf16: eager under `torch.autocast("cpu", torch.bfloat16)` held around all the steps under `torch.no_grad()`, as
  `subquad predict`, `eval` and `bench model` hold it: autocast casts each weight once and keeps it (its weight cache);
- bf16_inference_mode: the same steps under `torch.inference_mode()`, where autocast keeps no cast weights (torch
  2.14), so every weight is cast again each step: what a serving loop written with inference_mode pays.
- int8 (with `--int8`): `subquad.layers.int8.quantize_int8(model)`, every `nn.Linear` a dynamic int8 GEMM
  (`torch._int_mm`), the rest in fp32 (autocast off), as `subquad eval --precision int8` runs it;
- int8_bf16 (with `--int8`): the same int8 copy inside the bf16 autocast region, so that what is not an `nn.Linear`
  (convolutions, attention products) runs as in bf16: an experiment, not a `--precision` of the library;
- bf16_compile (with `--compile`): `torch.compile(model)` (inductor) in the same bf16 region, compiled by its first
  call before the timed rounds, as `subquad bench model --backend compile` runs it.
- bf16_compile_fused (with `--compile --fused-attention`): the same compiled model called under
  `subquad.backend.use_backend("plain")`, which traces softmax attention through torch's fused kernel
  (`scaled_dot_product_attention`) instead of the written-out bf16 form `subquad.backend.decompose_attention` picks
  under torch.compile on a CPU: the two attention schedules side by side (the compiled model keeps one graph per
  backend, as torch.compile guards on it).
The fp32 steps run in a nested `torch.autocast(enabled=False)` region, which leaves the weight cache intact.

What bounds the ratio (Amdahl): bf16 speeds up the GEMMs, not the rest of the step (LiSA's FFTs stay fp32, as torch has
no bf16 FFT on the CPU; elementwise work and casts gain nothing). From torch's profiler over `--profile-steps` steps of
each precision (after the timed rounds, one step per profile, alternating as the timed rounds do): `gemm_share_fp32`,
the GEMMs' share of the fp32 step's self CPU time, and `gemm_speedup_bf16`, their fp32 over bf16 time in this model.
`bound_vs_fp32_eager` = 1 / ((1 - share) + share / gemm_speedup_bf16) is the ratio with the GEMMs at that speed-up and
everything else at its fp32 time; `machine_bound_vs_fp32_eager` the same with the machine's own bf16 / fp32 rate of one
1024 x 1024 matmul at these threads (`machine_gemm_bf16_vs_fp32`). The rest of the step is not always at its fp32 time
under bf16 (elementwise work on bf16 activations moves half the bytes): `rest_speedup_bf16` is its profiled fp32 over
bf16 time, and `machine_bound_bf16_rest` = 1 / ((1 - share) / rest_speedup_bf16 + share / machine_gemm_bf16_vs_fp32) the
step with the GEMMs at the machine's full bf16 rate and the rest as fast as it ran in bf16.

Columns: model, img_size, rounds, fp32_ms, bf16_ms, bf16_inference_mode_ms (medians), speedup_vs_fp32_eager
(fp32_ms / bf16_ms), inference_mode_vs_no_grad (bf16_inference_mode_ms / bf16_ms), gemm_share_fp32,
gemm_speedup_bf16, bound_vs_fp32_eager, machine_gemm_bf16_vs_fp32, machine_bound_vs_fp32_eager, rest_speedup_bf16,
machine_bound_bf16_rest, profiled_speedup_bf16 (the profiled fp32 over bf16 self CPU time: how far the profile
agrees with the timed ratio), rel_diff (relative
RMS of the bf16 logits against fp32), bf16_compile_ms, compile_speedup_vs_fp32_eager (fp32_ms / bf16_compile_ms;
both empty without `--compile`), bf16_compile_fused_ms, compile_fused_speedup_vs_fp32_eager (the same for
bf16_compile_fused; empty without `--fused-attention`); with `--int8`: int8_ms, int8_speedup_vs_fp32_eager,
int8_rel_diff, machine_gemm_int8_vs_fp32 (`torch._int_mm` over fp32 of one 1024 x 1024 product), linear_share_fp32 (the
share of the fp32 step in the ops `nn.Linear` and LiSA's q/k/v run as: addmm, mm, baddbmm), machine_bound_int8_linear
(those at the machine's int8 rate, the rest at its fp32 time: the bound of this path) and machine_bound_int8_all (every
GEMM and convolution of GEMM_OPS at that rate: the bound had every product of the model been int8),
int8_bf16_ms, int8_bf16_speedup_vs_fp32_eager, int8_bf16_rel_diff; bf16_native
(the CPU's bf16 flag, `subquad.backend.cpu_features`), kept_freed_mib,
threads, cpu, cpu_family (from /proc/cpuinfo: AMD family 25 is Zen 3/4, 26 Zen 5), torch.

Usage (from the repository root, on a quiet machine: `uptime`):
    python benchmarks/precision_interleaved.py --out benchmarks/results/precision-interleaved-<hw>/run<n>.csv
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from subquad.errors import UserError  # noqa: E402

COLUMNS = ["model", "img_size", "rounds", "fp32_ms", "bf16_ms", "bf16_inference_mode_ms", "speedup_vs_fp32_eager",
           "inference_mode_vs_no_grad", "gemm_share_fp32", "gemm_speedup_bf16", "bound_vs_fp32_eager",
           "machine_gemm_bf16_vs_fp32", "machine_bound_vs_fp32_eager", "rest_speedup_bf16", "machine_bound_bf16_rest",
           "profiled_speedup_bf16", "rel_diff", "bf16_compile_ms",
           "compile_speedup_vs_fp32_eager", "bf16_compile_fused_ms", "compile_fused_speedup_vs_fp32_eager",
           "int8_ms", "int8_speedup_vs_fp32_eager", "int8_rel_diff", "machine_gemm_int8_vs_fp32", "linear_share_fp32",
           "machine_bound_int8_linear", "machine_bound_int8_all", "int8_bf16_ms", "int8_bf16_speedup_vs_fp32_eager",
           "int8_bf16_rel_diff", "bf16_native", "kept_freed_mib", "threads", "cpu",
           "cpu_family", "torch"]
# Ops counted as GEMMs (self CPU time in torch's profiler): dense products and convolutions (depthwise ones too, which
# gain less from bf16, so the bounds below are generous).
GEMM_OPS = ("aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::mkldnn_convolution",
            "aten::_slow_conv2d_forward", "aten::slow_conv3d_forward", "aten::_conv_depthwise2d",
            "aten::_nnpack_spatial_convolution", "aten::slow_conv_dilated2d", "aten::slow_conv_dilated3d",
            "aten::_scaled_dot_product_flash_attention_for_cpu")
LINEAR_OPS = ("aten::addmm", "aten::mm", "aten::baddbmm")  # what nn.Linear and LiSA's q/k/v GEMM run as in fp32
MODELS = ["lisanet_s", "hylisanet_s", "lisanet_i"]


def _args(argv):
    from subquad.bench.sweep import interleaved_parser

    p = interleaved_parser(__doc__, MODELS)
    p.add_argument("--compile", action="store_true", help="also time bf16 under torch.compile (side bf16_compile)")
    p.add_argument("--fused-attention", action="store_true",
                   help="with --compile, also time the compiled model with attention through the fused kernel "
                        "(side bf16_compile_fused)")
    p.add_argument("--int8", action="store_true", help="also time the int8 copy of the model (side int8)")
    p.add_argument("--profile-steps", type=int, default=6, help="profiled steps per precision for the GEMM share")
    return p.parse_args(argv)


def cpu_family() -> str:
    """The 'cpu family' field of /proc/cpuinfo ('' where there is none)."""
    from subquad.bench.sweep import cpuinfo_field

    return cpuinfo_field("cpu family")


def machine_gemm_ratio(n: int = 1024, reps: int = 10) -> float:
    """This machine's bf16 over fp32 rate of an n x n x n matmul at torch's threads (median of `reps`, interleaved)."""
    g = torch.Generator().manual_seed(0)
    a32, b32 = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    a16, b16 = a32.bfloat16(), b32.bfloat16()
    times = {torch.float32: [], torch.bfloat16: []}
    for r in range(reps + 1):
        for a, b in ((a32, b32), (a16, b16)):
            t0 = time.perf_counter()
            a @ b
            if r:
                times[a.dtype].append(time.perf_counter() - t0)
    return statistics.median(times[torch.float32]) / statistics.median(times[torch.bfloat16])


def machine_int8_ratio(n: int = 1024, reps: int = 10) -> float:
    """This machine's `torch._int_mm` over fp32 rate of an n x n x n product (median of `reps`, interleaved)."""
    g = torch.Generator().manual_seed(0)
    a32, b32 = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    a8, b8 = (torch.randint(-127, 128, (n, n), generator=g, dtype=torch.int8) for _ in range(2))
    times = {"fp32": [], "int8": []}
    for r in range(reps + 1):
        for side, fn in (("fp32", lambda: a32 @ b32), ("int8", lambda: torch._int_mm(a8, b8))):
            t0 = time.perf_counter()
            fn()
            if r:
                times[side].append(time.perf_counter() - t0)
    return statistics.median(times["fp32"]) / statistics.median(times["int8"])


def gemm_times(sides: dict, steps: int) -> dict:
    """{side: (GEMM self CPU time, all self CPU time, LINEAR_OPS self CPU time)} in seconds over `steps` calls of each
    sides[side]() under torch's profiler, one call per profile, the sides alternating (order flipping each round) as
    the timed rounds do."""
    from torch.profiler import profile

    out = {side: [0.0, 0.0, 0.0] for side in sides}
    for r in range(steps):
        for side in (list(sides) if r % 2 == 0 else list(reversed(sides))):
            with profile() as p:
                sides[side]()
            events = p.key_averages()
            out[side][0] += sum(e.self_cpu_time_total for e in events if e.key in GEMM_OPS) / 1e6
            out[side][1] += sum(e.self_cpu_time_total for e in events) / 1e6
            out[side][2] += sum(e.self_cpu_time_total for e in events if e.key in LINEAR_OPS) / 1e6
    return {side: tuple(v) for side, v in out.items()}


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("nan")


def amdahl(share: float, speedup: float, rest_speedup: float = 1.0) -> float:
    """The step's speed-up when a `share` of it runs `speedup` times faster and the rest `rest_speedup` times."""
    return 1.0 / ((1.0 - share) / rest_speedup + share / speedup)


def _sig(x: float, digits: int = 4) -> float:
    """`x` to `digits` significant digits: ratios span 0.008 (bf16 emulated on a CPU without it) to 4."""
    return float(f"{x:.{digits}g}")


def measure(name: str, img_size: int, rounds: int, warmup: int, profile_steps: int = 3,
            machine_ratio: float | None = None, compile: bool = False, fused_attention: bool = False,
            int8_ratio: float | None = None) -> dict:
    """One model at one size: the sides timed alternately (see the module docstring)."""
    import subquad
    from subquad import backend
    from subquad.bench.sweep import interleaved_times

    torch.manual_seed(0)
    net = subquad.create_model(name).eval()
    x = torch.randn(1, 3, img_size, img_size)

    def fp32():
        with torch.autocast("cpu", enabled=False):
            return net(x)

    def bf16_inference_mode():
        with torch.inference_mode():
            return net(x)

    sides = {"fp32": fp32, "bf16": lambda: net(x), "bf16_inference_mode": bf16_inference_mode}
    if int8_ratio is not None:
        from subquad.layers.int8 import quantize_int8

        net8 = quantize_int8(net)

        def int8():
            with torch.autocast("cpu", enabled=False):
                return net8(x)

        sides["int8"] = int8
        sides["int8_bf16"] = lambda: net8(x)  # inside the bf16 autocast region the steps run in
    if compile:
        # A fresh dynamo cache per size (see subquad.bench.sweep: the cache of an earlier size would make dynamo
        # recompile this one with symbolic shapes).
        torch._dynamo.reset()
        compiled = torch.compile(net)
        sides["bf16_compile"] = lambda: compiled(x)
    if compile and fused_attention:
        def compiled_fused():
            with backend.use_backend("plain"):
                return compiled(x)

        sides["bf16_compile_fused"] = compiled_fused
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        ref, low = fp32().float(), net(x).float()
        low8 = sides["int8"]().float() if "int8" in sides else None
        low8_16 = sides["int8_bf16"]().float() if "int8" in sides else None
        if compile:
            compiled(x)  # compiles, untimed
        if "bf16_compile_fused" in sides:
            compiled_fused()  # the second graph, untimed
        times = interleaved_times(sides, rounds, warmup)
        prof = gemm_times({"fp32": fp32, "bf16": sides["bf16"]}, profile_steps)
    (g32, t32, lin32), (g16, t16, _) = prof["fp32"], prof["bf16"]
    share, gemm_speedup, rest_speedup = _ratio(g32, t32), _ratio(g32, g16), _ratio(t32 - g32, t16 - g16)
    machine = machine_gemm_ratio() if machine_ratio is None else machine_ratio
    med = {k: statistics.median(v) for k, v in times.items()}
    diff = float((low.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30))
    return dict(model=name, img_size=img_size, rounds=rounds, fp32_ms=round(med["fp32"], 3),
                bf16_ms=round(med["bf16"], 3), bf16_inference_mode_ms=round(med["bf16_inference_mode"], 3),
                speedup_vs_fp32_eager=_sig(med["fp32"] / med["bf16"]),
                inference_mode_vs_no_grad=_sig(med["bf16_inference_mode"] / med["bf16"]),
                gemm_share_fp32=round(share, 4), gemm_speedup_bf16=_sig(gemm_speedup),
                bound_vs_fp32_eager=_sig(amdahl(share, gemm_speedup)), machine_gemm_bf16_vs_fp32=_sig(machine),
                machine_bound_vs_fp32_eager=_sig(amdahl(share, machine)), rest_speedup_bf16=_sig(rest_speedup),
                machine_bound_bf16_rest=_sig(amdahl(share, machine, rest_speedup)),
                profiled_speedup_bf16=_sig(_ratio(t32, t16)), rel_diff=f"{diff:.2e}",
                bf16_compile_ms=round(med["bf16_compile"], 3) if compile else "",
                compile_speedup_vs_fp32_eager=round(med["fp32"] / med["bf16_compile"], 3) if compile else "",
                **_fused_columns(med), **_int8_columns(med, ref, low8, _ratio(lin32, t32), _ratio(g32, t32),
                                                       int8_ratio, low8_16))


def _rel(a: torch.Tensor, ref: torch.Tensor) -> str:
    return f"{float((a.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)):.2e}"


def _int8_columns(med: dict, ref: torch.Tensor, low8: torch.Tensor | None, linear_share: float, gemm_share: float,
                  int8_ratio: float | None, low8_16: torch.Tensor | None = None) -> dict:
    if "int8" not in med:
        return dict.fromkeys(("int8_ms", "int8_speedup_vs_fp32_eager", "int8_rel_diff", "machine_gemm_int8_vs_fp32",
                              "linear_share_fp32", "machine_bound_int8_linear", "machine_bound_int8_all",
                              "int8_bf16_ms", "int8_bf16_speedup_vs_fp32_eager", "int8_bf16_rel_diff"), "")
    return dict(int8_ms=round(med["int8"], 3), int8_speedup_vs_fp32_eager=round(med["fp32"] / med["int8"], 3),
                int8_rel_diff=_rel(low8, ref), machine_gemm_int8_vs_fp32=round(int8_ratio, 3),
                linear_share_fp32=round(linear_share, 4),
                machine_bound_int8_linear=round(amdahl(linear_share, int8_ratio), 3),
                machine_bound_int8_all=round(amdahl(gemm_share, int8_ratio), 3),
                int8_bf16_ms=round(med["int8_bf16"], 3),
                int8_bf16_speedup_vs_fp32_eager=round(med["fp32"] / med["int8_bf16"], 3),
                int8_bf16_rel_diff=_rel(low8_16, ref))


def _fused_columns(med: dict) -> dict:
    if "bf16_compile_fused" not in med:
        return dict(bf16_compile_fused_ms="", compile_fused_speedup_vs_fp32_eager="")
    return dict(bf16_compile_fused_ms=round(med["bf16_compile_fused"], 3),
                compile_fused_speedup_vs_fp32_eager=round(med["fp32"] / med["bf16_compile_fused"], 3))


def main(argv=None) -> int:
    from subquad import backend
    from subquad.bench.sweep import check_interleaved_args, new_output, script_setup, write_csv

    args = _args(argv)
    out = new_output(args.out)
    if args.fused_attention and not args.compile:
        raise UserError("--fused-attention times a second compiled side: give --compile with it")
    check_interleaved_args(args, ["profile_steps"])
    env = dict(bf16_native=int(backend.cpu_features().bf16), **script_setup(args.model, args.threads))
    machine = machine_gemm_ratio()
    int8_ratio = machine_int8_ratio() if args.int8 else None
    rows = []
    for name in args.model:
        for size in args.img_size:
            row = measure(name, size, args.rounds, args.warmup, args.profile_steps, machine, args.compile,
                          args.fused_attention, int8_ratio)
            row.update(env)
            print({k: row[k] for k in ("model", "img_size", "fp32_ms", "bf16_ms", "speedup_vs_fp32_eager",
                                       "inference_mode_vs_no_grad", "gemm_share_fp32", "bound_vs_fp32_eager",
                                       "machine_bound_vs_fp32_eager", "machine_bound_bf16_rest",
                                       "compile_speedup_vs_fp32_eager", "compile_fused_speedup_vs_fp32_eager",
                                       "int8_speedup_vs_fp32_eager", "machine_bound_int8_linear",
                                       "machine_bound_int8_all", "int8_bf16_speedup_vs_fp32_eager")},
                  flush=True)
            rows.append(row)
    write_csv(rows, out, COLUMNS)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from subquad.bench.sweep import run_script

    run_script(main, "precision_interleaved")
