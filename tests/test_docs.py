"""The documentation site builds with `mkdocs build --strict` (broken links, missing pages or unresolved API
references fail), and the docs extra carries what the build needs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as pip vendors it
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_docs_build_strict(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    site = tmp_path / "site"
    for page in ("index.html", "models/index.html", "mechanisms/index.html", "api/models/index.html",
                 "api/attention/index.html", "deviations/index.html"):
        assert (site / page).is_file(), page
    api = (site / "api/models/index.html").read_text()
    assert "create_model" in api and "checkpoint_path" in api  # the docstring was rendered, not just the name
    zoo = (site / "models/index.html").read_text()
    assert "l2vit_tiny.in1k" in zoo and "pretrained=True" in zoo


def test_docs_extra_has_the_build_tools():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {d.split(">")[0].split("[")[0].split("=")[0].strip() for d in extras["docs"]}
    assert {"mkdocs", "mkdocs-material", "mkdocstrings"} <= names
    dev = {d.split(">")[0].split("[")[0].split("=")[0].strip() for d in extras["dev"]}
    assert names <= dev, "the dev extra (make test) must install what tests/test_docs.py builds with"
