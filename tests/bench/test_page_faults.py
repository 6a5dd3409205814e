"""benchmarks/page_faults.py: step time and page faults per step, one fresh process per glibc setting."""

from __future__ import annotations

import csv

import pytest

from subquad.errors import UserError

from ._scripts import load_benchmark


def test_rows_settings_reach_the_child_and_refusals(tmp_path):
    faults = load_benchmark("page_faults")
    out = tmp_path / "p.csv"
    argv = ["--model", "lisanet_micro", "--img-size", "64", "--precision", "fp32", "--config", "default",
            "MALLOC_TOP_PAD_=1073741824", "--runs", "1", "--steps", "2", "--warmup", "1", "--threads", "1",
            "--out", str(out)]
    assert faults.main(argv) == 0
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == faults.COLUMNS
    assert [r["config"] for r in rows] == ["default", "MALLOC_TOP_PAD_=1073741824"]
    assert all(float(r["step_ms"]) > 0 and float(r["minor_faults_per_step"]) >= 0 for r in rows)
    with pytest.raises(UserError, match="exists"):
        faults.main(argv)
    with pytest.raises(UserError, match="NAME=VALUE"):
        faults.main(argv[:7] + ["MALLOC_TOP_PAD_"] + argv[8:-1] + [str(tmp_path / "new.csv")])


def test_env_sets_only_what_the_config_names(monkeypatch):
    faults = load_benchmark("page_faults")
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")  # a setting of the caller's never leaks into a measured process
    monkeypatch.setenv("SUBQUAD_KEEP_FREED_MIB", "64")
    env = faults._env("MALLOC_TOP_PAD_=1 MALLOC_TRIM_THRESHOLD_=2")
    assert env["MALLOC_TOP_PAD_"] == "1" and env["MALLOC_TRIM_THRESHOLD_"] == "2" and "MALLOC_ARENA_MAX" not in env
    default = faults._env("default")
    assert not any(k.startswith("MALLOC_") for k in default) and "SUBQUAD_KEEP_FREED_MIB" not in default
    assert faults._env("SUBQUAD_KEEP_FREED_MIB=256")["SUBQUAD_KEEP_FREED_MIB"] == "256"


def test_measure_counts_faults_of_fresh_pages():
    """The two numbers of one process: the median step and the minor faults per timed step."""
    faults = load_benchmark("page_faults")
    r = faults.measure("lisanet_micro", 64, "fp32", steps=2, warmup=1, threads=1)
    assert set(r) == {"step_ms", "minor_faults_per_step"} and r["step_ms"] > 0
