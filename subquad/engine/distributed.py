"""Data-parallel helpers: process-group setup from torchrun's environment, a global-batch sampler, reductions.

`torchrun --nproc_per_node N -m subquad train ...` sets RANK / WORLD_SIZE / LOCAL_RANK; `init_distributed` then
starts the process group (gloo on CPU, nccl on CUDA). `GlobalBatchSampler` draws one permutation per epoch from
(seed, epoch) and hands each rank its contiguous slice of every global batch, so N processes with batch b see exactly
the batches of one process with batch N*b (and gradient averaging over ranks equals the global-batch mean).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils.data import Sampler

__all__ = ["DistInfo", "check_device", "init_distributed", "resolve_device", "GlobalBatchSampler", "all_reduce_sum",
           "barrier", "cleanup"]

# Device types a command may name, and how torch says whether this machine has one.
_ACCELERATORS = {"cuda": lambda: torch.cuda.is_available(), "mps": lambda: torch.backends.mps.is_available(),
                 "xpu": lambda: hasattr(torch, "xpu") and torch.xpu.is_available()}


@dataclass(frozen=True)
class DistInfo:
    """rank / world size of this process, its device, and whether a process group is active."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    enabled: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def check_device(device: str) -> torch.device:
    """The device that `--device` names, when this machine has it; else a one-line UserError (`--device gpu`, or
    `--device cuda` without a CUDA device). The `subquad` command checks every `--device` with it before a
    subcommand runs."""
    from ..errors import UserError

    allowed = "cpu, cuda, cuda:N, mps or xpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise UserError(f"--device {device!r} is not a device; use {allowed}") from None
    if dev.type == "cpu":
        return dev
    if dev.type not in _ACCELERATORS:
        raise UserError(f"--device {device!r}: subquad runs on {allowed}")
    if not _ACCELERATORS[dev.type]():
        name = {"cuda": "CUDA", "mps": "MPS (Apple GPU)", "xpu": "XPU (Intel GPU)"}[dev.type]
        raise UserError(f"--device {device}: no {name} device here; use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        n = torch.cuda.device_count()
        raise UserError(f"--device {device}: this machine has {n} CUDA device(s), cuda:0 to cuda:{n - 1}")
    return dev


def resolve_device(device: str = "") -> torch.device:
    """`device` (checked by `check_device`), or CUDA when available, else CPU (no process group)."""
    return check_device(device) if device else torch.device("cuda" if torch.cuda.is_available() else "cpu")


def init_distributed(device: str = "") -> DistInfo:
    """Start the process group when launched by torchrun (WORLD_SIZE > 1); pick the device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device:
        dev = check_device(device)
    else:
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local_rank if world > 1 else 0)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world <= 1:
        return DistInfo(device=dev)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return DistInfo(rank, world, local_rank, dev, True)


def cleanup(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def all_reduce_sum(values: list[float], info: DistInfo) -> list[float]:
    """Sum a list of floats over ranks (float64; identity without a process group)."""
    if not info.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=info.device if info.device.type == "cuda" else "cpu")
    dist.all_reduce(t)
    return t.tolist()


class GlobalBatchSampler(Sampler[int]):
    """Indices for one rank: global batch j is perm[j*G:(j+1)*G] (G = batch * world), rank r takes slice r.

    Args:
        n: dataset size.
        batch_size: per-rank batch.
        rank, world_size: this process and the number of processes.
        shuffle: permute with a generator seeded by (seed, epoch); otherwise keep order.
        seed: base seed.
        drop_last: drop the final incomplete global batch (training); otherwise the tail is split across ranks
            (evaluation, where the counts are summed over ranks).
    """

    def __init__(self, n: int, batch_size: int, rank: int = 0, world_size: int = 1, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = True) -> None:
        self.n, self.batch_size, self.rank, self.world = n, batch_size, rank, world_size
        self.shuffle, self.seed, self.drop_last, self.epoch, self.skip = shuffle, seed, drop_last, 0, 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """Draw the order of `epoch`; iteration starts after this rank's first `skip` batches (a resumed epoch)."""
        self.epoch, self.skip = epoch, skip

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def __iter__(self) -> Iterator[int]:
        order, g, b = self._order(), self.batch_size * self.world, self.batch_size
        full = self.n // g
        for j in range(self.skip, full):
            yield from order[j * g + self.rank * b: j * g + (self.rank + 1) * b]
        if not self.drop_last:
            yield from order[full * g:][self.rank::self.world]

    def __len__(self) -> int:
        g = self.batch_size * self.world
        full = (self.n // g) * self.batch_size
        if self.drop_last:
            return full
        tail = self.n - (self.n // g) * g
        return full + len(range(self.rank, tail, self.world))


def train_sampler(num_items: int, batch_size: int, info: DistInfo, seed: int) -> GlobalBatchSampler:
    """The shuffled, drop-last sampler of a training split; fewer items than one global batch is a UserError."""
    from ..errors import UserError

    global_batch = batch_size * info.world_size
    if num_items < global_batch:
        raise UserError(f"the training split has {num_items} images, fewer than one global batch ({global_batch}); "
                        "lower --batch-size")
    return GlobalBatchSampler(num_items, batch_size, info.rank, info.world_size, shuffle=True, seed=seed,
                              drop_last=True)
