"""What the long-sequence trainers (`subquad.engine.lra`, `subquad.engine.lm`) share: the run directory's start or
resume, and `_StepTask`, one stream of steps in the shared loop (engine.loop) with a summary.csv row, run files and
the resumable state at each evaluation."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import yaml

from subquad_cli.runconfig import RESUME_FREE

from ..errors import UserError
from .checkpoint import read_json, save_weights, write_json
from .loop import Loop, Position, TrainTask
from .rng import seed_everything, step_seed
from .runfiles import read_csv, write_args, write_csv


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


def _write_args(out: Path, cfg: Any) -> None:
    write_args(out, cfg)


def _resume_state(out: Path, cfg: Any) -> dict[str, Any]:
    from .checkpoint import load_state

    for f in ("last_state.pth", "args.yaml"):
        if not (out / f).is_file():
            raise UserError(f"--resume {out}: {f} is missing (the run saved no evaluation to resume from)")
    saved = yaml.safe_load((out / "args.yaml").read_text()) or {}
    mine = asdict(cfg)
    changed = sorted(k for k in mine if k not in (*RESUME_FREE, "output") and k in saved and saved[k] != mine[k])
    if changed:
        raise UserError(f"--resume {out}: the run was started with other settings ({', '.join(changed)}); resume "
                        "it with its own args.yaml")
    return load_state(out / "last_state.pth")


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
