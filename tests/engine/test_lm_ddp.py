"""`subquad lm train`: --amp (autocast through the loop's Precision) and DDP under torchrun (rank r trains on slice r
of every global batch, so N processes with batch b equal one process with batch N * b)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest
import torch
import yaml
from safetensors.torch import load_file

from subquad.engine.sequence import LMConfig, train_lm
from subquad.errors import UserError
from subquad_cli.__main__ import main


def _args(corpus, out, *extra):
    return ["lm", "train", "--data", str(corpus), "--attention", "long_short", "--dim", "16", "--depth", "1",
            "--num-heads", "2", "--ffn-dim", "24", "--dropout", "0", "--emb-dropout", "0", "--seq-len", "16",
            "--batch-size", "4", "--lr", "3e-3", "--warmup", "1", "--max-steps", "2", "--eval-every", "2",
            "--eval-ctx", "32", "--eval-score", "16", "--eval-batch", "4", "--eval-tokens", "64",
            "--final-eval-tokens", "64", "--seed", "5", "--device", "cpu",
            "--attn-opt", "window_size=8", "--attn-opt", "chunk_size=4", "--attn-opt", "rank=1",
            "--output", str(out), *extra]


def test_amp_bf16_on_cpu_trains_and_is_recorded(corpus, tmp_path, capsys):
    assert main(_args(corpus, tmp_path / "fp32")) == 0
    assert main(_args(corpus, tmp_path / "amp", "--amp")) == 0
    args = yaml.safe_load((tmp_path / "amp" / "args.yaml").read_text())
    assert args["amp"] is True and args["amp_dtype"] == "bfloat16"
    assert yaml.safe_load((tmp_path / "fp32" / "args.yaml").read_text())["amp"] is False
    a, b = load_file(str(tmp_path / "amp" / "last.safetensors")), load_file(str(tmp_path / "fp32" / "last.safetensors"))
    assert all(torch.isfinite(v).all() for v in a.values())
    # bf16 autocast changes the numerics (autocast was on), but only slightly over 2 steps.
    assert any(not torch.equal(a[k], b[k]) for k in a)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0.05, atol=0.02, msg=k)
    with open(tmp_path / "amp" / "summary.csv", newline="") as f:
        row = next(csv.DictReader(f))
    assert 0 < float(row["valid_bpc"]) < 10


def test_amp_dtype_refused_clearly(corpus, tmp_path, capsys):
    with pytest.raises(SystemExit):  # argparse: the allowed choices
        main(_args(corpus, tmp_path / "x", "--amp", "--amp-dtype", "int8"))
    assert "bfloat16" in capsys.readouterr().err
    with pytest.raises(UserError, match="bfloat16 or float16"):
        train_lm(LMConfig(data=str(corpus), amp=True, amp_dtype="int8", device="cpu", output=str(tmp_path / "y")))
    assert not (tmp_path / "y").exists()


def test_resume_refuses_amp_flag(corpus, tmp_path, capsys):
    assert main(_args(corpus, tmp_path / "r")) == 0
    assert main(["lm", "train", "--resume", str(tmp_path / "r"), "--amp"]) == 2
    assert "--amp" in capsys.readouterr().err


@pytest.mark.slow
def test_ddp_two_processes_equal_single_process(corpus, tmp_path):
    # Dropout 0: each rank draws its own dropout masks, which no single process reproduces.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ddp = _args(corpus, tmp_path / "ddp", "--batch-size", "3", "--max-steps", "4")[1:]
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                        "29547", "-m", "subquad", *["lm", *ddp]], capture_output=True, text=True, timeout=600,
                       env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert main(_args(corpus, tmp_path / "one", "--batch-size", "6", "--max-steps", "4")) == 0
    a, b = load_file(str(tmp_path / "ddp" / "last.safetensors")), load_file(str(tmp_path / "one" / "last.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    rows = []
    for d in ("ddp", "one"):
        with open(tmp_path / d / "summary.csv", newline="") as f:
            rows.append(list(csv.DictReader(f)))
    assert len(rows[0]) == len(rows[1]) == 2
    for ra, rb in zip(*rows):
        assert ra["step"] == rb["step"] and ra["valid_tokens"] == rb["valid_tokens"]
        assert abs(float(ra["train_bpc"]) - float(rb["train_bpc"])) < 1e-4
        assert abs(float(ra["valid_bpc"]) - float(rb["valid_bpc"])) < 1e-4
    # Only rank 0 wrote (one results.json, the global token count).
    import json

    ra, rb = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("ddp", "one"))
    assert ra["train_tokens"] == rb["train_tokens"] and abs(ra["valid_bpc"] - rb["valid_bpc"]) < 1e-4
