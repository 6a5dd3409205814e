"""`import subquad` is plain: it registers every mechanism and model (timm's registry included), whatever was
imported before it, and leaves Python's import machinery as it found it; the command line parses without it."""

import subprocess
import sys

import pytest


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("code", ["import subquad, timm", "import timm, subquad", "import subquad.attention, timm",
                                  "from subquad.models import create_model; import timm"],
                         ids=["subquad-first", "timm-first", "a-subpackage", "a-name-from-a-subpackage"])
def test_import_registers_the_models(code):
    """However subquad is imported, its models are in timm's registry right after, and the import hooks are the
    ones Python started with."""
    r = _run("import sys; hooks = list(sys.meta_path); " + code + "; m = timm.create_model('l2vit_micro'); "
             "import subquad; assert 'flatten_swin_tiny' in subquad.list_models(); "
             "assert sys.meta_path == hooks, sys.meta_path")
    assert r.returncode == 0, r.stderr[-2000:]


def test_the_command_line_parses_without_the_library():
    """Building every parser (`subquad --help`, every subcommand's --help) imports neither subquad nor torch; the
    time it takes is held in tests/cli/test_cli.py."""
    r = _run("import sys; from subquad_cli.__main__ import build_parser; build_parser(); "
             "print(sorted(m for m in ('subquad', 'torch', 'timm') if m in sys.modules))")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", r.stdout
