"""Image classification: train and evaluate a registered model, built on timm's optimizer/scheduler/loss pieces.

`train(cfg)` runs the loop and writes the run directory: `args.yaml`, `summary.csv`, `last.safetensors` /
`best.safetensors` with JSON sidecars. Files are written atomically (see `engine.checkpoint`).
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import yaml
from timm.loss import LabelSmoothingCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import accuracy
from torch.utils.data import DataLoader, TensorDataset

from ..errors import UserError
from .checkpoint import atomic_write, save_weights, write_json

__all__ = ["TrainConfig", "train", "evaluate", "load_data"]

_logger = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    """Training options; names follow timm's train.py flags."""

    model: str = "vit_attn_micro"
    data: str = "digits"
    img_size: int = 32
    batch_size: int = 64
    epochs: int = 30
    lr: float = 2e-3
    weight_decay: float = 0.05
    warmup_epochs: int = 2
    sched: str = "cosine"
    opt: str = "adamw"
    smoothing: float = 0.1
    drop_path: float = 0.0
    seed: int = 0
    workers: int = 0
    output: str = ""
    device: str = ""


def load_data(cfg: TrainConfig, in_chans: int) -> tuple[TensorDataset, TensorDataset, list[str]]:
    """Resolve `cfg.data` to (train, test, class names)."""
    if cfg.data == "digits":
        from ..data.small import DIGITS_CLASSES, load_digits_split

        xtr, ytr, xte, yte = load_digits_split((cfg.img_size, cfg.img_size), in_chans)
        return TensorDataset(xtr, ytr), TensorDataset(xte, yte), DIGITS_CLASSES
    raise UserError(f"unknown data source {cfg.data!r}; allowed: 'digits'")


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: DataLoader, device: torch.device) -> dict[str, float]:
    """Top-1, top-5 and mean cross-entropy over `loader`."""
    model.eval()
    n, loss_sum, top1_sum, top5_sum = 0, 0.0, 0.0, 0.0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        logits = model(x)
        loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
        k = min(5, logits.shape[1])
        a1, a5 = accuracy(logits, y, topk=(1, k))
        top1_sum += a1.item() * len(y)
        top5_sum += a5.item() * len(y)
        n += len(y)
    return {"eval_loss": loss_sum / n, "eval_top1": top1_sum / n, "eval_top5": top5_sum / n}


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Train `cfg.model` on `cfg.data`; returns the final metrics and the paths written."""
    from ..models import create_model

    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = create_model(cfg.model, num_classes=10 if cfg.data == "digits" else 1000, img_size=cfg.img_size,
                         drop_path_rate=cfg.drop_path)
    in_chans = model.pretrained_cfg.get("input_size", (3,))[0]
    train_set, test_set, classes = load_data(cfg, in_chans)
    if model.num_classes != len(classes):
        model.reset_classifier(len(classes))
    model.to(device)
    g = torch.Generator().manual_seed(cfg.seed)
    train_loader = DataLoader(train_set, cfg.batch_size, shuffle=True, generator=g, num_workers=cfg.workers,
                              drop_last=True)
    test_loader = DataLoader(test_set, 256, shuffle=False, num_workers=cfg.workers)
    optimizer = create_optimizer_v2(model, opt=cfg.opt, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler, _ = create_scheduler_v2(optimizer, sched=cfg.sched, num_epochs=cfg.epochs,
                                       warmup_epochs=cfg.warmup_epochs, updates_per_epoch=len(train_loader),
                                       warmup_lr=cfg.lr * 0.01, min_lr=cfg.lr * 0.01)
    criterion = LabelSmoothingCrossEntropy(cfg.smoothing) if cfg.smoothing > 0 else torch.nn.CrossEntropyLoss()

    out = Path(cfg.output or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{cfg.model}")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "args.yaml", lambda tmp: Path(tmp).write_text(yaml.safe_dump(asdict(cfg), sort_keys=False)))
    summary_rows: list[dict[str, Any]] = []
    best_top1, metrics = -1.0, {}
    seen, train_time = 0, 0.0
    meta = {"arch": cfg.model, "classes": classes}
    for epoch in range(cfg.epochs):
        model.train()
        t0 = time.perf_counter()
        loss_sum, steps = 0.0, 0
        for i, (x, y) in enumerate(train_loader):
            x, y = x.to(device), y.to(device)
            loss = criterion(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step_update(epoch * len(train_loader) + i + 1)
            loss_sum += loss.item()
            steps += 1
            seen += len(y)
        scheduler.step(epoch + 1)
        dt = time.perf_counter() - t0
        train_time += dt
        metrics = evaluate(model, test_loader, device)
        row = {"epoch": epoch, "train_loss": loss_sum / max(steps, 1), **metrics,
               "lr": optimizer.param_groups[0]["lr"], "time": dt}
        summary_rows.append(row)
        _logger.info("epoch %d/%d  train_loss %.4f  eval_top1 %.2f  eval_loss %.4f  (%.1fs)", epoch + 1, cfg.epochs,
                     row["train_loss"], metrics["eval_top1"], metrics["eval_loss"], dt)
        sidecar = {**meta, "epoch": epoch, "metrics": metrics, "args": asdict(cfg)}
        save_weights(model, out / "last.safetensors", {"arch": cfg.model, "epoch": str(epoch)})
        write_json(sidecar, out / "last.json")
        if metrics["eval_top1"] > best_top1:
            best_top1 = metrics["eval_top1"]
            save_weights(model, out / "best.safetensors", {"arch": cfg.model, "epoch": str(epoch)})
            write_json(sidecar, out / "best.json")

        def _write_csv(tmp: str) -> None:
            with open(tmp, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(summary_rows[0]))
                w.writeheader()
                w.writerows(summary_rows)

        atomic_write(out / "summary.csv", _write_csv)
    return {**metrics, "best_top1": best_top1, "images_per_sec": seen / max(train_time, 1e-9),
            "output": os.fspath(out), "checkpoint": os.fspath(out / "best.safetensors")}


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    fields = TrainConfig.__dataclass_fields__
    return TrainConfig(**{k: v for k, v in vars(args).items() if k in fields and v is not None})
