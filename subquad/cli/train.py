"""`subquad train`: train a registered model on an image data set."""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    from subquad.engine.classify import TrainConfig

    d = TrainConfig()
    p = sub.add_parser("train", help="train a model on images",
                       description="Train a registered model; writes args.yaml, summary.csv and safetensors "
                       "checkpoints (last/best, with JSON sidecars) to --output.")
    p.add_argument("--model", default=d.model, help=f"registered model name (default {d.model})")
    p.add_argument("--data", default=d.data, help="data source: digits (default, offline)")
    p.add_argument("--img-size", type=int, default=d.img_size, help="input resolution")
    p.add_argument("-b", "--batch-size", type=int, default=d.batch_size)
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--warmup-epochs", type=int, default=d.warmup_epochs)
    p.add_argument("--sched", default=d.sched)
    p.add_argument("--opt", default=d.opt)
    p.add_argument("--smoothing", type=float, default=d.smoothing)
    p.add_argument("--drop-path", type=float, default=d.drop_path)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--workers", type=int, default=d.workers)
    p.add_argument("--output", default="", help="run directory (default runs/<time>-<model>)")
    p.add_argument("--device", default="", help="cpu, cuda, ... (default: cuda when available)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    import torch

    import subquad
    from subquad.engine.classify import config_from_args, train

    cfg = config_from_args(args)
    if cfg.model not in subquad.list_models():
        subquad.create_model(cfg.model, device="meta")  # raises the one-line unknown-model error
    if cfg.epochs < 1 or cfg.batch_size < 1:
        raise subquad.UserError(f"--epochs and --batch-size must be >= 1, got {cfg.epochs} and {cfg.batch_size}")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    r = train(cfg)
    print(f"test accuracy: {r['eval_top1']:.2f} % (best {r['best_top1']:.2f} %)")
    print(f"throughput: {r['images_per_sec']:.0f} images/s (training)")
    print(f"checkpoint: {r['checkpoint']}")
    return 0
