"""Official weights by name: `pretrained=True` / a tag resolves the official release through timm's pretrained cfg.

Offline nothing downloads, so the same code path is tested with a local file (`pretrained_cfg_overlay=dict(file=)`)
holding a state dict in the official key layout (the fixtures of test_remap.py), wrapped as the official files are.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import timm
import torch

import subquad

from .test_remap import random_state_dict, through_remap

FIXTURES = Path(__file__).resolve().parents[1] / "_fixtures"


def _official_keys(name: str) -> dict[str, list[int]]:
    for f in FIXTURES.glob("*_keys.json"):
        d = json.loads(f.read_text())
        if name in d.get("models", {}):
            return d["models"][name]
        if f.name == f"{name}_keys.json":
            return d["keys"]
    raise KeyError(name)


# (tag, official wrapper key, build on CPU to compare values)
RELEASES = [("l2vit_tiny.in1k", "model_ema", False), ("flatten_pvt_tiny.in1k", "model", False),
            ("flatten_pvt_v2_b0.in1k", "model", True), ("flatten_swin_tiny.in1k", "model", False),
            ("flatten_cswin_tiny.in1k", "state_dict_ema", False), ("vil_ls_medium.in1k", "net", False)]


@pytest.mark.parametrize("tag,wrapper,real", RELEASES)
def test_release_by_name_through_local_file(tmp_path, tag, wrapper, real):
    name = tag.split(".")[0]
    sd = random_state_dict(_official_keys(name))
    path = tmp_path / "official.pth"
    torch.save({wrapper: sd, "epoch": 299}, path)
    cfg = timm.models.get_pretrained_cfg(tag)
    assert cfg.url.startswith("https://") and "top-1" in cfg.notes
    m = timm.create_model(tag, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)),
                          device=None if real else "meta")
    assert m.pretrained_cfg["tag"] == tag.split(".")[1]
    own = m.state_dict()
    expected = through_remap(sd, m)  # official names -> ours (e.g. PVT's q + kv -> qkv)
    assert set(own) == set(expected)
    if real:
        for k, v in own.items():
            assert torch.equal(v, expected[k]), k


def test_release_new_head_keeps_backbone(tmp_path):
    sd = random_state_dict(_official_keys("flatten_pvt_v2_b0"))
    path = tmp_path / "b0.pth"
    torch.save({"model": sd}, path)
    m = timm.create_model("flatten_pvt_v2_b0.in1k", pretrained=True, num_classes=7,
                          pretrained_cfg_overlay=dict(file=str(path)))
    assert m.head.weight.shape == (7, 256)
    assert torch.equal(m.state_dict()["patch_embed1.proj.weight"], sd["patch_embed1.proj.weight"])
    f = timm.create_model("flatten_pvt_v2_b0.in1k", pretrained=True, features_only=True,
                          pretrained_cfg_overlay=dict(file=str(path)))
    assert torch.equal(f.model.state_dict()["patch_embed1.proj.weight"], sd["patch_embed1.proj.weight"])


def test_every_release_is_an_official_link():
    tags = [t for t in timm.list_pretrained() if subquad.models.is_subquad_model(t)]
    assert len(tags) >= 13
    hosts = ("https://github.com/ChuanyangZheng/L2ViT/releases/download/", "https://cloud.tsinghua.edu.cn/f/",
             "https://www.dropbox.com/s/")
    for t in tags:
        url = timm.models.get_pretrained_cfg(t).url
        assert url.startswith(hosts), (t, url)


def test_no_release_says_so():
    with pytest.raises(ValueError, match=r"flatten_pvt_small: no released weights exist") as e:
        subquad.create_model("flatten_pvt_small", pretrained=True, device="meta")
    assert "\n" not in str(e.value)


@pytest.mark.parity
def test_release_urls_are_the_readme_links(official_root):
    """Every release URL appears in the official README it comes from (`?dl=1` added to Dropbox links)."""
    files = ("L2ViT/readme.md", "FLatten-Transformer/README.md", "transformer-ls/imagenet/README.md", "MLLA/README.md")
    readmes = "".join((Path(official_root) / p).read_text() for p in files)
    for t in [t for t in timm.list_pretrained() if subquad.models.is_subquad_model(t)]:
        url = timm.models.get_pretrained_cfg(t).url
        link = url.replace("model_best.pth?dl=1", "model_best.pth") if "dropbox" in url else url
        assert link in readmes, (t, url)
