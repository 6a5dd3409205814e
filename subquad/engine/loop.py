"""The one training loop of every trainer (image classification, LRA, the character LM, detection, segmentation).

`Loop.fit(task)` owns the mechanics: autocast (bf16/fp16; a GradScaler only for fp16 on CUDA), gradient
accumulation, clipping, the optimizer step, EMA, the position (epoch, micro-batch, update), the resumable state file
(written atomically: a temporary file renamed over the previous one, so a kill in the middle of a write leaves the
previous state loadable), `checkpoint_every` updates, and SIGTERM / SIGINT. A task plugs in what is its own through
the `TrainTask` methods: its batches, loss, scheduler and metrics, when to evaluate and which files to write.

Preemption: a SIGTERM or SIGINT during `fit` lets the current update finish, writes the resumable state, prints one
line naming the file and the position, and raises `Preempted` (a SystemExit with code 128 + the signal: 143 for
SIGTERM, 130 for SIGINT). Resuming from a state written inside an epoch restores the sampler position, every RNG,
the optimizer, grad scaler, EMA and the task's own state (schedule, metric sums), so the run ends with the weights of
an uninterrupted one. With data-loader workers (`workers > 0`) the augmentation draws of the rest of an interrupted
epoch are not those of the uninterrupted run (the workers' generators restart), the data order still is.

A step in the shape of timm's train.py `train_one_epoch` and Lightning's fit loop, written for this package.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .checkpoint import save_state
from .distributed import DistInfo, all_reduce_sum
from .rng import rng_state, set_rng_state
from .signals import SignalHandlers

__all__ = ["Loop", "TrainTask", "Position", "Precision", "Preempted", "StopSignals"]

_logger = logging.getLogger(__name__)


@dataclass
class Position:
    """Where training is: `epoch` (0-based) and `batch` (micro-batches done in it), `step` (optimizer updates)."""

    epoch: int = 0
    batch: int = 0
    step: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch": self.batch, "step": self.step}


class Preempted(SystemExit):
    """Training stopped on a signal after writing its resumable state; the exit code is 128 + the signal number."""

    def __init__(self, signum: int, path: Path, pos: Position) -> None:
        super().__init__(128 + signum)
        self.signum, self.path, self.position = signum, path, pos


class StopSignals(SignalHandlers):
    """While active (main thread only), the first SIGTERM / SIGINT is recorded instead of stopping the process;
    a second one of the same kind acts as usual, one of the other kind is ignored (a terminal's Ctrl-C reaches a
    process and its parent, which may then stop it with SIGTERM: it already is stopping)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        super().__init__()
        self.signum = 0

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == self.signum:
            signal.signal(signum, self.previous(signum))
            signal.raise_signal(signum)
            return
        self.signum = self.signum or signum


class Precision:
    """Autocast and the grad scaler: `dtype` 'float16' or 'bfloat16'; `cpu` False: no autocast on CPU (LRA's
    recipe). The scaler exists only for float16 on CUDA."""

    def __init__(self, device: torch.device, enabled: bool, dtype: str = "float16", cpu: bool = True) -> None:
        self.device_type = device.type
        self.dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float16
        self.enabled = enabled and (cpu or device.type == "cuda")
        self.scaler = torch.amp.GradScaler(device.type) if enabled and self.dtype == torch.float16 and \
            device.type == "cuda" else None

    def autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device_type, dtype=self.dtype) if self.enabled else contextlib.nullcontext()


class TrainTask:
    """What a trainer plugs into `Loop.fit`. Defaults: one epoch, no cap on updates, nothing to log or save."""

    epochs: int = 1
    total_steps: int = 0  # > 0: stop after this many updates

    def start_epoch(self, epoch: int, fresh: bool) -> None:
        """Seeding and sampler epoch; `fresh`: the epoch starts at its first batch (not resumed inside it)."""

    def batches(self, epoch: int, skip: int) -> Iterable:
        """The micro-batches of `epoch` after the first `skip`."""
        raise NotImplementedError

    def epoch_len(self, epoch: int) -> int | None:
        """Micro-batches in `epoch` (None: an endless stream)."""
        return None

    def before_update(self, pos: Position) -> None:
        """Before the first micro-batch of update pos.step + 1 (set the learning rate)."""

    def prepare(self, batch: Any) -> Any:
        """Device placement and batch transforms outside autocast (mixup)."""
        return batch

    def loss(self, batch: Any) -> torch.Tensor:
        """The training loss of one micro-batch (run under autocast)."""
        raise NotImplementedError

    def check_loss(self, loss: torch.Tensor, pos: Position) -> None:
        """Raise on a loss that must stop training (non-finite)."""

    def after_batch(self, pos: Position, loss: torch.Tensor, batch: Any, seconds: float, cpu: float) -> None:
        """Metric sums and progress lines; pos.batch counts this micro-batch."""

    def after_update(self, pos: Position) -> bool:
        """Schedulers, periodic evaluation and files after update pos.step; True: write the resumable state now."""
        return False

    def end_epoch(self, pos: Position) -> bool:
        """After the last micro-batch of pos.epoch; True: write the resumable state (pos is then the next epoch)."""
        return False

    def after_save(self, pos: Position) -> None:
        """After the resumable state was written at an evaluation point or an epoch end (callbacks)."""

    def should_stop(self, pos: Position) -> bool:
        """True: end training after this update (a time budget)."""
        return False

    def state_dict(self) -> dict[str, Any]:
        """The task's part of the resumable state (schedule, best so far, metric sums of the running interval)."""
        return {}


class Loop:
    """Model, optimizer and the training mechanics (see the module docstring).

    Args:
        model: the trained module (its parameters are clipped, its weights saved with a mid-epoch state).
        optimizer: replaced by a task that restarts it (`loop.optimizer = ...`).
        precision: autocast and grad scaler.
        state_path: the resumable state file (written by rank 0).
        info: rank / world size (DDP: the stop signal is agreed over ranks, every rank's RNG state is kept).
        accum_steps: micro-batches per update. clip: called on the unscaled gradients before each update.
        ema: a timm ModelEmaV3, updated after each update. checkpoint_every: > 0: write the state every N updates.
    """

    def __init__(self, *, model: nn.Module, optimizer: torch.optim.Optimizer, precision: Precision, state_path: Path,
                 info: DistInfo | None = None, accum_steps: int = 1, clip: Callable[[], Any] | None = None,
                 ema: Any = None, checkpoint_every: int = 0, sync_cuda: bool = False) -> None:
        self.model, self.optimizer, self.precision, self.state_path = model, optimizer, precision, Path(state_path)
        self.info = info or DistInfo()
        self.accum_steps, self.clip, self.ema, self.checkpoint_every = accum_steps, clip, ema, checkpoint_every
        self.sync_cuda = sync_cuda and self.info.device.type == "cuda"
        self.pos = Position()
        self._rng: dict[str, Any] | None = None  # restored when the resumed epoch's iterator exists
        self.signals = StopSignals()

    PER_RANK = ("rng", "sums")  # state keys that differ between DDP ranks

    def for_rank(self, state: dict[str, Any]) -> dict[str, Any]:
        """`state` with this rank's own entries of the per-rank keys (a state written under DDP keeps them all)."""
        own = {k: state[f"{k}_ranks"][self.info.rank] for k in self.PER_RANK
               if len(state.get(f"{k}_ranks") or ()) == self.info.world_size}
        return {**state, **own}

    @property
    def scaler(self) -> Any:
        return self.precision.scaler

    # ---- resumable state ----------------------------------------------------------------------------------------
    def state_dict(self, task: TrainTask) -> dict[str, Any]:
        """The task's state plus position, optimizer, scaler, EMA, RNG (and the weights when inside an epoch)."""
        state = {**task.state_dict(), "position": self.pos.as_dict(), "optimizer": self.optimizer.state_dict(),
                 "rng": rng_state()}
        if self.info.enabled:  # every rank's RNG and metric sums, each rank reads its own back (for_rank)
            import torch.distributed as dist

            for key in self.PER_RANK:
                if key in state:
                    ranks: list = [None] * self.info.world_size
                    dist.all_gather_object(ranks, state[key])
                    state[f"{key}_ranks"] = ranks
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        if self.ema is not None:
            state["ema"] = self.ema.module.state_dict()
        if self.pos.batch > 0 and "model" not in state:
            state["model"] = self.model.state_dict()
        return state

    def save(self, task: TrainTask) -> None:
        state = self.state_dict(task)
        if self.info.is_main:
            save_state(state, self.state_path)

    def load_state_dict(self, state: dict[str, Any], pos: Position) -> None:
        """Restore a state written by `save` at `pos` (the task reads its own keys); a state written inside an epoch
        restores the RNG once that epoch's iterator exists, and the weights it holds."""
        self.pos = pos
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None and "ema" in state:
            self.ema.module.load_state_dict(state["ema"])
        if "model" in state:
            self.model.load_state_dict(state["model"])
        self._rng = self.for_rank(state)["rng"]
        if pos.batch == 0:
            set_rng_state(self._rng)

    # ---- the loop -----------------------------------------------------------------------------------------------
    def fit(self, task: TrainTask) -> Position:
        """Train `task` from `self.pos` to its last epoch / update; returns the final position."""
        with self.signals:
            while self.pos.epoch < task.epochs and not self._finished(task):
                if not self._run_epoch(task):
                    break
        return self.pos

    def _finished(self, task: TrainTask) -> bool:
        return bool(task.total_steps) and self.pos.step >= task.total_steps

    def _run_epoch(self, task: TrainTask) -> bool:
        """One epoch from self.pos.batch, then the task's epoch end; False when training ends inside it (update cap or
        stop request)."""
        pos = self.pos
        task.start_epoch(pos.epoch, pos.batch == 0)
        batches = iter(task.batches(pos.epoch, pos.batch))
        if pos.batch > 0 and self._rng is not None:
            set_rng_state(self._rng)  # after the iterator drew its base seed, as in the uninterrupted run
        self._rng = None
        n = task.epoch_len(pos.epoch)
        going = True
        for batch in batches:
            first = pos.batch % self.accum_steps == 0
            boundary = (pos.batch + 1) % self.accum_steps == 0 or (n is not None and pos.batch + 1 == n)
            if first:
                task.before_update(pos)
            t0, c0 = time.perf_counter(), time.process_time()
            loss = self._micro_step(task, batch, boundary)
            if self.sync_cuda:
                torch.cuda.synchronize(self.info.device)
            pos.batch += 1
            task.after_batch(pos, loss, batch, time.perf_counter() - t0, time.process_time() - c0)
            if boundary and self._after_update(task):
                going = False
                break
        save = task.end_epoch(pos)
        pos.epoch, pos.batch = pos.epoch + 1, 0
        if save:
            self.save(task)
            task.after_save(pos)
        signum = self._agreed_signal() if going and pos.epoch < task.epochs else 0
        if signum:  # received during the epoch-end evaluation
            if not save:
                self.save(task)
            self._preempt(signum)
        return going

    def _micro_step(self, task: TrainTask, batch: Any, boundary: bool) -> torch.Tensor:
        """Forward, backward and (at an update boundary) clip, optimizer step, EMA."""
        batch = task.prepare(batch)
        with self.precision.autocast():
            loss = task.loss(batch)
        task.check_loss(loss, self.pos)
        scaled = loss / self.accum_steps if self.accum_steps > 1 else loss
        if self.scaler is not None:
            self.scaler.scale(scaled).backward()
        else:
            scaled.backward()
        if not boundary:
            return loss
        if self.scaler is not None and self.clip is not None:
            self.scaler.unscale_(self.optimizer)
        if self.clip is not None:
            self.clip()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.pos.step += 1
        if self.ema is not None:
            self.ema.update(self.model, step=self.pos.step)
        return loss

    def _after_update(self, task: TrainTask) -> bool:
        """The task's update hook, periodic / signalled state writes; True: training ends here."""
        pos = self.pos
        saved = False
        if task.after_update(pos):
            self.save(task)
            task.after_save(pos)
            saved = True
        signum = self._agreed_signal()
        if signum or (self.checkpoint_every > 0 and pos.step % self.checkpoint_every == 0):
            if not saved:
                self.save(task)
            if signum:
                self._preempt(signum)
        return task.should_stop(pos) or self._finished(task)

    def _agreed_signal(self) -> int:
        """The signal received by any rank (0: none)."""
        signum = self.signals.signum
        if self.info.enabled:
            signum = int(max(all_reduce_sum([float(signum)], self.info)[0], 0))
            signum = self.signals.signum or (signal.SIGTERM if signum else 0)
        return signum

    def _preempt(self, signum: int) -> None:
        pos = self.pos
        if self.info.is_main:
            _logger.warning("%s: stopped after update %d (epoch %d, batch %d); resumable state written to %s",
                            signal.Signals(signum).name, pos.step, pos.epoch + 1, pos.batch, self.state_path)
        raise Preempted(signum, self.state_path, pos)
