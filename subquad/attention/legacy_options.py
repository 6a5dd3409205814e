"""Options that subquad <= 0.1 accepted and that were removed, translated for the configs and run files written then.

`build_attention` passes every mechanism's options through `translate_removed_options(name, options)`. The only
entry today: long-short's `layout` (one set of parameter names per official form, removed when the mechanism kept one
set of names and the families' remaps took over the renaming): "lra" -> `global_token_rule="lra"` without the
relative-position bias, "external" -> `host_qkv=True`, "vision" / "ar" -> nothing. A DeprecationWarning says what to
write instead; any other value is refused.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

__all__ = ["translate_removed_options"]


def _long_short_layout(opts: dict) -> dict:
    layout = opts.pop("layout")
    if layout not in ("vision", "lra", "external", "ar", None):
        raise ValueError(f"long_short attention: layout={layout!r} was removed (one set of parameter names); "
                         "use global_token_rule='vision'|'lra', host_qkv=True, or causal=True")
    warnings.warn(f"long_short attention: layout={layout!r} is deprecated and ignored for names; "
                  + {"lra": "use global_token_rule='lra'", "external": "use host_qkv=True"}.get(layout, "drop it"),
                  DeprecationWarning, stacklevel=4)
    if layout == "lra":
        opts.setdefault("global_token_rule", "lra")
        opts.setdefault("rpe", False)
    elif layout == "external":
        opts["host_qkv"] = True
    return opts


# (mechanism, removed option) -> translation of the options dict
_REMOVED: dict[tuple[str, str], Callable[[dict], dict]] = {("long_short", "layout"): _long_short_layout}


def translate_removed_options(name: str, options: dict) -> dict:
    """`options` for mechanism `name` with every removed option translated (a copy; unchanged when none)."""
    out = dict(options)
    for (mech, key), fn in _REMOVED.items():
        if mech == name and key in out:
            out = fn(out)
    return out
