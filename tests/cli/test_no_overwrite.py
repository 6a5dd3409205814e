"""Nothing a user made is overwritten: every command that writes refuses an existing non-empty output folder or an
existing output file in one line (exit 2), before doing any work, unless --overwrite is given."""

from __future__ import annotations

import pytest

from subquad_cli.__main__ import main


def _mine(path):
    """A folder holding a file of the user's."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "keep.txt").write_text("mine")
    return path


def _file(path):
    path.write_text("mine")
    return path


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# (argv with OUT for the output, whether OUT is a folder with a user's file or a user's file). Inputs that the
# command would read are missing on purpose: the output is refused before they are looked at.
CASES = {
    "lra generate listops": (["lra", "generate", "listops", "--out", "OUT", "--num-train", "5"], "dir"),
    "lra generate pathfinder": (["lra", "generate", "pathfinder", "--out", "OUT", "--num-images", "10"], "dir"),
    "lm prepare": (["lm", "prepare", "--corpus", "MISSING", "--out", "OUT"], "dir"),
    "analyze": (["analyze", "--model", "l2vit_micro", "--out", "OUT"], "dir"),
    "train": (["train", "--model", "vit_attn_micro", "--data", "digits", "--epochs", "1", "--output", "OUT"], "dir"),
    "lra train": (["lra", "train", "--task", "listops", "--data", "MISSING", "--output", "OUT"], "dir"),
    "lm train": (["lm", "train", "--data", "MISSING", "--output", "OUT"], "dir"),
    "detect train": (["detect", "train", "--data", "synthetic", "--output", "OUT"], "dir"),
    "segment train": (["segment", "train", "--data", "synthetic", "--output", "OUT"], "dir"),
    "detect predict": (["detect", "predict", "IMG", "--checkpoint", "MISSING", "--out-dir", "OUT"], "pred"),
    "segment eval": (["segment", "eval", "--checkpoint", "MISSING", "--results-file", "OUT.json"], "file"),
    "eval": (["eval", "--checkpoint", "MISSING", "--results-file", "OUT.json"], "file"),
    "predict": (["predict", "--checkpoint", "MISSING", "IMG", "--json", "OUT.json"], "file"),
    "export": (["export", "--model", "l2vit_micro", "--format", "onnx", "--out", "OUT.onnx"], "file"),
    "bench model": (["bench", "model", "--model", "l2vit_micro", "--out", "OUT.csv", "--no-plot"], "file"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_existing_output_refused(name, tmp_path, capsys):
    argv, kind = CASES[name]
    img = tmp_path / "img.png"
    img.write_bytes(b"not read")
    out = None
    args = []
    for a in argv:
        if a.startswith("OUT"):
            out = tmp_path / a.replace("OUT", "mine")
            if kind == "pred":  # a predict refuses only the prediction files it would replace
                out.mkdir()
                (out / "img.pred.png").write_text("mine")
            else:
                (_mine if kind == "dir" else _file)(out)
            a = str(out)
        elif a == "MISSING":
            a = str(tmp_path / "missing")
        elif a == "IMG":
            a = str(img)
        args.append(a)
    assert main(args) == 2
    line = _one_line(capsys)
    assert str(out) in line and "nothing was written" in line, line
    # export refuses a file that is not an earlier export even with --overwrite; the others name the flag.
    assert ("is not an earlier onnx export" if name == "export" else "--overwrite") in line, line
    if kind == "pred":
        assert [p.name for p in out.iterdir()] == ["img.pred.png"] and (out / "img.pred.png").read_text() == "mine"
    elif kind == "dir":
        assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"
    else:
        assert out.read_text() == "mine"


def test_empty_output_folder_is_used(tmp_path, capsys):
    out = tmp_path / "empty"
    out.mkdir()
    assert main(["lra", "generate", "listops", "--out", str(out), "--num-train", "3", "--num-val", "1",
                 "--num-test", "1", "--min-len", "10", "--max-len", "60"]) == 0
    assert (out / "train.tsv").is_file()


def test_lra_generate_keeps_a_set_unless_overwrite(tmp_path, capsys):
    """The reported case: a 5-example set regenerated with 2 examples replaced it without a word."""
    gen = ["lra", "generate", "listops", "--out", str(tmp_path), "--num-val", "1", "--num-test", "1", "--min-len",
           "10", "--max-len", "60", "--num-train"]
    assert main([*gen, "5"]) == 0
    before = (tmp_path / "train.tsv").read_text()
    assert main([*gen, "2"]) == 2
    assert "--overwrite" in _one_line(capsys) and (tmp_path / "train.tsv").read_text() == before
    assert main([*gen, "2", "--overwrite"]) == 0
    assert len((tmp_path / "train.tsv").read_text().splitlines()) == 1 + 2


def test_lm_prepare_overwrite(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("the quick brown fox jumps over the lazy dog.\n" * 40)
    out = _mine(tmp_path / "prep")
    assert main(["lm", "prepare", "--corpus", str(tmp_path / "a.txt"), "--out", str(out)]) == 2
    assert main(["lm", "prepare", "--corpus", str(tmp_path / "a.txt"), "--out", str(out), "--overwrite"]) == 0
    assert (out / "train.bin").is_file() and (out / "keep.txt").read_text() == "mine"


def test_output_folder_that_is_a_file_refused_even_with_overwrite(tmp_path, capsys):
    f = _file(tmp_path / "f")
    assert main(["lra", "generate", "listops", "--out", str(f), "--overwrite"]) == 2
    assert "is a file" in _one_line(capsys) and f.read_text() == "mine"


def test_train_into_a_run_still_says_resume(tmp_path, capsys):
    """--overwrite lets a run use a folder of other files, never replace a run (that is what --resume is for)."""
    run = _mine(tmp_path / "run")
    (run / "last_state.pth").write_bytes(b"x")
    for extra in ([], ["--overwrite"]):
        assert main(["train", "--model", "vit_attn_micro", "--data", "digits", "--output", str(run), *extra]) == 2
        assert "--resume" in _one_line(capsys)
