"""`subquad video generate`: the synthetic moving-square clips (real .mp4 files) and their Kinetics-style lists."""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("video", help="video data tools (synthetic clips)",
                       description="Video data tools. `generate` writes a synthetic direction task as real .mp4 "
                       "files (PyAV) with train.txt/val.txt/test.txt lists of `relative/path.mp4 label`, the layout "
                       "that `subquad train --data video:DIR` reads.")
    vsub = p.add_subparsers(dest="video_command", metavar="ACTION")
    g = vsub.add_parser("generate", help="write synthetic moving-square clips",
                        description="A bright square moves right, left, down or up (4 classes) on a noisy "
                        "background from a random start: the label is invisible in any single frame.")
    g.add_argument("--out", required=True, help="output folder (refused when not empty, unless --overwrite)")
    g.add_argument("--n-train", type=int, default=200)
    g.add_argument("--n-val", type=int, default=40)
    g.add_argument("--n-test", type=int, default=80)
    g.add_argument("--frames", type=int, default=16, help="frames per clip")
    g.add_argument("--size", type=int, default=32, help="frame side in pixels (even, >= 16)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--overwrite", action="store_true", help="write into a non-empty --out")
    g.set_defaults(func=run_generate, lazy=True)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1], lazy=True)
    return p


def run_generate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from subquad.data.video import generate_moving_squares
    from subquad_cli.errors import UserError

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        raise UserError(f"--out {out} is not empty; pass --overwrite to write into it")
    counts = generate_moving_squares(out, args.n_train, args.n_val, args.n_test, args.frames, args.size, args.seed)
    print(f"wrote {sum(counts.values())} clips ({', '.join(f'{k} {v}' for k, v in counts.items())}; "
          f"{args.frames} frames of {args.size}x{args.size}) to {out}; train with --data video:{out}")
    return 0
