from __future__ import annotations

import subprocess
import sys

import pytest

from subquad.cli.__main__ import COMMANDS, main


def _run(*args):
    return subprocess.run([sys.executable, "-m", "subquad.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_help_for_every_command(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0
    assert "usage" in capsys.readouterr().out


def test_flops_matches_timm_deit(capsys):
    assert main(["flops", "--model", "deit_tiny_patch16_224"]) == 0
    out = capsys.readouterr().out
    assert "GMACs: 1.25" in out


def test_unknown_model_one_line():
    r = _run("flops", "--model", "no_such_model")
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.strip().splitlines() if ln]
    assert len(lines) == 1 and "no_such_model" in lines[0] and "Traceback" not in r.stderr


def test_models_table(capsys):
    assert main(["models", "--filter", "vit_attn_micro"]) == 0
    assert "vit_attn_micro" in capsys.readouterr().out


def test_train_tiny_run_writes_outputs(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--model", "vit_attn_micro", "--data", "digits", "--epochs", "1", "--img-size", "16",
                 "--train-limit", "128", "--eval-limit", "64", "--output", str(out)]) == 0
    for f in ("args.yaml", "summary.csv", "last.safetensors", "best.safetensors", "best.json"):
        assert (out / f).is_file(), f
    assert "test accuracy" in capsys.readouterr().out
