"""Every file the library writes goes through subquad.files (a temporary name renamed over the target), so a crash
or a Ctrl-C mid-write leaves the previous file whole."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from subquad.files import atomic_savefig, atomic_write_text

ROOT = Path(__file__).resolve().parent.parent
# Direct writes to a final path. Writes inside an atomic_write callback name its temporary path (`tmp`).
DIRECT = re.compile(r"\.savefig\(|\b(?!tmp\b)\w+\)?\.write_(text|bytes)\(")


def test_library_writes_go_through_the_atomic_helpers():
    hits = []
    for path in sorted([*(ROOT / "subquad").rglob("*.py"), *(ROOT / "subquad_cli").rglob("*.py")]):
        if path.name == "files.py":
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if DIRECT.search(line) and "tmp" not in line:
                hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not hits, "write through subquad.files.atomic_write / atomic_write_text / atomic_savefig:\n" + \
        "\n".join(hits)


def test_atomic_text_and_figure(tmp_path):
    plt = pytest.importorskip("matplotlib.pyplot")
    target = tmp_path / "a.txt"
    target.write_text("earlier")
    atomic_write_text(target, "new\n")
    assert target.read_text() == "new\n"
    fig = plt.figure()
    atomic_savefig(fig, tmp_path / "f.png", dpi=20)
    atomic_savefig(fig, tmp_path / "f.svg")
    plt.close(fig)
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (tmp_path / "f.svg").read_bytes()[:400]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "f.png", "f.svg"]  # no temporary left


def test_a_failed_write_keeps_the_earlier_file(tmp_path):
    from subquad.files import atomic_write

    target = tmp_path / "r.csv"
    target.write_text("earlier")

    def fail(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, fail)
    assert target.read_text() == "earlier" and [p.name for p in tmp_path.iterdir()] == ["r.csv"]
