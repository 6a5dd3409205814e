"""benchmarks/gpu.py (the prepared GPU check): its code runs end to end on the CPU (`--device cpu`, a smoke run at
tiny sizes) and writes every row; without CUDA the real run refuses in one line and writes nothing."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from tests.bench._scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


def _script():
    return load_benchmark("gpu")


def test_smoke_run_on_cpu_writes_every_row(tmp_path):
    gpu = _script()
    out = tmp_path / "gpu.csv"
    assert gpu.main(["--device", "cpu", "--grids", "6", "--attn-batch", "1", "--models", "l2vit_micro",
                     "--model-batch", "1", "--img-size", "64", "--warmup", "0", "--repeats", "1",
                     "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == gpu.FIELDS
    attn = [r for r in rows if r["kind"] == "attention"]
    from subquad.bench.sweep import attention_candidates

    # every mechanism, both passes, both dtypes; all ran, each beside softmax at the same grid
    assert len(attn) == len(set(attention_candidates()) | {"softmax"}) * 2 * 2
    assert all(r["status"] == "ok" and float(r["ms"]) > 0 for r in attn), [r for r in attn if r["status"] != "ok"]
    assert {r["ratio_to_baseline"] for r in attn if r["name"] == "softmax"} == {"1.0"}
    models = [r for r in rows if r["kind"] == "model"]
    assert len(models) == 4 and all(r["status"] == "ok" for r in models)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_without_cuda_it_refuses_in_one_line(tmp_path, capsys):
    assert _script().main(["--out", str(tmp_path / "g.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "needs a CUDA GPU" in err
    assert not (tmp_path / "g.csv").exists()
