"""Run timm's own `tests/test_models.py`, unchanged, against subquad's registered models only.

Usage (from the repository root; the test file comes from timm's repository at the release pyproject pins):

    python -m tests.models.timm_suite /path/to/pytorch-image-models/tests/test_models.py [pytest args...]

The upstream file parametrises its tests with `timm.list_models(...)` at import. This runner imports subquad (which
registers its models), then narrows `timm.list_models` to subquad's names before pytest imports the file:
- every call keeps only subquad's models (base name before the '.tag');
- a `module=` filter (the upstream list of timm modules whose models implement `forward_intermediates`) is
  replaced by subquad's family modules: every subquad model implements it through `subquad.models._base.Backbone`;
- the upstream list of non-standard name patterns (recognised by its 'vit_*' entry) is extended with the names
  subquad declares non-standard (`subquad.models.NON_STD`: the hosts whose features are token sequences, (B, N, C)),
  both where it is used as a filter and where it is excluded. This is what timm does for its own ViTs, by name
  (`NON_STD_FILTERS` in its tests/test_models.py): `test_model_default_cfgs` asserts two spatial axes
  (`assert len(spatial_axis) == 2  # TODO add 1D sequence support`), which a token sequence does not have, and
  `test_model_default_cfgs_non_std` checks those models instead.
Nothing else changes: sizes, tolerances and assertions are timm's. pytest imports the upstream files with
`--import-mode=importlib`: timm's `tests/conftest.py` and subquad's would otherwise both be `tests.conftest`.
Run it as timm's CI does, offline, with GITHUB_ACTIONS=1 (no test downloads weights then).
"""

from __future__ import annotations

import sys
from pathlib import Path


def _narrow_list_models() -> None:
    import timm
    import timm.models

    import subquad
    from subquad.models import NON_STD

    ours = set(subquad.list_models())
    modules = sorted({timm.models._registry._model_to_module[n] for n in ours})
    original = timm.models.list_models

    def _extend(patterns):
        if isinstance(patterns, (list, tuple)) and "vit_*" in patterns:
            return [*patterns, *sorted(NON_STD)]
        return patterns

    def list_models(filter="", module="", pretrained=False, exclude_filters="", name_matches_cfg=False,  # noqa: A002
                    include_tags=None):
        names = original(filter=_extend(filter), module=modules if module else "", pretrained=pretrained,
                         exclude_filters=_extend(exclude_filters), name_matches_cfg=name_matches_cfg,
                         include_tags=include_tags)
        return [n for n in names if n.split(".")[0] in ours]

    timm.list_models = list_models
    timm.models.list_models = list_models


def main(argv: list[str]) -> int:
    import pytest

    if not argv:
        print(__doc__)
        return 2
    _narrow_list_models()
    root = str(Path(argv[0]).resolve().parent)
    return pytest.main(["-p", "no:cacheprovider", "-W", "ignore::pytest.PytestUnknownMarkWarning", "--rootdir", root,
                        "--import-mode=importlib", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
