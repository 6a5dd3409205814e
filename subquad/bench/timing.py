"""Wall-clock timing of a callable: warm-up calls, then the median of timed repeats.

On CUDA every call is bracketed by `torch.cuda.synchronize` so the time covers the kernels, not their launch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

__all__ = ["Timing", "time_fn", "time_interleaved", "time_spread", "synchronize"]


@dataclass(frozen=True)
class Timing:
    """Result of `time_fn`, in seconds.

    Attributes:
        median: median of the timed repeats (the reported step time).
        best: fastest repeat.
        repeats: number of timed calls.
        times: every timed call.
    """

    median: float
    best: float
    repeats: int
    times: tuple[float, ...]

    @property
    def spread(self) -> float:
        """Interquartile range of the timed calls over their median (0 with fewer than two calls); above 0.2 the
        machine was busy or the step too short to time."""
        return time_spread(self.times)


def time_spread(times: tuple[float, ...] | list[float]) -> float:
    """(upper quartile - lower quartile) / median of `times`; 0 with fewer than two."""
    if len(times) < 2:
        return 0.0
    q1, med, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return (q3 - q1) / med if med > 0 else 0.0


def synchronize(device: torch.device | str) -> None:
    """Wait for queued kernels on `device` (no-op on CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn: Callable[[], object], device: torch.device | str = "cpu", warmup: int = 1, repeats: int = 5,
            budget_s: float | None = None, min_time_s: float | None = None, max_repeats: int = 200) -> Timing:
    """Median time of `fn()` after `warmup` untimed calls.

    Args:
        fn: the step to time (takes no arguments; its result is discarded).
        device: where `fn` computes (CUDA is synchronised around each call).
        warmup: untimed calls first (at least one is advised: allocator, oneDNN and SDPA kernel selection).
        repeats: timed calls wanted.
        budget_s: when set, fewer repeats are made (at least one) so that the timed calls take about this long;
            the first timed call sets the estimate.
        min_time_s: when set, more repeats are made (up to `max_repeats`) until the timed calls add up to this
            long, so millisecond steps get a median over many calls (the timeit autorange idea) while long steps
            keep `repeats`.
        max_repeats: cap of the calls `min_time_s` may add.
    Returns:
        a `Timing`.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"time_fn needs repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    for _ in range(warmup):
        fn()
    synchronize(device)
    times: list[float] = []
    def wanted() -> bool:
        if len(times) < repeats:
            return True
        return min_time_s is not None and sum(times) < min_time_s and len(times) < max_repeats

    while wanted():
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
        if budget_s is not None and sum(times) + times[0] > budget_s:
            break
    return Timing(statistics.median(times), min(times), len(times), tuple(times))


def time_interleaved(steps: Mapping[str, Callable[[], object]], rounds: int, warmup: int = 1,
                     device: torch.device | str = "cpu") -> dict[str, list[float]]:
    """Seconds of each named step, timed in rounds that call every step once in turn (A, B, A, B, ...), so that a
    change of load on a shared machine hits all of them alike; `warmup` untimed rounds first.

    Returns:
        {name: [seconds per round]} in the order of `steps`.
    """
    if rounds < 1 or warmup < 0:
        raise ValueError(f"time_interleaved needs rounds >= 1 and warmup >= 0, got rounds={rounds}, warmup={warmup}")
    for _ in range(warmup):
        for fn in steps.values():
            fn()
    synchronize(device)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            times[name].append(time.perf_counter() - t0)
    return times
