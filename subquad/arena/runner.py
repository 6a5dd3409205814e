"""`subquad arena run`: train every (mechanism, seed) cell of a task, resumably, cells side by side.

Layout of `--out DIR`:

    DIR/arena.json                         task, budget and the fingerprint of the recipe the cells were trained with
    DIR/data/                              generated data (sequence tasks), made once
    DIR/cells/<label>/seed<k>/             one cell: the trainer's run directory, plus
        cell.log                           the cell's own output
        progress.json                      its latest epoch/step and validation accuracy
        cell.json                          written when the cell finished: its measured numbers
    DIR/leaderboard.csv, leaderboard.png, curves.png

A rerun of the same command skips every cell with a cell.json and resumes the others from their last checkpoint
(the trainers restore data order and RNG, so the numbers equal those of an uninterrupted run). Each cell runs in its
own process with one thread; at most as many processes as this process may use cores.

Ctrl-C (SIGINT) or SIGTERM stops the run at any moment with exit status 130, however the process was started (a
background job of a script inherits SIGINT ignored; the runner handles it all the same): each running cell gets
SIGTERM, finishes its current update, writes its resumable state and exits; a second Ctrl-C kills them. A cell's
cell.json is written to a temporary name and renamed, so it is complete or absent.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engine.checkpoint import write_json
from ..engine.signals import SignalHandlers
from ..errors import UserError
from .tasks import ARENA_FILE, Task, kind_module, load_task, options_text, task_of_run

__all__ = ["run_arena", "kind_module", "Cell", "plan_cells", "available_cores", "INTERRUPT_ENV"]

# Seconds between two looks at the running cells.
POLL_S = 2.0

# Test hook: "<point>:<label>/seed<k>" sends the runner SIGINT, as a user's Ctrl-C would, when the run reaches that
# point of that cell, so that tests interrupt at a named point rather than after a wait:
#   start    the runner, just before the cell's process starts (before any cell, or between two cells);
#   started  the runner, just after the cell's process started, before the runner tracks it;
#   update   the cell, after its first optimizer update; it then waits for the runner to stop it;
#   written  the cell, after it wrote its cell.json, as its process ends.
INTERRUPT_ENV = "SUBQUAD_ARENA_INTERRUPT"


def _interrupt_at(point: str, label: str, seed: int, pid: int) -> None:
    """The test hook above: send `pid` SIGINT when $SUBQUAD_ARENA_INTERRUPT names this point."""
    if os.environ.get(INTERRUPT_ENV) == f"{point}:{label}/seed{seed}":
        os.kill(pid, signal.SIGINT)


class _Interrupts(SignalHandlers):
    """While active (in the main thread), SIGINT and SIGTERM raise KeyboardInterrupt, whatever handler the process
    inherited (a background job of a script starts with SIGINT ignored). Inside `deferred()` the exception is held
    until the block ends, so that a cell's process is never started without being tracked."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        super().__init__()
        self._deferring = False
        self._pending = False

    def _handle(self, signum: int, frame: Any) -> None:
        if self._deferring:
            self._pending = True
            return
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
        if self._pending:
            self._pending = False
            raise KeyboardInterrupt


def available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass
class Cell:
    label: str
    seed: int
    dir: Path
    proc: subprocess.Popen | None = None
    started: float = 0.0
    progress: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return (self.dir / "cell.json").is_file()

    def fraction(self) -> float:
        p = self.progress
        if "epoch" in p:
            return p["epoch"] / max(1, p["epochs"])
        if "step" in p:
            return p["step"] / max(1, p["steps"])
        return 0.0


def mech_entry(task: Task, label: str) -> dict[str, Any]:
    """What the kind's functions get: for image tasks the host's arguments with the entry on top."""
    entry = task.mechanism(label)
    return {**task.host, **entry} if task.kind == "image" else entry


def plan_cells(task: Task, labels: list[str], seeds: list[int], out: Path) -> list[Cell]:
    # Seed-major: every mechanism's first seed before any second seed, so a run cut short still compares them all.
    return [Cell(label, seed, out / "cells" / label / f"seed{seed}") for seed in seeds for label in labels]


def _check_out(out: Path, task: Task, budget: str) -> None:
    """Refuse an --out that holds something else: another task or budget, another recipe, or unrelated files."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a directory")
    meta_path = out / ARENA_FILE
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
        except json.JSONDecodeError:
            raise UserError(f"--out {out}: {ARENA_FILE} is not readable JSON; choose another --out") from None
        if (meta.get("task"), meta.get("budget")) != (task.name, budget):
            raise UserError(f"--out {out} holds the arena run of task {meta.get('task')!r} budget "
                            f"{meta.get('budget')!r}, not {task.name!r} {budget!r}; choose another --out")
        if meta.get("fingerprint") != task.fingerprint(budget):
            raise UserError(f"--out {out}: the recipe, seeds or claims of task {task.name!r} changed since these "
                            "cells were trained (they are fixed before a run); choose another --out")
        return
    if out.is_dir() and any(out.iterdir()):
        raise UserError(f"--out {out} holds other files (no {ARENA_FILE}: not an arena run); choose an empty or new "
                        "directory")


def _record_entries(meta: dict[str, Any], task: Task, labels: list[str], out: Path) -> bool:
    """Record the entry of each label that joins the run; refuse a label whose entry changed since it trained.
    Returns whether `meta` changed."""
    recorded = meta.setdefault("mechanisms", {})
    changed = False
    for label in labels:
        entry = json.loads(json.dumps(task.mechanism(label), sort_keys=True, default=str))
        if label not in recorded:
            recorded[label] = entry
            changed = True
        elif recorded[label] != entry:
            raise UserError(f"--out {out}: mechanism {label!r} was trained with {recorded[label]}, the task now "
                            f"gives {entry} (entries are fixed before a run); choose another --out or another label")
    return changed


def leaderboard_labels(task: Task, meta: dict[str, Any], labels: list[str]) -> list[str]:
    """The rows of a run's leaderboard: every mechanism this run directory has recorded (`arena.json`), not only
    the ones this invocation named, so a run trained in parts (`--attention a,b`, then `--attention c`) still
    gets one leaderboard of all its mechanisms. The task's `default_mechanisms` order first, then the others in
    the order they joined; a recorded label the task no longer resolves is left out."""
    recorded = [lb for lb in [*meta.get("mechanisms", {}), *labels] if _resolves(task, lb)]
    order = {lb: i for i, lb in enumerate(task.default_mechanisms)}
    unique = list(dict.fromkeys(recorded))
    return sorted(unique, key=lambda lb: (order.get(lb, len(order)), unique.index(lb)))


def _resolves(task: Task, label: str) -> bool:
    try:
        task.mechanism(label)
    except UserError:
        return False
    return True


def provenance() -> dict[str, Any]:
    """The git commit of the subquad source this process runs, and whether the package's tracked files matched it
    (`commit` is "" outside a git checkout, e.g. an installed wheel; the version then identifies the code)."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", "-C", os.fspath(root), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    commit = git("rev-parse", "HEAD") if (root / ".git").exists() else None
    if not commit:
        return {"commit": "", "tree_clean": None}
    status = git("status", "--porcelain", "--untracked-files=no", "--", "subquad")
    return {"commit": commit, "tree_clean": status == ""}


def _fmt_time(s: float | None) -> str:
    if s is None or s != s or s == float("inf"):
        return "?"
    s = int(round(s))
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


DEVICES = ("cpu", "cuda")


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def resolve_device(task: Task, device: str | None) -> str | None:
    """The device override of a run (None: the task recipe's own `device`). A task marked `requires: gpu` trains on
    CUDA; on a machine without CUDA it is refused unless `device` asks for the CPU explicitly."""
    if device is not None and device not in DEVICES:
        raise UserError(f"--device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cuda" and not _cuda_available():
        raise UserError("--device cuda: this machine has no CUDA device (torch.cuda.is_available() is False)")
    if task.requires == "gpu" and device is None and not _cuda_available():
        raise UserError(f"task {task.name!r} needs a GPU (requires: gpu in its YAML) and this machine has no CUDA "
                        "device; pass --device cpu to run it on the CPU anyway")
    if task.requires == "gpu" and device is None:
        return "cuda"
    return device


def run_arena(task_name: str, attention: str = "all", seeds: list[int] | None = None, budget: str = "default",
              out: str | os.PathLike = "runs/arena", workers: int | None = None,
              log: Callable[[str], None] = print, poll: float | None = None, device: str | None = None
              ) -> dict[str, Any]:
    """Train the cells that are not finished, then write the leaderboard (of every mechanism the run directory has
    recorded, see `leaderboard_labels`); returns a summary.

    Cells a mechanism cannot run (a causal-only mechanism on an image task, a 2-D one on a 1-D sequence) are
    skipped with their reason, on screen and in the leaderboard; when no cell can run, nothing is written (UserError).
    A cell that fails is reported and the others go on.
    `device` ("cpu" or "cuda") overrides the recipe's device for every cell of the run (recorded in arena.json; a
    run keeps the device it started with); a task marked `requires: gpu` needs it on a machine without CUDA.
    """
    from .report import write_leaderboard

    task = load_task(task_name)
    device = resolve_device(task, device)
    labels = task.resolve(attention, budget)
    seeds = list(task.budget_seeds(budget) if seeds is None else seeds)
    if not seeds:
        raise UserError("--seeds is empty")
    train = task.recipe(budget)
    mod = kind_module(task.kind)
    skipped = {label: reason for label in labels if (reason := mod.refusal(train, mech_entry(task, label)))}
    if len(skipped) == len(labels):
        raise UserError(f"--task {task.name}: no cell can run: "
                        + "; ".join(f"{label} {reason}" for label, reason in skipped.items())
                        + f" (nothing written; the task's mechanisms: {', '.join(task.default_mechanisms)})")
    out = Path(out)
    _check_out(out, task, budget)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    from ..version import __version__

    meta = _read_json(out / ARENA_FILE) or {
        "task": task.name, "source": task.source, "budget": budget, "fingerprint": task.fingerprint(budget),
        "subquad": __version__, "torch": torch.__version__, "created": time.strftime("%Y-%m-%d %H:%M:%S")}
    if meta.get("device") != device and (meta.get("device") is not None or (out / "cells").is_dir()):
        raise UserError(f"--out {out} was started with --device {meta.get('device') or '(the recipe default)'}, "
                        f"not {device or '(the recipe default)'}; run it with the same --device or choose another "
                        "--out")
    changed = _record_entries(meta, task, labels, out)
    if device is not None and "device" not in meta:
        meta["device"] = device
        changed = True
    if changed:
        write_json(meta, out / ARENA_FILE)
    for label, reason in skipped.items():
        log(f"[{task.name}] skip {label}: {reason}")
    runnable = [lb for lb in labels if lb not in skipped]
    cells = plan_cells(task, runnable, seeds, out)
    pending = [c for c in cells if not c.done]
    log(f"[{task.name}] {len(cells)} cells ({len(runnable)} mechanisms x {len(seeds)} seeds, budget {budget}): "
        f"{len(cells) - len(pending)} done, {len(pending)} to train")
    with _Interrupts() as interrupts:
        if pending:
            mod.prepare_data(task.as_dict(), out / "data", budget)
        n_workers = max(1, min(workers or available_cores(), available_cores(), len(pending) or 1))
        failed = _run_pool(task, pending, out, budget, n_workers, log, POLL_S if poll is None else poll, interrupts)
        board_labels = leaderboard_labels(task, meta, labels)
        board_skipped = {lb: reason for lb in board_labels
                         if (reason := skipped.get(lb) or mod.refusal(train, mech_entry(task, lb)))}
        board = write_leaderboard(out, task, board_labels, seeds, board_skipped)
    log(f"[{task.name}] leaderboard: {out / 'leaderboard.csv'}")
    return {"cells": len(cells), "trained": len(pending) - len(failed), "failed": failed, "skipped": skipped,
            "leaderboard": board}


def _run_pool(task: Task, pending: list[Cell], out: Path, budget: str, n_workers: int,
              log: Callable[[str], None], poll: float, interrupts: _Interrupts) -> list[str]:
    queue = list(pending)
    running: list[Cell] = []
    finished_walls: list[float] = []
    failed: list[str] = []
    t_start = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "SUBQUAD_ARENA_CELL": "1"}

    def run_eta() -> float | None:
        per_cell = list(finished_walls)
        for c in running:
            f = c.fraction()
            if f > 0:
                per_cell.append((time.perf_counter() - c.started) / f)
        if not per_cell:
            return None
        mean = sum(per_cell) / len(per_cell)
        left = sum(max(0.0, 1 - c.fraction()) for c in running) + len(queue)
        return mean * left / n_workers

    try:
        while queue or running:
            while len(running) < n_workers and (c := _next_ready(task, queue, running, budget)) is not None:
                _interrupt_at("start", c.label, c.seed, os.getpid())
                with interrupts.deferred():  # started and tracked, or neither
                    _start_cell(c, out, env)
                    running.append(c)
                log(f"[{task.name}] start {c.label} seed {c.seed}" + (" (resuming)" if c.progress else ""))
            time.sleep(poll)
            for c in list(running):
                _log_progress(task, c, log, run_eta)
                rc = c.proc.poll()
                if rc is None:
                    continue
                running.remove(c)
                _log_finished(task, c, rc, finished_walls, failed, len(pending), log, run_eta)
    except KeyboardInterrupt:
        _stop_cells(running)
        log(f"[{task.name}] interrupted after {_fmt_time(time.perf_counter() - t_start)}; run the same command "
            "again to resume (finished cells are kept)")
        raise
    return failed


def _next_ready(task: Task, queue: list[Cell], running: list[Cell], budget: str) -> Cell | None:
    """Take the first queued cell that may start now: one whose kind names no cell it depends on (`depends_on`, e.g.
    the recall tasks' learning-rate sweep on seed 0), or whose dependency has finished, or is neither queued nor
    running in this run (the cell then refuses in one line if it needs what is missing)."""
    depends = getattr(kind_module(task.kind), "depends_on", None)
    waiting = {(c.label, c.seed) for c in queue + running}
    for i, c in enumerate(queue):
        dep = depends(task.recipe(budget), c.label, c.seed) if depends else None
        if dep is None or dep not in waiting or (c.dir.parent / f"seed{dep[1]}" / "cell.json").is_file():
            return queue.pop(i)
    return None


def _stop_cells(cells: list[Cell], timeout: float = 120.0) -> None:
    """SIGTERM to every cell still running (its trainer finishes the current update, writes its resumable state and
    exits), then wait for them; a cell still running after `timeout` s, or a second interrupt while waiting, kills
    them."""
    live = [c.proc for c in cells if c.proc is not None and c.proc.poll() is None]
    try:
        for p in live:
            p.terminate()
        deadline = time.monotonic() + timeout
        for p in live:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    except KeyboardInterrupt:
        for p in live:
            if p.poll() is None:
                p.kill()
        for p in live:
            p.wait()
        raise


def _start_cell(c: Cell, out: Path, env: dict[str, str]) -> None:
    """Start cell `c` as a `python -m subquad.arena._cell` process appending to its cell.log."""
    c.dir.mkdir(parents=True, exist_ok=True)
    logf = open(c.dir / "cell.log", "a")
    c.proc = subprocess.Popen([sys.executable, "-m", "subquad.arena._cell", os.fspath(out), c.label,
                               str(c.seed)], stdout=logf, stderr=subprocess.STDOUT, env=env)
    _interrupt_at("started", c.label, c.seed, os.getpid())
    logf.close()
    c.started = time.perf_counter()
    c.progress = _read_json(c.dir / "progress.json") or {}


def _log_progress(task: Task, c: Cell, log: Callable[[str], None], run_eta: Callable[[], float | None]) -> None:
    """Log a running cell's progress.json when it changed (epoch or step, the validation score in the task's unit,
    ETAs)."""
    p = _read_json(c.dir / "progress.json") or {}
    if p and p != c.progress:
        c.progress = p
        f = c.fraction()
        where = (f"epoch {p['epoch']}/{p['epochs']}" if "epoch" in p else f"step {p['step']}/{p['steps']}")
        cell_eta = (time.perf_counter() - c.started) * (1 - f) / f if f > 0 else None
        log(f"[{task.name}] {c.label} seed {c.seed}: {where}, val {task.score(p['val_acc'])}, cell ETA "
            f"{_fmt_time(cell_eta)} | run ETA {_fmt_time(run_eta())}")


def _log_finished(task: Task, c: Cell, rc: int, finished_walls: list[float], failed: list[str], total: int,
                  log: Callable[[str], None], run_eta: Callable[[], float | None]) -> None:
    """Record and log a cell whose process exited with `rc`: its wall time when it finished, else a failure."""
    wall = time.perf_counter() - c.started
    if rc == 0 and c.done:
        finished_walls.append(wall)
        res = _read_json(c.dir / "cell.json") or {}
        log(f"[{task.name}] done {c.label} seed {c.seed}: test {task.score(res.get('test_acc'))} "
            f"({_fmt_time(wall)}) | {len(finished_walls)}/{total} trained, run ETA {_fmt_time(run_eta())}")
    else:
        tail = (c.dir / "cell.log").read_text(errors="replace").strip().splitlines()[-1:] or ["?"]
        failed.append(f"{c.label} seed {c.seed}")
        log(f"[{task.name}] FAILED {c.label} seed {c.seed} (exit {rc}): {tail[0]} (log: {c.dir / 'cell.log'})")


def run_one_cell(out: Path, label: str, seed: int) -> dict[str, Any]:
    """The body of one cell's process: train it (resuming when it can), write progress.json and cell.json."""
    import torch

    torch.set_num_threads(1)
    meta = json.loads((out / ARENA_FILE).read_text())
    task = task_of_run(out, meta)
    if task.fingerprint(meta["budget"]) != meta.get("fingerprint"):
        raise UserError(f"{out}: the recipe, seeds or claims of task {task.name!r} ({task.source}) changed since "
                        "this run began (they are fixed before a run); start another --out")
    _record_entries(dict(meta), task, [label], out)  # refuses an entry that changed since the run recorded it
    source = provenance()
    train = task.recipe(meta["budget"])
    if meta.get("device"):
        train = {**train, "device": meta["device"]}
    mod = kind_module(task.kind)
    cell_dir = out / "cells" / label / f"seed{seed}"
    if task.kind in ("lra", "lm"):
        train = {**train, "data": os.fspath(mod.prepare_data(task.as_dict(), out / "data", meta["budget"]))}
    entry = task.mechanism(label)

    def progress(p: dict[str, Any]) -> None:
        write_json(p, cell_dir / "progress.json")

    first_update = [True]

    def on_update(pos: Any) -> None:
        if first_update[0] and os.environ.get(INTERRUPT_ENV) == f"update:{label}/seed{seed}":
            first_update[0] = False
            _interrupt_runner_and_wait()

    res = mod.run_cell(train, mech_entry(task, label), seed, cell_dir, progress,
                       on_update if os.environ.get(INTERRUPT_ENV) else None)
    row = {"task": task.name, "attention": label, "mechanism": entry[task.name_key],
           "options": options_text(entry, task.name_key), "seed": seed, **res, **source}
    write_json(row, cell_dir / "cell.json")
    _interrupt_at("written", label, seed, os.getppid())
    return row


def _interrupt_runner_and_wait(timeout: float = 300.0) -> None:
    """The `update` test hook, in a cell: send the runner (this process's parent) SIGINT, then wait until the
    SIGTERM with which the runner stops this cell has reached the handler in place (the training loop's, which
    stops after this update), so that the cell is stopped in the middle of its training, never after it."""
    prev = signal.getsignal(signal.SIGTERM)
    got: list[int] = []

    def note(signum: int, frame: Any) -> None:
        got.append(signum)
        signal.signal(signum, prev)
        if callable(prev):
            prev(signum, frame)
        else:
            signal.raise_signal(signum)

    signal.signal(signal.SIGTERM, note)
    os.kill(os.getppid(), signal.SIGINT)
    deadline = time.monotonic() + timeout
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
