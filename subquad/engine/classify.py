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
exactly the batches, augmentations and drop-path draws of the uninterrupted run. Resuming a finished run reports it
complete; `--resume DIR --epochs N` with N above the run's epochs extends it, with the schedule `--resume-schedule`
names (restart: a new cosine from --lr over the added epochs; continue: the old schedule, whose lr has reached
min_lr).

Pieces from timm: create_transform, Mixup/CutMix, SoftTargetCrossEntropy, LabelSmoothingCrossEntropy,
create_optimizer_v2, create_scheduler_v2, ModelEmaV3, dispatch_clip_grad, accuracy.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import logging
import math
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch import nn
from torch.utils.data import DataLoader

from ..data.registry import ImageSource, TransformDataset, build_transform, open_source, resolve_aug
from ..data.video import multiview_logits
from ..errors import UserError
from .checkpoint import atomic_write, load_state, read_json, save_state, save_weights, write_json
from .config import TrainConfig
from .distributed import DistInfo, GlobalBatchSampler, all_reduce_sum, cleanup, init_distributed, train_sampler
from .optim import build_optimizer, build_scheduler
from .sequence import _rss_mb, peak_memory_mb

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


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def build_model(name: str, num_classes: int, img_size: int | None = None, drop_path: float | None = None,
                drop: float = 0.0, device: torch.device | str = "cpu",
                model_kwargs: dict[str, Any] | None = None) -> nn.Module:
    """create_model with the options every image model takes (plus `model_kwargs` for the model's constructor);
    unknown names and refused sizes are a UserError."""
    from ..models import create_model

    kw: dict[str, Any] = {**(model_kwargs or {}), "num_classes": num_classes}
    if drop_path is not None:
        kw["drop_path_rate"] = drop_path
    if drop:
        kw["drop_rate"] = drop
    if img_size is not None:
        if img_size < 1:
            raise UserError(f"--img-size must be >= 1, got {img_size}")
        kw["img_size"] = img_size
    try:
        try:
            model = create_model(name, **kw)
        except TypeError as e:
            if "img_size" not in str(e):
                raise
            kw.pop("img_size")
            model = create_model(name, **kw)
    except UserError:
        raise
    except (ValueError, AssertionError, RuntimeError, TypeError) as e:
        raise UserError(f"cannot build model {name!r} with {kw}: {_first_line(e)}") from None
    return model.to(device)


def model_input(model: nn.Module, img_size: int | None) -> tuple[int, int]:
    """(in_chans, side) the model takes: its pretrained_cfg's input_size unless `img_size` is given."""
    c, h, _ = (getattr(model, "pretrained_cfg", None) or {}).get("input_size", (3, 224, 224))
    return int(c), int(img_size or h)


@torch.no_grad()
def check_img_size(model: nn.Module, name: str, in_chans: int, img_size: int, device: torch.device) -> None:
    """One eval forward at the requested size; a model that cannot take it gives a one-line UserError."""
    was_training = model.training
    model.eval()
    try:
        model(torch.zeros(1, in_chans, img_size, img_size, device=device))
    except (RuntimeError, ValueError, AssertionError, IndexError) as e:
        raise UserError(f"model {name!r} cannot take --img-size {img_size}: {_first_line(e)}") from None
    finally:
        model.train(was_training)


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
                   seed: int = 0, hflip: float = 0.0, aug: str = "none", views: tuple[int, int] = (1, 1)):
    """A `VideoClipDataset` of `split`: clips (C, T, S, S), or (V, C, T, S, S) for multi-view evaluation.
    Training augmentation: 'none' (random temporal start only), 'light' (+ random resized crop), 'timm' (+ crop and
    horizontal flip with probability `hflip`)."""
    from ..data.video import VideoClipDataset

    base = source.dataset(split, limit, seed)
    samples = [base[i] for i in range(len(base))]
    v = dcfg["video"]
    kw: dict[str, Any] = {}
    if training and aug == "none":
        kw["scale"] = (1.0, 1.0)
        kw["ratio"] = (1.0, 1.0)
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


def _epoch_seed(seed: int, epoch: int, rank: int) -> int:
    return (seed * 1_000_003 + (epoch + 1) * 7_919 + rank * 104_729) % (2**31 - 1)


def _seed_everything(s: int) -> None:
    random.seed(s)
    np.random.seed(s % (2**32))
    torch.manual_seed(s)


def _rng_state() -> dict[str, Any]:
    py = random.getstate()
    npst = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": [py[0], list(py[1]), py[2]],
             "numpy": [npst[0], torch.from_numpy(npst[1].astype(np.int64)), int(npst[2]), int(npst[3]),
                       float(npst[4])]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], n[1].numpy().astype(np.uint32), n[2], n[3], n[4]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    fields = list(dict.fromkeys(k for r in rows for k in r))

    def _w(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)

    atomic_write(path, _w)


def _read_csv(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _check_config(cfg: TrainConfig, info: DistInfo) -> None:
    if cfg.epochs < 1:
        raise UserError(f"--epochs must be >= 1, got {cfg.epochs}")
    if cfg.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {cfg.batch_size}")
    if cfg.grad_accum_steps < 1:
        raise UserError(f"--grad-accum-steps must be >= 1, got {cfg.grad_accum_steps}")
    if (cfg.mixup > 0 or cfg.cutmix > 0) and cfg.batch_size % 2:
        raise UserError(f"--mixup/--cutmix need an even --batch-size, got {cfg.batch_size}")
    if cfg.amp and cfg.amp_dtype == "float16" and info.device.type == "cpu":
        _logger.warning("--amp-dtype float16 on CPU is slow; bfloat16 is the usual choice there")
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


def _prepare_output(cfg: TrainConfig, info: DistInfo) -> Path:
    if cfg.resume:
        return Path(cfg.resume)
    out = Path(cfg.output or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{cfg.model}")
    if out.exists() and not out.is_dir():
        raise UserError(f"--output {out} exists and is not a directory")
    if (out / "last.safetensors").exists() or (out / "last_state.pth").exists():
        raise UserError(f"--output {out} already holds a run; continue it with --resume {out} or choose another "
                        "--output (nothing was overwritten)")
    return out


def train(cfg: TrainConfig, on_epoch_end: Callable[[int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train `cfg.model` on `cfg.data` (DDP when launched by torchrun); returns final metrics and paths.

    Args:
        cfg: the resolved config.
        on_epoch_end: called as on_epoch_end(epoch, row) after each epoch's files are written (tests use it to
            interrupt a run).
    """
    info = init_distributed(cfg.device)
    if not info.is_main:
        logging.getLogger("subquad").setLevel(logging.WARNING)
    try:
        return _train(cfg, info, on_epoch_end)
    finally:
        cleanup(info)


def _train(cfg: TrainConfig, info: DistInfo, on_epoch_end: Callable | None) -> dict[str, Any]:
    from timm.data import Mixup
    from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
    from timm.utils import ModelEmaV3, dispatch_clip_grad

    from ..models._builder import load_into, read_state_dict
    from ..version import __version__

    _check_config(cfg, info)
    rss0 = _rss_mb()
    device = info.device
    out = _prepare_output(cfg, info)
    resume_state: dict[str, Any] | None = None
    if cfg.resume:
        for f in ("last.safetensors", "last_state.pth", "last.json"):
            if not (out / f).is_file():
                raise UserError(f"--resume {out}: {f} is missing (the run saved no complete epoch)")
        resume_state = load_state(out / "last_state.pth")

    source = open_source(cfg.data, cfg.dataset_download)
    num_classes = cfg.num_classes or len(source.classes)
    if num_classes < len(source.classes):
        raise UserError(f"--num-classes {num_classes} is below the data's {len(source.classes)} classes")
    _seed_everything(_epoch_seed(cfg.seed, -1, 0))
    model_kwargs = _video_model_kwargs(cfg, source)
    model = build_model(cfg.model, num_classes, cfg.img_size, cfg.drop_path, cfg.drop, device, model_kwargs)
    if source.video and not getattr(model, "video", False):
        raise UserError(f"model {cfg.model!r} takes images; video data needs a video model (e.g. "
                        "hylisanet_micro_video, hylisanet_s_video)")
    in_chans, img_size = model_input(model, cfg.img_size)
    check_img_size(model, cfg.model, in_chans, img_size, device)
    if cfg.inflate_from and resume_state is None:
        _inflate_into(model, cfg.inflate_from)
    if resume_state is not None:
        side = read_json(out / "last.json")
        if side.get("arch") != cfg.model:
            raise UserError(f"--resume {out}: the run trained {side.get('arch')!r}, not {cfg.model!r}")
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
    train_base = source.dataset(source.train_split, cfg.train_limit, cfg.seed)
    aug, aug_why = resolve_aug(source, img_size, len(train_base), "none" if cfg.no_aug else cfg.aug)
    dcfg["aug"] = aug
    _logger.info("augmentation: %s (%s) [%s]; change with --aug none|light|timm", aug,
                 _VIDEO_AUG_WHAT[aug] if source.video else _AUG_WHAT[aug], aug_why)
    train_tf = build_transform(source, img_size, True, aug=aug, interpolation=cfg.interpolation,
                               crop_pct=cfg.crop_pct, mean=tuple(dcfg["mean"]), std=tuple(dcfg["std"]),
                               scale=tuple(cfg.scale) if cfg.scale else None,
                               ratio=tuple(cfg.ratio) if cfg.ratio else None, hflip=cfg.hflip,
                               color_jitter=cfg.color_jitter, aa=cfg.aa, reprob=cfg.reprob, remode=cfg.remode,
                               recount=cfg.recount, train_interpolation=cfg.train_interpolation, in_chans=in_chans)
    mode = "L" if in_chans == 1 else "RGB"
    if source.video:
        train_set = _video_dataset(source, source.train_split, dcfg, True, cfg.train_limit, cfg.seed, cfg.hflip, aug)
    else:
        train_set = TransformDataset(train_base, train_tf, mode)
    global_batch = cfg.batch_size * info.world_size
    sampler = train_sampler(len(train_set), cfg.batch_size, info, cfg.seed)
    train_loader = DataLoader(train_set, cfg.batch_size, sampler=sampler, num_workers=cfg.workers,
                              pin_memory=cfg.pin_mem, drop_last=True, persistent_workers=False)
    val_loader = eval_loader(source, source.val_split, dcfg, cfg.validation_batch_size or 2 * cfg.batch_size,
                             cfg.workers, cfg.eval_limit, cfg.seed, info)

    ddp_model: nn.Module = model
    if info.enabled:
        if cfg.sync_bn:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        ddp_model = nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    if cfg.compile:
        # Training forwards only; evaluation and checkpoints use the eager module (same parameters, plain keys).
        ddp_model = torch.compile(ddp_model)
    optimizer = build_optimizer(model, cfg)
    updates_per_epoch = math.ceil(len(train_loader) / cfg.grad_accum_steps)
    # The schedule segment: epochs [start, end) and the update count at its start. A fresh run has one segment over
    # all its epochs; extending a finished run (--resume with a larger --epochs) may add one (see --resume-schedule).
    seg = {"start": 0, "end": cfg.epochs, "update0": 0}
    extend_note = ""
    if resume_state is not None:
        done = int(resume_state["epoch"]) + 1
        seg = dict(resume_state.get("schedule") or {"start": 0, "end": int(side["args"]["epochs"]), "update0": 0})
        if cfg.epochs < done:
            raise UserError(f"--resume {out}: the run has already trained {done} epochs; --epochs {cfg.epochs} is "
                            "fewer")
        if cfg.epochs != seg["end"] and cfg.epochs > done:
            if cfg.resume_schedule == "restart":
                seg = {"start": done, "end": cfg.epochs, "update0": int(resume_state["num_updates"])}
                extend_note = (f"extending {out} from {done} to {cfg.epochs} epochs: a new cosine from lr {cfg.lr:g} "
                               f"to {cfg.min_lr:g} over epochs {done + 1}-{cfg.epochs}, no warm-up "
                               "(--resume-schedule restart)")
            else:
                extend_note = (f"extending {out} from {done} to {cfg.epochs} epochs with the old schedule: epochs "
                               f"{seg['end'] + 1}-{cfg.epochs} train at its final lr {cfg.min_lr:g} "
                               "(--resume-schedule continue)")
    scheduler = _schedule(optimizer, cfg, updates_per_epoch, seg)
    ema = ModelEmaV3(model, decay=cfg.model_ema_decay, use_warmup=cfg.model_ema_warmup) if cfg.model_ema else None
    amp_dtype = torch.bfloat16 if cfg.amp_dtype == "bfloat16" else torch.float16
    scaler = torch.amp.GradScaler(device.type) if cfg.amp and amp_dtype == torch.float16 and \
        device.type == "cuda" else None

    def amp_ctx() -> contextlib.AbstractContextManager:
        return torch.autocast(device.type, dtype=amp_dtype) if cfg.amp else contextlib.nullcontext()

    mixup_fn = None
    if cfg.mixup > 0 or cfg.cutmix > 0:
        mixup_fn = Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, prob=cfg.mixup_prob,
                         switch_prob=cfg.mixup_switch_prob, mode=cfg.mixup_mode, label_smoothing=cfg.smoothing,
                         num_classes=num_classes)
        criterion: nn.Module = SoftTargetCrossEntropy()
    elif cfg.smoothing > 0:
        criterion = LabelSmoothingCrossEntropy(cfg.smoothing)
    else:
        criterion = nn.CrossEntropyLoss()

    n_params = sum(p.numel() for p in model.parameters())
    if cfg.dry_run:
        return {"dry_run": True, "config": dataclasses.asdict(cfg), "num_classes": num_classes,
                "img_size": img_size, "in_chans": in_chans, "params": n_params, "train_images": len(train_set),
                "updates_per_epoch": updates_per_epoch, "optimizer": type(optimizer).__name__,
                "scheduler": type(scheduler).__name__, "output": os.fspath(out)}

    start_epoch, num_updates, best_top1, best_epoch = 0, 0, -1.0, -1
    rows: list[dict[str, Any]] = []
    if resume_state is not None:
        optimizer.load_state_dict(resume_state["optimizer"])
        if not extend_note or cfg.resume_schedule == "continue":
            scheduler.load_state_dict(resume_state["scheduler"])
        if scaler is not None and resume_state.get("scaler"):
            scaler.load_state_dict(resume_state["scaler"])
        if ema is not None:
            if "ema" not in resume_state:
                raise UserError(f"--resume {out}: the run has no EMA state; drop --model-ema")
            ema.module.load_state_dict(resume_state["ema"])
        _set_rng_state(resume_state["rng"])
        start_epoch = int(resume_state["epoch"]) + 1
        num_updates = int(resume_state["num_updates"])
        best_top1, best_epoch = float(resume_state["best_top1"]), int(resume_state["best_epoch"])
        rows = [r for r in _read_csv(out / "summary.csv") if int(r["epoch"]) <= start_epoch]
        if start_epoch >= cfg.epochs and (out / "results.json").is_file():
            res = read_json(out / "results.json")
            return {"complete": True, "epochs": start_epoch, "output": os.fspath(out), "results": res}
        if extend_note:
            _logger.info("%s", extend_note)
        elif start_epoch < cfg.epochs:
            _logger.info("resuming %s after epoch %d of %d", out, start_epoch, cfg.epochs)
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "args.yaml", lambda tmp: Path(tmp).write_text(
            yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False)))
    _logger.info("model %s: %.3fM params, %d classes, %dx%d input, %d train images, global batch %d, %d rank(s)",
                 cfg.model, n_params / 1e6, num_classes, img_size, img_size, len(train_set), global_batch,
                 info.world_size)

    meta = {"arch": cfg.model, "classes": source.classes, "num_classes": num_classes, "data_config": dcfg,
            "subquad_version": __version__}
    st_meta = {"subquad_version": __version__, "arch": cfg.model, "source": f"trained:{out.name}",
               "pretrained_cfg": json.dumps(dict(getattr(model, "pretrained_cfg", {}) or {}), default=str),
               "dtype": str(next(model.parameters()).dtype).replace("torch.", ""), "remap": "none"}
    use_bar = info.is_main and sys.stderr.isatty()
    metrics: dict[str, float] = {}
    # Counters of completed epochs (kept in last_state.pth, so a resumed run reports its whole training).
    clock = {"seen": 0, "train_time": 0.0, "train_cpu": 0.0, "wall": 0.0}
    if resume_state is not None:
        clock.update({k: resume_state.get("clock", {}).get(k, v) for k, v in clock.items()})
    best_state: dict[str, torch.Tensor] | None = None
    for epoch in range(start_epoch, cfg.epochs):
        _seed_everything(_epoch_seed(cfg.seed, epoch, info.rank))
        sampler.set_epoch(epoch)
        ddp_model.train()
        t0, c0 = time.perf_counter(), time.process_time()
        seen = 0
        loss_sum, loss_n = 0.0, 0
        batches: Any = train_loader
        if use_bar:
            from tqdm import tqdm

            batches = tqdm(train_loader, desc=f"epoch {epoch + 1}/{cfg.epochs}", leave=False, dynamic_ncols=True)
        t_data = time.perf_counter()
        for i, (x, y) in enumerate(batches):
            data_time = time.perf_counter() - t_data
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if cfg.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            if mixup_fn is not None:
                x, y = mixup_fn(x, y)
            with amp_ctx():
                loss = criterion(ddp_model(x), y)
            if not torch.isfinite(loss):
                raise UserError(f"training diverged: loss is {loss.item()} at epoch {epoch + 1} batch {i + 1}; "
                                "lower --lr or enable --clip-grad (nothing saved was changed)")
            if scaler is not None:
                scaler.scale(loss / cfg.grad_accum_steps).backward()
            else:
                (loss / cfg.grad_accum_steps).backward()
            if (i + 1) % cfg.grad_accum_steps == 0 or i + 1 == len(train_loader):
                if scaler is not None:
                    scaler.unscale_(optimizer)
                if cfg.clip_grad is not None:
                    dispatch_clip_grad(model.parameters(), cfg.clip_grad, mode=cfg.clip_mode)
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                num_updates += 1
                if ema is not None:
                    ema.update(model, step=num_updates)
                scheduler.step_update(num_updates=num_updates - seg["update0"])
            loss_sum += loss.item() * len(x)
            loss_n += len(x)
            seen += len(x) * info.world_size
            if use_bar:
                batches.set_postfix(loss=f"{loss.item():.4f}", lr=f"{optimizer.param_groups[0]['lr']:.2e}")
            elif info.is_main and cfg.log_interval > 0 and (i + 1) % cfg.log_interval == 0:
                dt = time.perf_counter() - t0
                _logger.info("epoch %d [%d/%d]  loss %.4f  %.3fs/batch  %.0f img/s  lr %.3e  data %.3fs",
                             epoch + 1, i + 1, len(train_loader), loss.item(), dt / (i + 1),
                             (i + 1) * global_batch / dt, optimizer.param_groups[0]["lr"], data_time)
            t_data = time.perf_counter()
        dt = time.perf_counter() - t0
        cpu = time.process_time() - c0
        loss_sum, loss_n = all_reduce_sum([loss_sum, loss_n], info)
        metrics = evaluate(model, val_loader, device, info, amp_ctx if cfg.amp else None, cfg.channels_last)
        row: dict[str, Any] = {"epoch": epoch + 1, "train_loss": loss_sum / max(loss_n, 1), **metrics,
                               "lr": optimizer.param_groups[0]["lr"], "time": round(dt, 3)}
        if ema is not None:
            ema_metrics = evaluate(ema.module, val_loader, device, info, amp_ctx if cfg.amp else None,
                                   cfg.channels_last)
            row.update({f"ema_{k}": v for k, v in ema_metrics.items()})
        scheduler.step(epoch + 1 - seg["start"], metrics["eval_top1"])
        rows.append(row)
        is_best = metrics["eval_top1"] > best_top1
        if is_best:
            best_top1, best_epoch = metrics["eval_top1"], epoch
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        _logger.info("epoch %d/%d  train_loss %.4f  eval_loss %.4f  eval_top1 %.2f  eval_top5 %.2f  lr %.3e  "
                     "(%.1fs, %.0f img/s)", epoch + 1, cfg.epochs, row["train_loss"], metrics["eval_loss"],
                     metrics["eval_top1"], metrics["eval_top5"], row["lr"], dt, len(train_loader) * global_batch / dt)
        clock = {"seen": clock["seen"] + seen, "train_time": clock["train_time"] + dt,
                 "train_cpu": clock["train_cpu"] + cpu, "wall": clock["wall"] + time.perf_counter() - t0}
        if info.is_main:
            _save_epoch(out, model, ema, optimizer, scheduler, scaler, cfg, meta, st_meta, epoch, row, rows,
                        is_best, num_updates, best_top1, best_epoch, seg, clock)
        if on_epoch_end is not None:
            on_epoch_end(epoch, row)
    if not metrics and rows:
        last = rows[-1]
        metrics = {k: float(last[k]) for k in ("eval_loss", "eval_top1", "eval_top5")}
    # The one read of the test split: the weights validation selected, after the last epoch.
    if best_state is None:
        best_state = read_state_dict(out / "best.safetensors")
    model.load_state_dict(best_state)
    report_split = source.test_split or source.val_split
    test_loader = eval_loader(source, report_split, dcfg, cfg.validation_batch_size or 2 * cfg.batch_size,
                              cfg.workers, cfg.test_limit if source.test_split else cfg.eval_limit, cfg.seed, info)
    t0 = time.perf_counter()
    final = evaluate(model, test_loader, device, info, amp_ctx if cfg.amp else None, cfg.channels_last)
    eval_dt = time.perf_counter() - t0
    results = {"split": report_split, "top1": final["eval_top1"], "top5": final["eval_top5"],
               "loss": final["eval_loss"], "images": len(test_loader.dataset),
               "checkpoint": "best.safetensors", "selected_on": source.val_split, "best_epoch": best_epoch + 1,
               "best_val_top1": best_top1, "last_val_top1": metrics["eval_top1"], "epochs": cfg.epochs,
               "params": n_params,
               "train_images_per_sec": clock["seen"] / clock["train_time"] if clock["train_time"] > 0 else None,
               "train_images_per_cpu_sec": clock["seen"] / clock["train_cpu"] if clock["train_cpu"] > 0 else None,
               "eval_images_per_sec": len(test_loader.dataset) / eval_dt if eval_dt > 0 else None,
               "wall_s": clock["wall"] + eval_dt,
               "peak_mem_mb": peak_memory_mb(device, rss0), "threads": torch.get_num_threads(),
               "subquad": __version__, "torch": torch.__version__}
    if info.is_main:
        write_json(results, out / "results.json")
    return {**metrics, "best_top1": best_top1, "best_epoch": best_epoch + 1, "report_split": report_split,
            "report_top1": final["eval_top1"], "report_top5": final["eval_top5"], "results": results,
            "images_per_sec": results["train_images_per_sec"] or 0.0, "output": os.fspath(out),
            "checkpoint": os.fspath(out / "best.safetensors"), "last": os.fspath(out / "last.safetensors")}



def _save_epoch(out: Path, model: nn.Module, ema: Any, optimizer: torch.optim.Optimizer, scheduler: Any,
                scaler: Any, cfg: TrainConfig, meta: dict, st_meta: dict, epoch: int, row: dict, rows: list[dict],
                is_best: bool, num_updates: int, best_top1: float, best_epoch: int, seg: dict[str, int],
                clock: dict[str, float]) -> None:
    """Write last_* (and best_* on improvement), summary.csv and last_state.pth, each atomically."""
    metrics = {k: v for k, v in row.items() if k != "epoch"}
    sidecar = {**meta, "epoch": epoch + 1, "metrics": metrics, "args": dataclasses.asdict(cfg)}
    tags = ["last"] + (["best"] if is_best else [])
    for tag in tags:
        save_weights(model, out / f"{tag}.safetensors", {**st_meta, "epoch": str(epoch), "ema": "false"})
        if ema is not None:
            save_weights(ema.module, out / f"{tag}_ema.safetensors", {**st_meta, "epoch": str(epoch), "ema": "true"})
        write_json({**sidecar, "weights": f"{tag}.safetensors"}, out / f"{tag}.json")
    _write_csv(out / "summary.csv", rows)
    state = {"epoch": epoch, "num_updates": num_updates, "best_top1": best_top1, "best_epoch": best_epoch,
             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": _rng_state(),
             "arch": cfg.model, "schedule": dict(seg), "clock": dict(clock)}
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    if ema is not None:
        state["ema"] = ema.module.state_dict()
    save_state(state, out / "last_state.pth")
