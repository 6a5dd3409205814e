"""Official checkpoint loading: key-layout fixtures (names + shapes of the official classes), remap, strict load.

The fixtures `tests/_fixtures/{l2vit,flatten_pvt,flatten_pvt_v2}_keys.json` list `state_dict()` of the official
classes; a random state dict in that layout, wrapped as the official files wrap it, must load strictly through
`create_model(name, checkpoint_path=...)`. The `parity` test regenerates the lists from the official code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import subquad
from tests._official import build_official

FIXTURES = Path(__file__).resolve().parents[1] / "_fixtures"
FAMILIES = {"l2vit": "l2vit_keys.json", "flatten_pvt": "flatten_pvt_keys.json",
            "flatten_pvt_v2": "flatten_pvt_v2_keys.json"}
# Full-size models built on CPU in the default run (values checked); the others load on meta (names and shapes).
REAL = {"flatten_pvt_v2_b0"}


def fixture(family: str) -> dict[str, dict[str, list[int]]]:
    return json.loads((FIXTURES / FAMILIES[family]).read_text())["models"]


def random_state_dict(keys: dict[str, list[int]], seed: int = 0) -> dict[str, torch.Tensor]:
    """One random value per key, expanded to the fixture's shape (a small file that still tells keys apart);
    BN variances positive, counters int64."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for k, shape in keys.items():
        if k.endswith("num_batches_tracked"):
            sd[k] = torch.tensor(7, dtype=torch.int64)
        else:
            v = torch.rand(1, generator=g) + 0.5 if k.endswith("running_var") else torch.randn(1, generator=g)
            sd[k] = v.reshape([1] * len(shape)).expand(shape) if shape else v.reshape(())
    return sd


CASES = [(fam, name) for fam in FAMILIES for name in fixture(fam)]


def through_remap(sd: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What the family's checkpoint filter (`remap_official`) makes of an official-layout state dict."""
    return sys.modules[type(model).__module__].remap_official(dict(sd), model)


def folded_keys(official: set[str], own: set[str]) -> set[str]:
    """Official keys our one-name-set modules fold into another parameter: PVT's `q` + `kv` -> `qkv`."""
    out = set()
    for k in official - own:
        parts = k.rsplit(".", 2)
        if len(parts) == 3 and parts[1] in ("q", "kv") and f"{parts[0]}.qkv.{parts[2]}" in own:
            out.add(k)
    return out


def _check_load(tmp_path, family: str, name: str, wrapper: str, device) -> None:
    keys = fixture(family)[name]
    sd = random_state_dict(keys)
    path = tmp_path / "official.pth"
    torch.save({wrapper: sd, "epoch": 299}, path)
    m = subquad.create_model(name, checkpoint_path=str(path), device=device)
    own = m.state_dict()
    expected = through_remap(sd, m)
    assert set(own) == set(expected)
    dropped = set(keys) - set(own) - folded_keys(set(keys), set(own))
    # Only the unused FLatten-PVT final norm is dropped (spec flatten.md 5.2); nothing is left unloaded.
    assert dropped <= {"norm.weight", "norm.bias"} and (not dropped or family == "flatten_pvt"), dropped
    assert set(own) - set(keys) == {k for k in own if k.endswith((".qkv.weight", ".qkv.bias"))} - set(keys)
    if device is None:
        for k, v in own.items():
            assert torch.equal(v, expected[k]), k


@pytest.mark.parametrize("family,name", CASES)
def test_official_layout_loads_strictly(tmp_path, family, name):
    _check_load(tmp_path, family, name, "model", None if name in REAL else "meta")


@pytest.mark.parametrize("wrapper", ["model_ema", "state_dict", "module"])
def test_official_wrappers(tmp_path, wrapper):
    _check_load(tmp_path, "flatten_pvt_v2", "flatten_pvt_v2_b0", wrapper, "meta")


@pytest.mark.slow
def test_l2vit_tiny_values_load(tmp_path):
    _check_load(tmp_path, "l2vit", "l2vit_tiny", "model_ema", None)


def test_other_architecture_one_line_error(tmp_path):
    sd = random_state_dict(fixture("l2vit")["l2vit_tiny"])
    path = tmp_path / "l2vit.pth"
    torch.save({"model": sd}, path)
    with pytest.raises(ValueError, match="does not fit model 'flatten_pvt_v2_b0'") as e:
        subquad.create_model("flatten_pvt_v2_b0", checkpoint_path=str(path), device="meta")
    msg = str(e.value)
    assert "\n" not in msg and "missing key" in msg and "unexpected key" in msg


def test_wrong_shapes_named(tmp_path):
    sd = random_state_dict(fixture("l2vit")["l2vit_tiny"])
    path = tmp_path / "l2vit_t.pth"
    torch.save({"model": sd}, path)
    with pytest.raises(ValueError, match=r"shape mismatch.*checkpoint \(") as e:
        subquad.create_model("l2vit_small", checkpoint_path=str(path), device="meta", depths=(2, 2, 6, 2),
                             dims=(128, 256, 512, 1024), num_heads=(4, 8, 16, 32))
    assert "l2vit_small" in str(e.value)


@pytest.mark.parametrize("name,size", [("flatten_pvt_micro", 48), ("flatten_pvt_v2_micro", 40),
                                       ("flatten_deit_micro", 48)])
def test_resized_load_equals_runtime_resize(name, size):
    """A checkpoint loaded into a model built at another size (tables resized by remap_official) gives the same
    logits as the source model run at that size (tables resized at run time)."""
    src = subquad.create_model(name, num_classes=5).eval()
    with torch.no_grad():
        for n, p in src.named_parameters():
            if n.endswith(("positional_encoding", "scale")) or "pos_embed" in n:
                p.normal_(0, 0.3)
    dst = subquad.create_model(name, num_classes=5, img_size=size).eval()
    remap = sys.modules[f"subquad.models.{name[: -len('_micro')]}"].remap_official
    dst.load_state_dict(remap({"model": src.state_dict()}, dst), strict=True)
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        torch.testing.assert_close(dst(x), src(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parity
@pytest.mark.parametrize("family,name", CASES)
def test_fixture_matches_official(official_root, family, name):
    off = build_official(official_root, name)
    assert {k: list(v.shape) for k, v in off.state_dict().items()} == fixture(family)[name]


def test_pretrained_cfg_overlay_route(tmp_path):
    """timm's own loading path (`pretrained_cfg_overlay=dict(file=...)`) applies remap_official as its filter."""
    sd = random_state_dict(fixture("flatten_pvt")["flatten_pvt_tiny"])
    path = tmp_path / "flatten_pvt_t.pth"
    torch.save({"model": sd}, path)
    m = subquad.create_model("flatten_pvt_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))
    own = m.state_dict()
    assert "norm.weight" not in own
    for k in ("patch_embed1.proj.weight", "block3.1.attn.positional_encoding", "head.bias"):
        assert torch.equal(own[k], sd[k]), k
