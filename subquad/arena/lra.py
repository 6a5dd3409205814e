"""Arena cells of the sequence tasks (`listops`, `pathfinder32`): the LRA encoder trained by `train_lra`.

The arena runner (`subquad arena run`) calls, per task YAML (`subquad/configs/arena/<task>.yaml`, `kind: lra`):

    prepare_data(task, root, budget)      generate the task's data once -> the folder for train["data"]
    refusal(train, mech)                  why a mechanism cannot run on the task (None: it can); caps and a meta
                                          build only, nothing trained
    run_cell(train, mech, seed, out, progress, on_update)
                                          train one (mechanism, seed) cell in `out` (resuming a partial run,
                                          returning a finished one) -> the cell's metrics

`train` is the YAML's `train:` mapping (LRAConfig keys) with the budget's overrides applied and `data` set; a
budget's `generate:` entry (overrides of the `data:` generator settings, e.g. a tiny data set for `--budget quick`)
is read by `prepare_data` and ignored by `run_cell`. `mech` is a `mechanisms:` entry:

    attention: registered mechanism name
    attn_kw: {...}               options for build_attention (e.g. long_short: {dual_ln: false} for no DualLN)
    cls_attn_kw: {...}           options for a block that sees a class token (pool cls / cls_last only)
    odd_attn_kw: {...}           options for the odd-numbered blocks (window: {shift_size: 4}, Swin's SW-MSA)
    lcm_kernel_size: k           the L2ViT LCM branch after each attention (enhanced linear attention, Eq. 8)
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..errors import UserError
from ..files import atomic_write_text

__all__ = ["prepare_data", "refusal", "run_cell", "MECH_KEYS", "CELL_KEYS"]

MECH_KEYS = ("attention", "attn_kw", "cls_attn_kw", "odd_attn_kw", "lcm_kernel_size")
CELL_KEYS = ("test_acc", "best_val_acc", "params", "gmacs", "train_per_sec", "train_per_wall_sec", "eval_per_sec",
             "peak_mem_mb", "wall_s", "curve")
# Files a cell's run directory may hold (train_lra's layout); a partial run without a state file is cleared.
_RUN_FILES = ("args.yaml", "summary.csv", "last.safetensors", "last.json", "best.safetensors", "best.json",
              "last_state.pth", "results.json")
_GENERATORS = {"listops": ("num_train", "num_val", "num_test", "seed", "min_len", "max_len"),
               "pathfinder": ("size", "contour_length", "distractors", "num_images", "seed")}


# ---------------------------------------------------------------------------------------------------------- data


def _data_settings(task: dict[str, Any], budget: str) -> dict[str, Any]:
    data = dict(task.get("data") or {})
    budgets = task.get("budgets") or {}
    if budget not in budgets and budget != "default":
        raise UserError(f"unknown budget {budget!r} for task {task.get('task')!r}; allowed: "
                        f"{', '.join(budgets) or 'default'}")
    data.update((budgets.get(budget) or {}).get("generate") or {})
    gen = data.get("generator")
    if gen not in _GENERATORS:
        raise UserError(f"task {task.get('task')!r}: data.generator must be one of {', '.join(_GENERATORS)}, "
                        f"got {gen!r}")
    unknown = sorted(set(data) - {"generator", *_GENERATORS[gen]})
    if unknown:
        raise UserError(f"task {task.get('task')!r}: unknown {gen} data setting(s) {unknown}; allowed: "
                        f"{', '.join(_GENERATORS[gen])}")
    return data


def _generate(settings: dict[str, Any], out: Path) -> None:
    kw = {k: v for k, v in settings.items() if k != "generator"}
    if settings["generator"] == "listops":
        from ..data.lra.listops import write_listops

        write_listops(out, **kw)
    else:
        from ..data.lra.pathfinder import write_pathfinder

        write_pathfinder(out, **kw)
    # The generators record their run time in meta.json; drop it so that the folder is a function of the settings.
    meta_path = out / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta.pop("seconds", None)
    atomic_write_text(meta_path, json.dumps(meta, indent=2) + "\n")


def _token_cache(task: dict[str, Any], budget: str, folder: Path) -> None:
    """Write the ListOps token caches (`<split>.<encoding>.npz`) the cells will read, so that cells starting side
    by side only read them."""
    from ..data.lra.listops import ListOpsDataset

    train = {**(task.get("train") or {}), **((task.get("budgets") or {}).get(budget) or {})}
    for split in ("train", "val", "test"):
        limit = train.get("limit_train" if split == "train" else "limit_eval") or None
        ListOpsDataset(folder, split, train.get("encoding", "lra_released"), int(train.get("max_len", 2048)),
                       limit=limit)


def prepare_data(task: dict[str, Any], root: str | os.PathLike, budget: str = "default") -> Path:
    """Generate the data of `task` (its `data:` settings, plus the budget's `generate:` overrides) once.

    The folder is `root/<task>-<hash of the settings>`: written to a temporary folder, completed with
    `arena_data.json` (the settings) and renamed into place, so an interrupted generation leaves nothing that looks
    complete, and a complete folder is reused as is. The output is a function of the settings alone.

    Returns: the folder, for `train["data"]`.
    """
    settings = _data_settings(task, budget)
    key = json.dumps(settings, sort_keys=True)
    name = f"{task.get('task', settings['generator'])}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"
    root = Path(root)
    folder = root / name
    marker = {"settings": settings, "generated_by": "subquad.arena.lra.prepare_data"}

    def complete() -> bool:
        try:
            return json.loads((folder / "arena_data.json").read_text()) == marker
        except (OSError, ValueError):
            return False

    if complete():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    _generate(settings, tmp)
    if settings["generator"] == "listops":
        _token_cache(task, budget, tmp)
    (tmp / "arena_data.json").write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    return publish_folder(tmp, folder, complete)


def publish_folder(tmp: Path, folder: Path, complete: Callable[[], bool]) -> Path:
    """Move a finished data folder `tmp` into place as `folder` (an incomplete one there is replaced); when another
    process published the same folder first, keep theirs if it is complete."""
    if folder.exists() and not complete():
        shutil.rmtree(folder)
    try:
        os.replace(tmp, folder)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not complete():
            raise
    return folder


# ---------------------------------------------------------------------------------------------------- mechanism


def check_mech(mech: dict[str, Any], keys: tuple[str, ...] = MECH_KEYS) -> str:
    """The registered attention a sequence task's mechanism entry names; one line for a bad entry."""
    from ..attention import ATTENTION_REGISTRY

    if not isinstance(mech, dict) or "attention" not in mech:
        raise UserError(f"a mechanism entry needs `attention: <name>`, got {mech!r}")
    unknown = sorted(set(mech) - set(keys))
    if unknown:
        raise UserError(f"unknown mechanism option(s) {unknown}; allowed: {', '.join(keys)}")
    name = mech["attention"]
    if name not in ATTENTION_REGISTRY:
        raise UserError(f"unknown attention {name!r}; allowed: {', '.join(ATTENTION_REGISTRY.names())}")
    return name


def _config(train: dict[str, Any], mech: dict[str, Any], seed: int = 0, out: str = ""):
    """The LRAConfig of one cell."""
    from ..engine.sequence import LRAConfig

    name = check_mech(mech)
    values = {k: v for k, v in train.items() if k != "generate"}
    fields = {f.name for f in dataclasses.fields(LRAConfig)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise UserError(f"unknown train setting(s) {unknown}; allowed: {', '.join(sorted(fields))}")
    attn_kw = {**(values.get("attn_kw") or {}).get(name, {}), **(mech.get("attn_kw") or {})}
    cls_kw = {**(values.get("cls_attn_kw") or {}).get(name, {}), **(mech.get("cls_attn_kw") or {})}
    odd_kw = {**(values.get("odd_attn_kw") or {}).get(name, {}), **(mech.get("odd_attn_kw") or {})}
    values.update(attention=name, attn_kw={name: attn_kw}, cls_attn_kw={name: cls_kw} if cls_kw else {},
                  odd_attn_kw={name: odd_kw} if odd_kw else {},
                  seed=int(seed), output=os.fspath(out), device=values.get("device") or "cpu")
    if "lcm_kernel_size" in mech:
        values["lcm_kernel_size"] = int(mech["lcm_kernel_size"])
    return LRAConfig(**values)


def refusal(train: dict[str, Any], mech: dict[str, Any]) -> str | None:
    """Why `mech` cannot run on the task of `train` (None when it can).

    Decided from the mechanism's declared caps and a build of the model on the meta device (no weights, no
    forward): a causal-only mechanism, a 2-D mechanism on a 1-D task (no `grid`), a 2-D mechanism with a class
    token, or options the model refuses at build time. Bad input (unknown mechanism or option) raises UserError.
    """
    from ..attention import get_attention_cls
    from ..engine.sequence import build_lra_model

    cfg = _config(train, mech)
    caps = get_attention_cls(cfg.attention).caps
    if not caps.bidirectional:
        return f"is causal only; {cfg.task} needs a bidirectional encoder"
    if cfg.grid is None and not caps.sequence:
        return f"needs a 2-D token grid (hw); {cfg.task} is a 1-D sequence"
    if cfg.grid is not None and caps.needs_hw and cfg.pool in ("cls", "cls_last"):
        return (f"needs the {cfg.grid[0]}x{cfg.grid[1]} grid intact, which pool {cfg.pool!r} (a class token) "
                "breaks")
    try:
        build_lra_model(cfg, device=torch.device("meta"))
    except (UserError, ValueError) as e:
        return f"cannot be built for {cfg.task}: {str(e).splitlines()[0]}"
    return None


def count_gmacs(cfg) -> float:
    """Forward GMACs per example at the task's padded length (T = grid H * W, else max_len), on the meta device."""
    from ..bench.flops import count_module_macs
    from ..engine.sequence import build_lra_model

    model = build_lra_model(cfg, device=torch.device("meta")).eval()
    T = cfg.grid[0] * cfg.grid[1] if cfg.grid else cfg.max_len
    tokens = torch.zeros(1, T, dtype=torch.int64, device="meta")
    # No mask: a full-length example (masks make some mechanisms inspect values, which meta tensors lack).
    if cfg.task == "retrieval":
        return count_module_macs(model, tokens, None, tokens, None)["gmacs"]
    return count_module_macs(model, tokens, None)["gmacs"]


# ---------------------------------------------------------------------------------------------------------- cell


def _curve(out: Path) -> list[dict[str, Any]]:
    with open(out / "summary.csv", newline="") as f:
        return [{"step": int(r["step"]), "val_acc": float(r["eval_acc"])} for r in csv.DictReader(f)]


def _cell_result(cfg, res: dict[str, Any], out: Path) -> dict[str, Any]:
    def per(n: float, sec: float) -> float:
        return float(n) / sec if sec > 0 else float("nan")

    return {"test_acc": float(res["test_acc"]), "best_val_acc": float(res["best_val_acc"]),
            "params": int(res["params"]), "gmacs": count_gmacs(cfg),
            "train_per_sec": per(res["train_examples"], res["train_cpu_seconds"]),
            "train_per_wall_sec": per(res["train_examples"], res["train_seconds"]),
            "eval_per_sec": per(res["test_samples"], res["test_seconds"]),
            "peak_mem_mb": float(res["peak_mem_mb"]), "wall_s": float(res["wall_seconds"]), "curve": _curve(out)}


def run_cell(train: dict[str, Any], mech: dict[str, Any], seed: int, out: str | os.PathLike,
             progress: Callable[[dict[str, Any]], None] | None = None,
             on_update: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """Train one arena cell in `out` and return its metrics (`CELL_KEYS`).

    `out` gets train_lra's layout (args.yaml, summary.csv, last/best.safetensors + sidecars, last_state.pth,
    results.json). A finished run there is returned without training; a partial one is resumed from its last
    evaluation (same numbers as an uninterrupted run); a run directory without a state file (killed before its
    first evaluation) is cleared and started over. `progress({"step", "steps", "val_acc"})` follows every
    evaluation, `on_update(position)` every optimizer update.

    Returns: test_acc (% on the test split, once, for the best-on-val checkpoint), best_val_acc, params, gmacs
    (forward, per example), train_per_sec (training examples per second of process CPU time), train_per_wall_sec,
    eval_per_sec (validation examples per CPU second), peak_mem_mb (growth of the process's peak RSS during the
    run, or CUDA max allocated), wall_s (the training loop with its evaluations), curve [{step, val_acc}].
    """
    from ..engine.sequence import train_lra

    out = Path(out)
    cfg = _config(train, mech, seed, os.fspath(out))
    why = refusal(train, mech)
    if why:
        raise UserError(f"attention {cfg.attention!r} {why}")
    if (out / "last_state.pth").is_file():
        cfg = dataclasses.replace(cfg, resume=True)
    elif out.exists():
        for f in _RUN_FILES:
            (out / f).unlink(missing_ok=True)

    def on_eval(row: dict[str, Any]) -> None:
        if progress is not None:
            progress({"step": int(row["step"]), "steps": int(row["steps"]), "val_acc": float(row["eval_acc"])})

    res = train_lra(cfg, log=lambda s: None, on_eval=on_eval, on_update=on_update)
    if "train_cpu_seconds" not in res or "test_seconds" not in res:
        raise UserError(f"{out} holds a run of an older subquad without the arena's timings; use another --out")
    return _cell_result(cfg, res, out)


# ----------------------------------------------------------------------------------------------------- baselines


def listops_baselines(data_dir: str | os.PathLike) -> dict[str, float]:
    """Test accuracy (%) of two input-blind rules learned on the train split of a ListOps folder (train.tsv,
    test.tsv): the most common answer overall, and the most common answer of the outermost operator (the first
    `[OP` token). A model at the second number has learned only which operator is outside, not the nesting."""

    def rows(split: str) -> list[tuple[str, str]]:
        with open(Path(data_dir) / f"{split}.tsv", newline="") as f:
            r = [row for row in csv.reader(f, delimiter="\t") if len(row) >= 2]
        return [(s, y) for s, y in r if y.strip().isdigit()]

    def outer(s: str) -> str:
        return next((t for t in s.replace("(", " ").replace(")", " ").split() if t.startswith("[")), "")

    from collections import Counter

    train, test = rows("train"), rows("test")
    if not train or not test:
        raise UserError(f"{data_dir}: no ListOps rows in train.tsv / test.tsv")
    overall = Counter(y for _, y in train).most_common(1)[0][0]
    per_op: dict[str, Counter] = {}
    for s, y in train:
        per_op.setdefault(outer(s), Counter())[y] += 1
    rule = {op: c.most_common(1)[0][0] for op, c in per_op.items()}
    n = len(test)
    return {"majority": 100.0 * sum(y == overall for _, y in test) / n,
            "outer_operator": 100.0 * sum(rule.get(outer(s), overall) == y for s, y in test) / n}
