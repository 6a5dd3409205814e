"""subquad: sub-quadratic attention for vision transformers and long sequences.

Importing subquad registers every mechanism (`build_attention`) and every model into timm's registry
(`timm.create_model('l2vit_tiny')` works after `import subquad`).

The `subquad` command is the one exception: while it starts, the package is imported without torch and timm, so
that `--help`, `--version` and argument errors answer at once; the command loads the library (`_load()`) before
a subcommand runs, and any public name used before that loads it on first access.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .errors import UserError
from .version import __version__

__all__ = ["create_model", "list_models", "build_attention", "list_attention", "count_macs", "UserError",
           "__version__"]

# The `subquad` command's module names (`python -m NAME`).
_COMMAND_MODULES = ("subquad", "subquad.cli", "subquad.cli.__main__")
_loading: list[bool] = []  # non-empty while _load() runs (its `from . import` must not re-enter __getattr__)


def _load() -> None:
    """Import the library: register every mechanism and model (timm's registry included) and bind the API names."""
    _loading.append(True)
    try:
        _import_all()
    finally:
        _loading.pop()


def _import_all() -> None:
    from . import attention, models, sequence  # noqa: F401  (registration)
    from .attention import build_attention, list_attention
    from .bench.flops import count_macs
    from .models import create_model, list_models

    globals().update(build_attention=build_attention, list_attention=list_attention, count_macs=count_macs,
                     create_model=create_model, list_models=list_models)


def _command_starting() -> bool:
    """True while the `subquad` command itself is starting (its console script, or `python -m subquad[.cli]`)."""
    argv = list(getattr(sys, "orig_argv", None) or [])
    if "-m" in argv:
        i = argv.index("-m")
        return i + 1 < len(argv) and argv[i + 1] in _COMMAND_MODULES
    return bool(sys.argv) and Path(sys.argv[0]).name == "subquad" and sys.argv[0] not in ("-c", "")


if _command_starting():
    def __getattr__(name: str):
        """Load the library on first use of a public name (the command's lazy start)."""
        if name.startswith("__") or _loading:
            raise AttributeError(name)
        _load()
        try:
            return globals()[name]
        except KeyError:
            raise AttributeError(f"module 'subquad' has no attribute {name!r}") from None
else:
    _load()
