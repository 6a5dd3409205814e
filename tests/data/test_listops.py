"""ListOps generator (LRA recipe) and loader: labels, bounds, dedup across splits, determinism, encodings."""

from __future__ import annotations

import random

import numpy as np
import pytest

from subquad.data.lra.listops import (
    OPERATORS,
    ListOpsDataset,
    encode_source,
    evaluate_source,
    generate,
    generate_tree,
    vocab_size,
    write_listops,
)
from subquad.errors import UserError

MIN_LEN, MAX_LEN = 20, 120


@pytest.fixture(scope="module")
def listops_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("listops")
    write_listops(out, num_train=40, num_val=10, num_test=10, seed=3, min_len=MIN_LEN, max_len=MAX_LEN)
    return out


def _rows(path):
    lines = path.read_text().splitlines()
    assert lines[0] == "Source\tTarget"
    return [ln.split("\t") for ln in lines[1:]]


def test_text_form_matches_lra_release():
    # [MAX 2 9] is written ( ( ( [MAX 2 ) 9 ) ] ) with label 9.
    assert evaluate_source("( ( ( [MAX 2 ) 9 ) ] )") == 9
    rng = random.Random(0)
    text, length, value = generate_tree(rng)
    while length == 1:
        text, length, value = generate_tree(rng)
    assert text.startswith("( ") and text.endswith(" ] )")
    assert set(text.split()) <= {"(", ")", "]", *OPERATORS, *map(str, range(10))}


def test_operator_semantics():
    assert evaluate_source("( ( ( [MED 2 ) 5 ) ] )") == 3  # mean of the middle pair, truncated
    assert evaluate_source("( ( ( ( [MED 7 ) 1 ) 4 ) ] )") == 4
    assert evaluate_source("( ( ( [SM 7 ) 8 ) ] )") == 5
    assert evaluate_source("( ( ( ( [MIN 7 ) ( ( ( [MAX 3 ) 9 ) ] ) ) 8 ) ] )") == 7


def test_targets_lengths_and_splits(listops_dir):
    seen = {}
    for split, n in (("train", 40), ("val", 10), ("test", 10)):
        rows = _rows(listops_dir / f"{split}.tsv")
        assert len(rows) == n
        for src, tgt in rows:
            assert evaluate_source(src) == int(tgt)
            # Recipe length = values + operators + closing brackets = the structural token count.
            assert MIN_LEN < len(encode_source(src, "structural")) < MAX_LEN
            assert src not in seen, f"duplicate across {seen.get(src)} and {split}"
            seen[src] = split


def test_deterministic_per_seed(listops_dir, tmp_path):
    write_listops(tmp_path / "a", 40, 10, 10, seed=3, min_len=MIN_LEN, max_len=MAX_LEN)
    for split in ("train", "val", "test"):
        assert (tmp_path / "a" / f"{split}.tsv").read_bytes() == (listops_dir / f"{split}.tsv").read_bytes()
    other = generate(10, seed=4, min_len=MIN_LEN, max_len=MAX_LEN)
    assert [s for s, _ in other] != [s for s, _ in generate(10, seed=3, min_len=MIN_LEN, max_len=MAX_LEN)]


def test_encodings_round_trip(listops_dir):
    names = {i + 1: str(i) for i in range(10)} | {11 + i: op for i, op in enumerate(OPERATORS)} | {15: "]"}
    for src, tgt in _rows(listops_dir / "val.tsv"):
        structural = encode_source(src, "structural")
        kept = [t for t in src.split() if t not in ("(", ")")]
        assert [names[i] for i in structural] == kept
        # The structural sequence (with brackets) still determines the label.
        assert evaluate_source(" ".join(names[i] for i in structural)) == int(tgt)
        released = encode_source(src, "lra_released")
        assert [names[i] for i in released] == [t for t in kept if t != "]"]
        assert released.max() <= 14 and 15 not in released and 0 not in released
    assert vocab_size("lra_released") == 15 and vocab_size("structural") == 16


def test_dataset_padding_and_cache(listops_dir):
    ds = ListOpsDataset(listops_dir, "train", "structural", max_len=128)
    assert len(ds) == 40
    item = ds[0]
    n = int(ds.lengths()[0])
    assert item["tokens"].shape == (128,) and item["mask"].sum() == n
    assert (item["tokens"][n:] == 0).all() and (item["tokens"][:n] > 0).all()
    src, tgt = _rows(listops_dir / "train.tsv")[0]
    assert int(item["label"]) == int(tgt)
    assert (listops_dir / "train.structural.npz").is_file()
    again = ListOpsDataset(listops_dir, "train", "structural", max_len=128)
    assert np.array_equal(again[5]["tokens"].numpy(), ds[5]["tokens"].numpy())


def test_lra_release_file_names(tmp_path):
    (tmp_path / "basic_test.tsv").write_text("Source\tTarget\n( ( ( [SM 4 ) 9 ) ] )\t3\n")
    ds = ListOpsDataset(tmp_path, "test", cache=False, max_len=8)
    assert ds[0]["tokens"].tolist() == [14, 5, 10, 0, 0, 0, 0, 0] and int(ds[0]["label"]) == 3


def test_bad_input(tmp_path):
    (tmp_path / "train.tsv").write_text("Source\tTarget\n( ( ( [SM 4 ) 9 ) ] )\t3\nno tab on this line\n")
    with pytest.raises(UserError, match=r"train\.tsv:3: malformed line"):
        ListOpsDataset(tmp_path, "train", cache=False)
    (tmp_path / "val.tsv").write_text("Source\tTarget\n( ( ( [FOO 4 ) 9 ) ] )\t3\n")
    with pytest.raises(UserError, match=r"val\.tsv:2"):
        ListOpsDataset(tmp_path, "val", cache=False)
    (tmp_path / "test.tsv").write_text("Input\tLabel\n")
    with pytest.raises(UserError, match="header"):
        ListOpsDataset(tmp_path, "test", cache=False)
    with pytest.raises(UserError, match="encoding"):
        ListOpsDataset(tmp_path, "train", encoding="bytes")
    with pytest.raises(UserError, match="min_len"):
        generate(5, min_len=10, max_len=10)
