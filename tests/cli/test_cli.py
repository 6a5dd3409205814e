from __future__ import annotations

import subprocess
import sys

import pytest

from subquad_cli.__main__ import COMMANDS, main


def _run(*args):
    return subprocess.run([sys.executable, "-m", "subquad_cli", *args], capture_output=True, text=True, timeout=300)


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


@pytest.mark.parametrize("size", [["32x48"], ["32", "48"]])
def test_flops_takes_hxw_and_the_older_h_w(size, capsys):
    """One spelling of a size across the commands (`bench` takes HxW): `flops` counts 32 x 48 given either way,
    the same as the library does, and refuses a bad size in one line."""
    import subquad

    assert main(["flops", "--model", "deit_tiny_patch16_224", "--img-size", *size]) == 0
    out = capsys.readouterr().out
    want = subquad.count_macs("deit_tiny_patch16_224", (32, 48))["gmacs"]
    assert "img_size: 32x48" in out and f"GMACs: {want:.4f}" in out
    assert main(["flops", "--model", "deit_tiny_patch16_224", "--img-size", "32x0"]) == 2
    assert capsys.readouterr().err.strip() == ("subquad flops: error: --img-size '32x0': expected a positive side S "
                                               "or HxW (for example 224 or 224x320)")


@pytest.mark.parametrize("cmd", ["eval", "predict", "analyze"])
def test_size_options_of_eval_predict_and_analyze(cmd, capsys):
    """`--img-size 32` and `32x32` mean the same; eval and predict take HxW, analyze runs at a square size and
    refuses it in one line naming the commands that take it; a bad size says what is allowed."""
    from subquad_cli.__main__ import build_parser

    parser = build_parser()
    rest = {"eval": ["--checkpoint", "c"], "predict": ["--checkpoint", "c", "x.png"],
            "analyze": ["--model", "m", "--out", "o"]}[cmd]
    assert parser.parse_args([cmd, *rest, "--img-size", "32"]).img_size == 32
    assert parser.parse_args([cmd, *rest, "--img-size", "32x32"]).img_size == 32
    bads = [("0", "expected a positive side S or HxW (for example 224 or 224x320), got '0'")]
    if cmd == "analyze":
        bads = [("32x48", "'32x48' is not square: this command runs at S x S (bench, flops, export, eval and predict "
                          "take HxW)"), ("0", "expected a positive side S (or SxS), got '0'")]
    else:
        assert parser.parse_args([cmd, *rest, "--img-size", "32x48"]).img_size == (32, 48)
    for bad, msg in bads:
        with pytest.raises(SystemExit) as e:
            parser.parse_args([cmd, *rest, "--img-size", bad])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0] == (f"subquad {cmd}: error: argument --img-size: {msg} "
                                            f"(see `subquad {cmd} --help`)")


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


# Issue 13 item 6: help, version and argument errors answer in under a second (no torch, no timm), for every entry
# of COMMANDS (so a subcommand added later is held to it) and every nested subcommand.

def _parsers():
    """(argv prefix, parser) of the top level, every command and every nested subcommand."""
    import argparse

    from subquad_cli.__main__ import build_parser

    out = []

    def walk(prefix, p):
        out.append((prefix, p))
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    walk([*prefix, name], sp)

    walk([], build_parser())
    return out


def _timed(*args: str, env=None) -> tuple[float, subprocess.CompletedProcess]:
    """CPU seconds (user + system) of `python -X importtime -m subquad_cli ARGS` (what the `subquad` console script
    runs), best of up to three runs.

    CPU time rather than wall time: on an idle machine they agree, and on a busy one (this suite shares two cores
    with other work) wall time measures the other work too. The import list is checked separately."""
    import resource

    best, r = float("inf"), None
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        r = subprocess.run([sys.executable, "-X", "importtime", "-m", "subquad_cli", *args], capture_output=True,
                           text=True, timeout=120, env=env)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        best = min(best, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
        if best < 1.0:
            break
    return best, r


def _imported(stderr: str) -> set[str]:
    return {ln.split("|")[-1].strip() for ln in stderr.splitlines() if ln.startswith("import time:")}


def _assert_light(stderr: str) -> None:
    # the library itself (`subquad`, whose import registers every model) included
    heavy = {m for m in _imported(stderr)
             if m.split(".")[0] in ("subquad", "torch", "timm", "numpy", "PIL", "matplotlib")}
    assert not heavy, sorted(heavy)[:5]


def test_every_command_is_registered_and_covered():
    names = {tuple(prefix) for prefix, _ in _parsers() if len(prefix) == 1}
    assert names == {(c,) for c in COMMANDS}


@pytest.mark.parametrize("argv", [["--help"], ["--version"]] + [[c, "--help"] for c in sorted(COMMANDS)],
                         ids=lambda a: " ".join(a))
def test_help_and_version_answer_in_under_a_second(argv):
    dt, r = _timed(*argv)
    assert r.returncode == 0, r.stderr[-2000:]
    _assert_light(r.stderr)
    assert dt < 1.0, f"{argv}: {dt:.2f} s"


def test_nested_help_and_argument_errors_are_light():
    for prefix, _p in _parsers():
        if len(prefix) < 2:
            continue
        dt, r = _timed(*prefix, "--help")
        assert r.returncode == 0 and "usage" in r.stdout, (prefix, r.stderr[-500:])
        _assert_light(r.stderr)
        assert dt < 1.0, f"{prefix}: {dt:.2f} s"
    dt, r = _timed("train", "--no-such-flag")
    assert r.returncode == 2 and dt < 1.0
    _assert_light(r.stderr)
    assert "subquad train: error: unrecognized arguments: --no-such-flag (see `subquad train --help`)" in r.stderr


def test_models_cached_answers_without_torch(tmp_path):
    import os

    env = {**os.environ, "SUBQUAD_CACHE": str(tmp_path / "cache")}
    cold = subprocess.run([sys.executable, "-m", "subquad", "models", "--filter", "vit_attn_micro"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert cold.returncode == 0, cold.stderr[-2000:]
    assert (tmp_path / "cache" / "models.json").is_file()
    dt, warm = _timed("models", "--filter", "vit_attn_micro", env=env)
    assert warm.returncode == 0 and warm.stdout == cold.stdout
    _assert_light(warm.stderr)
    assert dt < 3.0, f"{dt:.2f} s"


@pytest.mark.parametrize("argv", [["models", "--no-count"], ["models", "--no-count", "--filter", "vit_attn_micro"]])
def test_output_into_a_closed_pipe_stops_quietly(argv, tmp_path):
    """`subquad models | head -1`: the reader closes early; we stop with SIGPIPE's status and no error text, whether
    the output fills the buffer (a write fails mid-run) or not (the failure would show at exit)."""
    import os

    read, write = os.pipe()
    os.close(read)
    env = {**os.environ, "SUBQUAD_CACHE": str(tmp_path / "cache")}
    try:
        r = subprocess.run([sys.executable, "-m", "subquad", *argv], stdout=write, stderr=subprocess.PIPE,
                           text=True, timeout=300, env=env)
    finally:
        os.close(write)
    assert r.returncode == 141 and r.stderr == "", (r.returncode, r.stderr[-2000:])


def test_models_cache_key_follows_versions(monkeypatch):
    from subquad_cli import models

    key = models.cache_key()
    assert key == models.cache_key()
    monkeypatch.setattr(models, "_dist_version", lambda name: "0.0.0-other")
    assert models.cache_key() != key


def test_models_columns_align_and_card_column_is_the_papers():
    from subquad_cli.models import table

    full = {"status": "official-arch", "img_size": 224, "params_m": 5.0, "gmacs": 1.3, "top1": 72.2,
            "ref_params": 4_000_000, "ref_gmacs": None}
    empty = {"status": "unofficial", "img_size": 32, "params_m": None, "gmacs": None, "top1": None,
             "ref_params": None, "ref_gmacs": None}
    lines = table(["a_full", "b_empty", "c_uncounted"], {"a_full": full, "b_empty": empty, "c_uncounted": empty},
                  {"a_full": {"params": 4_100_000, "gmacs": 1.3}, "b_empty": {"params": 21_000, "gmacs": 0.001}})
    header, rows = lines[0], lines[2:]
    for label in ("res", "params(M)", "paper(M)", "GMACs", "paper GMACs", "paper top-1"):
        end = header.index(label) + len(label)
        for row in rows:
            assert row[end - 1] != " " and (len(row) == end or row[end] == " "), (label, row)
    cells = rows[0].split()
    # paper(M) is the card's published 5.00 M, not the reference count (4.00 M) the gap is measured against.
    assert cells[3:8] == ["4.10", "5.00", "1.30", "1.30", "72.2"] and "GAP>1%: params" in rows[0]
    assert rows[1].split()[3:8] == ["0.02", "-", "0.00", "-", "-"] and rows[2].split()[3:8] == ["-"] * 5


# Issue 13 item 10 and issue 14: no abbreviated flags, an unknown flag names the subcommand's help, and only user
# errors become one line.

def test_no_parser_accepts_abbreviations(capsys):
    for prefix, p in _parsers():
        assert p.allow_abbrev is False, prefix
    with pytest.raises(SystemExit) as e:
        main(["train", "--model", "vit_attn_micro", "--epoch", "1", "--dry-run"])
    assert e.value.code == 2
    assert "unrecognized arguments: --epoch 1 (see `subquad train --help`)" in capsys.readouterr().err


def test_unknown_flag_points_to_the_subcommands_help(capsys):
    for argv, prog in ((["bench", "attention", "--nope"], "subquad bench attention"),
                       (["lm", "prepare", "--corpus", "x", "--out", "y", "--nope"], "subquad lm prepare"),
                       (["--nope"], "subquad")):
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err.strip()
        assert err == f"{prog}: error: unrecognized arguments: --nope (see `{prog} --help`)", err


def test_only_user_errors_become_one_line(monkeypatch, capsys):
    import subquad_cli.flops as flops
    from subquad.errors import UserError

    def boom(exc):
        def run(args):
            raise exc
        return run

    monkeypatch.setattr(flops, "run", boom(UserError("bad --img-size; allowed: positive ints")))
    assert main(["flops", "--model", "x"]) == 2
    assert capsys.readouterr().err.strip() == "subquad flops: error: bad --img-size; allowed: positive ints"
    monkeypatch.setattr(flops, "run", boom(FileNotFoundError(2, "No such file or directory", "w.pth")))
    assert main(["flops", "--model", "x"]) == 2
    assert capsys.readouterr().err.strip() == "subquad flops: error: No such file or directory: w.pth"
    # A library bug keeps its traceback.
    monkeypatch.setattr(flops, "run", boom(ValueError("internal: shapes disagree")))
    with pytest.raises(ValueError, match="internal"):
        main(["flops", "--model", "x"])


# Issue 24 defect 7: the CLI logs subquad's own messages at INFO and leaves the root logger, hence third-party
# loggers such as onnxscript and torch.onnx (about 230 INFO lines per ONNX export), at WARNING.

_LOG_PROBE = """
import logging, sys
from subquad_cli.__main__ import main
main(sys.argv[1:])
logging.getLogger("onnxscript.optimizer").info("third-party info")
logging.getLogger("torch.onnx").info("torch info")
logging.getLogger("onnxscript").warning("third-party warning")
logging.getLogger("subquad.engine.classify").info("subquad info")
"""


def test_cli_logs_subquad_not_third_party_info():
    import os
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    r = subprocess.run([sys.executable, "-c", _LOG_PROBE, "--version"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": root})
    assert r.returncode == 0 and r.stderr.splitlines() == ["third-party warning", "subquad info"], r.stderr


@pytest.mark.slow
def test_export_does_not_flood_the_terminal(tmp_path):
    """The reported case: `subquad export` of l2vit_micro to ONNX printed about 315 lines; now the result line and
    the check line (a few lines in all)."""
    import os
    from pathlib import Path

    pytest.importorskip("onnxscript")
    root = str(Path(__file__).resolve().parents[2])
    r = subprocess.run([sys.executable, "-m", "subquad", "export", "--model", "l2vit_micro", "--format", "onnx",
                        "--out", str(tmp_path / "m.onnx")], capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PYTHONPATH": root})
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert len(lines) <= 5, "\n".join(lines)


# Issue 24 defect 9: help text.

def _help(capsys, *argv) -> str:
    import re

    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return re.sub(r"\s+", " ", capsys.readouterr().out)  # argparse wraps lines: compare on one line


@pytest.mark.parametrize("argv", [["train"], ["detect", "train"], ["models"], ["lra", "train"], ["lm", "train"],
                                  ["eval"], ["predict"], ["bench", "model"]])
def test_help_text_renders_cleanly(argv, capsys):
    import re

    text = _help(capsys, *argv)
    assert "%%" not in text and "--no-no-" not in text
    # One "(default: ...)" per option: the help of each option is the text up to the next option.
    for entry in re.split(r" (?=-{1,2}[a-z])", text):
        assert entry.count("(default") <= 1, entry


def test_models_help_percent(capsys):
    assert "over 1 % from" in _help(capsys, "models")


def test_train_limit_names(capsys):
    """`--train-limit` is the one documented name (train, detect, lra train); `--limit-train` is a hidden alias."""
    from subquad_cli.__main__ import build_parser

    for argv in (["train"], ["lra", "train"]):
        text = _help(capsys, *argv)
        assert "--train-limit" in text and "--eval-limit" in text and "--limit-train" not in text
    p = build_parser()
    assert p.parse_args(["lra", "train", "--limit-train", "7"]).limit_train == 7
    assert p.parse_args(["lra", "train", "--train-limit", "8"]).limit_train == 8
    assert p.parse_args(["train", "--limit-train", "9"]).train_limit == 9
    assert p.parse_args(["train", "--no-aug"]).no_aug is True
    assert not hasattr(p.parse_args(["train"]), "no_aug")  # untyped flags do not override a recipe


def test_shipped_config_by_name_from_any_directory(tmp_path, monkeypatch):
    from subquad.errors import UserError
    from subquad_cli.config import CONFIG_ROOT, find_config

    monkeypatch.chdir(tmp_path)
    want = CONFIG_ROOT / "imagenet" / "l2vit_tiny.yaml"
    for text in ("subquad/configs/imagenet/l2vit_tiny.yaml", "l2vit_tiny", "l2vit_tiny.yaml", "imagenet/l2vit_tiny",
                 "./subquad/configs/imagenet/l2vit_tiny.yaml"):
        assert find_config(text, ("imagenet", "fmnist")) == want, text
    assert find_config("synthetic", ("coco",)) == CONFIG_ROOT / "coco" / "synthetic.yaml"
    mine = tmp_path / "l2vit_tiny"
    mine.write_text("epochs: 3\n")
    assert find_config("l2vit_tiny", ("imagenet",)).resolve() == mine  # a file the user names wins
    with pytest.raises(UserError, match=r"not found: nope .*imagenet/l2vit_tiny") as e:
        find_config("nope", ("imagenet", "fmnist"))
    assert "\n" not in str(e.value)


def test_train_dry_run_with_config_by_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "-c", "vit_attn_micro", "--data", "digits", "--img-size", "16", "--epochs", "1",
                 "--dry-run"]) == 0
    assert "dry run: vit_attn_micro" in capsys.readouterr().out
