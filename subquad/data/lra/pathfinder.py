"""Pathfinder (LRA): are the two marker discs connected by one dashed contour? Drawn with numpy and PIL only.

Procedure (after drewlinsley/pathfinder `snakes2.py` with LRA's parameters per resolution):
everything is drawn on a canvas of window * antialias_scale pixels and downsampled with LANCZOS.

1. Two *target* snakes start at seeds at least `seed_distance` apart, outside the `padding` border.
2. A snake is a chain of `contour_length` paddles (segments of `paddle_length`, width `paddle_thickness`), each
   separated from the previous by `paddle_margin`: the next paddle's end lies on the circle of radius
   paddle_length + margin around the current end. Candidate orientations (72, every 5 degrees) are weighted by
   (1 - occupancy) * cos^2(min(continuity * |turn|, pi / 2)); occupancy is 1 when the candidate leaves the canvas or
   comes within a guard distance of any stroke already drawn (other snakes, or this snake's earlier paddles), so
   distinct snakes never touch. A blocked snake is retried (4 times for targets, 4 for distractors); when the
   targets cannot be drawn, the whole image is resampled.
3. `num_distractor_snakes` distractors of `distractor_length` paddles are drawn with the same rules (one that stays
   blocked after its retrials is dropped).
4. Label ~ U{0, 1} (the first draw of the image's generator). One disc of `marker_radius` goes on an end of target
   A; the second on the other end of A (label 1, connected) or on an end of target B (label 0).
5. Strokes are drawn with intensity min(1, snake_contrast * paddle_contrast) * 255 and markers with 255, at high
   resolution with PIL, then resized to the window with LANCZOS and stored as 8-bit grayscale PNG.

Every image has its own generator seeded by (seed, index), so the output does not depend on the number of workers.
Files: `imgs/<shard>/sample_<index>.png` and `metadata.txt` with one line `<subdir> <filename> <index> <label>` per
image (LRA reads fields 0, 1 and 3). Splits: first 80 % train, next 10 % val, last 10 % test, in index order.

Official: drewlinsley/pathfinder snakes2.py / snakes2_wrapper.py and google-research/long-range-arena
lra_benchmarks/data/pathfinder.py (parameters); our re-implementation (the originals need scipy.misc and OpenCV).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ...errors import UserError
from ...files import atomic_write_text

__all__ = ["PathfinderParams", "params_for", "draw_sample", "sample_label", "write_pathfinder", "PathfinderDataset",
           "connected_oracle"]

VERSION = "1"
SHARD = 1000
_N_ANGLES = 72


@dataclass(frozen=True)
class PathfinderParams:
    """Generator parameters in output pixels."""

    window: int = 32
    padding: int = 1
    antialias_scale: int = 2
    paddle_length: float = 2.0
    paddle_thickness: float = 0.5
    paddle_margins: tuple[int, ...] = (1,)
    marker_radius: float = 1.5
    seed_distance: float = 7.0
    continuity: float = 1.0
    contour_length: int = 14
    distractor_length: int = 4
    num_distractor_snakes: int = 5
    snake_contrast: float = 2.0
    paddle_contrast: float = 0.75
    target_retrials: int = 4
    distractor_retrials: int = 4


def params_for(size: int = 32, contour_length: int = 14, distractors: int | None = None) -> PathfinderParams:
    """LRA's parameters for a 32, 64 or 128 pixel window (128 = Path-X); floor division for the distractor counts.

    `distractors` overrides the number of distractor snakes (LRA: 20, 22 or 35 // distractor length); fewer
    distractors make an easier task with the same contours.
    """
    if contour_length < 2:
        raise UserError(f"--contour-length must be >= 2, got {contour_length}")
    if distractors is not None and (isinstance(distractors, bool) or not isinstance(distractors, int)
                                    or distractors < 0):
        raise UserError(f"--distractors must be an integer >= 0, got {distractors!r}")
    dl = max(contour_length // 3, 1)
    if size == 32:
        p = PathfinderParams(32, 1, 2, 2.0, 0.5, (1,), 1.5, 7.0, 1.0, contour_length, dl, 20 // dl, 2.0, 0.75)
    elif size == 64:
        p = PathfinderParams(64, 1, 2, 5.0, 1.0, (1,), 2.5, 12.0, 1.8, contour_length, dl, 22 // dl, 0.8, 1.0)
    elif size == 128:
        p = PathfinderParams(128, 1, 2, 5.0, 1.5, (2, 3), 3.0, 20.0, 1.8, contour_length, dl, 35 // dl, 0.9, 1.0)
    else:
        raise UserError(f"unsupported Pathfinder size {size}; allowed: 32, 64, 128")
    return p if distractors is None else replace(p, num_distractor_snakes=distractors)


def _image_rng(seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, index])


def sample_label(seed: int, index: int) -> int:
    """The label of image `index` (the first draw of its generator, as in `draw_sample`)."""
    return int(_image_rng(seed, index).integers(0, 2))


class _Canvas:
    """High-resolution occupancy bookkeeping: a guard mask (strokes dilated) and the stroke path mask."""

    def __init__(self, p: PathfinderParams, margin: int) -> None:
        s = p.antialias_scale
        self.size = p.window * s
        self.lo = p.padding * s
        self.hi = self.size - p.padding * s
        self.L = p.paddle_length * s
        self.m = margin * s
        th = max(p.paddle_thickness * s, 1.0)
        # A guard above 2 * sqrt(2) pixels keeps the pixel sets of distinct snakes apart (8-connectivity).
        self.guard = self.m + th / 2 + 1.5
        r = int(math.ceil(self.guard))
        yy, xx = np.mgrid[-r:r + 1, -r:r + 1]
        keep = yy**2 + xx**2 <= self.guard**2
        self.disc = np.stack([yy[keep], xx[keep]], 1)
        self.occ = np.zeros((self.size, self.size), dtype=bool)
        self.path = np.zeros((self.size, self.size), dtype=np.int32)
        angles = np.arange(_N_ANGLES) * (2 * math.pi / _N_ANGLES)
        self.angles = angles
        self.dirs = np.stack([np.cos(angles), np.sin(angles)], 1)
        # Accepted snakes, each a list of paddles (start, end), in drawing order.
        self.snakes: list[list[tuple[np.ndarray, np.ndarray]]] = []

    def points(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Points every 0.5 px from a to b (inclusive): (P, 2) in (x, y)."""
        n = max(int(math.ceil(np.linalg.norm(b - a) / 0.5)), 1)
        t = np.linspace(0.0, 1.0, n + 1)[:, None]
        return a[None] * (1 - t) + b[None] * t

    def free(self, pts: np.ndarray) -> bool:
        if (pts < self.lo).any() or (pts >= self.hi).any():
            return False
        ij = np.floor(pts).astype(int)
        return not self.occ[ij[:, 1], ij[:, 0]].any()

    def stamp(self, pts: np.ndarray, snake_id: int) -> None:
        ij = np.floor(pts).astype(int)
        self.path[ij[:, 1], ij[:, 0]] = snake_id
        _stamp_guard(self, self.occ, pts)


def _grow(c: _Canvas, rng: np.random.Generator, length: int, continuity: float, snake_id: int,
          start: np.ndarray | None = None) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """Grow one snake; returns its paddles [(start, end)] or None when blocked. Stamps the canvas on success."""
    if start is None:
        start = rng.uniform(c.lo + c.L, c.hi - c.L, size=2)
    theta = rng.uniform(0, 2 * math.pi)
    s0, e0 = start, start + c.L * np.array([math.cos(theta), math.sin(theta)])
    first = c.points(s0, e0)
    if not c.free(first):
        return None
    paddles = [(s0, e0)]
    segments = [first]
    # Guard mask of this snake's own paddles except the current one (the next paddle starts next to it).
    own = np.zeros_like(c.occ)
    n_pts = max(int(math.ceil((c.L + c.m) / 0.5)), 1)
    t = np.linspace(0.0, 1.0, n_pts + 1)[1:]
    # Candidate offsets from the current end: (K, P, 2).
    offsets = (c.L + c.m) * t[None, :, None] * c.dirs[:, None, :]
    for _ in range(length - 1):
        end = paddles[-1][1]
        turn = np.abs((c.angles - theta + math.pi) % (2 * math.pi) - math.pi)
        w = np.cos(np.minimum(continuity * turn, math.pi / 2)) ** 2
        w[w <= 1e-12] = 0.0
        pts = end[None, None, :] + offsets
        inside = ((pts >= c.lo) & (pts < c.hi)).all(-1).all(-1)
        ij = np.clip(np.floor(pts).astype(int), 0, c.size - 1)
        hit = (c.occ | own)[ij[..., 1], ij[..., 0]].any(-1)
        w = w * (inside & ~hit)
        if w.sum() <= 0:
            return None
        k = int(rng.choice(_N_ANGLES, p=w / w.sum()))
        theta = c.angles[k]
        new_end = end + (c.L + c.m) * c.dirs[k]
        paddles.append((end + c.m * c.dirs[k], new_end))
        _stamp_guard(c, own, segments[-1])
        segments.append(np.concatenate([end[None], pts[k]]))
    for seg in segments:
        c.stamp(seg, snake_id)
    c.snakes.append(paddles)
    return paddles


def _stamp_guard(c: _Canvas, mask: np.ndarray, pts: np.ndarray) -> None:
    ij = np.floor(pts).astype(int)
    g = (ij[:, None, ::-1] + c.disc[None]).reshape(-1, 2)
    g = g[(g >= 0).all(1) & (g < c.size).all(1)]
    mask[g[:, 0], g[:, 1]] = True


def draw_sample(p: PathfinderParams, seed: int, index: int) -> tuple[np.ndarray, int, dict[str, Any]]:
    """Draw image `index`: returns (image (window, window) uint8, label, info with the high-res masks)."""
    from PIL import Image, ImageDraw

    rng = _image_rng(seed, index)
    label = int(rng.integers(0, 2))
    s = p.antialias_scale
    for _attempt in range(100):
        margin = int(rng.choice(p.paddle_margins))
        c = _Canvas(p, margin)
        snakes: list[list[tuple[np.ndarray, np.ndarray]]] = []
        for sid in (1, 2):
            snake = None
            for _ in range(p.target_retrials + 1):
                start = rng.uniform(c.lo + c.L, c.hi - c.L, size=2)
                if sid == 2 and np.linalg.norm(start - snakes[0][0][0]) < p.seed_distance * s:
                    continue
                snake = _grow(c, rng, p.contour_length, p.continuity, sid, start)
                if snake is not None:
                    break
            if snake is None:
                break
            snakes.append(snake)
        if len(snakes) == 2:
            break
    else:
        raise RuntimeError(f"Pathfinder: could not place two target snakes for image {index} (seed {seed})")
    for d in range(p.num_distractor_snakes):
        for _ in range(p.distractor_retrials):
            if _grow(c, rng, p.distractor_length, p.continuity, 3 + d) is not None:
                break
    a, b = snakes[0], snakes[1]
    ends_a = [a[0][0], a[-1][1]]
    first = int(rng.integers(0, 2))
    m1 = ends_a[first]
    if label == 1:
        m2 = ends_a[1 - first]
    else:
        m2 = [b[0][0], b[-1][1]][int(rng.integers(0, 2))]
    img = Image.new("L", (c.size, c.size), 0)
    draw = ImageDraw.Draw(img)
    value = int(round(255 * min(1.0, p.snake_contrast * p.paddle_contrast)))
    width = max(int(round(p.paddle_thickness * s)), 1)
    for snake in c.snakes:
        for s0, e0 in snake:
            draw.line([tuple(s0), tuple(e0)], fill=value, width=width)
    r = p.marker_radius * s
    for m in (m1, m2):
        draw.ellipse([m[0] - r, m[1] - r, m[0] + r, m[1] + r], fill=255)
    out = np.asarray(img.resize((p.window, p.window), Image.LANCZOS), dtype=np.uint8)
    info = {"path": c.path, "markers": (m1, m2), "scale": s}
    return out, label, info


def connected_oracle(info: dict[str, Any]) -> bool:
    """Flood fill (8-connectivity) over the high-res stroke path mask from marker 1: does it reach marker 2?"""
    from collections import deque

    path = info["path"] > 0
    (x1, y1), (x2, y2) = info["markers"]
    start = (min(int(y1), path.shape[0] - 1), min(int(x1), path.shape[1] - 1))
    goal = (min(int(y2), path.shape[0] - 1), min(int(x2), path.shape[1] - 1))
    if not path[start] or not path[goal]:
        raise ValueError("marker is not on a stroke")
    seen = np.zeros_like(path)
    seen[start] = True
    q = deque([start])
    H, W = path.shape
    while q:
        y, x = q.popleft()
        if (y, x) == goal:
            return True
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                ny, nx = y + dy, x + dx
                if 0 <= ny < H and 0 <= nx < W and path[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    q.append((ny, nx))
    return False


def _write_range(out: str, p: PathfinderParams, seed: int, lo: int, hi: int) -> list[str]:
    from PIL import Image

    lines = []
    for i in range(lo, hi):
        img, label, _ = draw_sample(p, seed, i)
        sub = f"imgs/{i // SHARD}"
        d = Path(out) / sub
        d.mkdir(parents=True, exist_ok=True)
        name = f"sample_{i}.png"
        Image.fromarray(img, mode="L").save(d / name, optimize=False)
        lines.append(f"{sub} {name} {i} {label}")
    return lines


def write_pathfinder(out: str | os.PathLike, size: int = 32, contour_length: int = 14, num_images: int = 200_000,
                     seed: int = 0, workers: int = 1, distractors: int | None = None) -> dict[str, Any]:
    """Generate `num_images` images + `metadata.txt` + `meta.json` under `out`; returns the meta dict.

    `distractors` overrides LRA's number of distractor snakes (see `params_for`).
    """
    if num_images < 1:
        raise UserError(f"--num-images must be >= 1, got {num_images}")
    p = params_for(size, contour_length, distractors)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    chunks = [(i, min(i + SHARD, num_images)) for i in range(0, num_images, SHARD)]
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers) as ex:
            parts = list(ex.map(_write_range, [os.fspath(out)] * len(chunks), [p] * len(chunks),
                                [seed] * len(chunks), [a for a, _ in chunks], [b for _, b in chunks]))
    else:
        parts = [_write_range(os.fspath(out), p, seed, a, b) for a, b in chunks]
    lines = [ln for part in parts for ln in part]
    text = "\n".join(lines) + "\n"
    atomic_write_text(out / "metadata.txt", text)
    positives = sum(int(ln.split()[3]) for ln in lines)
    meta = {"generator": "subquad.data.lra.pathfinder", "version": VERSION, "params": asdict(p), "seed": seed,
            "num_images": num_images, "positives": positives,
            "splits": {"train": [0, num_images * 8 // 10], "val": [num_images * 8 // 10, num_images * 9 // 10],
                       "test": [num_images * 9 // 10, num_images]},
            "metadata_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "seconds": round(time.perf_counter() - t0, 2)}
    atomic_write_text(out / "meta.json", json.dumps(meta, indent=2) + "\n")
    return meta


class PathfinderDataset(Dataset):
    """Generated Pathfinder split as dicts {tokens (window^2,) int64 intensities, mask all True, label}.

    Args:
        root: output folder of `write_pathfinder` (or any folder with metadata.txt in that layout).
        split: train (first 80 %), val (next 10 %) or test (last 10 %), in index order.
        limit: keep only the first `limit` images of the split.
        normalize: tokens as float intensities / 255 (for a linear pixel embedding) instead of ids 0-255.
    """

    def __init__(self, root: str | os.PathLike, split: str = "train", limit: int | None = None,
                 normalize: bool = False) -> None:
        from PIL import Image

        if split not in ("train", "val", "test"):
            raise UserError(f"unknown Pathfinder split {split!r}; allowed: train, val, test")
        root = Path(root)
        meta_path = root / "metadata.txt"
        if not meta_path.is_file():
            raise UserError(f"{meta_path} not found; create it with `subquad lra generate pathfinder --out {root}`")
        rows = []
        for lineno, line in enumerate(meta_path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            f = line.split()
            if len(f) < 4 or f[3] not in ("0", "1"):
                raise UserError(f"{meta_path}:{lineno}: malformed line: expected '<subdir> <file> <index> <label>' "
                                f"with label 0/1, got {line[:60]!r}")
            rows.append((f[0], f[1], int(f[3])))
        n = len(rows)
        a, b = {"train": (0, n * 8 // 10), "val": (n * 8 // 10, n * 9 // 10), "test": (n * 9 // 10, n)}[split]
        rows = rows[a:b][:limit] if limit else rows[a:b]
        imgs = [np.asarray(Image.open(root / sub / name).convert("L"), dtype=np.uint8).reshape(-1)
                for sub, name, _ in rows]
        self.pixels = np.stack(imgs) if imgs else np.zeros((0, 1), dtype=np.uint8)
        self.labels = np.array([r[2] for r in rows], dtype=np.int64)
        self.normalize = normalize

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        px = torch.from_numpy(self.pixels[i].astype(np.int64))
        tokens = px.float() / 255.0 if self.normalize else px
        return {"tokens": tokens, "mask": torch.ones(len(px), dtype=torch.bool),
                "label": torch.tensor(int(self.labels[i]))}
