"""Every code example in README.md and docs/*.md runs.

- A ```python block runs (in a temporary directory, in a fresh namespace) unless the line before it is a marker:
  `<!-- example: skip (reason) -->` never runs it (the reason is required and shows in the skip report),
  `<!-- example: slow (reason) -->` runs it under the `slow` marker only (`make test-all`).
- A shell block (```bash / ```sh) runs only when marked `<!-- example: run -->` (or `slow (reason)`): most shell
  blocks train on real data sets; the cheap `subquad` ones are marked. `subquad` there is this checkout's command.
- docs/index.md is generated from README.md (tests/test_readme.py checks it), so its blocks are README's.

Blocks are named `FILE::SECTION#k` (the heading above the block, k counting blocks in that section).
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GENERATED = {"docs/index.md"}
MARKER = re.compile(r"^<!-- example: (?P<kind>run|skip|slow)(?: \((?P<reason>[^)]*)\))? -->$")
FENCE = re.compile(r"^(?P<fence>```+)\s*(?P<info>[\w+-]*)")
PYTHON = {"python", "py"}
SHELL = {"bash", "sh", "shell"}


@dataclass(frozen=True)
class Block:
    file: str
    line: int  # 1-based line of the opening fence
    name: str
    lang: str  # "python" or "shell"
    code: str
    mode: str  # "run", "skip", "slow" or "" (a shell block without a marker: not run)
    reason: str


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [f for f in files if f.relative_to(ROOT).as_posix() not in GENERATED]


def parse(path: Path) -> list[Block]:
    """The fenced python and shell blocks of `path`, with their markers; a marker not followed by one is an error."""
    rel = path.relative_to(ROOT).as_posix()
    lines = path.read_text().splitlines()
    blocks, section, count, pending, i = [], "top", {}, None, 0
    while i < len(lines):
        line = lines[i]
        m = MARKER.match(line.strip())
        if m:
            if pending is not None:
                raise ValueError(f"{rel}:{i + 1}: two example markers in a row")
            pending = (m["kind"], (m["reason"] or "").strip(), i + 1)
            if m["kind"] in ("skip", "slow") and not pending[1]:
                raise ValueError(f"{rel}:{i + 1}: `example: {m['kind']}` needs a reason in parentheses")
            i += 1
            continue
        if line.startswith("#"):
            section = re.sub(r"[^a-z0-9]+", "-", line.lstrip("#").strip().lower()).strip("-")
        f = FENCE.match(line)
        if not f:
            if line.strip() and pending is not None:
                raise ValueError(f"{rel}:{pending[2]}: an example marker must stand right before a code block")
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith(f["fence"]))
        info = f["info"].lower()
        lang = "python" if info in PYTHON else "shell" if info in SHELL else ""
        if lang:
            count[section] = count.get(section, 0) + 1
            mode, reason = (pending[0], pending[1]) if pending else ("run" if lang == "python" else "", "")
            blocks.append(Block(rel, i + 1, f"{rel}::{section}#{count[section]}", lang,
                                "\n".join(lines[i + 1:end]) + "\n", mode, reason))
        elif pending is not None:
            raise ValueError(f"{rel}:{pending[2]}: example markers apply to python and shell blocks only")
        pending = None
        i = end + 1
    return blocks


def all_blocks() -> list[Block]:
    return [b for f in doc_files() for b in parse(f)]


def _params():
    out = []
    for b in all_blocks():
        if b.lang == "shell" and not b.mode:
            continue
        marks = [pytest.mark.slow] if b.mode == "slow" else []
        out.append(pytest.param(b, id=b.name, marks=marks))
    return out


_passed: set[tuple[str, str]] = set()  # (lang, code) already run in this process: README repeats docs' examples


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A temporary working directory, caches and generated data inside it, and a `subquad` on PATH that runs this
    checkout (not whatever an environment installed)."""
    bin_dir = tmp_path / "_bin"
    bin_dir.mkdir()
    shim = bin_dir / "subquad"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m subquad "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("SUBQUAD_CACHE", str(tmp_path / "_cache"))
    monkeypatch.setenv("SUBQUAD_DATA", str(tmp_path / "_data"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    return work, env


@pytest.mark.parametrize("block", _params())
def test_example_runs(block: Block, sandbox):
    if block.mode == "skip":
        pytest.skip(f"{block.name}: {block.reason}")
    key = (block.lang, block.code)
    if key in _passed:
        return
    work, env = sandbox
    if block.lang == "python":
        import torch

        torch.manual_seed(0)
        code = compile(block.code, f"{block.file}:{block.line}", "exec")
        exec(code, {"__name__": "__docs_example__"})  # noqa: S102 - the documented example itself
    else:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=work, env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, f"{block.name} (line {block.line}) failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    _passed.add(key)


def test_collector_finds_the_examples():
    """The collector is not vacuous: the README's Python and CLI examples and the docs' blocks are all found."""
    blocks = all_blocks()
    readme = [b for b in blocks if b.file == "README.md"]
    assert any(b.lang == "python" and b.mode == "run" for b in readme)
    assert any(b.lang == "shell" and b.mode == "run" and "subquad train" in b.code for b in readme)
    assert sum(b.lang == "python" for b in blocks) >= 10
    skipped = [b for b in blocks if b.mode == "skip"]
    assert all(b.reason for b in skipped)


def test_markers_are_checked(tmp_path, monkeypatch):
    """A marker without a reason, or one that stands before prose, is an error, not a silently run block."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    bad = tmp_path / "bad.md"
    bad.write_text("<!-- example: skip -->\n```python\nx = 1\n```\n")
    with pytest.raises(ValueError, match="needs a reason"):
        parse(bad)
    bad.write_text("<!-- example: run -->\nsome prose\n```bash\ntrue\n```\n")
    with pytest.raises(ValueError, match="right before a code block"):
        parse(bad)
    good = tmp_path / "good.md"
    good.write_text("# T\n\n<!-- example: skip (needs data) -->\n```python\n1/0\n```\n\n```bash\nrm -rf x\n```\n"
                    "\n```python\ny = 2\n```\n")
    got = parse(good)
    assert [(b.name, b.lang, b.mode, b.reason) for b in got] == [
        ("good.md::t#1", "python", "skip", "needs data"), ("good.md::t#2", "shell", "", ""),
        ("good.md::t#3", "python", "run", "")]
