"""Mistakes a new user makes (issue 34): each one gets one line and exit status 2 (or a clear exception in Python),
and nothing the user made is lost."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
import torch

from subquad_cli.__main__ import build_parser, main


def _err_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("subquad")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ----- item 1: --device a machine lacks -----

def _device_commands() -> list[list[str]]:
    """argv of every (sub)command that takes --device, with a placeholder for each required argument (the device is
    checked before a command runs, so the placeholders are never read)."""
    out = []

    def walk(prefix, p):
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if any("--device" in a.option_strings for a in p._actions):
            argv = list(prefix)
            for a in p._actions:
                if a.option_strings and a.required:
                    argv += [a.option_strings[-1], "x"]
                elif not a.option_strings and not isinstance(a, argparse._SubParsersAction) and a.nargs != "?":
                    argv.append("x")
            out.append(argv)
        for a in subs:
            for name, sp in a.choices.items():
                walk([*prefix, name], sp)

    walk([], build_parser())
    return out


def test_every_device_command_is_covered():
    names = {" ".join(w for w in a if w.isidentifier() and w != "x") for a in _device_commands()}
    assert {"train", "eval", "predict", "bench model", "bench attention", "analyze", "lm train", "lm eval",
            "lm generate", "lra train", "detect eval", "detect predict", "segment eval", "segment predict",
            "arena run"} <= names, names


@pytest.mark.parametrize("argv", _device_commands(), ids=lambda a: " ".join(x for x in a if x != "x"))
def test_device_without_cuda_is_one_line(argv, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main([*argv, "--device", "cuda"]) == 2
    assert "no CUDA device here; use --device cpu" in _err_line(capsys)
    assert main([*argv, "--device", "gpu"]) == 2
    assert "--device 'gpu' is not a device; use cpu, cuda" in _err_line(capsys)


def test_device_checked_by_the_real_command(tmp_path):
    """This machine's own CUDA answer, no monkeypatch: `--device cuda` without a GPU (on a machine with one, an index
    it does not have)."""
    missing = "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"
    r = subprocess.run([sys.executable, "-m", "subquad", "eval", "--checkpoint", str(tmp_path / "none"), "--device",
                        missing], capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith(f"subquad eval: error: --device {missing}: ") and "CUDA device" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_device_in_a_recipe_is_checked_too(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    y = tmp_path / "r.yaml"
    y.write_text("model: vit_attn_micro\ndevice: cuda\n")
    assert main(["train", "-c", str(y), "--img-size", "16", "--train-limit", "32", "--dry-run"]) == 2
    assert "no CUDA device here" in _err_line(capsys)


# ----- item 2: a file that is not a readable checkpoint -----

def _saved_state_dict(path):
    torch.save({"w": torch.randn(64, 64), "b": torch.randn(64)}, path)
    return path.read_bytes()


@pytest.mark.parametrize("cut", ["junk", "head", "half", "tail"])
def test_unreadable_checkpoint_names_the_file(tmp_path, capsys, cut):
    import subquad
    from subquad.engine.checkpoint import load_state

    data = _saved_state_dict(tmp_path / "full.pth")
    bad = tmp_path / "bad.pth"
    # Binary junk: plain text is no checkpoint file at all, and said so (test_eval_predict.py).
    bad.write_bytes({"junk": b"\x00junk", "head": data[:100], "half": data[: len(data) // 2], "tail": data[:-10]}[cut])
    assert main(["eval", "--checkpoint", str(bad), "--model", "vit_attn_micro", "--data", "digits"]) == 2
    line = _err_line(capsys)
    assert f"{bad} is not a readable checkpoint (truncated or corrupt" in line, line
    for call in (lambda: subquad.create_model("vit_attn_micro", pretrained=True,
                                              pretrained_cfg_overlay=dict(file=str(bad))),
                 lambda: load_state(bad)):
        with pytest.raises(subquad.UserError, match="is not a readable") as e:
            call()
        assert str(bad) in str(e.value) and "\n" not in str(e.value)


def test_unreadable_safetensors_names_the_file(tmp_path, capsys):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"junk")
    assert main(["eval", "--checkpoint", str(bad), "--model", "vit_attn_micro", "--data", "digits"]) == 2
    assert f"{bad} is not a readable safetensors checkpoint (truncated or corrupt" in _err_line(capsys)


class _RunsCode:
    def __reduce__(self):
        return (print, ("unpickled",))


def test_malicious_pickle_refused_without_torch_warnings(tmp_path, capsys, recwarn):
    """Item 14: a plain pickle (protocol 4) made torch print two UserWarning lines before the refusal."""
    import pickle

    evil = tmp_path / "evil.pth"
    with open(evil, "wb") as f:
        pickle.dump({"w": _RunsCode()}, f, protocol=4)
    assert main(["eval", "--checkpoint", str(evil), "--model", "vit_attn_micro", "--data", "digits"]) == 2
    out, err = capsys.readouterr()
    assert "unpickled" not in out
    assert err.strip().count("\n") == 0 and "UserWarning" not in err, err
    assert err.startswith(f"subquad eval: error: refusing to load {evil}: it cannot be loaded safely")
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)], [str(w.message)[:80] for w in recwarn]


# ----- item 3: count_macs sizes and integer inputs -----

@pytest.mark.parametrize("kw", [dict(img_size=-224), dict(img_size=0), dict(img_size=(32,)), dict(img_size=(32, 0)),
                                dict(img_size=3.5), dict(img_size=(32, 32), batch_size=0),
                                dict(img_size=32, in_chans=0)], ids=str)
def test_count_macs_refuses_bad_sizes(kw):
    import subquad

    with pytest.raises(subquad.UserError, match="count_macs: (img_size|batch_size|in_chans) must be") as e:
        subquad.count_macs("l2vit_tiny", **kw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["l2vit_micro", "flatten_swin_micro", "lisanet_micro", "vil_ls_micro",
                                  "vit_attn_micro", "hylisanet_micro_video"])
def test_integer_input_is_refused(name):
    import subquad
    from subquad.models._base import InputShapeError

    model = subquad.create_model(name, device="meta")
    with pytest.raises(InputShapeError, match="expected a floating-point input .* got torch.uint8"):
        model(torch.zeros(1, 3, 64, 64, dtype=torch.uint8, device="meta"))


# ----- item 4: train --resume with a flag that would change the run -----

TINY = ["--model", "vit_attn_micro", "--data", "digits", "--img-size", "16", "--train-limit", "64",
        "--eval-limit", "32", "--test-limit", "32", "-b", "32", "--log-interval", "0", "--device", "cpu"]


def test_resume_refuses_a_changed_flag(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, "--epochs", "1", "--output", str(run)]) == 0
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    capsys.readouterr()
    for flags, shown in ((["--lr", "0.5"], "--lr 0.5 (the run has 0.002)"),
                         (["--train-limit", "32", "--amp"], "--train-limit 32 (the run has 64), --amp True"),
                         (["--epochs", "2", "--resume-schedule", "continue", "--min-lr", "0.1"], "--min-lr 0.1")):
        assert main(["train", "--resume", str(run), *flags]) == 2
        line = _err_line(capsys)
        assert f"continues the run with its own settings (args.yaml); drop {shown}" in line, line
        assert "only --device, --workers" in line
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # args.yaml still says lr: 0.002
    # The run's own values, a device, and an extension whose new cosine starts from --lr are accepted.
    assert main(["train", "--resume", str(run), *TINY, "--epochs", "1", "--output", str(run)]) == 0
    assert "is complete" in capsys.readouterr().out
    assert main(["train", "--resume", str(run), "--epochs", "2", "--lr", "0.001", "--dry-run"]) == 0
    assert "lr: 0.001" in capsys.readouterr().out


# ----- item 5: train with no model -----

def test_train_without_model_prints_usage_and_starts_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for argv in (["train"], ["train", "--data", "digits", "--epochs", "1"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("usage: subquad train (--model NAME | -c RECIPE)"), err
        assert err.strip().splitlines()[-1] == ("subquad train: error: --model or -c is required (or --resume DIR to "
                                                "continue a run); see `subquad train --help`")
    assert list(tmp_path.iterdir()) == []  # no runs/ folder


# ----- item 6: bench model at a size below the model's stride -----

def test_bench_refuses_too_small_sizes_up_front(tmp_path, capsys):
    import subquad
    from subquad.bench.sweep import bench_models

    out = tmp_path / "b.csv"
    assert main(["bench", "model", "--model", "l2vit_micro", "--img-size", "32,7", "--repeats", "1", "--out",
                 str(out)]) == 2
    line = _err_line(capsys)
    assert "--img-size 7 is too small for l2vit_micro" in line and "use at least 16x16" in line
    assert list(tmp_path.iterdir()) == []  # no CSV, no empty plot
    with pytest.raises(subquad.UserError, match="too small"):
        bench_models(["l2vit_micro"], [7], repeats=1)


# ----- item 7: an arena run in which no cell can run -----

def test_arena_run_with_no_runnable_cell_writes_nothing(tmp_path, capsys):
    out = tmp_path / "arena"
    assert main(["arena", "run", "--task", "charlm", "--attention", "global_filter", "--budget", "quick",
                 "--device", "cpu", "--out", str(out)]) == 2
    line = _err_line(capsys)
    assert "no cell can run: global_filter has no causal mode" in line and "nothing written" in line
    assert not out.exists()


# ----- item 8: each arena metric with its own unit -----

def test_arena_lines_print_each_metric_with_its_unit(tmp_path):
    import json

    from subquad.arena import load_task
    from subquad.arena.report import claims_text
    from subquad.arena.runner import Cell, _log_finished, _log_progress

    lines: list[str] = []
    for name, val, test, unit in (("charlm", 7.8812, 2.3361, "bpc"), ("fmnist", 88.123, 87.5, "%")):
        task = load_task(name)
        cell = Cell("softmax", 0, tmp_path / name)
        cell.dir.mkdir()
        (cell.dir / "progress.json").write_text(json.dumps({"step": 5, "steps": 10, "val_acc": val}))
        (cell.dir / "cell.json").write_text(json.dumps({"test_acc": test}))
        _log_progress(task, cell, lines.append, lambda: None)
        _log_finished(task, cell, 0, [], [], 1, lines.append, lambda: None)
        if unit == "bpc":
            assert "val 7.881 bpc," in lines[-2] and "test 2.336 bpc " in lines[-1], lines
            assert "%" not in lines[-2] + lines[-1]
        else:
            assert "val 88.12 %," in lines[-2] and "test 87.50 % " in lines[-1], lines
    claim = {"source": "Tab. 4", "a": "long_short", "b": "softmax", "test": "superior", "lower_is_better": True,
             "metric": "bpc", "mean_a": 2.4, "mean_b": 2.336, "diff": None, "verdict": "inconclusive", "why": "x"}
    assert "2.400 bpc vs 2.336 bpc" in claims_text([claim])


# ----- item 9: eval again -----

@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("image") / "run"
    assert main(["train", *TINY, "--epochs", "1", "--output", str(run)]) == 0
    return run


def test_eval_again_prints_the_numbers_and_keeps_every_result(image_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(image_run, run)
    ev = ["eval", "--checkpoint", str(run), "--device", "cpu"]
    first, second = run / "best.eval-test.json", run / "best.eval-test-2.json"
    capsys.readouterr()
    assert main(ev) == 0
    assert f"results: {first}\n" in capsys.readouterr().out
    before = first.read_bytes()
    # The same result again: the numbers are printed, the file is left as it is.
    assert main(ev) == 0
    out = capsys.readouterr().out
    assert "top-1" in out and f"results: {first} (unchanged" in out and first.read_bytes() == before
    # A different result (a subset): printed, and written beside the earlier one, which is kept.
    assert main([*ev, "--limit", "50"]) == 0
    out = capsys.readouterr().out
    assert "[test, 50 images]: top-1" in out and f"results: {second} (a new file: {first.name} holds" in out
    assert first.read_bytes() == before and '"images": 50' in second.read_text()
    assert main([*ev, "--limit", "50"]) == 0 and f"results: {second} (unchanged" in capsys.readouterr().out
    assert sorted(p.name for p in run.glob("*.eval-*")) == sorted([first.name, second.name])
    # A named --results-file is still refused up front when it exists.
    assert main([*ev, "--results-file", str(first)]) == 2
    assert "exists; pass --overwrite" in _err_line(capsys)


# ----- item 10: a run of another trainer handed to the image commands -----

# The sidecar fields each trainer writes (subquad.engine.sequence, subquad.dense.engine) and an args.yaml key of its
# config; test_other_runs_of_real_trainers (slow) checks them against real runs.
OTHER_RUNS = {
    "lm": ({"arch": "char_lm", "model_args": {"vocab_size": 256}}, {"attention": "softmax", "eval_ctx": 1024},
           "an `lm train` run", "`subquad lm eval`"),
    "lra": ({"arch": "lra_encoder", "task": "listops", "attention": "softmax"},
            {"task": "listops", "attention": "softmax", "encoding": "learned"}, "an `lra train` run",
            "`subquad lra train --resume`"),
    "detect": ({"task": "detect", "kind": "fasterrcnn", "arch": "l2vit_micro"},
               {"kind": "fasterrcnn", "model": "l2vit_micro", "fpn_channels": 16}, "a `detect train` run",
               "`subquad detect eval`"),
    "segment": ({"task": "segment", "kind": "semantic_fpn", "arch": "l2vit_micro"},
                {"kind": "semantic_fpn", "model": "l2vit_micro", "fpn_channels": 16}, "a `segment train` run",
                "`subquad segment eval`"),
}


def _image_commands(run, tmp_path) -> list[list[str]]:
    img = tmp_path / "d.png"
    if not img.exists():
        from subquad.data.small import save_digits_image

        save_digits_image(img, 0)
    return [["eval", "--checkpoint", str(run)], ["predict", "--checkpoint", str(run), str(img)],
            ["export", "--checkpoint", str(run), "--format", "onnx", "--out", str(tmp_path / "m.onnx")],
            ["analyze", "--checkpoint", str(run), "--out", str(tmp_path / "an")], ["train", "--resume", str(run)]]


def _assert_refused(run, what, hint, tmp_path, capsys):
    for argv in _image_commands(run, tmp_path):
        assert main(argv) == 2, argv
        line = _err_line(capsys)
        assert f"{run} is {what}, not a `subquad train` run; " in line and hint in line, (argv, line)
    assert main(["predict", "--checkpoint", str(run / "best.safetensors"), str(tmp_path / "d.png")]) == 2
    assert f"holds the weights of {what}" in _err_line(capsys)


@pytest.mark.parametrize("kind", sorted(OTHER_RUNS))
def test_other_runs_are_named_with_their_commands(kind, tmp_path, capsys):
    import json

    import yaml
    from safetensors.torch import save_file

    side, args, what, hint = OTHER_RUNS[kind]
    run = tmp_path / kind
    run.mkdir()
    save_file({"w": torch.zeros(1)}, run / "best.safetensors")
    (run / "args.yaml").write_text(yaml.safe_dump(args))
    (run / "best.json").write_text(json.dumps(side))
    _assert_refused(run, what, hint, tmp_path, capsys)
    # A run stopped before its first sidecar: args.yaml tells.
    (run / "best.json").unlink()
    assert main(["train", "--resume", str(run)]) == 2 and what in _err_line(capsys)
    assert not (tmp_path / "m.onnx").exists() and not (tmp_path / "an").exists()


@pytest.mark.slow
def test_other_runs_of_real_trainers(tmp_path, capsys):
    from subquad.data.lra.listops import write_listops
    from subquad.dense.synthetic import generate_synthetic

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "doc.txt").write_text("the quick brown fox jumps over the lazy dog.\n" * 60)
    assert main(["lm", "prepare", "--corpus", str(tmp_path / "src"), "--out", str(tmp_path / "prep")]) == 0
    write_listops(tmp_path / "lo", num_train=24, num_val=8, num_test=8, seed=1, min_len=10, max_len=60)
    syn = generate_synthetic(tmp_path / "syn", seed=1, n_train=4, n_val=2, size=(40, 56), min_r=5, max_r=10)
    dense = ["--data", f"synthetic:{syn}", "--model", "l2vit_micro", "--epochs", "1", "--fpn-channels", "16", "-b", "2",
             "--log-interval", "0"]
    trains = {
        "lm": ["lm", "train", "--data", str(tmp_path / "prep"), "--attention", "softmax", "--dim", "16", "--depth",
               "1", "--num-heads", "2", "--seq-len", "16", "--batch-size", "2", "--max-steps", "2", "--eval-every",
               "2", "--eval-ctx", "16", "--eval-score", "8", "--eval-tokens", "32", "--final-eval-tokens", "32"],
        "lra": ["lra", "train", "--task", "listops", "--data", str(tmp_path / "lo"), "--attention", "softmax",
                "--max-steps", "2", "--eval-every", "2", "--batch-size", "4", "--max-len", "64"],
        "detect": ["detect", "train", *dense, "--kind", "fasterrcnn", "--representation-size", "32",
                   "--rpn-proposals", "32", "--box-batch-size-per-image", "16", "--rpn-batch-size-per-image", "16",
                   "--min-size", "48", "--max-size", "64"],
        "segment": ["segment", "train", *dense, "--kind", "semantic_fpn", "--head-channels", "16", "--scale", "40",
                    "56", "--crop-size", "32", "32"],
    }
    for kind, argv in trains.items():
        run = tmp_path / kind
        assert main([*argv, "--output", str(run)]) == 0, kind
        capsys.readouterr()
        _, _, what, hint = OTHER_RUNS[kind]
        _assert_refused(run, what, hint, tmp_path, capsys)


# ----- item 11 (and 14: a YAML parse error's line): numbers written 1e-3 -----

def test_recipe_numbers_in_exponent_notation(tmp_path, capsys):
    from subquad_cli.recipes import load_yaml

    y = tmp_path / "r.yaml"
    y.write_text("model: vit_attn_micro\nlr: 1e-3\nwarmup_lr: 5E-6\nweight_decay: -2.5e+1\nmodel_ema_decay: 1.0e-3\n"
                 "output: 1e3x\n")
    assert load_yaml(y) == {"model": "vit_attn_micro", "lr": 0.001, "warmup_lr": 5e-6, "weight_decay": -25.0,
                            "model_ema_decay": 0.001, "output": "1e3x"}
    assert main(["train", "-c", str(y), *TINY[2:], "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "lr: 0.001" in out and "warmup_lr: 5.0e-06" in out


def test_lm_recipe_numbers_in_exponent_notation(tmp_path, monkeypatch):
    import argparse

    from subquad_cli.lm import resolve_config

    y = tmp_path / "lm.yaml"
    y.write_text("lr: 3e-4\nweight_decay: 1e-2\n")
    args = argparse.Namespace(resume=None, data="enwik8:x", attention="long_short", config=str(y), attn_opt=[],
                              amp=None, amp_dtype=None)
    cfg = resolve_config(args)
    assert (cfg.lr, cfg.weight_decay) == (3e-4, 1e-2)


def test_yaml_parse_error_names_the_line(tmp_path, capsys):
    y = tmp_path / "r.yaml"
    y.write_text("model: vit_attn_micro\nlr: [0.1\nepochs: 3\n")
    assert main(["train", "-c", str(y), "--dry-run"]) == 2
    line = _err_line(capsys)
    assert f"cannot parse {y}, line 3, column" in line, line


# ----- item 14: the small ones -----

def test_did_you_mean_has_no_duplicates(capsys):
    from subquad.errors import closest, unknown_name

    assert closest("l2vit_tinny", ["l2vit_tiny", "l2vit_tiny", "l2vit_deit_tiny"]) == ["l2vit_tiny", "l2vit_deit_tiny"]
    assert "'l2vit_tiny', 'l2vit_tiny'" not in str(unknown_name("model", "l2vit_tinny", ["l2vit_tiny"] * 2))
    assert main(["flops", "--model", "l2vit_tinny"]) == 2  # subquad's models are in timm's list as well
    line = _err_line(capsys)
    suggested = line.split("did you mean ")[1].split("?")[0].split(", ")
    assert suggested[0] == "'l2vit_tiny'" and len(suggested) == len(set(suggested)), line


def test_no_released_weights_said_once():
    import subquad

    for name, rest in (("l2vit_micro", "; pass checkpoint_path"), ("lisanet_micro", " (unofficial configuration;")):
        with pytest.raises(subquad.UserError) as e:
            subquad.create_model(name, pretrained=True, device="meta")
        assert str(e.value).startswith(f"{name}: no released weights exist{rest}"), str(e.value)
        assert str(e.value).count("no released weights") == 1


@pytest.mark.filterwarnings("ignore:PlateauLRScheduler is deprecated")
def test_unknown_scheduler_and_optimizer_list_the_valid_ones(capsys):
    import dataclasses

    from subquad.engine.optim import SCHEDULERS, build_scheduler
    from subquad_cli.runconfig import TrainConfig

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    for name in SCHEDULERS:  # every listed name is one the installed timm builds
        cfg = dataclasses.replace(TrainConfig(), sched=name, epochs=4, sched_on_updates=name != "plateau")
        assert build_scheduler(opt, cfg, 2) is not None, name
    base = ["train", "--model", "vit_attn_micro", "--img-size", "16", "--train-limit", "64", "--dry-run"]
    assert main([*base, "--sched", "cosin"]) == 2
    line = _err_line(capsys)
    assert "unknown --sched 'cosin'; did you mean cosine? allowed: cosine, tanh, step" in line, line
    assert main([*base, "--opt", "adamww"]) == 2
    assert "unknown --opt 'adamww'; did you mean adamw" in _err_line(capsys)


def test_misspelt_recipe_suggests_one(capsys):
    assert main(["train", "-c", "l2vit_tinny", "--dry-run"]) == 2
    assert "config file not found: l2vit_tinny; did you mean imagenet/l2vit_tiny" in _err_line(capsys)


def test_bench_load_warning_with_one_thread():
    from subquad.bench import machine

    one = machine.load_warning(1, load=3.0)
    assert "--threads 1" not in one and "quieter" in one
    assert "--threads 1" in machine.load_warning(2, load=3.0)


# ----- item 15: predict over a folder with an unreadable image -----

def test_predict_folder_skips_and_reports_unreadable_images(image_run, tmp_path, capsys):
    import json

    from subquad.data.small import save_digits_image

    folder = tmp_path / "imgs"
    folder.mkdir()
    save_digits_image(folder / "a.png", 0)
    (folder / "b.png").write_bytes(b"\x89PNG broken")
    save_digits_image(folder / "c.png", 1)
    (folder / "d.jpg").write_bytes(b"")
    capsys.readouterr()
    res = tmp_path / "p.json"
    assert main(["predict", "--checkpoint", str(image_run), str(folder), "--json", str(res), "--device", "cpu"]) == 2
    out, err = capsys.readouterr()
    assert f"{folder / 'a.png'}: " in out and f"{folder / 'c.png'}: " in out and "2 image(s) in" in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"subquad predict: error: skipped 2 of 4 image(s) that cannot be read: {folder / 'b.png'} ("), lines
    assert lines[0].endswith(", and 1 more; the others were predicted")
    assert [r["image"] for r in json.loads(res.read_text())] == [str(folder / "a.png"), str(folder / "c.png")]


# ----- a new user's walk: rates out of range, a run that is all warm-up, unknown names and options -----

@pytest.mark.parametrize("flag,value,expect", [
    ("--smoothing", "2", "--smoothing must be in [0, 1), got 2"),
    ("--drop-path", "1.5", "--drop-path must be in [0, 1), got 1.5"),
    ("--drop", "-0.1", "--drop must be in [0, 1), got -0.1"),
    ("--mixup-prob", "1.5", "--mixup-prob must be in [0, 1], got 1.5"),
    ("--warmup-epochs", "-1", "--warmup-epochs must be >= 0 (0: off), got -1"),
    ("--mixup", "-1", "--mixup must be >= 0 (0: off), got -1"),
    # An audit of the flags: each of these trained (or crashed inside the DataLoader) before.
    ("--clip-grad", "-1", "--clip-grad must be > 0 (leave it unset for no clipping), got -1"),
    ("--clip-grad", "0", "--clip-grad must be > 0"),
    ("--workers", "-1", "--workers must be >= 0"),
    ("--validation-batch-size", "-1", "--validation-batch-size must be >= 1, got -1"),
])
def test_rates_out_of_range_are_one_line_and_nothing_is_written(tmp_path, capsys, flag, value, expect):
    out = tmp_path / "run"
    assert main(["train", *TINY, flag, value, "--epochs", "1", "--output", str(out)]) == 2
    assert expect in _err_line(capsys)
    assert not out.exists()


def test_a_run_that_is_all_warm_up_says_so(tmp_path, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="subquad"):
        assert main(["train", *TINY, "--epochs", "1", "--dry-run", "--output", str(tmp_path / "a")]) == 0
    assert "--warmup-epochs 2 >= --epochs 1: the whole run is warm-up" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="subquad"):
        assert main(["train", *TINY, "--epochs", "1", "--warmup-epochs", "0", "--dry-run",
                     "--output", str(tmp_path / "b")]) == 0
    assert "warm-up" not in caplog.text


def test_unknown_mechanism_without_a_near_name_lists_the_allowed_ones():
    import subquad

    with pytest.raises(ValueError, match="unknown attention 'projection'; allowed: agent, cswin, ") as e:
        subquad.create_model("flatten_swin_micro", attn="projection")
    assert all(n in str(e.value) for n in subquad.list_attention())


def test_lra_unknown_mechanism_option_is_one_line(tmp_path, capsys):
    from subquad.data.lra.listops import write_listops

    write_listops(tmp_path / "lo", num_train=8, num_val=4, num_test=4, seed=1, min_len=10, max_len=40)
    out = tmp_path / "run"
    assert main(["lra", "train", "--task", "listops", "--data", str(tmp_path / "lo"), "--attention", "long_short",
                 "--attn-opt", "rnk=2", "--max-steps", "2", "--batch-size", "4", "--output", str(out)]) == 2
    assert "attention 'long_short' got unknown option(s) ['rnk']; allowed: " in _err_line(capsys)
    assert not out.exists()


def test_a_mechanism_that_refuses_a_stage_names_the_host_and_what_fits():
    """CSwin's two branches need an even head count; a Swin micro stage has one head: the refusal names the host, the
    stage's sizes and the mechanisms that build there (each checked on the meta device)."""
    import subquad
    from subquad.errors import UserError

    with pytest.raises(UserError, match=r"attention 'cswin' cannot serve Swin stages with 1 head\(s\) of width 32: "
                       r".*even num_heads.*; mechanisms that fit this stage: agent, ") as e:
        subquad.create_model("flatten_swin_micro", attn="cswin")
    fit = str(e.value).split("mechanisms that fit this stage: ")[1].split(", ")
    assert "cswin" not in fit and "softmax" in fit and "window" in fit
    subquad.create_model("flatten_swin_micro", attn=fit[0])  # what it names does build


def test_python_api_model_option_mistakes_are_one_line():
    import subquad
    from subquad.errors import UserError

    with pytest.raises(TypeError, match="cannot build model 'l2vit_micro': .*unexpected keyword argument 'depht'") as e:
        subquad.create_model("l2vit_micro", depht=3)
    assert isinstance(e.value, UserError)  # one line on the command line, a TypeError for code that catches one
    with pytest.raises(UserError, match="cannot build model 'l2vit_micro' with features_only: feature index 5"):
        subquad.create_model("l2vit_micro", features_only=True, out_indices=(5,))


def test_train_precision_names_what_eval_and_predict_name(tmp_path, capsys):
    import yaml

    for word, amp, dtype in (("bf16", True, "bfloat16"), ("fp16", True, "float16"), ("fp32", False, "float16")):
        assert main(["train", *TINY, "--epochs", "1", "--precision", word, "--dry-run",
                     "--output", str(tmp_path / word)]) == 0
        cfg = yaml.safe_load(capsys.readouterr().out.split("dry run:")[0])
        assert (cfg["amp"], cfg["amp_dtype"]) == (amp, dtype), word
    assert main(["train", *TINY, "--precision", "fp32", "--amp", "--dry-run", "--output", str(tmp_path / "x")]) == 2
    assert "--precision fp32 contradicts --amp; give one of them" in _err_line(capsys)
    assert main(["train", *TINY, "--precision", "bf16", "--amp-dtype", "float16", "--dry-run",
                 "--output", str(tmp_path / "y")]) == 2
    assert "--precision bf16 contradicts --amp-dtype float16" in _err_line(capsys)


def test_an_img_size_below_the_models_smallest_input_is_one_line():
    import subquad
    from subquad.errors import UserError

    for size in (8, (16, 8)):
        with pytest.raises(UserError, match=r"flatten_pvt_micro: img_size .* is smaller than the model's total stride "
                           r"or smallest input 16x16 .*; use at least 16x16"):
            subquad.create_model("flatten_pvt_micro", img_size=size)
    assert subquad.create_model("flatten_pvt_micro", img_size=(16, 24)).num_classes > 0


@pytest.mark.parametrize("flag", ["--workers", "--limit"])
def test_eval_negative_workers_or_limit_is_one_line(tmp_path, capsys, flag):
    """A negative --limit evaluated every image (as 0 does) and a negative --workers crashed in the DataLoader."""
    run = tmp_path / "run"
    assert main(["train", *TINY, "--epochs", "1", "--warmup-epochs", "0", "--output", str(run)]) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(run), flag, "-1"]) == 2
    assert "--workers and --limit must be >= 0" in _err_line(capsys)


def test_lm_negative_clip_grad_is_one_line(tmp_path, capsys):
    (tmp_path / "c.txt").write_text("the quick brown fox jumps over the lazy dog. " * 200)
    assert main(["lm", "prepare", "--corpus", str(tmp_path / "c.txt"), "--out", str(tmp_path / "data")]) == 0
    capsys.readouterr()
    assert main(["lm", "train", "--data", str(tmp_path / "data"), "--clip-grad", "-1",
                 "--output", str(tmp_path / "run")]) == 2
    assert "--clip-grad must be >= 0 (0 = off), got -1" in _err_line(capsys)
    assert not (tmp_path / "run").exists()


def test_a_recipe_without_a_model_is_refused(tmp_path, capsys):
    """A recipe of hyperparameters only (as timm's --config files are) silently trained vit_attn_micro."""
    recipe = tmp_path / "hp.yaml"
    recipe.write_text("epochs: 1\nlr: 0.001\n")
    out = tmp_path / "run"
    assert main(["train", "-c", str(recipe), "--data", "digits", "--output", str(out)]) == 2
    assert "no model given: the recipe sets none and --model is missing" in _err_line(capsys)
    assert not out.exists()
    assert main(["train", "-c", str(recipe), *TINY, "--dry-run", "--output", str(out)]) == 0
