"""benchmarks/lisa_qkv_cast.py, sdpa_fused_cpu.py and int8_weights_speed.py: their before sides really run the old
code, every side is timed, and their rows are written."""

from __future__ import annotations

import csv

import pytest

from subquad.errors import UserError

from ._scripts import load_benchmark


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_lisa_qkv_cast_times_the_broadcast_projection_beside_the_leaf_one(tmp_path, monkeypatch):
    bench = load_benchmark("lisa_qkv_cast")
    calls = []
    old = bench.broadcast_linear

    def counted(*a):
        calls.append(1)
        return old(*a)

    monkeypatch.setattr(bench, "broadcast_linear", counted)
    out = tmp_path / "q.csv"
    argv = ["--model", "lisanet_micro", "--img-size", "32", "--rounds", "2", "--warmup", "0", "--threads", "1"]
    assert bench.main(argv + ["--out", str(out)]) == 0
    (row,) = _rows(out)
    assert list(row) == bench.COLUMNS and row["model"] == "lisanet_micro"
    assert calls  # the broadcast side ran the old projection
    assert float(row["max_abs_diff"]) < 1e-2 and float(row["gain"]) > 0
    with pytest.raises(UserError, match="exists"):
        bench.main(argv + ["--out", str(out)])


def test_sdpa_fused_cpu_counts_math_path_calls_before_and_after(tmp_path):
    bench = load_benchmark("sdpa_fused_cpu")
    out = tmp_path / "s.csv"
    argv = ["--model", "agent_deit_micro", "--img-size", "32", "--rounds", "2", "--warmup", "0", "--threads", "1"]
    assert bench.main(argv + ["--out", str(out)]) == 0
    (row,) = _rows(out)
    assert list(row) == bench.COLUMNS
    assert int(row["math_calls"]) == 0 and int(row["math_calls_before"]) > 0
    assert float(row["max_abs_diff"]) < 1e-4
    with pytest.raises(UserError, match="agent"):
        bench.main(["--model", "lisanet_micro", "--out", str(tmp_path / "t.csv")])


def test_bad_counts_are_refused_naming_the_values(tmp_path):
    bench = load_benchmark("lisa_qkv_cast")
    with pytest.raises(UserError, match=r"got --rounds 0, --img-size 32, --warmup -1"):
        bench.main(["--model", "lisanet_micro", "--img-size", "32", "--rounds", "0", "--warmup", "-1",
                    "--out", str(tmp_path / "x.csv")])
    assert not (tmp_path / "x.csv").exists()


def test_int8_weights_speed_times_every_scheme_beside_fp32(tmp_path):
    pytest.importorskip("onnxruntime", reason="the export extra is a dev dependency")
    bench = load_benchmark("int8_weights_speed")
    out = tmp_path / "w.csv"
    argv = ["--model", "vit_attn_micro", "--img-size", "32", "--rounds", "2", "--warmup", "0", "--threads", "1",
            "--block", "1", "--weights", "7bit,8bit-per-channel"]
    assert bench.main(argv + ["--out", str(out)]) == 0
    rows = _rows(out)
    assert list(rows[0]) == bench.COLUMNS
    assert [r["side"] for r in rows] == ["fp32 eager", "fp32 onnxruntime", "int8 onnxruntime 7bit",
                                         "int8 onnxruntime 8bit-per-channel"]
    assert rows[0]["speedup_vs_fp32_eager"] == "1.0" and all(float(r["median_ms"]) > 0 for r in rows)
    with pytest.raises(UserError, match="--weights '9bit' is unknown"):
        bench.main(argv[:-1] + ["9bit", "--out", str(tmp_path / "x.csv")])
    assert not (tmp_path / "x.csv").exists()


def test_interleaved_times_in_blocks():
    """block > 1: per timed round one untimed call, then `block` timed calls averaged; warm-up rounds call once."""
    from subquad.bench.sweep import interleaved_times

    calls = {"a": 0, "b": 0}
    sides = {k: (lambda k=k: calls.__setitem__(k, calls[k] + 1)) for k in calls}
    times = interleaved_times(sides, rounds=3, warmup=2, block=4)
    assert calls == {"a": 2 + 3 * 5, "b": 2 + 3 * 5} and all(len(t) == 3 for t in times.values())
    calls.update(a=0, b=0)
    interleaved_times(sides, rounds=3, warmup=1)
    assert calls == {"a": 4, "b": 4}  # block 1: as before, one timed call per round


def test_interleaved_times_pause_is_untimed(monkeypatch):
    """`pause` sleeps before every side's turn (warm-up rounds too), outside the timed calls."""
    import time

    from subquad.bench.sweep import interleaved_times

    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    times = interleaved_times({"a": lambda: None, "b": lambda: None}, rounds=3, warmup=1, block=2, pause=0.25)
    assert slept == [0.25] * 8 and all(len(t) == 3 for t in times.values())
    slept.clear()
    interleaved_times({"a": lambda: None}, rounds=2)
    assert slept == []
