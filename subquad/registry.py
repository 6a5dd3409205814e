"""Thin name -> builder registries for attention mechanisms and sequence models.

Image models live in timm's registry (`timm.models.register_model`); this module only holds the two registries timm
does not have. Registering a name twice is an error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import unknown_name

__all__ = ["Registry", "Entry"]


@dataclass(frozen=True)
class Entry:
    name: str
    builder: Callable[..., Any]
    meta: dict[str, Any] = field(default_factory=dict)


class Registry:
    """A name -> builder mapping; `kind` names the registry in error messages."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, builder: Callable[..., Any] | None = None, **meta: Any):
        """Register `builder` under `name`; usable as a decorator when `builder` is None."""

        def _add(fn: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered (by {self._entries[name].builder!r})")
            self._entries[name] = Entry(name, fn, dict(meta))
            return fn

        return _add if builder is None else _add(builder)

    def get(self, name: str) -> Entry:
        if not isinstance(name, str) or name not in self._entries:
            raise unknown_name(self.kind, str(name), self._entries)
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def names(self) -> list[str]:
        return sorted(self._entries)
