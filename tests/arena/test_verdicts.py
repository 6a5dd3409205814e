"""Arena verdicts: non-inferiority claims, the Holm correction, lower-is-better metrics, claims fixed with a run,
the report of a quick run, plots, and tasks that need a GPU. Hand-computed numbers use the closed form of
Student's t with 2 degrees of freedom: F(t) = 1/2 + t / (2 sqrt(2 + t^2)), t(0.975, 2) = 4.302653."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

import pytest
import yaml

from subquad.arena import check_claims, load_task
from subquad.arena.report import (
    LEADERBOARD_COLUMNS,
    SMOKE_LINE,
    check_run_claims,
    claims_text,
    holm,
    leaderboard_markdown,
    method_text,
    series_style,
    write_leaderboard,
)
from subquad.arena.tasks import CONFIG_DIR
from subquad.errors import UserError
from subquad_cli.__main__ import main

T975_2 = 4.302653


def _sf2(t: float) -> float:
    """P(T > t) for Student's t with 2 degrees of freedom."""
    return 0.5 - t / (2 * math.sqrt(2 + t * t))


def _fake_cells(out: Path, scores: dict[str, list[float]], full: bool = False) -> None:
    for label, values in scores.items():
        for seed, acc in enumerate(values):
            d = out / "cells" / label / f"seed{seed}"
            d.mkdir(parents=True)
            row = {"attention": label, "seed": seed, "test_acc": acc}
            if full:
                row.update(best_val_acc=acc, params=1000, gmacs=0.01, train_per_sec=100.0 + seed,
                           train_per_wall_sec=90.0, eval_per_sec=300.0, peak_mem_mb=10.0, wall_s=5.0,
                           curve=[{"step": s, "val_acc": acc - 3 + s / 100} for s in (100, 200, 300)])
            (d / "cell.json").write_text(json.dumps(row))


def _err_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("subquad")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _task(claims, metric=None):
    task = load_task("fmnist")
    task.claims = claims
    if metric is not None:
        task.metric = metric
    return task


def test_noninferiority_verdicts_and_p_values(tmp_path):
    # d1 = a - b = (-0.3, -0.1, -0.2): mean -0.2, sd 0.1, half-width 4.302653 * 0.1 / sqrt(3) = 0.248414.
    # d2 = c - b = (-2.0, -2.2, -1.9): mean -2.0333, sd 0.152753, half-width 0.379452.
    _fake_cells(tmp_path, {"a": [88.0, 88.4, 88.2], "b": [88.3, 88.5, 88.4], "c": [86.3, 86.3, 86.5]})
    task = _task([{"id": "ni", "a": "a", "b": "b", "test": "noninferior", "margin": 0.5},
                  {"id": "ni-tight", "a": "a", "b": "b", "test": "noninferior", "margin": 0.1},
                  {"id": "sup", "a": "a", "b": "b"},
                  {"id": "ni-worse", "a": "c", "b": "b", "test": "noninferior", "margin": 0.5}])
    res = {r["id"]: r for r in check_claims(tmp_path, task)}
    half = T975_2 * 0.1 / math.sqrt(3)
    assert res["ni"]["lo"] == pytest.approx(-0.2 - half, abs=1e-5)
    assert res["ni"]["hi"] == pytest.approx(-0.2 + half, abs=1e-5)
    assert res["ni"]["verdict"] == "holds"  # -0.4484 > -0.5
    assert res["ni-tight"]["verdict"] == "inconclusive"  # -0.4484 < -0.1 < +0.0484
    assert res["sup"]["verdict"] == "inconclusive"
    assert res["ni-worse"]["verdict"] == "does not hold"  # hi = -2.0333 + 0.3795 < -0.5
    # One-sided p of H0: diff <= -0.5: t = 0.3 / (0.1 / sqrt 3) = 5.196152.
    t = 0.3 / (0.1 / math.sqrt(3))
    assert res["ni"]["p_hold"] == pytest.approx(_sf2(t), rel=1e-5)
    assert res["ni"]["p"] == pytest.approx(2 * _sf2(t), rel=1e-5)  # 0.035098
    # "does not hold" comes from the mirror test: H0 diff >= -0.5.
    t_w = (-2.0 - 2.2 - 1.9) / 3 + 0.5
    sd_w = math.sqrt(sum((x - (-6.1 / 3)) ** 2 for x in (-2.0, -2.2, -1.9)) / 2)
    assert res["ni-worse"]["p_not"] == pytest.approx(_sf2(-t_w / (sd_w / math.sqrt(3))), rel=1e-5)
    text = claims_text(list(res.values()))
    assert "a >= b - 0.5" in text and "a > b" in text and text.count("Holm:") == 4


def test_holm_can_withdraw_a_raw_verdict(tmp_path):
    # x: d = (10, 10.5, 10.5), superior: t = 10.3333 / (0.288675 / sqrt 3) = 62.0 -> p = 2 * sf(62) = 0.000260.
    # y: d = (-0.3, -0.1, -0.2), noninferior 0.5: p = 2 * sf(5.196152) = 0.035098 < 0.05, raw verdict holds.
    # z: the same d, superior: t = -3.464102 -> p = 2 * sf(3.464102) = 0.074180, inconclusive.
    # Holm over 3: 0.000260 < 0.05 / 3 (x holds); 0.035098 > 0.05 / 2 (y and everything after: inconclusive).
    _fake_cells(tmp_path, {"a": [80.0, 81.0, 82.0], "b": [70.0, 70.5, 71.5], "c": [88.0, 88.4, 88.2],
                           "d": [88.3, 88.5, 88.4]})
    task = _task([{"id": "x", "a": "a", "b": "b"},
                  {"id": "y", "a": "c", "b": "d", "test": "noninferior", "margin": 0.5},
                  {"id": "z", "a": "c", "b": "d"},
                  {"id": "missing", "a": "c", "b": "gone"}])
    res = {r["id"]: r for r in check_claims(tmp_path, task)}
    px, py, pz = 2 * _sf2(62.0), 2 * _sf2(0.3 / (0.1 / math.sqrt(3))), 2 * _sf2(0.2 / (0.1 / math.sqrt(3)))
    assert (res["x"]["p"], res["y"]["p"], res["z"]["p"]) == pytest.approx((px, py, pz), rel=1e-4)
    assert res["y"]["verdict"] == "holds" and res["y"]["verdict_holm"] == "inconclusive"
    assert res["x"]["verdict"] == res["x"]["verdict_holm"] == "holds"
    assert res["z"]["verdict"] == res["z"]["verdict_holm"] == "inconclusive"
    assert res["x"]["p_holm"] == pytest.approx(3 * px, rel=1e-4)
    assert res["y"]["p_holm"] == pytest.approx(2 * py, rel=1e-4)
    assert res["z"]["p_holm"] == pytest.approx(max(2 * py, pz), rel=1e-4)
    # A claim without two paired seeds is not one of Holm's family.
    assert res["missing"]["p"] is None and res["missing"]["verdict_holm"] == "inconclusive"
    assert res["x"]["n_holm"] == 3 and "Holm over 3 claims" in method_text(list(res.values()))
    assert "paired t over seeds, one-sided" in method_text(list(res.values()))


def test_holm_step_down():
    adj, rej = holm([0.01, 0.04, 0.03, 0.005])
    # sorted 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06: stop), 0.04 (x1, max with 0.06 -> 0.06)
    assert rej == [True, False, False, True]
    assert adj == pytest.approx([0.03, 0.06, 0.06, 0.02])


def test_lower_is_better_metric(tmp_path):
    # bpc: a - b = (0.02, 0.02, 0.01) > 0, so "a beats b" (a < b) does not hold, and a <= b + 0.05 holds
    # (interval [0.0023, 0.0310], upper end below the margin).
    _fake_cells(tmp_path, {"a": [1.62, 1.63, 1.64], "b": [1.60, 1.61, 1.63], "lo": [1.50, 1.52, 1.51]})
    task = _task([{"id": "sup", "a": "a", "b": "b"},
                  {"id": "ni", "a": "a", "b": "b", "test": "noninferior", "margin": 0.05},
                  {"id": "ni-tight", "a": "a", "b": "b", "test": "noninferior", "margin": 0.001},
                  {"id": "better", "a": "lo", "b": "b"}], metric={"name": "bpc", "goal": "min"})
    res = {r["id"]: r for r in check_claims(tmp_path, task)}
    half = T975_2 * (0.01 / math.sqrt(3)) / math.sqrt(3)
    assert res["sup"]["diff"] == pytest.approx(0.05 / 3, abs=1e-9)
    assert res["sup"]["lo"] == pytest.approx(0.05 / 3 - half, abs=1e-6)
    assert res["sup"]["verdict"] == "does not hold"
    assert res["ni"]["verdict"] == "holds"
    assert res["ni-tight"]["verdict"] == "does not hold"  # lo 0.0023 > 0.001
    assert res["better"]["verdict"] == "holds" and res["better"]["diff"] < 0
    text = claims_text(list(res.values()))
    assert "a < b" in text and "a <= b + 0.05" in text
    # The same numbers as accuracies (higher is better) turn the first verdict around.
    task.metric = {"name": "acc", "goal": "max"}
    assert {r["id"]: r for r in check_claims(tmp_path, task)}["sup"]["verdict"] == "holds"


def test_leaderboard_of_a_lower_is_better_task(tmp_path):
    task = load_task("listops")
    task.metric = {"name": "bpc", "goal": "min"}
    _fake_cells(tmp_path, {"softmax": [1.3, 1.4], "linear": [1.6, 1.5]}, full=True)
    board = write_leaderboard(tmp_path, task, ["softmax", "linear"], [0, 1], {})
    assert [r["metric"] for r in board] == ["bpc", "bpc"]
    assert [r["best_acc"] for r in board] == [1.3, 1.5]  # the best is the lowest
    with open(tmp_path / "leaderboard.csv", newline="") as f:
        header = next(csv.reader(f))
    assert header[: len(LEADERBOARD_COLUMNS)] == LEADERBOARD_COLUMNS and "metric" in header
    table = leaderboard_markdown(tmp_path, task)
    rows = [ln for ln in table.splitlines() if ln.startswith("| `")]
    assert rows[0].startswith("| `softmax`") and "test bpc (lower is better)" in table
    task.metric = {"name": "acc", "goal": "max"}
    rows = [ln for ln in leaderboard_markdown(tmp_path, task).splitlines() if ln.startswith("| `")]
    assert rows[0].startswith("| `linear`")


@pytest.mark.parametrize("change,expect", [
    ({"test": "better"}, "allowed: superior, noninferior"),
    ({"test": "noninferior"}, "needs a positive `margin`"),
    ({"test": "noninferior", "margin": -0.5}, "needs a positive `margin`"),
    ({"test": "noninferior", "margin": "big"}, "needs a positive `margin`"),
    ({"margin": 0.5}, "only `test: noninferior`"),
])
def test_bad_claims_are_refused_at_load(tmp_path, capsys, change, expect):
    raw = yaml.safe_load((CONFIG_DIR / "fmnist.yaml").read_text())
    raw["claims"] = [{"id": "c", "source": "S", "a": "softmax", "b": "linear_relu", **change}]
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(UserError, match=expect.replace("`", ".")):
        load_task(str(path))
    assert main(["arena", "run", "--task", str(path), "--budget", "quick", "--out", str(tmp_path / "o")]) == 2
    line = _err_line(capsys)
    assert "'c'" in line and expect in line


@pytest.mark.parametrize("metric,expect", [({"name": "bpc", "goal": "down"}, "goal must be one of max, min"),
                                           ("bpc", "metric must be a mapping")])
def test_bad_metric_is_refused(tmp_path, metric, expect):
    raw = yaml.safe_load((CONFIG_DIR / "fmnist.yaml").read_text())
    raw["metric"] = metric
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(UserError, match=expect):
        load_task(str(path))


def test_fingerprint_covers_metric_but_not_levels_or_requires():
    base = load_task("listops")
    fp = base.fingerprint("default")
    task = load_task("listops")
    task.reference_levels = {"x": 1.0}
    task.requires = "gpu"
    assert task.fingerprint("default") == fp
    assert load_task("listops").reference_levels  # the shipped file declares them
    assert load_task("pathfinder32").requires == "gpu"
    task.metric = {"name": "bpc", "goal": "min"}
    assert task.fingerprint("default") != fp
    # The default metric leaves the fingerprints of existing runs as they were.
    fmnist = json.loads((Path(__file__).resolve().parents[2] / "benchmarks/results/arena/fmnist/arena.json")
                        .read_text())
    assert load_task("fmnist").fingerprint("default") == fmnist["fingerprint"]


def _run_dir(tmp_path: Path, task_file: Path, budget: str = "default") -> Path:
    task = load_task(str(task_file))
    out = tmp_path / "run"
    out.mkdir()
    (out / "arena.json").write_text(json.dumps({"task": task.name, "source": str(task_file.resolve()),
                                                "budget": budget, "fingerprint": task.fingerprint(budget)}))
    return out


def test_check_refuses_claims_edited_after_the_run_began(tmp_path, capsys):
    raw = yaml.safe_load((CONFIG_DIR / "fmnist.yaml").read_text())
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = _run_dir(tmp_path, path)
    _fake_cells(out, {"softmax": [81.0, 82.0, 80.0], "linear_relu": [82.0, 82.5, 82.2]})
    assert check_run_claims(out, load_task(str(path))) is None
    assert main(["arena", "check", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].startswith("test: paired t over seeds, one-sided") and "Holm:" in printed
    raw["claims"][0]["margin"] = 0.1
    raw["claims"][0]["test"] = "noninferior"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(UserError, match="differ from those this run was started with"):
        check_run_claims(out, load_task(str(path)))
    assert main(["arena", "check", str(out)]) == 2
    assert "claims" in _err_line(capsys)


def test_check_of_a_quick_run_says_it_is_a_smoke_test(tmp_path, capsys):
    """Issue 34 item 13: `check` on a `--budget quick` run carries the caveat `report` has; a default run does not."""
    raw = yaml.safe_load((CONFIG_DIR / "fmnist.yaml").read_text())
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(raw))
    for budget in ("quick", "default"):
        (tmp_path / budget).mkdir()
        out = _run_dir(tmp_path / budget, path, budget)
        _fake_cells(out, {"softmax": [81.0, 82.0, 80.0], "linear_relu": [82.0, 82.5, 82.2]})
        assert main(["arena", "check", str(out)]) == 0
        printed = capsys.readouterr().out
        smoke = "Smoke test (budget `quick`: a few steps on a tiny subset): these numbers check that the cells run"
        assert (printed.splitlines()[0].startswith(smoke) if budget == "quick" else smoke not in printed), printed
        assert "Holm:" in printed


def test_check_of_a_run_that_predates_recorded_claims_says_so(tmp_path, capsys):
    out = tmp_path / "old"
    out.mkdir()
    (out / "arena.json").write_text(json.dumps({"task": "listops", "budget": "default",
                                                "fingerprint": json.dumps({"kind": "lra"})}))
    assert "predates recorded claims" in check_run_claims(out, load_task("listops"))


def test_quick_run_report_is_a_smoke_test_without_std(tmp_path):
    task = load_task("listops")
    out = tmp_path / "q"
    out.mkdir()
    (out / "arena.json").write_text(json.dumps({"task": "listops", "budget": "quick",
                                                "fingerprint": task.fingerprint("quick")}))
    _fake_cells(out, {"softmax": [30.0], "linear": [20.0, 22.0]}, full=True)
    board = {r["attention"]: r for r in write_leaderboard(out, task, ["softmax", "linear"], [0, 1], {})}
    assert board["softmax"]["std_acc"] == "" and board["softmax"]["n_seeds"] == 1
    assert board["linear"]["std_acc"] == pytest.approx(math.sqrt(2), abs=1e-3)
    with open(out / "leaderboard.csv", newline="") as f:
        rows = {r["attention"]: r for r in csv.DictReader(f)}
    assert rows["softmax"]["std_acc"] == "" and rows["linear"]["std_acc"] == "1.414"
    table = leaderboard_markdown(out)
    lines = table.splitlines()
    assert lines[0] == SMOKE_LINE and lines[2].startswith("| attention")
    assert "| `softmax` | - | 30.00 |" in table and "21.00 ± 1.41" in table
    # A default-budget run has no smoke line.
    (out / "arena.json").write_text(json.dumps({"task": "listops", "budget": "default"}))
    assert "Smoke test" not in leaderboard_markdown(out)


def test_series_styles_are_distinct():
    styles = [series_style(i) for i in range(20)]
    assert len({c for c, _ in styles}) == 20
    assert len(set(series_style(i) for i in range(100))) == 100


def test_step_curves_draw_one_line_per_seed_and_the_reference_levels(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")  # the plot extra; without it no plot is written (tested below)
    import matplotlib.axes

    drawn, levels = [], []
    plot, axhline = matplotlib.axes.Axes.plot, matplotlib.axes.Axes.axhline

    def rec_plot(self, *args, **kw):
        drawn.append((kw.get("label"), kw.get("color"), tuple(args[1])))
        return plot(self, *args, **kw)

    def rec_hline(self, y=0, *args, **kw):
        levels.append((y, kw.get("label")))
        return axhline(self, y, *args, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", rec_plot)
    monkeypatch.setattr(matplotlib.axes.Axes, "axhline", rec_hline)
    task = load_task("listops")
    task.reference_levels = {"majority class": 14.3, "input-blind rule": 32.3}
    _fake_cells(tmp_path, {"softmax": [30.0, 31.0, 32.0], "linear": [20.0, 22.0, 21.0]}, full=True)
    write_leaderboard(tmp_path, task, ["softmax", "linear"], [0, 1, 2], {})
    curves = [d for d in drawn if len(d[2]) == 3]  # the step curves: 3 evaluations each
    assert len(curves) == 6  # one line per (mechanism, seed)
    assert [d[0] for d in curves] == ["softmax", None, None, "linear", None, None]  # one legend entry each
    assert len({d[1] for d in curves[:3]}) == 1 and curves[0][1] != curves[3][1]  # one colour per mechanism
    # Both plots draw both levels.
    assert sorted(levels) == sorted([(14.3, "majority class (14.3)"), (32.3, "input-blind rule (32.3)")] * 2)
    assert (tmp_path / "curves.png").is_file() and (tmp_path / "leaderboard.png").is_file()


@pytest.mark.parametrize("task", ["pathfinder32", "charlm"])
def test_requires_gpu_refuses_without_cuda(tmp_path, capsys, monkeypatch, task):
    from subquad.arena import runner

    monkeypatch.setattr(runner, "_cuda_available", lambda: False)
    out = tmp_path / "pf"
    assert load_task(task).requires == "gpu"
    assert main(["arena", "run", "--task", task, "--budget", "quick", "--out", str(out)]) == 2
    line = _err_line(capsys)
    assert "needs a GPU" in line and "--device cpu" in line and not out.exists()
    assert main(["arena", "run", "--task", task, "--budget", "quick", "--device", "cuda",
                 "--out", str(out)]) == 2
    assert "no CUDA device" in _err_line(capsys)
    assert main(["arena", "run", "--task", task, "--budget", "quick", "--device", "tpu",
                 "--out", str(out)]) == 2
    assert "--device 'tpu' is not a device" in _err_line(capsys)  # the command checks every --device first
    with pytest.raises(UserError, match="--device must be one of cpu, cuda"):
        runner.resolve_device(load_task("pathfinder32"), "mps")
    # With CUDA, a requires-gpu task trains on it without being asked; other tasks keep their recipe's device.
    monkeypatch.setattr(runner, "_cuda_available", lambda: True)
    assert runner.resolve_device(load_task("pathfinder32"), None) == "cuda"
    assert runner.resolve_device(load_task("listops"), None) is None


def test_a_run_keeps_its_device(tmp_path, capsys, monkeypatch):
    from subquad.arena import runner

    task = load_task("listops")
    out = tmp_path / "run"
    out.mkdir()
    (out / "arena.json").write_text(json.dumps({"task": "listops", "source": "listops", "budget": "quick",
                                                "fingerprint": task.fingerprint("quick"), "device": "cpu"}))
    monkeypatch.setattr(runner, "_cuda_available", lambda: True)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)  # the command's own --device check
    assert main(["arena", "run", "--task", "listops", "--budget", "quick", "--device", "cuda",
                 "--out", str(out)]) == 2
    assert "was started with --device cpu" in _err_line(capsys)


def test_lra_cell_eval_and_memory_mean_what_the_image_cells_do(tmp_path):
    """eval_per_sec: test examples per wall-clock second of the test pass (as the image trainer's
    eval_images_per_sec), not the validation passes' CPU rate; peak_mem_mb measured to the end of the test pass."""
    from subquad.arena import lra

    raw = yaml.safe_load((CONFIG_DIR / "listops.yaml").read_text())
    data = lra.prepare_data(raw, tmp_path / "data", budget="quick")
    train = {k: v for k, v in {**raw["train"], **raw["budgets"]["quick"]}.items() if k != "generate"}
    res = lra.run_cell({**train, "data": str(data)}, {"attention": "linear"}, 0, tmp_path / "cell")
    out = json.loads((tmp_path / "cell" / "results.json").read_text())
    assert out["test_seconds"] > 0 and out["test_cpu_seconds"] >= 0
    assert res["eval_per_sec"] == pytest.approx(out["test_samples"] / out["test_seconds"])
    assert res["peak_mem_mb"] == out["peak_mem_mb"] >= 0


def test_report_plots_rewrites_the_plots_and_nothing_else(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    task = load_task("listops")
    out = tmp_path / "run"
    out.mkdir()
    (out / "arena.json").write_text(json.dumps({"task": "listops", "budget": "default",
                                                "fingerprint": task.fingerprint("default")}))
    _fake_cells(out, {"softmax": [30.0, 31.0], "linear": [20.0, 22.0]}, full=True)
    write_leaderboard(out, task, ["softmax", "linear"], [0, 1], {})
    board = (out / "leaderboard.csv").read_bytes()
    for f in ("leaderboard.png", "curves.png"):
        (out / f).unlink()
    assert main(["arena", "report", str(out), "--plots"]) == 0
    assert "plots:" in capsys.readouterr().out
    assert (out / "leaderboard.png").is_file() and (out / "curves.png").is_file()
    assert (out / "leaderboard.csv").read_bytes() == board


def _load_backfill():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "backfill_arena_commits.py"
    spec = importlib.util.spec_from_file_location("backfill_arena_commits", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_backfill_reconstructs_the_commit_from_git_history(tmp_path, monkeypatch):
    import subprocess

    repo = tmp_path / "repo"
    (repo / "subquad").mkdir(parents=True)

    def commit(msg: str, when: str) -> str:
        env = {**os.environ, "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when, "GIT_AUTHOR_NAME": "t",
               "GIT_COMMITTER_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_EMAIL": "t@t"}
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, env=env)
        subprocess.run(["git", "-C", str(repo), "commit", "-qm", msg], check=True, env=env)
        return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True,
                              text=True).stdout.strip()

    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "subquad" / "x.py").write_text("a = 1\n")
    c1 = commit("code 1", "2026-12-01T09:00:00+00:00")
    run = repo / "run"
    (run / "cells" / "m" / "seed0").mkdir(parents=True)
    (run / "cells" / "m" / "seed1").mkdir(parents=True)
    (run / "arena.json").write_text(json.dumps({"task": "t", "created": "2026-12-01 09:30:00"}))
    (run / "cells" / "m" / "seed0" / "cell.json").write_text(json.dumps({"seed": 0, "wall_s": 600.0}))
    commit("cell 0", "2026-12-01T10:00:00+00:00")  # trained 09:30-09:50 at the latest: code 1, exact
    (repo / "subquad" / "x.py").write_text("a = 2\n")
    c2 = commit("code 2", "2026-12-01T11:00:00+00:00")
    (repo / "notes.txt").write_text("n\n")
    c3 = commit("not code", "2026-12-01T11:30:00+00:00")
    (run / "cells" / "m" / "seed1" / "cell.json").write_text(json.dumps({"seed": 1, "wall_s": 1800.0}))
    commit("cell 1", "2026-12-01T12:00:00+00:00")  # started 09:30-11:30: code 1 or code 2
    done = run / "cells" / "m" / "seed2"
    done.mkdir()
    (done / "cell.json").write_text(json.dumps({"seed": 2, "wall_s": 1.0, "commit": "abc", "tree_clean": True}))
    commit("cell 2", "2026-12-01T12:30:00+00:00")
    mod = _load_backfill()
    monkeypatch.setattr(mod, "ROOT", repo)
    assert mod.backfill(run, dry_run=False) == 2
    r0 = json.loads((run / "cells" / "m" / "seed0" / "cell.json").read_text())
    r1 = json.loads((run / "cells" / "m" / "seed1" / "cell.json").read_text())
    assert r0["commit"] == c1 and r0["tree_clean"] is None and "exact" in r0["commit_source"]
    assert r0["commit_source"].startswith("reconstructed from git history:") and "commit_earliest" not in r0
    # The newest code that can have trained it (c3: subquad/ as at c2), and the code at the run's start.
    assert r1["commit"] == c3 and r1["commit_earliest"] == c1 and "1 first-parent commit(s)" in r1["commit_source"]
    assert c2 != c3
    assert json.loads((done / "cell.json").read_text()) == {"seed": 2, "wall_s": 1.0, "commit": "abc",
                                                            "tree_clean": True}  # untouched
    assert mod.backfill(run, dry_run=False) == 0  # idempotent


def test_backfill_lr_sweeps_records_the_sweep_each_seed_took_its_rate_from(tmp_path, capsys):
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "backfill_arena_lr_sweeps.py"
    spec = importlib.util.spec_from_file_location("backfill_arena_lr_sweeps", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    run = tmp_path / "run"
    sweep = {"0.001": 5.0, "0.003": 90.0, "0.01": 1.0}
    cells = {0: {"seed": 0, "lr": 0.003, "lr_sweep": sweep, "test_acc": 88.0},
             1: {"seed": 1, "lr": 0.003, "lr_sweep": {}, "test_acc": float("nan")},
             2: {"seed": 2, "lr": 0.003, "lr_sweep": sweep, "lr_sweep_seed": 0}}
    for seed, row in cells.items():
        (run / "cells" / "m" / f"seed{seed}").mkdir(parents=True)
        (run / "cells" / "m" / f"seed{seed}" / "cell.json").write_text(json.dumps(row, indent=2) + "\n")
    before = (run / "cells" / "m" / "seed2" / "cell.json").read_text()
    assert mod.main([str(run), "--dry-run"]) == 0 and "2 cell(s) would change" in capsys.readouterr().out
    assert json.loads((run / "cells" / "m" / "seed1" / "cell.json").read_text())["lr_sweep"] == {}
    assert mod.main([str(run)]) == 0
    r0, r1 = (json.loads((run / "cells" / "m" / f"seed{s}" / "cell.json").read_text()) for s in (0, 1))
    assert r0 == {**cells[0], "lr_sweep_seed": 0}
    assert (r1["lr_sweep"], r1["lr_sweep_seed"], r1["lr"]) == (sweep, 0, 0.003) and math.isnan(r1["test_acc"])
    assert r1["lr_sweep_source"].startswith("filled in afterwards from cells/m/seed0/cell.json")
    assert (run / "cells" / "m" / "seed2" / "cell.json").read_text() == before  # already recorded: untouched
    assert mod.main([str(run)]) == 0 and "0 cell(s) changed" in capsys.readouterr().out.splitlines()[-1]
    # A seed whose rate is not the one the sweep chose stops the script, naming both.
    (run / "cells" / "n" / "seed0").mkdir(parents=True)
    (run / "cells" / "n" / "seed1").mkdir(parents=True)
    (run / "cells" / "n" / "seed0" / "cell.json").write_text(json.dumps({"seed": 0, "lr": 0.01, "lr_sweep": sweep}))
    (run / "cells" / "n" / "seed1" / "cell.json").write_text(json.dumps({"seed": 1, "lr": 0.003, "lr_sweep": {}}))
    with pytest.raises(SystemExit, match="lr 0.003 is not the rate"):
        mod.main([str(run)])
    assert "lr_sweep_seed" not in json.loads((run / "cells" / "n" / "seed0" / "cell.json").read_text())
    # A seed without its sweep seed's cell stops with one line naming the missing file, and writes nothing.
    (run / "cells" / "n" / "seed1" / "cell.json").write_text(json.dumps({"seed": 1, "lr": 0.01, "lr_sweep": {}}))
    (run / "cells" / "n" / "seed0" / "cell.json").unlink()
    with pytest.raises(SystemExit, match="no sweep seed cell .*seed0.cell.json"):
        mod.main([str(run)])
    assert json.loads((run / "cells" / "n" / "seed1" / "cell.json").read_text())["lr_sweep"] == {}
    assert not list(run.rglob("*.tmp"))


def test_tasks_lists_the_gpu_requirement(capsys):
    assert main(["arena", "tasks"]) == 0
    lines = {ln.split(" ")[0]: ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith(" ")}
    assert "needs a GPU" in lines["pathfinder32"] and "needs a GPU" not in lines["listops"]
