"""Sequence models (LRA encoder classifiers, character-level LM) and their registry.

Register a builder with `@register_sequence_model(name)`; build with `create_sequence_model(name, **kwargs)`.
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


# Model modules (each registers itself). One import per line.
from . import encoder  # noqa: E402,F401
from . import char_lm  # noqa: E402,F401
from .char_lm import CharLM  # noqa: E402,F401
