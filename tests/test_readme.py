"""README honesty: its tables equal what the registries render, and it gives the two commands first."""

from __future__ import annotations

from pathlib import Path

from subquad.cli.readme import render

README = Path(__file__).resolve().parents[1] / "README.md"


def test_tables_up_to_date():
    text = README.read_text()
    assert render(text) == text, "README.md tables are out of date: run `make readme`"


def test_two_commands_first():
    text = README.read_text()
    first = text.index("make demo")
    assert first < text.index("## ") or first < 2000
    assert "make test" in text[: text.index("make demo") + 400]
