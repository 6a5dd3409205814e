"""Character-level corpus: 90/5/5 split to the byte, deterministic build, 27-symbol text8 alphabet, BPC protocol."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch

from subquad.data.char import decode_ids, encode_text, find_linux_doc, load_split, prepare_corpus, read_meta
from subquad.engine.sequence import evaluate_bpc
from subquad.errors import UserError


def _corpus(root):
    (root / "b").mkdir(parents=True)
    (root / "a.txt").write_text("Hello,   World!\nThe Kernel  docs.")
    (root / "b" / "c.txt").write_text("Zeta line\n" * 30)
    (root / "B.txt").write_text("upper first in byte order\n")
    return root


def test_bytes_split_and_determinism(tmp_path):
    src = _corpus(tmp_path / "src")
    meta = prepare_corpus(src, tmp_path / "out", "bytes")
    raw = b"".join(p.read_bytes() + (b"" if p.read_bytes().endswith(b"\n") else b"\n")
                   for p in (src / "B.txt", src / "a.txt", src / "b" / "c.txt"))
    n = len(raw)
    sizes = {s: len(load_split(tmp_path / "out", s)) for s in ("train", "valid", "test")}
    assert sizes == {"train": n * 90 // 100, "valid": n * 5 // 100, "test": n - n * 90 // 100 - n * 5 // 100}
    joined = b"".join(bytes(load_split(tmp_path / "out", s)) for s in ("train", "valid", "test"))
    assert joined == raw
    assert meta["vocab_size"] == 256 and read_meta(tmp_path / "out")["splits"]["test"]["sha256"] == \
        hashlib.sha256(raw[sizes["train"] + sizes["valid"]:]).hexdigest()
    again = prepare_corpus(src, tmp_path / "out2", "bytes")
    assert again["splits"] == meta["splits"]


def test_chars_alphabet(tmp_path):
    src = _corpus(tmp_path / "src")
    meta = prepare_corpus(src, tmp_path / "out", "chars")
    assert meta["vocab_size"] == 27 and "".join(meta["vocab"]) == " abcdefghijklmnopqrstuvwxyz"
    ids = np.concatenate([np.asarray(load_split(tmp_path / "out", s)) for s in ("train", "valid", "test")])
    assert ids.max() < 27
    text = decode_ids(ids, "chars")
    assert text.startswith("upper first in byte order hello world the kernel docs zeta line")
    assert "  " not in text
    assert encode_text("Hi, you", "chars").tolist() == [8, 9, 0, 25, 15, 21]


def test_bad_corpus(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no files"):
        prepare_corpus(tmp_path / "empty", tmp_path / "o")
    (tmp_path / "e.txt").write_text("")
    with pytest.raises(UserError, match="empty"):
        prepare_corpus(tmp_path / "e.txt", tmp_path / "o")
    (tmp_path / "bin.dat").write_bytes(b"\x00\x01\x02" * 100)
    with pytest.raises(UserError, match="not text"):
        prepare_corpus(tmp_path / "bin.dat", tmp_path / "o")
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9 " * 100)
    with pytest.raises(UserError, match="not UTF-8"):
        prepare_corpus(tmp_path / "latin.txt", tmp_path / "o")
    with pytest.raises(UserError, match="does not exist"):
        prepare_corpus(tmp_path / "missing", tmp_path / "o")
    with pytest.raises(UserError, match="meta.json"):
        read_meta(tmp_path)


class _Uniform(torch.nn.Module):
    """Uniform predictions over V symbols (BPC = log2 V) that record which targets were scored."""

    def __init__(self, V: int) -> None:
        super().__init__()
        self.V = V
        self.w = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return torch.zeros(*x.shape, self.V) + self.w


class _Copy(torch.nn.Module):
    """Predicts the next symbol as the current one + 1 (mod V) with high confidence."""

    def __init__(self, V: int) -> None:
        super().__init__()
        self.V = V
        self.w = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return torch.nn.functional.one_hot((x + 1) % self.V, self.V).float() * 50 + self.w


@pytest.mark.parametrize("ctx,score", [(16, 8), (16, 16), (7, 3), (100, 10)])
def test_bpc_protocol_scores_every_target_once(ctx, score):
    data = (np.arange(61) % 5).astype(np.uint8)
    r = evaluate_bpc(_Uniform(5), data, ctx, score, batch_size=3)
    assert r["tokens"] == 60 and math.isclose(r["bpc"], math.log2(5), rel_tol=1e-6)
    assert evaluate_bpc(_Copy(5), data, ctx, score)["bpc"] < 1e-6
    assert evaluate_bpc(_Uniform(5), data, ctx, score, max_tokens=20)["tokens"] == 20
    with pytest.raises(UserError):
        evaluate_bpc(_Uniform(5), data, 4, 5)


@pytest.mark.data
def test_linux_doc_corpus(tmp_path):
    src = find_linux_doc()
    assert src is not None, "Debian package linux-doc-6.12 is not installed (apt-get install linux-doc-6.12)"
    meta = prepare_corpus(src, tmp_path / "ld", "bytes")
    assert meta["name"] == "linuxdoc-bytes" and meta["files"] == 3604 and "not comparable" in meta["note"]
    n = meta["source_bytes"]
    assert meta["splits"]["train"]["symbols"] == n * 90 // 100 and meta["splits"]["valid"]["symbols"] == n * 5 // 100
    assert meta["package"].startswith("linux-doc-6.12")


def test_folder_skips_compressed_and_binary_files_and_counts_them(tmp_path):
    """Issue 13 item 8: a folder with a .gz (as /usr/share/doc has) is prepared from its text files."""
    import gzip

    src = _corpus(tmp_path / "src")
    (src / "b" / "changelog.gz").write_bytes(gzip.compress(b"release notes\n" * 20))
    (src / "blob.bin").write_bytes(b"\x00\x01" * 50)
    (src / "latin.txt").write_bytes(b"caf\xe9\n" * 10)
    meta = prepare_corpus(src, tmp_path / "out", "bytes")
    assert meta["files"] == 3 and meta["skipped"] == {"compressed": 1, "binary": 2}
    assert set(meta["skipped_examples"]) == {"b/changelog.gz", "blob.bin", "latin.txt"}
    # The splits hold exactly the three text files.
    assert meta["splits"] == prepare_corpus(_corpus(tmp_path / "clean"), tmp_path / "out2", "bytes")["splits"]
    from subquad.data.char import skipped_summary

    assert skipped_summary(meta).startswith("skipped 1 compressed and 2 binary file(s), e.g. b/changelog.gz")
    # Nothing but such files: a one-line error that says what was skipped.
    only = tmp_path / "only"
    only.mkdir()
    (only / "x.gz").write_bytes(gzip.compress(b"x" * 200))
    with pytest.raises(UserError, match=r"no text files .*skipped 1 compressed file\(s\), e.g. x.gz"):
        prepare_corpus(only, tmp_path / "o")
    # A single file named on its own is still an error when it is not text.
    with pytest.raises(UserError, match="compressed; decompress it first"):
        prepare_corpus(only / "x.gz", tmp_path / "o")


def test_glob_without_slash_matches_base_names(tmp_path):
    src = tmp_path / "doc"
    for pkg in ("alpha", "beta/sub"):
        (src / pkg).mkdir(parents=True)
        (src / pkg / "copyright").write_text(f"copyright of {pkg}\n" * 10)
        (src / pkg / "README").write_text("readme\n" * 10)
    meta = prepare_corpus(src, tmp_path / "o", "bytes", glob="copyright")
    assert meta["files"] == 2
    text = b"".join(bytes(load_split(tmp_path / "o", s)) for s in ("train", "valid", "test")).decode()
    assert "copyright of alpha" in text and "copyright of beta/sub" in text and "readme" not in text
    # A pattern with a slash matches the relative path.
    assert prepare_corpus(src, tmp_path / "o2", "bytes", glob="alpha/*")["files"] == 2
    assert prepare_corpus(src, tmp_path / "o3", "bytes", glob="*/sub/copyright")["files"] == 1


def test_standard_split_is_90m_5m_5m_and_proportional_below():
    from subquad.data.char import split_bounds

    assert split_bounds(100_000_000) == {"train": (0, 90_000_000), "valid": (90_000_000, 95_000_000),
                                         "test": (95_000_000, 100_000_000)}
    assert split_bounds(1003) == {"train": (0, 902), "valid": (902, 952), "test": (952, 1003)}


def _enwik8_like(n, seed=0):
    # Wikipedia XML as enwik8 holds it: raw UTF-8 bytes, markup, non-ASCII characters.
    rng = np.random.default_rng(seed)
    words = ["<page>", "<title>Zürich</title>", "[[Link|text]]", "&amp;", "'''bold'''", "Ωmega", "\n", " the "]
    raw = "".join(words[i] for i in rng.integers(0, len(words), size=n)).encode("utf-8")
    return raw[:n]


def test_enwik8_reader_file_and_zip(tmp_path):
    import zipfile

    from subquad.data.char import open_corpus, parse_data_spec

    raw = _enwik8_like(2000)
    (tmp_path / "enwik8").write_bytes(raw)
    with zipfile.ZipFile(tmp_path / "enwik8.zip", "w") as z:
        z.writestr("enwik8", raw)
    for spec in (f"enwik8:{tmp_path / 'enwik8'}", f"enwik8:{tmp_path / 'enwik8.zip'}"):
        meta, s = open_corpus(spec)
        assert meta["name"] == "enwik8" and meta["vocab_size"] == 256 and meta["metric"] == "bpb"
        assert not meta["standard_size"]
        assert bytes(s["train"]) == raw[:1800] and bytes(s["valid"]) == raw[1800:1900]
        assert bytes(s["test"]) == raw[1900:]
    assert parse_data_spec(str(tmp_path)) == ("", str(tmp_path))
    with pytest.raises(UserError, match="no such file"):
        open_corpus(f"enwik8:{tmp_path / 'nope'}")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as z:
        z.writestr("a", raw)
        z.writestr("b", raw)
    with pytest.raises(UserError, match="not a member named 'enwik8'"):
        open_corpus(f"enwik8:{tmp_path / 'other.zip'}")


def test_text8_reader_maps_27_symbols_and_refuses_other_bytes(tmp_path):
    from subquad.data.char import open_corpus

    text = (" anarchism originated as a term of abuse first used against early working class radicals" * 30)[:2400]
    (tmp_path / "text8").write_text(text)
    meta, s = open_corpus(f"text8:{tmp_path / 'text8'}")
    assert meta["vocab_size"] == 27 and meta["metric"] == "bpc"
    assert [len(s[k]) for k in ("train", "valid", "test")] == [2160, 120, 120]
    assert decode_ids(np.concatenate([s["train"], s["valid"], s["test"]]), "chars") == text
    assert int(s["train"].max()) <= 26 and s["train"][0] == 0 and s["train"][1] == 1
    (tmp_path / "bad").write_text(text[:500] + "A" + text[:100])
    with pytest.raises(UserError, match="byte 65 at offset 500"):
        open_corpus(f"text8:{tmp_path / 'bad'}")
