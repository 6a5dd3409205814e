"""Every shipped dense recipe loads into DenseConfig, names a registered backbone and a valid kind, and builds."""

from __future__ import annotations

import pytest

from subquad.dense.engine import DEFAULT_KIND, _kind, lr_factor
from subquad_cli.config import load_yaml
from subquad_cli.denseconfig import CONFIG_DIRS, DenseConfig, merge_dense, shipped_dense_configs


@pytest.mark.parametrize("path", shipped_dense_configs(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_recipe_loads(path):
    import timm

    import subquad  # noqa: F401

    task = next(t for t, d in CONFIG_DIRS.items() if d == path.parent)
    cfg = merge_dense(DenseConfig(), load_yaml(path), origin=str(path))
    assert cfg.model in timm.list_models()
    assert _kind(cfg, task) in ({"maskrcnn", "fasterrcnn", "retinanet"} if task == "detect" else
                                {"semantic_fpn", "upernet"})
    if path.name != "synthetic.yaml":
        text = path.read_text()
        assert "Table" in text and "§" in text, "a paper recipe cites its table and section"


def test_every_folder_has_recipes():
    names = {p.name for p in shipped_dense_configs()}
    assert {"synthetic.yaml", "maskrcnn_1x_l2vit_tiny.yaml", "upernet_160k_l2vit_tiny.yaml"} <= names
    assert set(DEFAULT_KIND) == set(CONFIG_DIRS)


def test_lr_schedule():
    cfg = DenseConfig(lr=1.0, warmup_iters=10, warmup_ratio=0.1, sched="step", lr_steps=[8, 11], lr_gamma=0.1)
    ipe = 100
    assert lr_factor(cfg, 0, 1200, ipe) == pytest.approx(0.1)
    assert lr_factor(cfg, 5, 1200, ipe) == pytest.approx(0.55)
    assert lr_factor(cfg, 799, 1200, ipe) == pytest.approx(1.0)
    assert lr_factor(cfg, 800, 1200, ipe) == pytest.approx(0.1)
    assert lr_factor(cfg, 1100, 1200, ipe) == pytest.approx(0.01)
    poly = DenseConfig(lr=1.0, warmup_iters=0, sched="poly", poly_power=0.9, min_lr=0.0)
    assert lr_factor(poly, 500, 1000, ipe) == pytest.approx(0.5 ** 0.9)
