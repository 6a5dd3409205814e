"""Long Range Arena data: the ListOps and Pathfinder generators, and loaders for user-supplied Text and Retrieval.

Every loader yields dicts: `tokens` int64 (L,), `mask` bool (L,) with True = real token, `label` int64; Retrieval
adds `tokens_1` / `mask_1`. Sources: the LRA repository's file formats.
"""

from __future__ import annotations

from ._tsv import read_tsv

__all__ = ["read_tsv", "TASKS"]

# Task name -> number of classes.
TASKS: dict[str, int] = {"listops": 10, "text": 2, "retrieval": 2, "image": 10, "pathfinder": 2}
