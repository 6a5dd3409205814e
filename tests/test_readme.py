"""README honesty: a front page of at most 15 KB that gives the two commands first, and generated tables (README,
model zoo, mechanisms, the site's home page) equal to what the registries render."""

from __future__ import annotations

from pathlib import Path

import pytest

from subquad.cli import readme

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
