"""ImageNet-style folders: `root/{train,val}/<class>/<image>` (the layout of the L2ViT and FLatten READMEs).

Every file is decoded once when the split is opened (a valid header over a truncated or corrupt body counts as
unreadable; JPEGs are decoded at reduced scale, which still reads all of their data); unreadable files are skipped and
counted, and more than `max_corrupt_fraction` of them aborts with one clear line. Class names are the sorted
sub-folder names of the train split; every split uses the same class-to-index map, and a split that lacks one of
those classes is refused (its accuracy would silently cover fewer classes).
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from ..errors import UserError

__all__ = ["IMG_EXTENSIONS", "ImageFolderDataset", "find_classes"]

_logger = logging.getLogger(__name__)

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")


def find_classes(split_dir: Path) -> list[str]:
    """Sorted class folder names under `split_dir`; an empty class folder or no class at all is a UserError."""
    if not split_dir.is_dir():
        raise UserError(f"image folder split not found: {split_dir} (expected <root>/train/<class>/<image> and "
                        "<root>/val/<class>/<image>)")
    classes = sorted(d.name for d in split_dir.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise UserError(f"no class folders in {split_dir} (expected {split_dir}/<class>/<image>)")
    return classes


def decodes(path: str | os.PathLike) -> bool:
    """Whether the whole image decodes: `Image.open` reads only the header, so the pixels are loaded too (JPEGs in
    draft mode, at up to 1/8 scale: every byte is still read and entropy-decoded, so truncation is caught)."""
    try:
        with Image.open(path) as im:
            if im.format == "JPEG":
                im.draft(im.mode, (max(1, im.width // 8), max(1, im.height // 8)))
            im.load()
        return True
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError):
        return False


class ImageFolderDataset(Dataset):
    """One split of an image folder; yields (PIL image, class index).

    Args:
        split_dir: `<root>/<split>`.
        classes: the class names (index = position); None reads them from `split_dir`.
        max_corrupt_fraction: abort when more than this fraction of files cannot be opened.
    """

    def __init__(self, split_dir: str | os.PathLike, classes: list[str] | None = None,
                 max_corrupt_fraction: float = 0.01) -> None:
        split_dir = Path(split_dir)
        self.classes = list(classes) if classes is not None else find_classes(split_dir)
        here = find_classes(split_dir)
        unknown = sorted(set(here) - set(self.classes))
        if unknown:
            raise UserError(f"{split_dir} has class folders absent from the train split: {unknown[:5]}")
        missing = [c for c in self.classes if c not in here]
        if missing:
            shown = ", ".join(missing[:10]) + (f", ... ({len(missing)} in all)" if len(missing) > 10 else "")
            raise UserError(f"{split_dir} lacks {len(missing)} class folder(s) of the train split: {shown}; every "
                            "split needs every class")
        samples: list[tuple[str, int]] = []
        for idx, name in enumerate(self.classes):
            cdir = split_dir / name
            files = sorted(p for p in cdir.rglob("*") if p.is_file() and p.suffix.lower() in IMG_EXTENSIONS)
            if not files:
                raise UserError(f"class folder {cdir} holds no images (allowed extensions: "
                                f"{', '.join(IMG_EXTENSIONS)})")
            samples += [(os.fspath(p), idx) for p in files]
        good, bad = [], []
        # Pillow releases the GIL while decoding: a few threads cut the one-time check on large folders.
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
            ok = list(pool.map(decodes, [path for path, _ in samples], chunksize=64))
        for (path, label), fine in zip(samples, ok):
            if fine:
                good.append((path, label))
            else:
                bad.append(path)
        self.num_corrupt = len(bad)
        if bad:
            frac = len(bad) / len(samples)
            if frac > max_corrupt_fraction:
                raise UserError(f"{len(bad)} of {len(samples)} images in {split_dir} are corrupt "
                                f"({100 * frac:.1f} % > {100 * max_corrupt_fraction:g} %), e.g. {bad[0]}; aborting")
            _logger.warning("skipped %d corrupt image(s) of %d in %s (e.g. %s)", len(bad), len(samples), split_dir,
                            bad[0])
        self.samples = good
        self.targets = [lab for _, lab in good]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        # A file whose header is fine but whose body fails to decode is replaced by the next readable one.
        for k in range(len(self.samples)):
            path, label = self.samples[(index + k) % len(self.samples)]
            try:
                with Image.open(path) as im:
                    im.load()
                    return im.copy(), label
            except (OSError, ValueError) as e:
                _logger.warning("cannot decode %s (%s); using the next image", path, e)
        raise UserError(f"no image in {len(self.samples)} files could be decoded")
