"""Every registered model has a card; parameter counts equal the card's exact reference count (meta device)."""

from __future__ import annotations

import pytest

import subquad
from subquad.models import CARDS

NAMES = subquad.list_models()
WITH_PARAMS = [n for n in NAMES if CARDS[n].ref_params]
WITH_GMACS = [n for n in NAMES if CARDS[n].ref_gmacs]


def test_every_model_has_a_card_and_is_in_timm():
    import timm

    for n in NAMES:
        assert timm.is_model(n), n
        assert CARDS[n].status in ("official-arch", "unofficial", "test-size")
        # A scaled-down variant is never labelled as a published architecture's model (and only those are).
        assert (CARDS[n].status == "test-size") == ("_micro" in n), (n, CARDS[n].status)


@pytest.mark.parametrize("name", WITH_PARAMS)
def test_params_match_card(name):
    m = subquad.create_model(name, device="meta")
    n = sum(p.numel() for p in m.parameters())
    ref = CARDS[name].ref_params
    assert n == ref, f"{name}: {n:,} params vs reference {ref:,}"


@pytest.mark.slow
@pytest.mark.parametrize("name", WITH_GMACS)
def test_gmacs_match_card(name):
    c = CARDS[name]
    g = subquad.count_macs(name, c.img_size)["gmacs"]
    assert abs(g - c.ref_gmacs) / c.ref_gmacs <= 0.02, f"{name}: {g:.3f} GMACs vs reference {c.ref_gmacs}"
