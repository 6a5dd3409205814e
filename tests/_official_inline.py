"""The official InLine model code (LeapLabTHU/InLine), loaded by file path for parity checks.

Same convention as `tests/_official.py` (whose loader it uses): every function takes the root of the official
checkouts, the folder holding `InLine/` (tests read it from `SUBQUAD_OFFICIAL_ROOT`); nothing is installed, timm's
`register_model` is a no-op while a file executes and construction output is silenced.

`build_official_inline(root, name)` builds the official counterpart of our registered InLine model `name` as the
official configs do (`cfgs/inline_*.yaml` over the `config.py` defaults `ATTN_TYPE='IIII'`,
`PVT_LA_SR_RATIOS=1111`, `CSWIN_LA_SPLIT_SIZE='56-28-14-7'`); `INLINE_NAMES` lists the names it knows.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from types import ModuleType

from torch import nn

from subquad.errors import UserError
from tests._official import load_module, official_file, quiet

__all__ = ["INLINE_NAMES", "load_inline", "build_official_inline"]

_INLINE = "InLine/models/{}.py"
# name -> (img_size, C, heads) for DeiT (the official VisionTransformer, built directly: the variant functions call
# timm 0.4's build_model_with_cfg)
_DEIT = {"inline_deit_tiny": (224, 192, 6), "inline_deit_small": (288, 320, 10), "inline_deit_base": (448, 384, 12)}
_PVT = [f"inline_pvt_{n}" for n in ("tiny", "small", "medium", "large")]
_SWIN = {"inline_swin_tiny": (96, (2, 2, 6, 2), (3, 6, 12, 24), "IIIS"),
         "inline_swin_small": (96, (2, 2, 18, 2), (3, 6, 12, 24), "IISS"),
         "inline_swin_base": (128, (2, 2, 18, 2), (4, 8, 16, 32), "IIMS2")}
_CSWIN = [f"inline_cswin_{n}" for n in ("tiny", "small", "base")]
INLINE_NAMES: tuple[str, ...] = (*_DEIT, *_PVT, *_SWIN, *_CSWIN)


def load_inline(root: str | Path, file: str) -> ModuleType:
    """An official InLine model file: `file` is `inline_deit`, `inline_pvt`, `inline_swin` or `inline_cswin`."""
    return load_module(official_file(root, _INLINE.format(file)), f"_official_{file}")


def build_official_inline(root: str | Path, name: str, **kwargs) -> nn.Module:
    """The official model matching our registered InLine model `name` (random init, train mode, CPU), quietly, at
    224 px (DeiT-S 288, DeiT-B 448); kwargs go to the official constructor (e.g. num_classes)."""
    with quiet():
        if name in _DEIT:
            size, C, h = _DEIT[name]
            return load_inline(root, "inline_deit").VisionTransformer(img_size=size, patch_size=16, embed_dim=C,
                                                                      depth=12, num_heads=h, **kwargs)
        if name in _PVT:
            return getattr(load_inline(root, "inline_pvt"), name)(la_sr_ratios="1111", attn_type="IIII", **kwargs)
        if name in _SWIN:
            C, depths, heads, types = _SWIN[name]
            fn = partial(load_inline(root, "inline_swin").InLineSwin, img_size=224, embed_dim=C, depths=list(depths),
                         num_heads=list(heads), window_size=56, attn_type=types)
            return fn(**kwargs)
        if name in _CSWIN:
            return getattr(load_inline(root, "inline_cswin"), name)(img_size=224, la_split_size="56-28-14-7",
                                                                    attn_type="IISS", **kwargs)
    raise UserError(f"no official InLine code for model {name!r}; known: {', '.join(INLINE_NAMES)}")
