"""One arena cell in its own process: `python -m subquad.arena._cell OUT LABEL SEED` (started by the runner)."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

from .runner import run_one_cell


def exit_on_sigterm() -> None:
    """SIGTERM (the runner stopping this cell) outside training ends the process through SystemExit(143), so that
    `finally` blocks run: a file being written atomically loses its temporary copy, not only its rename. While the
    trainer's loop runs, its own handler takes SIGTERM (it stops after the current update) and then puts this one
    back."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def main(argv: list[str]) -> int:
    exit_on_sigterm()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    out, label, seed = Path(argv[0]), argv[1], int(argv[2])
    run_one_cell(out, label, seed)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
