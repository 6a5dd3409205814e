"""Attention cost sweep with the issues' protocol: every registered mechanism beside "softmax" (SDPA).

Protocol (defaults): C=192, 6 heads, B=1, fp32, CPU, token grids 14^2, 28^2, 56^2, 112^2, 224^2, forward and
forward + backward, the step-time ratio to "softmax" at the same grid, peak memory and GMACs. Mechanisms are taken
from the registry at run time, so new ones appear without editing this file. A size whose measurement would take
more than --max-time seconds (default 300) or more than --max-mem MiB (default 8192), extrapolated from the smaller
sizes, is skipped and the row says so.

Usage (from the repository root):
    python benchmarks/attention.py --overwrite      # full protocol -> benchmarks/results/bench-attn-<hw>-pt<v>.csv
    python benchmarks/attention.py --names focused_linear enhanced_linear --tokens 56,112
    python benchmarks/attention.py --forward-only --plot docs/cost.png

Any other `subquad bench attention` flag is passed through (later flags win); see `subquad bench attention -h`.
An existing result file (the committed one) is replaced only with `--overwrite`.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULTS = ["--dim", "192", "--heads", "6", "--batch-size", "1", "--tokens", "14,28,56,112,224", "--warmup", "1",
            "--repeats", "5", "--max-time", "300", "--max-mem", "8192"]


def main(argv: list[str] | None = None) -> int:
    from subquad.bench.machine import pin_threads_like_bench
    from subquad.bench.sweep import default_result_path
    from subquad_cli.__main__ import main as cli

    argv = list(sys.argv[1:] if argv is None else argv)
    forward_only = "--forward-only" in argv
    argv = [a for a in argv if a != "--forward-only"]
    args = ["bench", "attention", *DEFAULTS, *([] if forward_only else ["--backward"])]
    if "--out" not in argv:
        device = argv[argv.index("--device") + 1] if "--device" in argv else "cpu"
        pin_threads_like_bench(argv)  # the file is named after the threads bench will use
        args += ["--out", str(default_result_path("attn", device, ROOT / "benchmarks" / "results"))]
    return cli(args + argv)


if __name__ == "__main__":
    sys.exit(main())
