"""`subquad models`: the registry as a table, our measured params/GMACs beside the card's.

The table is cached (`$SUBQUAD_CACHE`, default `~/.cache/subquad`, file `models.json`) under a key made of the
subquad, torch and timm versions and the size and time of every subquad source file, so a later call prints without
importing torch: cards are read once, and each model's params/GMACs are counted (on the meta device) the first time
it is shown. Any change to the sources, or another torch or timm, starts a new cache.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from .recipes import LIBRARY_ROOT

_log = logging.getLogger(__name__)

CACHE_FILE = "models.json"
_CARD_FIELDS = ("status", "img_size", "params_m", "gmacs", "top1", "ref_params", "ref_gmacs")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("models", help="list registered models with their cards",
                       description="List subquad's models: the card's published params/GMACs/top-1 (paper) and our "
                       "own counts (meta device), flagging gaps over 1 % from the card's reference count. Cached "
                       "in $SUBQUAD_CACHE (default ~/.cache/subquad).")
    p.add_argument("--filter", default="", help="glob or substring of model names")
    p.add_argument("--unofficial", action="store_true", help="only models whose architecture we reconstructed")
    p.add_argument("--no-count", action="store_true", help="skip measuring params and GMACs (faster)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    p.set_defaults(func=run, lazy=True)
    return p


def cache_dir() -> Path:
    """$SUBQUAD_CACHE, else $XDG_CACHE_HOME/subquad, else ~/.cache/subquad."""
    if os.environ.get("SUBQUAD_CACHE"):
        return Path(os.environ["SUBQUAD_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "subquad"


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "none"


def cache_key() -> str:
    """subquad/torch/timm versions and every source file's (path, size, mtime) in subquad and subquad_cli, hashed;
    no torch import."""
    from subquad_cli.version import __version__

    h = hashlib.sha256(f"{__version__} {_dist_version('torch')} {_dist_version('timm')}".encode())
    for root in (LIBRARY_ROOT, Path(__file__).resolve().parent):
        for p in sorted(root.rglob("*.py")):
            st = p.stat()
            h.update(f"{root.name}/{p.relative_to(root).as_posix()} {st.st_size} {st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:32]


def _read_cache(path: Path, key: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("key") == key else {}


def _write_cache(path: Path, data: dict[str, Any]) -> None:
    from subquad.engine.checkpoint import write_json

    try:
        write_json(data, path)
    except OSError as e:  # a read-only home is no reason to fail
        _log.debug("cannot write the models cache %s: %s", path, e)


def _select(names: list[str], pattern: str) -> list[str]:
    """`subquad.list_models(filter)`'s rule: a glob, or else a substring."""
    if not pattern:
        return names
    pat = pattern if any(c in pattern for c in "*?[") else f"*{pattern}*"
    return [n for n in names if fnmatch.fnmatch(n, pat)]


def _cards() -> dict[str, dict[str, Any]]:
    import subquad
    from subquad.models import get_card

    return {n: {f: getattr(get_card(n), f) for f in _CARD_FIELDS} for n in subquad.list_models()}


def _count(name: str, img_size: int) -> dict[str, float]:
    import subquad

    r = subquad.count_macs(name, img_size)
    return {"params": r["params"], "gmacs": r["gmacs"]}


def table(names: list[str], cards: dict[str, dict], counts: dict[str, dict]) -> list[str]:
    """The lines of the table: our counts beside the card's published ones; `-` where a value is unknown."""
    cols = [("model", 28, "<"), ("status", 13, "<"), ("res", 4, ">"), ("params(M)", 9, ">"),
            ("paper(M)", 8, ">"), ("GMACs", 8, ">"), ("paper GMACs", 11, ">"), ("paper top-1", 11, ">"),
            ("flag", 0, "<")]

    def line(cells: list[str]) -> str:
        return " ".join(f"{c:{a}{w}}" for c, (_, w, a) in zip(cells, cols)).rstrip()

    def f(v, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    out = [line([c[0] for c in cols])]
    out.append("-" * len(out[0]))
    for n in names:
        c, m = cards[n], counts.get(n) or {}
        params = m["params"] / 1e6 if m else None
        gmacs = m.get("gmacs")
        # Gaps are measured against the count our model must match (the official code's, else the paper's).
        ref_p = c["ref_params"] / 1e6 if c["ref_params"] else c["params_m"]
        ref_g = c["ref_gmacs"] or c["gmacs"]
        flag = [k for k, ours, ref in (("params", params, ref_p), ("gmacs", gmacs, ref_g))
                if ours is not None and ref and abs(ours - ref) / ref > 0.01]
        out.append(line([n, c["status"], str(c["img_size"]), f(params, ".2f"), f(c["params_m"], ".2f"),
                         f(gmacs, ".2f"), f(c["gmacs"], ".2f"), f(c["top1"], ".1f"),
                         "GAP>1%: " + ",".join(flag) if flag else ""]))
    return out


def run(args: argparse.Namespace) -> int:
    from subquad_cli.errors import UserError

    path = cache_dir() / CACHE_FILE
    key = cache_key()
    cache = {} if args.no_cache else _read_cache(path, key)
    dirty = not cache
    cards = cache.get("cards") or _cards()
    counts: dict[str, dict] = dict(cache.get("counts") or {})
    names = _select(sorted(cards), args.filter)
    if args.unofficial:
        names = [n for n in names if cards[n]["status"] == "unofficial"]
    if not names:
        raise UserError(f"no model matches filter {args.filter!r}; try `subquad models` for all")
    if not args.no_count:
        for n in names:
            if n not in counts:
                counts[n] = _count(n, cards[n]["img_size"])
                dirty = True
    print("\n".join(table(names, cards, counts if not args.no_count else {})))
    print("params(M), GMACs: ours, counted on the meta device; paper: the card's published numbers; flag: ours "
          "more than 1 % from the card's reference count")
    print("status: official-arch, the architecture of released code; unofficial, reconstructed by us from the paper; "
          "test-size, a scaled-down size of ours for tests and demos (no published model)")
    if dirty and not args.no_cache:
        _write_cache(path, {"key": key, "cards": cards, "counts": counts})
    return 0
