"""bench hygiene (issue 13 items 4 and 7): committed results are never overwritten, threads pinned to the physical
cores and recorded, one-line warnings for a loaded machine or spread timings, units in the live table, the live
ratio column filled."""

from __future__ import annotations

import csv
import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from subquad.bench import machine
from subquad.bench.sweep import ATTN_COLUMNS, MODEL_COLUMNS
from subquad.bench.timing import Timing, time_spread
from subquad_cli.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--dim", "16", "--heads", "2", "--repeats", "2", "--warmup", "0"]


def _digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file() and ".git" not in p.parts}


def _copy_of_repository(dest: Path) -> Path:
    """The repository's tracked files (as they are in the working tree) copied to `dest`."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def test_bench_from_the_repository_root_changes_no_tracked_file(tmp_path, monkeypatch, capsys):
    """The reported defect: `bench attention --names linear --tokens 8` at the root replaced a committed CSV."""
    repo = _copy_of_repository(tmp_path / "repo")
    committed = sorted((repo / "benchmarks" / "results").glob("bench-attn-*.csv"))
    assert committed, "the copy holds the committed attention results"
    before = _digest(repo)
    monkeypatch.chdir(repo)
    assert main(["bench", "attention", "--names", "linear", "--tokens", "8", *TINY]) == 0
    after = _digest(repo)
    assert {k: v for k, v in after.items() if k in before} == before, "a tracked file changed"
    new = sorted(set(after) - set(before))
    assert new and all(n.startswith("runs/bench-attn-") for n in new), new
    # Naming a committed file is refused without --overwrite, and nothing is written.
    target = committed[0]
    assert main(["bench", "attention", "--names", "linear", "--tokens", "8", *TINY, "--out",
                 str(target.relative_to(repo))]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert _digest(repo) == after


def test_overwrite_replaces_an_earlier_result_of_the_same_kind(tmp_path):
    out = tmp_path / "a.csv"
    # An earlier result from before the hygiene columns existed is still recognised as one.
    old = [c for c in ATTN_COLUMNS if c not in ("threads", "time_spread_pct")]
    out.write_text(",".join(old) + "\n")
    assert main(["bench", "attention", "--names", "softmax", "--tokens", "4", *TINY, "--no-plot", "--out", str(out),
                 "--overwrite", "--threads", "1"]) == 0
    rows = list(csv.DictReader(open(out)))
    assert list(rows[0]) == ATTN_COLUMNS and rows[0]["threads"] == "1"


def test_an_interrupted_overwrite_leaves_the_earlier_result_whole(tmp_path, monkeypatch):
    """With --overwrite the rows go to <stem>.partial.csv while the sweep runs (they replaced the earlier result
    after the first row, so a Ctrl-C left one row where a committed sweep had been)."""
    import subquad.bench.sweep as sweep

    out = tmp_path / "a.csv"
    earlier = ",".join(ATTN_COLUMNS) + "\n" + ",".join(["x"] * len(ATTN_COLUMNS)) + "\n"
    out.write_text(earlier)

    def one_row_then_ctrl_c(*a, on_row, **k):
        on_row({"name": "softmax", "grid": "2x2"})
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep, "sweep_attention", one_row_then_ctrl_c)
    assert main(["bench", "attention", "--names", "softmax", "--tokens", "4", *TINY, "--no-plot", "--out", str(out),
                 "--overwrite"]) == 130
    assert out.read_text() == earlier
    assert [r["name"] for r in csv.DictReader(open(tmp_path / "a.partial.csv"))] == ["softmax"]
    monkeypatch.undo()
    assert main(["bench", "attention", "--names", "softmax", "--tokens", "4", *TINY, "--no-plot", "--out", str(out),
                 "--overwrite"]) == 0
    assert out.read_text() != earlier and not (tmp_path / "a.partial.csv").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    # A file of the user's own under that name is never replaced.
    (tmp_path / "a.partial.csv").write_text("mine\n")
    assert main(["bench", "attention", "--names", "softmax", "--tokens", "4", *TINY, "--no-plot", "--out", str(out),
                 "--overwrite"]) == 2
    assert (tmp_path / "a.partial.csv").read_text() == "mine\n"


def test_physical_cores_counts_smt_siblings_once(tmp_path, monkeypatch):
    # CPUs 0-3: two cores with two hyper-threads each; the process may use CPUs 0, 1 and 2.
    for cpu, core in enumerate([0, 0, 1, 1]):
        topo = tmp_path / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text("0\n")
        (topo / "core_id").write_text(f"{core}\n")
    monkeypatch.setattr(machine, "_allowed_cpus", lambda: [0, 1, 2])
    monkeypatch.setattr(machine, "_cgroup_limit", lambda: None)
    assert machine.physical_cores(tmp_path) == 2
    monkeypatch.setattr(machine, "_allowed_cpus", lambda: [0, 1])
    assert machine.physical_cores(tmp_path) == 1
    monkeypatch.setattr(machine, "_cgroup_limit", lambda: 1)
    monkeypatch.setattr(machine, "_allowed_cpus", lambda: [0, 2])
    assert machine.physical_cores(tmp_path) == 1
    assert machine.physical_cores() >= 1


def test_threads_pinned_by_default_and_written(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "physical_cores", lambda sysfs=None: 1)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    out = tmp_path / "m.csv"
    assert main(["bench", "model", "--model", "vit_attn_micro", "--img-size", "16", "--repeats", "1",
                 "--no-plot", "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out)))
    assert list(rows[0]) == MODEL_COLUMNS and rows[0]["threads"] == "1" and rows[0]["device"].endswith("-1t")
    assert torch.get_num_threads() == before  # restored for in-process callers
    assert main(["bench", "model", "--model", "vit_attn_micro", "--threads", "0"]) == 2


def test_spread():
    assert time_spread([1.0]) == 0.0
    assert time_spread([1.0, 1.0, 1.0]) == 0.0
    # quartiles 1.5 and 3.5 (inclusive method) around the median 2.5.
    assert time_spread([1.0, 2.0, 3.0, 4.0]) == pytest.approx((3.25 - 1.75) / 2.5)
    assert Timing(2.5, 1.0, 4, (1.0, 2.0, 3.0, 4.0)).spread == pytest.approx(0.6)


def test_warnings_are_one_line_and_only_when_due():
    assert machine.load_warning(2, load=1.5) is None
    w = machine.load_warning(2, load=3.25)
    assert w.startswith("warning:") and "3.25 > 2 thread(s)" in w and "\n" not in w
    assert machine.spread_warning([("a", 0.1), ("b", 0.2)]) is None
    w = machine.spread_warning([("a", 0.1), ("linear at 8x8", 0.35)])
    assert "35 %" in w and "linear at 8x8" in w and "\n" not in w


def test_live_table_units_ratio_and_warnings(tmp_path, monkeypatch, capsys):
    import subquad.bench.timing as timing

    monkeypatch.setattr(machine, "load_average", lambda: 1e3)
    monkeypatch.setattr(timing, "time_spread", lambda times: 0.5)
    out = tmp_path / "a.csv"
    assert main(["bench", "attention", "--names", "linear", "--tokens", "4,6", *TINY, "--no-plot", "--out",
                 str(out), "--threads", "1"]) == 0
    cap = capsys.readouterr()
    lines = cap.out.splitlines()
    header = lines[0]
    for unit in ("(ms)", "(MiB)", "(x)", "(t x t)"):
        assert unit in header, header
    rows = {r["name"] + r["grid"]: r for r in csv.DictReader(open(out))}
    # The live row of linear shows the ratio the CSV has.
    live = [ln for ln in lines[1:] if ln.startswith("linear ")]
    assert len(live) == 2
    for ln in live:
        grid = ln.split()[1]
        ratio = rows["linear" + grid]["infer_time_vs_softmax"]
        assert ratio and f"{float(ratio):.4g}" in ln.split()
    warnings = [ln for ln in cap.err.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 2 and "load average" in warnings[0] and "spread by up to 50 %" in warnings[1]
    assert all(float(r["time_spread_pct"]) == 50.0 for r in rows.values())


def test_scripts_name_files_after_the_threads_bench_will_use(monkeypatch):
    from subquad.bench.sweep import default_result_path

    monkeypatch.setattr(machine, "physical_cores", lambda sysfs=None: 1)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        assert machine.pin_threads_like_bench(["--names", "linear"]) == 1
        assert "-1t-" in default_result_path("attn", "cpu", "r").name
        assert machine.pin_threads_like_bench(["--threads", "2"]) == 2 and torch.get_num_threads() == 2
        assert "-2t-" in default_result_path("attn", "cpu", "r").name
    finally:
        torch.set_num_threads(before)


def test_threads_default_to_omp_num_threads(monkeypatch):
    """Issue 24: `bench` took every core although OMP_NUM_THREADS=1 was set; the load warning names the flag."""
    from types import SimpleNamespace

    from subquad_cli.bench import _pin_threads

    monkeypatch.setattr(machine, "physical_cores", lambda sysfs=None: 2)
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert _pin_threads(SimpleNamespace(threads=None)) == 1 and torch.get_num_threads() == 1
        assert machine.pin_threads_like_bench(["--names", "linear"]) == 1
        assert _pin_threads(SimpleNamespace(threads=2)) == 2  # --threads wins
        for unset in ("", "abc", "0"):
            monkeypatch.setenv("OMP_NUM_THREADS", unset)
            assert machine.default_threads() == 2
        monkeypatch.delenv("OMP_NUM_THREADS")
        assert _pin_threads(SimpleNamespace(threads=None)) == 2
    finally:
        torch.set_num_threads(before)
    assert "--threads 1" in machine.load_warning(2, load=3.25)


@pytest.mark.parametrize("dim,heads", [("16", "0"), ("16", "-2"), ("-16", "2"), ("0", "2")])
def test_attention_dim_and_heads_below_one_are_one_line(tmp_path, capsys, dim, heads):
    """--heads 0 raised ZeroDivisionError; a negative --heads or --dim wrote a CSV of failed rows and exited 0."""
    out = tmp_path / "b.csv"
    assert main(["bench", "attention", "--names", "linear", "--tokens", "8", "--dim", dim, "--heads", heads,
                 "--repeats", "1", "--warmup", "0", "--no-plot", "--out", str(out)]) == 2
    assert f"--dim and --heads must be >= 1, got {dim} and {heads}" in capsys.readouterr().err
    assert not out.exists()


def test_a_failure_is_reported_in_its_row_and_debug_shows_its_traceback(monkeypatch):
    """A sweep goes on past a mechanism that fails (the row says why); SUBQUAD_DEBUG=1 re-raises the failure so a
    library bug shows where it is."""
    import subquad.attention
    from subquad.bench.sweep import sweep_attention

    def broken(*a, **k):
        raise RuntimeError("a bug in a mechanism")

    monkeypatch.setattr(subquad.attention, "build_attention", broken)
    rows = sweep_attention(["linear"], dim=16, heads=2, tokens=(4,), repeats=1, warmup=0)
    assert rows[0]["status"] == "error: build failed: RuntimeError: a bug in a mechanism"
    monkeypatch.setenv("SUBQUAD_DEBUG", "1")
    with pytest.raises(RuntimeError, match="a bug in a mechanism"):
        sweep_attention(["linear"], dim=16, heads=2, tokens=(4,), repeats=1, warmup=0)


def test_a_precision_or_backend_named_twice_is_measured_once():
    from subquad_cli.bench import _word_list

    assert _word_list("eager, compile,eager,,") == ["eager", "compile"]
    assert _word_list("bf16,fp32,bf16") == ["bf16", "fp32"]


def test_benchmark_scripts_exit_with_one_line_user_errors(tmp_path):
    """`run_script`: a user error ends a benchmark script with one line `prog: message` (status 1); a library bug
    keeps its traceback. Run as a script, lisa_idft refuses a bad case that way."""
    import subprocess
    import sys
    from pathlib import Path

    from subquad.bench.sweep import run_script
    from subquad.errors import UserError

    def bad():
        raise UserError("--x 3: expected y")

    with pytest.raises(SystemExit) as e:
        run_script(bad, "prog")
    assert e.value.code == "prog: --x 3: expected y"
    with pytest.raises(SystemExit) as e:
        run_script(lambda: 0, "prog")
    assert e.value.code == 0
    with pytest.raises(ZeroDivisionError):
        run_script(lambda: 1 // 0, "prog")
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "lisa_idft.py"), "--cases", "7",
                        "--out", str(tmp_path / "o.csv")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip() == "lisa_idft: --cases '7': expected SIDExTRANSFORMS with positive integers, e.g. 56x256"


def test_cli_keeps_freed_memory_and_writes_it(tmp_path):
    """The `subquad` command lets glibc keep 256 MiB of freed memory (subquad.backend.keep_freed_memory) and
    `bench model` writes the setting in its kept_freed_mib column (0 where the C library is not glibc)."""
    import os
    import subprocess
    import sys

    out = tmp_path / "m.csv"
    env = {k: v for k, v in os.environ.items() if k != "SUBQUAD_KEEP_FREED_MIB"}
    subprocess.run([sys.executable, "-m", "subquad_cli", "bench", "model", "--model", "vit_attn_micro", "--img-size",
                    "16", "--repeats", "1", "--no-plot", "--out", str(out)], env=env, check=True, capture_output=True)
    rows = list(csv.DictReader(open(out)))
    assert rows and {r["kept_freed_mib"] for r in rows} == ({"256"} if os.confstr("CS_GNU_LIBC_VERSION") else {"0"})
