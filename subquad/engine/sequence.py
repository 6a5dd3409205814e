"""Training loops for long sequences: LRA classification (accuracy) and character-level LM (bits per character).

LRA (`train_lra`): the Transformer-LS / Nystromformer recipe: AdamW (betas 0.9 /
0.999, eps 1e-6), `OneCycleLR` with max_lr = lr, pct_start = warmup / steps, linear annealing and torch's defaults
(div_factor 25, final_div_factor 1e4, cycle_momentum=True), a fixed step budget, the dev split evaluated every
`eval_every` steps on `eval_steps` batches, the best-dev weights kept and the test split scored once with them.

LM (`train_lm`): random contiguous windows of the train memmap, AdamW with a linear warm-up to a fixed lr (the
official fairseq `fixed` schedule), optional wall-clock budget; BPC (= mean NLL / ln 2) on valid/test with the
paper's sliding-window protocol (`evaluate_bpc`: every scored token has at least `ctx - score` tokens of context).

Both train in the shared loop (engine.loop) and write the run directory like the image trainer: `args.yaml`,
`summary.csv`, `last.safetensors` / `best.safetensors` with JSON sidecars, and `results.json`; `last_state.pth` is
written at every evaluation, every `checkpoint_every` steps and on SIGTERM / SIGINT, and `resume=True` (`--resume
DIR`) continues from it exactly.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ..bench.memory import peak_memory_mb, rss_mb
from ..errors import UserError
from .checkpoint import read_json, save_weights, write_json
from .distributed import DistInfo, all_reduce_sum, barrier, cleanup, init_distributed
from .loop import Loop, Position, Precision, TrainTask
from .rng import seed_everything, step_seed
from .runfiles import read_csv, write_args, write_csv

__all__ = ["LRAConfig", "LMConfig", "train_lra", "train_lm", "evaluate_lra", "evaluate_bpc", "build_lra_data",
           "build_lm", "load_lm", "one_cycle", "lm_phases", "LM_TIMING_FIELDS"]

_logger = logging.getLogger(__name__)

LRA_TASKS = ("listops", "text", "retrieval", "image", "pathfinder")


@dataclass
class LRAConfig:
    """LRA run options; the shipped YAMLs (subquad/configs/lra/<task>.yaml) override these, flags override both."""

    task: str = "listops"
    data: str = ""
    attention: str = "softmax"
    # Mechanism options, per mechanism name (only the entry of `attention` is used).
    attn_kw: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Extra options, per mechanism, for the block that sees the class token (long_short: num_prefix_tokens=1).
    cls_attn_kw: dict[str, dict[str, Any]] = field(default_factory=dict)
    encoding: str = "lra_released"
    max_len: int = 2048
    vocab_size: int = 512
    num_classes: int = 10
    dim: int = 64
    depth: int = 2
    num_heads: int = 2
    mlp_dim: int = 128
    pool: str = "cls_last"
    drop: float = 0.0
    attn_drop: float = 0.0
    batch_size: int = 32
    lr: float = 1e-4
    weight_decay: float = 0.0
    adam_eps: float = 1e-6
    steps: int = 5000
    warmup: int = 1000
    max_steps: int = 0
    eval_every: int = 50
    eval_steps: int = 62
    limit_train: int = 0
    limit_eval: int = 0
    amp: bool = False
    seed: int = 1234
    device: str = ""
    workers: int = 0
    output: str = ""
    # Token grid (H, W) of image-like tasks (Pathfinder 32x32): passed to the mechanisms as hw (2-D mechanisms).
    grid: list[int] | None = None
    # Extra options, per mechanism, for the odd-numbered blocks (window: {shift_size: w // 2}, Swin's alternation).
    odd_attn_kw: dict[str, dict[str, Any]] = field(default_factory=dict)
    # > 0: the L2ViT LCM branch x + LCM(LN(x)) after each attention (needs grid; enhanced linear attention).
    lcm_kernel_size: int = 0
    # Continue the run in `output` from its last state (last_state.pth).
    resume: bool = False
    # > 0: also write the resumable state every N steps (not only at evaluations).
    checkpoint_every: int = 0


@dataclass
class LMConfig:
    """Character-LM run options (subquad/configs/charlm/*.yaml override these, flags override both)."""

    data: str = ""
    attention: str = "long_short"
    attn_kw: dict[str, dict[str, Any]] = field(default_factory=dict)
    dim: int = 128
    depth: int = 2
    num_heads: int = 4
    # FFN width (0: 4 * dim).
    ffn_dim: int = 0
    # Dropout on each attention output and inside each FFN; emb_dropout on the embeddings and the last hidden state.
    dropout: float = 0.0
    emb_dropout: float = 0.0
    # "standard": the textbook pre-LN causal LM (final LN); "official": Transformer-LS's normalised-input residual.
    residual: str = "standard"
    seq_len: int = 256
    batch_size: int = 16
    lr: float = 1e-3
    warmup: int = 50
    weight_decay: float = 0.01
    clip_grad: float = 0.0
    max_steps: int = 1000
    max_minutes: float = 0.0
    eval_every: int = 100
    eval_ctx: int = 1024
    eval_score: int = 512
    eval_batch: int = 8
    eval_tokens: int = 32768
    final_eval_tokens: int = 0
    # False: the final evaluation scores the valid split only (test_bpc is null), for calibrating a recipe without
    # looking at the test split.
    final_test: bool = True
    # Mixed precision: autocast in training and evaluation (bfloat16, or float16 with a grad scaler on CUDA).
    amp: bool = False
    amp_dtype: str = "bfloat16"
    seed: int = 0
    device: str = ""
    output: str = ""
    # Training phases run in order, each {seq_len, batch_size, steps, lr, warmup} (lr / warmup default to the
    # top-level values): the Transformer-LS schedule trains 430k / 50k / 50k updates at 2048 / 4096 / 8192 tokens
    # (arXiv 2107.02192, App. D). Each phase warms up linearly from 0 to its lr, then holds it; the optimizer state
    # carries over unless the phase says `reset_optimizer: true` (a fresh AdamW from the previous phase's weights,
    # as the official phases 2 and 3 start with fairseq's `--finetune-from-model`). Empty: one phase of (seq_len,
    # batch_size, max_steps, lr, warmup). With phases, max_steps caps the total number of steps (0 = all of them).
    phases: list[dict[str, Any]] = field(default_factory=list)
    # Continue the run in `output` from its last state (last_state.pth).
    resume: bool = False
    # > 0: also write the resumable state every N steps (not only at evaluations).
    checkpoint_every: int = 0


_PHASE_KEYS = ("seq_len", "batch_size", "steps", "lr", "warmup", "reset_optimizer")


def lm_phases(cfg: LMConfig) -> list[dict[str, Any]]:
    """The phases of `cfg` with every key filled and checked: [{seq_len, batch_size, steps, lr, warmup, first,
    last}], `first` / `last` the global steps (1-based, inclusive) of each phase, cut at `max_steps` when > 0."""
    if not cfg.phases:
        raw = [{"seq_len": cfg.seq_len, "batch_size": cfg.batch_size, "steps": cfg.max_steps, "lr": cfg.lr,
                "warmup": cfg.warmup}]
    else:
        raw = []
        for i, ph in enumerate(cfg.phases):
            if not isinstance(ph, dict):
                raise UserError(f"LM phases[{i}] must be a mapping of {', '.join(_PHASE_KEYS)}, got {ph!r}")
            unknown = sorted(set(ph) - set(_PHASE_KEYS))
            missing = [k for k in ("seq_len", "batch_size", "steps") if k not in ph]
            if unknown or missing:
                raise UserError(f"LM phases[{i}]: unknown key(s) {unknown} / missing {missing}; allowed: "
                                f"{', '.join(_PHASE_KEYS)} (seq_len, batch_size and steps required)")
            raw.append({"lr": cfg.lr, "warmup": cfg.warmup, **ph})
    out, first = [], 1
    cap = cfg.max_steps if cfg.phases else 0
    for i, ph in enumerate(raw):
        seq_len, bs, steps, lr, warm = (int(ph["seq_len"]), int(ph["batch_size"]), int(ph["steps"]),
                                        float(ph["lr"]), int(ph["warmup"]))
        if seq_len < 2 or bs < 1 or steps < 1 or lr <= 0 or warm < 0:
            raise UserError(f"LM phase {i}: need seq_len >= 2, batch_size >= 1, steps >= 1, lr > 0, warmup >= 0; "
                            f"got {seq_len}, {bs}, {steps}, {lr}, {warm}")
        last = first + steps - 1
        if cap and first > cap:
            break
        if cap:
            last = min(last, cap)
        out.append({"seq_len": seq_len, "batch_size": bs, "steps": steps, "lr": lr, "warmup": warm,
                    "reset_optimizer": bool(ph.get("reset_optimizer", False)), "first": first, "last": last})
        first = last + 1
    return out


def _phase_lr(phases: list[dict[str, Any]], step: int) -> tuple[int, float]:
    """(phase index, lr) of global step `step` (1-based): the phase's lr * min(1, j / warmup), j its local step."""
    for i, ph in enumerate(phases):
        if step <= ph["last"]:
            j = step - ph["first"] + 1
            return i, ph["lr"] * min(1.0, j / ph["warmup"]) if ph["warmup"] else ph["lr"]
    raise AssertionError(f"step {step} after the last phase")


def _lm_batch(train: np.ndarray, rng: np.random.Generator, seq_len: int, batch_size: int) -> np.ndarray:
    """(batch_size, seq_len + 1) training windows at random starts drawn from `rng` (whose state the resume file
    keeps, as a JSON string)."""
    starts = rng.integers(0, len(train) - seq_len - 1, size=batch_size)
    return np.stack([train[s:s + seq_len + 1] for s in starts]).astype(np.int64)


def _start_or_resume(out: Path, cfg: Any, total: int, log: Callable[[str], None]):
    """(resume state or None, the results of a run that is already complete or None); a new run refuses an `out`
    that holds one."""
    if not cfg.resume:
        _refuse_existing_run(out)
        return None, None
    if not cfg.output:
        raise UserError("--resume needs the run directory (--output / --resume DIR)")
    state = _resume_state(out, cfg)
    if int(state["step"]) >= total and (out / "results.json").is_file():
        log(f"{out} is complete ({int(state['step'])} of {total} steps); nothing to resume")
        return state, read_json(out / "results.json")
    return state, None


def _refuse_existing_run(out: Path) -> None:
    """Never overwrite a previous run's checkpoints."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--output {out} exists and is not a directory")
    if any((out / f).exists() for f in ("last.safetensors", "best.safetensors")):
        raise UserError(f"--output {out} already holds a run; choose another --output (nothing was overwritten)")

def _device(name: str) -> torch.device:
    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


def one_cycle(optimizer: torch.optim.Optimizer, lr: float, total_steps: int,
              pct_start: float) -> torch.optim.lr_scheduler.OneCycleLR:
    """The official LRA schedule: OneCycleLR(max_lr=lr, pct_start, anneal_strategy='linear'), torch defaults."""
    total = max(total_steps, 2)
    # torch divides by each phase's length (pct_start * total - 1 and total - pct_start * total): keep both > 0.
    pct = min(max(pct_start, 1.5 / total), 1.0 - 0.5 / total)
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=total, pct_start=pct,
                                               anneal_strategy="linear")


def _write_args(out: Path, cfg: Any) -> None:
    write_args(out, cfg)


def _to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def build_lra_data(cfg: LRAConfig, split: str) -> Dataset:
    """Dataset of `cfg.task` for split train / val / test from `cfg.data`."""
    limit = (cfg.limit_train if split == "train" else cfg.limit_eval) or None
    if cfg.task not in LRA_TASKS:
        raise UserError(f"unknown LRA task {cfg.task!r}; allowed: {', '.join(LRA_TASKS)}")
    if not cfg.data:
        raise UserError(f"--data is required: the folder with the {cfg.task} files")
    if cfg.task == "listops":
        from ..data.lra.listops import ListOpsDataset

        return ListOpsDataset(cfg.data, split, cfg.encoding, cfg.max_len, limit=limit)
    if cfg.task == "text":
        from ..data.lra.text import TextDataset

        return TextDataset(cfg.data, split, max_len=cfg.max_len, limit=limit)
    if cfg.task == "retrieval":
        from ..data.lra.retrieval import RetrievalDataset

        return RetrievalDataset(cfg.data, split, max_len=cfg.max_len, limit=limit)
    if cfg.task == "pathfinder":
        from ..data.lra.pathfinder import PathfinderDataset

        return PathfinderDataset(cfg.data, split, limit=limit)
    from ..data.lra.image import CifarGrayDataset

    return CifarGrayDataset(cfg.data, split, limit=limit)


def build_lra_model(cfg: LRAConfig, device: torch.device | None = None) -> nn.Module:
    from ..sequence import create_sequence_model

    return create_sequence_model("lra_encoder", vocab_size=cfg.vocab_size, num_classes=cfg.num_classes,
                                 dim=cfg.dim, depth=cfg.depth, num_heads=cfg.num_heads, mlp_dim=cfg.mlp_dim,
                                 max_len=cfg.max_len, attention=cfg.attention,
                                 attn_kw=dict(cfg.attn_kw.get(cfg.attention, {})),
                                 cls_attn_kw=dict(cfg.cls_attn_kw.get(cfg.attention, {})), pool=cfg.pool, drop=cfg.drop,
                                 attn_drop=cfg.attn_drop, dual=cfg.task == "retrieval", grid=cfg.grid,
                                 lcm_kernel_size=cfg.lcm_kernel_size,
                                 odd_attn_kw=dict(cfg.odd_attn_kw.get(cfg.attention, {})), device=device)


def _lra_forward(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    if "tokens_1" in batch:
        return model(batch["tokens"], batch["mask"], batch["tokens_1"], batch["mask_1"])
    return model(batch["tokens"], batch["mask"])


@torch.no_grad()
def evaluate_lra(model: nn.Module, loader: DataLoader, device: torch.device, max_batches: int = 0,
                 amp: bool = False) -> dict[str, float]:
    """Accuracy (%) and mean cross-entropy over `loader` (the first `max_batches` batches when > 0)."""
    model.eval()
    n, loss_sum, correct = 0, 0.0, 0
    for i, batch in enumerate(loader):
        if max_batches and i >= max_batches:
            break
        batch = _to(batch, device)
        with _autocast(device, amp):
            logits = _lra_forward(model, batch)
        y = batch["label"]
        loss_sum += F.cross_entropy(logits.float(), y, reduction="sum").item()
        correct += (logits.argmax(-1) == y).sum().item()
        n += len(y)
    return {"loss": loss_sum / max(n, 1), "acc": 100.0 * correct / max(n, 1), "samples": n}


def _autocast(device: torch.device, amp: bool):
    if amp and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.float16)
    return contextlib.nullcontext()


def _train_batches(n: int, batch_size: int, seed: int, first_step: int) -> Iterator[list[int]]:
    """Index batches of training steps first_step + 1, first_step + 2, ...: the order of epoch e is a permutation
    drawn from (seed, e) (GlobalBatchSampler), `n // batch_size` full batches per epoch, so step s's batch is a
    function of (seed, s) alone and a resumed run needs no iterator state."""
    from .distributed import GlobalBatchSampler

    per_epoch = n // batch_size
    sampler = GlobalBatchSampler(n, batch_size, shuffle=True, seed=seed, drop_last=True)
    epoch, j = divmod(first_step, per_epoch)
    while True:
        sampler.set_epoch(epoch)
        order = list(sampler)
        for k in range(j, per_epoch):
            yield order[k * batch_size:(k + 1) * batch_size]
        epoch, j = epoch + 1, 0


# results.json / summary.csv fields that measure time or memory (they differ between an uninterrupted and a resumed
# run; everything else is identical).
LRA_TIMING_FIELDS = ("time", "sec_per_step", "train_seconds", "train_cpu_seconds", "eval_seconds",
                     "eval_cpu_seconds", "test_seconds", "test_cpu_seconds", "wall_seconds", "peak_mem_mb")


def _resume_state(out: Path, cfg: LRAConfig | LMConfig) -> dict[str, Any]:
    from .checkpoint import load_state

    for f in ("last_state.pth", "args.yaml"):
        if not (out / f).is_file():
            raise UserError(f"--resume {out}: {f} is missing (the run saved no evaluation to resume from)")
    saved = yaml.safe_load((out / "args.yaml").read_text()) or {}
    mine = asdict(cfg)
    changed = sorted(k for k in mine if k not in ("resume", "device", "workers", "output", "max_minutes",
                                                  "checkpoint_every")
                     and k in saved and saved[k] != mine[k])
    if changed:
        raise UserError(f"--resume {out}: the run was started with other settings ({', '.join(changed)}); resume "
                        "it with its own args.yaml")
    return load_state(out / "last_state.pth")


def train_lra(cfg: LRAConfig, log: Callable[[str], None] | None = None,
              on_eval: Callable[[dict[str, Any]], None] | None = None,
              on_update: Callable[[Position], None] | None = None) -> dict[str, Any]:
    """Train the LRA classifier of `cfg`; returns the final metrics and paths (also written to results.json).

    Every evaluation writes `last.safetensors` (+ `best.safetensors` on a better dev accuracy), `summary.csv` and
    `last_state.pth` (model, optimizer, OneCycle scheduler, grad scaler, step, best so far, RNG; tensors and plain
    containers, read back with `torch.load(weights_only=True)`), each atomically, the state last; `checkpoint_every`
    > 0 also writes the state every N steps, and SIGTERM / SIGINT write it and stop (`loop.Preempted`). Step s
    trains on a batch fixed by (seed, s) and every RNG is re-seeded from (seed, s) after the evaluation at step s,
    so `cfg.resume=True` (same `output`) continues from the last state and ends with the same weights, summary.csv
    and results.json as an uninterrupted run (except the timing and memory fields, `LRA_TIMING_FIELDS`). Resuming a
    finished run returns its results.json.

    `on_eval(row)` is called after each evaluation, once its files are written, with the summary.csv row (step,
    train_loss, train_acc, eval_loss, eval_acc, lr, ...) plus `steps`; an exception there stops the run with
    those files intact (resumable). `on_update(position)` follows every step (tests).
    """
    log = log or _logger.info
    rss_start = rss_mb()  # before data and model: the baseline of peak_mem_mb, as the image trainer's
    torch.manual_seed(cfg.seed)
    device = _device(cfg.device)
    steps = cfg.max_steps or cfg.steps
    if steps < 1 or cfg.batch_size < 1 or cfg.eval_every < 1:
        raise UserError(f"--max-steps, --batch-size and --eval-every must be >= 1, got {steps}, {cfg.batch_size}, "
                        f"{cfg.eval_every}")
    out = Path(cfg.output or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-lra-{cfg.task}-{cfg.attention}")
    state, done = _start_or_resume(out, cfg, steps, log)
    if done is not None:
        return done
    sets = {s: build_lra_data(cfg, s) for s in ("train", "val", "test")}
    if len(sets["train"]) < cfg.batch_size:
        raise UserError(f"the {cfg.task} training split has {len(sets['train'])} examples, fewer than one batch of "
                        f"{cfg.batch_size}")
    model = build_lra_model(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.999), eps=cfg.adam_eps,
                                  weight_decay=cfg.weight_decay)
    # The recipe's warm-up fraction is kept when --max-steps scales the budget down.
    scheduler = one_cycle(optimizer, cfg.lr, steps, cfg.warmup / max(cfg.steps, 1))
    out.mkdir(parents=True, exist_ok=True)
    loop = Loop(model=model, optimizer=optimizer, precision=Precision(device, cfg.amp, "float16", cpu=False),
                state_path=out / "last_state.pth", info=DistInfo(device=device), checkpoint_every=cfg.checkpoint_every,
                sync_cuda=True)
    task = _LRATask(cfg, loop, scheduler, sets, steps, out, log, on_eval, on_update)
    if state is not None:
        task.load(state)
        loop.load_state_dict(state, Position(**state["position"]) if "position" in state else
                             Position(0, int(state["step"]), int(state["step"])))
        log(f"resuming {out} after step {loop.pos.step} of {steps}")
    else:
        _write_args(out, cfg)
    log(f"lra {cfg.task}: attention={cfg.attention} params={task.n_params} train={len(sets['train'])} "
        f"val={len(sets['val'])} test={len(sets['test'])} steps={steps} batch={cfg.batch_size} device={device}")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    task.wall0 = time.perf_counter() - task.tot["wall_seconds"]
    loop.fit(task)
    return _lra_results(cfg, task, device, rss_start)


class _StepTask(TrainTask):
    """What the LRA and LM trainers share in the loop: one stream of steps, totals carried across resumes, a
    summary.csv row and run files at each evaluation (every `eval_every` steps and the last), then the state and
    `on_eval`; the torch RNG re-seeded from (seed, step) after each evaluation."""

    ARCH = ""
    COUNTER = ""  # the evaluated-items total: eval_samples / eval_tokens

    def __init__(self, cfg: Any, loop: Loop, total: int, out: Path, log: Callable[[str], None],
                 on_eval: Callable | None, on_update: Callable | None) -> None:
        self.cfg, self.loop, self.total_steps, self.out, self.log = cfg, loop, total, out, log
        self.on_eval, self.on_update = on_eval, on_update
        self.model, self.device = loop.model, loop.info.device
        self.n_params = sum(p.numel() for p in self.model.parameters())
        # Totals over the whole run (carried across resumes): training time (wall and CPU), evaluation time / items.
        self.tot = {"train_seconds": 0.0, "train_cpu_seconds": 0.0, "eval_seconds": 0.0, "eval_cpu_seconds": 0.0,
                    self.COUNTER: 0, "wall_seconds": 0.0}
        self.rows: list[dict[str, Any]] = []
        self.sums = self.zero_sums()
        self.wall0 = self.t_start = time.perf_counter()
        self.out_of_time = False

    def zero_sums(self) -> dict[str, Any]:
        """The metric sums of one evaluation interval."""
        raise NotImplementedError

    def load(self, state: dict[str, Any]) -> None:
        self.tot.update({k: type(self.tot[k])(v) for k, v in state["totals"].items() if k in self.tot})
        self.sums.update(state.get("sums", {}))
        # (A state written before the first evaluation has no summary.csv yet.)
        self.rows = [r for r in read_csv(self.out / "summary.csv") if int(r["step"]) <= int(state["step"])]

    def state_dict(self) -> dict[str, Any]:
        self.tot["wall_seconds"] = time.perf_counter() - self.wall0
        return {"step": self.loop.pos.step, "totals": dict(self.tot), "arch": self.ARCH, "sums": dict(self.sums)}

    def start_epoch(self, epoch: int, fresh: bool) -> None:
        if fresh:
            seed_everything(step_seed(self.cfg.seed, 0))
        self.t_start = time.perf_counter()
        self.model.train()

    def check_loss(self, loss: torch.Tensor, pos: Position) -> None:
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"non-finite training loss at step {pos.step + 1}")

    def after_update(self, pos: Position) -> bool:
        if self.on_update is not None:
            self.on_update(pos)
        if not (pos.step % self.cfg.eval_every == 0 or pos.step == self.total_steps or self.out_of_time):
            return False
        t_ev, c_ev = time.perf_counter(), time.process_time()
        ev = self.evaluate()
        self.tot["eval_seconds"] += time.perf_counter() - t_ev
        self.tot["eval_cpu_seconds"] += time.process_time() - c_ev
        self.tot[self.COUNTER] += int(ev["n"])
        self.model.train()
        self.row, sidecar, better = self.record(pos.step, ev)
        self.rows.append(self.row)
        if self.loop.info.is_main:  # DDP: rank 0 writes the files
            for tag in ("last", "best") if better else ("last",):
                save_weights(self.model, self.out / f"{tag}.safetensors", {"arch": self.ARCH, "step": str(pos.step)})
                write_json(sidecar, self.out / f"{tag}.json")
            write_csv(self.out / "summary.csv", self.rows)
        self.sums = self.zero_sums()
        # The next interval's draws depend on (seed, step) only; the state file is the resume point.
        seed_everything(step_seed(self.cfg.seed, pos.step))
        return True

    def evaluate(self) -> dict[str, Any]:
        """The periodic evaluation ({..., "n": items scored})."""
        raise NotImplementedError

    def record(self, step: int, ev: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], bool]:
        """(summary row, sidecar, better than the best so far) of the evaluation at `step`; logs it."""
        raise NotImplementedError

    def after_save(self, pos: Position) -> None:
        if self.on_eval is not None:
            self.on_eval({**self.row, "steps": self.total_steps})


class _LRATask(_StepTask):
    """LRA classification: seeded batches (`_train_batches`), OneCycle per step, the dev split scored."""

    ARCH, COUNTER = "lra_encoder", "eval_samples"

    def __init__(self, cfg: LRAConfig, loop: Loop, scheduler: Any, sets: dict[str, Dataset], steps: int, out: Path,
                 log: Callable[[str], None], on_eval: Callable | None, on_update: Callable | None) -> None:
        super().__init__(cfg, loop, steps, out, log, on_eval, on_update)
        self.scheduler, self.sets = scheduler, sets
        self.val_loader = DataLoader(sets["val"], cfg.batch_size, shuffle=False, num_workers=cfg.workers)
        self.best_acc, self.best_step = -1.0, -1
        self.meta = {"arch": "lra_encoder", "task": cfg.task, "attention": cfg.attention, "encoding": cfg.encoding,
                     "args": asdict(cfg)}

    def zero_sums(self) -> dict[str, Any]:
        return {"time": 0.0, "loss_sum": 0.0, "acc_sum": 0.0, "k": 0}

    def load(self, state: dict[str, Any]) -> None:
        super().load(state)
        self.scheduler.load_state_dict(state["scheduler"])
        self.best_acc, self.best_step = float(state["best_acc"]), int(state["best_step"])

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "best_acc": self.best_acc, "best_step": self.best_step,
                "scheduler": self.scheduler.state_dict()}

    def batches(self, epoch: int, skip: int) -> DataLoader:
        # The loader's own generator keeps DataLoader from drawing on the global RNG (it would shift dropout draws).
        cfg = self.cfg
        return DataLoader(self.sets["train"], batch_sampler=_train_batches(len(self.sets["train"]), cfg.batch_size,
                                                                           cfg.seed, skip),
                          num_workers=cfg.workers, generator=torch.Generator().manual_seed(cfg.seed))

    def before_update(self, pos: Position) -> None:
        self.lr_used = self.loop.optimizer.param_groups[0]["lr"]

    def prepare(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return _to(batch, self.device)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        self.logits, self.label = _lra_forward(self.model, batch), batch["label"]
        return F.cross_entropy(self.logits.float(), batch["label"])

    def after_batch(self, pos: Position, loss: torch.Tensor, batch: Any, seconds: float, cpu: float) -> None:
        self.tot["train_cpu_seconds"] += cpu
        self.tot["train_seconds"] += seconds
        s = self.sums
        s["time"] += seconds
        s["loss_sum"] += loss.item()
        s["acc_sum"] += (self.logits.argmax(-1) == self.label).float().mean().item() * 100
        s["k"] += 1

    def after_update(self, pos: Position) -> bool:
        self.scheduler.step()
        return super().after_update(pos)

    def evaluate(self) -> dict[str, Any]:
        ev = evaluate_lra(self.model, self.val_loader, self.device, self.cfg.eval_steps, self.cfg.amp)
        return {**ev, "n": ev["samples"]}

    def record(self, step: int, ev: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], bool]:
        s = self.sums
        row = {"step": step, "train_loss": s["loss_sum"] / s["k"], "train_acc": s["acc_sum"] / s["k"],
               "eval_loss": ev["loss"], "eval_acc": ev["acc"], "lr": self.lr_used, "time": s["time"],
               "sec_per_step": s["time"] / s["k"]}
        self.log(f"step {step}/{self.total_steps}  train_loss {row['train_loss']:.4f}  train_acc "
                 f"{row['train_acc']:.2f}  val_loss {ev['loss']:.4f}  val_acc {ev['acc']:.2f}  "
                 f"{row['sec_per_step']:.3f}s/step")
        sidecar = {**self.meta, "step": step, "metrics": {"eval_acc": ev["acc"], "eval_loss": ev["loss"]}}
        better = ev["acc"] > self.best_acc
        if better:
            self.best_acc, self.best_step = ev["acc"], step
        return row, sidecar, better


def _lra_results(cfg: LRAConfig, task: _LRATask, device: torch.device, rss_start: float) -> dict[str, Any]:
    """Score the best checkpoint once on the test split; results.json."""
    from safetensors.torch import load_file

    model, tot, steps = task.model, task.tot, task.total_steps
    model.load_state_dict(load_file(task.out / "best.safetensors"))
    test_loader = DataLoader(task.sets["test"], cfg.batch_size, shuffle=False, num_workers=cfg.workers)
    t_test, c_test = time.perf_counter(), time.process_time()
    test = evaluate_lra(model, test_loader, device, 0, cfg.amp)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    tot["test_seconds"] = time.perf_counter() - t_test
    tot["test_cpu_seconds"] = time.process_time() - c_test
    # Peak memory from before the data and model were built to the end of the test pass (as the image trainer).
    peak = peak_memory_mb(device, rss_start)
    tot["wall_seconds"] = time.perf_counter() - task.wall0
    results = {"task": cfg.task, "attention": cfg.attention, "encoding": cfg.encoding if cfg.task == "listops"
               else "", "steps": steps, "batch_size": cfg.batch_size, "params": task.n_params,
               "best_val_acc": task.best_acc, "best_step": task.best_step, "test_acc": test["acc"],
               "test_loss": test["loss"], "test_samples": test["samples"],
               "sec_per_step": tot["train_seconds"] / steps, "train_examples": steps * cfg.batch_size, **tot,
               "peak_mem_mb": peak, "peak_mem_kind": "cuda_max_allocated" if device.type == "cuda"
               else "cpu_peak_rss_growth", "device": str(device), "torch": torch.__version__,
               "output": os.fspath(task.out), "checkpoint": os.fspath(task.out / "best.safetensors")}
    write_json(results, task.out / "results.json")
    return results


def lm_model_args(vocab_size: int, cfg: LMConfig) -> dict[str, Any]:
    """The keyword arguments of the `CharLM` that `build_lm` makes (also stored in checkpoint sidecars)."""
    return {"vocab_size": vocab_size, "dim": cfg.dim, "depth": cfg.depth, "num_heads": cfg.num_heads,
            "attention": cfg.attention, "ffn_dim": cfg.ffn_dim, "dropout": cfg.dropout,
            "emb_dropout": cfg.emb_dropout, "residual": cfg.residual,
            "attn_kw": dict(cfg.attn_kw.get(cfg.attention, {}))}


def build_lm(vocab_size: int, cfg: LMConfig, device: torch.device | None = None) -> nn.Module:
    """The character LM of `cfg`: `subquad.sequence.CharLM` with its width, depth, heads, FFN width (`ffn_dim`,
    0 = 4 d), dropout, residual form and the mechanism `attention` with `attn_kw[attention]`. Bad values are a
    UserError naming them."""
    from ..sequence.char_lm import CharLM

    if cfg.residual not in ("standard", "official"):
        raise UserError(f"LM residual must be 'standard' or 'official', got {cfg.residual!r}")
    for name in ("dropout", "emb_dropout"):
        if not 0.0 <= getattr(cfg, name) < 1.0:
            raise UserError(f"LM {name} must be in [0, 1), got {getattr(cfg, name)}")
    if cfg.ffn_dim < 0:
        raise UserError(f"LM ffn_dim must be >= 0 (0 = 4 * dim), got {cfg.ffn_dim}")
    a = lm_model_args(vocab_size, cfg)
    try:
        return CharLM(vocab_size, a["dim"], a["depth"], a["num_heads"], attention=a["attention"],
                      ffn_dim=a["ffn_dim"] or None, dropout=a["dropout"], emb_dropout=a["emb_dropout"],
                      residual=a["residual"], device=device, **a["attn_kw"])
    except ValueError as e:
        raise UserError(str(e).splitlines()[0]) from None


def _lm_logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return out[0] if isinstance(out, tuple) else out


@torch.no_grad()
def evaluate_bpc(model: nn.Module, data: np.ndarray, ctx: int, score: int, batch_size: int = 8,
                 max_tokens: int = 0, device: torch.device | None = None,
                 amp: Callable[[], contextlib.AbstractContextManager] | None = None) -> dict[str, float]:
    """Bits per character with sliding windows: context `ctx`, each window scores only its last `score` targets.

    The first window scores all of its targets; every later window advances by `score` tokens, so every target
    (data[1:]) is scored exactly once and, except in the first window, with at least ctx - score tokens of context
    (the paper's protocol: next 512 given the previous ones).

    `amp`: the autocast context of the forward (the log-softmax is taken in float32).

    Shapes: data (N,) uint8 ids.
    Returns: {"bpc", "nll" (nats per char), "tokens"}.
    """
    if ctx < 1 or not 1 <= score <= ctx:
        raise UserError(f"need ctx >= 1 and 1 <= score <= ctx, got ctx={ctx} and score={score}")
    device = device or next(model.parameters()).device
    model.eval()
    n = len(data)
    if n < 2:
        raise UserError(f"evaluation split has {n} tokens; need at least 2")
    last = n - 1
    if max_tokens:
        last = min(last, max_tokens)
    # Window k has inputs data[e - L : e] and targets data[e - L + 1 : e + 1]; it scores targets (prev_e, e].
    L = min(ctx, last)
    ends, scored, prev = [], [], 0
    e = L
    while prev < last:
        e = min(e, last)
        ends.append(e)
        scored.append(e - prev)
        prev = e
        e += score
    nll_sum, count = 0.0, 0
    for i in range(0, len(ends), batch_size):
        es, ss = ends[i:i + batch_size], scored[i:i + batch_size]
        x = torch.from_numpy(np.stack([data[e - L:e] for e in es]).astype(np.int64)).to(device)
        y = torch.from_numpy(np.stack([data[e - L + 1:e + 1] for e in es]).astype(np.int64)).to(device)
        with amp() if amp else contextlib.nullcontext():
            logits = _lm_logits(model, x)
        logp = F.log_softmax(logits.float(), dim=-1)
        nll = -logp.gather(-1, y[..., None])[..., 0]  # (b, L)
        keep = torch.arange(L, device=device)[None] >= (L - torch.tensor(ss, device=device))[:, None]
        nll_sum += nll[keep].sum().item()
        count += int(keep.sum().item())
    nats = nll_sum / max(count, 1)
    return {"bpc": nats / math.log(2), "nll": nats, "tokens": count}


def _load_split(root: Path, split: str) -> np.ndarray:
    from ..data.char import load_split

    return load_split(root, split)


# results.json / summary.csv fields of the LM run that measure time or memory (they differ between an uninterrupted
# and a resumed run; everything else is identical).
LM_TIMING_FIELDS = ("elapsed", "train_seconds", "train_cpu_seconds", "eval_seconds", "eval_cpu_seconds",
                    "wall_seconds", "peak_mem_mb")


def train_lm(cfg: LMConfig, log: Callable[[str], None] | None = None,
             model_fn: Callable[[int, LMConfig], nn.Module] | None = None,
             on_eval: Callable[[dict[str, Any]], None] | None = None,
             on_update: Callable[[Position], None] | None = None) -> dict[str, Any]:
    """Train the character LM on `cfg.data`: a prepared corpus (`subquad lm prepare`) or `enwik8:PATH` /
    `text8:PATH` (`subquad.data.char.read_standard`); returns metrics and paths.

    The phases of `cfg` (`lm_phases`) run in order, each with its sequence length, batch and warmed-up fixed lr.
    Every `eval_every` steps (and at the last step) the valid split (its first `eval_tokens` targets) is scored,
    `best.safetensors` keeps the weights of the lowest valid bpc and `last_state.pth` (model, optimizer, step, best
    so far, totals, RNG) is written, each atomically, the state last; `checkpoint_every` > 0 also writes the state
    every N steps, and SIGTERM / SIGINT write it and stop (`loop.Preempted`). Step s trains on windows drawn from
    the sampler RNG the state keeps and the torch RNG is re-seeded from (seed, s) after the evaluation at step s, so
    `cfg.resume=True` (same `output`) continues from the last state and ends with the same weights, summary.csv and
    results.json as an uninterrupted run (except `LM_TIMING_FIELDS`). At the end the best checkpoint is scored once
    on valid and test (`final_eval_tokens`, 0 = whole splits). `on_eval(row)` follows each periodic evaluation, its
    files written, with the summary.csv row plus `steps`; an exception there stops the run with those files intact.
    `on_update(position)` follows every step (tests).

    `cfg.amp`: autocast (`amp_dtype` bfloat16 or float16; a grad scaler for float16 on CUDA) in training and
    evaluation. Under torchrun (`torchrun --nproc_per_node N -m subquad lm train ...`; gloo on CPU, nccl on CUDA)
    each step draws one global batch of N * batch_size windows from the sampler RNG, exactly the draw of one process
    with batch N * batch_size, and rank r trains on slice r of it in a DistributedDataParallel model; the train loss
    is averaged over ranks, every rank scores the same evaluation windows (so the results equal one process's) and
    rank 0 alone writes files.
    """
    info = init_distributed(cfg.device)
    if not info.enabled:  # one process: the device as named (results.json records it)
        info = DistInfo(device=_device(cfg.device))
    if not info.is_main:
        log = lambda line: None  # noqa: E731
    try:
        return _train_lm(cfg, info, log, model_fn, on_eval, on_update)
    finally:
        cleanup(info)


def _train_lm(cfg: LMConfig, info: DistInfo, log: Callable[[str], None] | None,
              model_fn: Callable[[int, LMConfig], nn.Module] | None, on_eval: Callable[[dict[str, Any]], None] | None,
              on_update: Callable[[Position], None] | None) -> dict[str, Any]:
    from ..data.char import open_corpus

    log = log or _logger.info
    torch.manual_seed(cfg.seed)
    device = info.device
    if cfg.amp_dtype not in ("bfloat16", "float16"):
        raise UserError(f"--amp-dtype must be bfloat16 or float16, got {cfg.amp_dtype!r}")
    if cfg.amp and cfg.amp_dtype == "float16" and device.type == "cpu":
        _logger.warning("--amp-dtype float16 on CPU is slow and has no grad scaler; bfloat16 is the usual choice")
    if cfg.eval_every < 1:
        raise UserError(f"--eval-every must be >= 1, got {cfg.eval_every}")
    if not cfg.phases and (cfg.max_steps < 1 or cfg.batch_size < 1 or cfg.seq_len < 2):
        raise UserError(f"need --max-steps >= 1, --batch-size >= 1, --seq-len >= 2; got {cfg.max_steps}, "
                        f"{cfg.batch_size}, {cfg.seq_len}")
    phases = lm_phases(cfg)
    total = phases[-1]["last"]
    meta, data = open_corpus(cfg.data)
    if len(data["train"]) <= max(ph["seq_len"] for ph in phases) + 1:
        raise UserError(f"training split has {len(data['train'])} tokens; need more than the sequence length + 1 = "
                        f"{max(ph['seq_len'] for ph in phases) + 1}")
    out = Path(cfg.output or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-lm-{cfg.attention}")
    state, done = _start_or_resume(out, cfg, total, log)
    barrier(info)  # every rank has checked `out` before rank 0 writes into it
    if done is not None:
        return done
    model = (model_fn or build_lm)(int(meta["vocab_size"]), cfg).to(device)
    fwd: nn.Module = model
    if info.enabled:
        fwd = nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=phases[0]["lr"], weight_decay=cfg.weight_decay)
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
    clip = (lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)) if cfg.clip_grad > 0 else None
    loop = Loop(model=model, optimizer=optimizer, precision=Precision(device, cfg.amp, cfg.amp_dtype),
                state_path=out / "last_state.pth", info=info, clip=clip, checkpoint_every=cfg.checkpoint_every,
                sync_cuda=True)
    task = _LMTask(cfg, loop, phases, meta, data, out, log, on_eval, on_update)
    task.fwd = fwd
    if state is not None:
        task.load(loop.for_rank(state))
        loop.load_state_dict(state, Position(**state["position"]) if "position" in state else
                             Position(0, int(state["step"]), int(state["step"])))
        log(f"resuming {out} after step {loop.pos.step} of {total}")
    elif info.is_main:
        _write_args(out, cfg)
    note = " (not comparable to enwik8/text8)" if meta.get("name") not in ("enwik8", "text8") else ""
    log(f"lm: attention={cfg.attention} params={task.n_params} vocab={meta['vocab_size']} "
        f"train_tokens={len(data['train'])} "
        f"phases={[(p['seq_len'], p['batch_size'], p['last'] - p['first'] + 1) for p in phases]} device={device} "
        + (f"ranks={info.world_size} " if info.enabled else "") + (f"amp={cfg.amp_dtype} " if cfg.amp else "")
        + f"(corpus {meta.get('name', '?')}{note})")
    task.wall0 = time.perf_counter() - task.tot["wall_seconds"]
    loop.fit(task)
    return _lm_results(cfg, task, loop.pos.step, device)


class _LMTask(_StepTask):
    """The character LM: one endless stream of random windows, the phase schedule before each step, the valid split
    scored (bits per character)."""

    ARCH, COUNTER = "char_lm", "eval_tokens"

    def __init__(self, cfg: LMConfig, loop: Loop, phases: list[dict[str, Any]], meta: dict[str, Any],
                 data: dict[str, np.ndarray], out: Path, log: Callable[[str], None],
                 on_eval: Callable | None, on_update: Callable | None) -> None:
        super().__init__(cfg, loop, phases[-1]["last"], out, log, on_eval, on_update)
        self.phases, self.meta, self.data = phases, meta, data
        model_args = lm_model_args(int(meta["vocab_size"]), cfg)
        self.side = {"arch": "char_lm", "model_args": model_args, "corpus": meta.get("name", ""),
                     "variant": meta.get("variant", ""), "vocab": meta.get("vocab"), "args": asdict(cfg)}
        self.rss0 = rss_mb()
        self.best_bpc, self.best_step = float("inf"), 0
        self.rng = np.random.default_rng(cfg.seed)
        self.fwd: nn.Module = self.model  # the training forward (DistributedDataParallel under torchrun)

    def zero_sums(self) -> dict[str, Any]:
        return {"loss_sum": 0.0, "k": 0}

    def load(self, state: dict[str, Any]) -> None:
        super().load(state)
        self.rng.bit_generator.state = json.loads(state["sampler"])
        self.best_bpc, self.best_step = float(state["best_bpc"]), int(state["best_step"])

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "best_bpc": self.best_bpc, "best_step": self.best_step,
                "sampler": json.dumps(self.rng.bit_generator.state)}

    def batches(self, epoch: int, skip: int) -> Iterator[torch.Tensor]:
        for step in itertools.count(skip + 1):
            ph = self.phases[_phase_lr(self.phases, step)[0]]
            b, info = ph["batch_size"], self.loop.info
            # One global batch (the draw of one process with batch world * b); rank r takes slice r.
            xy = _lm_batch(self.data["train"], self.rng, ph["seq_len"], b * info.world_size)
            if info.enabled:
                xy = xy[info.rank * b:(info.rank + 1) * b]
            yield torch.from_numpy(xy).to(self.device)

    def before_update(self, pos: Position) -> None:
        step = pos.step + 1
        self.pi, self.lr = _phase_lr(self.phases, step)
        ph = self.phases[self.pi]
        if step == ph["first"] and len(self.phases) > 1:
            self.log(f"phase {self.pi + 1}/{len(self.phases)}: seq_len {ph['seq_len']}, batch {ph['batch_size']}, "
                     f"steps {ph['first']}-{ph['last']}, lr {ph['lr']:g} after {ph['warmup']} warm-up steps"
                     + (", fresh optimizer" if ph["reset_optimizer"] else ""))
        if step == ph["first"] and ph["reset_optimizer"]:
            self.loop.optimizer = torch.optim.AdamW(self.model.parameters(), lr=ph["lr"],
                                                    weight_decay=self.cfg.weight_decay)
        for g in self.loop.optimizer.param_groups:
            g["lr"] = self.lr

    def loss(self, xy: torch.Tensor) -> torch.Tensor:
        logits = _lm_logits(self.fwd, xy[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), xy[:, 1:].reshape(-1))

    def after_batch(self, pos: Position, loss: torch.Tensor, batch: Any, seconds: float, cpu: float) -> None:
        self.tot["train_seconds"] += seconds
        self.tot["train_cpu_seconds"] += cpu
        self.sums["loss_sum"] += loss.item()
        self.sums["k"] += 1

    def after_update(self, pos: Position) -> bool:
        cfg = self.cfg
        self.out_of_time = cfg.max_minutes > 0 and time.perf_counter() - self.t_start > cfg.max_minutes * 60.0
        if cfg.max_minutes > 0 and self.loop.info.enabled:  # DDP: every rank stops at the same step
            self.out_of_time = all_reduce_sum([float(self.out_of_time)], self.loop.info)[0] > 0
        return super().after_update(pos)

    def should_stop(self, pos: Position) -> bool:
        if self.out_of_time:
            self.log(f"time budget of {self.cfg.max_minutes} min reached at step {pos.step}")
        return self.out_of_time

    def evaluate(self) -> dict[str, Any]:
        cfg = self.cfg
        # Every rank scores the same windows with the same weights: the result of one process.
        ev = evaluate_bpc(self.model, self.data["valid"], cfg.eval_ctx, cfg.eval_score, cfg.eval_batch,
                          cfg.eval_tokens, self.device, self.loop.precision.autocast)
        return {**ev, "n": ev["tokens"]}

    def record(self, step: int, ev: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], bool]:
        loss_sum, k = self.sums["loss_sum"], self.sums["k"]
        info = self.loop.info
        if info.enabled:  # each rank's loss is the mean over its equal slice: average the ranks
            loss_sum = all_reduce_sum([loss_sum], info)[0] / info.world_size
        ph = self.phases[self.pi]
        row = {"step": step, "phase": self.pi + 1, "seq_len": ph["seq_len"], "train_loss": loss_sum / k,
               "train_bpc": loss_sum / k / math.log(2), "valid_bpc": ev["bpc"], "valid_tokens": ev["tokens"],
               "lr": self.lr, "elapsed": time.perf_counter() - self.wall0}
        self.log(f"step {step}  train_bpc {row['train_bpc']:.3f}  valid_bpc {ev['bpc']:.3f}  ({row['elapsed']:.0f}s)")
        sidecar = {**self.side, "step": step, "metrics": {"valid_bpc": ev["bpc"]}}
        better = ev["bpc"] < self.best_bpc
        if better:
            self.best_bpc, self.best_step = ev["bpc"], step
        return row, sidecar, better


def _lm_results(cfg: LMConfig, task: _LMTask, step: int, device: torch.device) -> dict[str, Any]:
    """Score the best checkpoint once on valid (and test unless `final_test` is off); results.json."""
    from safetensors.torch import load_file

    model, meta, phases, tot = task.model, task.meta, task.phases, task.tot
    info, amp = task.loop.info, task.loop.precision.autocast
    peak = peak_memory_mb(device, task.rss0)
    barrier(info)  # rank 0 has written best.safetensors
    model.load_state_dict(load_file(task.out / "best.safetensors"))
    ft = cfg.final_eval_tokens
    v = evaluate_bpc(model, task.data["valid"], cfg.eval_ctx, cfg.eval_score, cfg.eval_batch, ft, device, amp)
    t = (evaluate_bpc(model, task.data["test"], cfg.eval_ctx, cfg.eval_score, cfg.eval_batch, ft, device, amp)
         if cfg.final_test else {"bpc": None, "tokens": 0})
    metric = "bpc" if meta.get("variant") == "chars" else "bpb"
    train_tokens = sum((min(step, p["last"]) - p["first"] + 1) * p["batch_size"] * info.world_size * p["seq_len"]
                       for p in phases if step >= p["first"])
    tot["wall_seconds"] = time.perf_counter() - task.wall0
    results = {"corpus": meta.get("name", ""), "variant": meta.get("variant", ""), "metric": metric,
               "attention": cfg.attention, "params": task.n_params, "steps": step, "valid_bpc": v["bpc"],
               "test_bpc": t["bpc"], "valid_tokens": v["tokens"], "test_tokens": t["tokens"],
               "eval_ctx": cfg.eval_ctx, "eval_score": cfg.eval_score, "best_step": task.best_step,
               "best_periodic_valid_bpc": task.best_bpc, "selected_on": "valid", "train_tokens": train_tokens, **tot,
               "peak_mem_mb": peak,
               "peak_mem_kind": "cuda_max_allocated" if device.type == "cuda" else "cpu_peak_rss_growth",
               "device": str(device), "output": os.fspath(task.out),
               "checkpoint": os.fspath(task.out / "best.safetensors")}
    if info.is_main:
        write_json(results, task.out / "results.json")
    return results


def load_lm(checkpoint: str | os.PathLike, device: torch.device | None = None,
            model_fn: Callable[[int, LMConfig], nn.Module] | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild a character LM from `<name>.safetensors` + its JSON sidecar; returns (model in eval mode, sidecar)."""
    from safetensors.torch import load_file

    path = Path(checkpoint)
    if path.is_dir():
        path = path / "best.safetensors"
    side_path = path.with_suffix(".json")
    if not path.is_file() or not side_path.is_file():
        raise UserError(f"checkpoint {path} (with its sidecar {side_path.name}) not found; pass a run directory or "
                        "a .safetensors file written by `subquad lm train`")
    side = read_json(side_path)
    if side.get("arch") != "char_lm":
        raise UserError(f"{path} is not a character-LM checkpoint (arch {side.get('arch')!r})")
    ma = side["model_args"]
    # Sidecars written before ffn_dim / dropout / residual were recorded: CharLM's defaults then (4 d, 0, official).
    cfg = LMConfig(dim=ma["dim"], depth=ma["depth"], num_heads=ma["num_heads"], attention=ma["attention"],
                   attn_kw={ma["attention"]: ma.get("attn_kw", {})}, ffn_dim=int(ma.get("ffn_dim", 0)),
                   dropout=float(ma.get("dropout", 0.0)), emb_dropout=float(ma.get("emb_dropout", 0.0)),
                   residual=ma.get("residual", "official"))
    model = (model_fn or build_lm)(int(ma["vocab_size"]), cfg)
    from .legacy import remap_legacy

    model.load_state_dict(remap_legacy(load_file(path), model))
    model.to(device or torch.device("cpu")).eval()
    return model, side
