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
from pathlib import Path
from typing import Any

from subquad.config import load_yaml, parse_yaml

TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "lra"

# Flags that map one-to-one onto LRAConfig fields: (flag, type, help).
_FLAGS: list[tuple[str, type, str]] = [
    ("max_steps", int, "training steps (default: the recipe's `steps`; the warm-up fraction is kept)"),
    ("steps", int, "the recipe's step budget (sets the warm-up fraction warmup/steps)"),
    ("warmup", int, "warm-up steps of the recipe"),
    ("eval_every", int, "evaluate the dev split every N steps"),
    ("eval_steps", int, "dev batches per evaluation (0 = the whole split)"),
    ("batch_size", int, "batch size"),
    ("lr", float, "peak learning rate (OneCycle max_lr)"),
    ("weight_decay", float, "AdamW weight decay"),
    ("encoding", str, "ListOps tokenisation: lra_released (published numbers) or structural (keeps brackets)"),
    ("max_len", int, "padded sequence length"),
    ("vocab_size", int, "embedding rows (official 512)"),
    ("dim", int, "model width"),
    ("depth", int, "layers"),
    ("num_heads", int, "heads"),
    ("mlp_dim", int, "FFN width"),
    ("pool", str, "cls_last (official), cls, mean or masked_mean"),
    ("drop", float, "dropout"),
    ("attn_drop", float, "attention dropout (mechanisms with attn_drop)"),
    ("limit_train", int, "use only the first N training examples"),
    ("limit_eval", int, "use only the first N dev/test examples"),
    ("seed", int, "random seed"),
    ("checkpoint_every", int, "also write the resumable state every N steps (0: at evaluations only); SIGTERM / "
     "SIGINT always write it before stopping"),
    ("device", str, "cpu, cuda, ... (default: cuda when available)"),
    ("workers", int, "data-loader workers"),
    ("output", str, "run directory (default runs/<time>-lra-<task>-<attention>)"),
]


# Flags spelled as `subquad train` spells them (--train-limit), not as the LRAConfig field (limit_train).
_FLAG_NAMES = {"limit_train": "--train-limit", "limit_eval": "--eval-limit"}


def _flag(name: str) -> str:
    return _FLAG_NAMES.get(name, "--" + name.replace("_", "-"))


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
                        "last/best.safetensors (+ JSON sidecars) and results.json.")
    t.add_argument("--task", choices=TASKS, help="LRA task (required unless --resume)")
    t.add_argument("--data", help="folder with the task's files (required unless --resume)")
    t.add_argument("--resume", default=None, metavar="DIR",
                   help="continue the run in DIR from its last state (an evaluation, --checkpoint-every or a "
                   "SIGTERM), with the settings of DIR/args.yaml (only --device, --workers and --checkpoint-every "
                   "may be given besides)")
    t.add_argument("--attention", default=None,
                   help="registered mechanism (default softmax): any 1-D one (softmax, linear, long_short ...), and "
                   "with --grid the 2-D ones too (structure_aware, focused_linear, window, global_filter ...)")
    t.add_argument("--grid", default=None, metavar="H,W",
                   help="token grid of an image-like task (pathfinder: 32,32; image: 32,32): passed to the "
                   "mechanisms as hw, so 2-D mechanisms run; needs --pool mean or masked_mean for them")
    t.add_argument("-c", "--config", default=None,
                   help="YAML overriding the task's shipped recipe (a file, or a name in subquad/configs/lra/)")
    t.add_argument("--attn-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="mechanism option (YAML value), e.g. --attn-opt window_size=16 --attn-opt rank=2")
    t.add_argument("--window-size", type=int, default=None, help="long_short window w (shortcut for --attn-opt)")
    t.add_argument("--rank", type=int, default=None, help="long_short rank r (shortcut for --attn-opt)")
    t.add_argument("--amp", action="store_true", help="fp16 autocast on CUDA (the official runs used AMP)")
    t.add_argument("--overwrite", action="store_true",
                   help="train into --output even if it is a folder that is not empty (a run there is still refused)")
    for name, typ, help_text in _FLAGS:
        t.add_argument(_flag(name), type=typ, default=None, dest=name, help=help_text)
        if name in _FLAG_NAMES:  # the LRAConfig field's own spelling, kept as a hidden alias
            t.add_argument("--" + name.replace("_", "-"), type=typ, default=None, dest=name, help=argparse.SUPPRESS)
    t.set_defaults(func=run_train)
    p.set_defaults(func=lambda a: _need(p, "generate|train"))
    return p


def _need(p: argparse.ArgumentParser, what: str) -> int:
    p.print_help()
    from subquad.errors import UserError

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
    from subquad.errors import UserError

    parts = text.replace("x", ",").split(",")
    try:
        grid = [int(p) for p in parts]
    except ValueError:
        grid = []
    if len(grid) != 2 or min(grid) < 1:
        raise UserError(f"--grid expects H,W (two positive integers, e.g. 32,32), got {text!r}")
    return grid


def _parse_opt(text: str) -> tuple[str, Any]:
    from subquad.errors import UserError

    if "=" not in text:
        raise UserError(f"--attn-opt expects KEY=VALUE, got {text!r}")
    k, v = text.split("=", 1)
    return k.strip(), parse_yaml(v, f"--attn-opt {text}")


def _resume_config(args: argparse.Namespace):
    """--resume DIR: the run's own args.yaml, with resume on (and --device / --workers when given)."""
    from subquad.engine.runfiles import refuse_resume_changes
    from subquad.engine.sequence import LRAConfig
    from subquad.errors import UserError

    out = Path(args.resume)
    given = [_flag(n) for n, _, _ in _FLAGS if n not in ("device", "workers", "checkpoint_every")
             and getattr(args, n, None) is not None]
    given += [f for f, v in (("--config", args.config), ("--attn-opt", args.attn_opt), ("--grid", args.grid),
                             ("--window-size", args.window_size), ("--rank", args.rank)) if v]
    refuse_resume_changes(out, given, ["--device", "--workers", "--checkpoint-every"])
    if not (out / "args.yaml").is_file():
        raise UserError(f"--resume {out}: no args.yaml there (not a `subquad lra train` run directory)")
    values = load_yaml(out / "args.yaml")
    fields = {f.name for f in dataclasses.fields(LRAConfig)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise UserError(f"--resume {out}: args.yaml has unknown key(s) {unknown}")
    for name, given_value in (("task", args.task), ("data", args.data), ("attention", args.attention)):
        if given_value is not None and given_value != values.get(name):
            raise UserError(f"--resume {out}: the run has --{name} {values.get(name)!r}, not {given_value!r}")
    values.update(resume=True, output=str(out))
    for name in ("device", "workers", "checkpoint_every"):
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    return LRAConfig(**values)


def resolve_config(args: argparse.Namespace):
    """Recipe of the task, then -c YAML, then the flags -> LRAConfig (with --resume DIR: DIR/args.yaml)."""
    from subquad.engine.sequence import LRAConfig
    from subquad.errors import UserError

    if getattr(args, "resume", None):
        return _resume_config(args)
    if args.task is None or args.data is None:
        raise UserError("--task and --data are required (unless --resume DIR)")
    if args.task not in TASKS:
        raise UserError(f"unknown LRA task {args.task!r}; allowed: {', '.join(TASKS)}")
    values: dict[str, Any] = {}
    from subquad.cli.config import find_config

    for path in (CONFIG_DIR / f"{args.task}.yaml", args.config):
        if path is None:
            continue
        path = find_config(path, ("lra",))
        values.update(load_yaml(path))
    fields = {f.name for f in dataclasses.fields(LRAConfig)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise UserError(f"unknown LRA config key(s) {unknown}; allowed: {sorted(fields)}")
    if values.get("task", args.task) != args.task:
        raise UserError(f"config is for task {values['task']!r} but --task is {args.task!r}")
    attention = args.attention or "softmax"
    values.update(task=args.task, data=args.data, attention=attention, amp=bool(args.amp))
    if getattr(args, "grid", None) is not None:
        values["grid"] = _parse_grid(args.grid)
    for name, _, _ in _FLAGS:
        v = getattr(args, name, None)
        if v is not None:
            values[name] = v
    opts = dict(values.get("attn_kw", {}).get(attention, {}))
    opts.update(_parse_opt(o) for o in args.attn_opt)
    if args.window_size is not None:
        opts["window_size"] = args.window_size
    if args.rank is not None:
        opts["rank"] = args.rank
    values["attn_kw"] = {**values.get("attn_kw", {}), attention: opts}
    return LRAConfig(**values)


def run_train(args: argparse.Namespace) -> int:
    import subquad
    from subquad.attention import ATTENTION_REGISTRY
    from subquad.engine.loop import Preempted
    from subquad.engine.sequence import train_lra

    if args.attention is not None and args.attention not in ATTENTION_REGISTRY:
        subquad.build_attention(args.attention, 8, 1)  # raises the one-line unknown-attention error
    cfg = resolve_config(args)
    if not cfg.resume:
        from subquad.cli.config import check_run_output

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
