"""`DenseConfig`: the one typed source of truth for `subquad detect` and `subquad segment`.

Recipe YAMLs (subquad/configs/coco/, subquad/configs/ade20k/) may set only these fields; the CLI builds its flags
from them (`subquad_cli.detect`). Precedence: dataclass defaults < the task's synthetic demo recipe (when --data is
`synthetic` and no --config is given) < `--config FILE.yaml` < explicit flags; with --resume DIR, the run's args.yaml
is the base and a setting that would change the run is refused.

This module imports no torch, so building the command-line parser stays cheap.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .recipes import CONFIG_ROOT, find_config, load_yaml
from .runconfig import _f, apply_layers, merge_config, resume_run

__all__ = ["DenseConfig", "dense_fields", "merge_dense", "resolve_dense_config",
           "DEMO_RECIPES", "CONFIG_DIRS", "shipped_dense_configs"]

# Task -> the recipe folder, and the demo recipe the synthetic data uses by default.
CONFIG_DIRS = {"detect": CONFIG_ROOT / "coco", "segment": CONFIG_ROOT / "ade20k"}
DEMO_RECIPES = {task: d / "synthetic.yaml" for task, d in CONFIG_DIRS.items()}


@dataclass
class DenseConfig:
    """Detection / segmentation options (timm train.py names where they exist; mmdetection's for the schedule)."""

    kind: str = _f("", "detector (maskrcnn, fasterrcnn, retinanet) or segmenter (semantic_fpn, upernet); default "
                   "maskrcnn / upernet")
    model: str = _f("l2vit_micro", "backbone: any registered model with features_only (hierarchical)")
    data: str = _f("synthetic", "data: synthetic (generated, offline), coco:ROOT (detect), ade20k:ROOT (segment)")
    num_classes: int | None = _f(None, "object / pixel classes (default: the data's)")
    pretrained: bool = _f(False, "load the backbone's pretrained weights through timm (a local file in its cfg)")
    backbone_checkpoint: str = _f("", "initialise the backbone from this classification checkpoint (.safetensors)")
    out_indices: list[float] | None = _f(None, "backbone stages feeding the heads (default: all)")
    drop_path: float | None = _f(None, "backbone stochastic depth rate (default: the model's)")
    min_size: list[float] = _f([800], "detect: short side(s) of the input; several = multi-scale training (one per "
                               "batch), evaluation uses the last")
    max_size: int = _f(1333, "detect: cap on the long side")
    scale: list[float] = _f([512, 2048], "segment: (short, long) resize target before the ratio jitter; evaluation "
                            "resizes to it")
    ratio_range: list[float] = _f([0.5, 2.0], "segment: random rescale range of training")
    crop_size: list[float] = _f([512, 512], "segment: training crop (H W)")
    hflip: float = _f(0.5, "horizontal flip probability")
    photometric: bool = _f(False, "segment: random photometric distortion (mmsegmentation's PhotoMetricDistortion)")
    fpn_channels: int = _f(256, "FPN width")
    representation_size: int = _f(1024, "detect: R-CNN box-head width")
    mask_head_channels: int = _f(256, "detect: Mask R-CNN mask-head width")
    head_channels: int | None = _f(None, "segment: decode-head width (default 128 semantic_fpn, 512 upernet)")
    aux_weight: float = _f(0.4, "segment: auxiliary-head loss weight (upernet)")
    rpn_batch_size_per_image: int = _f(256, "detect: anchors sampled per image for the RPN loss")
    box_batch_size_per_image: int = _f(512, "detect: proposals sampled per image for the box loss")
    rpn_proposals: int | None = _f(None, "detect: R-CNN proposals per image before and after NMS (default: "
                                   "torchvision's 2000 training / 1000 inference)")
    anchor_scale: float | None = _f(None, "detect: anchor side in strides (default 8 R-CNN, 4 RetinaNet)")
    score_thresh: float | None = _f(None, "detect: minimum score kept at inference (default: torchvision's 0.05)")
    batch_size: int = _f(2, "images per process and step", short="-b")
    epochs: int = _f(12, "training epochs (the 1x schedule is 12)")
    max_iters: int = _f(0, "train exactly this many iterations instead (ADE20K recipes: 80k / 160k; 0: use epochs)")
    opt: str = _f("adamw", "optimizer: adamw or sgd", choices=("adamw", "sgd"))
    lr: float = _f(1e-4, "peak learning rate (for the global batch of this run)")
    weight_decay: float = _f(0.05, "weight decay (norms, biases, position embeddings and RPB tables excluded)")
    momentum: float = _f(0.9, "SGD momentum")
    opt_betas: list[float] | None = _f(None, "AdamW betas (default 0.9 0.999)")
    backbone_lr_mult: float = _f(1.0, "learning-rate multiplier of the backbone")
    sched: str = _f("step", "schedule: step (lr_steps), poly or cosine", choices=("step", "poly", "cosine"))
    lr_steps: list[float] = _f([8, 11], "step schedule: epochs (or fractions of max_iters when below 1) at which the "
                               "rate drops by lr_gamma")
    lr_gamma: float = _f(0.1, "step schedule factor")
    poly_power: float = _f(1.0, "poly schedule power")
    min_lr: float = _f(0.0, "final learning rate of poly / cosine")
    warmup_iters: int = _f(500, "linear warm-up iterations")
    warmup_ratio: float = _f(0.001, "learning-rate factor at the start of warm-up")
    clip_grad: float | None = _f(None, "gradient-norm clipping (off when unset)")
    amp: bool = _f(False, "mixed precision (autocast)")
    amp_dtype: str = _f("bfloat16", "autocast dtype", choices=("float16", "bfloat16"))
    workers: int = _f(0, "data-loader worker processes per rank", short="-j")
    seed: int = _f(0, "random seed (also of the synthetic data)")
    train_limit: int = _f(0, "use a seeded subset of this many training images (0: all)")
    eval_limit: int = _f(0, "evaluate a seeded subset of this many images (0: all)")
    eval_interval: int = _f(0, "evaluate every N epochs during training (0: after the last epoch only)")
    log_interval: int = _f(20, "iterations between log lines")
    checkpoint_every: int = _f(0, "also write the resumable state (last_state.pth) every N iterations, inside epochs "
                               "(0: at epoch ends only); SIGTERM / SIGINT always write it before stopping")
    output: str = _f("", "run directory (default runs/<time>-<task>-<model>)")
    resume: str = _f("", "continue the run in this directory from its last_* files")
    device: str = _f("", "cpu, cuda, cuda:1, ... (default: cuda when available)")
    dry_run: bool = _f(False, "build the model, data and optimizer, print the config, and stop")


def dense_fields() -> list[dataclasses.Field]:
    return list(dataclasses.fields(DenseConfig))


def merge_dense(base: DenseConfig, overrides: dict[str, Any], origin: str = "config") -> DenseConfig:
    """`base` with `overrides` applied; unknown keys and wrongly typed values are a UserError."""
    return merge_config(base, overrides, origin)


def resolve_dense_config(args: argparse.Namespace, task: str) -> DenseConfig:
    """defaults < synthetic demo recipe < --config YAML < explicit flags; with --resume DIR: DIR/args.yaml < --config
    YAML < flags, and a setting that would change the run is refused (`subquad_cli.runconfig.resume_run`; --epochs
    and --max-iters may extend it)."""
    names = {f.name for f in dense_fields()}
    explicit = {k: v for k, v in vars(args).items() if k in names}
    layers: list[tuple[str, dict[str, Any]]] = []
    if getattr(args, "config", None):
        config = find_config(args.config, (CONFIG_DIRS[task].name,))
        layers.append((str(config), load_yaml(config)))
    layers.append(("command line", explicit))
    if explicit.get("resume"):
        return resume_run(DenseConfig, explicit["resume"], layers, extend=("epochs", "max_iters"), drop=("task",))
    if len(layers) == 1 and explicit.get("data", DenseConfig.data).split(":", 1)[0] == "synthetic":
        layers.insert(0, (str(DEMO_RECIPES[task]), load_yaml(DEMO_RECIPES[task])))
    return apply_layers(DenseConfig(), layers)


def shipped_dense_configs() -> list[Path]:
    """Every recipe YAML in subquad/configs/coco and subquad/configs/ade20k."""
    return sorted(p for d in CONFIG_DIRS.values() for p in d.glob("*.yaml"))
