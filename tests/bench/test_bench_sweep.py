"""bench: timing, the allocator probe, the attention/model sweeps, CSV/plot output and the CLI (tiny sizes)."""

from __future__ import annotations

import csv
import re

import pytest
import torch

import subquad
from subquad.bench.memory import peak_memory
from subquad.bench.sweep import (
    ATTN_COLUMNS,
    MODEL_COLUMNS,
    attention_candidates,
    default_result_path,
    plot_attention,
    sweep_attention,
)
from subquad.bench.timing import time_fn, time_interleaved
from subquad_cli.__main__ import main

MiB = 2**20


def test_time_fn_median_and_budget():
    calls = []
    t = time_fn(lambda: calls.append(1), warmup=2, repeats=5)
    assert len(calls) == 7 and t.repeats == 5 and t.best <= t.median
    t = time_fn(lambda: torch.randn(200, 200) @ torch.randn(200, 200), repeats=50, budget_s=0.0)
    assert t.repeats == 1
    with pytest.raises(ValueError, match="repeats"):
        time_fn(lambda: None, repeats=0)


def test_time_fn_min_time_adds_repeats_for_fast_steps():
    import time

    t = time_fn(lambda: time.sleep(0.002), warmup=0, repeats=3, min_time_s=0.05, max_repeats=100)
    # Calls are added until the timed calls add up to min_time_s, and not one more; how many that takes depends on
    # how much a 2 ms sleep overshoots on this machine, so the rule is checked, not a count.
    assert sum(t.times) >= 0.05 and (t.repeats == 3 or sum(t.times[:-1]) < 0.05)
    assert t.repeats <= 30  # a 2 ms sleep never takes less than 2 ms
    t = time_fn(lambda: time.sleep(0.002), warmup=0, repeats=3, min_time_s=10.0, max_repeats=7)
    assert t.repeats == 7
    t = time_fn(lambda: time.sleep(0.03), warmup=0, repeats=3, min_time_s=0.01)
    assert t.repeats == 3


def test_peak_memory_sees_cpp_allocations():
    def two_live():
        a = torch.ones(2 * MiB // 4)
        b = torch.ones(MiB // 4)
        return a.sum() + b.sum()

    def sequential():
        for _ in range(3):
            torch.ones(2 * MiB // 4).sum()

    both = peak_memory(two_live)
    seq = peak_memory(sequential)
    # Two live tensors (3 MiB) at once vs one 2 MiB tensor at a time, plus a few scalars.
    assert 3 * MiB <= both < 3 * MiB + 64 * 1024
    assert 2 * MiB <= seq < 2 * MiB + 64 * 1024


def _softmax_macs(N: int, C: int) -> float:
    # qkv (N C 3C) + proj (N C C) + QK^T and PV (2 N^2 C), in GMACs.
    return (N * C * 3 * C + N * C * C + 2 * N * N * C) / 1e9


def test_sweep_softmax_rows_gmacs_ratio_and_backward():
    rows = sweep_attention(["softmax"], dim=16, heads=2, tokens=(6, 4), backward=True, repeats=1, max_time_s=None)
    assert [r["grid"] for r in rows] == ["4x4", "6x6"]
    for r in rows:
        assert r["status"] == "ok", r
        N = r["seq_len"]
        assert r["infer_gmacs"] == pytest.approx(_softmax_macs(N, 16), rel=1e-3)
        assert r["infer_step_time"] > 0 and r["train_step_time"] > 0 and r["peak_mem_mb"] > 0
        assert r["train_peak_mem_mb"] > 0 and r["infer_time_vs_softmax"] == 1.0
        assert r["param_count"] == 16 * 48 + 48 + 16 * 16 + 16
        assert r["torch"] == torch.__version__ and r["device"].startswith("cpu-")


def test_sweep_skips_sizes_over_memory_budget_and_says_so(tmp_path):
    rows = sweep_attention(["softmax"], dim=16, heads=2, tokens=(4, 8, 16), repeats=1, max_mem_mb=1e-4,
                           max_time_s=None)
    assert rows[0]["status"] == "ok"
    assert "skipped: estimated" in rows[1]["status"] and "--max-mem" in rows[1]["status"]
    assert rows[1]["infer_step_time"] == "" and "smaller size" in rows[2]["status"]
    assert plot_attention(rows, tmp_path / "r.png").stat().st_size > 10_000


def test_every_registered_mechanism_runs_in_the_sweep():
    names = attention_candidates()
    rows = sweep_attention(names, dim=24, heads=2, tokens=(5,), repeats=1, max_time_s=None)
    assert {r["name"] for r in rows} == set(names) | {"softmax"}
    bad = {r["name"]: r["status"] for r in rows if r["status"] != "ok"}
    assert not bad, bad
    assert all(r["infer_time_vs_softmax"] != "" and r["infer_gmacs"] != "" for r in rows)


def test_unknown_mechanism_is_a_one_line_error():
    with pytest.raises(ValueError, match="unknown attention 'nope'"):
        sweep_attention(["nope"], tokens=(4,))


def test_result_file_named_after_hardware_and_torch(tmp_path):
    p = default_result_path("attn", "cpu", tmp_path)
    assert re.fullmatch(r"bench-attn-cpu-[a-z0-9-]+-\d+t-pt\d+\.csv", p.name), p.name
    assert torch.__version__.split("+")[0].replace(".", "") in p.name


def test_cli_bench_attention_writes_csv_and_png(tmp_path, capsys):
    out = tmp_path / "attn.csv"
    assert main(["bench", "attention", "--names", "softmax", "--dim", "16", "--heads", "2", "--tokens", "4,6",
                 "--backward", "--repeats", "1", "--out", str(out)]) == 0
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ATTN_COLUMNS and len(rows) == 2
    png = out.with_suffix(".png")
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    assert "wrote" in capsys.readouterr().out


def test_cli_bench_bad_flags_one_line(capsys):
    assert main(["bench", "attention", "--dim", "10", "--heads", "3", "--tokens", "4", "--no-plot",
                 "--out", "/dev/null"]) == 2
    assert "not divisible" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "attention", "--tokens", "4,x"])


def test_cli_bench_model_rows_csv_and_png(tmp_path):
    out = tmp_path / "m.csv"
    assert main(["bench", "model", "--model", "vit_attn_micro", "--img-size", "24,16", "--backward", "--repeats", "1",
                 "--out", str(out)]) == 0
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == MODEL_COLUMNS and [r["infer_img_size"] for r in rows] == ["16", "24"]
    params = sum(p.numel() for p in subquad.create_model("vit_attn_micro").parameters())
    for r in rows:
        assert r["status"] == "ok", r
        assert float(r["infer_samples_per_sec"]) > 0 and float(r["train_samples_per_sec"]) > 0
        assert float(r["peak_mem_mb"]) > 0 and int(r["param_count"]) == params
        gmacs = subquad.count_macs("vit_attn_micro", int(r["infer_img_size"]))["gmacs"]
        assert float(r["infer_gmacs"]) == pytest.approx(gmacs, rel=1e-4)
    assert out.with_suffix(".png").stat().st_size > 10_000
    # A rerun replaces its own earlier result (and plot) only with --overwrite; an attention CSV is not a model CSV.
    before = out.read_bytes()
    assert main(["bench", "model", "--model", "vit_attn_micro", "--img-size", "16", "--repeats", "1",
                 "--out", str(out)]) == 2
    assert out.read_bytes() == before
    assert main(["bench", "model", "--model", "vit_attn_micro", "--img-size", "16", "--repeats", "1",
                 "--out", str(out), "--overwrite"]) == 0
    assert len(list(csv.DictReader(open(out)))) == 1
    attn = tmp_path / "a.csv"
    attn.write_text(",".join(ATTN_COLUMNS) + "\n")
    assert main(["bench", "model", "--model", "vit_attn_micro", "--img-size", "16", "--repeats", "1",
                 "--out", str(attn), "--no-plot", "--overwrite"]) != 0
    assert attn.read_text() == ",".join(ATTN_COLUMNS) + "\n"


def test_bench_models_timm_at_other_sizes_counts_gmacs():
    """timm baselines away from their native size: DeiT gets img_size (and its GMACs at that size are counted),
    PVTv2 takes no img_size and runs as built."""
    from subquad.bench.sweep import bench_models

    rows = bench_models(["deit_tiny_patch16_224", "pvt_v2_b0"], img_sizes=(64,), warmup=0, repeats=1,
                        max_time_s=None, max_mem_mb=None)
    assert [r["status"] for r in rows] == ["ok", "ok"], rows
    deit, pvt = rows
    # DeiT-Ti at 64 px: 16 tokens + cls instead of 196 + cls, so far fewer GMACs than its 1.25 at 224.
    assert 0 < deit["infer_gmacs"] < 0.2
    assert pvt["infer_gmacs"] > 0 and pvt["infer_step_time"] > 0


def test_time_interleaved_alternates_steps():
    order = []
    t = time_interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, rounds=3, warmup=1)
    assert order == ["a", "b"] * 4 and list(t) == ["a", "b"] and all(len(v) == 3 for v in t.values())
    with pytest.raises(ValueError, match="rounds"):
        time_interleaved({"a": lambda: None}, rounds=0)


def test_an_error_at_one_size_stops_larger_sizes_only_when_out_of_memory():
    """With non-square sizes a larger one need not contain a failing one: a shape error is reported in its row and
    the next size is measured; running out of memory still stops the larger sizes."""
    from subquad.bench.sweep import MODEL_COLUMNS, _Sweep

    def failing(exc):
        def make_step():
            def step():
                raise exc
            return step, lambda out: None
        return make_step

    def working():
        return (lambda: torch.ones(2)), (lambda out: None)

    sweep = _Sweep(torch.device("cpu"), None, None, 0, 1, False, 1)
    key = ("m", "infer", "fp32", "eager")
    row, status = dict.fromkeys(MODEL_COLUMNS, ""), []
    assert not sweep.measure(row, status, key, 230 * 320, 2.0, failing(ValueError("230 is not a multiple of 32")))
    assert status == ["infer error: ValueError: 230 is not a multiple of 32"]
    row, status = dict.fromkeys(MODEL_COLUMNS, ""), []
    assert sweep.measure(row, status, key, 512 * 512, 2.0, working) and status == []
    assert float(row["infer_step_time"]) > 0

    key = ("m2", "infer", "fp32", "eager")
    assert not sweep.measure({}, [], key, 100, 2.0, failing(RuntimeError("CPU out of memory: tried to allocate")))
    status = []
    assert not sweep.measure(dict.fromkeys(MODEL_COLUMNS, ""), status, key, 400, 2.0, working)
    assert status == ["infer skipped: out of memory at a smaller size"]
