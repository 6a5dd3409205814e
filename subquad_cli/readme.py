"""Regenerate the generated tables of README.md and the docs from the registries.

`python -m subquad_cli.readme --write` (or `make readme`) rewrites, between their `<!-- NAME:start -->` /
`<!-- NAME:end -->` markers:

- README.md: `families-table` (one row per model family);
- docs/models.md: `zoo-table` (the model zoo: one table per family, every registered model with its card's
  params, GMACs and top-1, its released weights with their licence, and the command that loads it);
- docs/mechanisms.md: `mechanisms-table` (every registered attention mechanism with its capabilities);

and writes docs/index.md, the site's home page, from README.md (`home_page`). Numbers in the text are generated too:
`<!-- count:NAME -->N<!-- /count -->` gets the current count NAME of `COUNTS` (registered models, official weight
tags, mechanisms).

Without `--write` it only checks, and exits 1 when a file is stale. `tests/test_readme.py` fails the same way.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: file (relative to the repository root) -> the marker names it holds.
TARGETS: dict[str, tuple[str, ...]] = {
    "README.md": ("families",),
    "docs/models.md": ("zoo",),
    "docs/mechanisms.md": ("mechanisms",),
}

#: family -> (display name, paper reference).
FAMILIES: dict[str, tuple[str, str]] = {
    "l2vit": ("L2ViT", "The Linear Attention Resurrection in Vision Transformer"),
    "flatten": ("FLatten", "FLatten Transformer: Vision Transformer using Focused Linear Attention (arXiv 2308.00442)"),
    "lisa": ("LiSA", "Lightweight Structure-Aware Attention for Visual Understanding (arXiv 2211.16289)"),
    "long_short": ("Transformer-LS", "Long-Short Transformer: Efficient Transformers for Language and Vision "
                   "(arXiv 2107.02192)"),
    "agent": ("Agent Attention", "Agent Attention: On the Integration of Softmax and Linear Attention "
              "(arXiv 2312.08874)"),
    "inline": ("InLine", "Bridging the Divide: Reconsidering Softmax and Linear Attention (arXiv 2412.06590)"),
    "polaformer": ("PolaFormer", "PolaFormer: Polarity-aware Linear Attention for Vision Transformers "
                   "(arXiv 2501.15061)"),
    "mlla": ("MLLA", "Demystify Mamba in Vision: A Linear Attention Perspective (arXiv 2405.16605)"),
    "vit": ("ViT / DeiT host", "Training data-efficient image transformers (DeiT, arXiv 2012.12877)"),
}


def mechanisms_table() -> str:
    from subquad.attention import ATTENTION_REGISTRY

    rows = ["| name | class | cost | spatial (needs hw) | causal | key mask | notes |", "|---|---|---|---|---|---|---|"]
    for name in ATTENTION_REGISTRY.names():
        cls = ATTENTION_REGISTRY.get(name).builder
        c = cls.caps
        yn = {True: "yes", False: "no"}
        rows.append(f"| `{name}` | `{cls.__name__}` | {c.complexity} | {yn[c.needs_hw]} | {yn[c.causal]} | "
                    f"{yn[c.supports_mask]} | {c.notes or '-'} |")
    return "\n".join(rows)


def models_table() -> str:
    """The full card table of every registered model (`subquad.models._card.cards_table`)."""
    import subquad
    from subquad.models._card import cards_table

    return cards_table(subquad.list_models())


def _by_family() -> dict[str, list[str]]:
    import subquad
    from subquad.models import get_card

    out: dict[str, list[str]] = {}
    for name in subquad.list_models():
        card = get_card(name)
        out.setdefault(card.family if card else "other", []).append(name)
    order = list(FAMILIES) + sorted(set(out) - set(FAMILIES))
    return {f: out[f] for f in order if f in out}


def _weights(name: str) -> list[tuple[str, str]]:
    """[(tag, licence)] of the released weights of `name`."""
    import timm
    from timm.models import get_pretrained_cfg

    tags = []
    for t in timm.list_pretrained(f"{name}.*"):
        cfg = get_pretrained_cfg(t)
        tags.append((t, (cfg.license if cfg is not None else None) or "unknown"))
    return tags


def families_table() -> str:
    """README: one row per family: its paper, its models and which of them have released weights."""
    rows = ["| family | paper | models | with official weights |", "|---|---|---|---|"]
    for fam, names in _by_family().items():
        label, paper = FAMILIES.get(fam, (fam, "-"))
        weighted = [n for n in names if _weights(n)]
        rows.append(f"| {label} | {paper} | {len(names)} | "
                    f"{', '.join(f'`{n}`' for n in weighted) or '-'} |")
    return "\n".join(rows)


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _source(source: str, paper: str) -> str:
    """`source` without the family's paper title (the zoo states it above each table)."""
    title = paper.split(" (")[0]
    if not source.startswith(title):
        return source or "-"
    rest = source[len(title):].lstrip()
    rest = re.sub(r"^\([^)]*\)", "", rest).lstrip(" ;,")
    return rest or "the paper"


def zoo_tables() -> str:
    """docs/models.md: one table per family, every model with its card, weights, licence and load command; below
    each table, where the numbers come from."""
    from subquad.models import get_card

    out = []
    for fam, names in _by_family().items():
        label, paper = FAMILIES.get(fam, (fam, "-"))
        out += [f"### {label}", "", f"Paper: {paper}.", "",
                "| model | res | params (M) | GMACs | top-1 (%) | official weights (licence) | load |",
                "|---|---|---|---|---|---|---|"]
        sources: dict[str, list[str]] = {}
        for n in names:
            c = get_card(n)
            w = _weights(n)
            weights = "<br>".join(f"`{t}` ({lic})" for t, lic in w) or "-"
            load = f'`timm.create_model("{w[0][0]}", pretrained=True)`' if w else f'`timm.create_model("{n}")`'
            if c is None:
                out.append(f"| `{n}` | - | - | - | - | {weights} | {load} |")
                continue
            sources.setdefault(_source(c.source, paper), []).append(n)
            model = f"`{n}`" + {"unofficial": " (unofficial)", "test-size": " (test size)"}.get(c.status, "")
            out.append(f"| {model} | {c.img_size} | {_fmt(c.params_m, '.1f')} | {_fmt(c.gmacs, '.2f')} | "
                       f"{_fmt(c.top1, '.1f')} | {weights} | {load} |")
        out += ["", "Numbers from:", ""]
        out += [f"- {', '.join(f'`{n}`' for n in ns)}: {src}" for src, ns in sources.items()]
        out.append("")
    return "\n".join(out).rstrip()


HOME = "docs/index.md"


def home_page(readme: str) -> str:
    """docs/index.md: the README (a front page) with its links made relative to docs/, the family table replaced
    by a pointer to the model zoo, and the list of pages dropped (the site's navigation has them)."""
    t = readme.replace("](docs/", "](")
    t = t.replace("([docs/](index.md))", "(this site)")
    t = t.replace("[LICENSE](LICENSE)", "`LICENSE`")
    t = t.replace("[CHANGELOG.md](CHANGELOG.md) records its versions",
                  "the [changelog](changelog.md) records its versions")
    a, b = t.index("## Models\n"), t.index("\n## ", t.index("## Models\n") + 1) + 1
    t = t[:a] + ("## Models\n\nEvery model with its paper's params, GMACs and top-1, its weights and their licence, "
                 "and the command that\nloads it: [Model zoo](models.md).\n\n") + t[b:]
    a = t.index("## Documentation\n")
    b = t.index("\n## ", a + 1) + 1
    note = "<!-- Generated from README.md by `make readme` (python -m subquad_cli.readme --write): edit README.md. -->"
    return note + "\n" + t[:a] + t[b:]


RENDERERS = {"mechanisms": mechanisms_table, "families": families_table, "zoo": zoo_tables}


def _count_models() -> int:
    import subquad

    return len(subquad.list_models())


def _count_weight_tags() -> int:
    import subquad

    return sum(len(_weights(n)) for n in subquad.list_models())


def _count_mechanisms() -> int:
    import subquad

    return len(subquad.list_attention())


#: count name -> how it is counted now (for `<!-- count:NAME -->N<!-- /count -->` in the text).
COUNTS = {"models": _count_models, "weight-tags": _count_weight_tags, "mechanisms": _count_mechanisms}
COUNT = re.compile(r"<!-- count:([\w-]+) -->(.*?)<!-- /count -->")


def render_counts(text: str, name: str = "README.md") -> str:
    """`text` with every count marker's number replaced by the current count."""
    def one(m: re.Match) -> str:
        if m.group(1) not in COUNTS:
            raise ValueError(f"{name}: unknown count {m.group(1)!r}; known: {', '.join(COUNTS)}")
        return f"<!-- count:{m.group(1)} -->{COUNTS[m.group(1)]()}<!-- /count -->"

    return COUNT.sub(one, text)


def render(text: str, keys: tuple[str, ...] = ("families",), name: str = "README.md") -> str:
    """`text` with the block between each key's markers replaced by the freshly rendered table, and its count
    markers by the current counts."""
    text = render_counts(text, name)
    for key in keys:
        pat = re.compile(rf"(<!-- {key}-table:start -->).*?(<!-- {key}-table:end -->)", re.S)
        if not pat.search(text):
            raise ValueError(f"{name} lacks the markers <!-- {key}-table:start --> / <!-- {key}-table:end -->")
        table = RENDERERS[key]()
        text = pat.sub(lambda m, t=table: m.group(1) + "\n" + t + "\n" + m.group(2), text)
    return text


def expected(root: Path = ROOT) -> dict[str, str]:
    """Every generated file under `root` (relative path -> the text it must have)."""
    out = {rel: render((root / rel).read_text(), keys, rel) for rel, keys in TARGETS.items()}
    out[HOME] = home_page(out["README.md"])
    return out


def stale(root: Path = ROOT, want: dict[str, str] | None = None) -> list[str]:
    """The generated files under `root` that differ from what the registries (and README.md) render."""
    want = expected(root) if want is None else want
    return [rel for rel, text in want.items() if not (root / rel).exists() or (root / rel).read_text() != text]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default=str(ROOT), help="repository root holding README.md and docs/")
    p.add_argument("--write", action="store_true", help="rewrite the stale files in place (default: check only)")
    args = p.parse_args(argv)
    root = Path(args.root)
    want = expected(root)
    bad = stale(root, want)
    if args.write:
        from subquad.files import atomic_write

        for rel in bad:
            atomic_write(root / rel, lambda tmp, s=want[rel]: Path(tmp).write_text(s))
            print(f"rewrote {rel}")
        return 0
    if bad:
        print(f"generated tables are out of date in {', '.join(bad)}: run `make readme`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
