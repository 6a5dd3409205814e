import subprocess
import sys


def test_import_with_warnings_as_errors_and_timm_registration():
    code = "import subquad, timm; m = timm.create_model('vit_attn_micro'); print(len(subquad.list_models()))"
    r = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
