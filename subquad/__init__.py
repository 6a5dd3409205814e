"""subquad: sub-quadratic attention for vision transformers and long sequences.

`import subquad` does the same wherever it runs (a script, a test, the `subquad` command): it imports neither torch
nor timm, and the library loads (every mechanism registered for `build_attention`, every model registered into
timm's registry) as soon as either of these happens:
- a public name is used (`subquad.create_model`, `subquad.list_attention`, any `subquad.<name>`);
- timm is imported, before or after subquad (`import subquad, timm; timm.create_model('l2vit_tiny')` works, and so
  does timm's `--device-modules subquad`); when timm comes in with a subquad module (`import subquad.attention`), the
  library loads once that import has finished.
So `subquad --help` answers without torch, and the command loads the library before a subcommand runs.
"""

from __future__ import annotations

import sys

from .errors import UserError
from .version import __version__

__all__ = ["create_model", "list_models", "build_attention", "list_attention", "count_macs", "UserError",
           "__version__"]

_loading: list[bool] = []  # non-empty while _load() runs (its `from . import` must not re-enter __getattr__)
_loaded: list[bool] = []  # non-empty once the library is loaded


def _load() -> None:
    """Import the library: register every mechanism and model (timm's registry included) and bind the API names."""
    if _loaded or _loading:
        return
    _loading.append(True)
    try:
        _import_all()
        _loaded.append(True)
    finally:
        _loading.pop()
    if _TIMM_HOOK in sys.meta_path:
        sys.meta_path.remove(_TIMM_HOOK)


def _import_all() -> None:
    from . import attention, models, sequence  # noqa: F401  (registration)
    from .attention import build_attention, list_attention
    from .bench.flops import count_macs
    from .models import create_model, list_models

    globals().update(build_attention=build_attention, list_attention=list_attention, count_macs=count_macs,
                     create_model=create_model, list_models=list_models)


def __getattr__(name: str):
    """Load the library on first use of a public name."""
    if name.startswith("__") or _loading:
        raise AttributeError(name)
    _load()
    try:
        return globals()[name]
    except KeyError:
        raise AttributeError(f"module 'subquad' has no attribute {name!r}") from None


def _initializing(module: object) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _load_when_ready(finished: str) -> None:
    """Load the library if timm is imported and no subquad import is under way (`finished` has just run)."""
    timm = sys.modules.get("timm")
    if _loaded or _loading or timm is None or (finished != "timm" and _initializing(timm)):
        return
    if any(n != finished and (n == "subquad" or n.startswith("subquad.")) and _initializing(m)
           for n, m in list(sys.modules.items())):
        return
    _load()


class _ThenLoad:
    """A module's own loader, followed by `_load_when_ready` once the module has run."""

    def __init__(self, loader, name: str) -> None:
        self._loader, self._name = loader, name

    def __getattr__(self, attr: str):
        return getattr(self._loader, attr)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = module.__spec__.loader = self._loader  # the module keeps its own loader
        self._loader.exec_module(module)
        _load_when_ready(self._name)


class _TimmHook:
    """Until the library is loaded: watches imports of timm and of subquad's modules (see the module docstring)."""

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname != "timm" and not fullname.startswith("subquad."):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenLoad(spec.loader, fullname)
                return spec
        return None

    def invalidate_caches(self) -> None:
        pass


_TIMM_HOOK = _TimmHook()
if "timm" in sys.modules and not _initializing(sys.modules["timm"]):
    _load()
else:
    sys.meta_path.insert(0, _TIMM_HOOK)
