"""Model selection on validation only, the final test report, `--aug auto`, and resume/extension semantics."""

from __future__ import annotations

import csv
import dataclasses
import json
import logging

import numpy as np
import pytest
from PIL import Image

from subquad.data import registry
from subquad.data.registry import ImageSource, open_source, resolve_aug
from subquad.data.small import digits_arrays, holdout_split
from subquad.engine.checkpoint import load_state
from subquad.engine.classify import train
from subquad.errors import UserError
from subquad_cli.runconfig import TrainConfig


def _cfg(out, **kw):
    base = dict(model="vit_attn_micro", data="digits", img_size=16, batch_size=32, epochs=2, lr=2e-3,
                warmup_epochs=0, train_limit=128, eval_limit=32, log_interval=0, output=str(out), device="cpu")
    return TrainConfig(**{**base, **kw})


def test_digits_val_is_fixed_and_disjoint_from_train_and_test():
    a, b = digits_arrays(), digits_arrays()
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(a[split][0], b[split][0])
    # The test part is the same 20 % as before the val split existed; val + train = the old training part.
    assert len(a["test"][1]) == 364 and len(a["train"][1]) + len(a["val"][1]) == len(a["train_full"][1]) == 1433
    rows = {s: {img.tobytes() for img in a[s][0]} for s in ("train", "val", "test")}
    assert not rows["train"] & rows["val"] and not rows["val"] & rows["test"]
    assert set(np.unique(a["val"][1])) == set(range(10))
    src = open_source("digits")
    assert (src.train_split, src.val_split, src.test_split) == ("train", "val", "test")


def test_holdout_split_per_class():
    labels = np.array([0] * 10 + [1] * 20 + [2] * 3)
    keep, held = holdout_split(labels, 0.2, seed=0)
    assert sorted(np.concatenate([keep, held]).tolist()) == list(range(33))
    assert [int((labels[held] == c).sum()) for c in range(3)] == [2, 4, 1]
    with pytest.raises(ValueError, match="fraction"):
        holdout_split(labels, 1.0)


def test_test_split_never_read_before_the_last_epoch(tmp_path, monkeypatch):
    events: list[str] = []
    real = ImageSource.dataset

    def spy(self, split, limit=0, seed=0):
        events.append(f"read:{split}")
        return real(self, split, limit, seed)

    monkeypatch.setattr(ImageSource, "dataset", spy)
    r = train(_cfg(tmp_path / "run", epochs=3), on_epoch_end=lambda e, row: events.append(f"epoch:{e}"))
    last_epoch = events.index("epoch:2")
    assert "read:test" in events and events.index("read:test") > last_epoch, events
    assert events.count("read:test") == 1
    assert all(e != "read:test" for e in events[:last_epoch])
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    assert res["split"] == "test" and res["selected_on"] == "val" and res["images"] == 364
    assert res["top1"] == pytest.approx(r["report_top1"]) and 1 <= res["best_epoch"] <= 3
    # The report is the selected (best-on-val) checkpoint, whatever the last epoch scored.
    best = json.loads((tmp_path / "run" / "best.json").read_text())
    assert best["epoch"] == res["best_epoch"] and best["metrics"]["eval_top1"] == pytest.approx(res["best_val_top1"])


def test_final_line_names_the_split(tmp_path, capsys):
    from subquad_cli.__main__ import main

    root = tmp_path / "folder"
    rng = np.random.RandomState(0)
    for split, n in (("train", 8), ("val", 4)):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.randint(0, 255, (12, 12, 3), dtype=np.uint8)).save(root / split / c / f"{i}.png")
    assert main(["train", "--model", "vit_attn_micro", "--data", f"imagefolder:{root}", "--img-size", "16", "-b", "4",
                 "--epochs", "1", "--log-interval", "0", "--device", "cpu", "--output", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("val accuracy:") and "selected on val" in out
    assert json.loads((tmp_path / "r" / "results.json").read_text())["split"] == "val"


@pytest.mark.parametrize("side,per_class,want", [(32, 50, "light"), (28, 5500, "light"), (224, 50, "light"),
                                                  (224, 1300, "timm"), (64, 200, "timm")])
def test_aug_auto_picks_by_image_and_set_size(side, per_class, want):
    src = ImageSource("imagefolder:x", [str(i) for i in range(10)], {}, aug="auto", native_size=None)
    assert resolve_aug(src, side, 10 * per_class)[0] == want
    assert resolve_aug(src, side, 10 * per_class, "none") == ("none", "set by --aug")


def test_aug_auto_fixed_sources_and_startup_line(tmp_path, caplog):
    assert resolve_aug(open_source("digits"), 32, 10_000)[0] == "none"  # a flipped digit is another digit
    with caplog.at_level(logging.INFO, logger="subquad"):
        train(_cfg(tmp_path / "run", epochs=1, data="digits"))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("augmentation:")]
    assert len(lines) == 1 and "--aug" in lines[0] and lines[0].startswith("augmentation: none")
    with pytest.raises(UserError, match="allowed"):
        resolve_aug(open_source("digits"), 32, 100, "strong")


def test_light_preset_has_no_resized_crop_zoom():
    tf = registry.build_transform(ImageSource("x", ["a"], {}, aug="auto", native_size=None), 32, True, aug="light")
    names = [type(t).__name__ for t in tf.transforms]
    assert "RandomCrop" in names and "RandomResizedCrop" not in names and "RandomHorizontalFlip" in names


def _summary_epochs(run):
    with open(run / "summary.csv") as f:
        return [int(r["epoch"]) for r in csv.DictReader(f)]


def test_epochs_count_from_one_everywhere(tmp_path, capsys):
    run = tmp_path / "run"
    train(_cfg(run, epochs=2))
    assert _summary_epochs(run) == [1, 2]
    assert json.loads((run / "last.json").read_text())["epoch"] == 2


def test_resume_of_a_finished_run_says_complete(tmp_path, capsys):
    from subquad_cli.__main__ import main

    run = tmp_path / "run"
    train(_cfg(run, epochs=1))
    before = (run / "last.safetensors").read_bytes()
    assert main(["train", "--resume", str(run)]) == 0
    out = capsys.readouterr().out
    assert "is complete" in out and "--epochs N" in out and "N > 1" in out
    assert (run / "last.safetensors").read_bytes() == before


@pytest.mark.parametrize("mode", ["restart", "continue"])
def test_resume_extends_the_schedule(tmp_path, caplog, mode):
    run = tmp_path / "run"
    train(_cfg(run, epochs=2, min_lr=1e-6))
    lrs = []
    with caplog.at_level(logging.INFO, logger="subquad"):
        train(dataclasses.replace(_cfg(run, epochs=4, min_lr=1e-6, resume_schedule=mode), output="",
                                  resume=str(run)), on_epoch_end=lambda e, row: lrs.append(row["lr"]))
    assert _summary_epochs(run) == [1, 2, 3, 4]
    note = [r.getMessage() for r in caplog.records if r.getMessage().startswith("extending")]
    assert len(note) == 1 and f"--resume-schedule {mode}" in note[0]
    if mode == "restart":
        # A new cosine over epochs 3-4 from the peak lr: after epoch 3 the lr is near the middle of that cosine.
        assert 1e-4 < lrs[0] < 2e-3 and lrs[1] < lrs[0]
        assert load_state(run / "last_state.pth")["schedule"] == {"start": 2, "end": 4, "update0": 8}
    else:
        assert lrs == [pytest.approx(1e-6)] * 2
    with pytest.raises(UserError, match="already trained 4 epochs"):
        train(dataclasses.replace(_cfg(run, epochs=3), output="", resume=str(run)))
