"""Attention mechanisms: registry, `build_attention` and `list_attention`.

Each mechanism module registers itself with `@register_attention(name)` (from `subquad.attention.registry`);
importing this package imports them all.
"""

from __future__ import annotations

from .base import AttentionCaps, Request, TokenMixer, check
from .registry import (ATTENTION_REGISTRY, build_attention, build_stage_attention, get_attention_cls,
                       get_attention_form, list_attention, register_attention, register_attention_form)

__all__ = ["register_attention", "build_attention", "build_stage_attention", "list_attention", "get_attention_cls",
           "register_attention_form", "get_attention_form", "ATTENTION_REGISTRY",
           "AttentionCaps", "Request", "TokenMixer", "check"]


# Mechanism modules (each registers itself). Keep one import per line.
from . import softmax  # noqa: E402,F401
from .enhanced_linear import EnhancedLinearAttention  # noqa: E402,F401
from . import window  # noqa: E402,F401
from . import structure_aware  # noqa: E402,F401
from . import global_filter  # noqa: E402,F401
from . import long_short  # noqa: E402,F401
from .focused_linear import FocusedLinearAttention  # noqa: E402,F401
from .inline import InLineAttention  # noqa: E402,F401
from . import cswin  # noqa: E402,F401
from .linear import LinearAttention  # noqa: E402,F401
from . import sliding_window  # noqa: E402,F401
from . import linear_angular  # noqa: E402,F401
from .polarity import PolarityLinearAttention  # noqa: E402,F401
from . import host_forms  # noqa: E402,F401
from . import mlla  # noqa: E402,F401
from .agent import AgentAttention  # noqa: E402,F401
