"""Command-line parsers generated from the config dataclasses; recipe files are read by `subquad.config`.

Every `TrainConfig` field becomes a `--flag` (underscores to dashes, timm's names) with its `help` metadata; booleans
become on/off switches (`--amp` / `--no-amp`). Flags are parsed with `argparse.SUPPRESS` defaults so that only the
flags a user typed override the YAML (`-c/--config FILE.yaml`) and, with `--resume DIR`, the run's own args.yaml.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from subquad.config import CONFIG_ROOT, find_config, load_run_args, load_yaml
from subquad.engine.config import TrainConfig, config_fields, merge_config

__all__ = ["add_config_arguments", "find_config", "load_yaml", "resolve_config", "shipped_configs", "check_run_output",
           "load_run_args", "CONFIG_ROOT"]

# The shipped recipe folders `-c NAME` searches for `subquad train`.
TRAIN_CONFIG_DIRS = ("imagenet", "fmnist", "kinetics400")


def _type_of(t: str):
    if t.startswith("int"):
        return int
    if t.startswith(("float", "list")):
        return float
    return str


def add_config_arguments(p: argparse.ArgumentParser, exclude: tuple[str, ...] = (), config_cls: type | None = None,
                         config_help: str = "YAML recipe of TrainConfig keys: a file, or a shipped recipe by "
                         "name (e.g. l2vit_tiny = subquad/configs/imagenet/l2vit_tiny.yaml)") -> None:
    """Add one flag per field of `config_cls` (TrainConfig by default; any config dataclass built with `_f`) to `p`
    (defaults suppressed, so only typed flags override a recipe; the dataclass default shows in --help)."""
    import dataclasses

    config_cls = config_cls or TrainConfig
    defaults = config_cls()
    p.add_argument("-c", "--config", default=argparse.SUPPRESS, metavar="FILE|NAME", help=config_help)
    for f in dataclasses.fields(config_cls):
        if f.name in exclude:
            continue
        flag = "--" + f.name.replace("_", "-")
        names = [f.metadata["short"], flag] if f.metadata.get("short") else [flag]
        t = str(f.type)
        default = getattr(defaults, f.name)
        help_text = f.metadata["help"]
        # A help text that explains its default already ("(default: the model's)") is not given a second one.
        if "(default" not in help_text:
            help_text += f" (default: {default!r})"
        help_text = help_text.replace("%", "%%")  # argparse %-formats help strings
        if t.startswith("dict"):
            p.add_argument(*names, type=str, default=argparse.SUPPRESS, metavar="JSON", help=help_text)
        elif t.startswith("bool") and f.name.startswith("no_"):
            # A negative switch (--no-aug) is only switched on: BooleanOptionalAction would add --no-no-aug.
            p.add_argument(*names, action="store_true", default=argparse.SUPPRESS, help=help_text)
        elif t.startswith("bool"):
            p.add_argument(*names, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS, help=help_text)
        elif t.startswith("list"):
            p.add_argument(*names, type=float, nargs="+", default=argparse.SUPPRESS, help=help_text)
        else:
            p.add_argument(*names, type=_type_of(t), default=argparse.SUPPRESS, choices=f.metadata.get("choices"),
                           help=help_text)
        if f.name.endswith("_limit"):
            # `subquad lra train` once spelled these --limit-train / --limit-eval: a hidden alias.
            alias = "--limit-" + f.name.removesuffix("_limit").replace("_", "-")
            p.add_argument(alias, dest=f.name, type=int, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


# What `train --resume` may change: where and how the run computes and reports, and how far it goes (--epochs above
# the run's extends it; see --resume-schedule). Any other flag that differs from the run's args.yaml is refused.
RESUME_FREE = ("device", "workers", "pin_mem", "checkpoint_every", "log_interval", "epochs", "resume_schedule",
               "dry_run", "resume")


def resolve_config(args: argparse.Namespace) -> TrainConfig:
    """defaults < --config YAML < (--resume DIR)/args.yaml < explicit flags; with --resume, a flag that would change
    the run is refused (`RESUME_FREE` lists those that may change)."""
    fields = {f.name for f in config_fields()}
    explicit = {k: v for k, v in vars(args).items() if k in fields}
    cfg = TrainConfig()
    if getattr(args, "config", None):
        path = find_config(args.config, TRAIN_CONFIG_DIRS)
        cfg = merge_config(cfg, load_yaml(path), origin=str(path))
    resume = explicit.get("resume") or cfg.resume
    if not resume:
        return merge_config(cfg, explicit, origin="command line")
    from subquad.engine.checkpoint import refuse_other_run

    refuse_other_run(resume)
    run = merge_config(cfg, load_run_args(resume), origin=str(Path(resume) / "args.yaml"))
    new = merge_config(run, explicit, origin="command line")
    _refuse_changes(resume, run, new, list(explicit))
    return new


def _refuse_changes(resume: str, run: TrainConfig, new: TrainConfig, flags: list[str]) -> None:
    """Refuse the typed `flags` whose value differs from the run's."""
    from subquad.engine.runfiles import refuse_resume_changes

    free = set(RESUME_FREE)
    if new.epochs > run.epochs and new.resume_schedule == "restart":
        free |= {"lr", "min_lr"}  # the extension's new cosine runs from --lr to --min-lr
    if new.output and Path(new.output).resolve() == Path(resume).resolve():
        free.add("output")
    changed = [f"--{k.replace('_', '-')} {getattr(new, k)!r} (the run has {getattr(run, k)!r})" for k in flags
               if k not in free and getattr(new, k) != getattr(run, k)]
    refuse_resume_changes(resume, changed, [f"--{k.replace('_', '-')}" for k in RESUME_FREE if k != "resume"],
                          verb="change")


def shipped_configs() -> list[Path]:
    """Every recipe YAML shipped in subquad/configs/{imagenet,fmnist,kinetics400}."""
    return sorted(p for sub in TRAIN_CONFIG_DIRS for p in (CONFIG_ROOT / sub).glob("*.yaml"))


def check_run_output(output: str, overwrite: bool) -> None:
    """A new run's --output: a folder that is not empty is refused unless --overwrite; one that holds a run is left
    to the trainer, which refuses it and says how to continue it."""
    from subquad.engine.checkpoint import refuse_existing_output

    out = Path(output) if output else None
    if out is not None and not any((out / f).exists() for f in ("last.safetensors", "best.safetensors",
                                                                 "last_state.pth")):
        refuse_existing_output(out, "--output", overwrite, folder=True)
