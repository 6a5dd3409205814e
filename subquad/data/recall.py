"""Synthetic associative recall, generated from a seed: `recall` (bidirectional) and `recall_causal` (MQAR).

The answer to each query is a value seen far earlier in the same sequence, so a mechanism that sees the whole
sequence solves it at any length, a window fails beyond its reach, and a linear mechanism is bounded by its state.
Written from the task definitions of Zoology (Arora et al. 2023, arXiv 2312.04927, Sec. 3, "multi-query
associative recall") and Based (arXiv 2402.18668, Sec. 3); no code is shared with either.

Vocabulary of `vocab` tokens: token 0 is the filler and token 1 the answer slot of the bidirectional task; values
are drawn from [vocab / 2, vocab) and keys from [1, vocab / 2) (causal) or [2, vocab / 2) (bidirectional), both
without repetition within an example.

`recall` (bidirectional), one example of `seq_len` tokens holding `kv` pairs:

    [filler x a] k1 v1 k2 v2 ... k_kv v_kv [filler x b] q_1 _ q_2 _ ... q_kv _

The queries q are the kv keys again in shuffled order, each followed by an answer slot `_` (token 1); the model is
scored at the answer slots: the target there is the value of the query's key, which is NOT in the input after its
pair (the value's only occurrence is in its pair). The filler between pairs and queries, b, is drawn log-uniformly
from [0, seq_len - 4 kv] (a = the rest), so the distances between a query and its pair cover every scale from a
few tokens to the whole sequence. (The answer slot mirrors the causal task, where the value follows its query: with
the host's causal short convolution, the slot and the pair's value token both hold the key one step back. A first
layout without slots, the queries back to back, failed its calibration: arena docs, recall.)

`recall_causal` (MQAR as Zoology defines it): the kv pairs k1 v1 ... come first; each key is then queried once, in
shuffled order, at a position after the pairs, the query key followed by its value (the model predicts that value
at the query position, as the next token); the gaps g between query slots are drawn without replacement with
p(g) proportional to g^(alpha - 1), alpha = 0.01 (Zoology's power law, many short and a few long gaps); every other
position is filler.

Every example records, for each query, the position it is scored at (`query_pos`: the answer slot, or the causal
query key whose next token is the value) and its distance d = (that position) - (position of the pair's value
token). `Batch.distance` (B, kv).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import UserError

__all__ = ["RecallBatch", "make_recall", "TASKS", "FILLER", "SLOT", "SPLIT_SEEDS", "check_sizes"]

TASKS = ("recall", "recall_causal")
FILLER = 0
SLOT = 1  # the answer slot after each bidirectional query
POWER_ALPHA = 0.01
# Streams of the three splits: an example's random draws come from np.random.default_rng((SPLIT, seed, index)), so
# the splits never share a generator state.
SPLIT_SEEDS = {"train": 0, "val": 1, "test": 2}


@dataclass
class RecallBatch:
    """tokens (B, L) int64; query_pos (B, kv) int64, the positions the model is scored at; target (B, kv) int64,
    the value expected there; distance (B, kv) int64, query position minus the pair's value position."""

    tokens: torch.Tensor
    query_pos: torch.Tensor
    target: torch.Tensor
    distance: torch.Tensor


def check_sizes(task: str, seq_len: int, kv: int, vocab: int) -> None:
    """Refuse (UserError) sizes no example can have."""
    if task not in TASKS:
        raise UserError(f"unknown recall task {task!r}; allowed: {', '.join(TASKS)}")
    for name, v in (("seq_len", seq_len), ("kv", kv), ("vocab", vocab)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UserError(f"recall: {name} must be an int >= 1, got {v!r}")
    if seq_len < 4 * kv:
        raise UserError(f"{task}: seq_len {seq_len} cannot hold {kv} pairs and their queries (needs >= {4 * kv})")
    if vocab // 2 - 2 < kv:
        raise UserError(f"recall: vocab {vocab} has {vocab // 2 - 2} keys, fewer than kv = {kv}")


def _one_bidirectional(rng: np.random.Generator, seq_len: int, kv: int, vocab: int):
    half = vocab // 2
    keys = rng.choice(np.arange(2, half), size=kv, replace=False)
    values = rng.choice(np.arange(half, vocab), size=kv, replace=False)
    free = seq_len - 4 * kv
    b = int(np.floor(np.exp(rng.uniform(0.0, np.log(free + 1.0))))) - 1
    b = min(max(b, 0), free)
    a = free - b
    tokens = np.full(seq_len, FILLER, dtype=np.int64)
    tokens[a:a + 2 * kv:2] = keys
    tokens[a + 1:a + 2 * kv:2] = values
    order = rng.permutation(kv)
    q0 = a + 2 * kv + b
    tokens[q0:q0 + 2 * kv:2] = keys[order]
    tokens[q0 + 1:q0 + 2 * kv:2] = SLOT
    query_pos = q0 + 1 + 2 * np.arange(kv)
    value_pos = a + 1 + 2 * order
    return tokens, query_pos, values[order], query_pos - value_pos


def _one_causal(rng: np.random.Generator, seq_len: int, kv: int, vocab: int):
    half = vocab // 2
    keys = rng.choice(np.arange(1, half), size=kv, replace=False)
    values = rng.choice(np.arange(half, vocab), size=kv, replace=False)
    tokens = np.full(seq_len, FILLER, dtype=np.int64)
    tokens[0:2 * kv:2] = keys
    tokens[1:2 * kv:2] = values
    slots = (seq_len - 2 * kv) // 2  # query slots of two tokens after the pairs
    g = np.arange(1, slots + 1, dtype=np.float64)
    p = g ** (POWER_ALPHA - 1.0)
    gaps = np.sort(rng.choice(slots, size=kv, replace=False, p=p / p.sum()))
    order = rng.permutation(kv)
    query_pos = 2 * kv + 2 * gaps
    tokens[query_pos] = keys[order]
    tokens[query_pos + 1] = values[order]
    return tokens, query_pos, values[order], query_pos - (1 + 2 * order)


def make_recall(task: str, n: int, seq_len: int, kv: int, vocab: int, seed: int, split: str = "train",
                start: int = 0) -> RecallBatch:
    """Examples `start .. start + n - 1` of split `split` of the stream `seed` (deterministic: the same arguments
    give the same batch on every machine). Bad sizes raise UserError."""
    check_sizes(task, seq_len, kv, vocab)
    if split not in SPLIT_SEEDS:
        raise UserError(f"recall: split must be one of {', '.join(SPLIT_SEEDS)}, got {split!r}")
    one = _one_bidirectional if task == "recall" else _one_causal
    rows = [one(np.random.default_rng((SPLIT_SEEDS[split], int(seed), start + i)), seq_len, kv, vocab)
            for i in range(n)]
    tokens, qpos, target, dist = (torch.from_numpy(np.stack(col)) for col in zip(*rows, strict=True))
    return RecallBatch(tokens=tokens, query_pos=qpos, target=target, distance=dist)
