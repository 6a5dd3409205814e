"""Character-LM trainer: phases run in order, and a run interrupted and resumed equals an uninterrupted one."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from safetensors.torch import load_file

from subquad.engine.checkpoint import load_state
from subquad.engine.sequence import LM_TIMING_FIELDS, LMConfig, _phase_lr, lm_phases, train_lm
from subquad.errors import UserError


class _Interrupt(Exception):
    pass




def _cfg(data, out, **kw):
    # Dropout on, two phases with different lengths and batches, evaluation every 2 steps: 7 steps in all.
    args = dict(data=str(data), attention="long_short", dim=16, depth=2, num_heads=2, ffn_dim=24, dropout=0.2,
                emb_dropout=0.1, residual="official", weight_decay=0.01, lr=3e-3, warmup=2, max_steps=0,
                phases=[{"seq_len": 16, "batch_size": 3, "steps": 4},
                        {"seq_len": 32, "batch_size": 2, "steps": 3, "lr": 1.5e-3, "warmup": 1,
                         "reset_optimizer": True}],
                eval_every=2, eval_ctx=32, eval_score=16, eval_batch=4, eval_tokens=96, final_eval_tokens=96,
                seed=3, device="cpu", output=str(out),
                attn_kw={"long_short": {"window_size": 8, "chunk_size": 4, "rank": 1}})
    args.update(kw)
    return LMConfig(**args)


def _rows(path):
    with open(path, newline="") as f:
        return [{k: v for k, v in r.items() if k not in LM_TIMING_FIELDS} for r in csv.DictReader(f)]


def _results(path):
    r = json.loads(path.read_text())
    return {k: v for k, v in r.items() if k not in LM_TIMING_FIELDS + ("output", "checkpoint")}


def test_phases_fill_defaults_and_schedule():
    cfg = LMConfig(lr=2e-3, warmup=4, max_steps=0, phases=[{"seq_len": 8, "batch_size": 2, "steps": 5},
                                                           {"seq_len": 16, "batch_size": 1, "steps": 3,
                                                            "lr": 1e-3, "warmup": 2}])
    ph = lm_phases(cfg)
    assert [(p["seq_len"], p["batch_size"], p["lr"], p["warmup"], p["first"], p["last"], p["reset_optimizer"])
            for p in ph] == [(8, 2, 2e-3, 4, 1, 5, False), (16, 1, 1e-3, 2, 6, 8, False)]
    lrs = [_phase_lr(ph, s) for s in range(1, 9)]
    assert lrs == [(0, 5e-4), (0, 1e-3), (0, 1.5e-3), (0, 2e-3), (0, 2e-3), (1, 5e-4), (1, 1e-3), (1, 1e-3)]
    # max_steps caps the total (quick runs of a phased recipe).
    capped = lm_phases(LMConfig(max_steps=6, phases=cfg.phases))
    assert [(p["first"], p["last"]) for p in capped] == [(1, 5), (6, 6)]
    # No phases: one phase of the top-level values.
    assert [(p["seq_len"], p["steps"]) for p in lm_phases(LMConfig(seq_len=12, max_steps=9))] == [(12, 9)]
    with pytest.raises(UserError, match=r"phases\[0\].*unknown key\(s\) \['len'\]"):
        lm_phases(LMConfig(phases=[{"len": 8, "batch_size": 2, "steps": 5}]))
    with pytest.raises(UserError, match="phase 1: need seq_len >= 2"):
        lm_phases(LMConfig(phases=[{"seq_len": 8, "batch_size": 2, "steps": 5},
                                   {"seq_len": 1, "batch_size": 2, "steps": 5}]))


def test_phased_run_trains_each_phase_at_its_length(corpus, tmp_path):
    seen = []

    class Spy(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            if self.training:
                seen.append(tuple(x.shape))
            return self.inner(x)

    from subquad.engine.sequence import build_lm

    r = train_lm(_cfg(corpus, tmp_path / "run"), log=lambda s: None, model_fn=lambda v, c: Spy(build_lm(v, c)))
    assert seen == [(3, 16)] * 4 + [(2, 32)] * 3
    assert r["steps"] == 7 and r["train_tokens"] == 4 * 3 * 16 + 3 * 2 * 32
    rows = list(csv.DictReader((tmp_path / "run" / "summary.csv").open()))
    assert [(int(x["step"]), int(x["phase"]), int(x["seq_len"])) for x in rows] == [(2, 1, 16), (4, 1, 16),
                                                                                    (6, 2, 32), (7, 2, 32)]
    assert float(rows[2]["lr"]) == 1.5e-3  # phase 2, local step 2 after its 1 warm-up step
    # Phase 2 starts a fresh AdamW: its step count is that phase's 3 steps, not 7.
    opt = load_state(tmp_path / "run" / "last_state.pth")["optimizer"]
    assert {int(v["step"]) for v in opt["state"].values()} == {3}


def test_interrupted_and_resumed_run_equals_uninterrupted(corpus, tmp_path):
    full = tmp_path / "full"
    train_lm(_cfg(corpus, full), log=lambda s: None)

    part = tmp_path / "part"

    def stop(row):
        if row["step"] == 4:  # killed after the evaluation at step 4, inside the training of steps 5-6
            raise _Interrupt

    with pytest.raises(_Interrupt):
        train_lm(_cfg(corpus, part), log=lambda s: None, on_eval=stop)
    assert int(load_state(part / "last_state.pth")["step"]) == 4 and not (part / "results.json").exists()
    # A new run into the folder is refused; resume continues it.
    with pytest.raises(UserError, match="already holds a run"):
        train_lm(_cfg(corpus, part), log=lambda s: None)
    with pytest.raises(UserError, match="other settings.*dropout"):
        train_lm(_cfg(corpus, part, resume=True, dropout=0.1), log=lambda s: None)
    train_lm(_cfg(corpus, part, resume=True), log=lambda s: None)
    for name in ("last.safetensors", "best.safetensors"):
        wa, wb = load_file(full / name), load_file(part / name)
        assert wa.keys() == wb.keys() and len(wa) > 10
        for key in wa:
            assert torch.equal(wa[key], wb[key]), f"{name}: {key} differs"
    sa, sb = load_state(full / "last_state.pth"), load_state(part / "last_state.pth")
    for key in sa["model"]:
        assert torch.equal(sa["model"][key], sb["model"][key]), key
    assert _rows(full / "summary.csv") == _rows(part / "summary.csv")
    assert _results(full / "results.json") == _results(part / "results.json")
    # Resuming a finished run returns its results.
    again = train_lm(_cfg(corpus, part, resume=True), log=lambda s: None)
    assert again["test_bpc"] == json.loads((part / "results.json").read_text())["test_bpc"]
