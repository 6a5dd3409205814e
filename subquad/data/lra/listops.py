"""ListOps (LRA): the published generator recipe, the TSV files of the LRA release and two tokenisations.

Generator (docs/deviations.md): trees of MIN / MAX / MED / SM over the digits 0-9, sampled by
`generate_tree(depth=1, max_depth=10, max_args=10)` (a value with probability 0.75 or at the depth limit, else an
operator with 2..max_args arguments); a tree is kept iff min_len < length < max_len (strict), where length counts
values, operators and closing brackets. Trees are deduplicated in insertion order and split into train / val / test
in that order, so the splits are disjoint and the output is a pure function of (parameters, seed).

Text form (identical to the LRA release, header `Source<TAB>Target`): the tree is built as nested pairs (op, a1),
((op, a1), a2), ..., (..., ']') and every pair is printed `( left right )`, e.g. `[MAX 2 9]` is written
`( ( ( [MAX 2 ) 9 ) ] )` with Target 9.

Encodings at load time:
    lra_released: what the LRA pipeline's tokenizer keeps (operator names and digits; every bracket dropped; this
        produced the published numbers). Ids: 0 pad, 1-10 digits '0'-'9', 11 MIN, 12 MAX, 13 MED, 14 SM.
    structural: keeps `[MIN` ... `[SM` and `]` (parentheses dropped); ids as above plus 15 = `]`. The length equals
        the recipe length.

Official: google-research/long-range-arena lra_benchmarks/data/listops.py (generator) and
lra_benchmarks/listops/input_pipeline.py (tokeniser); recipe facts only, the code is ours.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ...errors import UserError
from ...files import atomic_write_text
from ._tsv import read_tsv

__all__ = ["OPERATORS", "ENCODINGS", "generate_tree", "generate", "write_listops", "evaluate_source",
           "encode_source", "ListOpsDataset", "vocab_size"]

_logger = logging.getLogger(__name__)

GENERATOR_VERSION = "1"
OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
VALUE_P = 0.25
ENCODINGS = ("lra_released", "structural")
SPLITS = ("train", "val", "test")

# Single-character stand-ins used to encode a Source string with C-speed str.replace + a byte lookup table.
_CHAR_OF = {"[MIN": "A", "[MAX": "B", "[MED": "C", "[SM": "D", END: "E"}


def _lookup_table(encoding: str) -> np.ndarray:
    """Byte -> id table (255 = not a token) for one encoding."""
    table = np.full(256, 255, dtype=np.uint8)
    for d in range(10):
        table[ord(str(d))] = 1 + d
    for i, op in enumerate(OPERATORS):
        table[ord(_CHAR_OF[op])] = 11 + i
    if encoding == "structural":
        table[ord(_CHAR_OF[END])] = 15
    return table


def vocab_size(encoding: str) -> int:
    """Ids used by `encoding` (pad included): 15 for lra_released, 16 for structural."""
    _check_encoding(encoding)
    return 15 if encoding == "lra_released" else 16


def _check_encoding(encoding: str) -> None:
    if encoding not in ENCODINGS:
        raise UserError(f"unknown ListOps encoding {encoding!r}; allowed: {', '.join(ENCODINGS)}")


def _apply(op: str, args: list[int]) -> int:
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[SM":
        return sum(args) % 10
    s = sorted(args)
    n = len(s)
    # MED = int(numpy.median(args)): mean of the two middle values for an even count, truncated.
    return s[n // 2] if n % 2 else int((s[n // 2 - 1] + s[n // 2]) / 2)


def generate_tree(rng: random.Random, depth: int = 1, max_depth: int = 10, max_args: int = 10) -> tuple[str, int, int]:
    """Sample one tree; returns (text form, recipe length, value).

    Recipe: at depth < max_depth draw r ~ U[0, 1) (else r = 1); r > 0.25 gives a digit (length 1), otherwise an
    operator with n ~ U{2..max_args} recursively sampled arguments (length 2 + the arguments' lengths).
    """
    r = rng.random() if depth < max_depth else 1.0
    if r > VALUE_P:
        v = rng.randint(0, 9)
        return str(v), 1, v
    n = rng.randint(2, max_args)
    texts, values, length = [], [], 2
    for _ in range(n):
        t, ln, v = generate_tree(rng, depth + 1, max_depth, max_args)
        texts.append(t)
        values.append(v)
        length += ln
    op = rng.choice(OPERATORS)
    # Nested pairs: ( ( ( op a1 ) a2 ) ... an ) then ( ... ] ).
    parts = ["( " * (n + 1), op, " ", texts[0], " )"]
    for t in texts[1:]:
        parts += [" ", t, " )"]
    parts.append(" ] )")
    return "".join(parts), length, _apply(op, values)


def generate(num_samples: int, seed: int = 0, min_len: int = 500, max_len: int = 2000, max_depth: int = 10,
             max_args: int = 10, max_tries: int | None = None) -> list[tuple[str, int]]:
    """Collect `num_samples` distinct trees with min_len < length < max_len; returns [(source, value)] in order."""
    if num_samples < 0 or min_len < 0 or max_len <= min_len + 1:
        raise UserError(f"need num_samples >= 0 and 0 <= min_len < max_len - 1, got num_samples={num_samples}, "
                        f"min_len={min_len}, max_len={max_len}")
    if max_depth < 1 or max_args < 2:
        raise UserError(f"need max_depth >= 1 and max_args >= 2, got {max_depth} and {max_args}")
    rng = random.Random(seed)
    found: dict[str, int] = {}
    tries = 0
    max_tries = max_tries if max_tries is not None else 10_000 + 2_000 * num_samples
    while len(found) < num_samples:
        tries += 1
        if tries > max_tries:
            raise UserError(f"ListOps: only {len(found)} of {num_samples} trees with {min_len} < length < {max_len} "
                            f"after {max_tries} draws; widen --min-len/--max-len")
        text, length, value = generate_tree(rng, 1, max_depth, max_args)
        if min_len < length < max_len and text not in found:
            found[text] = value
    return list(found.items())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_listops(out: str | os.PathLike, num_train: int = 96_000, num_val: int = 2_000, num_test: int = 2_000,
                  seed: int = 0, min_len: int = 500, max_len: int = 2000) -> dict[str, Any]:
    """Generate and write `train.tsv`, `val.tsv`, `test.tsv` and `meta.json` under `out`; returns the meta dict."""
    sizes = {"--num-train": num_train, "--num-val": num_val, "--num-test": num_test}
    bad = {k: v for k, v in sizes.items() if not isinstance(v, int) or v < 0}
    if bad:
        raise UserError(f"split sizes must be whole numbers >= 0, got {bad}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    samples = generate(num_train + num_val + num_test, seed, min_len, max_len)
    bounds = {"train": (0, num_train), "val": (num_train, num_train + num_val),
              "test": (num_train + num_val, num_train + num_val + num_test)}
    files = {}
    for split, (a, b) in bounds.items():
        path = out / f"{split}.tsv"
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write("Source\tTarget\n")
            f.writelines(f"{src}\t{val}\n" for src, val in samples[a:b])
        os.replace(tmp, path)
        files[path.name] = {"samples": b - a, "sha256": _sha256(path)}
    meta = {"generator": "subquad.data.lra.listops", "version": GENERATOR_VERSION,
            "params": {"num_train": num_train, "num_val": num_val, "num_test": num_test, "seed": seed,
                       "min_len": min_len, "max_len": max_len, "max_depth": 10, "max_args": 10,
                       "value_p": VALUE_P, "operators": list(OPERATORS)},
            "files": files, "seconds": round(time.perf_counter() - t0, 2)}
    atomic_write_text(out / "meta.json", json.dumps(meta, indent=2) + "\n")
    return meta


def evaluate_source(source: str) -> int:
    """Evaluate a Source string of the LRA text form (independently of the generator) and return its value."""
    stack: list[list[Any]] = []
    result = None
    for tok in source.split():
        if tok in ("(", ")"):
            continue
        if tok in OPERATORS:
            stack.append([tok])
        elif tok == END:
            if not stack:
                raise ValueError(f"unbalanced ']' in ListOps source {source[:60]!r}")
            op, *args = stack.pop()
            value = _apply(op, args)
            if stack:
                stack[-1].append(value)
            else:
                result = value
        elif len(tok) == 1 and tok.isdigit():
            if stack:
                stack[-1].append(int(tok))
            else:
                result = int(tok)
        else:
            raise ValueError(f"unknown ListOps token {tok!r}")
    if stack or result is None:
        raise ValueError(f"incomplete ListOps source {source[:60]!r}")
    return result


def encode_source(source: str, encoding: str = "lra_released") -> np.ndarray:
    """Source text -> ids (uint8, unpadded) under `encoding`; raises ValueError on an unknown token."""
    _check_encoding(encoding)
    s = source
    for tok, ch in _CHAR_OF.items():
        s = s.replace(tok, ch)
    s = s.replace("(", "").replace(")", "").replace(" ", "")
    if encoding == "lra_released":
        s = s.replace(_CHAR_OF[END], "")
    ids = _lookup_table(encoding)[np.frombuffer(s.encode("ascii", errors="replace"), dtype=np.uint8)]
    if (ids == 255).any():
        bad = sorted({c for c in s if _lookup_table(encoding)[ord(c) if ord(c) < 256 else 0] == 255})
        raise ValueError(f"unknown ListOps token(s) {bad!r}")
    return ids


def _find_split_file(root: Path, split: str) -> Path:
    names = [f"{split}.tsv", f"basic_{split}.tsv"]
    for n in names:
        if (root / n).is_file():
            return root / n
    raise UserError(f"ListOps split {split!r} not found in {root}: expected one of {names} "
                    f"(create it with `subquad lra generate listops --out {root}`)")


class ListOpsDataset(Dataset):
    """ListOps split as dicts {tokens (L,) int64, mask (L,) bool, label () int64}, padded to `max_len`.

    Reads `<split>.tsv` (ours) or `basic_<split>.tsv` (the LRA release). Token arrays are built once per encoding
    and cached next to the TSV as `<split>.<encoding>.npz` (keyed by the TSV's size and mtime).

    Args:
        root: folder with the TSV files.
        split: train, val or test.
        encoding: lra_released (published numbers) or structural (keeps the operator brackets).
        max_len: padded length (LRA: 2000 padded to 2048); longer sequences are truncated.
        limit: read only the first `limit` rows.
        cache: read/write the .npz cache.
    """

    def __init__(self, root: str | os.PathLike, split: str = "train", encoding: str = "lra_released",
                 max_len: int = 2048, limit: int | None = None, cache: bool = True) -> None:
        _check_encoding(encoding)
        if split not in SPLITS:
            raise UserError(f"unknown ListOps split {split!r}; allowed: {', '.join(SPLITS)}")
        root = Path(root)
        if not root.is_dir():
            raise UserError(f"ListOps data folder {root} does not exist")
        self.path = _find_split_file(root, split)
        self.encoding = encoding
        self.max_len = max_len
        st = self.path.stat()
        cache_path = self.path.with_name(f"{self.path.stem}.{encoding}.npz")
        key = np.array([st.st_size, st.st_mtime_ns, -1 if limit is None else limit], dtype=np.int64)
        if cache and cache_path.is_file():
            with np.load(cache_path) as z:
                if np.array_equal(z["key"], key):
                    self._ids, self._offsets, self.labels = z["ids"], z["offsets"], z["labels"]
                    return
        self._ids, self._offsets, self.labels = self._encode(limit)
        if cache:
            tmp = cache_path.with_name(f".{cache_path.name}.tmp.npz")
            try:
                np.savez(tmp, ids=self._ids, offsets=self._offsets, labels=self.labels, key=key)
                os.replace(tmp, cache_path)
            except OSError as e:
                _logger.debug("ListOps cache not written (%s)", e)

    def _encode(self, limit: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows = read_tsv(self.path, 2, header=("Source", "Target"), limit=limit)
        chunks, labels = [], np.empty(len(rows), dtype=np.int64)
        for i, (src, tgt) in enumerate(rows):
            try:
                chunks.append(encode_source(src, self.encoding))
                label = int(float(tgt))
            except ValueError as e:
                raise UserError(f"{self.path}:{i + 2}: malformed ListOps line: {e}") from None
            if not 0 <= label <= 9:
                raise UserError(f"{self.path}:{i + 2}: Target must be a digit 0-9, got {tgt!r}")
            labels[i] = label
        lengths = np.array([len(c) for c in chunks], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        ids = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint8)
        return ids, offsets, labels

    def __len__(self) -> int:
        return len(self.labels)

    def lengths(self) -> np.ndarray:
        """Unpadded token counts per example."""
        return np.diff(self._offsets)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self._ids[self._offsets[i]:self._offsets[i + 1]][: self.max_len]
        tokens = torch.zeros(self.max_len, dtype=torch.int64)
        tokens[: len(ids)] = torch.from_numpy(ids.astype(np.int64))
        return {"tokens": tokens, "mask": tokens != 0, "label": torch.tensor(int(self.labels[i]))}
