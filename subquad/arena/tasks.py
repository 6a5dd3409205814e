"""Arena tasks: the YAML files under `subquad/configs/arena/`, read and checked.

A task file holds, fixed before any run:

    task: fmnist                 # the name `--task` takes (the file is <task>.yaml)
    kind: image | lra | lm | recall   # which trainer runs a cell (subquad.arena.image / .lra / .lm / .recall)
    description: ...             # one line, with the papers' tables it is the analogue of
    seeds: [0, 1, 2]
    data: {...}                  # lra: the generator and its settings; lm: the corpus (image tasks name their data
                                 # in `train`)
    train: {...}                 # the recipe: TrainConfig keys (image) or LRAConfig keys (lra)
    host: {...}                  # image: model keyword arguments shared by every cell
    budgets: {default: {...}, quick: {...}}   # overrides of `train` per budget (and `seeds`: the seeds a run of
                                              # that budget trains unless --seeds is given; `mechanisms`: what
                                              # `--attention all` runs under that budget, default_mechanisms if absent)
    mechanisms: {label: {...}}   # label -> entry; the label is what the leaderboard shows
    default_mechanisms: [...]    # what `--attention all` runs
    claims: [...]                # what `subquad arena check` tests (see subquad.arena.report)
    metric: {name: acc, goal: max}   # the score cells store in test_acc / best_val_acc (default: accuracy in %,
                                     # higher is better; e.g. {name: bpc, goal: min} for bits per byte)

Keys that change no cell's numbers and no verdict, outside the fingerprint:

    reference_levels: {label: value}   # horizontal lines drawn in the plots (e.g. input-blind baselines)
    requires: gpu                      # `arena run` refuses the task without CUDA unless `--device cuda`

A claim is `{id, source, a, b}` plus `test: superior` (the default: a beats b) or `test: noninferior` with a
positive `margin` in the metric's units (a is at most `margin` worse than b), and optionally `score`: the cell.json
key it compares (default `test_acc`; e.g. the recall tasks' `acc_beyond`, accuracy on queries beyond the window).

A mechanism entry names a registered mechanism (`attn` for image tasks, `attention` for lra tasks) and its options;
`options` in the leaderboard is the entry without that name.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from subquad_cli.recipes import load_yaml

from ..errors import UserError

__all__ = ["TASKS", "CONFIG_DIR", "ARENA_FILE", "Task", "load_task", "task_names", "task_of_run", "kind_module"]

# The run record of an arena run directory (written by the runner).
ARENA_FILE = "arena.json"

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs" / "arena"
KINDS = ("image", "lra", "lm", "recall")
CLAIM_TESTS = ("superior", "noninferior")
METRIC_GOALS = ("max", "min")
DEFAULT_METRIC = {"name": "acc", "goal": "max"}
REQUIRES = ("gpu",)


def kind_module(kind: str):
    """The module that trains cells of `kind` (refusal, run_cell, prepare_data)."""
    if kind == "image":
        from . import image

        return image
    if kind == "lm":
        from . import lm

        return lm
    if kind == "recall":
        from . import recall

        return recall
    from . import lra

    return lra


def task_names() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


TASKS = tuple(task_names())


@dataclass
class Task:
    name: str
    kind: str
    description: str
    seeds: list[int]
    train: dict[str, Any]
    budgets: dict[str, dict[str, Any]]
    mechanisms: dict[str, dict[str, Any]]
    default_mechanisms: list[str]
    host: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    claims: list[dict[str, Any]] = field(default_factory=list)
    metric: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_METRIC))
    # Outside the fingerprint: plot reference lines, and what the task needs to run (None or "gpu").
    reference_levels: dict[str, float] = field(default_factory=dict)
    requires: str | None = None
    # What `load_task` was given to find it again: the shipped task's name, or the absolute path of a YAML file.
    source: str = ""

    @property
    def lower_is_better(self) -> bool:
        return self.metric.get("goal") == "min"

    def score(self, value: float | None) -> str:
        """`value` of the task's metric with its own unit: '97.10 %' for accuracy, '2.412 bpc' for bits per
        byte (what progress lines, results and claims print)."""
        return metric_text(value, self.metric["name"])

    @property
    def name_key(self) -> str:
        return "attn" if self.kind == "image" else "attention"


    def recipe(self, budget: str) -> dict[str, Any]:
        """The `train` mapping with the budget's overrides applied (a budget's `seeds` is not a train setting)."""
        if budget not in self.budgets:
            raise UserError(f"task {self.name!r} has no budget {budget!r}; allowed: {', '.join(self.budgets)}")
        return {**self.train, **{k: v for k, v in self.budgets[budget].items() if k not in ("seeds", "mechanisms")}}

    def budget_seeds(self, budget: str) -> list[int]:
        """The seeds a run of `budget` trains by default: the budget's own `seeds` (e.g. one seed for a smoke test),
        else the task's."""
        self.recipe(budget)  # an unknown budget: one line
        return [int(s) for s in self.budgets[budget].get("seeds", self.seeds)]

    def mechanism(self, label: str) -> dict[str, Any]:
        """The entry of `label`: a listed label, or any registered mechanism under its own name with defaults."""
        if label in self.mechanisms:
            return dict(self.mechanisms[label])
        from ..attention import list_attention

        if label in list_attention():
            return {self.name_key: label}
        allowed = sorted(set(self.mechanisms) | set(list_attention()))
        raise UserError(f"unknown mechanism {label!r} for task {self.name!r}; allowed: {', '.join(allowed)}")

    def resolve(self, attention: str, budget: str = "default") -> list[str]:
        """`--attention` ('all' or a comma-separated list) -> labels, in order, without repeats. 'all' is the
        budget's own `mechanisms` where it names them (a smoke test's few), else `default_mechanisms`."""
        if attention.strip() == "all":
            self.recipe(budget)  # an unknown budget: one line
            return list(self.budgets[budget].get("mechanisms", self.default_mechanisms))
        labels = [a.strip() for a in attention.split(",") if a.strip()]
        if not labels:
            raise UserError("--attention is empty; give 'all' or a comma-separated list of mechanisms")
        for label in labels:
            self.mechanism(label)
        return list(dict.fromkeys(labels))

    def as_dict(self) -> dict[str, Any]:
        """The task as the mapping its YAML holds (what the kinds' `prepare_data` read)."""
        return {"task": self.name, "kind": self.kind, "description": self.description, "seeds": list(self.seeds),
                "data": dict(self.data), "train": dict(self.train), "host": dict(self.host),
                "budgets": {k: dict(v) for k, v in self.budgets.items()}, "mechanisms": dict(self.mechanisms),
                "default_mechanisms": list(self.default_mechanisms), "claims": list(self.claims),
                "metric": dict(self.metric)}

    def fingerprint(self, budget: str) -> str:
        """What every cell's numbers and the run's verdicts depend on (recipe, host, data, seeds, claims), as
        canonical JSON. Mechanism entries are not in it: a run records each label's entry when the label first
        trains (`arena.json`, "mechanisms"), so a mechanism can join a run but its entry cannot change under it.
        A metric other than the default (accuracy, higher is better) is in it too; `reference_levels` and
        `requires` are not (they change no number and no verdict)."""
        fp: dict[str, Any] = {"kind": self.kind, "train": self.recipe(budget), "host": self.host, "data": self.data,
                              "seeds": list(self.seeds), "claims": self.claims}
        if self.metric != DEFAULT_METRIC:
            fp["metric"] = self.metric
        return json.dumps(fp, sort_keys=True, default=str)


def metric_text(value: float | None, name: str = "acc") -> str:
    """A score with its unit: accuracy in % with two decimals, any other metric (bpc) with three and its name."""
    if value is None or value != value:
        return "-"
    return f"{value:.2f} %" if name == "acc" else f"{value:.3f} {name}"


def options_text(entry: dict[str, Any], name_key: str) -> str:
    """The entry without its mechanism name, as 'key=value;...' (the mechanism's own options unprefixed)."""
    flat: dict[str, Any] = {}

    def walk(prefix: str, d: dict[str, Any]) -> None:
        for k in sorted(d):
            if isinstance(d[k], dict):
                walk("" if k in ("attn_kwargs", "attn_kw") and not prefix else f"{prefix}{k}.", d[k])
            else:
                flat[f"{prefix}{k}"] = d[k]

    walk("", {k: v for k, v in entry.items() if k != name_key})
    return ";".join(f"{k}={v}" for k, v in flat.items())


def load_task(name: str) -> Task:
    """The task `name` (a file in CONFIG_DIR, or a path to a YAML of the same schema); bad input is a UserError."""
    path = Path(name)
    source = str(path.resolve())
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        path, source = CONFIG_DIR / f"{name}.yaml", str(name)
        if not path.is_file():
            raise UserError(f"unknown arena task {name!r}; allowed: {', '.join(task_names())}")
    raw = load_yaml(path)
    missing = [k for k in ("task", "kind", "seeds", "train", "budgets", "mechanisms", "default_mechanisms")
               if k not in raw]
    if missing:
        raise UserError(f"{path}: missing key(s) {', '.join(missing)}")
    if raw["kind"] not in KINDS:
        raise UserError(f"{path}: kind must be one of {', '.join(KINDS)}, got {raw['kind']!r}")
    if "default" not in raw["budgets"] or "quick" not in raw["budgets"]:
        raise UserError(f"{path}: budgets must define 'default' and 'quick'")
    task = Task(name=str(raw["task"]), kind=raw["kind"], description=str(raw.get("description", "")),
                seeds=[int(s) for s in raw["seeds"]], train=dict(raw["train"]),
                budgets={k: dict(v or {}) for k, v in raw["budgets"].items()},
                mechanisms={str(k): dict(v) for k, v in raw["mechanisms"].items()},
                default_mechanisms=[str(m) for m in raw["default_mechanisms"]], host=dict(raw.get("host") or {}),
                data=dict(raw.get("data") or {}), claims=list(raw.get("claims") or []), source=source)
    task.metric = _metric(raw.get("metric"), path)
    task.reference_levels = _levels(raw.get("reference_levels"), path)
    requires = raw.get("requires")
    if requires is not None and requires not in REQUIRES:
        raise UserError(f"{path}: requires must be one of {', '.join(REQUIRES)}, got {requires!r}")
    task.requires = requires
    for claim in task.claims:
        _check_claim(claim, path)
    for label, entry in task.mechanisms.items():
        if task.name_key not in entry:
            raise UserError(f"{path}: mechanism {label!r} has no {task.name_key!r} key")
    for where, labels in [("default_mechanisms", task.default_mechanisms)] + [
            (f"budget {b}'s mechanisms", v["mechanisms"]) for b, v in task.budgets.items() if "mechanisms" in v]:
        unknown = [m for m in labels if m not in task.mechanisms]
        if unknown:
            raise UserError(f"{path}: {where} lists unknown label(s) {', '.join(unknown)}")
    return task


def _metric(raw: Any, path: Path) -> dict[str, str]:
    if raw is None:
        return dict(DEFAULT_METRIC)
    if not isinstance(raw, dict) or set(raw) - {"name", "goal"} or not raw.get("name"):
        raise UserError(f"{path}: metric must be a mapping {{name: NAME, goal: max|min}}, got {raw!r}")
    goal = raw.get("goal", "max")
    if goal not in METRIC_GOALS:
        raise UserError(f"{path}: metric goal must be one of {', '.join(METRIC_GOALS)}, got {goal!r}")
    return {"name": str(raw["name"]), "goal": goal}


def _levels(raw: Any, path: Path) -> dict[str, float]:
    if raw is None:
        return {}
    try:
        return {str(k): float(v) for k, v in dict(raw).items()}
    except (TypeError, ValueError):
        raise UserError(f"{path}: reference_levels must map labels to numbers, got {raw!r}") from None


def _check_claim(claim: Any, path: Path) -> None:
    if not isinstance(claim, dict) or "a" not in claim or "b" not in claim:
        raise UserError(f"{path}: a claim needs `a` and `b` (mechanism labels), got {claim!r}")
    name = claim.get("id", f"{claim['a']} vs {claim['b']}")
    test = claim.get("test", "superior")
    if test not in CLAIM_TESTS:
        raise UserError(f"{path}: claim {name!r} has test {test!r}; allowed: {', '.join(CLAIM_TESTS)}")
    score = claim.get("score", "test_acc")
    if not isinstance(score, str) or not score:
        raise UserError(f"{path}: claim {name!r} has score {score!r}; give the cell.json key it compares (e.g. "
                        "test_acc)")
    margin = claim.get("margin")
    if test == "noninferior":
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin > 0:
            raise UserError(f"{path}: noninferior claim {name!r} needs a positive `margin` (in the metric's "
                            f"units), got {margin!r}")
    elif margin is not None:
        raise UserError(f"{path}: claim {name!r} gives a margin, which only `test: noninferior` takes")


def task_of_run(out: str | os.PathLike, meta: dict[str, Any] | None = None) -> Task:
    """The task of the arena run in `out`: from the YAML file the run was started with, when it was started with a
    file instead of a shipped task's name."""
    out = Path(out)
    if meta is None:
        meta_path = out / ARENA_FILE
        if not meta_path.is_file():
            raise UserError(f"{out} is not an arena run directory (no {ARENA_FILE})")
        meta = json.loads(meta_path.read_text())
    return load_task(meta.get("source") or meta["task"])
