from __future__ import annotations

import csv
import dataclasses

import pytest
import torch
from safetensors.torch import load_file

from subquad.engine.checkpoint import load_state
from subquad.engine.classify import train
from subquad_cli.runconfig import TrainConfig


class _Interrupt(Exception):
    pass


def _cfg(out, **kw):
    # Light augmentation, drop path, mixup/cutmix and EMA: every source of randomness the resume must reproduce.
    return TrainConfig(model="vit_attn_micro", data="digits", img_size=16, batch_size=32, epochs=3, lr=2e-3,
                       warmup_epochs=1, aug="light", drop_path=0.1, mixup=0.4, cutmix=0.4, model_ema=True,
                       model_ema_decay=0.9, train_limit=128, eval_limit=32, log_interval=0, output=str(out),
                       device="cpu", **kw)


def _rows(path):
    with open(path) as f:
        return [{k: v for k, v in r.items() if k != "time"} for r in csv.DictReader(f)]


def test_resume_after_interruption_equals_uninterrupted_run(tmp_path):
    full = tmp_path / "full"
    r_full = train(_cfg(full))

    part = tmp_path / "part"

    def stop(epoch, row):
        if epoch == 0:
            raise _Interrupt

    with pytest.raises(_Interrupt):
        train(_cfg(part), on_epoch_end=stop)
    assert load_state(part / "last_state.pth")["epoch"] == 0
    r_res = train(dataclasses.replace(_cfg(part), output="", resume=str(part)))

    for name in ("last.safetensors", "last_ema.safetensors", "best.safetensors"):
        a, b = load_file(str(full / name)), load_file(str(part / name))
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), f"{name}:{k}"
    assert _rows(full / "summary.csv") == _rows(part / "summary.csv")
    assert len(_rows(part / "summary.csv")) == 3
    for k in ("eval_top1", "eval_top5", "eval_loss", "best_top1"):
        assert r_full[k] == r_res[k], k
    sa, sb = load_state(full / "last_state.pth"), load_state(part / "last_state.pth")
    assert sa["num_updates"] == sb["num_updates"] == 3 * 4
    for k, v in sa["optimizer"]["state"].items():
        assert torch.equal(v["exp_avg"], sb["optimizer"]["state"][k]["exp_avg"])
