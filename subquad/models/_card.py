"""Model cards: the published numbers of every registered model, with provenance, and the README table.

A card states what the paper (or official README) reports and, where it exists, the exact parameter count of the
official code. Tests assert that our models have exactly `ref_params` parameters (and GMACs within 2 % under
`slow`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["ModelCard", "CARDS", "STATUSES", "register_card", "get_card", "cards_table"]

STATUSES = ("official-arch", "unofficial", "test-size")


@dataclass(frozen=True)
class ModelCard:
    """Published facts about one registered model.

    Attributes:
        arch: registered model name.
        family: paper family ('vit', 'l2vit', 'flatten', 'lisa', 'long_short').
        img_size: resolution of the published numbers.
        params_m: published parameter count in millions (None: not published).
        gmacs: published "FLOPs" (MACs) in G at `img_size` (None: not published).
        top1: published ImageNet-1k top-1 (%) (None: not published).
        source: where the numbers come from (paper title or arXiv id with its table, or the official README).
        status: 'official-arch' (architecture follows released code), 'unofficial' (reconstructed by us) or
            'test-size' (a scaled-down `*_micro` configuration of ours for tests and demos: no published model).
        ref_params: the exact parameter count our model must have (official code, measured; else our
            definition's count, measured). None: no count to hold (tiny test variants).
        ref_gmacs: GMACs our counter must match within 2 % (`slow` test); None: not checked.
        code: the official repository ('' when none exists).
        notes: anything a user must know (e.g. 'paper, not reproduced').
    """

    arch: str
    family: str
    img_size: int = 224
    params_m: float | None = None
    gmacs: float | None = None
    top1: float | None = None
    source: str = ""
    status: str = "official-arch"
    ref_params: int | None = None
    ref_gmacs: float | None = None
    code: str = ""
    notes: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return asdict(self)


CARDS: dict[str, ModelCard] = {}


def register_card(card: ModelCard) -> ModelCard:
    """Add `card` to CARDS; a second card for one arch is an error."""
    if card.arch in CARDS:
        raise ValueError(f"model card for {card.arch!r} is already registered")
    if card.status not in STATUSES:
        raise ValueError(f"card {card.arch!r}: status must be one of {', '.join(STATUSES)}, got {card.status!r}")
    CARDS[card.arch] = card
    return card


def get_card(arch: str) -> ModelCard | None:
    return CARDS.get(arch)


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def cards_table(names: list[str]) -> str:
    """Markdown table of the cards of `names` (the README models table), with the official release tags."""
    import timm

    rows = ["| model | family | status | res | params (M) paper | GMACs paper | top-1 paper | official weights "
            "| source |", "|---|---|---|---|---|---|---|---|---|"]
    for n in names:
        c = CARDS.get(n)
        if c is None:
            rows.append(f"| `{n}` | - | - | - | - | - | - | - | - |")
            continue
        tags = ", ".join(f"`{t}`" for t in timm.list_pretrained(f"{n}.*")) or "-"
        rows.append(f"| `{n}` | {c.family} | {c.status} | {c.img_size} | {_fmt(c.params_m, '.1f')} | "
                    f"{_fmt(c.gmacs, '.2f')} | {_fmt(c.top1, '.1f')} | {tags} | {c.source or '-'} |")
    return "\n".join(rows)
