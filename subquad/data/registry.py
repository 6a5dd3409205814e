"""Image data sources for `subquad train/eval/predict`, selected by a spec string.

Specs:
    `digits`                scikit-learn's handwritten digits (offline default; train/val/test, val held out of the
                            training part)
    `fashion-mnist[:DIR]`   IDX files from the Debian package `dataset-fashion-mnist` or DIR (train/val/test)
    `imagefolder:PATH`      PATH/train/<class>/<image>, PATH/val/<class>/<image> and optionally PATH/test/...
    `cifar10:PATH`, `cifar100:PATH`   the python-pickle release (train/val/test: val is a fixed 10 % of each class's
                            training images), read with a restricted unpickler

Selection never sees the test split: `val_split` selects checkpoints during training; `test_split` (None when a
source has none, e.g. an image folder without test/) is evaluated once, at the end, for the selected checkpoint.

Every dataset yields (PIL image, int label); `TransformDataset` converts the mode to the model's channels (gray to
3 channels) and applies a transform. `build_transform` makes the train/eval transforms with timm's `create_transform`
(aug="timm") or the light preset (aug="light": resize, random crop with padding S/8, horizontal flip; RandAugment and
random erasing still apply when asked), or resize only (aug="none"). `resolve_aug` turns aug="auto" into one of them
from the image size and the number of training images per class: timm's ImageNet RandomResizedCrop recipe zooms into
8-100 % crops, which on small images (under 64 px) or small sets (under 200 images per class) destroys more than it
adds, so those get the light preset.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, Subset

from ..errors import UserError

__all__ = ["ImageSource", "ArrayDataset", "TransformDataset", "parse_data_spec", "open_source", "build_transform",
           "resolve_aug", "DATA_SPECS", "AUG_PRESETS"]

DATA_SPECS = ("digits", "fashion-mnist", "fashion-mnist:DIR", "imagefolder:PATH", "cifar10:PATH", "cifar100:PATH",
              "video:DIR")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
AUG_PRESETS = ("none", "light", "timm")
# `--aug auto` picks timm's RandomResizedCrop recipe only for images at least this large with at least this many
# training images per class; smaller images or sets get the light preset.
AUTO_TIMM_MIN_SIDE = 64
AUTO_TIMM_MIN_PER_CLASS = 200


class ArrayDataset(Dataset):
    """In-memory uint8 images (N, H, W) or (N, H, W, 3) with int labels; yields (PIL image, label)."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images, self.targets = images, [int(t) for t in labels]

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        return Image.fromarray(self.images[index]), self.targets[index]


class TransformDataset(Dataset):
    """Wrap a (PIL image, label) dataset: convert to `mode` ("L" or "RGB") and apply `transform`."""

    def __init__(self, base: Dataset, transform: Callable, mode: str = "RGB") -> None:
        self.base, self.transform, self.mode = base, transform, mode

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        img, label = self.base[index]
        if img.mode != self.mode:
            img = img.convert(self.mode)
        return self.transform(img), label


@dataclass
class ImageSource:
    """A resolved data spec: class names, split builders, normalisation and the default augmentation preset.

    Attributes:
        name: the spec.
        classes: class names (index = label).
        splits: split name -> zero-argument builder of a (PIL image, label) dataset.
        train_split / val_split / test_split: which split trains, which one is evaluated during training to select
            the checkpoint, and which one is evaluated once at the end (None: the source has no test split; the
            final report then names `val_split`).
        mean, std: per-channel normalisation for 3 channels.
        aug: default training augmentation preset: "auto" (chosen by `resolve_aug` from image size and set size),
            or a fixed "none", "light" or "timm" for sources where the choice is a property of the data (digits:
            "none", since a flipped or shifted 8 x 8 digit is another digit).
        native_size: the images' own side (None when they vary).
        video: the splits hold (video path, label) pairs (`subquad.data.video`), not images.
    """

    name: str
    classes: list[str]
    splits: dict[str, Callable[[], Dataset]]
    train_split: str = "train"
    val_split: str = "val"
    test_split: str | None = "test"
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    aug: str = "auto"
    native_size: int | None = None
    video: bool = False
    _cache: dict[str, Dataset] = field(default_factory=dict, repr=False)

    def dataset(self, split: str, limit: int = 0, seed: int = 0) -> Dataset:
        """The (PIL image, label) dataset of `split`; `limit` > 0 keeps a seeded random subset of that size."""
        if split not in self.splits:
            raise UserError(f"data {self.name!r} has no split {split!r}; allowed: {', '.join(self.splits)}")
        if split not in self._cache:
            self._cache[split] = self.splits[split]()
        ds = self._cache[split]
        if len(ds) == 0:
            raise UserError(f"data {self.name!r} split {split!r} is empty")
        if 0 < limit < len(ds):
            keep = np.sort(np.random.RandomState(seed).permutation(len(ds))[:limit])
            ds = Subset(ds, keep.tolist())
        return ds


def parse_data_spec(spec: str) -> tuple[str, str | None]:
    """'cifar10:/data/c10' -> ('cifar10', '/data/c10'); names are case-insensitive; unknown kinds are a UserError."""
    kind, _, path = spec.partition(":")
    kind = kind.strip().lower().replace("_", "-")
    if kind in ("fmnist", "fashionmnist"):
        kind = "fashion-mnist"
    allowed = {"digits": False, "fashion-mnist": None, "imagefolder": True, "cifar10": True, "cifar100": True,
               "video": True}
    if kind not in allowed:
        raise UserError(f"unknown data {spec!r}; allowed: {', '.join(DATA_SPECS)}")
    need = allowed[kind]
    if need is True and not path:
        raise UserError(f"data {kind!r} needs a path: --data {kind}:PATH")
    if need is False and path:
        raise UserError(f"data {kind!r} takes no path (got {spec!r})")
    return kind, (path or None)


def _arrays_source(name: str, arrays: Callable[[], dict], classes: list[str], **kw) -> ImageSource:
    cache: dict[str, dict] = {}

    def get(split: str) -> Dataset:
        if "a" not in cache:
            cache["a"] = arrays()
        return ArrayDataset(*cache["a"][split])

    splits = {s: (lambda s=s: get(s)) for s in kw.pop("split_names")}
    return ImageSource(name, classes, splits, **kw)


def open_source(spec: str, download: bool = False, need_val: bool = True) -> ImageSource:
    """Resolve a data spec to an ImageSource (opens files lazily except to check that the paths exist).

    `need_val=False` (evaluation of one named split) accepts an image folder without val/; training needs it."""
    kind, path = parse_data_spec(spec)
    if kind == "digits":
        from .small import DIGITS_CLASSES, digits_arrays

        return _arrays_source(spec, digits_arrays, DIGITS_CLASSES, split_names=("train", "val", "test", "train_full"),
                              mean=(0.5,) * 3, std=(0.5,) * 3, aug="none", native_size=8)
    if kind == "fashion-mnist":
        from . import fashion_mnist as fm

        try:
            root = fm.find_fashion_mnist(path)
        except UserError:
            if not download:
                raise
            root = fm.download_fashion_mnist(path)
        return _arrays_source(spec, lambda: fm.fashion_mnist_arrays(root), fm.FASHION_MNIST_CLASSES,
                              split_names=("train", "val", "test", "train_full"), mean=(fm.MEAN,) * 3,
                              std=(fm.STD,) * 3, aug="auto", native_size=28)
    if kind in ("cifar10", "cifar100"):
        from .cifar import CIFAR_MEAN, CIFAR_STD, cifar_arrays

        n = 10 if kind == "cifar10" else 100
        if not Path(path).exists():
            raise UserError(f"CIFAR directory not found: {path}")
        from .small import holdout_split

        arrays, classes = cifar_arrays(path, n)
        keep, held = holdout_split(arrays["train"][1], 0.1, seed=0)
        images, labels = arrays["train"]
        arrays = {"train": (images[keep], labels[keep]), "val": (images[held], labels[held]), "test": arrays["test"],
                  "train_full": arrays["train"]}
        return ImageSource(spec, classes, {s: (lambda s=s: ArrayDataset(*arrays[s])) for s in arrays},
                           mean=CIFAR_MEAN, std=CIFAR_STD, aug="auto", native_size=32)
    if kind == "video":
        return _video_source(spec, Path(path), need_val)
    from .imagefolder import ImageFolderDataset, find_classes

    root = Path(path)
    if not root.is_dir():
        raise UserError(f"image folder not found: {root}")
    classes = find_classes(root / "train")
    splits = {s: (lambda s=s: ImageFolderDataset(root / s, classes)) for s in ("train", "val", "test")
              if (root / s).is_dir()}
    if "val" not in splits and need_val:
        raise UserError(f"image folder {root} has no val/ split (expected {root}/val/<class>/<image>)")
    return ImageSource(spec, classes, splits, val_split="val", test_split="test" if "test" in splits else None,
                       aug="auto")


class _PathList(Dataset):
    """(video path, label) pairs of one split (decoded later by `subquad.data.video.VideoClipDataset`)."""

    def __init__(self, samples: list[tuple[str, int]]) -> None:
        self.samples, self.targets = samples, [lab for _, lab in samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[str, int]:
        return self.samples[index]


def _video_source(spec: str, root: Path, need_val: bool) -> ImageSource:
    from .video import read_video_list

    if not root.is_dir():
        raise UserError(f"video folder not found: {root}")
    train, names = read_video_list(root, "train")
    labels = {lab for _, lab in train}
    n = len(names) if names else (max(labels) + 1 if labels else 0)
    classes = names or [str(i) for i in range(n)]
    lists = {"train": train}
    for s in ("val", "test"):
        try:
            lists[s] = read_video_list(root, s)[0]
        except UserError:
            if s == "val" and need_val:
                raise
    for s, samples in lists.items():
        bad = [lab for _, lab in samples if not 0 <= lab < n]
        if bad:
            raise UserError(f"{root} split {s!r} has label {bad[0]} outside 0..{n - 1} ({n} classes)")
    return ImageSource(spec, classes, {s: (lambda s=s: _PathList(lists[s])) for s in lists},
                       test_split="test" if "test" in lists else None, mean=(0.45,) * 3, std=(0.225,) * 3,
                       aug="none", video=True)


def resolve_aug(source: ImageSource, img_size: int, num_train: int, aug: str = "auto") -> tuple[str, str]:
    """(preset, reason): the training augmentation `aug` stands for, and why (one phrase, for the start-up line).

    `aug` other than "auto" is the user's explicit choice. Under "auto" a source's own fixed preset wins; otherwise
    timm's recipe needs images of at least AUTO_TIMM_MIN_SIDE px and AUTO_TIMM_MIN_PER_CLASS images per class.
    """
    if aug != "auto":
        if aug not in AUG_PRESETS:
            raise UserError(f"unknown augmentation preset {aug!r}; allowed: auto, {', '.join(AUG_PRESETS)}")
        return aug, "set by --aug"
    if source.aug != "auto":
        return source.aug, f"auto: fixed for data {source.name!r}"
    side = min(img_size, source.native_size) if source.native_size else img_size
    per_class = num_train / max(1, len(source.classes))
    what = f"auto: {side} px images, {per_class:.0f} per class"
    if side >= AUTO_TIMM_MIN_SIDE and per_class >= AUTO_TIMM_MIN_PER_CLASS:
        return "timm", what
    return "light", what


def build_transform(source: ImageSource, img_size: int | tuple[int, int], is_training: bool, aug: str = "auto",
                    interpolation: str = "", crop_pct: float | None = None,
                    mean: tuple[float, ...] | None = None, std: tuple[float, ...] | None = None,
                    scale: tuple[float, float] | None = None, ratio: tuple[float, float] | None = None,
                    hflip: float = 0.5, color_jitter: float = 0.4, aa: str | None = None, reprob: float = 0.0,
                    remode: str = "pixel", recount: int = 1, train_interpolation: str = "random",
                    in_chans: int = 3) -> Callable:
    """Train or eval transform (PIL image -> normalised tensor (in_chans, H, W)) for `source` at `img_size`, a side
    S (S x S) or (H, W)."""
    from timm.data import create_transform
    from torchvision import transforms as T

    hw = (img_size, img_size) if isinstance(img_size, int) else (int(img_size[0]), int(img_size[1]))
    img_size = hw[0] if hw[0] == hw[1] else hw
    if aug == "auto":
        aug = source.aug if source.aug != "auto" else ("light" if (source.native_size or min(hw)) <
                                                       AUTO_TIMM_MIN_SIDE else "timm")
    if aug not in AUG_PRESETS:
        raise UserError(f"unknown augmentation preset {aug!r}; allowed: auto, {', '.join(AUG_PRESETS)}")
    mean = tuple(mean or source.mean)[:in_chans] if in_chans != 3 else tuple(mean or source.mean)
    std = tuple(std or source.std)[:in_chans] if in_chans != 3 else tuple(std or source.std)
    interp = interpolation or ("bilinear" if source.native_size else "bicubic")
    if aug == "timm":
        return create_transform(img_size, is_training=is_training, scale=scale, ratio=ratio, hflip=hflip,
                                color_jitter=color_jitter, auto_augment=aa,
                                interpolation=train_interpolation if is_training else interp, mean=mean, std=std,
                                re_prob=reprob, re_mode=remode, re_count=recount,
                                crop_pct=crop_pct if crop_pct is not None else (None if not source.native_size
                                                                                else 1.0))
    from timm.data.auto_augment import rand_augment_transform
    from timm.data.random_erasing import RandomErasing
    from timm.data.transforms import str_to_interp_mode

    steps: list = [T.Resize(hw, interpolation=str_to_interp_mode(interp))]
    if is_training and aug == "light":
        steps += [T.RandomCrop(hw, padding=max(1, min(hw) // 8)), T.RandomHorizontalFlip(hflip)]
    if is_training and aa:
        if not aa.startswith("rand"):
            raise UserError(f"--aa {aa!r}: with the light/none presets only RandAugment ('rand-m9-mstd0.5') is "
                            "supported; use --aug timm for other policies")
        fill = tuple(int(round(255 * m)) for m in mean)
        steps.append(rand_augment_transform(aa, dict(translate_const=int(min(hw) * 0.45), img_mean=fill)))
    steps += [T.ToTensor(), T.Normalize(mean, std)]
    if is_training and reprob > 0:
        steps.append(RandomErasing(reprob, mode=remode, max_count=recount, device="cpu"))
    return T.Compose(steps)


def data_home() -> Path:
    """$SUBQUAD_DATA or ~/.cache/subquad/data."""
    return Path(os.environ.get("SUBQUAD_DATA", Path.home() / ".cache" / "subquad" / "data"))
