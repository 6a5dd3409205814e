"""`subquad arena` at the quick budget: leaderboard columns, resume after a kill, skips, claims, bad input."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from subquad.arena import check_claims, load_task
from subquad.arena.report import LEADERBOARD_COLUMNS, claims_text, leaderboard_markdown
from subquad.arena.tasks import CONFIG_DIR
from subquad.errors import UserError
from subquad_cli.__main__ import main

# A small Fashion-MNIST written by the tests (tests/conftest.py), named by $SUBQUAD_FASHION_MNIST_DIR for the cells.
needs_fmnist = pytest.mark.usefixtures("fashion_mnist_dir")


def _board(out: Path) -> list[dict[str, str]]:
    with open(out / "leaderboard.csv", newline="") as f:
        return list(csv.DictReader(f))


def _err_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("subquad")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@needs_fmnist
def test_quick_run_writes_the_leaderboard(tmp_path, capsys):
    out = tmp_path / "arena"
    t0 = time.perf_counter()
    assert main(["arena", "run", "--task", "fmnist", "--attention", "softmax,focused_linear", "--seeds", "0",
                 "--budget", "quick", "--out", str(out)]) == 0
    assert time.perf_counter() - t0 < 120
    rows = _board(out)
    assert list(rows[0])[: len(LEADERBOARD_COLUMNS)] == LEADERBOARD_COLUMNS
    assert [r["attention"] for r in rows] == ["softmax", "focused_linear"]
    for r in rows:
        assert r["task"] == "fmnist" and r["seeds"] == "0" and r["n_seeds"] == "1" and r["status"] == "ok"
        assert 0 <= float(r["mean_acc"]) <= 100 and r["std_acc"] == "" and int(r["params"]) > 0  # 1 seed: no std
        assert float(r["gmacs"]) > 0 and float(r["train_per_sec"]) > 0 and float(r["eval_per_sec"]) > 0
    # Each cell keeps the image trainer's run directory; the test split was read once, for the selected checkpoint.
    cell = out / "cells" / "softmax" / "seed0"
    for f in ("args.yaml", "summary.csv", "best.safetensors", "best.json", "last_state.pth", "results.json"):
        assert (cell / f).is_file(), f
    assert json.loads((cell / "results.json").read_text())["selected_on"] == "val"
    from subquad.arena.runner import provenance

    assert json.loads((cell / "cell.json").read_text())["commit"] == provenance()["commit"]  # what it trained with
    assert (out / "leaderboard.png").is_file() and (out / "curves.png").is_file()
    out_text = capsys.readouterr().out
    assert "done softmax seed 0" in out_text and "run ETA" in out_text
    assert main(["arena", "report", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| `softmax` |" in table and "±" not in table and "Smoke test" in table
    # A rerun trains nothing.
    stamp = (cell / "cell.json").stat().st_mtime_ns
    assert main(["arena", "run", "--task", "fmnist", "--attention", "softmax,focused_linear", "--seeds", "0",
                 "--budget", "quick", "--out", str(out)]) == 0
    assert "0 to train" in capsys.readouterr().out and (cell / "cell.json").stat().st_mtime_ns == stamp


def _run_processes(out: Path) -> list[int]:
    """This process's children that are cells of the run in `out` (their command line names it; one read in the
    instant of its exec may come back empty, and counts too): cells a run left behind."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            if not d.name.isdigit() or int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) != os.getpid():
                continue
            args = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if os.fsencode(out) in args or args == [b""]:
            pids.append(int(d.name))
    return pids


def _arena_run(monkeypatch, capsys, out: Path, attention: str, interrupt: str | None = None) -> tuple[int, str]:
    """`subquad arena run` in this process at the quick budget, one cell at a time, interrupted by a SIGINT sent at a
    named point of the run (the runner's test hook) instead of after a wait; (exit status, output)."""
    from subquad.arena import runner

    monkeypatch.setattr(runner, "POLL_S", 0.05)
    if interrupt:
        monkeypatch.setenv(runner.INTERRUPT_ENV, interrupt)
    else:
        monkeypatch.delenv(runner.INTERRUPT_ENV, raising=False)
    capsys.readouterr()
    rc = main(["arena", "run", "--task", "fmnist", "--attention", attention, "--seeds", "0", "--budget", "quick",
               "--workers", "1", "--out", str(out)])
    captured = capsys.readouterr()
    if interrupt:
        assert "interrupted" in captured.out, captured
    assert _run_processes(out) == []  # every cell it started was stopped and reaped
    return rc, captured.out


@pytest.fixture
def sigint_ignored():
    """SIGINT ignored in this process, as in a background job of a script (the issue's failing run): the runner must
    handle it itself."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    yield
    signal.signal(signal.SIGINT, old)


@needs_fmnist
@pytest.mark.parametrize("point", ["start", "started"])
def test_interrupt_before_a_cell_or_as_it_starts(tmp_path, monkeypatch, capsys, point):
    """Ctrl-C before any cell starts, and in the instant a cell's process has started but is not yet tracked: exit
    130, no cell, no process left running (the one just started is stopped, not orphaned)."""
    out = tmp_path / "arena"
    rc, _ = _arena_run(monkeypatch, capsys, out, "softmax", f"{point}:softmax/seed0")
    assert rc == 130 and not (out / "cells" / "softmax" / "seed0" / "cell.json").exists()
    assert (out / "cells").exists() == (point == "started")


@needs_fmnist
def test_interrupted_run_resumes_to_the_same_leaderboard(tmp_path, monkeypatch, capsys, sigint_ignored):
    keys = ["attention", "seeds", "mean_acc", "std_acc", "best_acc", "params", "gmacs"]
    # The reference: softmax trained whole; Ctrl-C as its process ends, after it wrote cell.json (the cell finished
    # between the runner's look and the signal): kept complete, and the rerun trains nothing.
    ref = tmp_path / "ref"
    ref_cell = ref / "cells" / "softmax" / "seed0"
    assert _arena_run(monkeypatch, capsys, ref, "softmax", "written:softmax/seed0")[0] == 130
    assert json.loads((ref_cell / "cell.json").read_text())["attention"] == "softmax"
    assert list(ref_cell.glob(".cell.json.*")) == []
    rc, text = _arena_run(monkeypatch, capsys, ref, "softmax")
    assert rc == 0 and "0 to train" in text
    # During a cell: the runner stops it, it finishes its update, writes its state and exits.
    out = tmp_path / "cut"
    first, second = out / "cells" / "softmax" / "seed0", out / "cells" / "linear_relu" / "seed0"
    assert _arena_run(monkeypatch, capsys, out, "softmax,linear_relu", "update:softmax/seed0")[0] == 130
    assert not (first / "cell.json").exists() and not second.exists()
    assert (first / "last_state.pth").is_file() and "stopped after update 1 " in (first / "cell.log").read_text()
    # Between cells: softmax resumed and finished, linear_relu not started.
    rc, text = _arena_run(monkeypatch, capsys, out, "softmax,linear_relu", "start:linear_relu/seed0")
    assert rc == 130 and "done softmax seed 0" in text and not second.exists()
    stamp = (first / "cell.json").stat().st_mtime_ns
    rc, text = _arena_run(monkeypatch, capsys, out, "softmax,linear_relu")
    assert rc == 0 and "start softmax" not in text and "done linear_relu seed 0" in text
    assert (first / "cell.json").stat().st_mtime_ns == stamp
    assert [{k: r[k] for k in keys} for r in _board(out)][:1] == [{k: r[k] for k in keys} for r in _board(ref)]


def test_a_cell_stopped_while_writing_leaves_no_file_behind(tmp_path):
    """The runner stops a cell with SIGTERM; in the middle of an atomic write (cell.json) the cell exits 143 with
    neither the file nor its temporary copy."""
    code = """if True:
        import signal, sys
        from subquad.arena._cell import exit_on_sigterm
        from subquad.files import atomic_write

        def write(tmp):
            with open(tmp, "w") as f:
                f.write('{"test_acc": ')
            signal.raise_signal(signal.SIGTERM)
            with open(tmp, "a") as f:
                f.write("1.0}")

        exit_on_sigterm()
        atomic_write(sys.argv[1], write)
    """
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "cell.json")], capture_output=True, text=True)
    assert r.returncode == 143 and list(tmp_path.iterdir()) == [], r.stderr


def _custom_task(tmp_path: Path, **changes) -> Path:
    raw = yaml.safe_load((CONFIG_DIR / "fmnist.yaml").read_text())
    for k, v in changes.items():
        raw[k] = v
    path = tmp_path / "custom.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_mechanism_the_host_cannot_take_is_skipped_with_its_reason(tmp_path, monkeypatch):
    from subquad.arena import image

    # A host with a class token cannot take LiSA's structure-aware attention: skipped at build time, not crashed.
    raw = yaml.safe_load((CONFIG_DIR / "fmnist.yaml").read_text())
    host = {**raw["host"], "class_token": True, "global_pool": "token"}
    reason = image.refusal(raw["train"], {**host, "attn": "structure_aware"})
    assert reason and "structure_aware" in reason and "class token" in reason and "softmax" in reason
    assert image.refusal(raw["train"], {**raw["host"], "attn": "softmax"}) is None


def test_skipped_row_in_the_leaderboard(tmp_path, capsys, monkeypatch):

    task_file = _custom_task(tmp_path, host={**yaml.safe_load((CONFIG_DIR / "fmnist.yaml").read_text())["host"],
                                             "class_token": True, "global_pool": "token"})
    out = tmp_path / "arena"
    # Issue 34 item 7: a run in which no cell can run is refused, and nothing is written.
    assert main(["arena", "run", "--task", str(task_file), "--attention", "structure_aware_d4", "--seeds", "0",
                 "--budget", "quick", "--out", str(out)]) == 2
    assert "no cell can run: structure_aware_d4" in capsys.readouterr().err and not out.exists()
    # Beside cells that run, the skipped mechanism gets its row (the runner writes it the same way).
    from subquad.arena import image
    from subquad.arena.report import write_leaderboard
    from subquad.arena.runner import mech_entry

    task = load_task(str(task_file))
    out.mkdir()
    write_leaderboard(out, task, ["structure_aware_d4"], [0], {
        "structure_aware_d4": image.refusal(task.recipe("quick"), mech_entry(task, "structure_aware_d4"))})
    row = _board(out)[0]
    assert row["status"] == "skipped" and "class token" in row["reason"] and row["n_seeds"] == "0"
    assert "skipped" in leaderboard_markdown(out)


@pytest.mark.parametrize("argv,expect", [
    (["--task", "imagenet"], "allowed: charlm, fmnist"),
    (["--task", "fmnist", "--attention", "softmax,nope"], "allowed:"),
    (["--task", "fmnist", "--budget", "huge"], "allowed: default, quick"),
    (["--task", "fmnist", "--seeds", "a,b"], "comma-separated integers"),
])
def test_bad_input_is_one_line(tmp_path, capsys, argv, expect):
    assert main(["arena", "run", *argv, "--out", str(tmp_path / "o")]) == 2
    assert expect in _err_line(capsys)


def test_out_holding_another_run_is_refused(tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    (other / "last.safetensors").write_bytes(b"x")
    assert main(["arena", "run", "--task", "fmnist", "--budget", "quick", "--out", str(other)]) == 2
    assert "not an arena run" in _err_line(capsys)
    arena = tmp_path / "arena"
    arena.mkdir()
    (arena / "arena.json").write_text(json.dumps({"task": "fmnist", "budget": "default"}))
    assert main(["arena", "run", "--task", "fmnist", "--budget", "quick", "--out", str(arena)]) == 2
    assert "budget 'default'" in _err_line(capsys)
    (arena / "arena.json").write_text(json.dumps({"task": "fmnist", "budget": "quick", "fingerprint": "old"}))
    assert main(["arena", "run", "--task", "fmnist", "--budget", "quick", "--out", str(arena)]) == 2
    assert "recipe, seeds or claims" in _err_line(capsys)


def _fake_cells(out: Path, accs: dict[str, list[float]]) -> None:
    for label, values in accs.items():
        for seed, acc in enumerate(values):
            d = out / "cells" / label / f"seed{seed}"
            d.mkdir(parents=True)
            (d / "cell.json").write_text(json.dumps({"attention": label, "seed": seed, "test_acc": acc}))


def test_claim_verdicts_and_interval(tmp_path):
    task = load_task("fmnist")
    task.claims = [{"id": "x", "source": "S", "a": "a", "b": "b"}, {"id": "y", "source": "S", "a": "b", "b": "a"},
                   {"id": "z", "source": "S", "a": "a", "b": "c"}, {"id": "w", "source": "S", "a": "a", "b": "gone"}]
    _fake_cells(tmp_path, {"a": [80.0, 81.0, 82.0], "b": [70.0, 70.5, 71.5], "c": [79.0, 82.0, 81.5]})
    res = {r["id"]: r for r in check_claims(tmp_path, task)}
    # d = a - b = (10, 10.5, 10.5): mean 10.333, sd 0.2887, t(0.975, 2) = 4.3027 -> half-width 0.7172.
    assert res["x"]["diff"] == pytest.approx(10.3333, abs=1e-4)
    assert res["x"]["lo"] == pytest.approx(10.3333 - 0.7172, abs=1e-3) and res["x"]["verdict"] == "holds"
    assert res["y"]["verdict"] == "does not hold"
    assert res["z"]["verdict"] == "inconclusive"
    assert res["w"]["verdict"] == "inconclusive" and "gone" in res["w"]["why"]
    text = claims_text(list(res.values()))
    assert "95 % CI" in text and text.count("\n") == 3


def test_shipped_tasks_load_and_name_registered_mechanisms():
    from subquad.attention import list_attention

    for name in ("fmnist", "listops", "pathfinder32"):
        task = load_task(name)
        assert task.seeds and task.default_mechanisms
        for label in task.default_mechanisms:
            assert task.mechanism(label)[task.name_key] in list_attention()
        for claim in task.claims:
            assert claim["a"] in task.mechanisms and claim["b"] in task.mechanisms


def test_quick_listops_run_and_a_2d_mechanism_skipped(tmp_path, capsys):
    out = tmp_path / "lo"
    assert main(["arena", "run", "--task", "listops", "--attention", "softmax,cswin", "--seeds", "0",
                 "--budget", "quick", "--out", str(out)]) == 0
    rows = {r["attention"]: r for r in _board(out)}
    assert rows["softmax"]["status"] == "ok" and 0 <= float(rows["softmax"]["mean_acc"]) <= 100
    assert rows["cswin"]["status"] == "skipped" and "grid" in rows["cswin"]["reason"]
    assert "skip cswin" in capsys.readouterr().out


def test_a_task_file_is_the_recipe_its_cells_train(tmp_path, capsys):
    """`--task FILE.yaml`: every cell (its own process) trains the file's recipe, not the shipped task of that name;
    a file edited after the run began is refused by the next cell."""
    raw = yaml.safe_load((CONFIG_DIR / "pathfinder32.yaml").read_text())
    raw["data"]["distractors"] = 0
    task_file = tmp_path / "pf_easy.yaml"
    task_file.write_text(yaml.safe_dump(raw))
    out = tmp_path / "run"
    assert main(["arena", "run", "--task", str(task_file), "--attention", "softmax", "--seeds", "0", "--budget",
                 "quick", "--out", str(out), "--device", "cpu"]) == 0  # pathfinder32 requires a GPU unless forced
    meta = json.loads((out / "arena.json").read_text())
    assert meta["source"] == str(task_file.resolve())
    args = yaml.safe_load((out / "cells" / "softmax" / "seed0" / "args.yaml").read_text())
    settings = json.loads((Path(args["data"]) / "arena_data.json").read_text())["settings"]
    assert settings["distractors"] == 0
    assert json.loads((Path(args["data"]) / "meta.json").read_text())["params"]["num_distractor_snakes"] == 0
    assert [r["status"] for r in _board(out)] == ["ok"]
    assert main(["arena", "report", str(out)]) == 0
    raw["data"]["distractors"] = 1
    task_file.write_text(yaml.safe_dump(raw))
    from subquad.arena.runner import run_one_cell
    from subquad.errors import UserError

    with pytest.raises(UserError, match="changed since this run began"):
        run_one_cell(out, "softmax", 1)


def test_mechanism_may_join_a_run_but_its_entry_may_not_change(tmp_path, capsys):
    from subquad.arena.runner import _record_entries

    task = load_task("fmnist")
    meta: dict = {}
    assert _record_entries(meta, task, ["softmax", "window"], tmp_path)
    assert meta["mechanisms"]["window"] == {"attn": "window", "attn_kwargs": {"window_size": 7}}
    assert _record_entries(meta, task, ["linear_relu+lcm"], tmp_path)  # a new label joins
    assert not _record_entries(meta, task, ["softmax", "window"], tmp_path)  # nothing new
    task.mechanisms["window"] = {"attn": "window", "attn_kwargs": {"window_size": 4}}
    with pytest.raises(Exception, match="'window' was trained with"):
        _record_entries(meta, task, ["window"], tmp_path)
    # Claims and seeds are part of the fingerprint: a claim edited after a run started is refused.
    before = load_task("fmnist").fingerprint("quick")
    task = load_task("fmnist")
    task.claims[0] = {**task.claims[0], "a": "linear_l1"}
    assert task.fingerprint("quick") != before
    task = load_task("fmnist")
    task.seeds = [0, 1]
    assert task.fingerprint("quick") != before


def test_provenance_names_the_checkout_commit():
    from subquad.arena.runner import provenance

    root = Path(__file__).resolve().parents[2]
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    p = provenance()
    if head.returncode == 0:
        assert p["commit"] == head.stdout.strip() and p["tree_clean"] in (True, False)
    else:  # not a git checkout (an sdist): no commit, and it says so
        assert p == {"commit": "", "tree_clean": None}


def test_a_budget_names_its_mechanisms_and_an_unknown_one_is_refused(tmp_path):
    """`--attention all` under a budget that names `mechanisms` runs those; the default budget runs
    default_mechanisms; a budget naming an unlisted label is refused when the file is read."""
    raw = yaml.safe_load((CONFIG_DIR / "fmnist.yaml").read_text())
    few = raw["default_mechanisms"][:2]
    task = load_task(str(_custom_task(tmp_path, budgets={**raw["budgets"], "quick": {**raw["budgets"]["quick"],
                                                                                  "mechanisms": few}})))
    assert task.resolve("all", "quick") == few and task.resolve("all") == raw["default_mechanisms"]
    assert "mechanisms" not in task.recipe("quick")
    with pytest.raises(UserError, match="budget quick's mechanisms lists unknown label"):
        load_task(str(_custom_task(tmp_path, budgets={**raw["budgets"], "quick": {"mechanisms": ["nope"]}})))
