"""The attention registry: `register_attention`, `build_attention`, `build_stage_attention`, `list_attention`.

Mechanism modules import `register_attention` from here; `subquad.attention` re-exports every name and imports the
mechanism modules, so that importing the package registers them all.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from ..errors import UserError
from ..registry import Registry
from .base import REGISTERED, TokenMixer
from .legacy_options import translate_removed_options

__all__ = ["ATTENTION_REGISTRY", "register_attention", "get_attention_cls", "build_attention",
           "build_stage_attention", "list_attention", "register_attention_form", "get_attention_form", "FORMS"]

ATTENTION_REGISTRY = Registry("attention")


def register_attention(name: str, **meta: Any):
    """Class decorator: register a TokenMixer subclass under `name` (sets `cls.name`)."""

    def _wrap(cls):
        cls.name = name
        ATTENTION_REGISTRY.register(name, cls, **meta)
        REGISTERED[name] = cls
        return cls

    return _wrap


def get_attention_cls(name: str) -> type[TokenMixer]:
    return ATTENTION_REGISTRY.get(name).builder


# Other forms of registered mechanisms, by (name, form). "host_qkv": the form for hosts that project q, k, v
# themselves (CSwin's block-level qkv, CvT's convolutional projections); it owns no q/k/v layers and is called as
# `forward_qkv(q, k, v, hw, x=None)` (x: the input the host projected, for mechanisms that read it).
_FORMS: dict[tuple[str, str], type] = {}
FORMS = ("host_qkv",)


def register_attention_form(name: str, form: str):
    """Class decorator: register `cls` as form `form` of mechanism `name` (`build_attention(name, ..., host_qkv=True)`
    builds it; sets `cls.name`)."""
    if form not in FORMS:
        raise ValueError(f"unknown attention form {form!r}; known: {FORMS}")

    def _wrap(cls):
        cls.name = name
        _FORMS[(name, form)] = cls
        return cls

    return _wrap


def get_attention_form(name: str, form: str) -> type:
    """The class of form `form` of mechanism `name`; a mechanism without that form is refused in one line."""
    ATTENTION_REGISTRY.get(name)  # unknown names: the registry's error
    cls = _FORMS.get((name, form))
    if cls is None:
        have = sorted(n for n, f in _FORMS if f == form)
        what = {"host_qkv": "take q, k, v projected by its host"}[form]
        raise UserError(f"attention {name!r} cannot {what} (no {form!r} form); mechanisms that can: {', '.join(have)}")
    return cls


def build_attention(name: str, dim: int, num_heads: int, **kwargs: Any) -> nn.Module:
    """Build the mechanism `name` for `dim` channels and `num_heads` heads.

    Args:
        name: a registered mechanism (see `list_attention()`).
        dim: channels C of x: (B, N, C).
        num_heads: heads h; dim % h must be 0.
        **kwargs: mechanism options; every mechanism accepts `input_size=(H, W)`, `device` and `dtype`.
            `host_qkv=True` builds the mechanism's form for hosts that project q, k, v themselves
            (`get_attention_form(name, "host_qkv")`; refused in one line for a mechanism without one).
    """
    entry = ATTENTION_REGISTRY.get(name)
    cls = entry.builder
    kwargs = translate_removed_options(name, kwargs)
    # A mechanism with several classes (long_short's causal form) picks one: `resolve(options) -> (class, options)`.
    resolve = getattr(cls, "resolve", None)
    if resolve is not None:
        cls, kwargs = resolve(dict(kwargs))
    if kwargs.pop("host_qkv", False):
        cls = get_attention_form(name, "host_qkv")
    params = inspect.signature(cls.__init__).parameters
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        unknown = sorted(k for k in kwargs if k not in params)
        if unknown:
            allowed = sorted(k for k in params if k not in ("self", "dim", "num_heads"))
            raise UserError(f"attention {name!r} got unknown option(s) {unknown}; allowed: {allowed}")
    return cls(dim, num_heads, **kwargs)


def build_stage_attention(name: str, dim: int, num_heads: int, stage: dict, overrides: dict | None = None,
                          **kwargs: Any) -> nn.Module:
    """Build mechanism `name` for one stage of a host: the mechanism's adapter (`stage_kwargs`) turns the host's
    stage facts (grid, window, shift, spatial reduction, projection layout, ...) into its options, so a host never
    switches on mechanism names. `overrides` (a user's `attn_kwargs`) and `kwargs` (device, dtype) are passed as
    they are."""
    opts = {**get_attention_cls(name).stage_kwargs(stage), **(overrides or {})}
    try:
        return build_attention(name, dim, num_heads, **opts, **kwargs)
    except UserError:
        raise
    except ValueError as e:  # the mechanism refuses this stage's sizes (e.g. CSwin's two branches, odd heads)
        fit = [n for n in ATTENTION_REGISTRY.names() if n != name and _builds(n, dim, num_heads, stage)]
        who = stage.get("host", "this host")
        raise UserError(f"attention {name!r} cannot serve {who} with {num_heads} head(s) of width {dim}: "
                        f"{str(e).splitlines()[0]}; mechanisms that fit this stage: {', '.join(fit) or 'none'}"
                        ) from e


def _builds(name: str, dim: int, num_heads: int, stage: dict) -> bool:
    """Whether mechanism `name` takes this stage (its declared caps, then a build on the meta device)."""
    cls = get_attention_cls(name)
    if cls.stage_refusal(stage) is not None:
        return False
    try:
        build_attention(name, dim, num_heads, **cls.stage_kwargs(stage), device="meta")
    except (ValueError, TypeError):
        return False
    return True


def list_attention(filter: str = "") -> list[str]:  # noqa: A002 - mirrors timm.list_models(filter=...)
    """Registered mechanism names, optionally filtered by a substring or glob."""
    import fnmatch

    names = ATTENTION_REGISTRY.names()
    if not filter:
        return names
    pat = filter if any(c in filter for c in "*?[") else f"*{filter}*"
    return [n for n in names if fnmatch.fnmatch(n, pat)]
