"""User-facing errors.

`UserError` is raised for anything a user can fix (unknown names, bad sizes, missing files). The CLI prints its
message as one line and exits non-zero; library callers get an ordinary `ValueError` subclass.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["UserError", "closest", "unknown_name", "unsafe_pickle"]


class UserError(ValueError):
    """An error the user can fix; its message is one line naming what was wrong and what is allowed."""


def closest(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Return up to `n` distinct names from `choices` closest to `name` (difflib ratio, then substring matches)."""
    choices = list(dict.fromkeys(choices))  # e.g. subquad's models are in timm's list too
    found = difflib.get_close_matches(name, choices, n=n, cutoff=0.5)
    if len(found) < n:
        extra = [c for c in choices if name and (name in c or c in name) and c not in found]
        found += extra[: n - len(found)]
    return found


def unknown_name(kind: str, name: str, choices: Iterable[str]) -> UserError:
    """Build the standard 'unknown X' error with the closest names as suggestions."""
    choices = sorted(set(choices))
    near = closest(name, choices)
    if near:
        hint = f"did you mean {', '.join(repr(c) for c in near)}?"
    elif len(choices) <= 40:  # few enough to name (the mechanisms): the user sees what is allowed
        hint = f"allowed: {', '.join(choices)}"
    else:
        hint = f"{len(choices)} are registered"
    return UserError(f"unknown {kind} {name!r}; {hint} (list them with `subquad models` / subquad.list_{kind}s())"
                     if kind == "model" else f"unknown {kind} {name!r}; {hint}")


def unsafe_pickle(path: object, error: BaseException) -> UserError:
    """The refusal of a pickle that `torch.load(weights_only=True)` would not read: the file cannot be loaded safely,
    and a trusted one can be converted once to safetensors. Names what the pickle asked for (a global, an opcode)
    but, unlike torch's own message, never suggests turning `weights_only` off."""
    import re

    text = str(error)
    found = re.search(r"GLOBAL ([\w.]+)", text) or re.search(r"global '([\w.]+)'", text)
    what = f"it refers to {found.group(1)}" if found else None
    if what is None:
        op = re.search(r"Unsupported operand (\d+)", text)
        what = f"it uses pickle opcode {op.group(1)}" if op else "it holds more than tensors and plain containers"
    return UserError(f"refusing to load {path}: it cannot be loaded safely ({what}; unpickling it could run code). "
                     "If you trust where it came from, convert it once to tensors only: load it in Python, save its "
                     "state dict with safetensors.torch.save_file(state_dict, 'weights.safetensors') and pass that "
                     "file instead")
