"""Parity of `mlla` (attention, block, MLLA-T) with the official code, LeapLabTHU/MLLA `models/mlla.py`, loaded by
file path from `<SUBQUAD_OFFICIAL_ROOT>/MLLA` (a checkout of that repository; skipped when absent).

Random official weights (every parameter and BatchNorm statistic perturbed) are loaded into ours through
`remap_official`; outputs agree at the float32 row of the tolerance table (the official RoPE computes in float32 only,
so there is no float64 parity). The official code needs square grids fixed at construction; those are the sizes
compared here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import subquad
from subquad.attention.mlla import MllaAttention
from subquad.models.mlla import MllaBlock, remap_official
from tests._official import load_module, quiet
from tests._tol import assert_close

pytestmark = pytest.mark.parity

_FILE = "MLLA/models/mlla.py"
_SIZES = {"mlla_tiny": (64, [2, 4, 8, 4], [2, 4, 8, 16]), "mlla_small": (64, [3, 6, 21, 6], [2, 4, 8, 16]),
          "mlla_base": (96, [3, 6, 21, 6], [3, 6, 12, 24])}


@pytest.fixture
def off(official_root):
    path = Path(official_root) / _FILE
    if not path.is_file():
        pytest.skip(f"{path} not found (SUBQUAD_OFFICIAL_ROOT must hold a LeapLabTHU/MLLA checkout named MLLA/)")
    return load_module(path, "_official_mlla")


@torch.no_grad()
def _randomise(m: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in m.parameters():
        p.add_(0.05 * torch.randn(p.shape, generator=g))
    for name, b in m.named_buffers():
        if name.endswith("running_mean"):
            b.copy_(0.1 * torch.randn(b.shape, generator=g))
        elif name.endswith("running_var"):
            b.copy_(0.5 + torch.rand(b.shape, generator=g))


def _build_official(off, name: str):
    dim, depths, heads = _SIZES[name]
    with quiet():
        return off.MLLA(img_size=224, embed_dim=dim, depths=depths, num_heads=heads, drop_path_rate=0.0)


def test_attention(off):
    torch.manual_seed(0)
    o = off.LinearAttention(dim=64, input_resolution=(7, 7), num_heads=4)
    _randomise(o)
    ours = MllaAttention(64, 4, input_size=(7, 7))
    ours.load_state_dict(remap_official(o.state_dict(), ours), strict=True)
    x = torch.randn(2, 49, 64)
    x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ref, out = o(x1), ours(x2, (7, 7))
    assert_close(out, ref, torch.float32, "attention output")
    cot = torch.randn_like(ref)
    ref.backward(cot)
    out.backward(cot)
    assert_close(x2.grad, x1.grad, torch.float32, "attention input gradient")
    for (n, p), (_, q) in zip(sorted(ours.named_parameters()), sorted(o.named_parameters())):
        assert_close(p.grad, q.grad, torch.float32, f"gradient of {n}")


def test_block(off):
    torch.manual_seed(1)
    o = off.MLLABlock(dim=64, input_resolution=(14, 14), num_heads=2)
    _randomise(o, 1)
    ours = MllaBlock(64, 2, (14, 14))
    ours.load_state_dict(remap_official(o.state_dict(), ours), strict=True)
    x = torch.randn(2, 196, 64)
    with torch.no_grad():
        assert_close(ours(x, (14, 14)), o(x), torch.float32, "block output")


def test_tiny_logits(off):
    torch.manual_seed(2)
    o = _build_official(off, "mlla_tiny").eval()
    _randomise(o, 2)
    ours = subquad.create_model("mlla_tiny").eval()
    ours.load_state_dict(remap_official({"model": o.state_dict()}, ours), strict=True)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        ref, out = o(x), ours(x)
    assert_close(out, ref, torch.float32, "MLLA-T logits")


@pytest.mark.parametrize("name", list(_SIZES))
def test_key_fixture_and_param_count_match_official(off, name):
    o = _build_official(off, name)
    fixture = json.loads((Path(__file__).resolve().parents[1] / "_fixtures" / "mlla_keys.json").read_text())
    assert {k: list(v.shape) for k, v in o.state_dict().items()} == fixture["models"][name]
    assert sum(p.numel() for p in o.parameters()) == subquad.models.CARDS[name].ref_params


def test_release_urls_are_the_readme_links(official_root):
    readme = (Path(official_root) / "MLLA" / "README.md")
    if not readme.is_file():
        pytest.skip(f"{readme} not found")
    import timm

    tags = timm.list_pretrained("mlla_*")
    assert sorted(tags) == ["mlla_base.in1k", "mlla_small.in1k", "mlla_tiny.in1k"]
    for t in tags:
        assert timm.models.get_pretrained_cfg(t).url in readme.read_text(), t
