"""`subquad train`: train a registered model on an image data set from a recipe (timm flag names)."""

from __future__ import annotations

import argparse

from subquad_cli.config import add_config_arguments, resolve_config

USAGE = ("%(prog)s (--model NAME | -c RECIPE) [--data SPEC] [--epochs N] [--output DIR] [options]\n"
         "       %(prog)s --resume DIR [--epochs N] [--device DEVICE]")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("train", help="train a model on images", usage=USAGE,
                       description="Train a registered model (DDP with `torchrun --nproc_per_node N -m subquad "
                       "train ...`). Writes args.yaml, summary.csv, last/best safetensors with JSON sidecars and "
                       "last_state.pth to --output. Precedence: defaults < --config YAML < resumed args.yaml < flags.")
    add_config_arguments(p)
    p.add_argument("--precision", default=None, choices=("fp32", "bf16", "fp16"),
                   help="training precision, as eval and predict name it: fp32, bf16 (= --amp --amp-dtype bfloat16) "
                   "or fp16 (= --amp --amp-dtype float16; slow on a CPU) (default: fp32, or the recipe's --amp)")
    p.add_argument("--overwrite", action="store_true",
                   help="train into --output even if it is a folder that is not empty (a run there is still refused: "
                   "continue it with --resume)")
    p.set_defaults(func=run, usage=p.format_usage)
    return p


def run(args: argparse.Namespace) -> int:
    import yaml

    from subquad.engine.classify import train
    from subquad.engine.loop import Preempted
    from subquad_cli.config import check_run_output

    if not any(getattr(args, k, None) for k in ("model", "config", "resume")):
        import sys

        from subquad_cli.errors import UserError

        print(args.usage().rstrip(), file=sys.stderr)
        raise UserError("--model or -c is required (or --resume DIR to continue a run); see `subquad train --help`")
    cfg = resolve_config(args)
    if not cfg.resume and not cfg.dry_run:
        check_run_output(cfg.output, args.overwrite)
    try:
        r = train(cfg)
    except Preempted as e:  # SIGTERM / SIGINT: the state is written and its place printed
        return int(e.code)
    if r.get("dry_run"):
        print(yaml.safe_dump(r["config"], sort_keys=False).rstrip())
        print(f"dry run: {cfg.model} ({r['params'] / 1e6:.3f}M params) on {cfg.data}: {r['num_classes']} classes, "
              f"{r['in_chans']}x{r['img_size']}x{r['img_size']} input, {r['train_images']} training images, "
              f"{r['updates_per_epoch']} updates/epoch, {r['optimizer']} + {r['scheduler']}; nothing written")
        return 0
    if r.get("complete"):
        res = r["results"]
        print(f"run {r['output']} is complete ({r['epochs']} epochs; {res['split']} accuracy {res['top1']:.2f} % for "
              f"the checkpoint selected on {res['selected_on']}); extend it with --resume {r['output']} --epochs N "
              f"(N > {r['epochs']}; see --resume-schedule)")
        return 0
    if r.get("rank", 0) == 0:
        res = r["results"]
        print(f"{res['split']} accuracy: {res['top1']:.2f} % (top-5 {res['top5']:.2f} %, {res['images']} images; "
              f"checkpoint selected on {res['selected_on']}: {r['best_top1']:.2f} % at epoch {r['best_epoch']})")
        print(f"throughput: {r['images_per_sec']:.0f} images/s (training)")
        print(f"checkpoint: {r['checkpoint']}")
    return 0
