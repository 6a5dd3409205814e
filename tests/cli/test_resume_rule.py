"""One config system: every training command's flags come from its config dataclass, and `--resume` refuses, in the
same one line, a typed setting that would change the run (a recipe's too) while RESUME_FREE's may change."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from subquad.engine.runfiles import write_args
from subquad.errors import UserError
from subquad_cli.__main__ import main
from subquad_cli.runconfig import RESUME_FREE, LMConfig, LRAConfig, TrainConfig


def _parser():
    from subquad_cli import detect, lm, lra, segment, train

    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    for mod in (train, lra, lm, detect, segment):
        mod.add_parser(sub)
    return p


# The flags `lra train` / `lm train` had before their parsers were generated (outside scripts use them).
LRA_FLAGS = ["--task", "--data", "--attention", "--grid", "-c", "--attn-opt", "--window-size", "--rank", "--amp",
             "--overwrite", "--max-steps", "--steps", "--warmup", "--eval-every", "--eval-steps", "--batch-size",
             "--lr", "--weight-decay", "--encoding", "--max-len", "--vocab-size", "--dim", "--depth", "--num-heads",
             "--mlp-dim", "--pool", "--drop", "--attn-drop", "--train-limit", "--limit-train", "--eval-limit",
             "--limit-eval", "--seed", "--checkpoint-every", "--device", "--workers", "--output", "--resume"]
LM_FLAGS = ["--data", "--resume", "--attention", "-c", "--attn-opt", "--amp", "--amp-dtype", "--overwrite", "--dim",
            "--depth", "--num-heads", "--ffn-dim", "--dropout", "--emb-dropout", "--residual", "--seq-len",
            "--batch-size", "--lr", "--warmup", "--weight-decay", "--clip-grad", "--max-steps", "--max-minutes",
            "--eval-every", "--eval-ctx", "--eval-score", "--eval-batch", "--eval-tokens", "--final-eval-tokens",
            "--seed", "--checkpoint-every", "--device", "--output"]


def _options(p: argparse.ArgumentParser, *path: str) -> set[str]:
    for name in path:
        p = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return {s for a in p._actions for s in a.option_strings}


def test_every_field_is_a_flag_and_the_old_flags_stay():
    p = _parser()
    lra, lm = _options(p, "lra", "train"), _options(p, "lm", "train")
    assert set(LRA_FLAGS) <= lra and set(LM_FLAGS) <= lm
    for cls, opts in ((LRAConfig, lra), (LMConfig, lm), (TrainConfig, _options(p, "train"))):
        for f in dataclasses.fields(cls):
            # A recipe-only field has no flag of its own (attn_kw, phases; --resume DIR and --grid H,W are set
            # by hand); every other field has its flag.
            own = "--" + f.name.replace("_", "-")
            if f.metadata["cli"]:
                assert (f.metadata["flag"] or own) in opts and own in opts, (cls.__name__, f.name)
            elif f.name not in ("resume", "grid"):
                assert own not in opts, (cls.__name__, f.name)
    # Types and the old spellings: --limit-train is the hidden alias of --train-limit.
    a = p.parse_args(["lra", "train", "--limit-train", "7", "--lr", "1e-3", "--amp"])
    assert (a.limit_train, a.lr, a.amp) == (7, 1e-3, True)


def _lra_run(tmp_path, **kw):
    run = tmp_path / "lra"
    run.mkdir()
    write_args(run, LRAConfig(data="d", dim=16, seed=5, output=str(run), attn_kw={"softmax": {}}, **kw))
    return run


def test_lra_resume_refuses_a_change_and_allows_the_free_flags(tmp_path):
    from subquad_cli.lra import resolve_config

    run = _lra_run(tmp_path)
    p = _parser()
    for flags, shown in ((["--lr", "0.5"], "--lr 0.5 (the run has 0.0001)"),
                         (["--task", "text", "--dim", "16", "--amp"], "--task 'text' (the run has 'listops'), --amp "
                          "True (the run has False)"),
                         (["--attn-opt", "rank=2"],
                          "--attn-opt {'softmax': {'rank': 2}} (the run has {'softmax': {}})"),
                         (["--grid", "4,4"], "--grid [4, 4] (the run has None)")):
        with pytest.raises(UserError) as e:
            resolve_config(p.parse_args(["lra", "train", "--resume", str(run), *flags]))
        assert str(e.value) == (f"--resume {run} continues the run with its own settings (args.yaml); drop {shown}; "
                                "only --device, --workers and --checkpoint-every may change"), str(e.value)
    # The run's own values and the free flags are accepted; the config is the run's.
    cfg = resolve_config(p.parse_args(["lra", "train", "--resume", str(run), "--task", "listops", "--dim", "16",
                                       "--device", "cpu", "--workers", "2", "--checkpoint-every", "3"]))
    assert (cfg.resume, cfg.output, cfg.dim, cfg.seed, cfg.device, cfg.workers, cfg.checkpoint_every) == (
        True, str(run), 16, 5, "cpu", 2, 3)


def test_lm_resume_same_rule_and_a_recipe_is_checked_too(tmp_path):
    from subquad_cli.lm import resolve_config

    run = tmp_path / "lm"
    run.mkdir()
    write_args(run, LMConfig(data="d", attention="softmax", dim=16, output=str(run)))
    p = _parser()
    recipe = tmp_path / "r.yaml"
    recipe.write_text("dim: 32\n")
    for flags, shown in ((["--attention", "long_short"], "--attention 'long_short' (the run has 'softmax')"),
                         (["-c", str(recipe)], "--dim 32 (the run has 16)"),
                         (["--amp-dtype", "float16"], "--amp-dtype 'float16' (the run has 'bfloat16')")):
        with pytest.raises(UserError, match="only --device, --checkpoint-every and --max-minutes may change") as e:
            resolve_config(p.parse_args(["lm", "train", "--resume", str(run), *flags]))
        assert f"drop {shown};" in str(e.value), str(e.value)
    cfg = resolve_config(p.parse_args(["lm", "train", "--resume", str(run), "--max-minutes", "5", "--device", "cpu"]))
    assert (cfg.attention, cfg.dim, cfg.max_minutes, cfg.resume) == ("softmax", 16, 5.0, True)


@pytest.mark.parametrize("task", ["detect", "segment"])
def test_dense_resume_refuses_a_change_and_records_an_extension(tmp_path, task, capsys):
    from subquad_cli.denseconfig import DenseConfig, resolve_dense_config

    run = tmp_path / task
    run.mkdir()
    write_args(run, DenseConfig(model="l2vit_micro", epochs=1, lr=1e-4, output=str(run)))
    p = _parser()
    # The dense trainer rewrites args.yaml on resume: a changed flag is refused before it could be recorded there.
    assert main([task, "train", "--resume", str(run), "--lr", "0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith(f"--resume {run} continues the run with its own settings (args.yaml); drop --lr 0.5 (the run "
                        "has 0.0001); only --device, --workers, --checkpoint-every, --log-interval, --dry-run, "
                        "--epochs and --max-iters may change"), err
    assert "lr: 0.0001" in (run / "args.yaml").read_text()
    cfg = resolve_dense_config(p.parse_args([task, "train", "--resume", str(run), "--epochs", "3"]), task)
    assert (cfg.epochs, cfg.lr, cfg.resume) == (3, 1e-4, str(run))


def test_train_resume_checks_a_recipe_like_a_flag(tmp_path):
    from subquad_cli.config import resolve_config

    run = tmp_path / "tr"
    run.mkdir()
    write_args(run, TrainConfig(model="vit_attn_micro", epochs=1, output=str(run)))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("lr: 0.5\n")
    with pytest.raises(UserError, match=r"drop --lr 0.5 \(the run has 0.002\); only --device, --workers, "):
        resolve_config(_parser().parse_args(["train", "--resume", str(run), "-c", str(recipe)]))
    recipe.write_text("lr: 0.002\nmodel: vit_attn_micro\n")
    assert resolve_config(_parser().parse_args(["train", "--resume", str(run), "-c", str(recipe)])).lr == 0.002


def test_resume_free_is_one_list_and_names_no_setting_of_the_numbers():
    # What may change on --resume computes nothing differently (the engine checks the same list).
    assert set(RESUME_FREE) == {"device", "workers", "pin_mem", "checkpoint_every", "log_interval", "max_minutes",
                                "dry_run", "resume"}


def test_sequence_module_reexports_the_split_trainers():
    from subquad.engine import lm, lra, sequence

    assert sequence.train_lra is lra.train_lra and sequence.train_lm is lm.train_lm
    assert sequence.LRAConfig is LRAConfig and lra.LRAConfig is LRAConfig and lm.LMConfig is LMConfig
