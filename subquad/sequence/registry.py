"""The sequence-model registry: `@register_sequence_model(name)` on a builder, `create_sequence_model(name, **kw)`.

Model modules import `register_sequence_model` from here (not from the package), so that the package imports its
model modules without an import circle.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..registry import Registry

__all__ = ["register_sequence_model", "create_sequence_model", "list_sequence_models", "SEQUENCE_REGISTRY"]

SEQUENCE_REGISTRY = Registry("sequence model")


def register_sequence_model(name: str, **meta: Any):
    return SEQUENCE_REGISTRY.register(name, None, **meta)


def create_sequence_model(name: str, **kwargs: Any) -> nn.Module:
    return SEQUENCE_REGISTRY.get(name).builder(**kwargs)


def list_sequence_models() -> list[str]:
    return SEQUENCE_REGISTRY.names()
