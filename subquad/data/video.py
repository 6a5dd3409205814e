"""Video clips for `subquad train/eval --data video:DIR`: the Kinetics layout, decoded with PyAV.

Layout (DIR):
    `train.txt`, `val.txt`, `test.txt`  one line per clip: `relative/path.mp4 label` (the list format of the
                                        Kinetics tools that UniFormer's video_classification reads,
                                        github.com/Sense-X/UniFormer)
    or `train.csv`, `val.csv`/`validate.csv`, `test.csv`  the Kinetics CSV `label,youtube_id,time_start,time_end,split`
                                        with clips at `<split>/<label>/<youtube_id>_<start:06d>_<end:06d>.mp4` or
                                        `<split>/<youtube_id>_...mp4` (labels: sorted names)
    `classes.txt` (optional)            class names, one per line (index = label)

Decoder: PyAV (maintained FFmpeg bindings, CPU wheels with FFmpeg inside; torchvision's video API is deprecated and
torchcodec needs a system FFmpeg). Every clip is probed when a split opens (container opens, one video stream with
frames); missing or undecodable clips are skipped and counted, and more than `max_corrupt_fraction` (1 %) of them
aborts with one line, as the image folders do.

Clip sampling (LiSA, arXiv:2311.12645, Tab. 8 follows UniFormer's Kinetics recipe): T frames at stride tau; training
takes a random start, evaluation the centre. Training augmentation: random resized crop (and a horizontal flip,
`hflip` > 0; keep it 0 where direction is the label, as in `generate_moving_squares`). Multi-view testing: `views =
(temporal clips, spatial crops)`; evaluation averages the model's scores over the views (`multiview_logits`).
Samples are float tensors (C, T, S, S) normalised with `mean`/`std`, so a batch is (B, C, T, H, W), the input of the
`*_video` models.
"""

from __future__ import annotations

import csv
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from ..errors import UserError
from ..files import atomic_write_text

__all__ = ["VideoClipDataset", "read_video_list", "decode_frames", "probe_video", "clip_indices", "sample_views",
           "generate_moving_squares", "write_video", "multiview_logits", "DIRECTIONS", "VIDEO_SPLITS"]

_logger = logging.getLogger(__name__)

VIDEO_SPLITS = ("train", "val", "test")
DIRECTIONS = ("right", "left", "down", "up")
_STEP = {"right": (0, 1), "left": (0, -1), "down": (1, 0), "up": (-1, 0)}


def _av():
    try:
        import av
    except ImportError:
        raise UserError("video data needs PyAV: pip install 'subquad[video]' (or pip install av)") from None
    return av


# ---------------------------------------------------------------------------------------------------------- writing
def write_video(path: str | os.PathLike, frames: np.ndarray, fps: int = 8) -> None:
    """Write uint8 frames (T, H, W, 3) as an H.264 (libx264, yuv420p; mpeg4 when libx264 is absent) .mp4, atomically."""
    av = _av()
    path = Path(path)
    t, h, w, _ = frames.shape
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.mp4")
    codec = "libx264" if "libx264" in av.codecs_available else "mpeg4"
    try:
        with av.open(os.fspath(tmp), mode="w") as out:
            stream = out.add_stream(codec, rate=fps)
            stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
            if codec == "libx264":
                stream.options = {"crf": "10", "preset": "veryfast"}
            for f in frames:
                for packet in stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")):
                    out.mux(packet)
            for packet in stream.encode():
                out.mux(packet)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _square_clip(rng: np.random.RandomState, direction: str, frames: int, size: int) -> np.ndarray:
    """One clip: a bright square moving `direction` (wrapping around the frame edges) on a noisy gray background.
    The start is uniform over the frame, so the square's position in any single frame is uniform for every class:
    only the motion between frames tells the label."""
    side = max(2, size // 6)
    speed = max(1, size // (2 * frames))
    dy, dx = _STEP[direction]
    y0, x0 = rng.randint(0, size, size=2)
    color = rng.randint(180, 256, size=3)
    out = np.empty((frames, size, size, 3), np.uint8)
    for t in range(frames):
        f = rng.randint(40, 110, size=(size, size, 3))
        ys = (y0 + dy * speed * t + np.arange(side)) % size
        xs = (x0 + dx * speed * t + np.arange(side)) % size
        f[np.ix_(ys, xs)] = color
        out[t] = f.astype(np.uint8)
    return out


def generate_moving_squares(out: str | os.PathLike, n_train: int = 200, n_val: int = 40, n_test: int = 80,
                            frames: int = 16, size: int = 32, seed: int = 0, fps: int = 8) -> dict[str, int]:
    """Write the synthetic direction task to `out`: `<split>/<direction>/<split>_<i:05d>.mp4`, list files
    `<split>.txt` (`relative/path.mp4 label`) and `classes.txt`. Classes (4): the square moves right, left, down or up;
    labels are balanced (i % 4); the square wraps around the edges, so every
    position is equally likely in every frame of every class. Returns the clip count per split."""
    if min(n_train, n_val, n_test) < 1:
        raise UserError(f"every split needs at least one clip (got train {n_train}, val {n_val}, test {n_test})")
    if frames < 2:
        raise UserError(f"--frames must be >= 2 (motion needs two frames), got {frames}")
    if size < 16:
        raise UserError(f"--size must be >= 16 (H.264 frames of at least 16 px), got {size}")
    if size % 2:
        raise UserError(f"--size must be even (yuv420p video), got {size}")
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(root / "classes.txt", "".join(f"{c}\n" for c in DIRECTIONS))
    counts = {}
    for k, (split, n) in enumerate((("train", n_train), ("val", n_val), ("test", n_test))):
        rng = np.random.RandomState([seed, k])
        lines = []
        for i in range(n):
            label = i % len(DIRECTIONS)
            rel = Path(split) / DIRECTIONS[label] / f"{split}_{i:05d}.mp4"
            (root / rel.parent).mkdir(parents=True, exist_ok=True)
            write_video(root / rel, _square_clip(rng, DIRECTIONS[label], frames, size), fps)
            lines.append(f"{rel.as_posix()} {label}\n")
        tmp = root / f".{split}.txt.tmp"
        tmp.write_text("".join(lines))
        os.replace(tmp, root / f"{split}.txt")
        counts[split] = n
    return counts


# ---------------------------------------------------------------------------------------------------------- reading
def read_video_list(root: str | os.PathLike, split: str) -> tuple[list[tuple[str, int]], list[str] | None]:
    """(samples [(absolute path, label)], class names or None) of `split` in `root` (list file or Kinetics CSV)."""
    root = Path(root)
    names = None
    if (root / "classes.txt").is_file():
        names = [ln.strip() for ln in (root / "classes.txt").read_text().splitlines() if ln.strip()]
    lst = root / f"{split}.txt"
    if lst.is_file():
        samples = []
        for n, line in enumerate(lst.read_text().splitlines(), 1):
            if not line.strip():
                continue
            parts = line.rsplit(None, 1)
            if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
                raise UserError(f"{lst}:{n}: expected `relative/path.mp4 label` (an integer label), got {line!r}")
            samples.append((os.fspath(root / parts[0]), int(parts[1])))
        return samples, names
    csv_names = [f"{split}.csv"] + (["validate.csv"] if split == "val" else [])
    for cname in csv_names:
        if (root / cname).is_file():
            return _read_kinetics_csv(root, root / cname, split, names)
    raise UserError(f"video folder {root} has no list for split {split!r} (expected {split}.txt with "
                    f"`relative/path.mp4 label` lines or the Kinetics {split}.csv)")


def _read_kinetics_csv(root: Path, path: Path, split: str, names: list[str] | None):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    need = {"label", "youtube_id", "time_start", "time_end"}
    if not rows or not need <= set(rows[0]):
        raise UserError(f"{path}: expected the Kinetics CSV header label,youtube_id,time_start,time_end,split")
    if names is None:
        train_csv = root / "train.csv"
        src = rows
        if train_csv.is_file():
            with open(train_csv, newline="") as f:
                src = list(csv.DictReader(f))
        names = sorted({r["label"] for r in src})
    index = {c: i for i, c in enumerate(names)}
    samples = []
    for r in rows:
        if r["label"] not in index:
            raise UserError(f"{path}: label {r['label']!r} is not a class of the train split")
        stem = f"{r['youtube_id']}_{int(float(r['time_start'])):06d}_{int(float(r['time_end'])):06d}.mp4"
        cand = [root / split / r["label"] / stem, root / split / stem, root / r["label"] / stem, root / stem]
        p = next((c for c in cand if c.is_file()), cand[0])
        samples.append((os.fspath(p), index[r["label"]]))
    return samples, names


def probe_video(path: str) -> int:
    """Number of decodable frames of `path` (0: missing, unreadable or no video stream)."""
    av = _av()
    try:
        with av.open(path) as c:
            if not c.streams.video:
                return 0
            return sum(1 for _ in c.decode(video=0))
    except (av.error.FFmpegError, OSError, ValueError, UnicodeDecodeError):
        return 0


def decode_frames(path: str) -> np.ndarray:
    """All frames of `path` as uint8 (T, H, W, 3) RGB."""
    av = _av()
    with av.open(path) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    if not frames:
        raise ValueError(f"no frames in {path}")
    return np.stack(frames)


def clip_indices(num_frames_video: int, t: int, stride: int, start: int) -> np.ndarray:
    """Frame indices start, start + stride, ... (t of them); a video too short repeats its last frame."""
    return np.minimum(start + stride * np.arange(t), num_frames_video - 1)


def _starts(n: int, t: int, stride: int, clips: int) -> list[int]:
    """Evenly spaced temporal clip starts (one clip: the centre), as UniFormer's multi-clip test does."""
    span = max(0, n - ((t - 1) * stride + 1))
    if clips == 1:
        return [span // 2]
    return [int(round(span * i / (clips - 1))) for i in range(clips)]


def _resize_short(x: torch.Tensor, side: int) -> torch.Tensor:
    """x (T, C, H, W) float with the short side resized to `side`."""
    h, w = x.shape[-2:]
    s = side / min(h, w)
    nh, nw = max(side, round(h * s)), max(side, round(w * s))
    if (nh, nw) == (h, w):
        return x
    return F.interpolate(x, size=(nh, nw), mode="bilinear", align_corners=False, antialias=True)


def _spatial_crops(x: torch.Tensor, side: int, crops: int) -> list[torch.Tensor]:
    """`crops` side x side crops along the long side of x (T, C, H, W) (1: centre; 3: both ends and the centre)."""
    x = _resize_short(x, side)
    h, w = x.shape[-2:]
    out = []
    for i in range(crops):
        f = 0.5 if crops == 1 else i / (crops - 1)
        y0, x0 = (int(round((h - side) * f)), (w - side) // 2) if h > w else ((h - side) // 2,
                                                                            int(round((w - side) * f)))
        out.append(x[..., y0:y0 + side, x0:x0 + side])
    return out


def _random_resized_crop(x: torch.Tensor, side: int, scale: tuple[float, float], ratio: tuple[float, float],
                         g: torch.Generator) -> torch.Tensor:
    """One random resized crop shared by all frames of x (T, C, H, W) (torchvision's RandomResizedCrop rule)."""
    h, w = x.shape[-2:]
    area = h * w
    for _ in range(10):
        a = area * (scale[0] + (scale[1] - scale[0]) * torch.rand((), generator=g).item())
        lr = (math.log(ratio[0]), math.log(ratio[1]))
        r = math.exp(lr[0] + (lr[1] - lr[0]) * torch.rand((), generator=g).item())
        cw, ch = int(round(math.sqrt(a * r))), int(round(math.sqrt(a / r)))
        if 0 < cw <= w and 0 < ch <= h:
            y0 = int(torch.randint(0, h - ch + 1, (), generator=g))
            x0 = int(torch.randint(0, w - cw + 1, (), generator=g))
            break
    else:
        ch = cw = min(h, w)
        y0, x0 = (h - ch) // 2, (w - cw) // 2
    crop = x[..., y0:y0 + ch, x0:x0 + cw]
    return F.interpolate(crop, size=(side, side), mode="bilinear", align_corners=False, antialias=True)


def sample_views(frames: np.ndarray, t: int, stride: int, side: int, views: tuple[int, int],
                 mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """Evaluation views of one video: (clips * crops, C, t, side, side), clip-major, normalised."""
    clips, crops = views
    x = torch.from_numpy(frames).permute(0, 3, 1, 2).float().div_(255)
    out = []
    for s in _starts(len(frames), t, stride, clips):
        sel = x[torch.from_numpy(clip_indices(len(frames), t, stride, s))]
        out += _spatial_crops(sel, side, crops)
    v = torch.stack(out).permute(0, 2, 1, 3, 4)  # (V, C, T, H, W)
    m = torch.tensor(mean, dtype=v.dtype).view(1, -1, 1, 1, 1)
    sd = torch.tensor(std, dtype=v.dtype).view(1, -1, 1, 1, 1)
    return (v - m) / sd


class VideoClipDataset(Dataset):
    """One split of a video folder; yields (clip (C, T, S, S), label) or, with views other than (1, 1) at
    evaluation, (views (V, C, T, S, S), label).

    Args:
        samples: [(path, label)] (`read_video_list`).
        num_frames, frame_stride: T and tau.
        img_size: S.
        training: random temporal start and random resized crop (+ flip with probability `hflip`); else centre.
        views: (temporal clips, spatial crops) at evaluation.
        scale, ratio: the random resized crop's area and aspect ranges.
        max_corrupt_fraction: abort when more than this fraction of clips is missing or undecodable.
    """

    def __init__(self, samples: list[tuple[str, int]], num_frames: int = 16, frame_stride: int = 4,
                 img_size: int = 224, training: bool = False, views: tuple[int, int] = (1, 1),
                 mean: Sequence[float] = (0.45, 0.45, 0.45), std: Sequence[float] = (0.225, 0.225, 0.225),
                 hflip: float = 0.0, scale: tuple[float, float] = (0.25, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), max_corrupt_fraction: float = 0.01,
                 where: str = "video list", seed: int = 0) -> None:
        if num_frames < 1 or frame_stride < 1:
            raise UserError(f"--num-frames and --frame-stride must be >= 1, got {num_frames} and {frame_stride}")
        if len(views) != 2 or min(views) < 1:
            raise UserError(f"views must be (temporal clips >= 1, spatial crops >= 1), got {tuple(views)}")
        self.t, self.stride, self.side, self.training = num_frames, frame_stride, img_size, training
        self.views, self.mean, self.std, self.hflip = tuple(views), tuple(mean), tuple(std), hflip
        self.scale, self.ratio, self.seed, self.epoch = tuple(scale), tuple(ratio), seed, 0
        good, bad = [], []
        for path, label in samples:
            n = probe_video(path) if os.path.isfile(path) else 0
            (good if n else bad).append((path, label, n))
        self.num_corrupt = len(bad)
        if bad:
            frac = len(bad) / max(1, len(samples))
            if frac > max_corrupt_fraction:
                raise UserError(f"{len(bad)} of {len(samples)} videos in {where} are missing or undecodable "
                                f"({100 * frac:.1f} % > {100 * max_corrupt_fraction:g} %), e.g. {bad[0][0]}; "
                                "aborting")
            _logger.warning("skipped %d missing or undecodable video(s) of %d in %s (e.g. %s)", len(bad),
                            len(samples), where, bad[0][0])
        self.samples = [(p, lab) for p, lab, _ in good]
        self.targets = [lab for _, lab in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        frames = decode_frames(path)
        if not self.training:
            v = sample_views(frames, self.t, self.stride, self.side, self.views, self.mean, self.std)
            return (v[0] if self.views == (1, 1) else v), label
        g = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()))
        span = max(0, len(frames) - ((self.t - 1) * self.stride + 1))
        start = int(torch.randint(0, span + 1, (), generator=g))
        x = torch.from_numpy(frames[clip_indices(len(frames), self.t, self.stride, start)])
        x = x.permute(0, 3, 1, 2).float().div_(255)
        x = _random_resized_crop(x, self.side, self.scale, self.ratio, g)
        if self.hflip > 0 and torch.rand((), generator=g).item() < self.hflip:
            x = x.flip(-1)
        x = x.permute(1, 0, 2, 3)  # (C, T, H, W)
        m = torch.tensor(self.mean).view(-1, 1, 1, 1)
        sd = torch.tensor(self.std).view(-1, 1, 1, 1)
        return (x - m) / sd, label


def multiview_logits(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Scores of clips (B, C, T, H, W), or of views (B, V, C, T, H, W) averaged over the V views (softmax scores
    are averaged, as UniFormer's multi-view test does; returned as their log so argmax and NLL stay meaningful)."""
    if x.dim() == 5:
        return model(x)
    b, v = x.shape[:2]
    probs = model(x.flatten(0, 1)).float().softmax(-1).view(b, v, -1).mean(1)
    return probs.clamp_min(1e-12).log()
