"""One arena cell in its own process: `python -m subquad.arena._cell OUT LABEL SEED` (started by the runner)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from .runner import run_one_cell


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    out, label, seed = Path(argv[0]), argv[1], int(argv[2])
    run_one_cell(out, label, seed)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
