from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from subquad_cli.__main__ import main

TINY = ["--model", "vit_attn_micro", "--data", "digits", "--img-size", "16", "--train-limit", "128",
        "--eval-limit", "64", "-b", "32", "--log-interval", "0", "--device", "cpu"]


def _err_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("subquad")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_dry_run_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--epochs", "2", "--mixup", "0.8", "--cutmix", "1.0", "--aa", "rand-m9-mstd0.5",
                 "--reprob", "0.25", "--model-ema", "--clip-grad", "1.0", "--output", str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "dry run: vit_attn_micro" in text and "mixup: 0.8" in text
    assert not out.exists()


def test_train_outputs_and_recipe_flags(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--train-limit", "64", "--epochs", "1", "--aug", "light", "--mixup", "0.2",
                 "--cutmix", "0.2", "--smoothing", "0.1", "--model-ema", "--model-ema-decay", "0.9", "--clip-grad",
                 "1.0", "--grad-accum-steps", "2",
                 "--channels-last", "--grad-checkpointing", "--amp", "--amp-dtype", "bfloat16", "--drop-path", "0.1",
                 "--output", str(out)]) == 0
    for f in ("args.yaml", "summary.csv", "last.safetensors", "last.json", "best.safetensors", "best.json",
              "last_ema.safetensors", "best_ema.safetensors", "last_state.pth"):
        assert (out / f).is_file(), f
    header = (out / "summary.csv").read_text().splitlines()[0].split(",")
    assert header[:7] == ["epoch", "train_loss", "eval_loss", "eval_top1", "eval_top5", "lr", "time"]
    import json

    side = json.loads((out / "best.json").read_text())
    assert side["arch"] == "vit_attn_micro" and side["classes"] == [str(i) for i in range(10)]
    assert side["epoch"] == 1 and "eval_top1" in side["metrics"] and side["args"]["amp_dtype"] == "bfloat16"
    assert "test accuracy" in capsys.readouterr().out


def test_config_yaml_and_flag_precedence(tmp_path, capsys):
    y = tmp_path / "r.yaml"
    y.write_text("model: vit_attn_micro\nlr: 0.5\nepochs: 7\nmixup: 0.8\n")
    assert main(["train", "-c", str(y), *TINY, "--lr", "0.01", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "lr: 0.01" in out and "epochs: 7" in out and "mixup: 0.8" in out
    y.write_text("lr: 1\nno_such_key: 3\n")
    assert main(["train", "-c", str(y), "--dry-run"]) == 2
    assert "no_such_key" in _err_line(capsys)
    y.write_text("epochs: ten\n")
    assert main(["train", "-c", str(y), "--dry-run"]) == 2
    assert "epochs" in _err_line(capsys)


def _folder(root, n_bad=0, empty=False):
    from PIL import Image

    for split in ("train", "val"):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True, exist_ok=True)
            for i in range(4):
                Image.new("RGB", (4, 4), (i * 40, 0, 0)).save(root / split / c / f"{i}.png")
    for i in range(n_bad):
        (root / "train" / "a" / f"bad{i}.png").write_bytes(b"\x89PNG broken")
    if empty:
        (root / "train" / "c").mkdir()
    return root


@pytest.mark.parametrize("case", ["missing", "empty_class", "corrupt", "img_size", "bad_value", "resume_missing",
                                  "unknown_data"])
def test_bad_input_one_line(tmp_path, capsys, case):
    args = {
        "missing": lambda: ["--data", f"imagefolder:{tmp_path / 'nope'}"],
        "empty_class": lambda: ["--data", f"imagefolder:{_folder(tmp_path / 'f', empty=True)}"],
        "corrupt": lambda: ["--data", f"imagefolder:{_folder(tmp_path / 'f', n_bad=2)}"],
        "img_size": lambda: ["--img-size", "0"],
        "bad_value": lambda: ["--epochs", "0"],
        "resume_missing": lambda: ["--resume", str(tmp_path / "nope")],
        "unknown_data": lambda: ["--data", "mnist"],
    }[case]()
    base = [a for a in TINY if a not in ("--data", "digits")] if case != "img_size" else TINY[:4]
    assert main(["train", *base, *args, "--output", str(tmp_path / "run")]) == 2
    line = _err_line(capsys)
    expect = {"missing": "not found", "empty_class": "holds no images", "corrupt": "corrupt", "img_size": "img-size",
              "bad_value": "epochs", "resume_missing": "not found", "unknown_data": "allowed"}[case]
    assert expect in line
    assert not (tmp_path / "run" / "last.safetensors").exists()


def test_unknown_flag_exits_nonzero(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--no-such-flag"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--no-such-flag" in err[0]


def test_existing_run_is_never_overwritten(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--epochs", "1", "--output", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert main(["train", *TINY, "--epochs", "1", "--output", str(out)]) == 2
    assert "already holds a run" in _err_line(capsys)
    # A resume with another model is refused before anything is written.
    assert main(["train", "--resume", str(out), "--model", "vit_attn_tiny"]) == 2
    assert "drop --model 'vit_attn_tiny' (the run has 'vit_attn_micro')" in _err_line(capsys)
    # Resuming a finished run trains nothing and changes nothing.
    assert main(["train", "--resume", str(out)]) == 0
    after = {p.name: p.read_bytes() for p in out.iterdir()}
    for name in ("last.safetensors", "best.safetensors", "last_state.pth", "summary.csv"):
        assert before[name] == after[name], name
    # A kept model without its resumable state (last.* deleted to save space) is refused too, --overwrite or not.
    (out / "last.safetensors").unlink()
    (out / "last_state.pth").unlink()
    kept = {p.name: p.read_bytes() for p in out.iterdir()}
    for extra in ([], ["--overwrite"]):
        assert main(["train", *TINY, "--epochs", "1", "--output", str(out), *extra]) == 2
        assert "already holds a run's model (best.safetensors" in _err_line(capsys)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == kept


@pytest.mark.slow
def test_ddp_two_processes_equal_single_process(tmp_path):
    common = ["--model", "vit_attn_micro", "--data", "digits", "--img-size", "16", "--train-limit", "128",
              "--eval-limit", "64", "--epochs", "2", "--log-interval", "0", "--device", "cpu", "--aug", "none",
              "--smoothing", "0", "--opt", "sgd", "--lr", "0.05", "--weight-decay", "0"]
    # SGD: Adam would turn the float noise of mathematically zero gradients (the key bias) into lr-sized steps.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                        "29533", "-m", "subquad", "train", *common, "-b", "16", "--output", str(tmp_path / "ddp")],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert main(["train", *common, "-b", "32", "--output", str(tmp_path / "one")]) == 0
    a, b = load_file(str(tmp_path / "ddp" / "last.safetensors")), load_file(str(tmp_path / "one" / "last.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)
    rows = [(tmp_path / d / "summary.csv").read_text().splitlines() for d in ("ddp", "one")]
    # Same eval counts: top-1 and top-5 agree exactly (loss up to float summation order).
    for ra, rb in zip(rows[0][1:], rows[1][1:]):
        fa, fb = ra.split(","), rb.split(",")
        assert fa[0] == fb[0] and abs(float(fa[3]) - float(fb[3])) < 1e-6 and abs(float(fa[4]) - float(fb[4])) < 1e-6
        assert abs(float(fa[1]) - float(fb[1])) < 1e-4


def test_fashion_mnist_one_epoch(tmp_path, capsys, fashion_mnist_dir):
    out = tmp_path / "fm"
    assert main(["train", "--model", "vit_attn_micro", "--data", "fashion-mnist", "--img-size", "16", "--train-limit",
                 "128", "--eval-limit", "64", "-b", "32", "--epochs", "1", "--log-interval", "0", "--device", "cpu",
                 "--output", str(out)]) == 0
    import json

    side = json.loads((out / "best.json").read_text())
    assert side["classes"][0] == "T-shirt/top" and side["data_config"]["mean"][0] == pytest.approx(0.2860)


def test_fashion_mnist_absent_is_one_line(tmp_path, capsys, monkeypatch):
    from subquad.data.fashion_mnist import ENV_DIR

    monkeypatch.setenv(ENV_DIR, str(tmp_path))  # an empty folder: no Fashion-MNIST
    assert main(["train", "--model", "vit_attn_micro", "--data", "fashion-mnist", "--img-size", "16", "--epochs", "1",
                 "--device", "cpu", "--output", str(tmp_path / "fm")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "holds none of the Fashion-MNIST files" in err and "apt-get install dataset-fashion-mnist" in err
