"""Model construction and checkpoint loading shared by every family.

`build(cls, variant, pretrained, remap, out_indices, **kwargs)` wraps `timm.models.build_model_with_cfg` (so
`features_only=True` works through `forward_intermediates`), and `load_checkpoint` loads official `.pth` files
(`torch.load(weights_only=True)`, unwrapping `model` / `state_dict` / `model_ema`) or our safetensors, through the
family's `remap_official`, with strict semantics and a one-line report of what did not match.
`download_pretrained` fetches a release into a cache file of its own per tag (checked before it is kept).
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from timm.models import build_model_with_cfg
from torch import nn

from ..errors import UserError

__all__ = ["build", "download_pretrained", "pretrained_cache_path", "load_checkpoint", "read_state_dict",
           "unwrap_state_dict", "load_into", "Variant", "register_family", "NON_STD", "FAMILY_MODULES", "HOSTS",
           "IMAGENET_CFG"]

_logger = logging.getLogger(__name__)

_WRAPPER_KEYS = ("model_ema", "state_dict_ema", "model", "state_dict", "module", "net")


def build(model_cls: type[nn.Module], variant: str, pretrained: bool = False,
          remap: Callable[[dict, nn.Module], dict] | None = None, default_out_indices: Sequence[int] = (0, 1, 2, 3),
          **kwargs: Any) -> nn.Module:
    """Build a registered variant through timm (features via `forward_intermediates`).

    `pretrained=True` loads the weights of the tag in the name (`l2vit_base.in22k_ft_in1k`; the first released tag
    when the name has none) that timm's pretrained cfg names: `file` (e.g. `pretrained_cfg_overlay=dict(file=...)`)
    or the official release `url`, downloaded once into a cache file of its own (`download_pretrained`). Either is
    read without unpickling objects and mapped strictly through `remap`; a head of another size than the
    checkpoint's is left freshly initialised. A variant without released weights says so.
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
    sd = None
    if pretrained:
        cfg = model.pretrained_cfg
        checkpoint_path = cfg.get("file")
        if not checkpoint_path:
            checkpoint_path, sd = download_pretrained(cfg.get("url"), variant, cfg)
        backbone = model.model if features else model
        skip_head = getattr(backbone, "num_classes", cfg.get("num_classes")) != cfg.get("num_classes")
    if checkpoint_path:
        backbone = model.model if features else model
        if sd is None:
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


#: Suffixes of a release URL's file name that name its format; anything else (e.g. TsinghuaCloud's `/f/<key>/?dl=1`,
#: whose path ends in `/`) is cached as `.pth` (torch.save's format, sniffed before it is kept).
_CKPT_SUFFIXES = (".safetensors", ".pth.tar", ".pth", ".pt", ".bin", ".ckpt")
_DOWNLOAD_TIMEOUT_S = 60.0
_CHUNK = 1 << 20


def pretrained_cache_path(url: str, variant: str, tag: str | None) -> Path:
    """Where the release at `url` is cached: `<torch hub dir>/checkpoints/subquad/<variant>.<tag>-<8 hex>.<ext>`.

    The name carries the variant, the tag and a hash of the URL, so two tags (or two URLs) never share a file; the
    folder follows `torch.hub.get_dir()` (so `TORCH_HOME` moves it).
    """
    import hashlib
    from urllib.parse import urlsplit

    leaf = urlsplit(url).path.rsplit("/", 1)[-1].lower()
    ext = next((s for s in _CKPT_SUFFIXES if leaf.endswith(s)), ".pth")
    digest = hashlib.sha256(url.encode()).hexdigest()[:8]
    name = f"{variant}.{tag}-{digest}{ext}" if tag else f"{variant}-{digest}{ext}"
    return Path(torch.hub.get_dir()) / "checkpoints" / "subquad" / name


def _by_hand() -> str:
    return ("download the file by hand and load it with pretrained_cfg_overlay=dict(file=PATH) (Python) or "
            "--checkpoint PATH (CLI)")


def _size(n: int | None) -> str:
    return "unknown size" if n is None else f"{n / 1e6:.1f} MB"


def _sniff(head: bytes) -> str | None:
    """The checkpoint format that a file's first bytes announce: 'torch' (zip or legacy pickle), 'safetensors'
    (8-byte little-endian header length, then JSON), or None (e.g. an HTML page instead of the file)."""
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":
        return "torch"
    if len(head) > 8 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") < (1 << 32):
        return "safetensors"
    return None


def download_pretrained(url: str | None, variant: str, cfg: dict) -> tuple[Path, dict[str, torch.Tensor]]:
    """The released checkpoint of one tag: its cache file and its state dict (read once).

    A cached file (`pretrained_cache_path`) is used without touching the network. Otherwise the file is downloaded
    into a temporary file in the cache folder, checked (complete, a torch or safetensors checkpoint that
    `torch.load(weights_only=True)` / safetensors reads) and only then renamed to its cache name. One log line
    (INFO) says what happens: URL, size and cache path. Offline, an HTTP error or a file that is not a checkpoint
    raise a one-line `UserError` naming the URL and how to load a file downloaded by hand; nothing is kept.
    """
    if not url:
        notes = [n for n in (cfg.get("notes") or "").split("; ") if n and n != "no released weights"]
        why = f" ({'; '.join(notes)})" if notes else ""
        raise UserError(f"{variant}: no released weights exist{why}; pass checkpoint_path=... or "
                        "pretrained_cfg_overlay=dict(file=...)")
    if not isinstance(url, str):  # timm allows (url, filename) pairs; no subquad cfg uses them
        raise UserError(f"{variant}: unsupported pretrained url {url!r} (expected one https URL)")
    tag = cfg.get("tag")
    what = f"{variant}.{tag}" if tag else variant
    path = pretrained_cache_path(url, variant, tag)
    if path.is_file():
        _logger.info("%s: loading cached %s (%s) from %s", what, url, _size(path.stat().st_size), path)
        try:
            return path, read_state_dict(path)
        except UserError as e:  # kept only after a check, so someone else wrote or damaged it
            raise UserError(f"{e}; delete that cached file to download {url} again") from None
    import http.client
    import urllib.error
    import urllib.request

    from ..files import atomic_write

    def fail(reason: str) -> UserError:
        return UserError(f"cannot download the {what} weights from {url}: {reason}; nothing was cached; "
                         + _by_hand())

    sd: dict[str, torch.Tensor] = {}

    def write(tmp: str) -> None:
        try:
            response = urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "subquad"}),
                                              timeout=_DOWNLOAD_TIMEOUT_S)
        except urllib.error.HTTPError as e:
            raise fail(f"HTTP {e.code} {e.reason}") from None
        except urllib.error.URLError as e:
            raise fail(f"{e.reason} (offline?)") from None
        except (OSError, ValueError, http.client.HTTPException) as e:  # timeouts, a malformed URL or reply
            raise fail(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
        with response:
            length = response.headers.get("Content-Length")
            expected = int(length) if length and length.isdigit() else None
            _logger.info("%s: downloading %s (%s) to %s", what, url, _size(expected), path)
            got, head = 0, b""
            with open(tmp, "wb") as f:
                while True:
                    try:
                        chunk = response.read(_CHUNK)
                    except (OSError, http.client.HTTPException) as e:  # a dropped connection mid-file
                        raise fail(f"the transfer broke off after {got} bytes ({type(e).__name__})") from None
                    if not chunk:
                        break
                    if len(head) < 16:
                        head += chunk[: 16 - len(head)]
                    f.write(chunk)
                    got += len(chunk)
        if expected is not None and got != expected:
            raise fail(f"the transfer is incomplete ({got} of {expected} bytes)")
        fmt = _sniff(head)
        if fmt is None:
            kind = "an HTML page" if head.lstrip()[:1] == b"<" else f"a file starting with {head[:8]!r}"
            raise fail(f"the server sent {kind}, not a checkpoint")
        if (fmt == "safetensors") != (path.suffix == ".safetensors"):
            raise fail(f"the file is {fmt} but its URL names a {path.suffix} file")
        try:
            sd.update(read_state_dict(tmp, fmt=fmt))
        except UserError as e:
            raise fail(f"the file is not a readable checkpoint ({str(e).replace(tmp, 'download')})") from None

    atomic_write(path, write)
    return path, sd


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


class _YacsCfgNode:
    """What a pickled yacs `CfgNode` (a dict subclass) becomes when read: an OrderedDict of its items, its attributes
    set on that dict, no yacs code imported or run. The Swin-based training scripts of the official FLatten code
    (LeapLabTHU/FLatten-Transformer, `utils.py` `save_checkpoint`) store their config as one under `config`."""

    def __new__(cls, *args: Any) -> OrderedDict:
        return OrderedDict()


def torch_load_weights(path: str | os.PathLike) -> Any:
    """`torch.load(weights_only=True)` that also reads the two non-tensor objects that official and timm training
    scripts save beside the weights: `argparse.Namespace` (L2ViT's `utils.save_model` and timm's `CheckpointSaver`
    store the training arguments as one under `args`) and yacs' `CfgNode` (read as an OrderedDict). Any other
    global is refused by torch's weights-only unpickler, unrun (`pickle.UnpicklingError`)."""
    import argparse
    import contextlib

    allow = getattr(torch.serialization, "safe_globals", None)  # torch >= 2.5
    ctx = allow([argparse.Namespace, (_YacsCfgNode, "yacs.config.CfgNode")]) if allow else contextlib.nullcontext()
    with ctx:
        return torch.load(path, map_location="cpu", weights_only=True)


def unreadable(path: str | os.PathLike, what: str, error: BaseException) -> UserError:
    """The one-line error of a file that is not a readable `what` (a checkpoint, a training state): it names the file
    and the first sentence of what the reader said."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    text = text.split(". ")[0].rstrip(".")
    return UserError(f"{os.fspath(path)} is not a readable {what} (truncated or corrupt: {text})")


def torch_read(path: str | os.PathLike, what: str = "checkpoint",
               load: Callable[[Path], Any] | None = None) -> Any:
    """`load(path)` (default `torch_load_weights`) with its failures as one line naming the file: a torch file whose
    pickle needs more than tensors and plain containers is refused unrun (`errors.unsafe_pickle`); any other failure
    (a 4-byte file, a truncated zip, random bytes) is a file that is not a readable `what`. torch's warnings about the
    file (e.g. its pickle protocol) are not shown: the refusal says what matters."""
    import warnings

    from ..errors import unsafe_pickle

    path = Path(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return (load or torch_load_weights)(path)
    except pickle.UnpicklingError as e:
        with open(path, "rb") as f:
            head = f.read(16)
        if _sniff(head) == "torch":
            raise unsafe_pickle(path, e) from None
        raise unreadable(path, what, e) from None
    except Exception as e:  # noqa: BLE001 - what torch raises depends on the bytes (struct.error, EOFError, OSError...)
        raise unreadable(path, what, e) from None


def read_state_dict(path: str | os.PathLike, prefer_ema: bool = False,
                    fmt: str | None = None) -> dict[str, torch.Tensor]:
    """Read weights from a safetensors or torch file without unpickling arbitrary objects.

    `fmt` ('safetensors' or 'torch') overrides the format that the suffix names.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint file not found: {path}")
    if (fmt or ("safetensors" if path.suffix == ".safetensors" else "torch")) == "safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
            raise unreadable(path, "safetensors checkpoint", e) from None
    return unwrap_state_dict(torch_read(path), prefer_ema=prefer_ema)


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
#: Registered name -> its host class (`register_family`).
HOSTS: dict[str, type[nn.Module]] = {}

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
        # A `*_micro` variant is a size of ours for tests and demos, whatever its family's status.
        size = {"status": "test-size"} if "_micro" in v.name else {}
        register_card(ModelCard(arch=v.name, **{**(card or {}), **v.card, **size},
                                tags=("non-std",) if non_std else ()))
        if non_std:
            NON_STD.add(v.name)
        HOSTS[v.name] = model_cls
        fn = _entry_point(model_cls, v, remap, out_indices)
        fn.__module__ = module
        setattr(mod, v.name, register_model(fn))


def _entry_point(model_cls, v: Variant, remap, out_indices) -> Callable[..., nn.Module]:
    def entry(pretrained: bool = False, **kwargs: Any) -> nn.Module:
        args = v.args
        if any(k in kwargs for k in getattr(model_cls, "deprecated_attn", ())):
            args = {k: a for k, a in args.items() if k != "attn"}  # the caller's old spelling replaces it
        merged = {**args, **kwargs}
        default = tuple(out_indices(merged)) if out_indices else (0, 1, 2, 3)
        return build(model_cls, v.name, pretrained, remap=remap, default_out_indices=default, **merged)

    entry.__name__ = entry.__qualname__ = v.name
    entry.__doc__ = f"{v.name}: {model_cls.__name__}({', '.join(f'{k}={a!r}' for k, a in v.args.items())})."
    return entry
