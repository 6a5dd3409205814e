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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from timm.models import build_model_with_cfg
from torch import nn

from ..errors import UserError

__all__ = ["build", "load_checkpoint", "read_state_dict", "unwrap_state_dict", "load_into"]

_logger = logging.getLogger(__name__)

_WRAPPER_KEYS = ("model_ema", "state_dict_ema", "model", "state_dict", "module")


def build(model_cls: type[nn.Module], variant: str, pretrained: bool = False,
          remap: Callable[[dict, nn.Module], dict] | None = None, default_out_indices: Sequence[int] = (0, 1, 2, 3),
          **kwargs: Any) -> nn.Module:
    """Build a registered variant through timm (features via `forward_intermediates`)."""
    checkpoint_path = kwargs.pop("subquad_checkpoint", None)
    # A caller's out_indices (features_only=True) overrides the family default.
    out_indices = kwargs.pop("out_indices", default_out_indices)
    features = bool(kwargs.get("features_only", False))
    model = build_model_with_cfg(
        model_cls, variant, pretrained, pretrained_filter_fn=remap,
        feature_cfg=dict(feature_cls="getter",
                         out_indices=out_indices if isinstance(out_indices, int) else tuple(out_indices)), **kwargs)
    if checkpoint_path:
        if features:
            # A feature extractor wraps the backbone (`.model`) and has pruned its head: load the keys it kept
            # (every one must be in the checkpoint, with its shape).
            backbone = model.model
            sd = read_state_dict(checkpoint_path)
            sd = remap(sd, backbone) if remap is not None else sd
            own = backbone.state_dict()
            load_into(backbone, {k: v for k, v in sd.items() if k in own}, strict=True,
                      what=f"checkpoint {os.fspath(checkpoint_path)!r}")
        else:
            load_checkpoint(model, checkpoint_path, remap=remap)
    return model


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
        first = str(e).strip().splitlines()[0] if str(e).strip() else "unsupported content"
        raise UserError(f"refusing to load {path}: it holds objects other than tensors and plain containers "
                        f"(weights_only=True refused it: {first})") from None
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
