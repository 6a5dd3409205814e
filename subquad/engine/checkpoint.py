"""Atomic, pickle-free checkpoint files.

Weights are safetensors with a string-dict header; every file is written to a temporary name in the same folder and
renamed over the target, so a crash mid-write leaves the previous file intact.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where it is used: `subquad models` writes its cache without it
    import torch
    from torch import nn

__all__ = ["atomic_write", "save_weights", "write_json", "read_json", "sidecar_path", "save_state", "load_state",
           "resolve_checkpoint", "read_sidecar", "checkpoint_arch", "read_weights", "load_checkpointed_model"]


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call `write(tmp_path)` then rename tmp_path over `path` (same folder, fsync'd)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        # mkstemp creates 0600 files: give the result the usual permissions (0666 minus the umask).
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def check_output_file(path: str | os.PathLike, suffixes: tuple[str, ...], protect: tuple = (),
                      what: str = "output", overwrite_if=None) -> Path:
    """Refuse an output path that would destroy something: a wrong suffix, one of the `protect`ed inputs, or an
    existing file that `overwrite_if(path)` does not recognise as an earlier output of the same kind."""
    from ..errors import UserError

    p = Path(path)
    if p.suffix.lower() not in suffixes:
        raise UserError(f"{what} {p} must end in {' or '.join(suffixes)}")
    resolved = p.resolve()
    for q in protect:
        if q is not None and Path(q).resolve() == resolved:
            raise UserError(f"{what} {p} is one of the inputs; choose another path (nothing was written)")
    if p.exists() and (p.is_dir() or (overwrite_if is not None and not overwrite_if(p))):
        raise UserError(f"{what} {p} exists and is not an earlier {what}; choose another path (nothing was written)")
    return p


def save_weights(model: nn.Module | dict[str, torch.Tensor], path: str | os.PathLike,
                 metadata: dict[str, str] | None = None) -> Path:
    """Write a model's state dict as safetensors (shared tensors are cloned), atomically."""
    from safetensors.torch import save_file

    sd = model.state_dict() if hasattr(model, "state_dict") else model
    sd = {k: v.detach().cpu().contiguous().clone() for k, v in sd.items()}
    meta = {k: str(v) for k, v in (metadata or {}).items()}
    return atomic_write(path, lambda tmp: save_file(sd, tmp, metadata=meta))


def write_json(obj: Any, path: str | os.PathLike) -> Path:
    def _w(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, default=str)
            f.write("\n")

    return atomic_write(path, _w)


def read_json(path: str | os.PathLike) -> Any:
    with open(path) as f:
        return json.load(f)


def sidecar_path(weights: str | os.PathLike) -> Path:
    """`best.safetensors` -> `best.json`."""
    p = Path(weights)
    return p.with_suffix(".json")


def save_state(state: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write training state (tensors and plain containers only) with torch.save, atomically."""
    import torch

    return atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_state(path: str | os.PathLike) -> dict[str, Any]:
    """Read a training-state file with `torch.load(weights_only=True)`: nothing but tensors and plain containers.

    Raises:
        UserError: the file is missing, or holds anything else (a pickle that would run code is refused unrun).
    """
    import pickle

    import torch

    from ..errors import UserError, unsafe_pickle

    path = Path(path)
    if not path.is_file():
        raise UserError(f"training state not found: {path}")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise unsafe_pickle(path, e) from None
    except (RuntimeError, EOFError, ValueError) as e:
        raise UserError(f"cannot read training state {path}: {str(e).splitlines()[0] if str(e) else e!r}") from None
    if not isinstance(obj, dict):
        raise UserError(f"training state {path} is not a dict")
    return obj


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """`--checkpoint`: a weights file, or a run directory of `subquad train` (its best.safetensors).

    Raises:
        UserError: nothing there, or a folder without best.safetensors.
    """
    from ..errors import UserError

    p = Path(path)
    if p.is_dir():
        if (p / "best.safetensors").is_file():
            return p / "best.safetensors"
        raise UserError(f"--checkpoint {p} is a folder without best.safetensors; give a weights file or a run "
                        "directory of `subquad train`")
    if not p.is_file():
        raise UserError(f"checkpoint file not found: {p}")
    return p


def read_sidecar(weights: str | os.PathLike) -> dict[str, Any]:
    """The JSON sidecar of a weights file (`best.json`; `<name>_ema` files share their model's), {} when none."""
    from ..errors import UserError

    weights = Path(weights)
    for cand in (sidecar_path(weights), weights.with_name(weights.stem.removesuffix("_ema") + ".json")):
        if cand.is_file():
            try:
                data = read_json(cand)
            except (OSError, json.JSONDecodeError) as e:
                raise UserError(f"cannot read the sidecar {cand}: {e}") from None
            return data if isinstance(data, dict) else {}
    return {}


def checkpoint_arch(weights: str | os.PathLike, sidecar: dict[str, Any], model: str | None = None) -> str:
    """The model a checkpoint holds: its sidecar's `arch`, reconciled with an optional `--model`.

    Raises:
        UserError: `model` disagrees with the sidecar (both are named), or neither names a model.
    """
    from ..errors import UserError

    arch = sidecar.get("arch")
    if model and arch and model != arch:
        raise UserError(f"--model {model} disagrees with checkpoint {weights}: it holds model {arch!r} (its "
                        f"sidecar {sidecar_path(weights).name} says so); pass --model {arch} or leave --model out")
    if not (model or arch):
        raise UserError(f"checkpoint {weights} has no sidecar naming its model ({sidecar_path(weights).name}); "
                        "pass --model NAME")
    return model or arch


def read_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """A state dict from safetensors, or from a torch file read with `torch.load(weights_only=True)` (official
    wrappers `model` / `state_dict` / `model_ema` unwrapped); a pickle that needs more is refused unrun."""
    from ..models._builder import read_state_dict

    return read_state_dict(Path(path))


def load_checkpointed_model(checkpoint: str | os.PathLike, model: str | None = None, img_size: int | None = None,
                            device: Any = "cpu", use_ema: bool = False
                            ) -> tuple[str, nn.Module, dict[str, Any], dict[str, Any], Path]:
    """Everything `eval`, `predict`, `analyze` and `export` need from `--checkpoint` (and an optional `--model`).

    The checkpoint is a weights file or a run directory (its best.safetensors; `use_ema`: best_ema.safetensors).
    Its JSON sidecar (written by `subquad train`) supplies the model name, class count, class names and the eval
    transform; without one (official weights) `model` is required, the class count is read from the classifier's
    weights and the family's `remap_official` maps the keys.

    Returns:
        (model name, model in eval mode on `device`, sidecar dict ({} when none), data config of the eval transform
        (`subquad.engine.classify.eval_transform`), weights path).
    Raises:
        UserError: a missing file, a disagreeing `--model`, weights of another model, an unsafe pickle.
    """
    import sys

    from ..models import create_model
    from ..models._builder import load_into
    from .classify import build_model, check_img_size, model_input

    weights = resolve_checkpoint(checkpoint)
    if use_ema:
        weights = resolve_checkpoint(weights.with_name(weights.stem + "_ema" + weights.suffix))
    sd = read_weights(weights)
    side = read_sidecar(weights)
    name = checkpoint_arch(weights, side, model)
    num_classes = side.get("num_classes")
    if num_classes is None:
        probe = create_model(name, device="meta")
        head = (getattr(probe, "pretrained_cfg", {}) or {}).get("classifier", "head")
        w = sd.get(f"{head}.weight")
        num_classes = int(w.shape[0]) if w is not None else int(getattr(probe, "num_classes", 1000))
    dcfg = dict(side.get("data_config") or {})
    size = img_size or dcfg.get("img_size")
    # The constructor arguments the run trained with (`--model-kwargs`, e.g. an arena host's mechanism and sizes).
    model_kwargs = (side.get("args") or {}).get("model_kwargs") or dcfg.pop("model_kwargs", None) or {}
    dcfg.pop("model_kwargs", None)
    net = build_model(name, int(num_classes), size, device=device, model_kwargs=model_kwargs)
    if not side:
        remap = getattr(sys.modules.get(type(net).__module__), "remap_official", None)
        sd = remap(sd, net) if callable(remap) else sd
    load_into(net, sd, what=f"checkpoint {os.fspath(weights)!r}")
    net.eval()
    in_chans, size = model_input(net, size)
    if not dcfg:
        pc = getattr(net, "pretrained_cfg", {}) or {}
        dcfg = {"in_chans": in_chans, "mean": list(pc.get("mean", (0.485, 0.456, 0.406))),
                "std": list(pc.get("std", (0.229, 0.224, 0.225))), "interpolation": pc.get("interpolation", ""),
                "crop_pct": pc.get("crop_pct"), "aug": "timm", "source_aug": "timm", "native_size": None}
    dcfg["img_size"] = size
    check_img_size(net, name, in_chans, size, device)
    return name, net, side, dcfg, weights
