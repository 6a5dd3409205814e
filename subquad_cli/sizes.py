"""The one spelling of an image size on the command line: a side `S` (S x S) or `HxW`."""

from __future__ import annotations

from collections.abc import Sequence

from subquad.errors import UserError


def one_size(values: Sequence[str] | None, flag: str = "--img-size") -> tuple[int, int] | None:
    """(H, W) of a size option given as `S`, `HxW`, or the older two numbers `H W`; None when not given.

    Raises UserError (one line, naming what was given and what is allowed) for anything else."""
    from subquad.bench.sweep import image_size

    if values is None:
        return None
    given = " ".join(values)
    if len(values) == 2 and all(v.strip().isdigit() for v in values):
        values = [f"{values[0]}x{values[1]}"]
    if len(values) != 1:
        raise UserError(f"{flag} {given!r}: expected one size, S or HxW (for example 224 or 224x320; H W also "
                        "works)")
    try:
        return image_size(values[0])
    except UserError:
        raise UserError(f"{flag} {given!r}: expected a positive side S or HxW (for example 224 or 224x320)") from None


def square_side(text: str) -> int:
    """argparse type of `--img-size` for the commands that run at a square size (eval, predict, analyze): S or SxS.

    A non-square HxW is refused in one line that names the commands that take it."""
    import argparse

    from subquad.bench.sweep import image_size

    try:
        h, w = image_size(text)
    except UserError:
        raise argparse.ArgumentTypeError(f"expected a positive side S (or SxS), got {text!r}") from None
    if h != w:
        raise argparse.ArgumentTypeError(f"{text!r} is not square: this command runs at S x S (subquad bench, flops "
                                         "and export take HxW)")
    return h
