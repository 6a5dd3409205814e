"""LRA Text / Retrieval loaders on synthetic files in the release formats (byte ids +1, truncation, padding)."""

from __future__ import annotations

import pytest

from subquad.data.lra.retrieval import RetrievalDataset
from subquad.data.lra.text import TextDataset
from subquad.errors import UserError


def test_text_tsv(tmp_path):
    (tmp_path / "train.tsv").write_text("Source\tTarget\nab\t1\nhello world, long review\t0\n", encoding="utf-8")
    (tmp_path / "test.tsv").write_text("Source\tTarget\n\u00e9!\t1\n", encoding="utf-8")
    ds = TextDataset(tmp_path, "train", max_len=16, truncate=10)
    assert len(ds) == 2
    a = ds[0]
    assert a["tokens"][:2].tolist() == [ord("a") + 1, ord("b") + 1] and a["tokens"][2:].eq(0).all()
    assert a["mask"].tolist() == [True, True] + [False] * 14 and int(a["label"]) == 1
    b = ds[1]
    assert int(b["mask"].sum()) == 10 and b["tokens"][9] == ord("l") + 1 and int(b["label"]) == 0
    # UTF-8 bytes, offset +1; LRA validates on test (val = test).
    val = TextDataset(tmp_path, "val", max_len=8)
    assert val.val_is_test and val[0]["tokens"][:3].tolist() == [0xC3 + 1, 0xA9 + 1, ord("!") + 1]


def test_text_aclimdb_layout(tmp_path):
    root = tmp_path / "aclImdb"
    for split in ("train", "test"):
        for sub, text in (("pos", "great film"), ("neg", "dull")):
            (root / split / sub).mkdir(parents=True)
            (root / split / sub / "0_9.txt").write_text(f"{split} {text}")
    (root / "train" / "unsup").mkdir()
    (root / "train" / "unsup" / "0_0.txt").write_text("ignored")
    ds = TextDataset(tmp_path, "train", max_len=32)
    assert len(ds) == 2 and sorted(int(ds[i]["label"]) for i in range(2)) == [0, 1]
    assert int(ds[0]["label"]) == 0 and int(ds[0]["mask"].sum()) == len("train dull")


def test_retrieval_tsv_no_header(tmp_path):
    rows = ["1.0\tid_a\tid_b\tfirst doc\tsecond document here", "0.0\tid_c\tid_d\tx\tyz"]
    (tmp_path / "new_aan_pairs.train.tsv").write_text("\n".join(rows) + "\n")
    ds = RetrievalDataset(tmp_path, "train", max_len=12, truncate=8)
    assert len(ds) == 2
    a = ds[0]
    assert int(a["label"]) == 1 and int(a["mask"].sum()) == 8 and int(a["mask_1"].sum()) == 8
    assert a["tokens"][:5].tolist() == [b + 1 for b in b"first"] and a["tokens"][8:].eq(0).all()
    b = ds[1]
    assert int(b["label"]) == 0 and b["tokens_1"][:3].tolist() == [ord("y") + 1, ord("z") + 1, 0]


def test_bad_files(tmp_path):
    (tmp_path / "new_aan_pairs.eval.tsv").write_text("1.0\ta\tb\tdoc1\tdoc2\n0.0\ta\tb\tonly four\n")
    with pytest.raises(UserError, match=r"new_aan_pairs\.eval\.tsv:2: malformed line"):
        RetrievalDataset(tmp_path, "val")
    (tmp_path / "new_aan_pairs.test.tsv").write_text("yes\ta\tb\tdoc1\tdoc2\n")
    with pytest.raises(UserError, match=r"test\.tsv:1: label"):
        RetrievalDataset(tmp_path, "test")
    with pytest.raises(UserError, match="not found"):
        RetrievalDataset(tmp_path, "train")
    (tmp_path / "train.tsv").write_text("Source\tTarget\nreview\t2\n")
    with pytest.raises(UserError, match=r"train\.tsv:2"):
        TextDataset(tmp_path, "train")
    with pytest.raises(UserError, match="split"):
        TextDataset(tmp_path, "dev")


def test_lengths_before_the_max_len_cut_and_the_note(tmp_path):
    """`lengths()` counts the tokens each example has before --max-len cuts it (after the recipe's `truncate`), and
    `lra train` notes how many examples --max-len cuts; a cut by `truncate` alone is the recipe's, not noted."""
    from subquad.engine.lra import _max_len_note

    (tmp_path / "train.tsv").write_text("Source\tTarget\nab\t1\nhello world, long review\t0\n", encoding="utf-8")
    text = TextDataset(tmp_path, "train", max_len=8)
    assert text.lengths().tolist() == [2, 24] and int(text[1]["mask"].sum()) == 8
    assert TextDataset(tmp_path, "train", max_len=8, truncate=10).lengths().tolist() == [2, 10]
    assert TextDataset(tmp_path, "train", max_len=8, limit=1).lengths().tolist() == [2]
    rows = ["1.0\tid_a\tid_b\tfirst doc\tsecond document here", "0.0\tid_c\tid_d\tx\tyz"]
    (tmp_path / "new_aan_pairs.train.tsv").write_text("\n".join(rows) + "\n")
    pairs = RetrievalDataset(tmp_path, "train", max_len=12)
    assert pairs.lengths().tolist() == [20, 2] and int(pairs[0]["mask_1"].sum()) == 12
    assert RetrievalDataset(tmp_path, "train", max_len=12, truncate=8).lengths().tolist() == [8, 2]
    assert _max_len_note(8, {"train": text, "val": pairs}) == \
        "note: --max-len 8 cuts 1 of 2 train, 1 of 2 val examples (longest 24 tokens)"
    assert _max_len_note(16, {"train": TextDataset(tmp_path, "train", max_len=16, truncate=10)}) is None
    assert _max_len_note(24, {"train": text}) is None
