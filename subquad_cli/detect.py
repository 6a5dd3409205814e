"""`subquad detect train|eval|predict`: object detection / instance segmentation with a subquad backbone.

This module and `subquad segment` share `add_task_parser`; neither imports torch until a command runs.
"""

from __future__ import annotations

import argparse

_HELP = {
    "detect": ("detection and instance segmentation (torchvision Mask/Faster R-CNN, RetinaNet + FPN)",
               "COCO-format data (coco:ROOT) or the generated set (synthetic)", "bbox_mAP, bbox_mAP50 (+ segm_mAP, "
               "segm_mAP50 for Mask R-CNN)"),
    "segment": ("semantic segmentation (Semantic FPN, UperNet)",
                "ADE20K-format data (ade20k:ROOT) or the generated twin (synthetic)", "mIoU, aAcc"),
}


def add_dense_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per DenseConfig field (defaults suppressed, so only typed flags override the recipes)."""
    from subquad_cli.config import add_config_arguments
    from subquad_cli.denseconfig import DenseConfig

    add_config_arguments(p, config_cls=DenseConfig, config_help="YAML recipe of these keys: a file, or a shipped "
                         "recipe by name (subquad/configs/coco/ for detect, subquad/configs/ade20k/ for segment)")


def add_task_parser(sub, task: str) -> argparse.ArgumentParser:
    """`subquad <task>` with train / eval / predict sub-commands."""
    what, data, keys = _HELP[task]
    p = sub.add_parser(task, help=what, description=f"{what[0].upper()}{what[1:]} on {data}.")
    cmds = p.add_subparsers(dest="action", metavar="ACTION")
    tr = cmds.add_parser("train", help="train", description=(
        f"Train (DDP with `torchrun --nproc_per_node N -m subquad {task} train ...`). Writes args.yaml, summary.csv, "
        "last/best safetensors with JSON sidecars and last_state.pth to --output. Precedence: defaults < the "
        "synthetic demo recipe (for --data synthetic without --config) < --config YAML < resumed args.yaml < flags."))
    add_dense_arguments(tr)
    tr.add_argument("--overwrite", action="store_true",
                    help="train into --output even if it is a folder that is not empty (a run there is still "
                    "refused: continue it with --resume)")
    tr.set_defaults(func=run_train, task=task)
    ev = cmds.add_parser("eval", help="evaluate a run", description=(
        f"Evaluate a run on its data's validation split: {keys} as fractions in [0, 1]. Writes results.json to the "
        "run directory and to --results-file when given."))
    ev.add_argument("--checkpoint", required=True, help="run directory (its best, else last, weights) or .safetensors")
    ev.add_argument("--data", default=None, help="data spec (default: the one the run was trained on)")
    ev.add_argument("--split", default=None, help="split (default: the data's validation split)")
    ev.add_argument("--results-file", default=None, help="also write the results JSON here (an existing file is "
                    "replaced only with --overwrite)")
    ev.add_argument("--overwrite", action="store_true",
                    help="let --results-file, and the run's results.json and results-<split>.detail.json, replace an "
                    "earlier result (without it an earlier, different result is kept and the new one is numbered)")
    ev.add_argument("--limit", type=int, default=0, help="evaluate a seeded subset of this many images (0: all)")
    ev.add_argument("-b", "--batch-size", type=int, default=2, help="images per forward (detect)")
    ev.add_argument("--device", default="", help="cpu, cuda, ... (default: cuda when available)")
    ev.set_defaults(func=run_eval, task=task)
    pr = cmds.add_parser("predict", help="predict on image files", description=(
        "Predict on image files: " + ("writes <stem>.pred.png (boxes and masks drawn) and <stem>.pred.json "
                                      "(boxes, classes, scores, RLE masks)" if task == "detect" else
                                      "writes <stem>.pred.png (colour overlay) and <stem>.label.png (class "
                                      "indices)") + " to --out-dir."))
    pr.add_argument("images", nargs="+", help="image files")
    pr.add_argument("--checkpoint", required=True, help="run directory or .safetensors")
    pr.add_argument("--out-dir", default=None, help="output folder (default: <run>/predict); refused when it holds a "
                    "prediction file this run would write, unless --overwrite")
    pr.add_argument("--overwrite", action="store_true",
                    help="replace the predictions of images of the same names in --out-dir")
    if task == "detect":
        pr.add_argument("--score-thresh", type=float, default=0.5, help="draw and list detections above this score")
    pr.add_argument("--device", default="", help="cpu, cuda, ... (default: cuda when available)")
    pr.set_defaults(func=run_predict, task=task)
    p.set_defaults(func=lambda args: _no_action(p))
    return p


def _no_action(p: argparse.ArgumentParser) -> int:
    p.print_help()
    return 2


def add_parser(sub) -> argparse.ArgumentParser:
    return add_task_parser(sub, "detect")


def run_train(args: argparse.Namespace) -> int:
    import yaml

    from subquad.dense.engine import train_dense
    from subquad.engine.loop import Preempted
    from subquad_cli.config import check_run_output
    from subquad_cli.denseconfig import resolve_dense_config

    cfg = resolve_dense_config(args, args.task)
    if not cfg.resume and not cfg.dry_run:
        check_run_output(cfg.output, args.overwrite)
    if cfg.checkpoint_every < 0:
        from subquad_cli.errors import UserError

        raise UserError(f"--checkpoint-every must be >= 0, got {cfg.checkpoint_every}")
    try:
        r = train_dense(cfg, args.task)
    except Preempted as e:  # SIGTERM / SIGINT: the state is written and its place printed
        return int(e.code)
    if r.get("dry_run"):
        print(yaml.safe_dump(r["config"], sort_keys=False).rstrip())
        print(f"dry run: {r['kind']} on {cfg.model} ({r['params'] / 1e6:.3f}M params), {r['num_classes']} classes, "
              f"{r['train_images']} training images, {r['total_iters']} iterations ({r['iters_per_epoch']}/epoch); "
              "nothing written")
        return 0
    if r.get("rank", 0) == 0:
        shown = "  ".join(f"{k} {r[k]:.4f}" for k in ("bbox_mAP", "bbox_mAP50", "segm_mAP", "segm_mAP50", "mIoU",
                                                      "aAcc") if k in r)
        print(f"validation: {shown}")
        print(f"training time: {r['train_time_s']:.0f} s for {r['iters']} iterations")
        print(f"run: {r['output']}")
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from subquad_cli.dense_run import evaluate_run

    return evaluate_run(args)


def run_predict(args: argparse.Namespace) -> int:
    from subquad_cli.dense_run import predict_run

    return predict_run(args)
