"""`subquad detect` / `subquad segment`: train, eval (results.json keys and ranges), predict, resume, refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from subquad.dense.synthetic import generate_synthetic
from subquad_cli.__main__ import main

# Tiny heads and images, two iterations: the conventions, not the accuracy (the README's demo runs show that).
DETECT = ["--fpn-channels", "16", "--representation-size", "32", "--mask-head-channels", "16", "--rpn-proposals", "32",
          "--box-batch-size-per-image", "16", "--rpn-batch-size-per-image", "16", "--min-size", "48", "--max-size",
          "64", "-b", "2", "--log-interval", "0"]
SEGMENT = ["--head-channels", "16", "--fpn-channels", "16", "--scale", "40", "56", "--crop-size", "32", "32", "-b", "2",
           "--log-interval", "0"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = generate_synthetic(tmp_path_factory.mktemp("synth"), seed=1, n_train=4, n_val=2, size=(40, 56), min_r=5,
                              max_r=10)
    return f"synthetic:{root}"


def _check_results(path, keys):
    r = json.loads(path.read_text())
    assert set(r) == set(keys)
    assert all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in r.values()), r


@pytest.mark.parametrize("task,kind,flags,keys", [
    ("detect", "maskrcnn", DETECT, ("bbox_mAP", "bbox_mAP50", "segm_mAP", "segm_mAP50")),
    ("segment", "semantic_fpn", SEGMENT, ("mIoU", "aAcc")),
])
def test_train_eval_predict_resume(tmp_path, data, capsys, task, kind, flags, keys):
    run = tmp_path / "run"
    args = [task, "train", "--data", data, "--model", "l2vit_micro", "--kind", kind, "--epochs", "2", *flags]
    assert main([*args, "--output", str(run)]) == 0
    for f in ("args.yaml", "summary.csv", "last.safetensors", "last.json", "best.safetensors", "best.json",
              "last_state.pth"):
        assert (run / f).is_file(), f
    assert json.loads((run / "last.json").read_text())["epoch"] == 1
    # The run directory is never overwritten; --resume of a finished run trains nothing more.
    assert main([*args, "--output", str(run)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main([task, "train", "--resume", str(run)]) == 0
    res = tmp_path / "metrics.json"
    assert main([task, "eval", "--checkpoint", str(run), "--results-file", str(res)]) == 0
    _check_results(res, keys)
    _check_results(run / "results.json", keys)
    # --results-file never replaces the weights or an unrelated file, and an earlier result only with --overwrite.
    (tmp_path / "notes.json").write_text('{"mine": 1}')
    assert main([task, "eval", "--checkpoint", str(run), "--results-file", str(tmp_path / "notes.json")]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert main([task, "eval", "--checkpoint", str(run), "--results-file", str(tmp_path / "notes.json"),
                 "--overwrite"]) == 2
    assert "is not an earlier --results-file" in capsys.readouterr().err
    assert main([task, "eval", "--checkpoint", str(run), "--results-file", str(res), "--overwrite"]) == 0
    _check_results(res, keys)
    # The run's results.json keeps an earlier, different result (e.g. of another --limit): the new one is numbered;
    # the same result again changes nothing; --overwrite replaces it. A negative --limit is refused.
    earlier = json.dumps({k: 0.123456 for k in keys})
    (run / "results.json").write_text(earlier)
    capsys.readouterr()
    assert main([task, "eval", "--checkpoint", str(run)]) == 0
    assert (run / "results.json").read_text() == earlier and "kept as it is" in capsys.readouterr().out
    _check_results(run / "results-2.json", keys)
    assert main([task, "eval", "--checkpoint", str(run)]) == 0
    assert "unchanged" in capsys.readouterr().out and not (run / "results-3.json").exists()
    assert main([task, "eval", "--checkpoint", str(run), "--overwrite"]) == 0
    assert (run / "results.json").read_text() != earlier
    _check_results(run / "results.json", keys)
    assert main([task, "eval", "--checkpoint", str(run), "--limit", "-1"]) == 2
    assert "--limit >= 0" in capsys.readouterr().err
    assert main([task, "train", "--data", data, "--model", "l2vit_micro", "--kind", kind, "--train-limit", "-2",
                 "--output", str(tmp_path / "neg")]) == 2
    assert "--train-limit must be >= 0, got -2" in capsys.readouterr().err and not (tmp_path / "neg").exists()
    img = tmp_path / "img.png"
    Image.fromarray((np.random.default_rng(0).random((40, 56, 3)) * 255).astype(np.uint8)).save(img)
    assert main([task, "predict", "--checkpoint", str(run), str(img), "--out-dir", str(tmp_path / "pred")]) == 0
    assert Image.open(tmp_path / "pred" / "img.pred.png").size == (56, 40)
    if task == "detect":
        assert "detections" in json.loads((tmp_path / "pred" / "img.pred.json").read_text())
    else:
        assert Image.open(tmp_path / "pred" / "img.label.png").size == (56, 40)
    # Issue 34 item 12: a missing image is named (not the output folder); a second predict into the default folder
    # needs --overwrite only for the files it would replace.
    capsys.readouterr()
    assert main([task, "predict", "--checkpoint", str(run), str(tmp_path / "nothere.jpg")]) == 2
    assert f"image not found: {tmp_path / 'nothere.jpg'}" in capsys.readouterr().err
    img2 = tmp_path / "img2.png"
    img2.write_bytes(img.read_bytes())
    assert main([task, "predict", "--checkpoint", str(run), str(img)]) == 0
    assert main([task, "predict", "--checkpoint", str(run), str(img2)]) == 0
    assert (run / "predict" / "img.pred.png").is_file() and (run / "predict" / "img2.pred.png").is_file()
    before = (run / "predict" / "img.pred.png").read_bytes()
    assert main([task, "predict", "--checkpoint", str(run), str(img)]) == 2
    err = capsys.readouterr().err
    assert "already holds img.pred.png (and 1 more)" in err and "--overwrite" in err
    assert (run / "predict" / "img.pred.png").read_bytes() == before
    assert main([task, "predict", "--checkpoint", str(run), str(img), "--overwrite"]) == 0


def test_refusals(tmp_path, data, capsys):
    bad = tmp_path / "coco"
    (bad / "annotations").mkdir(parents=True)
    (bad / "annotations" / "instances_train.json").write_text("{}")
    (bad / "annotations" / "instances_val.json").write_text('{"images": []}')
    assert main(["detect", "train", "--data", f"coco:{bad}", "--output", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "instances_val.json is not COCO instances JSON" in err
    assert main(["segment", "train", "--data", data, "--kind", "maskrcnn", "--output", str(tmp_path / "r")]) == 2
    assert "not a segmenter" in capsys.readouterr().err
    assert main(["detect", "train", "--data", data, "--model", "flatten_deit_micro", "--output",
                 str(tmp_path / "r")]) == 2
    assert "hierarchical" in capsys.readouterr().err
    assert main(["detect", "eval", "--checkpoint", str(tmp_path)]) == 2
    assert "holds no best.safetensors" in capsys.readouterr().err


def test_resume_continues_exactly(tmp_path, data):
    """Two epochs straight and one epoch + --resume give the same weights (seeded order and draws per epoch)."""
    from safetensors.torch import load_file

    # A step schedule without drops: the learning rate of an iteration does not depend on the run's length.
    args = ["segment", "train", "--data", data, "--kind", "semantic_fpn", "--sched", "step", "--lr-steps", "100",
            *SEGMENT]
    assert main([*args, "--epochs", "2", "--output", str(tmp_path / "a")]) == 0
    assert main([*args, "--epochs", "1", "--output", str(tmp_path / "b")]) == 0
    assert main(["segment", "train", "--resume", str(tmp_path / "b"), "--epochs", "2"]) == 0
    a, b = load_file(tmp_path / "a" / "last.safetensors"), load_file(tmp_path / "b" / "last.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert np.allclose(a[k].numpy(), b[k].numpy(), atol=1e-6), k


def _torchrun(args: list[str], tmp_path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "subquad",
           *args]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.parametrize("task,kind,flags,keys", [
    # The detector's run is slow-only: its eval gather is tested in the default suite with an oracle model.
    pytest.param("detect", "fasterrcnn", DETECT, ("bbox_mAP", "bbox_mAP50"), marks=pytest.mark.slow),
    ("segment", "upernet", SEGMENT, ("mIoU", "aAcc")),
])
def test_torchrun_two_ranks(tmp_path, data, task, kind, flags, keys):
    """`torchrun --nproc_per_node 2`: both commands run with two ranks, rank 0 writes the run, and a two-rank eval
    reports what one process reports for the same checkpoint (segmentation sums the ranks' confusion matrices; the
    detection gather, whose untrained mAP here is 0, is tested with an oracle model in test_data_metrics)."""
    run = tmp_path / "run"
    _torchrun([task, "train", "--data", data, "--model", "l2vit_micro", "--kind", kind, "--epochs", "1", *flags,
               "--output", str(run)], tmp_path)
    assert json.loads((run / "last.json").read_text())["epoch"] == 0
    assert sorted(p.name for p in run.iterdir() if p.name.startswith("last")) == \
        ["last.json", "last.safetensors", "last_state.pth"]
    _torchrun([task, "eval", "--checkpoint", str(run), "--results-file", str(tmp_path / "two.json")], tmp_path)
    assert main([task, "eval", "--checkpoint", str(run), "--results-file", str(tmp_path / "one.json")]) == 0
    two, one = (json.loads((tmp_path / f).read_text()) for f in ("two.json", "one.json"))
    assert set(one) == set(keys) and two == one
