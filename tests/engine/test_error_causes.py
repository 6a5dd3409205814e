"""A user error that wraps an exception keeps it as its cause (SUBQUAD_DEBUG=1 shows the whole chain), and a bug
while the arena builds a host is not mistaken for the host refusing a mechanism."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from subquad.errors import UserError


class _Broken(nn.Module):
    def forward(self, x):
        raise RuntimeError("shape mismatch deep inside")


def test_img_size_refusal_keeps_its_cause():
    from subquad.engine.modelbuild import check_img_size

    with pytest.raises(UserError, match="cannot take --img-size 7: shape mismatch deep inside") as e:
        check_img_size(_Broken(), "broken", 3, 7, torch.device("cpu"))
    assert isinstance(e.value.__cause__, RuntimeError)


def test_build_refusal_keeps_its_cause():
    from subquad.engine.modelbuild import build_model

    with pytest.raises(UserError, match="cannot build model 'vit_attn_micro'") as e:
        build_model("vit_attn_micro", 10, model_kwargs={"mlp_ratio": -1.0})
    assert isinstance(e.value.__cause__, RuntimeError)


@pytest.mark.parametrize("exc,refused", [(ValueError("window 7 does not fit"), True),
                                         (NotImplementedError("no 1-head form"), True),
                                         (RuntimeError("a bug"), False), (TypeError("a typo"), False)])
def test_arena_refusal_is_a_refusal_not_a_bug(monkeypatch, exc, refused):
    import subquad.models
    from subquad.arena import image

    def create_model(*a, **k):
        raise exc

    monkeypatch.setattr(subquad.models, "create_model", create_model)
    train, mech = {"model": "vit_attn_micro", "img_size": 28}, {"attn": "softmax"}
    if refused:
        assert image.refusal(train, mech) == f"the host cannot take it: {exc}"
    else:
        with pytest.raises(type(exc)):
            image.refusal(train, mech)


def test_a_depth_below_one_is_named():
    import subquad

    with pytest.raises(UserError, match=r"needs at least one block, got -2 \(a depth must be >= 1\)"):
        subquad.create_model("vit_attn_micro", depth=-2)
