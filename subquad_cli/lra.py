"""`subquad lra`: generate ListOps / Pathfinder data and train the LRA encoder with any 1-D mechanism.

    subquad lra generate listops --out DIR [--num-train 96000 --num-val 2000 --num-test 2000] [--seed S]
                                 [--min-len 500 --max-len 2000]
    subquad lra generate pathfinder --out DIR [--size 32|64|128] [--contour-length 14] [--distractors K]
                                    [--num-images N]
    subquad lra train --task listops|text|retrieval|image|pathfinder --data DIR --attention NAME
                      [-c YAML] [--max-steps N] [--eval-every N] [--attn-opt KEY=VALUE ...]
    subquad lra train --resume DIR          continue an interrupted run from its last evaluation

`train` starts from the task's shipped recipe (subquad/configs/lra/<task>.yaml, the official Transformer-LS
settings), then a `-c` YAML, then the flags; it writes args.yaml, summary.csv, last/best.safetensors with JSON
sidecars, results.json and (at every evaluation) the resumable last_state.pth to --output.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from subquad_cli.config import add_sequence_arguments, attn_options
from subquad_cli.recipes import CONFIG_ROOT, load_run_args, load_yaml

TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
CONFIG_DIR = CONFIG_ROOT / "lra"

def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("lra", help="Long Range Arena: generate data, train the LRA encoder",
                       description="Long Range Arena: ListOps/Pathfinder generators and training of the LRA encoder "
                       "classifier with any registered 1-D attention mechanism.")
    lsub = p.add_subparsers(dest="lra_command", metavar="{generate,train}")
    g = lsub.add_parser("generate", help="generate ListOps or Pathfinder data")
    gsub = g.add_subparsers(dest="dataset", metavar="{listops,pathfinder}")

    lo = gsub.add_parser("listops", help="the LRA ListOps generator (train/val/test.tsv, Source<TAB>Target)")
    lo.add_argument("--out", required=True, help="output folder (refused if not empty, unless --overwrite)")
    lo.add_argument("--overwrite", action="store_true",
                    help="write into --out even if it is a folder that is not empty (its files of the same names "
                    "are replaced)")
    lo.add_argument("--num-train", type=int, default=96_000)
    lo.add_argument("--num-val", type=int, default=2_000)
    lo.add_argument("--num-test", type=int, default=2_000)
    lo.add_argument("--seed", type=int, default=0)
    lo.add_argument("--min-len", type=int, default=500, help="keep trees with length > min-len (strict)")
    lo.add_argument("--max-len", type=int, default=2000, help="keep trees with length < max-len (strict)")
    lo.set_defaults(func=run_generate_listops)

    pf = gsub.add_parser("pathfinder", help="the Pathfinder generator (PNG images + metadata labels)")
    pf.add_argument("--out", required=True, help="output folder (refused if not empty, unless --overwrite)")
    pf.add_argument("--overwrite", action="store_true",
                    help="write into --out even if it is a folder that is not empty (its files of the same names "
                    "are replaced)")
    pf.add_argument("--size", type=int, default=32, choices=(32, 64, 128), help="image side (128 = Path-X)")
    pf.add_argument("--contour-length", type=int, default=14, help="paddles per target snake (6, 9, 14 = hard)")
    pf.add_argument("--distractors", type=int, default=None,
                    help="distractor snakes per image (default: LRA's, 20 // (contour length // 3) at 32 px)")
    pf.add_argument("--num-images", type=int, default=200_000, help="images (80/10/10 train/val/test)")
    pf.add_argument("--seed", type=int, default=0)
    pf.add_argument("--workers", type=int, default=1, help="processes (output does not depend on it)")
    pf.set_defaults(func=run_generate_pathfinder)
    g.set_defaults(func=lambda a: _need(g, "generate listops|pathfinder"))

    t = lsub.add_parser("train", help="train the LRA encoder on one task",
                        description="Train the LRA encoder classifier; writes args.yaml, summary.csv, "
                        "last/best.safetensors (+ JSON sidecars) and results.json. Precedence: defaults < the task's "
                        "shipped recipe < -c YAML < flags; with --resume DIR: DIR/args.yaml < flags.")
    from subquad_cli.runconfig import LRAConfig

    add_sequence_arguments(t, LRAConfig, "YAML overriding the task's shipped recipe (a file, or a name in "
                           "subquad/configs/lra/)")
    t.add_argument("--grid", default=None, metavar="H,W",
                   help="token grid of an image-like task (pathfinder: 32,32; image: 32,32): passed to the "
                   "mechanisms as hw, so 2-D mechanisms run; needs --pool mean or masked_mean for them")
    t.add_argument("--window-size", type=int, default=None, help="long_short window w (shortcut for --attn-opt)")
    t.add_argument("--rank", type=int, default=None, help="long_short rank r (shortcut for --attn-opt)")
    t.set_defaults(func=run_train)
    p.set_defaults(func=lambda a: _need(p, "generate|train"))
    return p


def _need(p: argparse.ArgumentParser, what: str) -> int:
    p.print_help()
    from subquad_cli.errors import UserError

    raise UserError(f"missing subcommand: {what}")


def run_generate_listops(args: argparse.Namespace) -> int:
    from subquad.data.lra.listops import write_listops
    from subquad.engine.checkpoint import refuse_existing_output

    refuse_existing_output(args.out, "--out", args.overwrite, folder=True)
    meta = write_listops(args.out, args.num_train, args.num_val, args.num_test, args.seed, args.min_len, args.max_len)
    counts = ", ".join(f"{k} {v['samples']}" for k, v in meta["files"].items())
    print(f"ListOps written to {args.out}: {counts} ({meta['seconds']:.1f}s)")
    return 0


def run_generate_pathfinder(args: argparse.Namespace) -> int:
    from subquad.data.lra.pathfinder import write_pathfinder
    from subquad.engine.checkpoint import refuse_existing_output

    refuse_existing_output(args.out, "--out", args.overwrite, folder=True)
    meta = write_pathfinder(args.out, size=args.size, contour_length=args.contour_length, num_images=args.num_images,
                            seed=args.seed, workers=args.workers, distractors=args.distractors)
    print(f"Pathfinder {args.size}x{args.size} (contour length {args.contour_length}, "
          f"{meta['params']['num_distractor_snakes']} distractors) written to {args.out}: "
          f"{meta['num_images']} images, {meta['positives']} connected ({meta['seconds']:.1f}s)")
    return 0


def _parse_grid(text: str) -> list[int]:
    from subquad_cli.errors import UserError

    parts = text.replace("x", ",").split(",")
    try:
        grid = [int(p) for p in parts]
    except ValueError:
        grid = []
    if len(grid) != 2 or min(grid) < 1:
        raise UserError(f"--grid expects H,W (two positive integers, e.g. 32,32), got {text!r}")
    return grid


def _derived(args: argparse.Namespace, cfg: Any, fresh: bool) -> dict[str, Any]:
    """The settings of the flags that are not fields: --grid and the mechanism options (--attn-opt, --window-size,
    --rank); a fresh run always records the entry of its mechanism in attn_kw."""
    values: dict[str, Any] = {}
    if getattr(args, "grid", None) is not None:
        values["grid"] = _parse_grid(args.grid)
    shortcuts = {k: getattr(args, k) for k in ("window_size", "rank") if getattr(args, k, None) is not None}
    values.update(attn_options(cfg, getattr(args, "attn_opt", None) or [], shortcuts, always=fresh))
    return values


def resolve_config(args: argparse.Namespace):
    """defaults < the task's shipped recipe < -c YAML < the flags -> LRAConfig; with --resume DIR: DIR/args.yaml <
    -c YAML < the flags, a setting that would change the run refused (`subquad_cli.config.resume_run`)."""
    from subquad_cli.config import apply_layers, recipe_layers, resume_run, typed_fields
    from subquad_cli.errors import UserError
    from subquad_cli.runconfig import LRAConfig

    layers = [*recipe_layers(args, ("lra",)), ("command line", typed_fields(args, LRAConfig))]
    if getattr(args, "resume", None):
        run = apply_layers(LRAConfig(), [(f"{args.resume}/args.yaml", load_run_args(args.resume))])
        layers.append(("command line", _derived(args, apply_layers(run, layers), fresh=False)))
        cfg = resume_run(LRAConfig, args.resume, layers)
        return dataclasses.replace(cfg, resume=True, output=str(args.resume))
    task = layers[-1][1].get("task")
    if task is None or not layers[-1][1].get("data"):
        raise UserError("--task and --data are required (unless --resume DIR)")
    if task not in TASKS:
        raise UserError(f"unknown LRA task {task!r}; allowed: {', '.join(TASKS)}")
    layers.insert(0, (str(CONFIG_DIR / f"{task}.yaml"), load_yaml(CONFIG_DIR / f"{task}.yaml")))
    recipe = apply_layers(LRAConfig(task=task), layers[:-1])
    if recipe.task != task:
        raise UserError(f"config is for task {recipe.task!r} but --task is {task!r}")
    cfg = apply_layers(LRAConfig(), layers)
    return apply_layers(cfg, [("command line", _derived(args, cfg, fresh=True))])


def run_train(args: argparse.Namespace) -> int:
    import subquad
    from subquad.attention import ATTENTION_REGISTRY
    from subquad.engine.loop import Preempted
    from subquad.engine.lra import train_lra

    cfg = resolve_config(args)
    if cfg.attention not in ATTENTION_REGISTRY:
        subquad.build_attention(cfg.attention, 8, 1)  # raises the one-line unknown-attention error
    if not cfg.resume:
        from subquad_cli.config import check_run_output

        check_run_output(cfg.output, args.overwrite)
    try:
        r = train_lra(cfg, log=print)
    except Preempted as e:  # SIGTERM / SIGINT: the state is written and its place printed
        return int(e.code)
    enc = f", encoding {r['encoding']}" if r["encoding"] else ""
    print(f"{cfg.task} ({cfg.attention}{enc}): test accuracy {r['test_acc']:.2f} % (best val {r['best_val_acc']:.2f} "
          f"% at step {r['best_step']}); {r['sec_per_step'] * 1000:.0f} ms/step; peak memory {r['peak_mem_mb']:.0f} MB")
    print(f"checkpoint: {r['checkpoint']}")
    return 0
