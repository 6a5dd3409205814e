"""Train, evaluate and predict with dense models; the run-directory conventions of `subquad train`.

`train_dense(cfg, task)` writes (rank 0 only), each file atomically (engine.checkpoint):

    args.yaml                     the resolved DenseConfig
    summary.csv                   epoch, iters, train_loss, lr, time (+ the metrics of evaluated epochs)
    last.safetensors / last.json  weights after the latest epoch and their sidecar (task, kind, backbone, classes,
                                  config, metrics)
    best.safetensors / best.json  the evaluated epoch with the best bbox_mAP (detect) or mIoU (segment)
    last_state.pth                optimizer, RNG states and counters (tensors and plain containers only)

Resume (`--resume DIR`) continues after the last complete epoch with the same batches and random draws: the data
order of epoch e is a permutation drawn from (seed, e) and every RNG is re-seeded from (seed, e, rank) at its start.
`--checkpoint-every N` (iterations) and SIGTERM / SIGINT also write last_state.pth inside an epoch, with the weights,
sampler position and RNG states, from which `--resume` continues exactly (engine.loop).
`torchrun --nproc_per_node N -m subquad detect train ...` trains with DistributedDataParallel.

The learning rate is a pure function of the iteration (linear warm-up, then step / poly / cosine), so it needs no
scheduler state. Parameter groups: no weight decay for norms, biases, position embeddings, relative-position-bias
tables and the backbone's own no_weight_decay() names (mmdetection's paramwise_cfg in the Swin recipes), and the
backbone's rate times backbone_lr_mult.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Subset

from subquad_cli.denseconfig import DenseConfig

from ..engine.checkpoint import load_state, read_json, save_weights, write_json
from ..engine.distributed import DistInfo, GlobalBatchSampler, all_reduce_sum, cleanup, init_distributed, train_sampler
from ..engine.loop import Loop, Position, Precision, TrainTask
from ..engine.rng import epoch_seed, seed_everything
from ..engine.runfiles import prepare_output, read_csv, write_args, write_csv
from ..errors import UserError
from .backbone import FeatureBackbone
from .data import DenseSource, collate_detection, detection_transforms, open_dense_source, segmentation_transforms
from .detect import DETECTOR_KINDS, build_detector
from .metrics import coco_map, confusion_matrix, detections_to_coco, segmentation_scores
from .segment import SEGMENTER_KINDS, build_segmenter, segmentation_loss

__all__ = ["train_dense", "build_dense_model", "evaluate_detection", "evaluate_segmentation", "load_dense_run",
           "lr_factor", "param_groups", "DEFAULT_KIND", "BEST_METRIC"]

_logger = logging.getLogger(__name__)

DEFAULT_KIND = {"detect": "maskrcnn", "segment": "upernet"}
BEST_METRIC = {"detect": "bbox_mAP", "segment": "mIoU"}


def _kind(cfg: DenseConfig, task: str) -> str:
    kind = cfg.kind or DEFAULT_KIND[task]
    allowed = DETECTOR_KINDS if task == "detect" else SEGMENTER_KINDS
    if kind not in allowed:
        raise UserError(f"--kind {kind!r} is not a {'detector' if task == 'detect' else 'segmenter'}; allowed: "
                        f"{', '.join(allowed)}")
    return kind


def build_dense_model(cfg: DenseConfig, task: str, num_classes: int) -> nn.Module:
    """The detector or segmenter `cfg` describes (backbone weights from cfg.backbone_checkpoint when set)."""
    kind = _kind(cfg, task)
    out_indices = [int(i) for i in cfg.out_indices] if cfg.out_indices else None
    if task == "detect":
        model = build_detector(kind, cfg.model, num_classes, min_size=[int(s) for s in cfg.min_size],
                               max_size=cfg.max_size, fpn_channels=cfg.fpn_channels,
                               representation_size=cfg.representation_size,
                               mask_head_channels=cfg.mask_head_channels, drop_path_rate=cfg.drop_path,
                               pretrained_backbone=cfg.pretrained, score_thresh=cfg.score_thresh,
                               rpn_batch_size_per_image=cfg.rpn_batch_size_per_image,
                               box_batch_size_per_image=cfg.box_batch_size_per_image,
                               rpn_proposals=cfg.rpn_proposals, anchor_scale=cfg.anchor_scale,
                               out_indices=out_indices)
    else:
        model = build_segmenter(kind, cfg.model, num_classes, channels=cfg.head_channels,
                                fpn_channels=cfg.fpn_channels, drop_path_rate=cfg.drop_path,
                                pretrained_backbone=cfg.pretrained, aux_head=None if cfg.aux_weight else False,
                                out_indices=out_indices)
    if cfg.backbone_checkpoint:
        _load_backbone(feature_backbone(model), cfg.backbone_checkpoint)
    return model


def feature_backbone(model: nn.Module) -> FeatureBackbone:
    for m in model.modules():
        if isinstance(m, FeatureBackbone):
            return m
    raise ValueError("model has no FeatureBackbone")


def _load_backbone(fb: FeatureBackbone, path: str) -> None:
    """Load a classification checkpoint of the same architecture into the features_only body (head keys dropped)."""
    from ..models._builder import read_state_dict

    sd = read_state_dict(path)
    own = fb.body.state_dict()
    mapped = {}
    for k, v in sd.items():
        for cand in (k, f"model.{k}"):
            if cand in own and own[cand].shape == v.shape:
                mapped[cand] = v
                break
    if not mapped:
        raise UserError(f"--backbone-checkpoint {path}: no tensor fits backbone {fb.name!r} (a checkpoint of another "
                        "architecture?)")
    fb.body.load_state_dict(mapped, strict=False)
    _logger.info("backbone: loaded %d of %d tensors from %s", len(mapped), len(own), path)


_NO_DECAY_WORDS = ("pos_embed", "relative_position_bias_table", "absolute_pos_embed", "pos_block", "cpe", "rpe")


def param_groups(model: nn.Module, cfg: DenseConfig) -> list[dict[str, Any]]:
    """Four groups (backbone or not) x (decay or not); 'lr_mult' is read by the iteration-wise schedule."""
    fb = feature_backbone(model)
    inner = getattr(fb.body, "model", fb.body)
    nwd = set(inner.no_weight_decay()) if hasattr(inner, "no_weight_decay") else set()
    in_backbone = {id(p) for p in fb.parameters()}
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        no_decay = p.ndim <= 1 or name.endswith(".bias") or any(w in name for w in _NO_DECAY_WORDS) or \
            any(name.endswith(n) for n in nwd)
        groups.setdefault((id(p) in in_backbone, no_decay), []).append(p)
    out = []
    for (bb, nd), params in sorted(groups.items()):
        mult = cfg.backbone_lr_mult if bb else 1.0
        out.append({"params": params, "weight_decay": 0.0 if nd else cfg.weight_decay, "lr": cfg.lr * mult,
                    "lr_mult": mult})
    return out


def build_optimizer(model: nn.Module, cfg: DenseConfig) -> torch.optim.Optimizer:
    groups = param_groups(model, cfg)
    if cfg.opt == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum)
    betas = tuple(cfg.opt_betas) if cfg.opt_betas else (0.9, 0.999)
    if len(betas) != 2:
        raise UserError(f"--opt-betas takes two numbers, got {cfg.opt_betas}")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=betas)


def lr_factor(cfg: DenseConfig, it: int, total: int, iters_per_epoch: int) -> float:
    """Learning-rate factor at iteration `it` (0-based) of `total`: linear warm-up times the main schedule."""
    if cfg.sched == "step":
        drops = [int(round(s * total)) if s < 1 else int(round(s * iters_per_epoch)) for s in cfg.lr_steps]
        main = cfg.lr_gamma ** sum(it >= d for d in drops)
    else:
        frac = min(1.0, it / max(1, total))
        lo = cfg.min_lr / cfg.lr if cfg.lr > 0 else 0.0
        shape = (1 - frac) ** cfg.poly_power if cfg.sched == "poly" else 0.5 * (1 + math.cos(math.pi * frac))
        main = lo + (1 - lo) * shape
    if cfg.warmup_iters > 0 and it < cfg.warmup_iters:
        k = it / cfg.warmup_iters
        main *= cfg.warmup_ratio + (1 - cfg.warmup_ratio) * k
    return main


def _check(cfg: DenseConfig) -> None:
    for name in ("batch_size", "epochs"):
        if getattr(cfg, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    for name in ("max_iters", "train_limit", "eval_limit", "workers"):
        if getattr(cfg, name, 0) < 0:  # a negative limit would cut the split from its end
            raise UserError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(cfg, name)}")
    for name, n in (("scale", 2), ("ratio_range", 2), ("crop_size", 2)):
        if len(getattr(cfg, name)) != n:
            raise UserError(f"--{name.replace('_', '-')} takes {n} numbers, got {getattr(cfg, name)}")
    if not cfg.min_size or min(cfg.min_size) < 1:
        raise UserError(f"--min-size takes one or more positive sides, got {cfg.min_size}")


def _subset(ds, limit: int, seed: int):
    """A seeded random subset of `limit` items (all of `ds` when limit is 0 or not below its length)."""
    if limit < 0:
        raise UserError(f"a limit must be >= 0 (0: all), got {limit}")
    if limit and limit < len(ds):
        g = torch.Generator().manual_seed(seed)
        return Subset(ds, sorted(torch.randperm(len(ds), generator=g)[:limit].tolist()))
    return ds


def _amp(cfg_amp: bool, dtype: str, device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    dt = torch.bfloat16 if dtype == "bfloat16" else torch.float16
    return lambda: torch.autocast(device.type, dtype=dt) if cfg_amp else contextlib.nullcontext()


def _datasets(cfg: DenseConfig, task: str, source: DenseSource, num_classes: int, kind: str):
    if task == "detect":
        train = source.detection(source.train_split, detection_transforms(True, cfg.hflip), kind == "maskrcnn",
                                 remove_empty=True)
        val = source.detection(source.val_split, detection_transforms(False), kind == "maskrcnn")
    else:
        tf = segmentation_transforms(True, cfg.scale, cfg.ratio_range, cfg.crop_size, cfg.hflip, cfg.photometric)
        train = source.segmentation(source.train_split, num_classes, tf)
        val = source.segmentation(source.val_split, num_classes, segmentation_transforms(
            False, cfg.scale, cfg.ratio_range, cfg.crop_size))
    return train, val


@torch.no_grad()
def evaluate_detection(model: nn.Module, dataset, device: torch.device, info: DistInfo | None = None,
                       batch_size: int = 2, amp: Callable | None = None) -> dict[str, float]:
    """COCO box (and, for Mask R-CNN, mask) mAP / mAP50 of `model` on a CocoDetection (or a Subset of one)."""
    info = info or DistInfo()
    base = dataset.dataset if isinstance(dataset, Subset) else dataset
    indices = list(dataset.indices) if isinstance(dataset, Subset) else list(range(len(dataset)))
    if not indices:
        raise UserError("the evaluation split is empty")
    model.eval()
    sampler = GlobalBatchSampler(len(dataset), batch_size, info.rank, info.world_size, shuffle=False,
                                 drop_last=False)
    loader = DataLoader(dataset, batch_size, sampler=sampler, collate_fn=collate_detection)
    results: list[dict[str, Any]] = []
    for images, targets in loader:
        with amp() if amp else contextlib.nullcontext():
            outs = model([im.to(device) for im in images])
        outs = [{k: v.float() for k, v in o.items()} for o in outs]
        results += detections_to_coco(outs, [t["image_id"] for t in targets], base.label_to_cat)
    if info.enabled:
        import torch.distributed as dist

        gathered: list = [None] * info.world_size
        dist.all_gather_object(gathered, results)
        results = [r for part in gathered for r in part]
    img_ids = [base.ids[i] for i in indices]
    box = coco_map(base.coco, results, "bbox", img_ids)
    metrics = {"bbox_mAP": box["mAP"], "bbox_mAP50": box["mAP50"]}
    if getattr(model, "kind", "") == "maskrcnn":
        segm = coco_map(base.coco, results, "segm", img_ids)
        metrics.update({"segm_mAP": segm["mAP"], "segm_mAP50": segm["mAP50"]})
    return metrics


@torch.no_grad()
def evaluate_segmentation(model: nn.Module, dataset, device: torch.device, num_classes: int,
                          info: DistInfo | None = None, amp: Callable | None = None) -> dict[str, Any]:
    """mIoU and aAcc (fractions) of `model` on an ADE20KSegmentation (or Subset), logits resized to each label."""
    info = info or DistInfo()
    if len(dataset) == 0:
        raise UserError("the evaluation split is empty")
    model.eval()
    sampler = GlobalBatchSampler(len(dataset), 1, info.rank, info.world_size, shuffle=False, drop_last=False)
    cm = torch.zeros(num_classes, num_classes, dtype=torch.int64)
    for idx in sampler:
        img, _ = dataset[idx]
        base, j = (dataset.dataset, dataset.indices[idx]) if isinstance(dataset, Subset) else (dataset, idx)
        label = base.label(j)
        with amp() if amp else contextlib.nullcontext():
            logits = model(img[None].to(device))["out"].float()
        logits = F.interpolate(logits, size=tuple(label.shape), mode="bilinear", align_corners=False)
        cm += confusion_matrix(logits.argmax(1)[0].cpu(), label, num_classes)
    if info.enabled:
        import torch.distributed as dist

        t = cm.to(info.device if info.device.type == "cuda" else "cpu")
        dist.all_reduce(t)
        cm = t.cpu()
    s = segmentation_scores(cm)
    return {"mIoU": s["mIoU"], "aAcc": s["aAcc"], "IoU": s["IoU"]}


def _evaluate(task: str, model: nn.Module, val, device, info, cfg: DenseConfig, num_classes: int) -> dict:
    amp = _amp(cfg.amp, cfg.amp_dtype, device) if cfg.amp else None
    if task == "detect":
        return evaluate_detection(model, val, device, info, max(1, cfg.batch_size), amp)
    return evaluate_segmentation(model, val, device, num_classes, info, amp)


def train_dense(cfg: DenseConfig, task: str, on_epoch_end: Callable[[int, dict], None] | None = None,
                checkpoint_every: int = 0, on_update: Callable[[Position], None] | None = None) -> dict:
    """Train a detector (task 'detect') or segmenter ('segment') as `cfg` says; returns final metrics and paths.

    `checkpoint_every` > 0 (default: `cfg.checkpoint_every`) also writes last_state.pth every N iterations, inside
    epochs; SIGTERM / SIGINT write it and stop (`engine.loop.Preempted`); `--resume` continues from it exactly.
    `on_update(position)` follows every iteration (tests)."""
    info = init_distributed(cfg.device)
    if not info.is_main:
        logging.getLogger("subquad").setLevel(logging.WARNING)
    try:
        return _train(cfg, task, info, on_epoch_end, checkpoint_every or cfg.checkpoint_every, on_update)
    finally:
        cleanup(info)


def _read_resume(cfg: DenseConfig, out: Path, kind: str) -> dict[str, Any] | None:
    """The resumable state of `out` (checked against the model and kind of `cfg`), None for a new run."""
    if not cfg.resume:
        return None
    if not (out / "last_state.pth").is_file():
        raise UserError(f"--resume {out}: last_state.pth is missing (the run saved no state to resume from)")
    state = load_state(out / "last_state.pth")
    if "model" not in state:  # written at an epoch end: the weights are last.safetensors
        for f in ("last.safetensors", "last.json"):
            if not (out / f).is_file():
                raise UserError(f"--resume {out}: {f} is missing (the run saved no complete epoch)")
    side = read_json(out / "last.json") if (out / "last.json").is_file() else state
    if side.get("arch") != cfg.model or side.get("kind") != kind:
        raise UserError(f"--resume {out}: the run trained {side.get('kind')} on {side.get('arch')!r}, not {kind} "
                        f"on {cfg.model!r}")
    return state


@dataclasses.dataclass(kw_only=True, eq=False, repr=False)
class _DenseTask(TrainTask):
    """Detection / segmentation in the shared loop: epochs over the seeded sampler, the iteration-wise lr, an
    evaluation every `eval_interval` epochs and after the last, run files at each epoch end. The fields are the
    run's pieces, built by `_train` (`task`: 'detect' or 'segment'; `meta`, `st_meta`: see `_metas`)."""

    cfg: DenseConfig
    task: str
    info: DistInfo
    loop: Loop
    model: nn.Module
    ddp_model: nn.Module
    sampler: Any
    loader: DataLoader
    val_set: Any
    num_classes: int
    kind: str
    out: Path
    on_epoch_end: Callable | None
    on_update: Callable | None
    meta: dict[str, Any]
    st_meta: dict[str, str]

    def __post_init__(self) -> None:
        self.ipe = len(self.loader)
        self.total_steps = self.cfg.max_iters or self.cfg.epochs * self.ipe
        self.epochs = math.ceil(self.total_steps / self.ipe)
        self.rows: list[dict[str, Any]] = []
        self.best, self.best_epoch, self.metrics = -1.0, -1, {}
        self.sums = {"loss_sum": 0.0, "loss_n": 0, "time": 0.0}

    def load(self, state: dict[str, Any], pos: Position) -> None:
        self.best, self.best_epoch = float(state["best"]), int(state["best_epoch"])
        self.sums.update(state.get("sums", {}))
        self.rows = [r for r in read_csv(self.out / "summary.csv") if int(r["epoch"]) < pos.epoch]

    def state_dict(self) -> dict[str, Any]:
        pos = self.loop.pos
        return {"epoch": pos.epoch - 1, "iters": pos.step, "best": self.best, "best_epoch": self.best_epoch,
                "arch": self.cfg.model, "kind": self.kind, "sums": dict(self.sums)}

    def start_epoch(self, epoch: int, fresh: bool) -> None:
        seed_everything(epoch_seed(self.cfg.seed, epoch, self.info.rank))
        if fresh:
            self.sums = {"loss_sum": 0.0, "loss_n": 0, "time": 0.0}
        self.ddp_model.train()
        self.t0 = time.perf_counter() - self.sums["time"]

    def batches(self, epoch: int, skip: int) -> DataLoader:
        self.sampler.set_epoch(epoch, skip)
        return self.loader

    def epoch_len(self, epoch: int) -> int:
        return self.ipe

    def before_update(self, pos: Position) -> None:
        f = lr_factor(self.cfg, pos.step, self.total_steps, self.ipe)
        for g in self.loop.optimizer.param_groups:
            g["lr"] = self.cfg.lr * g.get("lr_mult", 1.0) * f

    def loss(self, batch: Any) -> torch.Tensor:
        device = self.info.device
        if self.task == "detect":
            images, targets = batch
            images = [im.to(device) for im in images]
            targets = [{k: (v.to(device) if torch.is_tensor(v) else v) for k, v in t.items()} for t in targets]
            return sum(self.ddp_model(images, targets).values())
        x, y = batch
        return segmentation_loss(self.ddp_model(x.to(device)), y.to(device).long(), self.cfg.aux_weight)

    def check_loss(self, loss: torch.Tensor, pos: Position) -> None:
        if not torch.isfinite(loss):
            raise UserError(f"training diverged: loss is {loss.item()} at epoch {pos.epoch + 1} iteration "
                            f"{pos.step + 1}; lower --lr or set --clip-grad (nothing saved was changed)")

    def after_update(self, pos: Position) -> bool:
        if self.on_update is not None:
            self.on_update(pos)
        return False

    def after_batch(self, pos: Position, loss: torch.Tensor, batch: Any, seconds: float, cpu: float) -> None:
        self.sums["loss_sum"] += float(loss.item())
        self.sums["loss_n"] += 1
        self.sums["time"] = time.perf_counter() - self.t0
        it, cfg = pos.step, self.cfg
        if self.info.is_main and cfg.log_interval > 0 and it % cfg.log_interval == 0:
            _logger.info("epoch %d [%d/%d] iter %d/%d  loss %.4f  lr %.3e  %.2fs/iter", pos.epoch + 1, pos.batch,
                         self.ipe, it, self.total_steps, loss.item(), self.loop.optimizer.param_groups[0]["lr"],
                         self.sums["time"] / pos.batch)

    def end_epoch(self, pos: Position) -> bool:
        cfg, epoch, it = self.cfg, pos.epoch, pos.step
        dt = time.perf_counter() - self.t0
        loss_sum, loss_n = all_reduce_sum([self.sums["loss_sum"], self.sums["loss_n"]], self.info)
        row: dict[str, Any] = {"epoch": epoch, "iters": it, "train_loss": loss_sum / max(loss_n, 1),
                               "lr": cfg.lr * lr_factor(cfg, max(it - 1, 0), self.total_steps, self.ipe),
                               "time": round(dt, 3)}
        evaluated = epoch == self.epochs - 1 or (cfg.eval_interval > 0 and (epoch + 1) % cfg.eval_interval == 0)
        is_best = False
        if evaluated:
            self.metrics = _evaluate(self.task, self.model, self.val_set, self.info.device, self.info, cfg,
                                     self.num_classes)
            row.update({k: v for k, v in self.metrics.items() if k != "IoU"})
            is_best = self.metrics[BEST_METRIC[self.task]] > self.best
            if is_best:
                self.best, self.best_epoch = self.metrics[BEST_METRIC[self.task]], epoch
            _logger.info("epoch %d/%d  train_loss %.4f  %s  (%.1fs)", epoch + 1, self.epochs, row["train_loss"],
                         "  ".join(f"{k} {v:.4f}" for k, v in self.metrics.items() if k != "IoU"), dt)
        else:
            _logger.info("epoch %d/%d  train_loss %.4f  (%.1fs)", epoch + 1, self.epochs, row["train_loss"], dt)
        self.rows.append(row)
        self.sums = {"loss_sum": 0.0, "loss_n": 0, "time": 0.0}
        if self.info.is_main:
            sidecar = {**self.meta, "epoch": epoch, "metrics": {k: v for k, v in row.items() if k != "epoch"},
                       "args": dataclasses.asdict(cfg)}
            for tag in ["last"] + (["best"] if is_best else []):
                save_weights(self.model, self.out / f"{tag}.safetensors", {**self.st_meta, "epoch": str(epoch)})
                write_json({**sidecar, "weights": f"{tag}.safetensors"}, self.out / f"{tag}.json")
            write_csv(self.out / "summary.csv", self.rows)
        self.row = row
        return True

    def after_save(self, pos: Position) -> None:
        if self.on_epoch_end is not None:
            self.on_epoch_end(pos.epoch - 1, self.row)


def _train(cfg: DenseConfig, task: str, info: DistInfo, on_epoch_end: Callable | None, checkpoint_every: int,
           on_update: Callable | None) -> dict:
    from ..models._builder import load_into, read_state_dict

    _check(cfg)
    kind = _kind(cfg, task)
    device = info.device
    if not cfg.resume and not cfg.output:
        cfg = dataclasses.replace(cfg, output=f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{task}-{cfg.model}")
    out = prepare_output(cfg)
    state = _read_resume(cfg, out, kind)
    source = open_dense_source(cfg.data, task, cfg.seed)
    num_classes = cfg.num_classes or len(source.classes)
    if num_classes < len(source.classes):
        raise UserError(f"--num-classes {num_classes} is below the data's {len(source.classes)} classes")
    seed_everything(epoch_seed(cfg.seed, -1, 0))
    model = build_dense_model(cfg, task, num_classes).to(device)
    if state is not None and "model" not in state:
        load_into(model, read_state_dict(out / "last.safetensors"), what=f"checkpoint {out / 'last.safetensors'}")
    train_set, val_set = _datasets(cfg, task, source, num_classes, kind)
    train_set = _subset(train_set, cfg.train_limit, cfg.seed)
    val_set = _subset(val_set, cfg.eval_limit, cfg.seed)
    sampler = train_sampler(len(train_set), cfg.batch_size, info, cfg.seed)
    loader = DataLoader(train_set, cfg.batch_size, sampler=sampler, num_workers=cfg.workers, drop_last=True,
                        collate_fn=collate_detection if task == "detect" else None)
    ddp_model: nn.Module = model
    if info.enabled:
        ddp_model = nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    clip = (lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)) \
        if cfg.clip_grad is not None else None
    loop = Loop(model=model, optimizer=build_optimizer(model, cfg), precision=Precision(device, cfg.amp, cfg.amp_dtype),
                state_path=out / "last_state.pth", info=info, clip=clip, checkpoint_every=checkpoint_every)
    dtask = _DenseTask(cfg=cfg, task=task, info=info, loop=loop, model=model, ddp_model=ddp_model, sampler=sampler,
                       loader=loader, val_set=val_set, num_classes=num_classes, kind=kind, out=out,
                       on_epoch_end=on_epoch_end, on_update=on_update,
                       **_metas(cfg, task, kind, source, num_classes, out))
    n_params = sum(p.numel() for p in model.parameters())
    if cfg.dry_run:
        return {"dry_run": True, "config": dataclasses.asdict(cfg), "task": task, "kind": kind,
                "num_classes": num_classes, "params": n_params, "train_images": len(train_set),
                "iters_per_epoch": dtask.ipe, "total_iters": dtask.total_steps, "output": os.fspath(out)}
    if state is not None:
        pos = Position(**state["position"]) if "position" in state else \
            Position(int(state["epoch"]) + 1, 0, int(state["iters"]))
        state = loop.for_rank(state)
        dtask.load(state, pos)
        loop.load_state_dict(state, pos)
        if pos.batch:
            _logger.info("resuming %s inside epoch %d, after iteration %d", out, pos.epoch + 1, pos.step)
        else:
            _logger.info("resuming %s after epoch %d", out, pos.epoch - 1)
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        write_args(out, cfg)
    _logger.info("%s %s on %s: %.3fM params, %d classes, %d train images, global batch %d, %d iterations "
                 "(%d/epoch), %d rank(s)", kind, cfg.model, cfg.data, n_params / 1e6, num_classes, len(train_set),
                 cfg.batch_size * info.world_size, dtask.total_steps, dtask.ipe, info.world_size)
    t_start = time.perf_counter()
    loop.fit(dtask)
    return {**{k: v for k, v in dtask.metrics.items() if k != "IoU"}, "best": dtask.best,
            "best_epoch": dtask.best_epoch, "task": task, "kind": kind, "output": os.fspath(out),
            "iters": loop.pos.step, "train_time_s": round(time.perf_counter() - t_start, 1),
            "checkpoint": os.fspath(out / "best.safetensors"), "last": os.fspath(out / "last.safetensors")}


def _metas(cfg: DenseConfig, task: str, kind: str, source: DenseSource, num_classes: int, out: Path
           ) -> dict[str, Any]:
    """The sidecar (`meta`) and safetensors header (`st_meta`) fields every epoch's files share."""
    from ..version import __version__

    meta = {"task": task, "kind": kind, "arch": cfg.model, "classes": source.classes, "num_classes": num_classes,
            "subquad_version": __version__}
    st_meta = {"subquad_version": __version__, "arch": cfg.model, "task": task, "kind": kind,
               "source": f"trained:{out.name}", "num_classes": str(num_classes)}
    return {"meta": meta, "st_meta": st_meta}


def resolve_checkpoint(checkpoint: str | os.PathLike) -> Path:
    """A run directory (its best.safetensors, else last.safetensors) or a .safetensors file with its sidecar."""
    p = Path(checkpoint)
    if p.is_dir():
        for tag in ("best", "last"):
            if (p / f"{tag}.safetensors").is_file():
                return p / f"{tag}.safetensors"
        raise UserError(f"--checkpoint {p}: the directory holds no best.safetensors or last.safetensors (not a "
                        "finished detect/segment run)")
    if not p.is_file():
        raise UserError(f"--checkpoint {p}: not found")
    if p.suffix != ".safetensors":
        raise UserError(f"--checkpoint {p}: expected a run directory or a .safetensors file from detect/segment train")
    return p


def load_dense_run(checkpoint: str | os.PathLike, task: str, device: torch.device | str = "cpu"):
    """(model in eval mode, sidecar dict, DenseConfig, weights path) of a detect/segment run."""
    from subquad_cli.denseconfig import merge_dense

    from ..models._builder import load_into, read_state_dict

    weights = resolve_checkpoint(checkpoint)
    side_path = weights.with_suffix(".json")
    if not side_path.is_file():
        raise UserError(f"--checkpoint {weights}: its sidecar {side_path.name} is missing")
    try:
        side = read_json(side_path)
    except json.JSONDecodeError as e:
        raise UserError(f"cannot read sidecar {side_path}: {e}") from None
    if side.get("task") != task:
        raise UserError(f"--checkpoint {weights} is a {side.get('task') or 'non-dense'} run, not a {task} run")
    cfg = merge_dense(DenseConfig(), {k: v for k, v in (side.get("args") or {}).items()
                                      if k not in ("resume", "dry_run", "backbone_checkpoint", "pretrained")},
                      origin=str(side_path))
    model = build_dense_model(cfg, task, int(side["num_classes"]))
    load_into(model, read_state_dict(weights), what=f"checkpoint {weights}")
    return model.to(device).eval(), side, cfg, weights
