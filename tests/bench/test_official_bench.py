"""benchmarks/official.py (ours vs the official models: logits and speed) and the official-code loader it uses."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tests._official import build_official
from tests.bench._scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "_fixtures"


def _bench():
    return load_benchmark("official")


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def test_missing_root_is_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("SUBQUAD_OFFICIAL_ROOT", raising=False)
    out = tmp_path / "r.csv"
    assert _bench().main(["--model", "flatten_pvt_v2_b0", "--out", str(out)]) == 2
    assert "SUBQUAD_OFFICIAL_ROOT is not set" in _one_line_error(capsys)
    # A root without the checkouts names the first missing file.
    assert _bench().main(["--model", "flatten_pvt_v2_b0", "--official-root", str(tmp_path), "--out", str(out)]) == 2
    assert "official file not found" in _one_line_error(capsys) and not out.exists()
    assert _bench().main(["--model", "cvt_ls_13", "--official-root", str(tmp_path), "--out", str(out)]) == 2
    assert "no official counterpart for model 'cvt_ls_13'" in _one_line_error(capsys)


def test_randomise_perturbs_only_constant_tensors():
    m = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.BatchNorm1d(4))
    m[0].bias.data.zero_()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    _bench().randomise_(m, 0)
    after = m.state_dict()
    assert torch.equal(after["0.weight"], before["0.weight"])  # already random: kept
    for k in ("0.bias", "1.weight", "1.bias", "2.weight", "2.bias", "2.running_mean", "2.running_var"):
        assert not torch.equal(after[k], before[k]) and after[k].unique().numel() == 4, k
    assert (after["2.running_var"] > 0).all() and (after["1.weight"] > 0).all()
    assert torch.equal(after["2.num_batches_tracked"], before["2.num_batches_tracked"])


@pytest.mark.parity
def test_benchmark_row(official_root, tmp_path, capsys):
    bench = _bench()
    out = tmp_path / "official.csv"
    args = ["--model", "flatten_pvt_v2_b0", "--rounds", "1", "--warmup", "0", "--official-root", official_root,
            "--out", str(out)]
    assert bench.main(args) == 0
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and set(bench.COLUMNS) <= set(rows[0])
    r = rows[0]
    assert r["model"] == "flatten_pvt_v2_b0" and r["img_size"] == "224" and r["batch_size"] == "1"
    assert 0 <= float(r["logits_rel_err"]) < 1e-5 and r["parity_ok"] == "1" and r["status"] == "ok"
    assert float(r["ours_ms"]) > 0 and float(r["official_ms"]) > 0
    assert float(r["speedup"]) == pytest.approx(float(r["official_ms"]) / float(r["ours_ms"]), rel=1e-2)
    assert int(r["threads"]) == torch.get_num_threads() and r["torch"] == torch.__version__
    # An earlier output is replaced; any other file is refused before anything runs.
    assert bench.main(args) == 0
    other = tmp_path / "other.csv"
    other.write_text("name,value\n")
    assert bench.main(args[:-1] + [str(other)]) == 2
    assert "is not an earlier --out" in _one_line_error(capsys) and other.read_text() == "name,value\n"


def _fixture(name: str) -> dict[str, list[int]]:
    if name.startswith("vil_ls"):
        return json.loads((FIXTURES / f"{name}_keys.json").read_text())["keys"]
    family = "flatten_swin" if name.startswith("flatten_swin") else "flatten_cswin"
    return json.loads((FIXTURES / f"{family}_keys.json").read_text())["models"][name]


@pytest.mark.parity
@pytest.mark.parametrize("name", ["flatten_swin_tiny", "flatten_swin_base_384", "flatten_cswin_tiny",
                                  "flatten_cswin_base_384", "vil_ls_medium", "vil_ls_medium_384"])
def test_official_configs_match_fixtures(official_root, name):
    """build_official's configs (window / split sizes that follow img_size, MsViT arch strings) give the official key
    layouts recorded in the fixtures; the einops stand-in does not outlive loading."""
    off = build_official(official_root, name)
    assert {k: list(v.shape) for k, v in off.state_dict().items()} == _fixture(name)
    assert "einops" not in sys.modules or importlib.util.find_spec("einops") is not None
