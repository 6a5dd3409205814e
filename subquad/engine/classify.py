"""Image classification: train and evaluate a registered model, built on timm's training pieces.

`train(cfg)` runs the loop and writes the run directory (rank 0 only):

    args.yaml                       the resolved TrainConfig
    summary.csv                     epoch, train_loss, eval_loss, eval_top1, eval_top5, lr, time (+ ema_* with EMA);
                                    eval_* are on the validation split; epochs count from 1, as on screen
    last.safetensors / last.json    weights after the latest epoch and their sidecar (arch, epoch, metrics, args,
                                    class names, data config)
    best.safetensors / best.json    the epoch with the best validation eval_top1
    results.json                    the final report: the test split evaluated once, after the last epoch, with the
                                    weights validation selected (best.safetensors); `split` names what it reports
                                    ("val" for sources without a test split)
    last_ema / best_ema.safetensors EMA weights when --model-ema is on
    last_state.pth                  optimizer, scheduler, grad scaler, EMA, RNG states and counters; tensors and plain
                                    containers only (read back with torch.load(weights_only=True))

Every file is written to a temporary name and renamed (engine.checkpoint), so a crash leaves the previous files.

Selection: checkpoints are chosen on the source's validation split only; the test split is read once, after the
last epoch (tests assert it is not opened before).

Determinism and resume: the data order of epoch e is a permutation drawn from (seed, e) (GlobalBatchSampler) and
every RNG is re-seeded from (seed, e, rank) at the start of epoch e, so `--resume DIR` after epoch k continues with
exactly the batches, augmentations and drop-path draws of the uninterrupted run. Inside an epoch, `--checkpoint-every
N` (updates) and SIGTERM / SIGINT write last_state.pth with the weights, the sampler position, every RNG state and
the epoch's loss sums (engine.loop), and `--resume DIR` from it ends with the same weights and metrics too.
Resuming a finished run reports it complete; `--resume DIR --epochs N` with N above the run's epochs extends it, with
the schedule `--resume-schedule` names (restart: a new cosine from --lr over the added epochs; continue: the old
schedule, whose lr has reached min_lr).

Pieces from timm: create_transform, Mixup/CutMix, SoftTargetCrossEntropy, LabelSmoothingCrossEntropy,
create_optimizer_v2, create_scheduler_v2, ModelEmaV3, dispatch_clip_grad, accuracy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from subquad_cli.runconfig import TrainConfig

from ..bench.memory import peak_memory_mb, rss_mb
from ..data.registry import ImageSource, TransformDataset, build_transform, open_source, resolve_aug
from ..data.video import multiview_logits
from ..errors import UserError
from .checkpoint import load_state, read_json, save_weights, write_json
from .distributed import DistInfo, GlobalBatchSampler, all_reduce_sum, cleanup, init_distributed, train_sampler
from .loop import Loop, Position, Precision, TrainTask
from .modelbuild import build_model, check_img_size, model_input
from .optim import build_optimizer, build_scheduler, check_scheduler
from .rng import epoch_seed, seed_everything
from .runfiles import prepare_output, read_csv, write_args, write_csv

__all__ = ["TrainConfig", "train", "evaluate", "build_model", "data_config", "eval_loader", "SUMMARY_FIELDS"]

_logger = logging.getLogger(__name__)

SUMMARY_FIELDS = ["epoch", "train_loss", "eval_loss", "eval_top1", "eval_top5", "lr", "time"]


_VIDEO_AUG_WHAT = {"none": "random temporal start, full frame", "light": "random temporal start, random resized crop",
                   "timm": "random temporal start, random resized crop, horizontal flip"}


def _inflate_into(model: nn.Module, path: str) -> None:
    """Initialise a video model from a trained image checkpoint (a .safetensors file or a run folder's
    best.safetensors) by `inflate_image_weights`; a classifier head of another class count keeps its fresh init."""
    from ..models._builder import load_into, read_state_dict
    from ..models.lisanet import inflate_image_weights

    src = Path(path)
    if src.is_dir():
        src = src / "best.safetensors"
    if not src.is_file():
        raise UserError(f"--inflate-from {path}: no such checkpoint (a .safetensors file or a run folder)")
    image_state = read_state_dict(src)
    own = model.state_dict()
    image_state = {k: (own[k] if k.startswith("head") and k in own and own[k].shape != v.shape else v)
                   for k, v in image_state.items()}
    load_into(model, inflate_image_weights(image_state, model), what=f"inflated image checkpoint {src}")
    _logger.info("initialised %s from image checkpoint %s (2-D -> 3-D inflation)", type(model).__name__, src)


def data_config(cfg: TrainConfig, source: ImageSource, in_chans: int, img_size: int) -> dict[str, Any]:
    """What predict/eval need to rebuild the eval transform (stored in every sidecar)."""
    return {"img_size": img_size, "in_chans": in_chans, "mean": list(cfg.mean or source.mean),
            "std": list(cfg.std or source.std), "interpolation": cfg.interpolation, "crop_pct": cfg.crop_pct,
            "aug": "none" if cfg.no_aug else cfg.aug, "source_aug": source.aug, "native_size": source.native_size,
            "model_kwargs": dict(cfg.model_kwargs or {})}


def _video_model_kwargs(cfg: TrainConfig, source: ImageSource) -> dict[str, Any] | None:
    """The model's constructor options: `--num-frames` goes to a video model's `num_frames`."""
    if cfg.num_frames is not None and cfg.num_frames < 1:
        raise UserError(f"--num-frames must be >= 1, got {cfg.num_frames}")
    if cfg.frame_stride < 1:
        raise UserError(f"--frame-stride must be >= 1, got {cfg.frame_stride}")
    if not source.video:
        if cfg.num_frames is not None or cfg.inflate_from:
            raise UserError(f"--num-frames/--inflate-from need video data (--data video:DIR), not {cfg.data!r}")
        return cfg.model_kwargs
    kw = dict(cfg.model_kwargs or {})
    if cfg.num_frames is not None:
        kw["num_frames"] = cfg.num_frames
    return kw


def _video_dataset(source: ImageSource, split: str, dcfg: dict[str, Any], training: bool, limit: int = 0,
                   seed: int = 0, hflip: float = 0.0, aug: str = "none", views: tuple[int, int] = (1, 1),
                   scale: Any = None, ratio: Any = None):
    """A `VideoClipDataset` of `split`: clips (C, T, S, S), or (V, C, T, S, S) for multi-view evaluation.
    Training augmentation: 'none' (random temporal start only), 'light' (+ random resized crop, `scale` / `ratio`
    when given), 'timm' (+ crop and horizontal flip with probability `hflip`)."""
    from ..data.video import VideoClipDataset

    base = source.dataset(split, limit, seed)
    samples = [base[i] for i in range(len(base))]
    v = dcfg["video"]
    kw: dict[str, Any] = {}
    if training and aug == "none":
        kw["scale"] = (1.0, 1.0)
        kw["ratio"] = (1.0, 1.0)
    elif training:
        kw.update({k: tuple(v) for k, v in (("scale", scale), ("ratio", ratio)) if v})
    return VideoClipDataset(samples, v["num_frames"], v["frame_stride"], dcfg["img_size"], training=training,
                            views=views, mean=dcfg["mean"], std=dcfg["std"],
                            hflip=hflip if training and aug == "timm" else 0.0, where=f"{source.name} [{split}]",
                            **kw)


def eval_transform(dcfg: dict[str, Any], source: ImageSource | None = None) -> Callable:
    """The eval transform described by a sidecar's data config."""
    if source is None:
        source = ImageSource("sidecar", [], {}, mean=tuple(dcfg["mean"]), std=tuple(dcfg["std"]),
                             aug=dcfg.get("source_aug", "timm"), native_size=dcfg.get("native_size"))
    return build_transform(source, dcfg["img_size"], False, aug=dcfg.get("aug", "auto"),
                           interpolation=dcfg.get("interpolation") or "", crop_pct=dcfg.get("crop_pct"),
                           mean=tuple(dcfg["mean"]), std=tuple(dcfg["std"]), in_chans=dcfg["in_chans"])


def eval_loader(source: ImageSource, split: str, dcfg: dict[str, Any], batch_size: int, workers: int = 0,
                limit: int = 0, seed: int = 0, info: DistInfo | None = None) -> DataLoader:
    """Non-shuffled loader over `split` (this rank's share under DDP)."""
    info = info or DistInfo()
    if source.video:
        views = tuple((dcfg.get("video") or {}).get("views") or (1, 1))
        ds = _video_dataset(source, split, dcfg, False, limit, seed, views=views)
    else:
        ds = TransformDataset(source.dataset(split, limit, seed), eval_transform(dcfg, source),
                              "L" if dcfg["in_chans"] == 1 else "RGB")
    sampler = GlobalBatchSampler(len(ds), batch_size, info.rank, info.world_size, shuffle=False, drop_last=False)
    return DataLoader(ds, batch_size, sampler=sampler, num_workers=workers)


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device, info: DistInfo | None = None,
             amp: Callable[[], contextlib.AbstractContextManager] | None = None,
             channels_last: bool = False) -> dict[str, float]:
    """Top-1, top-5 (%) and mean cross-entropy over `loader`, summed over ranks."""
    info = info or DistInfo()
    model.eval()
    n, loss_sum, c1, c5 = 0, 0.0, 0.0, 0.0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with amp() if amp else contextlib.nullcontext():
            logits = model(x) if x.dim() < 6 else multiview_logits(model, x)  # (B, V, C, T, H, W): views averaged
        logits = logits.float()
        loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
        k = min(5, logits.shape[1])
        top = logits.topk(k, dim=1).indices
        hit = top.eq(y[:, None])
        c1 += hit[:, 0].sum().item()
        c5 += hit.any(dim=1).sum().item()
        n += len(y)
    n, loss_sum, c1, c5 = all_reduce_sum([n, loss_sum, c1, c5], info)
    if n == 0:
        raise UserError("the evaluation split is empty")
    return {"eval_loss": loss_sum / n, "eval_top1": 100.0 * c1 / n, "eval_top5": 100.0 * c5 / n}


def _check_config(cfg: TrainConfig, info: DistInfo) -> None:
    check_scheduler(cfg.sched)  # before any data is read
    if cfg.epochs < 1:
        raise UserError(f"--epochs must be >= 1, got {cfg.epochs}")
    if cfg.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {cfg.batch_size}")
    if cfg.grad_accum_steps < 1:
        raise UserError(f"--grad-accum-steps must be >= 1, got {cfg.grad_accum_steps}")
    if cfg.validation_batch_size is not None and cfg.validation_batch_size < 1:
        raise UserError(f"--validation-batch-size must be >= 1, got {cfg.validation_batch_size}")
    if cfg.workers < 0:
        raise UserError(f"--workers must be >= 0 (0: load in the main process), got {cfg.workers}")
    if cfg.clip_grad is not None and cfg.clip_grad <= 0:  # torch would flip (norm) or replace (value) every gradient
        raise UserError(f"--clip-grad must be > 0 (leave it unset for no clipping), got {cfg.clip_grad:g}")
    if (cfg.mixup > 0 or cfg.cutmix > 0) and cfg.batch_size % 2:
        raise UserError(f"--mixup/--cutmix need an even --batch-size, got {cfg.batch_size}")
    if cfg.amp and cfg.amp_dtype == "float16" and info.device.type == "cpu":
        _logger.warning("--amp with --amp-dtype float16 (its default) on a CPU is slow, often slower than fp32; "
                        "--amp-dtype bfloat16 is the usual choice there")
    # Rates and probabilities: refused here in one line, before anything is written (timm asserts, or torch fails
    # in the first step, otherwise).
    ranges = {"smoothing": (0.0, 1.0, False), "drop": (0.0, 1.0, False), "drop_path": (0.0, 1.0, False),
              "mixup_prob": (0.0, 1.0, True), "mixup_switch_prob": (0.0, 1.0, True), "hflip": (0.0, 1.0, True),
              "reprob": (0.0, 1.0, True)}
    for name, (lo, hi, closed) in ranges.items():
        v = getattr(cfg, name, None)
        if v is not None and not (lo <= v <= hi if closed else lo <= v < hi):
            flag = "--" + name.replace("_", "-")
            raise UserError(f"{flag} must be in [{lo:g}, {hi:g}{']' if closed else ')'}, got {v:g}")
    for name in ("warmup_epochs", "mixup", "cutmix"):
        if getattr(cfg, name) < 0:
            raise UserError(f"--{name.replace('_', '-')} must be >= 0 (0: off), got {getattr(cfg, name):g}")
    if not cfg.resume and cfg.warmup_epochs >= cfg.epochs > 0:
        _logger.warning("--warmup-epochs %g >= --epochs %d: the whole run is warm-up, the learning rate never "
                        "reaches --lr %g and never decays; pass a shorter --warmup-epochs (e.g. 0)", cfg.warmup_epochs,
                        cfg.epochs, cfg.lr)
    for name in ("scale", "ratio"):
        v = getattr(cfg, name)
        if v is not None and len(v) != 2:
            raise UserError(f"--{name} takes two numbers, got {v}")


_AUG_WHAT = {"none": "resize only", "light": "pad-crop + flip", "timm": "RandomResizedCrop + flip + colour jitter"}


def _schedule(optimizer: torch.optim.Optimizer, cfg: TrainConfig, updates_per_epoch: int, seg: dict[str, int]) -> Any:
    """The lr schedule of segment `seg` (start epoch, end epoch): the run's own schedule for the segment starting at
    epoch 0 (warm-up included), a warm-up-free one over its epochs for a segment added by extending a finished run."""
    if seg["start"] == 0:
        return build_scheduler(optimizer, dataclasses.replace(cfg, epochs=seg["end"]), updates_per_epoch)
    return build_scheduler(optimizer, dataclasses.replace(cfg, epochs=seg["end"] - seg["start"], warmup_epochs=0,
                                                         cooldown_epochs=0), updates_per_epoch)


def train(cfg: TrainConfig, on_epoch_end: Callable[[int, dict[str, Any]], None] | None = None,
          on_update: Callable[[Position], None] | None = None) -> dict[str, Any]:
    """Train `cfg.model` on `cfg.data` (DDP when launched by torchrun); returns final metrics and paths.

    Args:
        cfg: the resolved config.
        on_epoch_end: called as on_epoch_end(epoch, row) after each epoch's files are written (tests use it to
            interrupt a run).
        on_update: called with the loop's Position after every optimizer update (before the state written by
            --checkpoint-every or a signal).
    Raises:
        Preempted: SIGTERM / SIGINT; the resumable state was written (exit code 143 / 130).
    """
    info = init_distributed(cfg.device)
    if not info.is_main:
        logging.getLogger("subquad").setLevel(logging.WARNING)
    try:
        return _train(cfg, info, on_epoch_end, on_update)
    finally:
        cleanup(info)


def _read_resume(cfg: TrainConfig, out: Path) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(resumable state or None, the last.json sidecar or {} for a state written inside the first epoch)."""
    if not cfg.resume:
        return None, {}
    if not (out / "last_state.pth").is_file():
        raise UserError(f"--resume {out}: last_state.pth is missing (the run saved no state to resume from)")
    state = load_state(out / "last_state.pth")
    if "model" in state:  # written inside an epoch: the weights are in the state
        return state, read_json(out / "last.json") if (out / "last.json").is_file() else {}
    for f in ("last.safetensors", "last.json"):
        if not (out / f).is_file():
            raise UserError(f"--resume {out}: {f} is missing (the run saved no complete epoch)")
    return state, read_json(out / "last.json")


def _build(cfg: TrainConfig, info: DistInfo, source: ImageSource, num_classes: int, out: Path,
           state: dict[str, Any] | None, side: dict[str, Any]) -> tuple[nn.Module, dict[str, Any], int, int]:
    """(model on the device, data config, in_chans, img_size): built from the epoch -1 seed, inflated or loaded."""
    from ..models._builder import load_into, read_state_dict

    device = info.device
    seed_everything(epoch_seed(cfg.seed, -1, 0))
    model_kwargs = _video_model_kwargs(cfg, source)
    model = build_model(cfg.model, num_classes, cfg.img_size, cfg.drop_path, cfg.drop, device, model_kwargs)
    if source.video and not getattr(model, "video", False):
        raise UserError(f"model {cfg.model!r} takes images; video data needs a video model (e.g. "
                        "hylisanet_micro_video, hylisanet_s_video)")
    in_chans, img_size = model_input(model, cfg.img_size)
    check_img_size(model, cfg.model, in_chans, img_size, device)
    if cfg.inflate_from and state is None:
        _inflate_into(model, cfg.inflate_from)
    if state is not None:
        arch = side.get("arch", state.get("arch"))
        if arch != cfg.model:
            raise UserError(f"--resume {out}: the run trained {arch!r}, not {cfg.model!r}")
        if "model" not in state:
            load_into(model, read_state_dict(out / "last.safetensors"), what=f"checkpoint {out / 'last.safetensors'}")
    if cfg.grad_checkpointing:
        if not hasattr(model, "set_grad_checkpointing"):
            raise UserError(f"model {cfg.model!r} has no set_grad_checkpointing(); drop --grad-checkpointing")
        model.set_grad_checkpointing(True)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    dcfg = data_config(cfg, source, in_chans, img_size)
    dcfg["model_kwargs"] = dict(model_kwargs or {})
    if source.video:
        dcfg["video"] = {"num_frames": int(cfg.num_frames or getattr(model, "num_frames", 16)),
                         "frame_stride": cfg.frame_stride, "views": [1, 1]}
    return model, dcfg, in_chans, img_size


def mix_batch(mixup_fn: Callable, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """timm's Mixup/CutMix on images (B, C, H, W) or clips (B, C, T, H, W). timm boxes dims 2 and 3 of the batch,
    which for a clip would be time and height: the frames are folded into the channels so that every frame of a
    clip gets the same spatial box and the same mixing weight."""
    if x.dim() != 5:
        return mixup_fn(x, y)
    B, C, T, H, W = x.shape
    x2, y = mixup_fn(x.reshape(B, C * T, H, W).contiguous(), y)
    return x2.reshape(B, C, T, H, W), y


def _refuse_image_only_aug(cfg: TrainConfig) -> None:
    """RandAugment and random erasing act on single images; on clips they are refused rather than ignored."""
    given = [f for f, on in (("--aa", bool(cfg.aa)), ("--reprob", cfg.reprob > 0)) if on]
    if given:
        raise UserError(f"{' and '.join(given)} apply to images only; video training samples time, crops "
                        "(--scale/--ratio) and flips (--hflip): drop them for --data video:...")


def _train_data(cfg: TrainConfig, info: DistInfo, source: ImageSource, dcfg: dict[str, Any], in_chans: int,
                img_size: int) -> tuple[Any, GlobalBatchSampler, DataLoader, DataLoader]:
    """(training set, its sampler, its loader, the validation loader); sets dcfg['aug']."""
    train_base = source.dataset(source.train_split, cfg.train_limit, cfg.seed)
    aug, aug_why = resolve_aug(source, img_size, len(train_base), "none" if cfg.no_aug else cfg.aug)
    dcfg["aug"] = aug
    _logger.info("augmentation: %s (%s) [%s]; change with --aug none|light|timm", aug,
                 _VIDEO_AUG_WHAT[aug] if source.video else _AUG_WHAT[aug], aug_why)
    if source.video:
        _refuse_image_only_aug(cfg)
        train_set = _video_dataset(source, source.train_split, dcfg, True, cfg.train_limit, cfg.seed, cfg.hflip, aug,
                                   scale=cfg.scale, ratio=cfg.ratio)
    else:
        train_tf = build_transform(source, img_size, True, aug=aug, interpolation=cfg.interpolation,
                                   crop_pct=cfg.crop_pct, mean=tuple(dcfg["mean"]), std=tuple(dcfg["std"]),
                                   scale=tuple(cfg.scale) if cfg.scale else None,
                                   ratio=tuple(cfg.ratio) if cfg.ratio else None, hflip=cfg.hflip,
                                   color_jitter=cfg.color_jitter, aa=cfg.aa, reprob=cfg.reprob, remode=cfg.remode,
                                   recount=cfg.recount, train_interpolation=cfg.train_interpolation,
                                   in_chans=in_chans)
        train_set = TransformDataset(train_base, train_tf, "L" if in_chans == 1 else "RGB")
    sampler = train_sampler(len(train_set), cfg.batch_size, info, cfg.seed)
    train_loader = DataLoader(train_set, cfg.batch_size, sampler=sampler, num_workers=cfg.workers,
                              pin_memory=cfg.pin_mem, drop_last=True, persistent_workers=False)
    val_loader = eval_loader(source, source.val_split, dcfg, cfg.validation_batch_size or 2 * cfg.batch_size,
                             cfg.workers, cfg.eval_limit, cfg.seed, info)
    return train_set, sampler, train_loader, val_loader


def _wrap(model: nn.Module, cfg: TrainConfig, info: DistInfo) -> tuple[nn.Module, nn.Module]:
    """(model, the module the training forward calls): DDP under torchrun (SyncBatchNorm with --sync-bn),
    torch.compile with --compile."""
    ddp_model: nn.Module = model
    if info.enabled:
        if cfg.sync_bn:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        device = info.device
        ddp_model = nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    if cfg.compile:
        # Training forwards only; evaluation and checkpoints use the eager module (same parameters, plain keys).
        ddp_model = torch.compile(ddp_model)
    return model, ddp_model


def _segment(cfg: TrainConfig, state: dict[str, Any] | None, side: dict[str, Any], out: Path
             ) -> tuple[dict[str, int], str]:
    """The schedule segment: epochs [start, end) and the update count at its start, and the note of an extension.
    A fresh run has one segment over all its epochs; extending a finished run (--resume with a larger --epochs) may
    add one (see --resume-schedule)."""
    if state is None:
        return {"start": 0, "end": cfg.epochs, "update0": 0}, ""
    done = int(state["epoch"]) + 1
    seg = dict(state.get("schedule") or {"start": 0, "end": int(side["args"]["epochs"]), "update0": 0})
    if cfg.epochs < done:
        raise UserError(f"--resume {out}: the run has already trained {done} epochs; --epochs {cfg.epochs} is fewer")
    if cfg.epochs == seg["end"] or cfg.epochs <= done:
        return seg, ""
    if "model" in state:
        raise UserError(f"--resume {out}: the run stopped inside epoch {done + 1}; finish it with --epochs "
                        f"{seg['end']} before extending it")
    if cfg.resume_schedule == "restart":
        seg = {"start": done, "end": cfg.epochs, "update0": int(state["num_updates"])}
        return seg, (f"extending {out} from {done} to {cfg.epochs} epochs: a new cosine from lr {cfg.lr:g} to "
                     f"{cfg.min_lr:g} over epochs {done + 1}-{cfg.epochs}, no warm-up (--resume-schedule restart)")
    return seg, (f"extending {out} from {done} to {cfg.epochs} epochs with the old schedule: epochs {seg['end'] + 1}-"
                 f"{cfg.epochs} train at its final lr {cfg.min_lr:g} (--resume-schedule continue)")


def _criterion(cfg: TrainConfig, num_classes: int) -> tuple[Any, nn.Module]:
    """(timm Mixup or None, the training loss): soft-target CE with mixup/cutmix, label smoothing, or plain CE."""
    from timm.data import Mixup
    from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

    if cfg.mixup > 0 or cfg.cutmix > 0:
        mixup_fn = Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, prob=cfg.mixup_prob,
                         switch_prob=cfg.mixup_switch_prob, mode=cfg.mixup_mode, label_smoothing=cfg.smoothing,
                         num_classes=num_classes)
        return mixup_fn, SoftTargetCrossEntropy()
    if cfg.smoothing > 0:
        return None, LabelSmoothingCrossEntropy(cfg.smoothing)
    return None, nn.CrossEntropyLoss()


@dataclasses.dataclass(kw_only=True, eq=False, repr=False)
class _ClassifyTask(TrainTask):
    """Image classification in the shared loop: epochs over the seeded sampler, validation and files at each
    epoch end, the per-update lr schedule. The fields are the run's pieces, built by `_train`; `meta` and
    `st_meta` are the fields every epoch's sidecar and safetensors header share (`_metas`)."""

    cfg: TrainConfig
    info: DistInfo
    loop: Loop
    model: nn.Module
    ddp_model: nn.Module
    sampler: Any
    train_loader: DataLoader
    val_loader: DataLoader
    scheduler: Any
    seg: dict[str, int]
    extend_note: str
    ema: Any
    precision: Precision
    mixup_fn: Any
    criterion: nn.Module
    out: Path
    global_batch: int
    on_epoch_end: Callable | None
    on_update: Callable | None
    meta: dict[str, Any]
    st_meta: dict[str, str]

    def __post_init__(self) -> None:
        self.epochs = self.cfg.epochs
        self.rows: list[dict[str, Any]] = []
        self.best_top1, self.best_epoch, self.metrics = -1.0, -1, {}
        self.best_state: dict[str, torch.Tensor] | None = None
        # Counters of completed epochs (kept in the state, so a resumed run reports its whole training), and the
        # sums of the running epoch.
        self.clock = {"seen": 0, "train_time": 0.0, "train_cpu": 0.0, "wall": 0.0}
        self.sums = {"seen": 0, "loss_sum": 0.0, "loss_n": 0, "time": 0.0, "cpu": 0.0}
        self.use_bar = self.info.is_main and sys.stderr.isatty()

    def load(self, state: dict[str, Any], out: Path) -> None:
        if not self.extend_note or self.cfg.resume_schedule == "continue":
            self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None and "ema" not in state:
            raise UserError(f"--resume {out}: the run has no EMA state; drop --model-ema")
        self.best_top1, self.best_epoch = float(state["best_top1"]), int(state["best_epoch"])
        self.clock.update({k: state.get("clock", {}).get(k, v) for k, v in self.clock.items()})
        self.sums.update(state.get("sums", {}))

    def state_dict(self) -> dict[str, Any]:
        pos = self.loop.pos
        return {"epoch": pos.epoch - 1, "num_updates": pos.step, "best_top1": self.best_top1,
                "best_epoch": self.best_epoch, "scheduler": self.scheduler.state_dict(), "arch": self.cfg.model,
                "schedule": dict(self.seg), "clock": dict(self.clock), "sums": dict(self.sums)}

    def start_epoch(self, epoch: int, fresh: bool) -> None:
        seed_everything(epoch_seed(self.cfg.seed, epoch, self.info.rank))
        if fresh:
            self.sums = {"seen": 0, "loss_sum": 0.0, "loss_n": 0, "time": 0.0, "cpu": 0.0}
        self.ddp_model.train()
        self.t0 = time.perf_counter() - self.sums["time"]
        self.c0 = time.process_time() - self.sums["cpu"]

    def batches(self, epoch: int, skip: int) -> Any:
        self.sampler.set_epoch(epoch, skip)
        self.t_data = time.perf_counter()
        if not self.use_bar:
            return self.train_loader
        from tqdm import tqdm

        self.bar = tqdm(self.train_loader, desc=f"epoch {epoch + 1}/{self.cfg.epochs}", leave=False,
                        dynamic_ncols=True, initial=skip, total=len(self.train_loader))
        return self.bar

    def epoch_len(self, epoch: int) -> int:
        return len(self.train_loader)

    def prepare(self, batch: Any) -> Any:
        self.data_time = time.perf_counter() - self.t_data
        x, y = batch
        x, y = x.to(self.info.device, non_blocking=True), y.to(self.info.device, non_blocking=True)
        if self.cfg.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.mixup_fn is not None:
            x, y = mix_batch(self.mixup_fn, x, y)
        return x, y

    def loss(self, batch: Any) -> torch.Tensor:
        x, y = batch
        return self.criterion(self.ddp_model(x), y)

    def check_loss(self, loss: torch.Tensor, pos: Position) -> None:
        if not torch.isfinite(loss):
            raise UserError(f"training diverged: loss is {loss.item()} at epoch {pos.epoch + 1} batch "
                            f"{pos.batch + 1}; lower --lr or enable --clip-grad (nothing saved was changed)")

    def after_update(self, pos: Position) -> bool:
        self.scheduler.step_update(num_updates=pos.step - self.seg["update0"])
        if self.on_update is not None:
            self.on_update(pos)
        return False

    def after_batch(self, pos: Position, loss: torch.Tensor, batch: Any, seconds: float, cpu: float) -> None:
        n = len(batch[0])
        s = self.sums
        s["loss_sum"] += loss.item() * n
        s["loss_n"] += n
        s["seen"] += n * self.info.world_size
        s["time"], s["cpu"] = time.perf_counter() - self.t0, time.process_time() - self.c0
        lr = self.loop.optimizer.param_groups[0]["lr"]
        if self.use_bar:
            self.bar.set_postfix(loss=f"{loss.item():.4f}", lr=f"{lr:.2e}")
        elif self.info.is_main and self.cfg.log_interval > 0 and pos.batch % self.cfg.log_interval == 0:
            dt, i = s["time"], pos.batch
            _logger.info("epoch %d [%d/%d]  loss %.4f  %.3fs/batch  %.0f img/s  lr %.3e  data %.3fs", pos.epoch + 1,
                         i, len(self.train_loader), loss.item(), dt / i, i * self.global_batch / dt, lr,
                         self.data_time)
        self.t_data = time.perf_counter()

    def end_epoch(self, pos: Position) -> bool:
        cfg, epoch, s = self.cfg, pos.epoch, self.sums
        dt, cpu = time.perf_counter() - self.t0, time.process_time() - self.c0
        loss_sum, loss_n = all_reduce_sum([s["loss_sum"], s["loss_n"]], self.info)
        amp = self.precision.autocast if cfg.amp else None
        device = self.info.device
        self.metrics = evaluate(self.model, self.val_loader, device, self.info, amp, cfg.channels_last)
        row: dict[str, Any] = {"epoch": epoch + 1, "train_loss": loss_sum / max(loss_n, 1), **self.metrics,
                               "lr": self.loop.optimizer.param_groups[0]["lr"], "time": round(dt, 3)}
        if self.ema is not None:
            ema_metrics = evaluate(self.ema.module, self.val_loader, device, self.info, amp, cfg.channels_last)
            row.update({f"ema_{k}": v for k, v in ema_metrics.items()})
        self.scheduler.step(epoch + 1 - self.seg["start"], self.metrics["eval_top1"])
        self.rows.append(row)
        is_best = self.metrics["eval_top1"] > self.best_top1
        if is_best:
            self.best_top1, self.best_epoch = self.metrics["eval_top1"], epoch
            self.best_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        _logger.info("epoch %d/%d  train_loss %.4f  eval_loss %.4f  eval_top1 %.2f  eval_top5 %.2f  lr %.3e  "
                     "(%.1fs, %.0f img/s)", epoch + 1, cfg.epochs, row["train_loss"], self.metrics["eval_loss"],
                     self.metrics["eval_top1"], self.metrics["eval_top5"], row["lr"], dt,
                     len(self.train_loader) * self.global_batch / dt)
        c = self.clock
        self.clock = {"seen": c["seen"] + s["seen"], "train_time": c["train_time"] + dt,
                      "train_cpu": c["train_cpu"] + cpu, "wall": c["wall"] + time.perf_counter() - self.t0}
        self.sums = {"seen": 0, "loss_sum": 0.0, "loss_n": 0, "time": 0.0, "cpu": 0.0}
        if self.info.is_main:
            _save_epoch(self.out, self.model, self.ema, self.meta, self.st_meta, epoch, row, self.rows, is_best,
                        dataclasses.asdict(cfg))
        self.row = row
        return True

    def after_save(self, pos: Position) -> None:
        if self.on_epoch_end is not None:
            self.on_epoch_end(pos.epoch - 1, self.row)


def _train(cfg: TrainConfig, info: DistInfo, on_epoch_end: Callable | None, on_update: Callable | None
           ) -> dict[str, Any]:
    from timm.utils import ModelEmaV3, dispatch_clip_grad

    _check_config(cfg, info)
    rss0 = rss_mb()
    out = prepare_output(cfg)
    state, side = _read_resume(cfg, out)
    source = open_source(cfg.data, cfg.dataset_download)
    num_classes = cfg.num_classes or len(source.classes)
    if num_classes < len(source.classes):
        raise UserError(f"--num-classes {num_classes} is below the data's {len(source.classes)} classes")
    model, dcfg, in_chans, img_size = _build(cfg, info, source, num_classes, out, state, side)
    train_set, sampler, train_loader, val_loader = _train_data(cfg, info, source, dcfg, in_chans, img_size)
    model, ddp_model = _wrap(model, cfg, info)
    optimizer = build_optimizer(model, cfg)
    updates_per_epoch = math.ceil(len(train_loader) / cfg.grad_accum_steps)
    seg, extend_note = _segment(cfg, state, side, out)
    scheduler = _schedule(optimizer, cfg, updates_per_epoch, seg)
    ema = ModelEmaV3(model, decay=cfg.model_ema_decay, use_warmup=cfg.model_ema_warmup) if cfg.model_ema else None
    precision = Precision(info.device, cfg.amp, cfg.amp_dtype)
    mixup_fn, criterion = _criterion(cfg, num_classes)
    n_params = sum(p.numel() for p in model.parameters())
    if cfg.dry_run:
        return {"dry_run": True, "config": dataclasses.asdict(cfg), "num_classes": num_classes,
                "img_size": img_size, "in_chans": in_chans, "params": n_params, "train_images": len(train_set),
                "updates_per_epoch": updates_per_epoch, "optimizer": type(optimizer).__name__,
                "scheduler": type(scheduler).__name__, "output": os.fspath(out)}
    clip = (lambda: dispatch_clip_grad(model.parameters(), cfg.clip_grad, mode=cfg.clip_mode)) \
        if cfg.clip_grad is not None else None
    loop = Loop(model=model, optimizer=optimizer, precision=precision, state_path=out / "last_state.pth", info=info,
                accum_steps=cfg.grad_accum_steps, clip=clip, ema=ema, checkpoint_every=cfg.checkpoint_every)
    task = _ClassifyTask(
        cfg=cfg, info=info, loop=loop, model=model, ddp_model=ddp_model, sampler=sampler, train_loader=train_loader,
        val_loader=val_loader, scheduler=scheduler, seg=seg, extend_note=extend_note, ema=ema, precision=precision,
        mixup_fn=mixup_fn, criterion=criterion, out=out, global_batch=cfg.batch_size * info.world_size,
        on_epoch_end=on_epoch_end, on_update=on_update, **_metas(cfg, model, dcfg, source, out))
    if state is not None:
        done = _resume(loop, task, loop.for_rank(state), out)
        if done is not None:
            return done
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        write_args(out, cfg)
    _logger.info("model %s: %.3fM params, %d classes, %dx%d input, %d train images, global batch %d, %d rank(s)",
                 cfg.model, n_params / 1e6, num_classes, img_size, img_size, len(train_set), task.global_batch,
                 info.world_size)
    loop.fit(task)
    return _final_report(cfg, info, task, source, dcfg, n_params, rss0)


def _metas(cfg: TrainConfig, model: nn.Module, dcfg: dict[str, Any], source: ImageSource, out: Path
           ) -> dict[str, Any]:
    """The sidecar (`meta`) and safetensors header (`st_meta`) fields every epoch's files share."""
    from ..version import __version__

    meta = {"arch": cfg.model, "classes": source.classes, "num_classes": len(source.classes)
            if not cfg.num_classes else cfg.num_classes, "data_config": dcfg, "subquad_version": __version__}
    st_meta = {"subquad_version": __version__, "arch": cfg.model, "source": f"trained:{out.name}",
               "pretrained_cfg": json.dumps(dict(getattr(model, "pretrained_cfg", {}) or {}), default=str),
               "dtype": str(next(model.parameters()).dtype).replace("torch.", ""), "remap": "none"}
    return {"meta": meta, "st_meta": st_meta}


def _resume(loop: Loop, task: _ClassifyTask, state: dict[str, Any], out: Path) -> dict[str, Any] | None:
    """Restore loop and task from `state`; the report of a run that is already complete, else None."""
    cfg = task.cfg
    pos = Position(**state["position"]) if "position" in state else \
        Position(int(state["epoch"]) + 1, 0, int(state["num_updates"]))
    task.load(state, out)
    loop.load_state_dict(state, pos)
    task.rows = [r for r in read_csv(out / "summary.csv") if int(r["epoch"]) <= pos.epoch]
    if pos.epoch >= cfg.epochs and (out / "results.json").is_file():
        res = read_json(out / "results.json")
        return {"complete": True, "epochs": pos.epoch, "output": os.fspath(out), "results": res}
    if task.extend_note:
        _logger.info("%s", task.extend_note)
    elif pos.batch:
        _logger.info("resuming %s inside epoch %d of %d, after batch %d (update %d)", out, pos.epoch + 1,
                     cfg.epochs, pos.batch, pos.step)
    elif pos.epoch < cfg.epochs:
        _logger.info("resuming %s after epoch %d of %d", out, pos.epoch, cfg.epochs)
    return None


def _final_report(cfg: TrainConfig, info: DistInfo, task: _ClassifyTask, source: ImageSource,
                  dcfg: dict[str, Any], n_params: int, rss0: float) -> dict[str, Any]:
    """The one read of the test split: the weights validation selected, after the last epoch (results.json)."""
    from ..models._builder import read_state_dict
    from ..version import __version__

    out, model, metrics, clock = task.out, task.model, task.metrics, task.clock
    if not metrics and task.rows:
        last = task.rows[-1]
        metrics = {k: float(last[k]) for k in ("eval_loss", "eval_top1", "eval_top5")}
    model.load_state_dict(task.best_state if task.best_state is not None else
                          read_state_dict(out / "best.safetensors"))
    report_split = source.test_split or source.val_split
    test_loader = eval_loader(source, report_split, dcfg, cfg.validation_batch_size or 2 * cfg.batch_size,
                              cfg.workers, cfg.test_limit if source.test_split else cfg.eval_limit, cfg.seed, info)
    t0 = time.perf_counter()
    final = evaluate(model, test_loader, info.device, info, task.precision.autocast if cfg.amp else None,
                     cfg.channels_last)
    eval_dt = time.perf_counter() - t0
    results = {"split": report_split, "top1": final["eval_top1"], "top5": final["eval_top5"],
               "loss": final["eval_loss"], "images": len(test_loader.dataset),
               "checkpoint": "best.safetensors", "selected_on": source.val_split,
               "best_epoch": task.best_epoch + 1, "best_val_top1": task.best_top1,
               "last_val_top1": metrics["eval_top1"], "epochs": cfg.epochs, "params": n_params,
               "train_images_per_sec": clock["seen"] / clock["train_time"] if clock["train_time"] > 0 else None,
               "train_images_per_cpu_sec": clock["seen"] / clock["train_cpu"] if clock["train_cpu"] > 0 else None,
               "eval_images_per_sec": len(test_loader.dataset) / eval_dt if eval_dt > 0 else None,
               "wall_s": clock["wall"] + eval_dt,
               "peak_mem_mb": peak_memory_mb(info.device, rss0), "threads": torch.get_num_threads(),
               "subquad": __version__, "torch": torch.__version__}
    if info.is_main:
        write_json(results, out / "results.json")
    return {**metrics, "best_top1": task.best_top1, "best_epoch": task.best_epoch + 1, "report_split": report_split,
            "report_top1": final["eval_top1"], "report_top5": final["eval_top5"], "results": results,
            "images_per_sec": results["train_images_per_sec"] or 0.0, "output": os.fspath(out),
            "checkpoint": os.fspath(out / "best.safetensors"), "last": os.fspath(out / "last.safetensors")}


def _save_epoch(out: Path, model: nn.Module, ema: Any, meta: dict, st_meta: dict, epoch: int, row: dict,
                rows: list[dict], is_best: bool, args: dict[str, Any]) -> None:
    """Write last_* (and best_* on improvement) and summary.csv, each atomically (the loop writes the state)."""
    metrics = {k: v for k, v in row.items() if k != "epoch"}
    sidecar = {**meta, "epoch": epoch + 1, "metrics": metrics, "args": args}
    for tag in ["last"] + (["best"] if is_best else []):
        save_weights(model, out / f"{tag}.safetensors", {**st_meta, "epoch": str(epoch), "ema": "false"})
        if ema is not None:
            save_weights(ema.module, out / f"{tag}_ema.safetensors", {**st_meta, "epoch": str(epoch), "ema": "true"})
        write_json({**sidecar, "weights": f"{tag}.safetensors"}, out / f"{tag}.json")
    write_csv(out / "summary.csv", rows)
