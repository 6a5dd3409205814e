from __future__ import annotations

import json
import pickle

import pytest

from subquad.cli.__main__ import main
from subquad.data.small import save_digits_image


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("evalrun") / "run"
    assert main(["train", "--model", "vit_attn_micro", "--data", "digits", "--img-size", "16", "--train-limit", "128",
                 "--eval-limit", "64", "-b", "32", "--epochs", "1", "--log-interval", "0", "--device", "cpu",
                 "--output", str(out)]) == 0
    return out


def _err_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("subquad")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_eval_prints_and_writes_json(run_dir, tmp_path, capsys):
    res = tmp_path / "res.json"
    assert main(["eval", "--model", "vit_attn_micro", "--checkpoint", str(run_dir / "best.safetensors"),
                 "--data", "digits", "--limit", "100", "--results-file", str(res), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "top-1" in out and "top-5" in out and "loss" in out
    row = json.loads(res.read_text())
    assert row["images"] == 100 and 0 <= row["top1"] <= row["top5"] <= 100 and row["img_size"] == 16
    assert row["model"] == "vit_attn_micro" and row["loss"] > 0


def test_eval_matches_training_metrics(run_dir, capsys):
    side = json.loads((run_dir / "best.json").read_text())
    res = run_dir / "check.json"
    # Training selected on the val split; its metrics are reproduced there.
    assert main(["eval", "--model", "vit_attn_micro", "--checkpoint", str(run_dir / "best.safetensors"),
                 "--limit", "64", "--split", "val", "--results-file", str(res), "--device", "cpu"]) == 0
    assert json.loads(res.read_text())["top1"] == pytest.approx(side["metrics"]["eval_top1"], abs=1e-3)
    # The test split, read once at the end of training, gives the run's results.json.
    res_test = run_dir / "check_test.json"
    assert main(["eval", "--model", "vit_attn_micro", "--checkpoint", str(run_dir / "best.safetensors"),
                 "--results-file", str(res_test), "--device", "cpu"]) == 0
    final = json.loads((run_dir / "results.json").read_text())
    assert final["split"] == "test"
    assert json.loads(res_test.read_text())["top1"] == pytest.approx(final["top1"], abs=1e-3)


def test_predict_top5_with_class_names(run_dir, tmp_path, capsys):
    img = tmp_path / "d.png"
    save_digits_image(img, 3)
    assert main(["predict", "--model", "vit_attn_micro", "--checkpoint", str(run_dir / "best.safetensors"), str(img),
                 str(img), "--device", "cpu", "--json", str(tmp_path / "p.json")]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(str(img))]
    assert len(lines) == 2 and lines[0].count("%)") == 5
    top = json.loads((tmp_path / "p.json").read_text())[0]["top"]
    assert len(top) == 5 and all(t["class"] in [str(i) for i in range(10)] for t in top)
    assert abs(sum(t["prob"] for t in top) - 1) < 1 and top[0]["prob"] >= top[-1]["prob"]


def test_checkpoint_of_another_model_refused(run_dir, tmp_path, capsys):
    assert main(["eval", "--model", "vit_attn_tiny", "--checkpoint", str(run_dir / "best.safetensors"),
                 "--device", "cpu"]) == 2
    assert "holds model 'vit_attn_micro'" in _err_line(capsys)
    # Without the sidecar the weights themselves are checked.
    bare = tmp_path / "bare.safetensors"
    bare.write_bytes((run_dir / "best.safetensors").read_bytes())
    assert main(["eval", "--model", "flatten_deit_micro", "--checkpoint", str(bare), "--data", "digits",
                 "--device", "cpu"]) == 2
    assert "does not fit model" in _err_line(capsys)


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, ("touch EVIL_MARKER",))


@pytest.mark.parametrize("cmd", ["eval", "predict"])
def test_malicious_pickle_refused_nothing_run(tmp_path, monkeypatch, capsys, cmd):
    monkeypatch.chdir(tmp_path)
    evil = tmp_path / "evil.pth"
    with open(evil, "wb") as f:
        pickle.dump({"state_dict": _Evil()}, f)
    img = tmp_path / "d.png"
    save_digits_image(img, 0)
    extra = ["--data", "digits"] if cmd == "eval" else [str(img)]
    assert main([cmd, "--model", "vit_attn_micro", "--checkpoint", str(evil), *extra, "--device", "cpu"]) == 2
    assert "refusing to load" in _err_line(capsys)
    assert not (tmp_path / "EVIL_MARKER").exists()


def test_predict_bad_images(run_dir, tmp_path, capsys):
    ck = str(run_dir / "best.safetensors")
    assert main(["predict", "--model", "vit_attn_micro", "--checkpoint", ck, str(tmp_path / "none.png")]) == 2
    assert "image not found" in _err_line(capsys)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"nope")
    assert main(["predict", "--model", "vit_attn_micro", "--checkpoint", ck, str(bad), "--device", "cpu"]) == 2
    assert "cannot read image" in _err_line(capsys)
