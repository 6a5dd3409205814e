"""A seeded synthetic dense-prediction set: shapes with instance masks on textured backgrounds.

`generate_synthetic(root)` writes the same images in two layouts:

    root/coco/annotations/instances_train.json   COCO instances (polygons, iscrowd 0), categories circle/square/triangle
    root/coco/annotations/instances_val.json
    root/coco/train/000000.png ...               images (H x W RGB)
    root/coco/val/...
    root/ade20k/images/training/000000.png ...   the ADE20K-format twin: same images,
    root/ade20k/annotations/training/000000.png  label PNGs: 0 = unlabelled (ignored), 1 = background, 2.. = shapes
    root/ade20k/images/validation/...
    root/ade20k/classes.txt                      one class name per line, for labels 1.. (background, circle, ...)

Every image has a texture (a random mixture of low-frequency sinusoids per channel plus pixel noise) and 1 to
`max_objects` non-overlapping shapes of random colour, size, position and rotation, so the class is told by shape
alone. The polygons (stored at full float precision) are rasterised with pycocotools, exactly as the COCO reader
decodes them, and the label PNGs are the union of the same masks. Everything is drawn from
`numpy.random.default_rng(seed)`: one seed, one data set.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ..files import atomic_write_text

__all__ = ["SYNTHETIC_CLASSES", "generate_synthetic", "synthetic_root", "SYNTHETIC_VERSION"]

SYNTHETIC_CLASSES = ("circle", "square", "triangle")
SYNTHETIC_VERSION = 2
_DONE = ".complete"


def _texture(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """(H, W, 3) uint8: per-channel sums of 3 random low-frequency sinusoids, plus noise."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.empty((h, w, 3))
    base = rng.uniform(60, 190, size=3)
    for c in range(3):
        acc = np.zeros((h, w))
        for _ in range(3):
            fx, fy = rng.uniform(-0.25, 0.25, size=2)
            acc += rng.uniform(10, 35) * np.sin(2 * math.pi * (fx * xx + fy * yy) / 4 + rng.uniform(0, 2 * math.pi))
        img[..., c] = base[c] + acc
    img += rng.normal(0, 8, size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def _polygon(rng: np.random.Generator, kind: str, cx: float, cy: float, r: float) -> list[float]:
    """Flat [x0, y0, x1, y1, ...] polygon of a shape of circumradius r centred at (cx, cy)."""
    rot = rng.uniform(0, 2 * math.pi)
    n = {"circle": 32, "square": 4, "triangle": 3}[kind]
    if kind == "circle":
        rot = 0.0
    pts = []
    for k in range(n):
        a = rot + 2 * math.pi * k / n
        pts += [cx + r * math.cos(a), cy + r * math.sin(a)]
    return pts


def _mask(poly: list[float], h: int, w: int) -> np.ndarray:
    from pycocotools import mask as mask_utils

    rle = mask_utils.merge(mask_utils.frPyObjects([poly], h, w))
    return mask_utils.decode(rle).astype(bool)


def _draw(rng: np.random.Generator, h: int, w: int, max_objects: int, min_r: float, max_r: float):
    img = _texture(rng, h, w)
    objs: list[tuple[int, list[float], np.ndarray]] = []
    taken = np.zeros((h, w), bool)
    for _ in range(int(rng.integers(1, max_objects + 1))):
        for _try in range(20):
            cls = int(rng.integers(len(SYNTHETIC_CLASSES)))
            r = rng.uniform(min_r, max_r)
            cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
            poly = _polygon(rng, SYNTHETIC_CLASSES[cls], cx, cy, r)
            m = _mask(poly, h, w)
            grown = m.copy()
            grown[1:] |= m[:-1]
            grown[:-1] |= m[1:]
            grown[:, 1:] |= m[:, :-1]
            grown[:, :-1] |= m[:, 1:]
            if m.sum() >= 16 and not (grown & taken).any():
                break
        else:
            continue
        colour = rng.uniform(0, 255, size=3)
        shade = colour[None, :] + rng.normal(0, 6, size=(int(m.sum()), 3))
        img[m] = np.clip(shade, 0, 255).astype(np.uint8)
        taken |= m
        objs.append((cls, poly, m))
    return img, objs


def generate_synthetic(root: str | os.PathLike, seed: int = 0, n_train: int = 320, n_val: int = 64,
                       size: tuple[int, int] = (96, 128), max_objects: int = 3, min_r: float = 12.0,
                       max_r: float = 26.0) -> Path:
    """Write the COCO-format set and its ADE20K-format twin under `root` (see the module docstring).

    Args:
        root: output folder (created).
        seed: the one seed of the whole set.
        n_train, n_val: images per split (train / val in COCO, training / validation in ADE20K).
        size: (H, W) of every image.
        max_objects: at most this many shapes per image (at least one).
        min_r, max_r: range of the shapes' circumradius in pixels.
    """
    from PIL import Image

    from ..engine.checkpoint import write_json

    root = Path(root)
    h, w = int(size[0]), int(size[1])
    rng = np.random.default_rng(seed)
    cats = [{"id": i + 1, "name": n, "supercategory": "shape"} for i, n in enumerate(SYNTHETIC_CLASSES)]
    (root / "ade20k").mkdir(parents=True, exist_ok=True)
    atomic_write_text(root / "ade20k" / "classes.txt", "\n".join(("background",) + SYNTHETIC_CLASSES) + "\n")
    for split, ade_split, n in (("train", "training", n_train), ("val", "validation", n_val)):
        img_dir, ade_img, ade_ann = (root / "coco" / split, root / "ade20k" / "images" / ade_split,
                                     root / "ade20k" / "annotations" / ade_split)
        for d in (img_dir, ade_img, ade_ann):
            d.mkdir(parents=True, exist_ok=True)
        images, anns = [], []
        for i in range(n):
            img, objs = _draw(rng, h, w, max_objects, min_r, max_r)
            name = f"{i:06d}.png"
            Image.fromarray(img).save(img_dir / name)
            Image.fromarray(img).save(ade_img / name)
            label = np.ones((h, w), np.uint8)
            images.append({"id": i + 1, "file_name": name, "height": h, "width": w})
            for cls, poly, m in objs:
                label[m] = cls + 2
                ys, xs = np.nonzero(m)
                x0, y0 = float(xs.min()), float(ys.min())
                anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": cls + 1,
                             "segmentation": [[float(v) for v in poly]], "area": float(m.sum()),
                             "bbox": [x0, y0, float(xs.max()) + 1 - x0, float(ys.max()) + 1 - y0], "iscrowd": 0})
            Image.fromarray(label, mode="L").save(ade_ann / name)
        (root / "coco" / "annotations").mkdir(parents=True, exist_ok=True)
        write_json({"info": {"description": f"subquad synthetic shapes v{SYNTHETIC_VERSION}, seed {seed}"},
                    "images": images, "annotations": anns, "categories": cats},
                   root / "coco" / "annotations" / f"instances_{split}.json")
    atomic_write_text(root / _DONE, f"{SYNTHETIC_VERSION} {seed}\n")
    return root


def synthetic_root(seed: int = 0) -> Path:
    """The generated set of `seed` in $SUBQUAD_DATA (default ~/.cache/subquad/data), generated on first use.

    Generation goes to a temporary folder renamed into place, so concurrent or interrupted runs never see half a set.
    """
    from ..data.registry import data_home

    final = data_home() / f"dense-synthetic-v{SYNTHETIC_VERSION}-seed{seed}"
    if (final / _DONE).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        generate_synthetic(tmp, seed=seed)
        try:
            os.replace(tmp, final)
        except OSError:
            # Another process finished first (the target exists and is not empty).
            if not (final / _DONE).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
