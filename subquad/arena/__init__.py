"""`subquad arena`: every mechanism trained in the same host under the same recipe, over several seeds.

A task (YAML under `subquad/configs/arena/`) fixes the host, the data, the recipe, the seeds and the budgets before
any run; a cell is one (mechanism, seed) training run in the trainer's own run-directory layout. `run` trains the
cells (resumable, independent cells side by side, one thread each), `report` prints the leaderboard, `check` tests
the papers' claims on it.

    from subquad.arena import load_task, run_arena, read_leaderboard, check_claims
"""

from __future__ import annotations

from .report import check_claims, leaderboard_markdown, read_leaderboard
from .runner import run_arena
from .tasks import TASKS, load_task

__all__ = ["TASKS", "load_task", "run_arena", "read_leaderboard", "leaderboard_markdown", "check_claims"]
