"""Pathfinder generator: determinism, label balance, markers, connectivity oracle, loader splits, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from subquad.data.lra.pathfinder import (
    PathfinderDataset,
    connected_oracle,
    draw_sample,
    params_for,
    sample_label,
    write_pathfinder,
)
from subquad.errors import UserError


@pytest.fixture(scope="module")
def pf_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("pathfinder")
    write_pathfinder(out, size=32, contour_length=14, num_images=10, seed=5)
    return out


def test_same_seed_same_png_bytes(pf_dir, tmp_path):
    write_pathfinder(tmp_path, size=32, contour_length=14, num_images=10, seed=5, workers=1)
    a = sorted(p.relative_to(pf_dir) for p in pf_dir.rglob("*.png"))
    assert len(a) == 10
    for rel in a:
        assert (tmp_path / rel).read_bytes() == (pf_dir / rel).read_bytes(), rel
    assert (tmp_path / "metadata.txt").read_text() == (pf_dir / "metadata.txt").read_text()


def test_labels_balanced():
    labels = np.array([sample_label(0, i) for i in range(10_000)])
    assert abs(labels.mean() - 0.5) <= 0.02


@pytest.mark.parametrize("size,n", [(32, 8), (64, 2), (128, 1)])
def test_oracle_agrees_with_label_and_markers_present(size, n):
    p = params_for(size)
    labels = []
    for i in range(n):
        img, label, info = draw_sample(p, 1, i)
        assert img.shape == (size, size) and img.dtype == np.uint8
        assert label == sample_label(1, i)
        assert connected_oracle(info) == bool(label)
        # Both marker discs are drawn at full intensity.
        for x, y in info["markers"]:
            cy, cx = int(y / info["scale"]), int(x / info["scale"])
            assert img[max(cy - 1, 0):cy + 2, max(cx - 1, 0):cx + 2].max() >= 200
        labels.append(label)
    if size == 32:
        assert 0 < sum(labels) < n


def test_metadata_and_dataset_splits(pf_dir):
    lines = (pf_dir / "metadata.txt").read_text().splitlines()
    assert len(lines) == 10
    sub, name, idx, label = lines[3].split()[:4]
    assert (pf_dir / sub / name).is_file() and idx == "3" and int(label) == sample_label(5, 3)
    sizes = {s: len(PathfinderDataset(pf_dir, s)) for s in ("train", "val", "test")}
    assert sizes == {"train": 8, "val": 1, "test": 1}
    item = PathfinderDataset(pf_dir, "test")[0]
    assert item["tokens"].shape == (1024,) and item["mask"].all() and int(item["label"]) == int(lines[9].split()[3])
    assert int(item["tokens"].max()) <= 255


def test_bad_input(tmp_path):
    with pytest.raises(UserError, match="size"):
        params_for(48)
    with pytest.raises(UserError, match="contour-length"):
        params_for(32, 1)
    with pytest.raises(UserError, match="metadata.txt"):
        PathfinderDataset(tmp_path, "train")
    (tmp_path / "metadata.txt").write_text("imgs/0 sample_0.png 0\n")
    with pytest.raises(UserError, match=r"metadata\.txt:1"):
        PathfinderDataset(tmp_path, "train")


def test_distractor_override_keeps_targets_and_labels(tmp_path):
    """`distractors=K` changes only the number of distractor snakes: same labels, same target pixels, fewer strokes."""
    assert params_for(32, 6).num_distractor_snakes == 10          # LRA: 20 // (6 // 3)
    assert params_for(32, 6, 0).num_distractor_snakes == 0
    assert params_for(32, 6, 3).num_distractor_snakes == 3
    m0 = write_pathfinder(tmp_path / "d0", contour_length=6, distractors=0, num_images=6, seed=2)
    m10 = write_pathfinder(tmp_path / "d10", contour_length=6, num_images=6, seed=2)
    assert m0["params"]["num_distractor_snakes"] == 0 and m10["params"]["num_distractor_snakes"] == 10
    lab0 = [ln.split()[3] for ln in (tmp_path / "d0" / "metadata.txt").read_text().splitlines()]
    lab10 = [ln.split()[3] for ln in (tmp_path / "d10" / "metadata.txt").read_text().splitlines()]
    assert lab0 == lab10
    from PIL import Image

    lit0 = sum(int((np.asarray(Image.open(tmp_path / "d0" / "imgs" / "0" / f"sample_{i}.png")) > 0).sum())
               for i in range(6))
    lit10 = sum(int((np.asarray(Image.open(tmp_path / "d10" / "imgs" / "0" / f"sample_{i}.png")) > 0).sum())
                for i in range(6))
    assert 0 < lit0 < lit10
    for bad in (-1, 1.5, True):
        with pytest.raises(UserError, match="distractors"):
            params_for(32, 6, bad)
