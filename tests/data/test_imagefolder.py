from __future__ import annotations

import pickle

import numpy as np
import pytest
from PIL import Image

from subquad.data.cifar import cifar_arrays, safe_unpickle
from subquad.data.imagefolder import ImageFolderDataset
from subquad.data.registry import TransformDataset, build_transform, open_source, parse_data_spec
from subquad.errors import UserError


def make_folder(root, classes=("cat", "dog"), per_class=3, corrupt=0, size=(6, 5), mode="RGB"):
    rng = np.random.RandomState(0)
    for split in ("train", "val"):
        for c in classes:
            d = root / split / c
            d.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
                Image.fromarray(rng.randint(0, 256, shape).astype(np.uint8), mode).save(d / f"{i}.png")
    for i in range(corrupt):
        (root / "train" / classes[0] / f"bad{i}.jpg").write_bytes(b"not an image at all")
    return root


def test_imagefolder_source_classes_splits_and_gray_to_rgb(tmp_path):
    root = make_folder(tmp_path / "f", mode="L")
    src = open_source(f"imagefolder:{root}")
    assert src.classes == ["cat", "dog"]
    ds = src.dataset("train")
    assert len(ds) == 6 and [ds[i][1] for i in range(6)] == [0, 0, 0, 1, 1, 1]
    tf = build_transform(src, 12, False)
    x, y = TransformDataset(ds, tf, "RGB")[0]
    assert x.shape == (3, 12, 12) and y == 0
    # Gray images are replicated: all three channels equal before normalisation differences in mean/std.
    tf_train = build_transform(src, 12, True, aa="rand-m9-mstd0.5", reprob=0.5)
    assert TransformDataset(ds, tf_train, "RGB")[1][0].shape == (3, 12, 12)


def test_corrupt_images_skipped_with_count(tmp_path):
    root = make_folder(tmp_path / "f", classes=("a",), per_class=120, corrupt=1, size=(2, 2))
    ds = ImageFolderDataset(root / "train", ["a"])
    assert ds.num_corrupt == 1 and len(ds) == 120


def test_corrupt_images_above_one_percent_abort(tmp_path):
    root = make_folder(tmp_path / "f", per_class=3, corrupt=2)
    with pytest.raises(UserError, match=r"2 of 8 images .* corrupt") as e:
        open_source(f"imagefolder:{root}").dataset("train")
    assert "\n" not in str(e.value)


def test_empty_class_folder_and_missing_paths(tmp_path):
    root = make_folder(tmp_path / "f")
    (root / "train" / "empty").mkdir()
    with pytest.raises(UserError, match="empty.* holds no images"):
        open_source(f"imagefolder:{root}").dataset("train")
    with pytest.raises(UserError, match="not found"):
        open_source(f"imagefolder:{tmp_path / 'nope'}")
    (tmp_path / "g" / "train").mkdir(parents=True)
    with pytest.raises(UserError, match="no class folders"):
        open_source(f"imagefolder:{tmp_path / 'g'}")
    with pytest.raises(UserError, match="allowed"):
        parse_data_spec("mnist")
    with pytest.raises(UserError, match="needs a path"):
        parse_data_spec("cifar10")


def _write_cifar10(root, n=4):
    rng = np.random.RandomState(0)
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.randint(0, 256, (n, 3072)).astype(np.uint8), b"labels": list(rng.randint(0, 10, n))}
        batch[b"labels"] = [int(v) for v in batch[b"labels"]]
        with open(d / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
    with open(d / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(10)]}, f, protocol=2)
    return d


def test_cifar10_pickle_release(tmp_path):
    d = _write_cifar10(tmp_path)
    arrays, classes = cifar_arrays(tmp_path, 10)
    assert classes == [f"c{i}" for i in range(10)]
    assert arrays["train"][0].shape == (20, 32, 32, 3) and arrays["test"][0].shape == (4, 32, 32, 3)
    # (N, 3072) rows are R, G, B planes: pixel (0, 0) of image 0 has R at 0, G at 1024, B at 2048.
    raw = safe_unpickle(d / "test_batch")[b"data"]
    np.testing.assert_array_equal(arrays["test"][0][0, 0, 0], raw[0, [0, 1024, 2048]])
    src = open_source(f"cifar10:{d}")
    # Selection uses a fixed held-out part of the training batches, never the test batch.
    assert src.val_split == "val" and src.test_split == "test"
    tr, va = src.dataset("train"), src.dataset("val")
    assert len(tr) + len(va) == 20 and 0 < len(va) < len(tr)
    seen = {tuple(a.tobytes() for a in (ds.images[i],)) for ds in (tr,) for i in range(len(ds))}
    assert not seen & {tuple(a.tobytes() for a in (va.images[i],)) for i in range(len(va))}
    assert open_source(f"cifar10:{d}").dataset("val").targets == va.targets  # fixed, not redrawn


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, ("touch EVIL_MARKER",))


def test_cifar_malicious_pickle_refused_unrun(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = _write_cifar10(tmp_path / "c")
    with open(d / "test_batch", "wb") as f:
        pickle.dump({b"data": _Evil(), b"labels": [0]}, f)
    with pytest.raises(UserError, match="refusing to load .*os.*system|refusing to load .*posix.*system"):
        cifar_arrays(d, 10)
    assert not (tmp_path / "EVIL_MARKER").exists()


def test_split_lacking_a_class_of_train_refused(tmp_path):
    """Issue 24: a val/ without one of train/'s classes trained silently."""
    import shutil

    root = make_folder(tmp_path / "f", classes=("ant", "bee", "cat"))
    shutil.rmtree(root / "val" / "bee")
    with pytest.raises(UserError, match=r"val lacks 1 class folder\(s\) of the train split: bee;") as e:
        open_source(f"imagefolder:{root}").dataset("val")
    assert "\n" not in str(e.value)


def _truncated_png(path, size=(40, 30)):
    """A PNG whose header (and so Image.open) is fine but whose pixel data stops halfway."""
    rng = np.random.RandomState(1)
    Image.fromarray(rng.randint(0, 256, (size[1], size[0], 3)).astype(np.uint8)).save(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with Image.open(path) as im:
        assert im.size == size  # the header alone passes


def test_truncated_png_counts_as_corrupt(tmp_path):
    root = make_folder(tmp_path / "f", per_class=3)
    _truncated_png(root / "train" / "cat" / "trunc.png")
    with pytest.raises(UserError, match=r"1 of 7 images .* corrupt .* > 1 %.*trunc.png"):
        open_source(f"imagefolder:{root}").dataset("train")
    root = make_folder(tmp_path / "g", classes=("a",), per_class=120, size=(2, 2))
    _truncated_png(root / "train" / "a" / "trunc.png")
    ds = ImageFolderDataset(root / "train", ["a"])
    assert ds.num_corrupt == 1 and len(ds) == 120 and all(not p.endswith("trunc.png") for p, _ in ds.samples)


def test_truncated_jpeg_counts_as_corrupt(tmp_path):
    from subquad.data.imagefolder import decodes

    rng = np.random.RandomState(2)
    path = tmp_path / "x.jpg"
    Image.fromarray(rng.randint(0, 256, (64, 48, 3)).astype(np.uint8)).save(path, quality=95)
    assert decodes(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert not decodes(path)


def test_test_split_without_val(tmp_path):
    """`eval --split test` opens a folder that has train/ and test/ but no val/; training still needs val/."""
    import shutil

    root = make_folder(tmp_path / "f")
    shutil.copytree(root / "val", root / "test")
    shutil.rmtree(root / "val")
    with pytest.raises(UserError, match="no val/ split"):
        open_source(f"imagefolder:{root}")
    src = open_source(f"imagefolder:{root}", need_val=False)
    assert len(src.dataset("test")) == 6 and src.test_split == "test"
