"""Model construction and checkpoint loading shared by every family.

`build(cls, variant, pretrained, remap, out_indices, **kwargs)` wraps `timm.models.build_model_with_cfg` (so
`features_only=True` works through `forward_intermediates`), and `load_checkpoint` loads official `.pth` files
(`torch.load(weights_only=True)`, unwrapping `model` / `state_dict` / `model_ema`) or our safetensors, through the
family's `remap_official`, with strict semantics and a one-line report of what did not match.
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from timm.models import build_model_with_cfg
from torch import nn

from ..errors import UserError

__all__ = ["build", "load_checkpoint", "read_state_dict", "unwrap_state_dict", "load_into", "Variant",
           "register_family", "NON_STD", "FAMILY_MODULES", "IMAGENET_CFG"]

_logger = logging.getLogger(__name__)

_WRAPPER_KEYS = ("model_ema", "state_dict_ema", "model", "state_dict", "module", "net")


def build(model_cls: type[nn.Module], variant: str, pretrained: bool = False,
          remap: Callable[[dict, nn.Module], dict] | None = None, default_out_indices: Sequence[int] = (0, 1, 2, 3),
          **kwargs: Any) -> nn.Module:
    """Build a registered variant through timm (features via `forward_intermediates`).

    `pretrained=True` (or a tagged name such as `l2vit_tiny.in1k`) loads the weights that timm's pretrained cfg
    names: `file` (e.g. `pretrained_cfg_overlay=dict(file=...)`) or the official release `url` (downloaded into
    timm's cache). Either is read without unpickling objects and mapped strictly through `remap`; a head of another
    size than the checkpoint's is left freshly initialised. A variant without released weights says so.
    """
    checkpoint_path = kwargs.pop("subquad_checkpoint", None)
    # A caller's out_indices (features_only=True) overrides the family default.
    out_indices = kwargs.pop("out_indices", default_out_indices)
    features = bool(kwargs.get("features_only", False))
    model = build_model_with_cfg(
        model_cls, variant, False, feature_cfg=dict(
            feature_cls="getter", out_indices=out_indices if isinstance(out_indices, int) else tuple(out_indices)),
        **kwargs)
    skip_head = False
    if pretrained:
        cfg = model.pretrained_cfg
        checkpoint_path = cfg.get("file") or _download(cfg.get("url"), variant, cfg)
        backbone = model.model if features else model
        skip_head = getattr(backbone, "num_classes", cfg.get("num_classes")) != cfg.get("num_classes")
    if checkpoint_path:
        backbone = model.model if features else model
        sd = read_state_dict(checkpoint_path)
        sd = remap(sd, backbone) if remap is not None else sd
        own = backbone.state_dict()
        if features:
            # A feature extractor has pruned its head (and maybe late stages): load the keys it kept (every one must
            # be in the checkpoint, with its shape).
            sd = {k: v for k, v in sd.items() if k in own}
        if skip_head:
            # A head of another size keeps its fresh init.
            head = (model.pretrained_cfg.get("classifier") or "head") + "."
            sd = {**{k: v for k, v in sd.items() if not k.startswith(head)},
                  **{k: v for k, v in own.items() if k.startswith(head)}}
        load_into(backbone, sd, strict=True, what=f"checkpoint {os.fspath(checkpoint_path)!r}")
    return model


def _download(url: str | None, variant: str, cfg: dict) -> str:
    if not url:
        raise UserError(f"{variant}: no released weights exist ({cfg.get('notes') or 'none published'}); pass "
                        "checkpoint_path=... or pretrained_cfg_overlay=dict(file=...)")
    from timm.models._hub import download_cached_file

    return download_cached_file(url, check_hash=False, progress=True)


def unwrap_state_dict(obj: Any, prefer_ema: bool = False) -> dict[str, torch.Tensor]:
    """Return the tensor dict inside a checkpoint object (official `.pth` wrappers included)."""
    if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        sd = obj
    else:
        sd = None
        non_ema = tuple(k for k in _WRAPPER_KEYS if "ema" not in k)
        ema = tuple(k for k in _WRAPPER_KEYS if "ema" in k)
        keys = ema + non_ema if prefer_ema else non_ema + ema
        for k in keys:
            if isinstance(obj, dict) and isinstance(obj.get(k), dict):
                sd = unwrap_state_dict(obj[k])
                break
        if sd is None:
            raise UserError("checkpoint holds no state dict (expected tensors, or a dict with one of "
                            f"{list(_WRAPPER_KEYS)})")
    # DataParallel / DDP prefixes.
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k[len("module."):]: v for k, v in sd.items()}
    return sd


def read_state_dict(path: str | os.PathLike, prefer_ema: bool = False) -> dict[str, torch.Tensor]:
    """Read weights from a safetensors or torch file without unpickling arbitrary objects."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint file not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as e:  # safetensors raises its own error types
            raise UserError(f"cannot read safetensors file {path}: {e}") from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        from ..errors import unsafe_pickle

        raise unsafe_pickle(path, e) from None
    except (RuntimeError, EOFError, ValueError) as e:
        raise UserError(f"cannot read checkpoint {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") \
            from None
    return unwrap_state_dict(obj, prefer_ema=prefer_ema)


def load_into(model: nn.Module, state_dict: dict[str, torch.Tensor], strict: bool = True, what: str = "checkpoint"):
    """load_state_dict with a one-line report naming the model and the first mismatching keys/shapes."""
    arch = getattr(model, "pretrained_cfg", {}).get("architecture", type(model).__name__)
    own = model.state_dict()
    bad_shapes = [f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
                  for k, v in state_dict.items() if k in own and own[k].shape != v.shape]
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    if bad_shapes or (strict and (missing or unexpected)):
        parts = []
        if bad_shapes:
            parts.append(f"{len(bad_shapes)} shape mismatch(es), e.g. {bad_shapes[0]}")
        if missing:
            parts.append(f"{len(missing)} missing key(s), e.g. {missing[:3]}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s), e.g. {unexpected[:3]}")
        raise UserError(f"{what} does not fit model {arch!r}: " + "; ".join(parts))
    result = model.load_state_dict(state_dict, strict=strict)
    if not strict and (missing or unexpected):
        _logger.info("loaded %s into %s with %d missing and %d unexpected keys", what, arch, len(missing),
                     len(unexpected))
    return result


def load_checkpoint(model: nn.Module, path: str | os.PathLike,
                    remap: Callable[[dict, nn.Module], dict] | None = None, strict: bool = True,
                    prefer_ema: bool = False):
    """Load an official `.pth` (through `remap`) or a subquad safetensors file into `model`."""
    sd = read_state_dict(path, prefer_ema=prefer_ema)
    if remap is not None:
        sd = remap(sd, model)
    return load_into(model, sd, strict=strict, what=f"checkpoint {os.fspath(path)!r}")


# ----- one registration helper for every family -----

#: Keys every pretrained cfg must carry (`pool_size` except for token-output hosts, whose features are not a map).
REQUIRED_CFG_KEYS = ("input_size", "min_input_size", "pool_size", "crop_pct", "interpolation", "mean", "std",
                     "first_conv", "classifier", "license", "paper_ids", "origin_url")
#: Registered names whose features are token sequences (B, N, C), not a (B, C, H, W)-style map: timm's tests treat
#: them as non-standard models, as they do timm's own ViTs.
NON_STD: set[str] = set()
#: timm module names (the family files' last name component) under which `register_family` registered models.
FAMILY_MODULES: set[str] = set()

IMAGENET_CFG = dict(num_classes=1000, input_size=(3, 224, 224), crop_pct=0.875, interpolation="bicubic",
                    mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), classifier="head")


@dataclass(frozen=True)
class Variant:
    """One registered model: its constructor arguments, its card, its cfg overrides and its released weights.

    Attributes:
        name: the registered name.
        args: constructor arguments (a caller's kwargs override them).
        card: `ModelCard` fields other than `arch` (family defaults are merged in).
        cfg: pretrained-cfg overrides for every tag (input_size, crop_pct, ...).
        weights: tag -> cfg of a released checkpoint (`url`, `notes` with the claimed top-1, ...); empty when
            nothing was released (the cfg then says so).
    """

    name: str
    args: dict
    card: dict
    cfg: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)


def register_family(module: str, model_cls: type[nn.Module], variants: Sequence[Variant], cfg: dict,
                    stride: Callable[[dict], int], remap: Callable | None = None, card: dict | None = None,
                    out_indices: Callable[[dict], Sequence[int]] | None = None, non_std: bool = False) -> None:
    """Register a family's variants into timm: entry points, complete `default_cfgs` and model cards.

    Args:
        module: the family module's `__name__` (timm files the entry points and cfgs under it).
        model_cls: the host class.
        variants: the variant table.
        cfg: the family's pretrained-cfg fields (merged over `IMAGENET_CFG`).
        stride: total stride of a variant from its arguments (sets `min_input_size` and `pool_size`).
        remap: official checkpoint -> our state dict (strict), for `pretrained=True` and `checkpoint_path=`.
        card: `ModelCard` defaults of the family.
        out_indices: default `features_only` levels from the merged arguments (four stages when None).
        non_std: features are token sequences (no `pool_size`; timm's non-standard tests).
    """
    from timm.models import generate_default_cfgs, register_model

    from ._card import ModelCard, register_card

    mod = sys.modules[module]
    FAMILY_MODULES.add(module.rsplit(".", 1)[-1])
    cfgs: dict[str, dict] = {}
    for v in variants:
        merged = {**IMAGENET_CFG, **cfg, **v.cfg}
        size = tuple(merged["input_size"])
        s = stride(v.args)
        merged.setdefault("min_input_size", (size[0], *([1] * (len(size) - 3)), s, s))
        if not non_std:
            merged.setdefault("pool_size", tuple(-(-n // s) for n in size[-2:]))
        missing = [k for k in REQUIRED_CFG_KEYS if merged.get(k) is None and not (non_std and k == "pool_size")]
        if missing:
            raise ValueError(f"{v.name}: pretrained cfg lacks {missing}")
        if v.weights:
            cfgs.update({f"{v.name}.{tag}": {**merged, **w} for tag, w in v.weights.items()})
        else:
            note = merged.get("notes")
            cfgs[v.name] = {**merged, "notes": "no released weights" + (f"; {note}" if note else "")}
    mod.default_cfgs = {**getattr(mod, "default_cfgs", {}), **generate_default_cfgs(cfgs)}
    for v in variants:
        register_card(ModelCard(arch=v.name, **{**(card or {}), **v.card},
                                tags=("non-std",) if non_std else ()))
        if non_std:
            NON_STD.add(v.name)
        fn = _entry_point(model_cls, v, remap, out_indices)
        fn.__module__ = module
        setattr(mod, v.name, register_model(fn))


def _entry_point(model_cls, v: Variant, remap, out_indices) -> Callable[..., nn.Module]:
    def entry(pretrained: bool = False, **kwargs: Any) -> nn.Module:
        merged = {**v.args, **kwargs}
        default = tuple(out_indices(merged)) if out_indices else (0, 1, 2, 3)
        return build(model_cls, v.name, pretrained, remap=remap, default_out_indices=default, **merged)

    entry.__name__ = entry.__qualname__ = v.name
    entry.__doc__ = f"{v.name}: {model_cls.__name__}({', '.join(f'{k}={a!r}' for k, a in v.args.items())})."
    return entry
