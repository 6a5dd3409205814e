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
import yaml
from torch import nn
from torch.utils.data import DataLoader, Subset

from ..engine.checkpoint import atomic_write, load_state, read_json, save_state, save_weights, write_json
from ..engine.classify import _prepare_output
from ..engine.distributed import DistInfo, GlobalBatchSampler, all_reduce_sum, cleanup, init_distributed, train_sampler
from ..engine.rng import epoch_seed as _epoch_seed
from ..engine.rng import rng_state as _rng_state
from ..engine.rng import seed_everything as _seed_everything
from ..engine.rng import set_rng_state as _set_rng_state
from ..engine.runfiles import read_csv as _read_csv
from ..engine.runfiles import write_csv as _write_csv
from ..errors import UserError
from .backbone import FeatureBackbone
from .config import DenseConfig
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
    if cfg.max_iters < 0:
        raise UserError(f"--max-iters must be >= 0, got {cfg.max_iters}")
    for name, n in (("scale", 2), ("ratio_range", 2), ("crop_size", 2)):
        if len(getattr(cfg, name)) != n:
            raise UserError(f"--{name.replace('_', '-')} takes {n} numbers, got {getattr(cfg, name)}")
    if not cfg.min_size or min(cfg.min_size) < 1:
        raise UserError(f"--min-size takes one or more positive sides, got {cfg.min_size}")


def _subset(ds, limit: int, seed: int):
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


def train_dense(cfg: DenseConfig, task: str, on_epoch_end: Callable[[int, dict], None] | None = None) -> dict:
    """Train a detector (task 'detect') or segmenter ('segment') as `cfg` says; returns final metrics and paths."""
    info = init_distributed(cfg.device)
    if not info.is_main:
        logging.getLogger("subquad").setLevel(logging.WARNING)
    try:
        return _train(cfg, task, info, on_epoch_end)
    finally:
        cleanup(info)


def _train(cfg: DenseConfig, task: str, info: DistInfo, on_epoch_end: Callable | None) -> dict:
    from ..models._builder import load_into, read_state_dict
    from ..version import __version__

    _check(cfg)
    kind = _kind(cfg, task)
    device = info.device
    if not cfg.resume and not cfg.output:
        cfg = dataclasses.replace(cfg, output=f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{task}-{cfg.model}")
    out = _prepare_output(cfg, info)
    resume_state = None
    if cfg.resume:
        for f in ("last.safetensors", "last_state.pth", "last.json"):
            if not (out / f).is_file():
                raise UserError(f"--resume {out}: {f} is missing (the run saved no complete epoch)")
        resume_state = load_state(out / "last_state.pth")
    source = open_dense_source(cfg.data, task, cfg.seed)
    num_classes = cfg.num_classes or len(source.classes)
    if num_classes < len(source.classes):
        raise UserError(f"--num-classes {num_classes} is below the data's {len(source.classes)} classes")
    _seed_everything(_epoch_seed(cfg.seed, -1, 0))
    model = build_dense_model(cfg, task, num_classes).to(device)
    if resume_state is not None:
        side = read_json(out / "last.json")
        if side.get("arch") != cfg.model or side.get("kind") != kind:
            raise UserError(f"--resume {out}: the run trained {side.get('kind')} on {side.get('arch')!r}, not {kind} "
                            f"on {cfg.model!r}")
        load_into(model, read_state_dict(out / "last.safetensors"), what=f"checkpoint {out / 'last.safetensors'}")
    train_set, val_set = _datasets(cfg, task, source, num_classes, kind)
    train_set = _subset(train_set, cfg.train_limit, cfg.seed)
    val_set = _subset(val_set, cfg.eval_limit, cfg.seed)
    global_batch = cfg.batch_size * info.world_size
    sampler = train_sampler(len(train_set), cfg.batch_size, info, cfg.seed)
    loader = DataLoader(train_set, cfg.batch_size, sampler=sampler, num_workers=cfg.workers, drop_last=True,
                        collate_fn=collate_detection if task == "detect" else None)
    ipe = len(loader)
    total = cfg.max_iters or cfg.epochs * ipe
    n_epochs = math.ceil(total / ipe)
    ddp_model: nn.Module = model
    if info.enabled:
        ddp_model = nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    optimizer = build_optimizer(model, cfg)
    scaler = torch.amp.GradScaler(device.type) if cfg.amp and cfg.amp_dtype == "float16" and \
        device.type == "cuda" else None
    amp_ctx = _amp(cfg.amp, cfg.amp_dtype, device)
    n_params = sum(p.numel() for p in model.parameters())
    if cfg.dry_run:
        return {"dry_run": True, "config": dataclasses.asdict(cfg), "task": task, "kind": kind,
                "num_classes": num_classes, "params": n_params, "train_images": len(train_set),
                "iters_per_epoch": ipe, "total_iters": total, "output": os.fspath(out)}
    start_epoch, it, best, best_epoch = 0, 0, -1.0, -1
    rows: list[dict[str, Any]] = []
    if resume_state is not None:
        optimizer.load_state_dict(resume_state["optimizer"])
        if scaler is not None and resume_state.get("scaler"):
            scaler.load_state_dict(resume_state["scaler"])
        _set_rng_state(resume_state["rng"])
        start_epoch, it = int(resume_state["epoch"]) + 1, int(resume_state["iters"])
        best, best_epoch = float(resume_state["best"]), int(resume_state["best_epoch"])
        rows = [r for r in _read_csv(out / "summary.csv") if int(r["epoch"]) < start_epoch]
        _logger.info("resuming %s after epoch %d", out, start_epoch - 1)
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "args.yaml", lambda tmp: Path(tmp).write_text(
            yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False)))
    _logger.info("%s %s on %s: %.3fM params, %d classes, %d train images, global batch %d, %d iterations "
                 "(%d/epoch), %d rank(s)", kind, cfg.model, cfg.data, n_params / 1e6, num_classes, len(train_set),
                 global_batch, total, ipe, info.world_size)
    meta = {"task": task, "kind": kind, "arch": cfg.model, "classes": source.classes, "num_classes": num_classes,
            "subquad_version": __version__}
    st_meta = {"subquad_version": __version__, "arch": cfg.model, "task": task, "kind": kind,
               "source": f"trained:{out.name}", "num_classes": str(num_classes)}
    metrics: dict[str, Any] = {}
    t_start = time.perf_counter()
    for epoch in range(start_epoch, n_epochs):
        _seed_everything(_epoch_seed(cfg.seed, epoch, info.rank))
        sampler.set_epoch(epoch)
        ddp_model.train()
        t0 = time.perf_counter()
        loss_sum, loss_n = 0.0, 0
        for i, batch in enumerate(loader):
            if it >= total:
                break
            f = lr_factor(cfg, it, total, ipe)
            for g in optimizer.param_groups:
                g["lr"] = cfg.lr * g.get("lr_mult", 1.0) * f
            with amp_ctx():
                if task == "detect":
                    images, targets = batch
                    images = [im.to(device) for im in images]
                    targets = [{k: (v.to(device) if torch.is_tensor(v) else v) for k, v in t.items()} for t in targets]
                    losses = ddp_model(images, targets)
                    loss = sum(losses.values())
                else:
                    x, y = batch
                    loss = segmentation_loss(ddp_model(x.to(device)), y.to(device).long(), cfg.aux_weight)
            if not torch.isfinite(loss):
                raise UserError(f"training diverged: loss is {loss.item()} at epoch {epoch + 1} iteration {it + 1}; "
                                "lower --lr or set --clip-grad (nothing saved was changed)")
            optimizer.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
            else:
                loss.backward()
            if cfg.clip_grad is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            it += 1
            loss_sum += float(loss.item())
            loss_n += 1
            if info.is_main and cfg.log_interval > 0 and it % cfg.log_interval == 0:
                _logger.info("epoch %d [%d/%d] iter %d/%d  loss %.4f  lr %.3e  %.2fs/iter", epoch + 1, i + 1, ipe, it,
                             total, loss.item(), optimizer.param_groups[0]["lr"], (time.perf_counter() - t0) / (i + 1))
        dt = time.perf_counter() - t0
        loss_sum, loss_n = all_reduce_sum([loss_sum, loss_n], info)
        row: dict[str, Any] = {"epoch": epoch, "iters": it, "train_loss": loss_sum / max(loss_n, 1),
                               "lr": cfg.lr * lr_factor(cfg, max(it - 1, 0), total, ipe),
                               "time": round(dt, 3)}
        last = epoch == n_epochs - 1
        evaluated = last or (cfg.eval_interval > 0 and (epoch + 1) % cfg.eval_interval == 0)
        is_best = False
        if evaluated:
            metrics = _evaluate(task, model, val_set, device, info, cfg, num_classes)
            row.update({k: v for k, v in metrics.items() if k != "IoU"})
            is_best = metrics[BEST_METRIC[task]] > best
            if is_best:
                best, best_epoch = metrics[BEST_METRIC[task]], epoch
            _logger.info("epoch %d/%d  train_loss %.4f  %s  (%.1fs)", epoch + 1, n_epochs, row["train_loss"],
                         "  ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k != "IoU"), dt)
        else:
            _logger.info("epoch %d/%d  train_loss %.4f  (%.1fs)", epoch + 1, n_epochs, row["train_loss"], dt)
        rows.append(row)
        if info.is_main:
            sidecar = {**meta, "epoch": epoch, "metrics": {k: v for k, v in row.items() if k != "epoch"},
                       "args": dataclasses.asdict(cfg)}
            for tag in ["last"] + (["best"] if is_best else []):
                save_weights(model, out / f"{tag}.safetensors", {**st_meta, "epoch": str(epoch)})
                write_json({**sidecar, "weights": f"{tag}.safetensors"}, out / f"{tag}.json")
            _write_csv(out / "summary.csv", rows)
            state = {"epoch": epoch, "iters": it, "best": best, "best_epoch": best_epoch,
                     "optimizer": optimizer.state_dict(), "rng": _rng_state(), "arch": cfg.model, "kind": kind}
            if scaler is not None:
                state["scaler"] = scaler.state_dict()
            save_state(state, out / "last_state.pth")
        if on_epoch_end is not None:
            on_epoch_end(epoch, row)
    return {**{k: v for k, v in metrics.items() if k != "IoU"}, "best": best, "best_epoch": best_epoch,
            "task": task, "kind": kind, "output": os.fspath(out), "iters": it,
            "train_time_s": round(time.perf_counter() - t_start, 1),
            "checkpoint": os.fspath(out / "best.safetensors"), "last": os.fspath(out / "last.safetensors")}


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
    from ..models._builder import load_into, read_state_dict
    from .config import merge_dense

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
