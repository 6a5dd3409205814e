"""The `subquad` command: one console script with subcommands.

Each subcommand lives in `subquad/cli/<name>.py` and exposes `add_parser(subparsers)`, which registers its parser
and sets `func` to the function that runs it. A user error prints one line `subquad <cmd>: error: ...` and exits 2;
set SUBQUAD_DEBUG=1 for the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

# Subcommand -> module in subquad.cli. One line per command.
COMMANDS: dict[str, str] = {
    "models": "models",
    "flops": "flops",
    "train": "train",
    "eval": "eval",
    "predict": "predict",
    "bench": "bench",
    "analyze": "analyze",
    "lra": "lra",
    "lm": "lm",
    "detect": "detect",
    "segment": "segment",
}


class _OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors (unknown flag, bad value) are one line and exit 2; subparsers inherit it."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="subquad", description="Sub-quadratic attention: models, training, "
                            "benchmarks and analysis.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS.values():
        importlib.import_module(f"subquad.cli.{module}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from subquad.version import __version__

        print(__version__)
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from subquad.errors import UserError

    try:
        result = args.func(args)
    except (UserError, ValueError, OSError) as e:
        if os.environ.get("SUBQUAD_DEBUG"):
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if isinstance(e, OSError) and e.filename:
            msg = f"{e.strerror or type(e).__name__}: {e.filename}"
        print(f"subquad {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"subquad {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
