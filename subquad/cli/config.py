"""Command-line parsers generated from the config dataclasses, and YAML recipe loading.

Every `TrainConfig` field becomes a `--flag` (underscores to dashes, timm's names) with its `help` metadata; booleans
become on/off switches (`--amp` / `--no-amp`). Flags are parsed with `argparse.SUPPRESS` defaults so that only the
flags a user typed override the YAML (`-c/--config FILE.yaml`) and, with `--resume DIR`, the run's own args.yaml.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import yaml

from subquad.engine.config import TrainConfig, config_fields, merge_config
from subquad.errors import UserError

__all__ = ["add_config_arguments", "load_yaml", "resolve_config", "shipped_configs", "check_run_output",
           "CONFIG_ROOT"]

CONFIG_ROOT = Path(__file__).resolve().parent.parent / "configs"


def _type_of(t: str):
    if t.startswith("int"):
        return int
    if t.startswith(("float", "list")):
        return float
    return str


def add_config_arguments(p: argparse.ArgumentParser, exclude: tuple[str, ...] = (), config_cls: type | None = None,
                         config_help: str = "YAML recipe of TrainConfig keys (see subquad/configs/)") -> None:
    """Add one flag per field of `config_cls` (TrainConfig by default; any config dataclass built with `_f`) to `p`
    (defaults suppressed, so only typed flags override a recipe; the dataclass default shows in --help)."""
    import dataclasses

    config_cls = config_cls or TrainConfig
    defaults = config_cls()
    p.add_argument("-c", "--config", default=argparse.SUPPRESS, metavar="FILE.yaml", help=config_help)
    for f in dataclasses.fields(config_cls):
        if f.name in exclude:
            continue
        flag = "--" + f.name.replace("_", "-")
        names = [f.metadata["short"], flag] if f.metadata.get("short") else [flag]
        t = str(f.type)
        default = getattr(defaults, f.name)
        help_text = f"{f.metadata['help']} (default: {default!r})"
        if t.startswith("dict"):
            p.add_argument(*names, type=str, default=argparse.SUPPRESS, metavar="JSON", help=help_text)
        elif t.startswith("bool"):
            p.add_argument(*names, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_text)
        elif t.startswith("list"):
            p.add_argument(*names, type=float, nargs="+", default=argparse.SUPPRESS, help=help_text)
        else:
            p.add_argument(*names, type=_type_of(t), default=argparse.SUPPRESS, choices=f.metadata.get("choices"),
                           help=help_text)


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a recipe YAML (a mapping of TrainConfig keys)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise UserError(f"cannot parse {path}: {str(e).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path} must hold a mapping of config keys, got {type(data).__name__}")
    return data


def resolve_config(args: argparse.Namespace) -> TrainConfig:
    """defaults < --config YAML < (--resume DIR)/args.yaml < explicit flags."""
    fields = {f.name for f in config_fields()}
    explicit = {k: v for k, v in vars(args).items() if k in fields}
    cfg = TrainConfig()
    if getattr(args, "config", None):
        cfg = merge_config(cfg, load_yaml(args.config), origin=str(args.config))
    resume = explicit.get("resume") or cfg.resume
    if resume:
        cfg = merge_config(cfg, load_run_args(resume), origin=str(Path(resume) / "args.yaml"))
    return merge_config(cfg, explicit, origin="command line")


def load_run_args(resume: str | os.PathLike, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """The args.yaml of run directory `resume` (without `resume`, `dry_run` and the `drop` keys)."""
    run_args = Path(resume) / "args.yaml"
    if not Path(resume).is_dir():
        raise UserError(f"--resume: run directory not found: {resume}")
    if not run_args.is_file():
        raise UserError(f"--resume: {resume} holds no args.yaml (not a subquad run directory)")
    saved = load_yaml(run_args)
    for key in ("resume", "dry_run", *drop):
        saved.pop(key, None)
    return saved


def shipped_configs() -> list[Path]:
    """Every recipe YAML shipped in subquad/configs/{imagenet,fmnist}."""
    return sorted(p for sub in ("imagenet", "fmnist") for p in (CONFIG_ROOT / sub).glob("*.yaml"))


def check_run_output(output: str, overwrite: bool) -> None:
    """A new run's --output: a folder that is not empty is refused unless --overwrite; one that holds a run is left
    to the trainer, which refuses it and says how to continue it."""
    from subquad.engine.checkpoint import refuse_existing_output

    out = Path(output) if output else None
    if out is not None and not any((out / f).exists() for f in ("last.safetensors", "best.safetensors",
                                                                 "last_state.pth")):
        refuse_existing_output(out, "--output", overwrite, folder=True)
