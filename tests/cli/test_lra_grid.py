"""`subquad lra train --grid`: 2-D mechanisms on Pathfinder's pixel grid through the CLI; bad grids in one line."""

from __future__ import annotations

import json

import pytest

from subquad.data.lra.pathfinder import write_pathfinder
from subquad_cli.__main__ import main


@pytest.fixture(scope="module")
def pf_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("pf")
    write_pathfinder(out, size=32, contour_length=6, num_images=20, seed=2)
    return out


def test_pathfinder_with_a_2d_mechanism(pf_dir, tmp_path, capsys):
    out = tmp_path / "run"
    flags = ["lra", "train", "--task", "pathfinder", "--data", str(pf_dir), "--attention", "window",
             "--max-steps", "2", "--eval-every", "2", "--batch-size", "4", "--dim", "16", "--mlp-dim", "16",
             "--device", "cpu"]
    assert main([*flags, "--grid", "32,32", "--pool", "mean", "--output", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["attention"] == "window" and res["test_samples"] == 2
    capsys.readouterr()
    assert main([*flags, "--output", str(tmp_path / "no_grid")]) == 2
    assert "cannot encode 1-D sequences" in capsys.readouterr().err
    assert main([*flags, "--grid", "32,32", "--output", str(tmp_path / "cls")]) == 2  # the recipe's cls_last
    assert "class token" in capsys.readouterr().err
    assert main([*flags, "--grid", "32", "--pool", "mean", "--output", str(tmp_path / "bad")]) == 2
    assert "--grid expects H,W" in capsys.readouterr().err
