"""LRA classification (accuracy): the Transformer-LS / Nystromformer recipe (`train_lra`).

AdamW (betas 0.9 / 0.999, eps 1e-6), `OneCycleLR` with max_lr = lr, pct_start = warmup / steps, linear annealing and
torch's defaults (div_factor 25, final_div_factor 1e4, cycle_momentum=True), a fixed step budget, the dev split
evaluated every `eval_every` steps on `eval_steps` batches, the best-dev weights kept and the test split scored once
with them. The run directory is the image trainer's (`args.yaml`, `summary.csv`, `last.safetensors` /
`best.safetensors` with JSON sidecars, `results.json`); `last_state.pth` is written at every evaluation, every
`checkpoint_every` steps and on SIGTERM / SIGINT, and `resume=True` (`--resume DIR`) continues from it exactly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from subquad_cli.runconfig import LRAConfig

from ..bench.memory import peak_memory_mb, rss_mb
from ..errors import UserError
from .checkpoint import write_json
from .distributed import DistInfo
from .loop import Loop, Position, Precision
from .steps import _device, _start_or_resume, _StepTask, _write_args

__all__ = ["LRAConfig", "LRA_TASKS", "LRA_TIMING_FIELDS", "train_lra", "evaluate_lra", "build_lra_data",
           "build_lra_model", "one_cycle"]

_logger = logging.getLogger(__name__)

LRA_TASKS = ("listops", "text", "retrieval", "image", "pathfinder")


def one_cycle(optimizer: torch.optim.Optimizer, lr: float, total_steps: int,
              pct_start: float) -> torch.optim.lr_scheduler.OneCycleLR:
    """The official LRA schedule: OneCycleLR(max_lr=lr, pct_start, anneal_strategy='linear'), torch defaults."""
    total = max(total_steps, 2)
    # torch divides by each phase's length (pct_start * total - 1 and total - pct_start * total): keep both > 0.
    pct = min(max(pct_start, 1.5 / total), 1.0 - 0.5 / total)
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=total, pct_start=pct,
                                               anneal_strategy="linear")


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


def _max_len_note(max_len: int, sets: dict[str, Dataset]) -> str | None:
    """One line saying how many examples of each split `max_len` cuts (the datasets with `lengths()`: ListOps, Text,
    Retrieval), None when it cuts none."""
    parts, cut, longest = [], 0, 0
    for split, ds in sets.items():
        if callable(getattr(ds, "lengths", None)):
            n = ds.lengths()
            k = int((n > max_len).sum())
            parts.append(f"{k} of {len(n)} {split}")
            cut, longest = cut + k, max(longest, int(n.max(initial=0)))
    if not cut:
        return None
    return f"note: --max-len {max_len} cuts {', '.join(parts)} examples (longest {longest} tokens)"


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
    counts = {"--eval-steps": cfg.eval_steps, "--train-limit": cfg.limit_train, "--eval-limit": cfg.limit_eval,
              "--workers": cfg.workers}
    if bad := {k: v for k, v in counts.items() if v is not None and v < 0}:
        raise UserError("must be >= 0 (0 = the whole split, or no worker processes): "
                        + ", ".join(f"{k} {v}" for k, v in bad.items()))
    out = Path(cfg.output or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-lra-{cfg.task}-{cfg.attention}")
    state, done = _start_or_resume(out, cfg, steps, log)
    if done is not None:
        return done
    sets = {s: build_lra_data(cfg, s) for s in ("train", "val", "test")}
    if len(sets["train"]) < cfg.batch_size:
        raise UserError(f"the {cfg.task} training split has {len(sets['train'])} examples, fewer than one batch of "
                        f"{cfg.batch_size}")
    note = _max_len_note(cfg.max_len, sets)
    if note:
        log(note)
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
