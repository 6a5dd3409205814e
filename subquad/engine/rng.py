"""Seeds and RNG states of a training run: the per-epoch and per-step seeds every trainer draws from, and the
(python, numpy, torch, CUDA) generator states a resumable state file keeps."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["epoch_seed", "step_seed", "seed_everything", "rng_state", "set_rng_state"]


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """The seed of every RNG at the start of epoch `epoch` on `rank` (epoch -1: model initialisation)."""
    return (seed * 1_000_003 + (epoch + 1) * 7_919 + rank * 104_729) % (2**31 - 1)


def step_seed(seed: int, step: int) -> int:
    """The RNG seed of the training interval that starts after step `step` (0 = the start of training)."""
    return (seed * 1_000_003 + step * 7_919 + 12_345) % (2**31 - 1)


def seed_everything(s: int) -> None:
    """Seed python's `random`, numpy's global RNG and torch (all devices) with `s`."""
    random.seed(s)
    np.random.seed(s % (2**32))
    torch.manual_seed(s)


def rng_state() -> dict[str, Any]:
    """The global RNG states as tensors and plain containers (readable with torch.load(weights_only=True))."""
    py = random.getstate()
    npst = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": [py[0], list(py[1]), py[2]],
             "numpy": [npst[0], torch.from_numpy(npst[1].astype(np.int64)), int(npst[2]), int(npst[3]),
                       float(npst[4])]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], n[1].numpy().astype(np.uint32), n[2], n[3], n[4]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
