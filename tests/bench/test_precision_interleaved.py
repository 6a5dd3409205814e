"""benchmarks/precision_interleaved.py: fp32 and bf16 eager steps timed alternately in one process."""

from __future__ import annotations

import csv

import pytest
import torch

from subquad.errors import UserError

from ._scripts import load_benchmark


def test_rows_columns_and_refusals(tmp_path, monkeypatch):
    """One row per (model, size) with the three sides timed, the ratios their medians' ratios, bf16 logits close to
    fp32; an existing output, an unknown model and a bad count refused in one line."""
    bench = load_benchmark("precision_interleaved")
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # --threads 1 must not outlive the test
    monkeypatch.setattr("subquad.backend.keep_freed_memory_from_env", lambda: False)  # the process keeps its malloc
    # The machine's bf16 / fp32 rate at 256^3, not 1024^3: on a CPU without native bf16 (emulated, ~100x slower than
    # fp32) the 1024^3 measurement alone takes ~15 s; the row's columns are checked against the value used.
    real_ratio = bench.machine_gemm_ratio
    monkeypatch.setattr(bench, "machine_gemm_ratio", lambda: real_ratio(n=256, reps=3))
    out = tmp_path / "p.csv"
    # one size: on a CPU without native bf16 each size costs several seconds
    argv = ["--model", "lisanet_micro", "--img-size", "40", "--rounds", "2", "--warmup", "1", "--threads", "1",
            "--out", str(out)]
    assert bench.main(argv) == 0
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == bench.COLUMNS
    assert [(r["model"], r["img_size"]) for r in rows] == [("lisanet_micro", "40")]
    for r in rows:
        fp32, bf16, im = (float(r[k]) for k in ("fp32_ms", "bf16_ms", "bf16_inference_mode_ms"))
        assert min(fp32, bf16, im) > 0 and r["rounds"] == "2"
        assert float(r["speedup_vs_fp32_eager"]) == pytest.approx(fp32 / bf16, rel=2e-2)
        assert float(r["inference_mode_vs_no_grad"]) == pytest.approx(im / bf16, rel=2e-2)
        assert 0 < float(r["rel_diff"]) < 5e-2, r  # bf16 rounding, not another function
        share, speedup, machine = (float(r[k]) for k in ("gemm_share_fp32", "gemm_speedup_bf16",
                                                         "machine_gemm_bf16_vs_fp32"))
        assert 0 < share < 1 and speedup > 0 and machine > 0
        assert float(r["bound_vs_fp32_eager"]) == pytest.approx(1 / (1 - share + share / speedup), rel=2e-3)
        assert float(r["machine_bound_vs_fp32_eager"]) == pytest.approx(1 / (1 - share + share / machine), rel=2e-3)
        rest = float(r["rest_speedup_bf16"])
        assert rest > 0
        bound = 1 / ((1 - share) / rest + share / machine)
        assert float(r["machine_bound_bf16_rest"]) == pytest.approx(bound, rel=3e-3)
        assert r["bf16_compile_ms"] == r["compile_speedup_vs_fp32_eager"] == ""  # no --compile
        assert r["bf16_compile_fused_ms"] == r["compile_fused_speedup_vs_fp32_eager"] == ""
    with pytest.raises(UserError, match="exists"):
        bench.main(argv)
    with pytest.raises(UserError, match="unknown model"):
        bench.main(["--model", "no_such_model", "--out", str(tmp_path / "e.csv")])
    with pytest.raises(UserError, match="give --compile"):
        bench.main(["--fused-attention", "--out", str(tmp_path / "g.csv")])
    for bad in (["--rounds", "0"], ["--profile-steps", "0"]):
        with pytest.raises(UserError, match="must be positive"):
            bench.main([*bad, "--out", str(tmp_path / "f.csv")])


def test_bf16_side_casts_each_weight_once_and_inference_mode_every_step(monkeypatch):
    """The premise of the two bf16 sides: in the held autocast region under no_grad a Linear's weight is cast once
    across steps (fp32 steps in a nested disabled region in between), under inference_mode again on every step."""
    from torch.profiler import profile

    lin, x = torch.nn.Linear(16, 8), torch.randn(4, 16)

    def casts(step_ctx):
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
            lin(x)
            with profile() as p:
                for _ in range(3):
                    with torch.autocast("cpu", enabled=False):
                        lin(x)
                    with step_ctx():
                        lin(x)
        return sum(e.count for e in p.key_averages() if e.key == "aten::_to_copy")

    import contextlib

    assert casts(contextlib.nullcontext) == 3  # the input only, once per bf16 step
    assert casts(torch.inference_mode) == 9  # input, weight and bias every step


def test_compile_side_is_timed_alternately(monkeypatch):
    """With compile, the compiled model is a fourth side: compiled once before the timed rounds, then called once per
    round (torch.compile stands in for an identity wrapper here: the script's bookkeeping, not inductor, is tested)."""
    bench = load_benchmark("precision_interleaved")
    calls = []

    def fake_compile(model):
        def run(x):
            calls.append(x.shape)
            return model(x)
        return run

    monkeypatch.setattr(torch, "compile", fake_compile)
    resets = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(len(calls)))
    row = bench.measure("lisanet_micro", 32, rounds=3, warmup=1, profile_steps=1, machine_ratio=2.0, compile=True)
    assert resets == [0]  # a fresh dynamo cache before the size's first compiled call
    assert len(calls) == 1 + 1 + 3  # the compiling call, the warm-up round, the timed rounds
    ms = float(row["bf16_compile_ms"])
    assert ms > 0 and float(row["compile_speedup_vs_fp32_eager"]) == pytest.approx(row["fp32_ms"] / ms, rel=2e-2)


def test_fused_attention_side_runs_the_compiled_model_under_plain(monkeypatch):
    """--fused-attention: a fifth side calling the same compiled model with the backend 'plain' (so attention is
    traced through the fused kernel), timed alternately with the others."""
    from subquad import backend

    bench = load_benchmark("precision_interleaved")
    seen = []

    def fake_compile(model):
        def run(x):
            seen.append(backend.get_backend())
            return model(x)
        return run

    monkeypatch.setattr(torch, "compile", fake_compile)
    row = bench.measure("lisanet_micro", 32, rounds=3, warmup=1, profile_steps=1, machine_ratio=2.0, compile=True,
                        fused_attention=True)
    assert seen.count("plain") == 1 + 1 + 3 and seen.count("auto") == 1 + 1 + 3
    ms = float(row["bf16_compile_fused_ms"])
    assert ms > 0 and float(row["compile_fused_speedup_vs_fp32_eager"]) == pytest.approx(row["fp32_ms"] / ms, rel=2e-2)
    assert backend.get_backend() == "auto"


def test_amdahl_and_gemm_profile():
    """The bound's arithmetic, and the profiled GEMM time of a step that is one matmul and one elementwise op."""
    bench = load_benchmark("precision_interleaved")
    assert bench.amdahl(0.5, 2.0) == pytest.approx(1 / 0.75)
    assert bench.amdahl(0.0, 10.0) == 1.0 and bench.amdahl(1.0, 3.0) == pytest.approx(3.0)
    assert bench.amdahl(0.5, 2.0, 2.0) == pytest.approx(2.0) and bench.amdahl(0.0, 5.0, 1.25) == pytest.approx(1.25)
    a = torch.randn(256, 256)
    got = bench.gemm_times({"mm": lambda: (a @ a).exp_(), "none": lambda: a.exp()}, 3)
    assert set(got) == {"mm", "none"}
    assert 0 < got["mm"][0] < got["mm"][1] and got["none"][0] == 0 < got["none"][1]
    assert bench._ratio(1.0, 0.0) != bench._ratio(1.0, 0.0)  # nan, not a ZeroDivisionError


def test_cpuinfo_field_reads_the_named_field(tmp_path):
    from subquad.bench.sweep import cpuinfo_field

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC 9B14\n\nprocessor\t: 1\n"
                    "cpu family\t: 26\n")
    assert cpuinfo_field("cpu family", str(info)) == "25"  # the first processor's
    assert cpuinfo_field("model", str(info)) == "17"  # not "model name"
    assert cpuinfo_field("model name", str(info)) == "AMD EPYC 9B14"
    assert cpuinfo_field("flags", str(info)) == "" and cpuinfo_field("cpu family", str(tmp_path / "none")) == ""
    fam = load_benchmark("precision_interleaved").cpu_family()
    assert fam == "" or fam.isdigit()


def test_int8_side_and_its_bounds():
    """With int8, the quantize_int8 copy is a further side; its ratio is the medians' ratio, its logits an int8
    rounding away from fp32, and its bounds Amdahl's with the machine's int8 rate (linear GEMMs only, then every
    product)."""
    bench = load_benchmark("precision_interleaved")
    row = bench.measure("lisanet_micro", 32, rounds=2, warmup=1, profile_steps=1, machine_ratio=2.0, int8_ratio=4.0)
    ms = float(row["int8_ms"])
    assert ms > 0 and float(row["int8_speedup_vs_fp32_eager"]) == pytest.approx(row["fp32_ms"] / ms, rel=2e-2)
    assert 0 < float(row["int8_rel_diff"]) < 0.1
    lin, share = float(row["linear_share_fp32"]), float(row["gemm_share_fp32"])
    assert 0 < lin <= share < 1
    assert float(row["machine_bound_int8_linear"]) == pytest.approx(1 / (1 - lin + lin / 4.0), rel=3e-3)
    assert float(row["machine_bound_int8_all"]) == pytest.approx(1 / (1 - share + share / 4.0), rel=3e-3)
    ms16 = float(row["int8_bf16_ms"])  # the int8 copy inside the bf16 region
    assert ms16 > 0 and float(row["int8_bf16_speedup_vs_fp32_eager"]) == pytest.approx(row["fp32_ms"] / ms16, rel=2e-2)
    assert 0 < float(row["int8_bf16_rel_diff"]) < 0.1
    assert bench.machine_int8_ratio(n=64, reps=1) > 0
    plain = bench.measure("lisanet_micro", 32, rounds=1, warmup=0, profile_steps=1, machine_ratio=2.0)
    assert plain["int8_ms"] == plain["machine_bound_int8_all"] == plain["int8_bf16_ms"] == ""
