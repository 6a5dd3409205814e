"""Parity of `polarity` and the Pola-Swin / Pola-PVT models with the official PolaFormer code (loaded by file path).

Needs SUBQUAD_OFFICIAL_ROOT with a `PolaFormer/` checkout (ZacharyMeng/PolaFormer). Random official weights (the
zero-initialised `power`, `scale` and `positional_encoding` drawn at random too) are loaded into ours through the
family's `remap_official`; logits must agree to fp32 tolerance.
"""

from __future__ import annotations

import sys

import pytest
import torch

import subquad
from subquad.attention.polarity import PolarityLinearAttention, remap_qg_kv
from tests._official import build_official, load_pola
from tests._tol import assert_close, rel_rms

pytestmark = pytest.mark.parity


def _randomise(model: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(("power", "scale", "positional_encoding")):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif n.endswith("bias") or "norm" in n or "relative_position_bias_table" in n:
                p.add_(torch.randn(p.shape, generator=g) * 0.02)


def test_attention_swin_form(official_root):
    o = load_pola(official_root, "pola_swin").PolaLinearAttention(96, (14, 14), 3)
    o.train(False)  # the official module overrides eval() (it prints and returns None)
    _randomise(o)
    ours = PolarityLinearAttention(96, 3, input_size=(14, 14)).eval()
    ours.load_state_dict(o.state_dict(), strict=True)
    x = torch.randn(2, 196, 96)
    with torch.no_grad():
        assert_close(ours(x, (14, 14)), o(x, 14, 14), torch.float32, "polarity (swin form) vs official")


def test_attention_pvt_form(official_root):
    o = load_pola(official_root, "pola_pvt").PolaLinearAttention(64, 12 * 12, 2, qkv_bias=True).eval()
    _randomise(o)
    ours = torch.nn.Sequential(PolarityLinearAttention(64, 2, input_size=(12, 12))).eval()
    # official qg ([q; g]) + kv ([k; v]) -> our qkvg
    ours.load_state_dict(remap_qg_kv({f"0.{k}": v for k, v in o.state_dict().items()}, ours), strict=True)
    ours = ours[0]
    x = torch.randn(2, 144, 64)
    with torch.no_grad():
        assert_close(ours(x, (12, 12)), o(x, 12, 12), torch.float32, "polarity (pvt form) vs official")


@pytest.mark.parametrize("name", ["pola_swin_tiny", "pola_pvt_tiny"])
def test_model_logits(official_root, name):
    torch.manual_seed(0)
    off = build_official(official_root, name).eval()
    _randomise(off)
    ours = subquad.create_model(name).eval()
    remap = sys.modules[f"subquad.models.{name.rsplit('_', 1)[0]}"].remap_official  # the family's checkpoint filter
    ours.load_state_dict(remap({"model": off.state_dict()}, ours), strict=True)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        a, b = ours(x), off(x)
    err = rel_rms(a, b)
    print(f"{name}: logits fp32 relative error {err:.3e}")
    assert err < 1e-5, f"{name}: logits relative error {err:.3e}"
