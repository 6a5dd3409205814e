"""The config dataclasses of the training commands: `TrainConfig` (`subquad train`), `LRAConfig` (`subquad lra
train`) and `LMConfig` (`subquad lm train`) (the two share `SequenceConfig`), with the field helper `_f` that
`subquad_cli.denseconfig.DenseConfig` uses too.

Each is the one typed source of truth of its command: recipe YAML files may set only its fields, `subquad_cli.config`
builds the command-line flags from them (the `help` metadata becomes `--help`), and `--resume` refuses a typed flag
whose value differs from the run's unless `RESUME_FREE` lists it. TrainConfig's field names follow timm's train.py
flags (`--batch-size` is `batch_size`, ...). Precedence: dataclass defaults < recipe YAML < the run's args.yaml
(with `--resume`) < explicit flags. No torch is imported.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import UserError

__all__ = ["TrainConfig", "SequenceConfig", "LRAConfig", "LMConfig", "RESUME_FREE", "config_fields", "merge_config",
           "flag_name", "resume_changes", "apply_layers", "resume_run", "refuse_resume_changes"]

#: The settings `--resume` may change, in every training command: where and how a run computes and reports, not what
#: it computes (`max_minutes` is the wall-clock budget of each invocation). Each command allows those of its config's
#: fields listed here; `subquad train` and `detect|segment train` may also extend a run (`resume_changes`).
RESUME_FREE = ("device", "workers", "pin_mem", "checkpoint_every", "log_interval", "max_minutes", "dry_run", "resume")


def _f(default: Any, help: str, short: str | None = None, choices: tuple | None = None,  # noqa: A002
       flag: str | None = None, cli: bool = True) -> Any:
    """A config field with its `--help` text; `short` (-b), `choices`, `flag` (a flag spelled other than the field,
    whose own spelling stays a hidden alias) and `cli` (False: recipe YAML only, no flag) shape the generated flag."""
    meta = {"help": help, "short": short, "choices": choices, "flag": flag, "cli": cli}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def flag_name(f: dataclasses.Field) -> str:
    """The command-line spelling of config field `f` (`batch_size` is `--batch-size`)."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


@dataclass
class TrainConfig:
    """Training options (timm train.py names)."""

    model: str = _f("vit_attn_micro", "registered model name (default: none; required unless -c FILE or --resume DIR "
                    "gives one)")
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


def _again(base: type, name: str, default: Any, help: str | None = None) -> Any:  # noqa: A002
    """Field `name` of `base` with another default (and help): a subclass's own default of a shared field."""
    meta = dict(base.__dataclass_fields__[name].metadata)
    return _f(default, help or meta.pop("help"), **{k: meta[k] for k in ("short", "choices", "flag", "cli")})


@dataclass
class SequenceConfig:
    """What the long-sequence trainers (`LRAConfig`, `LMConfig`, subquad.engine.lra / .lm) share: the data, the
    mechanism, the host's size, the optimisation budget and the run directory. The defaults are the LM's; LRAConfig
    sets its own."""

    data: str = _f("", "the data folder / corpus (required unless --resume)")
    attention: str = _f("long_short", "registered mechanism")
    attn_kw: dict[str, dict[str, Any]] = _f({}, "mechanism options, per mechanism name (only the entry of "
                                            "`attention` is used; --attn-opt KEY=VALUE adds to it)", flag="--attn-opt",
                                            cli=False)
    dim: int = _f(128, "model width")
    depth: int = _f(2, "layers")
    num_heads: int = _f(4, "heads")
    batch_size: int = _f(16, "batch size")
    lr: float = _f(1e-3, "learning rate after warm-up (fixed)")
    warmup: int = _f(50, "linear warm-up steps")
    weight_decay: float = _f(0.01, "AdamW weight decay")
    max_steps: int = _f(1000, "training steps")
    eval_every: int = _f(100, "evaluate every N steps")
    amp: bool = _f(False, "mixed precision: autocast in training and evaluation")
    seed: int = _f(0, "random seed")
    device: str = _f("", "cpu, cuda, ... (default: cuda when available)")
    output: str = _f("", "run directory (default runs/<time>-<command>-...)")
    resume: bool = _f(False, "continue the run in `output` from its last state (last_state.pth); the command line's "
                      "--resume DIR", cli=False)
    checkpoint_every: int = _f(0, "also write the resumable state every N steps (0: at evaluations only); SIGTERM / "
                               "SIGINT always write it before stopping")


_S = SequenceConfig


@dataclass
class LRAConfig(SequenceConfig):
    """LRA run options; the shipped YAMLs (subquad/configs/lra/<task>.yaml) override these, flags override both."""

    task: str = _f("listops", "LRA task (default: none; required unless --resume)",
                   choices=("listops", "text", "retrieval", "image", "pathfinder"))
    attention: str = _again(_S, "attention", "softmax", "registered mechanism: any 1-D one (softmax, linear, "
                            "long_short ...), and with --grid the 2-D ones too (structure_aware, focused_linear, "
                            "window, global_filter ...)")
    cls_attn_kw: dict[str, dict[str, Any]] = _f({}, "extra options, per mechanism, for the block that sees the class "
                                                "token (long_short: num_prefix_tokens=1)", cli=False)
    encoding: str = _f("lra_released", "ListOps tokenisation: lra_released (published numbers) or structural (keeps "
                       "brackets)")
    max_len: int = _f(2048, "padded sequence length")
    vocab_size: int = _f(512, "embedding rows (official 512)")
    num_classes: int = _f(10, "classifier outputs")
    dim: int = _again(_S, "dim", 64)
    num_heads: int = _again(_S, "num_heads", 2)
    mlp_dim: int = _f(128, "FFN width")
    pool: str = _f("cls_last", "cls_last (official), cls, mean or masked_mean")
    drop: float = _f(0.0, "dropout")
    attn_drop: float = _f(0.0, "attention dropout (mechanisms with attn_drop)")
    batch_size: int = _again(_S, "batch_size", 32)
    lr: float = _again(_S, "lr", 1e-4, "peak learning rate (OneCycle max_lr)")
    weight_decay: float = _again(_S, "weight_decay", 0.0)
    adam_eps: float = _f(1e-6, "AdamW epsilon")
    steps: int = _f(5000, "the recipe's step budget (sets the warm-up fraction warmup/steps)")
    warmup: int = _again(_S, "warmup", 1000, "warm-up steps of the recipe")
    max_steps: int = _again(_S, "max_steps", 0, "training steps (0: the recipe's `steps`; the warm-up fraction is "
                            "kept)")
    eval_every: int = _again(_S, "eval_every", 50, "evaluate the dev split every N steps")
    eval_steps: int = _f(62, "dev batches per evaluation (0 = the whole split)")
    limit_train: int = _f(0, "use only the first N training examples (0: all)", flag="--train-limit")
    limit_eval: int = _f(0, "use only the first N dev/test examples (0: all)", flag="--eval-limit")
    amp: bool = _again(_S, "amp", False, "fp16 autocast on CUDA (the official runs used AMP)")
    seed: int = _again(_S, "seed", 1234)
    workers: int = _f(0, "data-loader workers")
    output: str = _again(_S, "output", "", "run directory (default runs/<time>-lra-<task>-<attention>)")
    grid: list[int] | None = _f(None, "token grid (H, W) of image-like tasks (pathfinder 32x32), passed to the "
                                "mechanisms as hw (2-D mechanisms); the command line's --grid H,W", flag="--grid",
                                cli=False)
    odd_attn_kw: dict[str, dict[str, Any]] = _f({}, "extra options, per mechanism, for the odd-numbered blocks "
                                                "(window: {shift_size: w // 2}, Swin's alternation)", cli=False)
    lcm_kernel_size: int = _f(0, "> 0: the L2ViT LCM branch x + LCM(LN(x)) after each attention (needs --grid; "
                              "enhanced linear attention)")


@dataclass
class LMConfig(SequenceConfig):
    """Character-LM run options (subquad/configs/charlm/*.yaml override these, flags override both)."""

    data: str = _again(_S, "data", "", "prepared corpus folder (subquad lm prepare), or enwik8:PATH / text8:PATH (the "
                       "file or its zip, split 90M/5M/5M; a file of another size 90/5/5 %); required unless --resume")
    attention: str = _again(_S, "attention", "long_short", "a mechanism with a causal form: long_short (default), "
                            "softmax, sliding_window, linear_elu1, linear_relu")
    ffn_dim: int = _f(0, "FFN width (0 = 4 x dim)")
    dropout: float = _f(0.0, "dropout on attention outputs and in the FFN")
    emb_dropout: float = _f(0.0, "dropout on the embeddings and the last hidden state")
    residual: str = _f("standard", "standard (textbook pre-LN, final LN) or official (Transformer-LS "
                       "normalised-input residual)")
    seq_len: int = _f(256, "training sample length (tokens)")
    clip_grad: float = _f(0.0, "gradient-norm clipping (0 = off, as the official runs)")
    max_minutes: float = _f(0.0, "wall-clock budget in minutes (0 = none); stops early and evaluates")
    eval_every: int = _again(_S, "eval_every", 100, "evaluate valid BPC every N steps")
    eval_ctx: int = _f(1024, "evaluation context length")
    eval_score: int = _f(512, "tokens scored per evaluation window (the last ones; paper 512)")
    eval_batch: int = _f(8, "evaluation windows per batch")
    eval_tokens: int = _f(32768, "valid tokens scored at each periodic evaluation (0 = all)")
    final_eval_tokens: int = _f(0, "valid/test tokens scored at the end (0 = the whole splits)")
    final_test: bool = _f(True, "score the test split at the end (off: valid only, test_bpc null; for calibrating a "
                          "recipe without looking at the test split)")
    amp: bool = _again(_S, "amp", False, "mixed precision: autocast in training and evaluation (see --amp-dtype)")
    amp_dtype: str = _f("bfloat16", "autocast dtype with --amp (float16 adds a grad scaler on CUDA)",
                        choices=("bfloat16", "float16"))
    output: str = _again(_S, "output", "", "run directory (default runs/<time>-lm-<attention>)")
    # The Transformer-LS schedule trains 430k / 50k / 50k updates at 2048 / 4096 / 8192 tokens (arXiv 2107.02192,
    # App. D); `reset_optimizer: true` is a fresh AdamW from the previous phase's weights, as the official phases 2
    # and 3 start with fairseq's `--finetune-from-model`.
    phases: list[dict[str, Any]] = _f([], "training phases run in order, each {seq_len, batch_size, steps, lr, "
                                      "warmup, reset_optimizer} (lr / warmup default to the top-level values; each "
                                      "warms up linearly from 0 to its lr, then holds it; the optimizer state carries "
                                      "over unless reset_optimizer). Empty: one phase of (seq_len, batch_size, "
                                      "max_steps, lr, warmup); with phases, max_steps caps the total (0 = all)",
                                      cli=False)


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
    if t.startswith("list[dict"):
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, dict) for v in value):
            raise UserError(f"config key {f.name!r} must be a list of mappings, got {value!r}")
        return [dict(v) for v in value]
    if t.startswith("list[int"):
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                           for v in value):
            raise UserError(f"config key {f.name!r} must be a list of integers, got {value!r}")
        return [int(v) for v in value]
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
        from .errors import closest

        near = closest(unknown[0].replace("-", "_"), fields)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        raise UserError(f"{origin}: unknown key {unknown[0]!r}{hint}")
    values = {k.replace("-", "_"): _coerce(fields[k.replace("-", "_")], v) for k, v in overrides.items()}
    return dataclasses.replace(base, **values)


def resume_changes(run: Any, new: Any, given: list[str], extend: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """The `--resume` rule of every training command: (the typed flags among the field names `given` that would
    change the run: `--flag NEW (the run has OLD)`, the flags that may change). `run` is the run's config (its
    args.yaml), `new` the one the command would train with. The fields of `RESUME_FREE` may change, and so may
    `extend`: the fields that lengthen a finished run (`epochs`), or that its extension uses (`subquad train`'s new
    cosine starts from `lr`)."""
    names = {f.name: f for f in dataclasses.fields(new)}
    free = [k for k in RESUME_FREE if k in names and names[k].metadata.get("cli", True) and k != "resume"]
    free += [k for k in extend if k not in free]
    changed = [f"{flag_name(names[k])} {getattr(new, k)!r} (the run has {getattr(run, k)!r})" for k in given
               if k in names and k not in free and k != "resume" and getattr(new, k) != getattr(run, k)]
    return changed, [flag_name(names[k]) for k in free]


def apply_layers(cfg, layers: list[tuple[str, dict]]):
    """`cfg` with each (origin, values) layer merged in order (unknown keys and wrong types: a UserError naming the
    origin)."""
    for origin, values in layers:
        cfg = merge_config(cfg, values, origin=origin)
    return cfg


def resume_run(config_cls: type, resume: str, layers: list[tuple[str, dict]], extend: tuple[str, ...] = (),
               exempt=None, drop: tuple[str, ...] = ()):
    """The config that `--resume DIR` trains with: the run's args.yaml (less `drop`), then the given `layers` (a
    recipe given with --resume, the typed flags). A setting of a layer that differs from the run's is refused in
    one line, naming it and what may change (`resume_changes`: RESUME_FREE and `extend`); `exempt(run, new)` names
    more fields that may change in this case."""
    from .recipes import load_run_args

    run = merge_config(config_cls(), load_run_args(resume, drop), origin=str(Path(resume) / "args.yaml"))
    new = apply_layers(run, layers)
    skip = set(exempt(run, new)) if exempt else set()
    given = list(dict.fromkeys(k.replace("-", "_") for _, values in layers for k in values))
    changed, free = resume_changes(run, new, [k for k in given if k not in skip], extend)
    refuse_resume_changes(resume, changed, free, verb="change")
    return new


def refuse_resume_changes(resume: str | Path, flags: list[str], free: list[str], verb: str = "be given") -> None:
    """The refusal every `--resume` shares: a resumed run continues with its own settings (its args.yaml), so the
    `flags` that would change them are refused in one line; `free` names the flags that may {verb}."""
    if flags:
        allowed = free[0] if len(free) == 1 else f"{', '.join(free[:-1])} and {free[-1]}"
        raise UserError(f"--resume {resume} continues the run with its own settings (args.yaml); drop "
                        f"{', '.join(flags)}; only {allowed} may {verb}")
