"""Image-task cells: one run of the image trainer (`subquad.engine.classify.train`) per (mechanism, seed).

The host is the task's `train.model` built with the task's `host` keyword arguments; `mech` (the arguments of every
function here) is the host's arguments with the cell's mechanism entry on top. A cell changes only the token
mixer (`attn`, `attn_kwargs`) and, for L2ViT's enhanced linear attention, adds the LCM branch its paper makes part
of the mechanism (`lcm_kernel_size`, see `subquad.models.vit.Block`). Everything else (data, subset, recipe, budget)
comes from the task file, so cells differ by mechanism and seed only.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["refusal", "run_cell", "prepare_data", "cell_config"]

# How a host refuses a mechanism while it is built (an unknown option is a ModelOptionError, a UserError). A
# RuntimeError or TypeError while building on the meta device is a bug and keeps its traceback.
_BUILD_ERRORS = (ValueError, AssertionError, NotImplementedError)


def refusal(train: dict[str, Any], mech: dict[str, Any]) -> str | None:
    """Why the host cannot take this mechanism (None: it can), found by building it on the meta device."""
    from ..attention import Request, check, get_attention_cls
    from ..errors import UserError
    from ..models import create_model

    try:
        reasons = check(get_attention_cls(mech["attn"]).caps, Request())
    except (KeyError, ValueError, UserError) as e:
        return str(e).splitlines()[0]
    if reasons:
        return f"{mech['attn']} {'; '.join(reasons)}; image tasks are bidirectional"
    try:
        create_model(train["model"], device="meta", num_classes=10, img_size=train.get("img_size"),
                     **mech)
    except (*_BUILD_ERRORS, UserError) as e:
        return f"the host cannot take it: {str(e).strip().splitlines()[0]}"
    return None


def gmacs(train: dict[str, Any], mech: dict[str, Any]) -> float:
    """Forward GMACs per image of the cell's model at the task's image size (counted on the meta device)."""
    from ..bench.flops import count_macs
    from ..models import create_model

    size = train.get("img_size") or 224
    model = create_model(train["model"], device="meta", num_classes=10, img_size=size, **mech)
    return float(count_macs(model, size)["gmacs"])


def prepare_data(task: dict[str, Any], root: Path, budget: str = "default") -> str:
    """Image tasks read the data source `train.data` names; nothing to generate."""
    return str(task["train"]["data"])


def cell_config(train: dict[str, Any], mech: dict[str, Any], seed: int, out: Path):
    from subquad_cli.runconfig import TrainConfig, merge_config

    cfg = merge_config(TrainConfig(), {**train, "model_kwargs": dict(mech), "seed": seed,
                                       "output": str(out), "log_interval": 0}, origin="arena task")
    if (out / "last_state.pth").is_file():
        cfg = merge_config(cfg, {"resume": str(out)}, origin="arena resume")
    return cfg


def _curve(out: Path) -> list[dict[str, float]]:
    with open(out / "summary.csv", newline="") as f:
        return [{"epoch": int(r["epoch"]), "val_acc": float(r["eval_top1"])} for r in csv.DictReader(f)]


def run_cell(train: dict[str, Any], mech: dict[str, Any], seed: int, out: Path,
             progress: Callable[[dict[str, Any]], None],
             on_update: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """Train (or resume, or just read) the cell in `out`; returns its measured numbers. `progress` follows every
    epoch, `on_update(position)` every optimizer update."""
    from ..engine.classify import train as train_image

    if not (out / "results.json").is_file():
        cfg = cell_config(train, mech, seed, out)
        epochs = cfg.epochs
        train_image(cfg, on_epoch_end=lambda e, row: progress({"epoch": int(row["epoch"]), "epochs": epochs,
                                                                "val_acc": float(row["eval_top1"])}),
                    on_update=on_update)
    res = json.loads((out / "results.json").read_text())
    return {"test_acc": res["top1"], "best_val_acc": res["best_val_top1"], "params": res["params"],
            "gmacs": gmacs(train, mech), "train_per_sec": res["train_images_per_cpu_sec"],
            "train_per_wall_sec": res["train_images_per_sec"], "eval_per_sec": res["eval_images_per_sec"],
            "peak_mem_mb": res["peak_mem_mb"], "wall_s": res["wall_s"], "curve": _curve(out)}
