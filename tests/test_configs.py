"""Every shipped recipe YAML loads into TrainConfig, builds its own model (on the meta device, with the recipe's
model options) and drives `subquad train --dry-run` on a tiny model."""

from __future__ import annotations

import pytest
import yaml

import subquad
from subquad.engine.modelbuild import build_model
from subquad_cli.__main__ import main
from subquad_cli.config import load_yaml, shipped_configs
from subquad_cli.runconfig import TrainConfig, merge_config

CONFIGS = shipped_configs()


def test_configs_are_shipped():
    names = {p.parent.name for p in CONFIGS}
    assert names == {"imagenet", "fmnist", "kinetics400"}, CONFIGS


IMAGE_CONFIGS = [p for p in CONFIGS if p.parent.name != "kinetics400"]
VIDEO_CONFIGS = [p for p in CONFIGS if p.parent.name == "kinetics400"]


@pytest.mark.parametrize("path", IMAGE_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_config_loads_and_dry_runs(path, capsys):
    data = load_yaml(path)
    cfg = merge_config(TrainConfig(), data, origin=str(path))
    assert cfg.model == data["model"] and path.stem == cfg.model
    assert main(["train", "-c", str(path), "--model", "vit_attn_micro", "--data", "digits", "--img-size", "16",
                 "--workers", "0", "--device", "cpu", "--dry-run"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out.split("dry run:")[0])
    for k, v in data.items():
        if k not in ("model", "data", "img_size", "workers"):
            assert printed[k] == v, k
    _builds_its_model(cfg)


def _builds_its_model(cfg: TrainConfig) -> None:
    """The recipe's own model, with the recipe's sizes and options, builds (on the meta device: no weights)."""
    assert cfg.model in subquad.list_models(), f"recipe model {cfg.model!r} is not registered"
    kw = {**(cfg.model_kwargs or {}), "device": "meta"}
    if cfg.num_frames is not None:
        kw["num_frames"] = cfg.num_frames
    m = build_model(cfg.model, cfg.num_classes or 1000, cfg.img_size, cfg.drop_path, cfg.drop, "meta", kw)
    assert m.pretrained_cfg["architecture"] == cfg.model and next(m.parameters()).is_meta


def test_a_recipe_with_an_unknown_model_fails():
    with pytest.raises(AssertionError, match="not registered"):
        _builds_its_model(TrainConfig(model="l2vit_tinyy"))


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    from subquad.data.video import generate_moving_squares

    root = tmp_path_factory.mktemp("k400")
    generate_moving_squares(root, n_train=4, n_val=2, n_test=2, frames=8, size=32, seed=0)
    return root


@pytest.mark.parametrize("path", VIDEO_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_video_config_loads_and_dry_runs(path, clips, capsys):
    """The Kinetics-400 recipes (UniFormer's settings) drive `subquad train --dry-run` on generated clips and a
    micro video model; every recipe value reaches the run's configuration."""
    data = load_yaml(path)
    cfg = merge_config(TrainConfig(), data, origin=str(path))
    assert cfg.model == path.stem and cfg.model in subquad.list_models()
    assert (cfg.num_frames, cfg.frame_stride, cfg.img_size) == (16, 4, 224)
    assert main(["train", "-c", str(path), "--model", "hylisanet_micro_video", "--data", f"video:{clips}",
                 "--img-size", "32", "--num-frames", "4", "--frame-stride", "1", "--batch-size", "2",
                 "--workers", "0", "--device", "cpu", "--dry-run"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out.split("dry run:")[0])
    for k, v in data.items():
        if k not in ("model", "data", "img_size", "workers", "num_frames", "frame_stride", "batch_size"):
            assert printed[k] == v, k
    _builds_its_model(cfg)
