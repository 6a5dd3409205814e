"""README honesty: a front page of at most 15 KB that gives the two commands first, and generated tables (README,
model zoo, mechanisms, the site's home page) equal to what the registries render."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from subquad_cli import readme

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_generated_files_up_to_date():
    assert readme.stale(ROOT) == [], "generated tables are out of date: run `make readme`"


def test_stale_file_is_detected_and_rewritten(tmp_path, capsys):
    """A model zoo page whose table lost a row fails the check, and --write restores it."""
    for rel in [*readme.TARGETS, readme.HOME]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text())
    zoo = tmp_path / "docs/models.md"
    good = zoo.read_text()
    zoo.write_text("\n".join(line for line in good.splitlines() if "`l2vit_tiny`" not in line) + "\n")
    assert readme.main(["--root", str(tmp_path)]) == 1
    assert "docs/models.md" in capsys.readouterr().err
    assert readme.main(["--root", str(tmp_path), "--write"]) == 0
    assert zoo.read_text() == good
    assert readme.main(["--root", str(tmp_path)]) == 0


def test_missing_markers_are_an_error():
    with pytest.raises(ValueError, match="zoo-table"):
        readme.render("no markers here", ("zoo",), "docs/models.md")


def test_readme_is_a_front_page():
    assert README.stat().st_size <= 15 * 1024, f"README.md is {README.stat().st_size} bytes; the limit is 15 KB"


def test_two_commands_first():
    text = README.read_text()
    first = text.index("make demo")
    assert first < text.index("## ") and first < 2000
    assert "make test" in text[first: first + 400]


def test_zoo_lists_every_model_with_load_command():
    import subquad

    zoo = (ROOT / "docs/models.md").read_text()
    for name in subquad.list_models():
        assert f"| `{name}` " in zoo, name
    assert 'timm.create_model("l2vit_tiny.in1k", pretrained=True)' in zoo


# Issue 34 items 17-19: the numbers of the README are generated or checked, the install is sized, and what to try
# after `make demo` names commands and models that exist.

def test_counts_are_generated(tmp_path, capsys):
    import subquad

    text = README.read_text()
    assert f"<!-- count:models -->{len(subquad.list_models())}<!-- /count --> models" in text
    assert f"<!-- count:mechanisms -->{len(subquad.list_attention())}<!-- /count --> mechanisms" in text
    for rel in [*readme.TARGETS, readme.HOME]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text())
    stale = text.replace(f"<!-- count:models -->{len(subquad.list_models())}", "<!-- count:models -->56")
    (tmp_path / "README.md").write_text(stale)
    assert readme.main(["--root", str(tmp_path)]) == 1
    assert readme.main(["--root", str(tmp_path), "--write"]) == 0
    assert (tmp_path / "README.md").read_text() == text
    with pytest.raises(ValueError, match="unknown count 'modles'"):
        readme.render_counts("<!-- count:modles -->1<!-- /count -->")


def test_fidelity_names_the_models_that_were_timed():
    """The Fidelity bullet lists exactly the models of the official-speed results and claims no official weights."""
    import csv

    text = README.read_text()
    bullet = text[text.index("- **Fidelity.**"): text.index("- **Cost.**")]
    named = set(re.findall(r"`(\w+)`", bullet.split("give the official logits")[0]))
    with open(ROOT / "benchmarks/results/official-speed-cpu-amd-epyc-2t.csv") as f:
        timed = {r["model"] for r in csv.DictReader(f)}
    assert named == timed, (named, timed)
    assert "official weights" not in bullet and "Tiny models" not in bullet


def _make_n(*args: str, venv: Path) -> str:
    """What `make ARGS` would run (`-n`, every target out of date) for a virtual environment at `venv`."""
    import subprocess

    r = subprocess.run(["make", "-n", "-B", *args, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_make_demo_installs_the_library_alone_and_takes_a_torch_index(tmp_path):
    venv = tmp_path / "venv"  # a fresh clone: no install yet
    demo = _make_n("demo", venv=venv)
    assert "pip install -q -e .\n" in demo and "[dev]" not in demo and "--index-url" not in demo
    for option in ("CPU=1", "TORCH_INDEX=https://download.pytorch.org/whl/cpu"):
        lines = _make_n("demo", option, venv=venv).splitlines()
        torch_line = next(i for i, ln in enumerate(lines) if "--index-url https://download.pytorch.org/whl/cpu" in ln)
        assert "pip install -q torch torchvision" in lines[torch_line]
        assert torch_line < next(i for i, ln in enumerate(lines) if ln.endswith("pip install -q -e ."))
    test = _make_n("test", venv=venv)
    assert 'pip install -q -e ".[dev]"' in test and "--index-url" not in test
    assert "--index-url https://download.pytorch.org/whl/cpu" in _make_n("test", "CPU=1", venv=venv)
    # A checkout that has the dev install runs the demo with it.
    venv.mkdir()
    (venv / ".installed").touch()
    assert 'pip install -q -e ".[dev]"' in _make_n("demo", venv=venv)


def test_install_size_and_what_to_try_after_the_demo():
    import subquad
    from subquad_cli.__main__ import COMMANDS

    text = README.read_text()
    assert "make demo CPU=1" in text and "download.pytorch.org/whl/cpu" in text and "GB" in text
    after = text[text.index("## After `make demo`"):]
    after = after[: after.index("\n## ")]
    used = re.findall(r"`subquad (\w+)", after)
    assert used and set(used) <= set(COMMANDS), used
    for model in re.findall(r"--model (\w+)", after):
        assert model in subquad.list_models(), model
