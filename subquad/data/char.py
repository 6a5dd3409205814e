"""Character-level corpora: a text file or folder -> contiguous 90/5/5 uint8 memmaps `train/valid/test.bin`.

The corpus (docs/deviations.md). Build: list the files (a folder: every file matching `glob`, sorted by relative
POSIX path bytewise; a pattern without `/` matches base names at any depth, so `copyright` finds `*/copyright`, one
with `/` the relative path),
skip the compressed and binary ones of a folder (counted in `meta.json` and reported), read the raw bytes, make
each end with a newline, concatenate, encode, split contiguously (first 90 % train, next 5 % valid, last 5 % test,
to the byte) and write each split as raw uint8 with `meta.json` (sources, sizes, vocabulary, sha256 of every
split).

Variants:
    bytes (enwik8-style): ids are the raw bytes; vocabulary 256; metric bits per byte.
    chars (text8-style): A-Z lower-cased, every other byte a space, runs of spaces collapsed; ids 0 = space,
        1-26 = a-z; vocabulary 27; metric bits per character.

Offline corpus for development: the reStructuredText sources of the Debian package `linux-doc-6.12`
(`/usr/share/doc/linux-doc-6.12/html/_sources`, files `*.rst.txt`). Results on it are named `linuxdoc-bytes` /
`linuxdoc-chars` and are never comparable to enwik8 / text8 numbers. enwik8 (a single file) and text8 work the same.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError
from ..files import atomic_write_text

__all__ = ["VARIANTS", "LINUX_DOC_SOURCES", "prepare_corpus", "load_split", "read_meta", "encode_text",
           "decode_ids", "find_linux_doc", "skipped_summary", "STANDARD_CORPORA", "split_bounds", "parse_data_spec",
           "read_standard", "open_corpus"]

VARIANTS = ("bytes", "chars")
SPLITS = ("train", "valid", "test")
LINUX_DOC_SOURCES = "/usr/share/doc/linux-doc-6.12/html/_sources"
CHARS = " abcdefghijklmnopqrstuvwxyz"
VERSION = "1"


def find_linux_doc() -> Path | None:
    """The linux-doc reStructuredText source folder when the package is installed, else None."""
    p = Path(LINUX_DOC_SOURCES)
    return p if p.is_dir() and any(p.rglob("*.rst.txt")) else None


def _matches(rel: str, pattern: str) -> bool:
    """A pattern with a `/` matches the relative path; one without matches the base name at any depth."""
    return fnmatch.fnmatch(rel if "/" in pattern else rel.rsplit("/", 1)[-1], pattern)


def _list_files(corpus: Path, glob: str | None) -> list[Path]:
    if corpus.is_file():
        return [corpus]
    if not corpus.is_dir():
        raise UserError(f"corpus {corpus} does not exist (give a text file or a folder of text files)")
    pattern = glob or "*"
    files = [p for p in corpus.rglob("*") if p.is_file() and _matches(p.relative_to(corpus).as_posix(), pattern)]
    if glob is None:
        files = [p for p in files if not p.name.startswith(".")]
    # Bytewise order of the relative POSIX path.
    files.sort(key=lambda p: p.relative_to(corpus).as_posix().encode("utf-8", "surrogateescape"))
    if not files:
        raise UserError(f"corpus folder {corpus} has no files matching {pattern!r}")
    return files


# Leading bytes of compressed and archive formats: gzip, bzip2, xz, zstd, zip, 7z, lz4, lzip.
_COMPRESSED_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd", b"PK\x03\x04", b"7z\xbc\xaf\x27\x1c",
                     b"\x04\x22\x4d\x18", b"LZIP")


def _not_text(data: bytes) -> tuple[str, str] | None:
    """(kind, reason) when `data` is not UTF-8 text: kind 'compressed' or 'binary'; None for text."""
    if data.startswith(_COMPRESSED_MAGIC):
        return "compressed", "it is compressed"
    if b"\x00" in data:
        return "binary", "it contains NUL bytes"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return "binary", f"invalid byte at offset {e.start}"
    return None


def _check_text(path: Path, data: bytes) -> None:
    bad = _not_text(data)
    if bad is None:
        return
    kind, why = bad
    if kind == "compressed":
        raise UserError(f"corpus file {path} is not text ({why}; decompress it first)")
    if why.startswith("it contains"):
        raise UserError(f"corpus file {path} is not text ({why})")
    raise UserError(f"corpus file {path} is not UTF-8 text ({why})")


def _chars_encode(raw: bytes) -> np.ndarray:
    a = np.frombuffer(raw, dtype=np.uint8)
    upper = (a >= 65) & (a <= 90)
    lower = (a >= 97) & (a <= 122)
    ids = np.zeros(len(a), dtype=np.uint8)
    ids[upper] = a[upper] - 64
    ids[lower] = a[lower] - 96
    # Collapse runs of spaces (id 0) to one.
    keep = np.ones(len(ids), dtype=bool)
    keep[1:] = ~((ids[1:] == 0) & (ids[:-1] == 0))
    return ids[keep]


def encode_text(text: str, variant: str) -> np.ndarray:
    """Encode a prompt like the corpus: UTF-8 bytes (bytes) or the 27-symbol alphabet (chars)."""
    raw = text.encode("utf-8")
    if variant == "bytes":
        return np.frombuffer(raw, dtype=np.uint8).copy()
    if variant == "chars":
        return _chars_encode(raw)
    raise UserError(f"unknown corpus variant {variant!r}; allowed: {', '.join(VARIANTS)}")


def decode_ids(ids: Any, variant: str) -> str:
    """Inverse of `encode_text` (bytes decoded as UTF-8 with replacement)."""
    ids = np.asarray(ids, dtype=np.int64)
    if variant == "bytes":
        return bytes(ids.clip(0, 255).astype(np.uint8).tolist()).decode("utf-8", errors="replace")
    return "".join(CHARS[i] if 0 <= i < 27 else "?" for i in ids.tolist())


def _sha256(data: bytes | np.ndarray) -> str:
    return hashlib.sha256(bytes(data)).hexdigest()


def _package_version(path: Path) -> str:
    """Debian version of the package owning `path` (empty when unknown)."""
    try:
        owner = subprocess.run(["dpkg", "-S", os.fspath(path)], capture_output=True, text=True, timeout=20)
        pkg = owner.stdout.split(":", 1)[0].strip() if owner.returncode == 0 else ""
        if not pkg:
            return ""
        ver = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True, timeout=20)
        return f"{pkg} {ver.stdout.strip()}" if ver.returncode == 0 else pkg
    except (OSError, subprocess.SubprocessError):
        return ""


def prepare_corpus(corpus: str | os.PathLike, out: str | os.PathLike, variant: str = "bytes",
                   glob: str | None = None, name: str = "", limit_bytes: int = 0) -> dict[str, Any]:
    """Build `train.bin`, `valid.bin`, `test.bin` and `meta.json` under `out`; returns the meta dict.

    Args:
        corpus: a text file (enwik8, text8, ...) or a folder of text files.
        out: output folder.
        variant: bytes or chars (see the module docstring).
        glob: file pattern relative to a corpus folder (default every non-hidden file; the linux-doc sources use
            `*.rst.txt`).
        name: corpus name recorded in meta.json (default: linuxdoc-<variant> for the linux-doc sources, else the
            corpus file/folder name).
        limit_bytes: keep only the first `limit_bytes` bytes of the concatenation (tests, quick runs).
    """
    if variant not in VARIANTS:
        raise UserError(f"unknown corpus variant {variant!r}; allowed: {', '.join(VARIANTS)}")
    corpus = Path(corpus)
    if glob is None and corpus.is_dir() and os.path.realpath(corpus) == os.path.realpath(LINUX_DOC_SOURCES):
        glob = "*.rst.txt"
    if limit_bytes < 0:
        raise UserError(f"--limit-bytes must be >= 0 (0 = everything), got {limit_bytes}")
    files = _list_files(corpus, glob)
    # Never read back what an earlier `prepare` wrote into the same folder.
    ours = {os.path.realpath(os.path.join(out, n)) for n in ("train.bin", "valid.bin", "test.bin", "meta.json")}
    files = [f for f in files if os.path.realpath(f) not in ours]
    parts, kept = [], []
    skipped: dict[str, list[str]] = {"compressed": [], "binary": []}
    for f in files:
        data = f.read_bytes()
        if corpus.is_file():
            _check_text(f, data)  # the one file named: say what is wrong with it
        else:
            bad = _not_text(data)
            if bad is not None:
                skipped[bad[0]].append(f.relative_to(corpus).as_posix())
                continue
        if data and not data.endswith(b"\n"):
            data += b"\n"
        parts.append(data)
        kept.append(f)
    skip = {"skipped": {k: len(v) for k, v in skipped.items()},
            "skipped_examples": [p for v in skipped.values() for p in v[:3]]}
    if not kept:
        raise UserError(f"corpus folder {corpus} has no text files matching {glob or '*'!r}: "
                        f"{skipped_summary(skip)}")
    files = kept
    raw = b"".join(parts)
    if limit_bytes:
        raw = raw[:limit_bytes]
    ids = np.frombuffer(raw, dtype=np.uint8) if variant == "bytes" else _chars_encode(raw)
    n = len(ids)
    if n < 100:
        raise UserError(f"corpus {corpus} is empty or too small: {n} symbols after encoding (need at least 100)")
    n_train, n_valid = n * 90 // 100, n * 5 // 100
    bounds = {"train": (0, n_train), "valid": (n_train, n_train + n_valid), "test": (n_train + n_valid, n)}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    splits = {}
    for split, (a, b) in bounds.items():
        part = np.ascontiguousarray(ids[a:b])
        tmp = out / f".{split}.bin.tmp"
        part.tofile(tmp)
        os.replace(tmp, out / f"{split}.bin")
        splits[split] = {"symbols": int(b - a), "sha256": _sha256(part)}
    is_linux_doc = os.path.realpath(corpus).startswith(os.path.realpath(LINUX_DOC_SOURCES))
    if not name:
        name = f"linuxdoc-{variant}" if is_linux_doc else corpus.name
    vocab = list(range(256)) if variant == "bytes" else list(CHARS)
    meta = {"name": name, "variant": variant, "generator": "subquad.data.char", "version": VERSION,
            "source": os.fspath(corpus), "glob": glob, "files": len(files), **skip, "source_bytes": len(raw),
            "source_sha256": _sha256(raw), "package": _package_version(files[0]) if is_linux_doc else "",
            "vocab_size": 256 if variant == "bytes" else 27, "vocab": vocab if variant == "chars" else "bytes 0-255",
            "splits": splits, "metric": "bpb" if variant == "bytes" else "bpc",
            "note": "not comparable to enwik8/text8" if is_linux_doc else ""}
    atomic_write_text(out / "meta.json", json.dumps(meta, indent=2) + "\n")
    return meta


def skipped_summary(meta: dict[str, Any]) -> str:
    """The skipped-files line of a prepared corpus's meta ('' when none were skipped)."""
    counts = {k: n for k, n in (meta.get("skipped") or {}).items() if n}
    if not counts:
        return ""
    examples = ", ".join(meta.get("skipped_examples") or [])
    return f"skipped {' and '.join(f'{n} {k}' for k, n in counts.items())} file(s)" + (
        f", e.g. {examples}" if examples else "")


def read_meta(root: str | os.PathLike) -> dict[str, Any]:
    """meta.json of a prepared corpus (clear error when `root` is not one)."""
    p = Path(root) / "meta.json"
    if not p.is_file():
        raise UserError(f"{root} is not a prepared corpus (no meta.json); run `subquad lm prepare --corpus ... "
                        f"--out {root}` first")
    return json.loads(p.read_text())


def load_split(root: str | os.PathLike, split: str) -> np.ndarray:
    """Memory-map `<root>/<split>.bin` as uint8 ids (split: train, valid or test)."""
    if split not in SPLITS:
        raise UserError(f"unknown corpus split {split!r}; allowed: {', '.join(SPLITS)}")
    p = Path(root) / f"{split}.bin"
    if not p.is_file():
        raise UserError(f"{p} not found; run `subquad lm prepare` first")
    if p.stat().st_size == 0:
        raise UserError(f"{p} is empty")
    return np.memmap(p, dtype=np.uint8, mode="r")


# ---------------------------------------------------------------------------------------------------------------
# The standard enwik8 / text8 files, read directly (`--data enwik8:PATH`, `--data text8:PATH`).
#
# enwik8: the first 10^8 bytes of the English Wikipedia dump of 3 March 2006 (Hutter Prize); text8: the same text
# cleaned to the 27 symbols a-z and space (Mahoney). Both are split contiguously 90M / 5M / 5M into train / valid /
# test (Transformer-LS, arXiv 2107.02192, Sec. 4.2 "divided into 90M, 5M, 5M for train, dev, test"; the split of
# Transformer-XL's `prep_enwik8.py` and of Mikolov et al.'s text8 setup). enwik8 keeps the raw bytes as ids (256);
# text8 maps space -> 0, a-z -> 1-26 (27), the alphabet of `encode_text(..., "chars")`.
#
# Split rule for a file of n symbols: train = n * 90 // 100, valid = n * 5 // 100, test = the rest. For the real
# files (n = 100,000,000) that is exactly 90M / 5M / 5M; smaller files of the same format (tests, excerpts) get the
# same proportions, and their meta says `standard_size: false`.

STANDARD_CORPORA = {"enwik8": "bytes", "text8": "chars"}
STANDARD_SIZE = 100_000_000


def split_bounds(n: int) -> dict[str, tuple[int, int]]:
    """[start, end) of train / valid / test for a corpus of n symbols (90/5/5, floor; the rest to test)."""
    n_train, n_valid = n * 90 // 100, n * 5 // 100
    return {"train": (0, n_train), "valid": (n_train, n_train + n_valid), "test": (n_train + n_valid, n)}


def parse_data_spec(spec: str | os.PathLike) -> tuple[str, str]:
    """`enwik8:PATH` / `text8:PATH` -> (name, PATH); anything else -> ("", spec), a prepared corpus folder."""
    s = os.fspath(spec)
    head, sep, tail = s.partition(":")
    if sep and head in STANDARD_CORPORA:
        if not tail:
            raise UserError(f"--data {s}: give the path after '{head}:' (the file {head} or {head}.zip)")
        return head, tail
    return "", s


def _read_standard_bytes(name: str, path: Path) -> np.ndarray:
    import zipfile

    if not path.exists():
        raise UserError(f"--data {name}:{path}: no such file (give the file {name} or its zip)")
    if path.is_dir():
        cand = [path / name, path / f"{name}.zip"]
        found = [c for c in cand if c.is_file()]
        if not found:
            raise UserError(f"--data {name}:{path}: the folder has neither {name} nor {name}.zip")
        path = found[0]
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            names = [i.filename for i in z.infolist() if not i.is_dir()]
            member = name if name in names else (names[0] if len(names) == 1 else None)
            if member is None:
                raise UserError(f"--data {name}:{path}: the zip holds {names[:5]}, not a member named {name!r}")
            return np.frombuffer(z.read(member), dtype=np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r")


def read_standard(name: str, path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read the enwik8 or text8 file (or its zip) and split it 90/5/5; returns (meta, {split: uint8 ids}).

    text8 must hold only lower-case a-z and spaces; another byte is a UserError naming its offset.
    """
    if name not in STANDARD_CORPORA:
        raise UserError(f"unknown standard corpus {name!r}; allowed: {', '.join(STANDARD_CORPORA)}")
    raw = _read_standard_bytes(name, Path(path))
    n = len(raw)
    if n < 100:
        raise UserError(f"--data {name}:{path} has {n} bytes; need at least 100")
    variant = STANDARD_CORPORA[name]
    if variant == "bytes":
        ids = raw
    else:
        table = np.full(256, 255, dtype=np.uint8)
        table[32] = 0
        table[97:123] = np.arange(1, 27, dtype=np.uint8)
        ids = table[raw]
        bad = np.flatnonzero(ids == 255)
        if len(bad):
            raise UserError(f"--data text8:{path} is not text8: byte {int(raw[bad[0]])} at offset {int(bad[0])} "
                            "(text8 holds only a-z and spaces)")
    splits = {k: ids[a:b] for k, (a, b) in split_bounds(n).items()}
    meta = {"name": name, "variant": variant, "source": os.fspath(path), "source_bytes": n,
            "standard_size": n == STANDARD_SIZE, "vocab_size": 256 if variant == "bytes" else 27,
            "vocab": list(CHARS) if variant == "chars" else "bytes 0-255",
            "splits": {k: {"symbols": len(v)} for k, v in splits.items()},
            "metric": "bpb" if variant == "bytes" else "bpc", "note": ""}
    return meta, splits


def open_corpus(spec: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The data of `--data`: `enwik8:PATH` / `text8:PATH` (read and split here) or a prepared corpus folder."""
    name, path = parse_data_spec(spec)
    if name:
        return read_standard(name, path)
    meta = read_meta(path)
    return meta, {s: load_split(path, s) for s in SPLITS}
