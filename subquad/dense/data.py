"""Dense-prediction data: a COCO-format reader, an ADE20K-format reader, and torchvision v2 transforms.

Specs (`--data`):
    `synthetic`       the generated set (subquad.dense.synthetic), COCO layout for detect, ADE20K twin for segment
    `coco:ROOT`       ROOT/annotations/instances_<split>.json + ROOT/<split>/ images (COCO 2017: train2017/val2017)
    `ade20k:ROOT`     ROOT/images/<split>/*.jpg|png + ROOT/annotations/<split>/*.png (ADEChallengeData2016:
                      training/validation); class names from ROOT/classes.txt or objectInfo150.csv when present

Detection samples are (tv_tensors.Image uint8 (3, H, W), target) with target = {boxes: BoundingBoxes XYXY (N, 4),
labels: (N,) int64 in 1..K, masks: Mask (N, H, W) uint8 (when asked), image_id: int}; crowd annotations are left out
of the targets (COCOeval still sees them). Segmentation samples are (Image, Mask (H, W) int64) with ADE20K's
`reduce_zero_label` rule: raw 0 (unlabelled) -> 255 (ignored), raw v -> v - 1.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import UserError
from .segment import IGNORE_INDEX

__all__ = ["CocoDetection", "ADE20KSegmentation", "load_coco", "open_dense_source", "DenseSource",
           "detection_transforms", "segmentation_transforms", "collate_detection", "read_rgb"]

_IMG_EXT = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


def read_rgb(path: str | os.PathLike) -> torch.Tensor:
    """An image file as a (3, H, W) uint8 tensor."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            arr = np.asarray(im.convert("RGB"))
    except OSError as e:
        raise UserError(f"cannot read image {path}: {e}") from None
    return torch.from_numpy(arr.copy()).permute(2, 0, 1)


def load_coco(ann_file: str | os.PathLike):
    """A pycocotools COCO object for `ann_file`, after checking that the file is COCO instances JSON."""
    from pycocotools.coco import COCO

    p = Path(ann_file)
    if not p.is_file():
        raise UserError(f"annotation file not found: {p}")
    try:
        data = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"annotation file {p} is not COCO instances JSON (not JSON: {e})") from None
    missing = [k for k in ("images", "annotations", "categories") if not isinstance(data, dict) or
               not isinstance(data.get(k), list)]
    if missing:
        raise UserError(f"annotation file {p} is not COCO instances JSON (no {missing[0]!r} list); expected keys "
                        "images, annotations, categories")
    for a in data["annotations"][:1] + data["annotations"][-1:]:
        need = [k for k in ("image_id", "category_id", "bbox") if k not in a]
        if need:
            raise UserError(f"annotation file {p} is not COCO instances JSON (an annotation has no {need[0]!r})")
    for im in data["images"][:1]:
        need = [k for k in ("id", "file_name", "height", "width") if k not in im]
        if need:
            raise UserError(f"annotation file {p} is not COCO instances JSON (an image has no {need[0]!r})")
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


class CocoDetection(Dataset):
    """COCO instances JSON + image folder (pycocotools), as torchvision detection samples.

    Args:
        ann_file: instances JSON.
        img_dir: folder holding the images named in it.
        transforms: v2 transform called as transforms(image, target).
        with_masks: decode instance masks (Mask R-CNN).
        remove_empty: drop images without non-crowd annotations (training, as torchvision's reference does).
    """

    def __init__(self, ann_file: str | os.PathLike, img_dir: str | os.PathLike, transforms: Callable | None = None,
                 with_masks: bool = True, remove_empty: bool = False) -> None:
        self.coco = load_coco(ann_file)
        self.img_dir = Path(img_dir)
        self.transforms, self.with_masks = transforms, with_masks
        self.cat_ids = sorted(self.coco.getCatIds())
        self.classes = [self.coco.cats[c]["name"] for c in self.cat_ids]
        self.cat_to_label = {c: i + 1 for i, c in enumerate(self.cat_ids)}
        self.label_to_cat = {i + 1: c for i, c in enumerate(self.cat_ids)}
        ids = sorted(self.coco.imgs)
        if remove_empty:
            ids = [i for i in ids if any(not a.get("iscrowd", 0) for a in self.coco.imgToAnns.get(i, []))]
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def target(self, image_id: int) -> dict[str, Any]:
        """Boxes (XYXY), labels and masks of one image (crowd annotations left out)."""
        from torchvision import tv_tensors

        info = self.coco.imgs[image_id]
        h, w = int(info["height"]), int(info["width"])
        anns = [a for a in self.coco.imgToAnns.get(image_id, []) if not a.get("iscrowd", 0)]
        boxes, labels, masks = [], [], []
        for a in anns:
            x, y, bw, bh = (float(v) for v in a["bbox"])
            if bw <= 0 or bh <= 0:
                continue
            if a["category_id"] not in self.cat_to_label:
                raise UserError(f"annotation {a.get('id')} has category_id {a['category_id']}, not among the "
                                f"categories {self.cat_ids}")
            boxes.append([x, y, x + bw, y + bh])
            labels.append(self.cat_to_label[a["category_id"]])
            if self.with_masks:
                masks.append(self.coco.annToMask(a) if a.get("segmentation") else
                             _box_mask(h, w, x, y, bw, bh))
        t: dict[str, Any] = {
            "boxes": tv_tensors.BoundingBoxes(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
                                              format="XYXY", canvas_size=(h, w)),
            "labels": torch.tensor(labels, dtype=torch.int64),
            "image_id": int(image_id)}
        if self.with_masks:
            m = np.stack(masks) if masks else np.zeros((0, h, w), np.uint8)
            t["masks"] = tv_tensors.Mask(torch.from_numpy(m.astype(np.uint8)))
        return t

    def __getitem__(self, index: int):
        from torchvision import tv_tensors

        image_id = self.ids[index]
        info = self.coco.imgs[image_id]
        img = tv_tensors.Image(read_rgb(self.img_dir / info["file_name"]))
        if tuple(img.shape[-2:]) != (int(info["height"]), int(info["width"])):
            raise UserError(f"image {info['file_name']} is {img.shape[-2]}x{img.shape[-1]} but its annotation says "
                            f"{info['height']}x{info['width']}")
        target = self.target(image_id)
        if self.transforms is not None:
            img, target = self.transforms(img, target)
        return img, target


def _box_mask(h: int, w: int, x: float, y: float, bw: float, bh: float) -> np.ndarray:
    m = np.zeros((h, w), np.uint8)
    m[int(y):int(np.ceil(y + bh)), int(x):int(np.ceil(x + bw))] = 1
    return m


def _ade_classes(root: Path) -> list[str] | None:
    txt = root / "classes.txt"
    if txt.is_file():
        return [line.strip() for line in txt.read_text().splitlines() if line.strip()]
    for name in ("objectInfo150.csv", "objectInfo150.txt"):
        f = root / name
        if f.is_file():
            import csv

            sep = "," if name.endswith(".csv") else "\t"
            rows = list(csv.reader(f.read_text().splitlines(), delimiter=sep))
            col = next((i for i, c in enumerate(rows[0]) if c.strip().lower() == "name"), len(rows[0]) - 1)
            return [r[col].split(";")[0].strip() for r in rows[1:] if r]
    return None


class ADE20KSegmentation(Dataset):
    """ADE20K-format folder: images/<split>/ + annotations/<split>/<stem>.png, labels 0 (unlabelled) .. K.

    Args:
        root: the folder holding images/ and annotations/.
        split: 'training' or 'validation' (any sub-folder name present in both).
        num_classes: K (labels above it are refused with the file named).
        transforms: v2 transform called as transforms(image, mask), or None.
    """

    def __init__(self, root: str | os.PathLike, split: str, num_classes: int,
                 transforms: Callable | None = None) -> None:
        self.root = Path(root)
        img_dir, ann_dir = self.root / "images" / split, self.root / "annotations" / split
        if not img_dir.is_dir() or not ann_dir.is_dir():
            raise UserError(f"ADE20K-format folder {self.root} has no images/{split} and annotations/{split}")
        self.images = sorted(p for p in img_dir.iterdir() if p.suffix.lower() in _IMG_EXT)
        self.labels = [ann_dir / (p.stem + ".png") for p in self.images]
        absent = [p for p in self.labels if not p.is_file()]
        if absent:
            raise UserError(f"label PNG {absent[0]} is missing (every image needs annotations/{split}/<stem>.png)")
        self.num_classes, self.transforms = num_classes, transforms

    def __len__(self) -> int:
        return len(self.images)

    def label(self, index: int) -> torch.Tensor:
        """(H, W) int64 in [0, K) or 255 (ignored)."""
        from PIL import Image

        path = self.labels[index]
        with Image.open(path) as im:
            if im.mode not in ("L", "P", "I", "I;16"):
                raise UserError(f"label PNG {path} has mode {im.mode}; expected one class index per pixel (L or P)")
            raw = np.asarray(im).astype(np.int64)
        bad = raw[(raw > self.num_classes) & (raw != 255)]
        if bad.size:
            raise UserError(f"label PNG {path} holds class value {int(bad.max())}, outside 0..{self.num_classes} "
                            "(0 = unlabelled, 255 = ignored)")
        lab = raw - 1
        lab[(raw == 0) | (raw == 255)] = IGNORE_INDEX
        return torch.from_numpy(lab)

    def __getitem__(self, index: int):
        from torchvision import tv_tensors

        img = tv_tensors.Image(read_rgb(self.images[index]))
        lab = tv_tensors.Mask(self.label(index))
        if tuple(lab.shape) != tuple(img.shape[-2:]):
            raise UserError(f"label PNG {self.labels[index]} is {tuple(lab.shape)} but its image is "
                            f"{tuple(img.shape[-2:])}")
        if self.transforms is not None:
            img, lab = self.transforms(img, lab)
        return img, lab


def detection_transforms(train: bool, hflip: float = 0.5) -> Callable:
    """v2 transforms for detection (boxes and masks move with the image); resizing happens inside the model."""
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    steps: list = []
    if train and hflip > 0:
        steps.append(v2.RandomHorizontalFlip(hflip))
    steps.append(v2.ToDtype({tv_tensors.Image: torch.float32, "others": None}, scale=True))
    if train:
        steps.append(v2.SanitizeBoundingBoxes())
    return v2.Compose(steps)


def segmentation_transforms(train: bool, scale: Sequence[float], ratio_range: Sequence[float],
                            crop_size: Sequence[float], hflip: float = 0.5, photometric: bool = False,
                            mean: Sequence[float] = (0.485, 0.456, 0.406),
                            std: Sequence[float] = (0.229, 0.224, 0.225)) -> Callable:
    """v2 transforms for segmentation, after mmsegmentation's ADE20K pipeline.

    Training: rescale to fit (short, long) = `scale` times a factor drawn from `ratio_range` (v2.ScaleJitter), random
    crop `crop_size` (padded with 0 / label 255 where the image is smaller), flip, optional photometric distortion,
    normalise. Evaluation: resize the short side to scale[0] with the long side at most scale[1], normalise (the label
    is not resized: the logits are resized back to it).
    """
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    short, long = int(scale[0]), int(scale[1])
    norm = [v2.ToDtype({tv_tensors.Image: torch.float32, "others": None}, scale=True), v2.Normalize(mean, std)]
    if not train:
        return v2.Compose([v2.Resize(short, max_size=long if long > short else None, antialias=True), *norm])
    crop = (int(crop_size[0]), int(crop_size[1]))
    steps: list = [v2.ScaleJitter((short, long), scale_range=(float(ratio_range[0]), float(ratio_range[1]))),
                   v2.RandomCrop(crop, pad_if_needed=True, fill={tv_tensors.Image: 0, tv_tensors.Mask: IGNORE_INDEX})]
    if hflip > 0:
        steps.append(v2.RandomHorizontalFlip(hflip))
    if photometric:
        steps.append(v2.RandomPhotometricDistort())
    return v2.Compose(steps + norm)


def collate_detection(batch: list) -> tuple[list, list]:
    return [b[0] for b in batch], [b[1] for b in batch]


@dataclass
class DenseSource:
    """One dense data set: a root, its splits, its classes, and how to read a split."""

    spec: str
    task: str
    root: Path
    train_split: str
    val_split: str
    classes: list[str]

    def coco_files(self, split: str) -> tuple[Path, Path]:
        return self.root / "annotations" / f"instances_{split}.json", self.root / split

    def detection(self, split: str, transforms: Callable | None, with_masks: bool,
                  remove_empty: bool = False) -> CocoDetection:
        ann, img_dir = self.coco_files(split)
        return CocoDetection(ann, img_dir, transforms, with_masks, remove_empty)

    def segmentation(self, split: str, num_classes: int, transforms: Callable | None) -> ADE20KSegmentation:
        return ADE20KSegmentation(self.root, split, num_classes, transforms)


def _pick(splits: list[str], prefer: tuple[str, ...], what: str, root: Path) -> str:
    for s in prefer:
        if s in splits:
            return s
    raise UserError(f"{root} has no {what} split (looked for {', '.join(prefer)}; found {', '.join(splits) or 'none'})")


def open_dense_source(spec: str, task: str, seed: int = 0) -> DenseSource:
    """Resolve `--data` for task 'detect' (COCO layout) or 'segment' (ADE20K layout)."""
    kind, _, path = spec.partition(":")
    if kind == "synthetic":
        from .synthetic import synthetic_root

        base = Path(path) if path else synthetic_root(seed)
        root = base / ("coco" if task == "detect" else "ade20k")
        kind = "coco" if task == "detect" else "ade20k"
    elif kind in ("coco", "ade20k") and path:
        root = Path(path).expanduser()
    else:
        raise UserError(f"unknown --data {spec!r}; allowed: synthetic, coco:ROOT (detect), ade20k:ROOT (segment)")
    if not root.is_dir():
        raise UserError(f"--data {spec}: folder not found: {root}")
    if task == "detect":
        if kind != "coco":
            raise UserError(f"detect reads COCO-format data (coco:ROOT), got {spec!r}")
        ann = root / "annotations"
        splits = sorted(p.name[len("instances_"):-len(".json")] for p in ann.glob("instances_*.json"))
        train = _pick(splits, ("train2017", "train"), "training", root)
        val = _pick(splits, ("val2017", "val"), "validation", root)
        coco = load_coco(ann / f"instances_{val}.json")
        classes = [coco.cats[c]["name"] for c in sorted(coco.getCatIds())]
        return DenseSource(spec, task, root, train, val, classes)
    if kind != "ade20k":
        raise UserError(f"segment reads ADE20K-format data (ade20k:ROOT), got {spec!r}")
    if not (root / "images").is_dir() and (root / "ADEChallengeData2016" / "images").is_dir():
        root = root / "ADEChallengeData2016"
    splits = sorted(p.name for p in (root / "images").glob("*") if p.is_dir()) if (root / "images").is_dir() else []
    train = _pick(splits, ("training", "train"), "training", root)
    val = _pick(splits, ("validation", "val"), "validation", root)
    classes = _ade_classes(root) or [f"class_{i + 1}" for i in range(150)]
    return DenseSource(spec, task, root, train, val, classes)
