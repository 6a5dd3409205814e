"""Regenerate the README tables from the registries: `python -m subquad.cli.readme --write` (or `make readme`).

`tests/test_readme.py` fails when README.md differs from what this module renders.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

MARKERS = ("mechanisms", "models")


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
    import subquad
    from subquad.models._card import cards_table

    return cards_table(subquad.list_models())


def render(text: str) -> str:
    tables = {"mechanisms": mechanisms_table(), "models": models_table()}
    for key in MARKERS:
        pat = re.compile(rf"(<!-- {key}-table:start -->).*?(<!-- {key}-table:end -->)", re.S)
        if not pat.search(text):
            raise ValueError(f"README.md lacks the markers <!-- {key}-table:start --> / <!-- {key}-table:end -->")
        text = pat.sub(lambda m, k=key: m.group(1) + "\n" + tables[k] + "\n" + m.group(2), text)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--readme", default=str(Path(__file__).resolve().parents[2] / "README.md"))
    p.add_argument("--write", action="store_true", help="rewrite README.md in place (default: check only)")
    args = p.parse_args(argv)
    path = Path(args.readme)
    old = path.read_text()
    new = render(old)
    if args.write:
        path.write_text(new)
        return 0
    if new != old:
        print("README.md tables are out of date: run `make readme`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
