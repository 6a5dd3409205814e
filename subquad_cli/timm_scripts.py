"""`subquad timm SCRIPT [ARGS...]`: run one of timm's own scripts (train.py, validate.py, benchmark.py, ...) with
subquad's models registered in timm's registry.

timm's scripts ship with its source repository (https://github.com/huggingface/pytorch-image-models), not with the
wheel, and only `train.py` can import extra model modules (`--device-modules`). This command imports subquad (which
registers every subquad model into timm's registry), then runs SCRIPT as `__main__` with `sys.argv = [SCRIPT,
*ARGS]` and the script's folder first on `sys.path`, as `python SCRIPT ARGS` would; the script's exit status is the
command's. Logging is left to the script (timm's scripts configure their own). Multi-process runs work as usual:
`torchrun --nproc_per_node N -m subquad timm train.py ...`.
"""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("timm", help="run timm's train.py / validate.py / benchmark.py with subquad's models",
                       description="Run a script of timm's repository (train.py, validate.py, benchmark.py, ...) "
                       "with every subquad model registered, e.g. `subquad timm validate.py --model l2vit_tiny "
                       "--data-dir /data/imagenet --checkpoint model_best.pth.tar`. Everything after SCRIPT is "
                       "passed to it unchanged (a leading `--` is dropped).")
    p.add_argument("script", metavar="SCRIPT", help="path to the script, e.g. pytorch-image-models/validate.py")
    p.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's own arguments")
    p.set_defaults(func=run, own_logging=True)
    return p


def run(args: argparse.Namespace) -> int:
    import runpy
    import sys
    from pathlib import Path

    from subquad_cli.errors import UserError

    script = Path(args.script)
    if not script.is_file():
        raise UserError(f"script not found: {script} (timm's train.py, validate.py and benchmark.py are in its "
                        "repository, https://github.com/huggingface/pytorch-image-models, not in the wheel)")
    argv = list(args.script_args)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *argv]
    sys.path.insert(0, str(script.resolve().parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return int(e.code or 0)
        print(e.code, file=sys.stderr)
        return 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return 0
