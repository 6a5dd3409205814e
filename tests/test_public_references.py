"""What the project cites is what a user can open: a paper (title or arXiv id with its section, equation or table) or
a public repository and file. Our private working notes (design notes, specs, seed texts) are not among them, so no
tracked file may point at them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Pointers into working material a user cannot open.
PATTERNS = [r"\bspec(ification)? (section|§)", r"\bin the spec\b", r"\.\./shared", r"\bseed ?0\d{2}\b",
            r"\bDESIGN\.md", r"\bregister tag"]
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".cfg", ".txt", ".sh"}


def _tracked() -> list[Path]:
    r = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True)
    if r.returncode == 0 and r.stdout:
        names = r.stdout.splitlines()
    else:  # an unpacked source tree without git: every file under the root but the environments
        names = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file()
                 and not {".venv", ".git", "build", "dist"} & set(p.relative_to(ROOT).parts)]
    return [ROOT / n for n in names if Path(n).suffix in SUFFIXES or Path(n).name == "Makefile"]


def test_no_file_cites_private_working_material():
    pattern = re.compile("|".join(PATTERNS), re.IGNORECASE)
    hits = []
    for path in _tracked():
        if not path.is_file() or path == Path(__file__).resolve():  # this file spells the patterns out
            continue
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()[:120]}")
    assert not hits, "cite the paper or the official repository instead:\n" + "\n".join(hits)


def test_the_check_catches_each_pattern():
    pattern = re.compile("|".join(PATTERNS), re.IGNORECASE)
    for text in ("as in spec section 5", "see " + "../" + "shared/spec", "seed 003", "DESIGN" + ".md section 6",
                 "stated in the spec."):
        assert pattern.search(text), text
    for text in ("arXiv 2107.02192 Sec. 3.2", "seed 0", "the data spec", "spec: str"):
        assert not pattern.search(text), text
