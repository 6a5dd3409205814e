"""The `subquad` command: one console script with subcommands.

Each subcommand lives in `subquad_cli/<name>.py` and exposes `add_parser(subparsers)`, which registers its parser
and sets `func` to the function that runs it. Building the parsers must not import the library (`subquad`, whose
import loads torch and timm and registers every model; tests hold every entry of COMMANDS to `--help` in under a
second, and the parser modules to imports from subquad_cli alone): import it inside `func`. The library is loaded
after parsing, before `func` runs, unless the parser sets `lazy=True` (then `func` imports what it needs).

A user error (`subquad.errors.UserError`, or an OSError naming a file) prints one line `subquad <cmd>: error: ...`
and exits 2; anything else is a bug and keeps its traceback. Set SUBQUAD_DEBUG=1 for the traceback of a user error.
Commands that load the library first let glibc keep up to 256 MiB of freed memory for reuse
(`subquad.backend.keep_freed_memory`; SUBQUAD_KEEP_FREED_MIB sets the MiB, 0 leaves glibc's defaults).
Every command's `--device` is checked here, before its subcommand runs (`engine.distributed.check_device`): a device
this machine lacks is one line, not the traceback of the first tensor moved to it.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

# Subcommand -> module in subquad_cli. One line per command.
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
    "arena": "arena",
    "detect": "detect",
    "segment": "segment",
    "export": "export",
    "timm": "timm_scripts",
    "video": "video",
}

# Namespace attribute naming the innermost parser that was left with unrecognised arguments.
_EXTRAS_PARSER = "_subquad_extras_parser"


class _OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors (unknown flag, bad value) are one line and exit 2, that accepts no abbreviated
    flags, and that reports an unknown flag with the help of the (sub)command it was given to; subparsers inherit
    it."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")

    def parse_known_args(self, args=None, namespace=None):
        ns, extras = super().parse_known_args(args, namespace)
        # Subparsers run first (innermost first): the first parser left with extras is the one they were given to.
        if extras and not hasattr(ns, _EXTRAS_PARSER):
            setattr(ns, _EXTRAS_PARSER, self)
        return ns, extras

    def parse_args(self, args=None, namespace=None):
        ns, extras = self.parse_known_args(args, namespace)
        owner = getattr(ns, _EXTRAS_PARSER, self)
        if hasattr(ns, _EXTRAS_PARSER):
            delattr(ns, _EXTRAS_PARSER)
        if extras:
            owner.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="subquad", description="Sub-quadratic attention: models, training, "
                            "benchmarks and analysis.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS.values():
        importlib.import_module(f"subquad_cli.{module}").add_parser(sub)
    return parser


def _one_line(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename:
        return f"{e.strerror or type(e).__name__}: {e.filename}"
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def setup_logging() -> None:
    """subquad's own messages (loggers `subquad` and `subquad_cli`, INFO) as plain lines on stderr. The root logger
    keeps its level (WARNING), so third-party libraries (onnxscript, torch.onnx, timm, ...) say only what they warn
    about."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
    for name in ("subquad", "subquad_cli"):
        logging.getLogger(name).setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "own_logging", False):
        setup_logging()
    if args.version:
        from subquad_cli.version import __version__

        print(__version__)
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from subquad_cli.errors import UserError

    try:
        if not getattr(args, "lazy", False):
            import subquad  # noqa: F401  (loads the library: every mechanism and model registered)
            from subquad.backend import keep_freed_memory_from_env

            keep_freed_memory_from_env()  # freed memory reused, not faulted in again each step (subquad.backend)
        if getattr(args, "device", None):
            from subquad.engine.distributed import check_device

            check_device(args.device)
        result = args.func(args)
        sys.stdout.flush()  # a closed reader shows here, inside the handler below, not at interpreter exit
    except BrokenPipeError:
        # The reader of our output went away (`subquad models | head`): stop quietly, as Unix tools do on SIGPIPE.
        # Python would report the flush of the now-dead stdout at exit again, so stdout goes to /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except (UserError, OSError) as e:
        if os.environ.get("SUBQUAD_DEBUG"):
            raise
        print(f"subquad {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"subquad {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
