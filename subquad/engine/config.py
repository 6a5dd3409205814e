"""`TrainConfig`: the one typed source of truth for `subquad train`.

Field names follow timm's train.py flags (`--batch-size` is `batch_size`, ...). Recipe YAML files may set only these
fields; `subquad.cli.config` builds the command-line parser from them (the `help` metadata becomes `--help`).
Precedence: dataclass defaults < `--config FILE.yaml` < the run's args.yaml (with `--resume`) < explicit flags.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..errors import UserError

__all__ = ["TrainConfig", "config_fields", "merge_config"]


def _f(default: Any, help: str, short: str | None = None, choices: tuple | None = None) -> Any:  # noqa: A002
    meta = {"help": help, "short": short, "choices": choices}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class TrainConfig:
    """Training options (timm train.py names)."""

    model: str = _f("vit_attn_micro", "registered model name")
    model_kwargs: dict | None = _f(None, "extra keyword arguments for the model's constructor, as a JSON/YAML "
                                   "mapping (e.g. '{\"attn\": \"focused_linear\", \"depth\": 4}')")
    data: str = _f("digits", "data source: digits (offline default), fashion-mnist[:DIR], imagefolder:PATH, "
                   "cifar10:PATH, cifar100:PATH, video:DIR (list files + .mp4 clips, see subquad video generate)")
    dataset_download: bool = _f(False, "allow torchvision to download fashion-mnist when absent (needs internet)")
    img_size: int | None = _f(None, "input side (default: the model's)")
    num_frames: int | None = _f(None, "video: frames per clip T (default: the model's num_frames); also passed to the "
                                "model's constructor")
    frame_stride: int = _f(4, "video: stride tau between the sampled frames")
    inflate_from: str | None = _f(None, "video: initialise the video model from a trained image checkpoint "
                                  "(.safetensors or run folder) by 2-D -> 3-D kernel inflation")
    num_classes: int | None = _f(None, "classifier outputs (default: the data's class count)")
    batch_size: int = _f(64, "batch size per process", short="-b")
    validation_batch_size: int | None = _f(None, "evaluation batch size (default: 2 x batch size)")
    epochs: int = _f(30, "training epochs")
    resume_schedule: str = _f("restart", "when --resume extends a finished schedule (--epochs above the run's): "
                              "restart (a new cosine from --lr over the added epochs, no warm-up) or continue (keep "
                              "the old schedule, i.e. train at its final lr)", choices=("restart", "continue"))
    opt: str = _f("adamw", "optimizer (timm create_optimizer_v2 name)")
    opt_eps: float | None = _f(None, "optimizer epsilon (default: the optimizer's)")
    opt_betas: list[float] | None = _f(None, "optimizer betas")
    momentum: float = _f(0.9, "SGD momentum")
    lr: float = _f(2e-3, "peak learning rate (for the global batch of this run)")
    weight_decay: float = _f(0.05, "weight decay (1-D parameters, biases and no_weight_decay() names excluded)")
    sched: str = _f("cosine", "learning-rate schedule (timm create_scheduler_v2: cosine, step, plateau, ...)")
    sched_on_updates: bool = _f(True, "step the schedule every optimizer update rather than every epoch")
    warmup_epochs: float = _f(2, "linear warm-up epochs (fractions allowed, e.g. 0.25)")
    warmup_lr: float = _f(1e-5, "learning rate at the start of warm-up")
    min_lr: float = _f(1e-5, "final learning rate of the schedule")
    cooldown_epochs: int = _f(0, "epochs at min_lr after the schedule")
    drop: float = _f(0.0, "classifier dropout rate")
    drop_path: float | None = _f(None, "stochastic depth rate (default: the model's)")
    aug: str = _f("auto", "training augmentation preset: auto (timm for images >= 64 px with >= 200 per class, "
                  "light otherwise), none, light (pad-crop + flip), timm (RandomResizedCrop + flip + colour "
                  "jitter)", choices=("auto", "none", "light", "timm"))
    no_aug: bool = _f(False, "disable training augmentation (same as --aug none)")
    scale: list[float] | None = _f(None, "RandomResizedCrop scale range (aug timm; default 0.08 1.0)")
    ratio: list[float] | None = _f(None, "RandomResizedCrop aspect range (aug timm)")
    hflip: float = _f(0.5, "horizontal flip probability")
    color_jitter: float = _f(0.4, "colour jitter (aug timm, ignored when --aa is set)")
    aa: str | None = _f(None, "RandAugment policy, e.g. rand-m9-mstd0.5-inc1")
    reprob: float = _f(0.0, "random erasing probability")
    remode: str = _f("pixel", "random erasing mode")
    recount: int = _f(1, "random erasing count")
    interpolation: str = _f("", "eval resize interpolation (default: bilinear for small sets, bicubic otherwise)")
    train_interpolation: str = _f("random", "training interpolation (aug timm)")
    crop_pct: float | None = _f(None, "eval centre-crop fraction (aug timm; default 0.875 for folders)")
    mean: list[float] | None = _f(None, "normalisation mean (default: the data's)")
    std: list[float] | None = _f(None, "normalisation std (default: the data's)")
    mixup: float = _f(0.0, "mixup alpha (0: off)")
    cutmix: float = _f(0.0, "cutmix alpha (0: off)")
    mixup_prob: float = _f(1.0, "probability of applying mixup or cutmix per batch")
    mixup_switch_prob: float = _f(0.5, "probability of cutmix instead of mixup when both are on")
    mixup_mode: str = _f("batch", "mixup mode: batch, pair or elem", choices=("batch", "pair", "elem"))
    smoothing: float = _f(0.1, "label smoothing")
    model_ema: bool = _f(False, "keep an exponential moving average of the weights")
    model_ema_decay: float = _f(0.9998, "EMA decay")
    model_ema_warmup: bool = _f(False, "EMA decay warm-up")
    clip_grad: float | None = _f(None, "gradient clipping value (off when unset)")
    clip_mode: str = _f("norm", "clipping mode: norm, value or agc", choices=("norm", "value", "agc"))
    grad_accum_steps: int = _f(1, "batches per optimizer update")
    amp: bool = _f(False, "mixed precision (autocast)")
    amp_dtype: str = _f("float16", "autocast dtype", choices=("float16", "bfloat16"))
    channels_last: bool = _f(False, "channels-last memory format")
    grad_checkpointing: bool = _f(False, "activation checkpointing in the model's blocks")
    compile: bool = _f(False, "torch.compile the training forward (inductor; the first steps compile)")
    sync_bn: bool = _f(False, "convert BatchNorm to SyncBatchNorm under DDP")
    workers: int = _f(0, "data-loader worker processes per rank", short="-j")
    pin_mem: bool = _f(False, "pin host memory in the data loaders")
    seed: int = _f(0, "random seed")
    train_limit: int = _f(0, "use a seeded subset of this many training images (0: all)")
    eval_limit: int = _f(0, "use a seeded subset of this many evaluation images (0: all)")
    test_limit: int = _f(0, "score only a seeded subset of this many test images at the end (0: all; for quick "
                         "checks, never for reported numbers)")
    log_interval: int = _f(50, "batches between log lines when output is not a terminal")
    output: str = _f("", "run directory (default runs/<time>-<model>)")
    resume: str = _f("", "continue the run in this directory from its last_* files (or from the state written "
                     "inside an epoch by --checkpoint-every or a SIGTERM / SIGINT)")
    checkpoint_every: int = _f(0, "also write the resumable state (last_state.pth) every N optimizer updates, inside "
                               "epochs (0: at epoch ends only); SIGTERM / SIGINT always write it before stopping")
    device: str = _f("", "cpu, cuda, cuda:1, ... (default: cuda when available)")
    dry_run: bool = _f(False, "build the model, data, optimizer and schedule, print the config, and stop")


def config_fields() -> list[dataclasses.Field]:
    return list(dataclasses.fields(TrainConfig))


def _coerce(f: dataclasses.Field, value: Any) -> Any:
    """Check a YAML value against the field's type (ints accepted for floats)."""
    t = str(f.type)
    if t.startswith("dict"):
        if value is None:
            return None
        if isinstance(value, str):
            import json

            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise UserError(f"config key {f.name!r} must be a JSON mapping, got {value!r} ({e.msg})") from None
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise UserError(f"config key {f.name!r} must be a mapping of names to values, got {value!r}")
        return dict(value)
    if value is None:
        if "None" in t:
            return None
        raise UserError(f"config key {f.name!r} cannot be null")
    if t.startswith("list"):
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, (int, float)) for v in value):
            raise UserError(f"config key {f.name!r} must be a list of numbers, got {value!r}")
        return [float(v) for v in value]
    if t.startswith("bool"):
        if not isinstance(value, bool):
            raise UserError(f"config key {f.name!r} must be true or false, got {value!r}")
        return value
    if t.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"config key {f.name!r} must be an integer, got {value!r}")
        return value
    if t.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"config key {f.name!r} must be a number, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise UserError(f"config key {f.name!r} must be a string, got {value!r}")
    choices = f.metadata.get("choices")
    if choices and value not in choices:
        raise UserError(f"config key {f.name!r} is {value!r}; allowed: {', '.join(choices)}")
    return value


def merge_config(base: Any, overrides: dict[str, Any], origin: str = "config") -> Any:
    """Return `base` (a TrainConfig, or any config dataclass built with `_f`) with `overrides` applied; unknown keys
    and wrongly typed values are a UserError."""
    fields = {f.name: f for f in dataclasses.fields(base)}
    unknown = [k for k in overrides if k.replace("-", "_") not in fields]
    if unknown:
        from ..errors import closest

        near = closest(unknown[0].replace("-", "_"), fields)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        raise UserError(f"{origin}: unknown key {unknown[0]!r}{hint}")
    values = {k.replace("-", "_"): _coerce(fields[k.replace("-", "_")], v) for k, v in overrides.items()}
    return dataclasses.replace(base, **values)
