"""The one spelling of an image size on the command line: a side `S` (S x S) or `HxW`.

Parsing needs nothing from the library (the command line parses without importing torch)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def parse_size(text: str) -> tuple[int, int] | None:
    """(H, W) of `S` or `HxW` (positive decimal integers, case-insensitive x, spaces around parts allowed); None
    for anything else."""
    parts = [p.strip() for p in str(text).lower().split("x")]
    if not 1 <= len(parts) <= 2 or not all(p.isdecimal() and int(p) >= 1 for p in parts):
        return None
    h, w = int(parts[0]), int(parts[-1])
    return h, w


def one_size(values: Sequence[str] | None, flag: str = "--img-size") -> tuple[int, int] | None:
    """(H, W) of a size option given as `S`, `HxW`, or the older two numbers `H W`; None when not given.

    Raises UserError (one line, naming what was given and what is allowed) for anything else."""
    from subquad.errors import UserError

    if values is None:
        return None
    given = " ".join(values)
    if len(values) == 2 and all(v.strip().isdecimal() for v in values):
        values = [f"{values[0]}x{values[1]}"]
    if len(values) != 1:
        raise UserError(f"{flag} {given!r}: expected one size, S or HxW (for example 224 or 224x320; H W also "
                        "works)")
    hw = parse_size(values[0])
    if hw is None:
        raise UserError(f"{flag} {given!r}: expected a positive side S or HxW (for example 224 or 224x320)")
    return hw


def square_side(text: str) -> int:
    """argparse type of `--img-size` for a command that runs at a square size (analyze): S or SxS.

    A non-square HxW is refused in one line that names the commands that take it."""
    hw = parse_size(text)
    if hw is None:
        raise argparse.ArgumentTypeError(f"expected a positive side S (or SxS), got {text!r}")
    if hw[0] != hw[1]:
        raise argparse.ArgumentTypeError(f"{text!r} is not square: this command runs at S x S (bench, flops, export, "
                                         "eval and predict take HxW)")
    return hw[0]


def size_arg(text: str) -> int | tuple[int, int]:
    """argparse type of `--img-size` for eval and predict: S (a side) or HxW; a square HxW is the side S."""
    hw = parse_size(text)
    if hw is None:
        raise argparse.ArgumentTypeError(f"expected a positive side S or HxW (for example 224 or 224x320), got "
                                         f"{text!r}")
    return hw[0] if hw[0] == hw[1] else hw
