"""Recipe files: find a YAML recipe by path or shipped name, read it, and read a run's args.yaml.

The library (`subquad.dense`, `subquad.arena`) and the command (`subquad_cli.config`) read recipes through these
functions. Bad input (a missing or unparsable file, an ambiguous name) is a `UserError`. No torch is imported.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import yaml

from .errors import UserError

__all__ = ["LIBRARY_ROOT", "CONFIG_ROOT", "find_config", "load_yaml", "load_run_args", "parse_yaml"]

#: The library's folder, found without importing `subquad` (which loads torch).
LIBRARY_ROOT = Path(importlib.util.find_spec("subquad").submodule_search_locations[0]).resolve()
#: The shipped recipes (the library's package data): subquad/configs/<dir>/<name>.yaml.
CONFIG_ROOT = LIBRARY_ROOT / "configs"


def find_config(text: str | os.PathLike, subdirs: tuple[str, ...]) -> Path:
    """The recipe file `-c/--config TEXT` names, from any working directory.

    TEXT is, in this order: an existing file; a path ending in `subquad/configs/<dir>/<name>.yaml` (the package's
    own copy is used when the working directory is not the repository root); `<dir>/<name>[.yaml]` under the shipped
    configs; or the `<name>[.yaml]` of a shipped recipe in one of this command's `subdirs` (e.g. `l2vit_tiny` is
    `subquad/configs/imagenet/l2vit_tiny.yaml` for `subquad train`).

    Raises:
        UserError: nothing matches (the message lists this command's shipped recipes) or a name matches several.
    """
    p = Path(text)
    if p.is_file():
        return p
    parts = p.as_posix().split("/")
    if "configs" in parts and parts.index("configs") > 0 and parts[parts.index("configs") - 1] == "subquad":
        cand = CONFIG_ROOT.joinpath(*parts[parts.index("configs") + 1:])
        if cand.is_file():
            return cand
    name = p.as_posix().removesuffix(".yaml").removesuffix(".yml")
    if "/" in name and (CONFIG_ROOT / f"{name}.yaml").is_file():
        return CONFIG_ROOT / f"{name}.yaml"
    found = [CONFIG_ROOT / d / f"{name}.yaml" for d in subdirs if (CONFIG_ROOT / d / f"{name}.yaml").is_file()]
    if len(found) == 1:
        return found[0]
    shipped = sorted(f"{d}/{q.stem}" for d in subdirs for q in (CONFIG_ROOT / d).glob("*.yaml"))
    if found:
        raise UserError(f"config {text!r} is ambiguous: {', '.join(f'{q.parent.name}/{q.stem}' for q in found)}")
    from .errors import closest

    stems = {s.split("/")[-1]: s for s in shipped}
    near = closest(name.split("/")[-1], stems) if shipped else []
    hint = f"; did you mean {', '.join(stems[n] for n in near)}?" if near else ""
    raise UserError(f"config file not found: {text}{hint} (a YAML file, or a shipped recipe by name: "
                    f"{', '.join(shipped) or 'none'})")


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader that also reads a number in exponent notation without a dot (`1e-3`, `5E+4`) as a float,
    as YAML 1.2 does; PyYAML (YAML 1.1) reads it as a string."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
                              list("-+0123456789"))


def parse_yaml(text: str, where: str = "YAML") -> Any:
    """`text` read by the recipes' YAML loader (`1e-3` is a float); a parse error is a UserError naming `where` and
    the line and column."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"cannot parse {where}{at}: {what}") from None


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a recipe YAML (a mapping of TrainConfig keys)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"config file not found: {path}")
    data = parse_yaml(path.read_text(), str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path} must hold a mapping of config keys, got {type(data).__name__}")
    return data


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
