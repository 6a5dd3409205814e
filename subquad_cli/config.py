"""Command-line flags, recipe layers and the `--resume` rule of every training command, generated from its config
dataclass (`TrainConfig`, `LRAConfig`, `LMConfig`, `DenseConfig`); recipe files are read by `subquad_cli.recipes`.

Every field becomes a `--flag` (underscores to dashes, or the field's `flag` metadata) with its `help` metadata;
booleans become on/off switches (`--amp` / `--no-amp`); fields marked `cli=False` are set by recipes only. Flags are
parsed with `argparse.SUPPRESS` defaults so that only the flags a user typed override the recipe YAML (`-c/--config`)
and, with `--resume DIR`, the run's own args.yaml; a typed setting that differs from the run's is refused
(`resume_run`, `subquad_cli.runconfig.resume_changes`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from subquad_cli.recipes import CONFIG_ROOT, find_config, load_run_args, load_yaml
from subquad_cli.runconfig import TrainConfig, apply_layers, flag_name, resume_run

__all__ = ["add_config_arguments", "find_config", "load_yaml", "resolve_config", "shipped_configs", "check_run_output",
           "write_result_keeping",
           "load_run_args", "CONFIG_ROOT", "typed_fields", "apply_layers", "resume_run", "add_sequence_arguments",
           "attn_options", "recipe_layers"]

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
                         "name (e.g. l2vit_tiny = subquad/configs/imagenet/l2vit_tiny.yaml)",
                         default_note: str = "{default!r}") -> None:
    """Add `-c/--config` and one flag per field of `config_cls` (TrainConfig by default; any config dataclass built
    with `_f`) to `p` (defaults suppressed, so only typed flags override a recipe; `default_note` formats the
    default that --help shows)."""
    import dataclasses

    config_cls = config_cls or TrainConfig
    defaults = config_cls()
    p.add_argument("-c", "--config", default=argparse.SUPPRESS, metavar="FILE|NAME", help=config_help)
    for f in dataclasses.fields(config_cls):
        if f.name in exclude or not f.metadata.get("cli", True):
            continue
        flag = flag_name(f)
        names = [f.metadata["short"], flag] if f.metadata.get("short") else [flag]
        help_text = f.metadata["help"]
        # A help text that explains its default already ("(default: the model's)") is not given a second one.
        if "(default" not in help_text:
            help_text += f" (default: {default_note.format(default=getattr(defaults, f.name))})"
        _add_flag(p, names, str(f.type), f.name, help_text.replace("%", "%%"),  # argparse %-formats help strings
                  f.metadata.get("choices"))
        # Hidden aliases: a field spelled otherwise on the command line keeps its own spelling; `subquad lra train`
        # once spelled --train-limit / --eval-limit as --limit-train / --limit-eval.
        aliases = ["--" + f.name.replace("_", "-")] if flag != "--" + f.name.replace("_", "-") else []
        if f.name.endswith("_limit"):
            aliases.append("--limit-" + f.name.removesuffix("_limit").replace("_", "-"))
        for alias in aliases:
            _add_flag(p, [alias], str(f.type), f.name, argparse.SUPPRESS, f.metadata.get("choices"))


def _add_flag(p: argparse.ArgumentParser, names: list[str], t: str, dest: str, help_text: str, choices) -> None:
    kw = {"dest": dest, "default": argparse.SUPPRESS, "help": help_text}
    if t.startswith("dict"):
        p.add_argument(*names, type=str, metavar="JSON", **kw)
    elif t.startswith("bool") and dest.startswith("no_"):
        # A negative switch (--no-aug) is only switched on: BooleanOptionalAction would add --no-no-aug.
        p.add_argument(*names, action="store_true", **kw)
    elif t.startswith("bool"):
        p.add_argument(*names, action=argparse.BooleanOptionalAction, **kw)
    elif t.startswith("list"):
        p.add_argument(*names, type=int if t.startswith("list[int") else float, nargs="+", **kw)
    else:
        p.add_argument(*names, type=_type_of(t), choices=choices, **kw)


def add_sequence_arguments(p: argparse.ArgumentParser, config_cls: type, config_help: str) -> None:
    """The flags of `subquad lra train` / `lm train`: one per field of `config_cls` (LRAConfig, LMConfig), `-c`,
    `--resume DIR`, `--attn-opt KEY=VALUE` and `--overwrite`."""
    add_config_arguments(p, config_cls=config_cls, config_help=config_help,
                         default_note="the recipe's, else {default!r}")
    p.add_argument("--resume", default=None, metavar="DIR",
                   help="continue the run in DIR from its last state (an evaluation, --checkpoint-every or a SIGTERM) "
                   "with the settings of DIR/args.yaml; a flag that would change them is refused (--device, "
                   "--checkpoint-every and the like may be given); ends bit-identical to an uninterrupted run")
    p.add_argument("--attn-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="mechanism option (YAML value) added to the recipe's attn_kw of --attention, e.g. --attn-opt "
                   "window_size=16 --attn-opt rank=2")
    p.add_argument("--overwrite", action="store_true",
                   help="train into --output even if it is a folder that is not empty (a run there is still refused)")


def attn_options(cfg, opts: list[str], shortcuts: dict | None = None, always: bool = True) -> dict:
    """{"attn_kw": ...}: `cfg.attn_kw` with the `--attn-opt KEY=VALUE` options (and `shortcuts`, e.g. --window-size)
    added to the entry of `cfg.attention` ({} when none is given and not `always`)."""
    from subquad_cli.errors import UserError
    from subquad_cli.recipes import parse_yaml

    if not (opts or shortcuts or always):
        return {}
    entry = dict(cfg.attn_kw.get(cfg.attention, {}))
    for o in opts:
        if "=" not in o:
            raise UserError(f"--attn-opt expects KEY=VALUE, got {o!r}")
        k, v = o.split("=", 1)
        entry[k.strip()] = parse_yaml(v, f"--attn-opt {o}")
    entry.update(shortcuts or {})
    return {"attn_kw": {**cfg.attn_kw, cfg.attention: entry}}


def recipe_layers(args: argparse.Namespace, subdirs: tuple[str, ...]) -> list[tuple[str, dict]]:
    """[(path, values)] of the `-c/--config` recipe when one is given."""
    if not getattr(args, "config", None):
        return []
    path = find_config(args.config, subdirs)
    return [(str(path), load_yaml(path))]


def typed_fields(args: argparse.Namespace, config_cls: type) -> dict:
    """The fields of `config_cls` whose flags were typed (the parser suppresses the others; recipe-only fields have
    none)."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(config_cls) if f.metadata.get("cli", True)}
    return {k: v for k, v in vars(args).items() if k in names and v is not None}


def resolve_config(args: argparse.Namespace) -> TrainConfig:
    """defaults < --config YAML < explicit flags; with --resume DIR: DIR/args.yaml < --config YAML < flags, and a
    setting that would change the run is refused (`resume_run`; an extension may change --epochs and
    --resume-schedule, and a restarted cosine --lr and --min-lr)."""
    explicit = typed_fields(args, TrainConfig)
    precision = getattr(args, "precision", None)
    if precision is not None:  # `subquad train --precision`: the words eval and predict use, for amp / amp_dtype
        from subquad_cli.errors import UserError

        wanted = {"fp32": {"amp": False}, "bf16": {"amp": True, "amp_dtype": "bfloat16"},
                  "fp16": {"amp": True, "amp_dtype": "float16"}}[precision]
        clash = {k: explicit[k] for k in wanted if k in explicit and explicit[k] != wanted[k]}
        if clash:
            raise UserError(f"--precision {precision} contradicts "
                            + ", ".join((f"--{'' if v else 'no-'}amp" if k == "amp" else f"--amp-dtype {v}")
                                        for k, v in clash.items())
                            + "; give one of them")
        explicit.update(wanted)
    layers = [*recipe_layers(args, TRAIN_CONFIG_DIRS), ("command line", explicit)]
    cfg = apply_layers(TrainConfig(), layers)
    if not cfg.resume:
        if not any("model" in values for _, values in layers):  # a recipe of hyperparameters only
            from subquad_cli.errors import UserError

            raise UserError("no model given: the recipe sets none and --model is missing (pass --model NAME or add "
                            "'model: NAME' to the recipe; `subquad models` lists the names)")
        return cfg
    from subquad.engine.checkpoint import refuse_other_run

    refuse_other_run(cfg.resume)
    return resume_run(TrainConfig, cfg.resume, layers, extend=("epochs", "resume_schedule"), exempt=_train_exempt)


def _train_exempt(run: TrainConfig, new: TrainConfig) -> set[str]:
    """`subquad train --resume`: the extension's new cosine runs from --lr to --min-lr; --output may name the run."""
    free = {"lr", "min_lr"} if new.epochs > run.epochs and new.resume_schedule == "restart" else set()
    if new.output and Path(new.output).resolve() == Path(new.resume).resolve():
        free.add("output")
    return free


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


def add_inference_arguments(p: argparse.ArgumentParser) -> None:
    """`--device` and `--precision`, as `subquad eval` and `subquad predict` take them."""
    p.add_argument("--device", default="", help="cpu, cuda, ... (default: cuda when available)")
    p.add_argument("--precision", default="fp32", metavar="fp32|bf16|int8",
                   help="fp32; bf16 (autocast; the linear-attention and FFT cores stay fp32); or int8 (CPU only: every "
                   "nn.Linear as a dynamic int8 GEMM, the rest fp32). On a CPU without native bf16 arithmetic or "
                   "int8 dot products, that precision falls back to fp32 with a warning (default: fp32)")


def write_result_keeping(base: Path, row: dict, overwrite: bool, volatile: tuple[str, ...] = ()) -> tuple[Path, str]:
    """Write a result without losing an earlier one: to `base` when it is new (or `overwrite`); not at all when a file
    there (or at a numbered name) holds the same result, fields in `volatile` aside; else to the first free
    `<stem>-N<suffix>` (N = 2, 3, ...), keeping the earlier, different result as it is. Returns the path and a note
    saying which."""
    from subquad.engine.checkpoint import read_json, write_json

    if overwrite or not base.exists():
        write_json(row, base)
        return base, ""

    def same(p: Path) -> bool:
        try:
            old = read_json(p)
        except (OSError, ValueError):
            return False
        return isinstance(old, dict) and {k: v for k, v in old.items() if k not in volatile} == \
            {k: v for k, v in row.items() if k not in volatile}

    k, path = 1, base
    while path.exists():
        if path.is_file() and same(path):
            return path, " (unchanged: it holds this result already)"
        k += 1
        path = base.with_name(f"{base.stem}-{k}{base.suffix}")
    write_json(row, path)
    return path, f" (a new file: {base.name} holds an earlier, different result, kept as it is)"
