"""Peak memory of one call of a step function.

CPU: an allocator probe. torch's profiler (`profile_memory=True`) records every allocation and free of the CPU
allocator with its size; the running sum of those records, in time order, peaks at the largest amount of memory the
step held at once beyond what existed before it (parameters and inputs are not counted, saved activations and
temporaries are). This sees the C++ allocator, which `tracemalloc` does not, and is exact where an RSS delta is not
(glibc keeps freed pages, and short peaks fall between RSS samples).

CUDA: `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`, minus the memory allocated before the call.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator

import torch

__all__ = ["peak_memory", "peak_memory_mb", "rss_mb", "quiet_native_stderr"]


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (the profiler backend writes start/stop notices there from C++)."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)


def _allocation_records(prof) -> list[tuple[int, int]]:
    """(time ns, signed bytes) of every allocator event in a finished profile."""
    from torch._C._profiler import _EventType

    records = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.tag == _EventType.Allocation:
            records.append((event.start_time_ns, int(event.extra_fields.alloc_size)))
        stack.extend(event.children)
    records.sort(key=lambda r: r[0])
    return records


def _peak_cpu(fn: Callable[[], object]) -> int:
    from torch.profiler import ProfilerActivity, profile

    with quiet_native_stderr():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
        records = _allocation_records(prof)
    current = peak = 0
    for _, size in records:
        current += size
        peak = max(peak, current)
    return peak


def _peak_cuda(fn: Callable[[], object], device: torch.device) -> int:
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return max(0, torch.cuda.max_memory_allocated(device) - base)


def peak_memory(fn: Callable[[], object], device: torch.device | str = "cpu") -> int:
    """Peak bytes allocated by one call of `fn()` beyond what was allocated before it.

    Args:
        fn: the step (no arguments; its result is dropped before returning, so memory it returns is counted at
            its peak but not kept).
        device: 'cpu' (allocator probe through the profiler) or a CUDA device (`max_memory_allocated`).
    Returns:
        bytes (int).
    """
    device = torch.device(device)
    if device.type == "cuda":
        return _peak_cuda(fn, device)
    if device.type != "cpu":
        raise ValueError(f"peak_memory supports cpu and cuda devices, got {device}")
    return _peak_cpu(fn)


def rss_mb() -> float:
    """The process's peak resident set size so far, in MiB (ru_maxrss is in KiB on Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def peak_memory_mb(device: torch.device, rss_before: float) -> float:
    """Peak memory of a training run: CUDA max allocated, or on CPU the growth of the process's peak RSS since
    `rss_before` (`rss_mb()` at the run's start)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return max(rss_mb() - rss_before, 0.0)
