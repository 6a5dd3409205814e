"""Arena cells of the language-modelling tasks (`charlm`): the causal `CharLM` trained by `train_lm`, scored in bits
per byte/character (lower is better).

The arena runner (`subquad arena run`) calls, per task YAML (`subquad/configs/arena/<task>.yaml`, `kind: lm`):

    prepare_data(task, root, budget)      build the byte corpus once (`subquad.data.char.prepare_corpus`: files
                                          concatenated, split contiguously 90/5/5) -> the folder for train["data"]
    refusal(train, mech)                  why a mechanism cannot run (None: it can): no causal 1-D form in its
                                          declared caps, or options the host refuses at build time
    run_cell(train, mech, seed, out, progress, on_update)
                                          train one (mechanism, seed) cell in `out` -> the cell's metrics

`data:` names the corpus: `corpus` (a text file or folder), `glob`, `variant` (bytes | chars), `limit_bytes`
(0 = all), `name`. A budget's `corpus:` entry overrides them (e.g. a smaller corpus for `--budget quick`). The
environment variable SUBQUAD_ARENA_CORPUS, when set, replaces `corpus` (every non-hidden file of a folder, or the
one file; `glob` is dropped): tests and machines without the Debian package point the task at their own text. The
data folder is named by a hash of the resolved settings, and a run whose data folder holds a corpus built from other
settings is refused, so cells of one run never train on different text.

`train` is the YAML's `train:` mapping (LMConfig keys: the host, the recipe and the evaluation) with the budget's
overrides; `mech` is a `mechanisms:` entry:

    attention: registered mechanism name (built with causal=True)
    attn_kw: {...}               its options (long_short: {window_size, chunk_size, rank, dual_ln})
    context: n                   train and evaluate at n tokens instead of `seq_len` / `eval_ctx`: seq_len = eval_ctx
                                 = n, eval_score = n // 2 (the same rule: the last half of each window is scored),
                                 batch_size scaled by seq_len / n so that every step sees as many tokens (in every
                                 training phase, when the recipe has `phases`)

Cell metrics (CELL_KEYS, shared with the other kinds): `test_acc` and `best_val_acc` hold bits per symbol (bpc) on
the test split and the valid split for the checkpoint the periodic valid evaluations selected; `train_per_sec` is
training tokens per second of the cell's CPU time, `eval_per_sec` valid tokens scored per CPU second, `gmacs` the
forward GMACs of one window of the cell's context.
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
from .lra import check_mech, publish_folder

__all__ = ["prepare_data", "refusal", "run_cell", "MECH_KEYS", "CELL_KEYS", "CORPUS_ENV", "DATA_KEYS"]

MECH_KEYS = ("attention", "attn_kw", "context")
CELL_KEYS = ("test_acc", "best_val_acc", "params", "gmacs", "train_per_sec", "train_per_wall_sec", "eval_per_sec",
             "peak_mem_mb", "wall_s", "curve")
DATA_KEYS = ("corpus", "glob", "variant", "limit_bytes", "name")
CORPUS_ENV = "SUBQUAD_ARENA_CORPUS"
# Keys of a budget that are not LMConfig settings.
_BUDGET_ONLY = ("corpus",)
_RUN_FILES = ("args.yaml", "summary.csv", "last.safetensors", "last.json", "best.safetensors", "best.json",
              "results.json")


# ---------------------------------------------------------------------------------------------------------- data


def _data_settings(task: dict[str, Any], budget: str) -> dict[str, Any]:
    data = dict(task.get("data") or {})
    budgets = task.get("budgets") or {}
    if budget not in budgets:
        raise UserError(f"unknown budget {budget!r} for task {task.get('task')!r}; allowed: {', '.join(budgets)}")
    data.update((budgets.get(budget) or {}).get("corpus") or {})
    unknown = sorted(set(data) - set(DATA_KEYS))
    if unknown:
        raise UserError(f"task {task.get('task')!r}: unknown corpus setting(s) {unknown}; allowed: "
                        f"{', '.join(DATA_KEYS)}")
    env = os.environ.get(CORPUS_ENV, "").strip()
    if env:
        data["corpus"] = os.path.abspath(env)
        data.pop("glob", None)
        data.pop("name", None)
    if not data.get("corpus"):
        raise UserError(f"task {task.get('task')!r}: data.corpus is not set (a text file or folder)")
    return data


def _missing_corpus(settings: dict[str, Any]) -> str | None:
    """A one-line explanation when the corpus is absent (None when it is there)."""
    from ..data.char import LINUX_DOC_SOURCES

    path = Path(settings["corpus"])
    if path.exists():
        return None
    if os.path.realpath(path).startswith(os.path.realpath(LINUX_DOC_SOURCES)):
        return (f"the corpus {path} is not installed: `apt-get install linux-doc-6.12` (Debian), or set "
                f"{CORPUS_ENV}=FILE_OR_FOLDER to train on other text")
    return f"the corpus {path} does not exist (set data.corpus or {CORPUS_ENV}=FILE_OR_FOLDER)"


def prepare_data(task: dict[str, Any], root: str | os.PathLike, budget: str = "default") -> Path:
    """Build the task's byte corpus once: `root/<task>-<hash of the settings>` with train/valid/test.bin and
    meta.json (`subquad lm prepare`), written to a temporary folder and renamed into place, so that an
    interrupted build leaves nothing that looks complete.

    Refuses (UserError) when `root` already holds this task's corpus built from other settings (another
    SUBQUAD_ARENA_CORPUS, another budget's corpus), since the run's cells must share their text.

    Returns: the folder, for `train["data"]`.
    """
    from ..data.char import prepare_corpus

    settings = _data_settings(task, budget)
    key = json.dumps(settings, sort_keys=True)
    tname = str(task.get("task", "lm"))
    name = f"{tname}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"
    root = Path(root)
    folder = root / name
    marker = {"settings": settings, "generated_by": "subquad.arena.lm.prepare_data"}

    def complete(f: Path) -> dict[str, Any] | None:
        try:
            m = json.loads((f / "arena_data.json").read_text())
        except (OSError, ValueError):
            return None
        return m if m.get("generated_by") == marker["generated_by"] else None

    if complete(folder) == marker:
        return folder
    if root.is_dir():
        for other in sorted(root.glob(f"{tname}-*")):
            m = complete(other)
            if other != folder and m is not None:
                raise UserError(f"this run's corpus was built from {m['settings']}, the task now gives {settings} "
                                f"(check {CORPUS_ENV}); cells of one run share their text: choose another --out")
    why = _missing_corpus(settings)
    if why:
        raise UserError(why)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    prepare_corpus(settings["corpus"], tmp, settings.get("variant", "bytes"), settings.get("glob"),
                   settings.get("name", ""), int(settings.get("limit_bytes", 0) or 0))
    (tmp / "arena_data.json").write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    return publish_folder(tmp, folder, lambda: complete(folder) == marker)


# ---------------------------------------------------------------------------------------------------- mechanism


def _check_mech(mech: dict[str, Any]) -> str:
    return check_mech(mech, MECH_KEYS)


def cell_config(train: dict[str, Any], mech: dict[str, Any], seed: int = 0, out: str = ""):
    """The LMConfig of one cell: the task's recipe, the mechanism and its options, the cell's context."""
    from ..engine.sequence import LMConfig

    name = _check_mech(mech)
    values = {k: v for k, v in train.items() if k not in _BUDGET_ONLY}
    fields = {f.name for f in dataclasses.fields(LMConfig)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise UserError(f"unknown train setting(s) {unknown}; allowed: {', '.join(sorted(fields))}")
    attn_kw = {**(values.get("attn_kw") or {}).get(name, {}), **(mech.get("attn_kw") or {})}
    values.update(attention=name, attn_kw={name: attn_kw}, seed=int(seed), output=os.fspath(out),
                  device=values.get("device") or "cpu")
    cfg = LMConfig(**values)
    if "context" in mech:
        n = mech["context"]
        if not isinstance(n, int) or n < 2 or cfg.seq_len % n:
            raise UserError(f"mechanism context must be an int >= 2 dividing seq_len={cfg.seq_len}, got {n!r}")
        from ..engine.sequence import lm_phases

        lm_phases(cfg)  # a malformed phase list is refused here, in one line
        phases = []
        for ph in cfg.phases:
            if int(ph["seq_len"]) % n:
                raise UserError(f"mechanism context {n} must divide every phase's seq_len, got {ph['seq_len']}")
            phases.append({**ph, "seq_len": n, "batch_size": int(ph["batch_size"]) * (int(ph["seq_len"]) // n)})
        cfg = dataclasses.replace(cfg, seq_len=n, eval_ctx=n, eval_score=n // 2,
                                  batch_size=cfg.batch_size * (cfg.seq_len // n), phases=phases)
    return cfg


def refusal(train: dict[str, Any], mech: dict[str, Any]) -> str | None:
    """Why `mech` cannot run as the token mixer of the causal LM (None when it can): no causal 1-D form in its
    declared caps, or options the host refuses when it is built (on the meta device; nothing is trained). Bad input
    (unknown mechanism, option or setting) raises UserError."""
    from ..attention import Request, check, get_attention_cls
    from ..engine.sequence import build_lm

    cfg = cell_config(train, mech)
    reasons = check(get_attention_cls(cfg.attention).caps, Request(causal=True, sequence=True))
    if reasons:
        return f"{'; '.join(reasons)}; a language model needs a causal 1-D form"
    try:
        build_lm(256, cfg, device=torch.device("meta"))
    except (UserError, ValueError) as e:
        return f"the host cannot take it: {str(e).splitlines()[0]}"
    return None


def count_gmacs(cfg, vocab_size: int) -> float:
    """Forward GMACs of one window of `cfg.seq_len` tokens (batch 1)."""
    from ..bench.flops import count_module_macs
    from ..engine.sequence import build_lm

    model = build_lm(vocab_size, cfg).eval()
    tokens = torch.zeros(1, cfg.seq_len, dtype=torch.int64)
    return float(count_module_macs(model, tokens)["gmacs"])


# ---------------------------------------------------------------------------------------------------------- cell


def _curve(out: Path) -> list[dict[str, Any]]:
    with open(out / "summary.csv", newline="") as f:
        return [{"step": int(r["step"]), "val_acc": float(r["valid_bpc"])} for r in csv.DictReader(f)]


def run_cell(train: dict[str, Any], mech: dict[str, Any], seed: int, out: str | os.PathLike,
             progress: Callable[[dict[str, Any]], None] | None = None,
             on_update: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """Train one cell in `out` (train_lm's layout) and return its metrics (`CELL_KEYS`, bpc in the accuracy keys).

    A finished run there (results.json) is returned without training; a partial one (a killed cell) is cleared and
    trained again from the start. `progress({"step", "steps", "val_acc"})` follows every periodic evaluation
    (`val_acc` = valid bpc); `on_update(position)` every optimizer update.
    """
    from ..engine.sequence import train_lm

    out = Path(out)
    cfg = cell_config(train, mech, seed, os.fspath(out))
    why = refusal(train, mech)
    if why:
        raise UserError(f"attention {cfg.attention!r} {why}")
    if not (out / "results.json").is_file():
        if out.exists():
            for f in _RUN_FILES:
                (out / f).unlink(missing_ok=True)

        def on_eval(row: dict[str, Any]) -> None:
            if progress is not None:
                progress({"step": int(row["step"]), "steps": int(row["steps"]), "val_acc": float(row["valid_bpc"])})

        train_lm(cfg, log=lambda s: None, on_eval=on_eval, on_update=on_update)
    res = json.loads((out / "results.json").read_text())

    def per(n: float, sec: float) -> float:
        return float(n) / sec if sec > 0 else float("nan")

    from ..data.char import read_meta

    vocab = int(read_meta(cfg.data)["vocab_size"])
    return {"test_acc": float(res["test_bpc"]), "best_val_acc": float(res["valid_bpc"]), "metric": "bpc",
            "params": int(res["params"]), "gmacs": count_gmacs(cfg, vocab),
            "train_per_sec": per(res["train_tokens"], res["train_cpu_seconds"]),
            "train_per_wall_sec": per(res["train_tokens"], res["train_seconds"]),
            "eval_per_sec": per(res["eval_tokens"], res["eval_cpu_seconds"]),
            "peak_mem_mb": float(res["peak_mem_mb"]), "wall_s": float(res["wall_seconds"]), "curve": _curve(out),
            "context": cfg.seq_len, "test_tokens": int(res["test_tokens"]), "best_step": int(res["best_step"])}
