"""Every shipped recipe YAML loads into TrainConfig and drives `subquad train --dry-run` on a tiny model."""

from __future__ import annotations

import pytest
import yaml

import subquad
from subquad.cli.__main__ import main
from subquad.cli.config import load_yaml, shipped_configs
from subquad.engine.config import TrainConfig, merge_config

CONFIGS = shipped_configs()


def test_configs_are_shipped():
    names = {p.parent.name for p in CONFIGS}
    assert names == {"imagenet", "fmnist"}, CONFIGS


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
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
    if cfg.model not in subquad.list_models():
        pytest.skip(f"recipe model {cfg.model!r} is not registered yet")
