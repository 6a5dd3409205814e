"""The machine a benchmark runs on: the physical cores it was given, and whether it is too loaded to time.

`physical_cores()` counts distinct physical cores (SMT siblings once) among the CPUs this process may run on
(`os.sched_getaffinity`), capped by a cgroup CPU quota; `bench` pins torch's threads to that count by default.
`load_warning` and `spread_warning` are the one-line warnings `bench` prints when the load average exceeds the
threads in use or the timed repeats of a step spread by more than 20 % (interquartile range over median).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["physical_cores", "load_average", "load_warning", "spread_warning", "pin_threads_like_bench",
           "SPREAD_LIMIT"]

# Interquartile range / median of a step's timed repeats above which the timing is called noisy.
SPREAD_LIMIT = 0.20


def _allowed_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _cgroup_limit() -> int | None:
    """CPUs allowed by a cgroup v2 quota (`cpu.max`), rounded up; None when unlimited or unknown."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return max(1, math.ceil(int(quota) / int(period)))
    except (ValueError, ZeroDivisionError):
        return None


def physical_cores(sysfs: str | os.PathLike = "/sys/devices/system/cpu") -> int:
    """Physical cores among the CPUs this process may use (hyper-threads counted once), at least 1."""
    cpus = _allowed_cpus()
    cores = set()
    for c in cpus:
        topo = Path(sysfs) / f"cpu{c}" / "topology"
        try:
            cores.add((topo / "physical_package_id").read_text().strip() + ":" + (topo / "core_id").read_text().strip())
        except OSError:
            cores.add(f"cpu{c}")  # no topology: count the CPU itself
    n = max(1, len(cores))
    limit = _cgroup_limit()
    return min(n, limit) if limit else n


def default_threads() -> int:
    """The threads a benchmark uses without `--threads`: OMP_NUM_THREADS when it is set to a positive integer (the
    user's own limit, which torch itself honours), else the physical cores this process may use."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return physical_cores()


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def load_warning(threads: int, load: float | None = None) -> str | None:
    """The warning line when the load average (measured before the benchmark) is above the threads it uses."""
    load = load_average() if load is None else load
    if load is None or load <= threads:
        return None
    advice = ("fewer threads compete less (--threads 1, or OMP_NUM_THREADS=1)" if threads > 1 else
              "rerun when the machine is quieter")
    return (f"warning: the machine is loaded (1-minute load average {load:.2f} > {threads} thread(s) in use): other "
            f"processes compete for the cores, so times are slower and noisier than on a quiet machine; {advice}")


def spread_warning(spreads: Iterable[tuple[str, float]]) -> str | None:
    """The warning line when any (label, spread) exceeds SPREAD_LIMIT, naming the worst."""
    worst = max(spreads, key=lambda s: s[1], default=None)
    if worst is None or worst[1] <= SPREAD_LIMIT:
        return None
    return (f"warning: timings spread by up to {100 * worst[1]:.0f} % ({worst[0]}; interquartile range / median of "
            f"the repeats, limit {100 * SPREAD_LIMIT:.0f} %): the machine is busy or the step too short; rerun on a "
            "quiet machine or with more --repeats")


def pin_threads_like_bench(argv: list[str]) -> int:
    """Set torch's threads as `subquad bench` will for these arguments (`--threads N`, else `default_threads()`), so
    that a result file named before the run (`sweep.default_result_path`) carries the right thread count."""
    import torch

    n = default_threads()
    if "--threads" in argv[:-1]:
        try:
            n = max(1, int(argv[argv.index("--threads") + 1]))
        except ValueError:
            pass  # bench itself reports the bad value
    torch.set_num_threads(n)
    return n
