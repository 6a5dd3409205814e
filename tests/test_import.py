import subprocess
import sys

import pytest


def test_import_with_warnings_as_errors_and_timm_registration():
    code = "import subquad, timm; m = timm.create_model('vit_attn_micro'); print(len(subquad.list_models()))"
    r = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("argv0", ["", "import sys; sys.argv[0] = 'subquad'; "], ids=["script", "command-argv"])
def test_import_is_light_whatever_the_command_line(argv0):
    """`import subquad` imports neither torch nor timm, in a script and where argv looks like the `subquad` command's
    (both imported the same way)."""
    r = _run(argv0 + "import sys, subquad; print(sorted(m for m in ('torch', 'timm') if m in sys.modules))")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", r.stdout


@pytest.mark.parametrize("code", ["import subquad; subquad.create_model('vit_attn_micro'); import timm",
                                  "import timm, subquad",
                                  "from subquad.attention import build_attention; import timm"],
                         ids=["public-name", "timm-first", "timm-inside-a-subquad-import"])
def test_library_loads_on_first_use_or_with_timm(code):
    """The library loads on a public name, on `import timm` before or after subquad, and after a subquad module whose
    import brought timm in; each way, subquad's models are in timm's registry and the import hook is gone."""
    r = _run(code + "; m = timm.create_model('l2vit_micro'); import subquad, sys; "
             "assert subquad._loaded and not any(type(f).__name__ == '_TimmHook' for f in sys.meta_path)")
    assert r.returncode == 0, r.stderr[-2000:]
