"""Parity of InLine attention and the InLine-DeiT / -PVT / -Swin / -CSwin Tiny models with the official code
(LeapLabTHU/InLine, loaded by file path from SUBQUAD_OFFICIAL_ROOT/InLine): random official weights are loaded into
ours through the family's `remap_official`, and the fp32 logits must agree within the fp32 row of the tolerance
table. Also: the committed key-name fixtures equal the official classes' state dicts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import subquad
from subquad.attention.inline import InLineAttention
from tests._official_inline import INLINE_NAMES, build_official_inline, load_inline
from tests._tol import assert_close

pytestmark = pytest.mark.parity

FIXTURES = Path(__file__).resolve().parents[1] / "_fixtures"
TINY = ["inline_deit_tiny", "inline_pvt_tiny", "inline_swin_tiny", "inline_cswin_tiny"]


def _randomise(sd: dict[str, torch.Tensor], seed: int = 0) -> dict[str, torch.Tensor]:
    """Random values for every float parameter (norm weights around 1); buffers (Swin masks, indices) kept."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in sd.items():
        if v.is_floating_point() and not k.endswith("attn_mask"):
            v = torch.randn(v.shape, generator=g) * 0.05 + (1.0 if "norm" in k and k.endswith("weight") else 0.0)
        out[k] = v
    return out


def _parity(official_root: str, name: str, size: int, **ours_kw) -> float:
    off = build_official_inline(official_root, name, **ours_kw.pop("official_kw", {})).eval()
    off.load_state_dict(_randomise(off.state_dict()))
    ours = subquad.create_model(name, **ours_kw).eval()
    remap = sys.modules[f"subquad.models.{name.rsplit('_', 1)[0]}"].remap_official
    ours.load_state_dict(remap({"model": off.state_dict()}, ours), strict=True)
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = off(x), ours(x)
    assert_close(got, want.double(), torch.float32, f"{name} logits")
    return ((got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt()).item()


@pytest.mark.parametrize("name", TINY)
def test_tiny_logits_match_official(official_root, name):
    _parity(official_root, name, 224)


def test_swin_mixed_stage_matches_official(official_root):
    """InLine-Swin-B's mixed stage 3 (`IIMS2`: 2 InLine blocks, then shifted 7 x 7 windows) on a narrow model."""
    kw = dict(embed_dim=32, depths=(1, 1, 6, 1), num_heads=(1, 2, 4, 8))
    mod = load_inline(official_root, "inline_swin")
    from tests._official import quiet

    with quiet():
        off = mod.InLineSwin(img_size=224, window_size=56, attn_type="IIMS2", num_classes=10,
                             **{k: list(v) if isinstance(v, tuple) else v for k, v in kw.items()}).eval()
    off.load_state_dict(_randomise(off.state_dict()))
    ours = subquad.create_model("inline_swin_micro", img_size=224, window_size=7, mlp_ratio=4.0, num_classes=10,
                                attn=("inline", "inline", ("inline",) * 2 + ("window",) * 4, "window"), **kw).eval()
    ours.load_state_dict(subquad.models.inline_swin.remap_official({"model": off.state_dict()}, ours), strict=True)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        assert_close(ours(x), off(x).double(), torch.float32, "logits")


@pytest.mark.parametrize("kernel", ["identity", "relu", "leakyrelu", "exp"])
def test_attention_module_matches_official(official_root, kernel):
    """Our InLineAttention vs the official Swin-file module (the one with `kernel_func`), float64, on one window."""
    mod = load_inline(official_root, "inline_swin")
    off = mod.InLineAttention(32, window_size=(6, 6), num_heads=4, kernel_func=kernel).double().eval()
    ours = InLineAttention(32, 4, kernel_func=kernel).double().eval()
    ours.load_state_dict(off.state_dict(), strict=True)
    x = torch.randn(3, 36, 32, dtype=torch.float64)
    with torch.no_grad():
        assert_close(ours(x, (6, 6)), off(x), torch.float64, f"{kernel} output")


@pytest.mark.parametrize("name", INLINE_NAMES)
def test_fixture_matches_official(official_root, name):
    fam = name.rsplit("_", 1)[0]
    want = json.loads((FIXTURES / f"{fam}_keys.json").read_text())["models"][name]
    off = build_official_inline(official_root, name)
    assert {k: list(v.shape) for k, v in off.state_dict().items()} == want
