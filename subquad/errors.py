"""User-facing errors.

`UserError` is raised for anything a user can fix (unknown names, bad sizes, missing files). The CLI prints its
message as one line and exits non-zero; library callers get an ordinary `ValueError` subclass.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["UserError", "closest", "unknown_name"]


class UserError(ValueError):
    """An error the user can fix; its message is one line naming what was wrong and what is allowed."""


def closest(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Return up to `n` names from `choices` closest to `name` (difflib ratio, then substring matches)."""
    choices = list(choices)
    found = difflib.get_close_matches(name, choices, n=n, cutoff=0.5)
    if len(found) < n:
        extra = [c for c in choices if name and (name in c or c in name) and c not in found]
        found += extra[: n - len(found)]
    return found


def unknown_name(kind: str, name: str, choices: Iterable[str]) -> UserError:
    """Build the standard 'unknown X' error with the closest names as suggestions."""
    choices = sorted(choices)
    near = closest(name, choices)
    hint = f"did you mean {', '.join(repr(c) for c in near)}?" if near else f"{len(choices)} are registered"
    return UserError(f"unknown {kind} {name!r}; {hint} (list them with `subquad models` / subquad.list_{kind}s())"
                     if kind == "model" else f"unknown {kind} {name!r}; {hint}")
