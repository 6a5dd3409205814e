"""Atomic, pickle-free checkpoint files.

Weights are safetensors with a string-dict header; every file is written to a temporary name in the same folder and
renamed over the target, so a crash mid-write leaves the previous file intact.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..files import atomic_write

if TYPE_CHECKING:  # torch is imported where it is used: `subquad models` writes its cache without it
    import torch
    from torch import nn

__all__ = ["atomic_write", "refuse_existing_output", "check_output_file", "save_weights", "write_json", "read_json",
           "sidecar_path", "save_state", "load_state", "resolve_checkpoint", "read_sidecar", "checkpoint_arch",
           "read_weights", "read_checkpoint", "is_timm_checkpoint", "is_training_state", "refuse_exported_program",
           "refuse_non_checkpoint", "load_checkpointed_model", "run_kind", "refuse_other_run"]

_logger = logging.getLogger(__name__)


def refuse_existing_output(path: str | os.PathLike, flag: str, overwrite: bool = False, folder: bool = False
                           ) -> Path:
    """The rule of every command that writes: nothing a user made is overwritten. An existing file, or an existing
    folder that is not empty, at an output path is refused in one line unless `overwrite` (the command's
    `--overwrite`); an empty folder is used as it is.

    Args:
        path: the output path. flag: the option that named it, for the message (e.g. "--out").
        overwrite: the user allowed writing over what is there.
        folder: the output is a folder: a file at `path` is refused even with `overwrite`.
    Raises:
        UserError: what is at `path` may not be written over.
    """
    from ..errors import UserError

    p = Path(path)
    if folder and p.exists() and not p.is_dir():
        raise UserError(f"{flag} {p} is a file, not a folder; choose another {flag} (nothing was written)")
    if overwrite or not p.exists():
        return p
    if p.is_dir():
        if not any(p.iterdir()):
            return p
        raise UserError(f"{flag} {p} is a folder that is not empty; pass --overwrite to write into it, or choose "
                        f"another {flag} (nothing was written)")
    raise UserError(f"{flag} {p} exists; pass --overwrite to replace it, or choose another {flag} (nothing was "
                    "written)")


def check_output_file(path: str | os.PathLike, suffixes: tuple[str, ...], protect: tuple = (),
                      what: str = "output", overwrite_if=None, overwrite: bool | None = None) -> Path:
    """Refuse an output path that would destroy something: a wrong suffix, one of the `protect`ed inputs, an existing
    file when `overwrite` is False (`refuse_existing_output`), or an existing file that `overwrite_if(path)` does not
    recognise as an earlier output of the same kind."""
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
    if overwrite is not None:
        refuse_existing_output(p, what, overwrite)
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
    import torch

    from ..errors import UserError
    from ..models._builder import torch_read

    path = Path(path)
    if not path.is_file():
        raise UserError(f"training state not found: {path}")
    obj = torch_read(path, "training state", lambda p: torch.load(p, map_location="cpu", weights_only=True))
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


# The runs of the other trainers: what the image commands (eval, predict, export, analyze, train --resume) say when
# handed one, and which commands take it instead.
_OTHER_RUNS = {
    "lm": ("an `lm train` run", "use `subquad lm eval` / `lm generate`, and `subquad lm train --resume` to continue "
           "it"),
    "lra": ("an `lra train` run", "its test accuracy is in results.json; continue it with `subquad lra train "
            "--resume`"),
    "detect": ("a `detect train` run", "use `subquad detect eval` / `detect predict`, and `subquad detect train "
               "--resume` to continue it"),
    "segment": ("a `segment train` run", "use `subquad segment eval` / `segment predict`, and `subquad segment train "
                "--resume` to continue it"),
}
_DETECTORS = ("maskrcnn", "fasterrcnn", "retinanet")


def run_kind(info: dict[str, Any]) -> str:
    """Which trainer wrote a run: 'image' (`subquad train`), 'lm', 'lra', 'detect' or 'segment', from a sidecar
    (best.json / last.json: `arch`, `task`, `kind`) or, before the first one is written, from the run's args.yaml."""
    if info.get("arch") == "char_lm" or "eval_ctx" in info:
        return "lm"
    if info.get("arch") == "lra_encoder" or "encoding" in info:
        return "lra"
    if info.get("task") in ("detect", "segment") and info.get("kind"):
        return str(info["task"])
    if "fpn_channels" in info:
        return "detect" if info.get("kind") in _DETECTORS else "segment"
    return "image"


def refuse_other_run(path: str | os.PathLike, side: dict[str, Any] | None = None) -> None:
    """Refuse, in one line naming the commands that take it, a run of another trainer (or weights with its sidecar)
    given to a command for image classifiers. `side` is the weights' sidecar; for a run folder it is read from the
    folder (its best.json or last.json, else args.yaml)."""
    from ..errors import UserError

    p = Path(path)
    if side is None:
        side = {}
        for name in ("best.json", "last.json", "args.yaml"):
            if (p / name).is_file():
                try:
                    import yaml

                    side = yaml.safe_load((p / name).read_text()) or {}
                except (OSError, yaml.YAMLError):
                    side = {}
                break
    kind = run_kind(side if isinstance(side, dict) else {})
    if kind != "image":
        what, hint = _OTHER_RUNS[kind]
        if p.is_file():
            raise UserError(f"{p} holds the weights of {what}, not of a `subquad train` run; {hint}")
        raise UserError(f"{p} is {what}, not a `subquad train` run; {hint}")


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
    wrappers `model` / `state_dict` / `model_ema` unwrapped, timm `train.py` checkpoints included); a pickle that
    needs more is refused unrun."""
    return read_checkpoint(path)[0]


def refuse_exported_program(path: str | os.PathLike) -> None:
    """Refuse an exported program given where weights are expected: an ONNX file (a protobuf, whose first byte is the
    tag of `ir_version`, 0x08; a torch file starts with a zip or pickle header) or a `torch.export` archive (.pt2),
    with one line saying how such a file is run instead."""
    import zipfile

    from ..errors import UserError

    p = Path(path)
    with open(p, "rb") as f:
        head = f.read(1)
    if p.suffix.lower() == ".onnx" or head == b"\x08":
        raise UserError(f"{p} is an ONNX model (as `subquad export --format onnx` writes), not a weights file: run it "
                        f"with ONNX Runtime (onnxruntime.InferenceSession({os.fspath(p)!r})); --checkpoint takes "
                        ".safetensors, a run directory, or a .pth / .pth.tar checkpoint")
    pt2 = p.suffix.lower() == ".pt2"
    if not pt2 and zipfile.is_zipfile(p):
        with zipfile.ZipFile(p) as z:
            pt2 = any(n.endswith("archive_format") for n in z.namelist())
    if pt2:
        raise UserError(f"{p} is a torch.export program (.pt2, as `subquad export --format pt2` writes), not a weights "
                        f"file: run it with torch.export.load({os.fspath(p)!r}).module(); --checkpoint takes "
                        ".safetensors, a run directory, or a .pth / .pth.tar checkpoint")


# The first bytes of image files (PNG, JPEG, GIF; WebP below): a torch file starts with a zip or pickle header.
_IMAGE_MAGIC = ((b"\x89PNG\r\n\x1a\n", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"))
_ACCEPTED = "--checkpoint takes .safetensors, a run directory, or a .pth / .pth.tar checkpoint"


def refuse_non_checkpoint(path: str | os.PathLike) -> None:
    """Refuse, in one line naming what it looks like, a file that is no torch or safetensors file at all (an image, a
    JSON sidecar, YAML or other text) given where weights are expected; a file that starts like a checkpoint is left
    to the reader (whose failure says truncated or corrupt)."""
    from ..errors import UserError
    from ..models._builder import _sniff

    p = Path(path)
    with open(p, "rb") as f:
        head = f.read(512)
    if not head or _sniff(head) is not None:
        return
    kind = next((k for magic, k in _IMAGE_MAGIC if head.startswith(magic)), None)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        kind = "a WebP image"
    if kind is None:
        text = head.decode("utf-8", "replace")
        if text.count("\ufffd") > 1 or not all(c.isprintable() or c in "\t\n\r\f\ufffd" for c in text):
            return
        first = text.lstrip()[:1]
        kind = ("a JSON file" if first in ("{", "[") else "an HTML / XML file" if first == "<" else
                "a YAML file" if p.suffix.lower() in (".yaml", ".yml") else "a text file")
    weights = p.with_suffix(".safetensors")
    if kind == "a JSON file" and weights.is_file():
        raise UserError(f"{p} is a JSON file (the sidecar of {weights.name}), not a checkpoint; pass {weights} or "
                        f"the run directory {p.parent}")
    raise UserError(f"{p} is {kind}, not a checkpoint; {_ACCEPTED}")


def is_training_state(obj: Any) -> bool:
    """The resumable state that the trainers write to `last_state.pth` (`engine.loop.Loop.state_dict`: optimizer,
    RNG states and the position, beside the task's counters), not weights."""
    return (isinstance(obj, dict) and "optimizer" in obj and "rng" in obj
            and any(k in obj for k in ("position", "num_updates", "step")))


def is_timm_checkpoint(obj: Any) -> bool:
    """A training checkpoint written by timm's `CheckpointSaver` (its `train.py`): a dict holding `state_dict` next
    to the saver's bookkeeping (`arch`, `args`, `epoch`, `optimizer`, `version`)."""
    return (isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict)
            and any(k in obj for k in ("arch", "args", "epoch", "optimizer", "version")))


def read_checkpoint(path: str | os.PathLike, prefer_ema: bool = False) -> tuple[dict[str, torch.Tensor],
                                                                                 dict[str, Any]]:
    """(state dict, metadata) of a weights file, read without running code.

    safetensors files are read as they are. Torch files are read with `torch.load(weights_only=True)`, allowing one
    more global, `argparse.Namespace`: timm's `CheckpointSaver` (`timm/utils/checkpoint_saver.py`) saves the
    training arguments as one under `args`, next to `state_dict`, `state_dict_ema` (with `--model-ema`), `arch`,
    `epoch`, `optimizer`, `version`, `metric` and `saver`. For such a file the metadata is {"format": "timm",
    "arch", "args" (a dict), "epoch", "metric"}, and the weights are `state_dict` (`state_dict_ema` when
    `prefer_ema`) with the `module.` / `_orig_mod.` prefixes of DDP and torch.compile removed as timm's
    `clean_state_dict` does. Any other torch file: the official wrappers are unwrapped, and the metadata is {}.

    Raises:
        UserError: a missing file, an ONNX or .pt2 program, a file that is no checkpoint at all (an image, JSON or
            other text), a trainer's resumable state (`last_state.pth`), an unreadable file, a pickle that needs any
            other global (refused unrun), or `prefer_ema` for a timm checkpoint without EMA weights.
    """
    import argparse

    from ..errors import UserError
    from ..models._builder import read_state_dict, torch_read, unwrap_state_dict

    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint file not found: {path}")
    if path.suffix == ".safetensors":
        return read_state_dict(path), {}
    refuse_exported_program(path)
    refuse_non_checkpoint(path)
    obj = torch_read(path)
    if is_training_state(obj):
        refuse_other_run(path.parent)
        raise UserError(f"{path} is the resumable training state of a run (optimizer, RNG states, counters), not its "
                        f"weights; pass the run directory {path.parent} or its best.safetensors to --checkpoint, and "
                        f"`subquad train --resume {path.parent}` continues the training")
    if not is_timm_checkpoint(obj):
        return unwrap_state_dict(obj, prefer_ema=prefer_ema), {}
    from timm.models import clean_state_dict

    if prefer_ema and not isinstance(obj.get("state_dict_ema"), dict):
        raise UserError(f"{path} is a timm training checkpoint without EMA weights (no state_dict_ema: it was trained "
                        "without --model-ema); leave out --use-ema")
    sd = clean_state_dict(obj["state_dict_ema" if prefer_ema else "state_dict"])
    args = obj.get("args")
    args = vars(args) if isinstance(args, argparse.Namespace) else dict(args) if isinstance(args, dict) else {}
    meta = {"format": "timm", "arch": obj.get("arch") or args.get("model"), "args": args, "epoch": obj.get("epoch"),
            "metric": obj.get("metric")}
    return sd, meta


def load_checkpointed_model(checkpoint: str | os.PathLike, model: str | None = None,
                            img_size: int | tuple[int, int] | None = None,
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

    from ..errors import UserError
    from ..models import create_model
    from ..models._builder import load_into
    from .modelbuild import build_model, check_img_size, model_input

    if Path(checkpoint).is_dir():
        refuse_other_run(checkpoint)
    weights = resolve_checkpoint(checkpoint)
    refuse_other_run(weights, read_sidecar(weights))
    # subquad keeps EMA weights in their own file; a timm training checkpoint holds them as state_dict_ema.
    ema_file = use_ema and weights.suffix == ".safetensors"
    if ema_file:
        weights = resolve_checkpoint(weights.with_name(weights.stem + "_ema" + weights.suffix))
    sd, meta = read_checkpoint(weights, prefer_ema=use_ema and not ema_file)
    side = read_sidecar(weights)
    hw, wide, img_size = _requested_size(img_size)
    if meta.get("format") == "timm" and not side:
        if wide:
            raise UserError(f"--img-size {hw[0]}x{hw[1]}: a checkpoint of timm's train.py is evaluated at a square "
                            "size here; pass --img-size S")
        return _load_timm_checkpoint(weights, sd, meta, model, img_size, device)
    name = checkpoint_arch(weights, side, model)
    num_classes = side.get("num_classes")
    if num_classes is None:
        probe = create_model(name, device="meta")
        head = (getattr(probe, "pretrained_cfg", {}) or {}).get("classifier", "head")
        w = sd.get(f"{head}.weight")
        num_classes = int(w.shape[0]) if w is not None else int(getattr(probe, "num_classes", 1000))
    dcfg = dict(side.get("data_config") or {})
    if wide and "video" in dcfg:
        raise UserError(f"--img-size {hw[0]}x{hw[1]}: video checkpoints are evaluated at a square size; pass "
                        "--img-size S")
    size = img_size or dcfg.get("img_size")
    if wide:
        from ..models import is_subquad_model

        size = dcfg.get("img_size") if is_subquad_model(name) else hw  # subquad models run at any size as built
    # The constructor arguments the run trained with (`--model-kwargs`, e.g. an arena host's mechanism and sizes).
    model_kwargs = (side.get("args") or {}).get("model_kwargs") or dcfg.pop("model_kwargs", None) or {}
    dcfg.pop("model_kwargs", None)
    net = build_model(name, int(num_classes), size, device=device, model_kwargs=model_kwargs)
    if not side:
        remap = getattr(sys.modules.get(type(net).__module__), "remap_official", None)
        sd = remap(sd, net) if callable(remap) else sd
    # Checkpoints written before the layout options left the mechanisms: their keys renamed (a no-op otherwise).
    from .legacy import remap_legacy

    load_into(net, remap_legacy(sd, net), what=f"checkpoint {os.fspath(weights)!r}")
    net.eval()
    in_chans, size = model_input(net, None if wide else size)
    if wide:
        size = hw
    if not dcfg:
        pc = getattr(net, "pretrained_cfg", {}) or {}
        dcfg = {"in_chans": in_chans, "mean": list(pc.get("mean", (0.485, 0.456, 0.406))),
                "std": list(pc.get("std", (0.229, 0.224, 0.225))), "interpolation": pc.get("interpolation", ""),
                "crop_pct": pc.get("crop_pct"), "aug": "timm", "source_aug": "timm", "native_size": None}
    dcfg["img_size"] = size
    check_img_size(net, name, in_chans, size, device)
    _note_other_size(hw, (side.get("data_config") or {}).get("img_size"))
    return name, net, side, dcfg, weights


def _requested_size(img_size: int | tuple[int, int] | None) -> tuple[tuple[int, int] | None, bool,
                                                                     int | tuple[int, int] | None]:
    """(H, W) asked (None: the checkpoint's own), whether it is not square, and the size as S or (H, W).

    A non-square size: the model is built as for its own size (timm models, whose position tables fix the size, at
    (H, W)), then checked and evaluated at H x W."""
    if img_size is None:
        return None, False, None
    hw = (img_size, img_size) if isinstance(img_size, int) else (int(img_size[0]), int(img_size[1]))
    wide = hw[0] != hw[1]
    return hw, wide, (hw if wide else hw[0])


def _note_other_size(hw: tuple[int, int] | None, trained: Any) -> None:
    """The one-line note when the size asked is not the size the checkpoint was trained at."""
    if hw is None or not isinstance(trained, int) or hw == (trained, trained):
        return
    h, w = hw
    _logger.warning("note: evaluating at %d x %d (--img-size %s); the checkpoint was trained at %d x %d", h, w,
                    f"{h}x{w}" if h != w else h, trained, trained)


def _load_timm_checkpoint(weights: Path, sd: dict[str, torch.Tensor], meta: dict[str, Any], model: str | None,
                          img_size: int | None, device: Any) -> tuple[str, nn.Module, dict[str, Any], dict[str, Any],
                                                                      Path]:
    """`load_checkpointed_model` for a checkpoint of timm's `train.py`: the model is built as `train.py` built it
    (`arch`, the classifier's class count, `in_chans` and `--model-kwargs` of its `args`), and the eval transform is
    the one `train.py` evaluated with, `timm.data.resolve_data_config(vars(args), model=model)` (`--img-size`
    overrides its size), which is also what timm's `validate.py` resolves when given the same data flags."""
    from timm.data import resolve_data_config

    from ..errors import UserError
    from ..models import create_model
    from ..models._builder import load_into
    from .modelbuild import build_model, check_img_size

    args, arch = meta["args"], meta["arch"]
    if model and arch and model != arch:
        raise UserError(f"--model {model} disagrees with checkpoint {weights}: timm's train.py saved it for model "
                        f"{arch!r} (its `arch`); pass --model {arch} or leave --model out")
    name = model or arch
    if not name:
        raise UserError(f"checkpoint {weights} does not name its model (no `arch`); pass --model NAME")
    probe = create_model(name, device="meta")
    head = (getattr(probe, "pretrained_cfg", {}) or {}).get("classifier", "head")
    w = sd.get(f"{head}.weight")
    num_classes = int(w.shape[0]) if w is not None else int(args.get("num_classes") or probe.num_classes)
    # timm train.py: in_chans = args.in_chans, else args.input_size[0], else 3.
    in_chans = args.get("in_chans") or (args["input_size"][0] if args.get("input_size") else 3)
    kwargs = dict(args.get("model_kwargs") or {})
    if in_chans != 3:
        kwargs["in_chans"] = int(in_chans)
    net = build_model(name, num_classes, None, device=device, model_kwargs=kwargs)
    # Checkpoints written before the layout options left the mechanisms: their keys renamed (a no-op otherwise).
    from .legacy import remap_legacy

    load_into(net, remap_legacy(sd, net), what=f"checkpoint {os.fspath(weights)!r}")
    net.eval()
    dargs = {k: args.get(k) for k in ("input_size", "img_size", "in_chans", "mean", "std", "crop_pct", "crop_mode",
                                      "interpolation")}
    if img_size:
        dargs.update(img_size=img_size, input_size=None)
    dc = resolve_data_config(dargs, model=net)
    c, h, w_ = dc["input_size"]
    if h != w_:
        raise UserError(f"checkpoint {weights} was trained at {h}x{w_}; evaluation here is square: pass --img-size N")
    dcfg = {"in_chans": int(c), "mean": [float(v) for v in dc["mean"]], "std": [float(v) for v in dc["std"]],
            "interpolation": dc["interpolation"], "crop_pct": float(dc["crop_pct"]), "aug": "timm",
            "source_aug": "timm", "native_size": None, "img_size": int(h)}
    check_img_size(net, name, int(c), int(h), device)
    folder = (args.get("dataset") or "") in ("", "folder", "imagefolder") and not args.get("class_map")
    data = f"imagefolder:{args['data_dir']}" if folder and args.get("data_dir") else None
    # timm's folder reader numbers classes in natural order (timm.utils.misc.natural_key: c2 before c10).
    side = {"arch": name, "num_classes": num_classes, "format": "timm", "epoch": meta.get("epoch"),
            "class_order": "natural" if folder else None, "args": {"data": data} if data else {}}
    return name, net, side, dcfg, weights
