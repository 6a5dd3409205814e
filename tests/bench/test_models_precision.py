"""benchmarks/models_precision.py: per-model parts (resumable), their merge, and the docs table."""

from __future__ import annotations

import csv
import json

import pytest

from subquad.bench.sweep import MODEL_COLUMNS
from subquad.errors import UserError

from ._scripts import load_benchmark


def test_parts_resume_and_merge(tmp_path, monkeypatch):
    mp = load_benchmark("models_precision")
    parts, out = tmp_path / "parts", tmp_path / "all.csv"
    # --backend passes through (compile is a minute per model, an ONNX export ~15 s on a 2-core Zen 3: the other
    # backends' rows are tested in test_bench_precision.py).
    argv = ["--model", "vit_attn_micro,l2vit_micro", "--img-size", "16", "--repeats", "1", "--warmup", "0",
            "--threads", "1", "--parts", str(parts), "--backend", "eager"]
    assert mp.main(argv + ["--out", str(out)]) == 0
    for m in ("vit_attn_micro", "l2vit_micro"):
        assert (parts / f"{m}.csv").is_file() and (parts / f"{m}.json").is_file()
    assert not list(parts.glob(".*"))  # no partial file left behind
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == MODEL_COLUMNS
    assert [r["model"] for r in rows] == ["vit_attn_micro"] * 3 + ["l2vit_micro"] * 3
    assert {r["backend"] for r in rows} == {"eager"}
    assert all("--backend eager " in " ".join(json.loads((parts / f"{m}.json").read_text())["command"]) + " "
               for m in ("vit_attn_micro", "l2vit_micro"))
    ok = [r for r in rows if r["status"] == "ok"]
    assert {(r["precision"], r["backend"]) for r in ok} >= {("fp32", "eager")}
    # A second run measures nothing again (its parts exist) and refuses an existing --out.
    monkeypatch.setattr(mp.subprocess, "run", lambda *a, **k: pytest.fail("measured a model twice"))
    with pytest.raises(UserError, match="exists"):
        mp.main(argv + ["--out", str(out)])
    assert mp.main(argv + ["--out", str(tmp_path / "again.csv")]) == 0
    assert (tmp_path / "again.csv").read_bytes() == out.read_bytes()


def test_table_marks_the_fastest_path_and_the_target(tmp_path):
    mp = load_benchmark("models_precision")
    path = tmp_path / "t.csv"
    rows = [("a", "fp32", "eager", "10", "1.0", "ok", "3.1"), ("a", "bf16", "eager", "4", "2.5", "ok", "12.6"),
            ("a", "int8", "onnxruntime", "5", "2.0", "ok", "0.4"), ("a", "bf16", "compile", "", "", "error: boom", ""),
            ("b", "fp32", "eager", "8", "1.0", "ok", "2.0"), ("b", "fp32", "compile", "6.4", "1.25", "ok", "1.0")]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=MODEL_COLUMNS)
        w.writeheader()
        for m, p, b, t, s, st, sp in rows:
            w.writerow({"model": m, "infer_img_size": 224, "precision": p, "backend": b, "infer_step_time": t,
                        "speedup_vs_fp32_eager": s, "status": st, "time_spread_pct": sp})
    lines = mp.table(path).splitlines()
    a, b = (next(x for x in lines if x.startswith(f"| `{m}`")) for m in "ab")
    assert "bf16 eager (2.50x)" in a and a.endswith("| yes | 13 % |") and "| error |" in a and "| 10.0 |" in a
    assert "fp32 compile (1.25x)" in b and b.endswith("| **no** | 2 % |")


def test_a_noisy_model_is_measured_once_more_and_the_repeat_kept(tmp_path, monkeypatch):
    mp = load_benchmark("models_precision")
    spreads = iter(["35.0", "4.0"])

    def fake_run(cmd, check, cwd):  # writes what `subquad bench model --out` would, with the next spread
        out = cmd[cmd.index("--out") + 1]
        with open(out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=MODEL_COLUMNS)
            w.writeheader()
            w.writerow({"model": "m", "status": "ok", "time_spread_pct": next(spreads), "precision": "fp32",
                        "backend": "eager"})
            w.writerow({"model": "m", "status": "skipped: no int8 in eager", "time_spread_pct": "99"})

    monkeypatch.setattr(mp.subprocess, "run", fake_run)
    args = mp._args(["--model", "m"])
    part = mp.measure("m", args, tmp_path)
    with open(part, newline="") as f:
        assert next(csv.DictReader(f))["time_spread_pct"] == "4.0"
    assert json.loads((tmp_path / "m.json").read_text())["max_spread_pct"] == [35.0, 4.0]
    assert not list(tmp_path.glob(".*"))
    # A quiet first run is kept as it is.
    spreads = iter(["5.0"])
    mp.measure("q", args, tmp_path)
    assert json.loads((tmp_path / "q.json").read_text())["max_spread_pct"] == [5.0]


def test_table_joins_the_fastest_paths_accuracy_on_the_micro_sibling(tmp_path):
    mp = load_benchmark("models_precision")
    speed, acc = tmp_path / "s.csv", tmp_path / "a.csv"
    with open(speed, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=MODEL_COLUMNS)
        w.writeheader()
        for m, p, b, s in [("fam_a_small", "fp32", "eager", "1.0"), ("fam_a_small", "int8", "onnxruntime", "3.0"),
                           ("fam_a_small", "bf16", "eager", "2.0"), ("fam_b_tiny", "fp32", "eager", "1.0"),
                           ("fam_b_tiny", "bf16", "eager", "2.0"), ("l2vit_deit_tiny", "fp32", "eager", "1.0"),
                           ("l2vit_deit_tiny", "bf16", "compile", "1.6"), ("orphan_s", "fp32", "eager", "1.0"),
                           ("orphan_s", "bf16", "eager", "1.9")]:
            w.writerow({"model": m, "infer_img_size": 224, "precision": p, "backend": b, "infer_step_time": "9",
                        "speedup_vs_fp32_eager": s, "status": "ok", "time_spread_pct": "1"})
    with open(acc, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["model", "precision", "backend", "top1_delta", "status"])
        w.writeheader()
        w.writerows([{"model": "fam_a_micro", "precision": "int8", "backend": "onnxruntime", "top1_delta": "-0.27",
                      "status": "ok"},
                     {"model": "fam_a_micro", "precision": "bf16", "backend": "eager", "top1_delta": "-2.0",
                      "status": "ok"},
                     {"model": "fam_b_micro", "precision": "bf16", "backend": "eager", "top1_delta": "-0.82",
                      "status": "flagged: top-1 drops by more than 0.5 points"},
                     {"model": "fam_b_micro", "precision": "fp32", "backend": "eager", "top1_delta": "+0.00",
                      "status": "ok"},
                     {"model": "l2vit_micro", "precision": "bf16", "backend": "compile", "top1_delta": "+0.55",
                      "status": "ok"}])
    lines = mp.table(speed, acc).splitlines()
    assert lines[0].endswith("| fastest | fastest keeping top-1 (change on the micro model) | >= 1.5x, drop <= 0.5 "
                             "| spread |")
    row = {m: next(x for x in lines if x.startswith(f"| `{m}`")) for m in
           ("fam_a_small", "fam_b_tiny", "l2vit_deit_tiny", "orphan_s")}
    assert "| int8 onnxruntime (3.00x) | int8 onnxruntime (3.00x, -0.27 on `fam_a_micro`) | yes |" in row["fam_a_small"]
    # bf16 is fastest but drops 0.82: fp32 eager (its own reference, change 0) is what keeps top-1, at 1.0x.
    assert "| bf16 eager (2.00x) | fp32 eager (1.00x, +0.00 on `fam_b_micro`) | **no** |" in row["fam_b_tiny"]
    assert "| bf16 compile (1.60x, +0.55 on `l2vit_micro`) | yes |" in row["l2vit_deit_tiny"]  # a gain is no drop
    assert "| bf16 eager (1.90x) | - (no micro model measured) | **no** |" in row["orphan_s"]


def test_table_reads_several_accuracy_files_later_ones_winning(tmp_path):
    mp = load_benchmark("models_precision")
    speed = tmp_path / "s.csv"
    with open(speed, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=MODEL_COLUMNS)
        w.writeheader()
        for p, b, s in [("fp32", "eager", "1.0"), ("int8", "eager", "1.7"), ("bf16", "eager", "1.6")]:
            w.writerow({"model": "fam_a_small", "infer_img_size": 224, "precision": p, "backend": b,
                        "infer_step_time": "9", "speedup_vs_fp32_eager": s, "status": "ok", "time_spread_pct": "1"})
    files = []
    for name, rows in [("old", [("bf16", "eager", "+0.00"), ("int8", "eager", "-2.00")]),
                       ("new", [("int8", "eager", "-0.27")])]:
        files.append(tmp_path / f"{name}.csv")
        with open(files[-1], "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["model", "precision", "backend", "top1_delta", "status"])
            w.writeheader()
            w.writerows({"model": "fam_a_micro", "precision": p, "backend": b, "top1_delta": d, "status": "ok"}
                        for p, b, d in rows)
    row = next(x for x in mp.table(speed, files).splitlines() if x.startswith("| `fam_a_small`"))
    assert "| int8 eager (1.70x, -0.27 on `fam_a_micro`) | yes |" in row  # the later file's int8 row counts
    row = next(x for x in mp.table(speed, files[:1]).splitlines() if x.startswith("| `fam_a_small`"))
    assert "| bf16 eager (1.60x, +0.00 on `fam_a_micro`) | yes |" in row  # alone, the old file drops int8
