"""Sequence models (LRA encoder classifiers, character-level LM) and their registry.

Register a builder with `@register_sequence_model(name)`; build with `create_sequence_model(name, **kwargs)`.
"""

from __future__ import annotations

from .registry import SEQUENCE_REGISTRY, create_sequence_model, list_sequence_models, register_sequence_model

__all__ = ["register_sequence_model", "create_sequence_model", "list_sequence_models", "SEQUENCE_REGISTRY"]

# Model modules (each registers itself). One import per line.
from . import encoder  # noqa: E402,F401
from . import char_lm  # noqa: E402,F401
from .char_lm import CharLM  # noqa: E402,F401
