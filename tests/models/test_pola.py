"""Pola-Swin and Pola-PVT: the registered variants, the official key layout through `remap_official` (fixtures of
the official classes' `state_dict()` names and shapes), resized loads and the hosts' `attn=` keyword."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import timm
import torch

import subquad
from subquad.attention.polarity import PolarityLinearAttention
from subquad.models._card import CARDS
from tests._official import build_official

FIXTURES = Path(__file__).resolve().parents[1] / "_fixtures"
FAMILIES = {"pola_pvt": "pola_pvt_tiny", "pola_swin": "pola_swin_tiny"}


def fixture(family: str) -> dict[str, dict[str, list[int]]]:
    return json.loads((FIXTURES / f"{family}_keys.json").read_text())["models"]


def test_official_readme_variants_in_timm():
    assert timm.list_models("pola_swin_*") == ["pola_swin_base", "pola_swin_micro", "pola_swin_small",
                                              "pola_swin_tiny"]
    assert timm.list_models("pola_pvt_*") == ["pola_pvt_micro", "pola_pvt_small", "pola_pvt_tiny"]
    assert {n: CARDS[n].top1 for n in timm.list_models("pola_*") if "micro" not in n} == {
        "pola_pvt_small": 81.9, "pola_pvt_tiny": 78.8, "pola_swin_base": 83.8, "pola_swin_small": 83.6,
        "pola_swin_tiny": 82.6}


@pytest.mark.parametrize("name", ["pola_swin_tiny", "pola_pvt_tiny"])
def test_stage_mechanisms(name):
    m = subquad.create_model(name, device="meta")
    want = ("polarity",) * 4 if "pvt" in name else ("polarity", "polarity", "window", "window")
    assert m.attn_names == want
    polas = [a for a in m.modules() if isinstance(a, PolarityLinearAttention)]
    assert polas and all(a.alpha == 4.0 and a.dwc.kernel_size == (5, 5) for a in polas)
    # the 'L' stages attend over the whole stage grid at 224 (official window 56 / the PVT stage grid)
    assert polas[0].pe_hw == (56, 56)


def _random_official(keys: dict[str, list[int]], seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(shape, generator=g) * 0.02 for k, shape in keys.items()}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_official_layout_loads_strictly(tmp_path, family):
    name = FAMILIES[family]
    sd = _random_official(fixture(family)[name])
    path = tmp_path / "official.pth"
    torch.save({"model": sd, "epoch": 299}, path)
    m = subquad.create_model(name, checkpoint_path=str(path))
    own = m.state_dict()
    dropped = set(sd) - set(own)
    if family == "pola_pvt":
        # the unused final norm, and every attention's qg / kv (folded into qkvg)
        folded = {k for k in sd if k.endswith((".qg.weight", ".qg.bias", ".kv.weight", ".kv.bias"))}
        assert folded and dropped == {"norm.weight", "norm.bias"} | folded
        qg, kv = sd["block2.1.attn.qg.weight"], sd["block2.1.attn.kv.weight"]
        assert torch.equal(own["block2.1.attn.qkvg.weight"], torch.cat([qg[:128], kv, qg[128:]]))
    else:
        assert {k.rsplit(".", 1)[-1] for k in dropped} <= {"relative_position_index", "attn_mask"}
    for k in set(own) & set(sd):
        assert torch.equal(own[k], sd[k]), k


@pytest.mark.parametrize("name,size", [("pola_pvt_micro", 48), ("pola_swin_micro", 96)])
def test_resized_load_equals_runtime_resize(name, size):
    """A checkpoint loaded into a model built at another size (PE tables resized by remap_official) gives the
    same logits as the source model run at that size (PE resized at run time). Swin: polarity in every stage (the
    'S' windows are clipped to the construction grid, which changes the model itself)."""
    kw = dict(num_classes=5, attn="polarity") if "swin" in name else dict(num_classes=5)
    src = subquad.create_model(name, **kw).eval()
    with torch.no_grad():
        for n, p in src.named_parameters():
            if n.endswith(("positional_encoding", "scale", "power")) or "pos_embed" in n:
                p.normal_(0, 0.3)
    dst = subquad.create_model(name, img_size=size, **kw).eval()
    remap = sys.modules[f"subquad.models.{name[: -len('_micro')]}"].remap_official
    dst.load_state_dict(remap({"model": src.state_dict()}, dst), strict=True)
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        torch.testing.assert_close(dst(x), src(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["pola_pvt_micro", "pola_swin_micro"])
def test_non_square_image(name):
    m = subquad.create_model(name, num_classes=3).eval()
    with torch.no_grad():
        y = m(torch.randn(1, 3, 48, 80))
    assert y.shape == (1, 3) and torch.isfinite(y).all()


@pytest.mark.parity
@pytest.mark.parametrize("family", list(FAMILIES))
def test_fixture_matches_official(official_root, family):
    off = build_official(official_root, FAMILIES[family])
    assert {k: list(v.shape) for k, v in off.state_dict().items()} == fixture(family)[FAMILIES[family]]
