"""Every host family takes every registered mechanism its stages admit, and refuses the others at build time.

The hosts never name a mechanism: each one describes its stages (grid, class token, causal mode, ...) and the
mechanism's adapter (`TokenMixer.stage_kwargs`) picks its options or refuses the stage with one line. Here every
family (one micro variant each) is built with every registered mechanism:
    - a mechanism whose declared capabilities admit the family's stages builds, and a forward on a small non-square
      input gives finite logits of the right shape;
    - any other mechanism is refused while the model is built, with one line (ValueError / UserError) that names
      it and says what is missing and what would fit; never a crash inside torch at the first forward.
The expected admission is computed here from the declared capabilities alone (not from the adapters), plus a short
table of refusals that depend on a stage's size rather than on capabilities.
"""

from __future__ import annotations

import pytest
import timm
import torch

import subquad  # noqa: F401  (registers the models)
from subquad.attention import Request, check, get_attention_cls, list_attention
from subquad.errors import UserError
from subquad.models.lisanet import LiSANet
from subquad.sequence import create_sequence_model

MECHANISMS = list_attention()


def _image(name: str, **kw):
    return lambda a: timm.create_model(name, num_classes=3, **{k: (v(a) if callable(v) else v) for k, v in kw.items()})


def _video(a: str):
    return LiSANet(img_size=32, embed_dims=(16, 32, 32, 64), depths=(1, 1, 1, 1),
                   stage_types=("conv", "conv", "lisa", "lisa"), num_heads=(1, 2, 2, 2), D=4, video=True,
                   num_frames=4, num_classes=3, attn=a)


def _char_lm(a: str):
    return create_sequence_model("char_lm", vocab_size=20, dim=16, depth=1, num_heads=2, attention=a)


_FOUR = lambda a: (a,) * 4  # noqa: E731  (one mechanism for every stage)

# family: (builder(mechanism) -> model, input, what the stages ask: "2d", "2d+cls", "3d" or "lm", default mechanism)
FAMILIES = {
    "l2vit_lwa": (_image("l2vit_micro", lwa_attn=lambda a: a), (1, 3, 32, 40), "2d", "window"),
    "l2vit_lga": (_image("l2vit_micro", lga_attn=lambda a: a), (1, 3, 32, 40), "2d", "enhanced_linear"),
    "flatten_deit": (_image("flatten_deit_micro", attn=lambda a: a), (1, 3, 32, 40), "2d+cls", "focused_linear"),
    "vit": (_image("vit_attn_micro", attn=lambda a: a), (1, 3, 32, 40), "2d+cls", "softmax"),
    "vit_avg": (_image("vit_attn_micro", attn=lambda a: a, class_token=False, global_pool="avg"), (1, 3, 32, 40),
                "2d", "softmax"),
    "flatten_pvt": (_image("flatten_pvt_micro", stage_attn=_FOUR), (1, 3, 32, 40), "2d", "focused_linear"),
    "flatten_pvt_v2": (_image("flatten_pvt_v2_micro", stage_attn=_FOUR), (1, 3, 32, 40), "2d", "focused_linear"),
    "flatten_swin": (_image("flatten_swin_micro", stage_attn=_FOUR), (1, 3, 64, 72), "2d", "window"),
    "lisanet": (_image("lisanet_micro", attn=lambda a: a), (1, 3, 32, 40), "2d", "structure_aware"),
    "hylisanet": (_image("hylisanet_micro", attn=lambda a: a), (1, 3, 32, 40), "2d", "structure_aware"),
    "hylisanet_video": (_video, (1, 3, 4, 32, 40), "3d", "structure_aware"),
    "char_lm": (_char_lm, None, "lm", "long_short"),
}

# Refusals that depend on a stage's sizes, not on capabilities: (family, mechanism) -> a word of the message.
_ODD_HEADS = "even num_heads"  # CSwin's two stripe branches split the heads; these micro models have a 1-head stage
SIZE_REFUSALS = {**{(f, "cswin"): _ODD_HEADS for f in ("l2vit_lwa", "l2vit_lga", "flatten_pvt", "flatten_pvt_v2",
                                                      "flatten_swin", "lisanet")},
                 }


def _admitted_by_caps(kind: str, name: str) -> bool:
    cls = get_attention_cls(name)
    caps = cls.caps
    if kind == "lm":
        return not check(caps, Request(causal=True, sequence=True))
    if check(caps, Request()) or (3 if kind == "3d" else 2) not in caps.grid_ndims:
        return False
    if kind == "2d+cls":  # a grid mixer must declare that it takes the class token as a prefix token
        return cls.takes_prefix_tokens()
    return True


def _input(family: str, shape):
    g = torch.Generator().manual_seed(0)
    if shape is None:
        return torch.randint(0, 20, (1, 13), generator=g)
    return torch.randn(*shape, generator=g)


CASES = [(f, a) for f in FAMILIES for a in MECHANISMS]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_default_mechanism_is_admitted(family):
    _, _, kind, default = FAMILIES[family]
    assert default in MECHANISMS and _admitted_by_caps(kind, default)


@pytest.mark.parametrize("family,name", CASES, ids=[f"{f}-{a}" for f, a in CASES])
def test_family_builds_or_refuses(family, name):
    build, shape, kind, _ = FAMILIES[family]
    admitted = _admitted_by_caps(kind, name) and (family, name) not in SIZE_REFUSALS
    if admitted:
        model = build(name).eval()
        x = _input(family, shape)
        with torch.no_grad():
            y = model(x)
        want = (1, 13, 20) if kind == "lm" else (1, 3)
        assert tuple(y.shape) == want and torch.isfinite(y).all(), (family, name)
        return
    with pytest.raises((UserError, ValueError)) as info:
        build(name)
    msg = str(info.value)
    assert type(info.value) in (UserError, ValueError), f"{family}/{name}: refused by {type(info.value).__name__}"
    assert "\n" not in msg and name in msg, f"{family}/{name}: refusal must be one line naming the mechanism: {msg!r}"
    if (family, name) in SIZE_REFUSALS:
        assert SIZE_REFUSALS[family, name] in msg, msg
    elif kind == "lm":
        fit = msg.split("mechanisms with a causal 1-D form: ")[1].split(", ")
        assert fit == [a for a in MECHANISMS if _admitted_by_caps("lm", a)], msg
    else:
        # A capability refusal lists exactly the mechanisms whose capabilities fit the same stage.
        fit = msg.split("mechanisms that fit: ")[1].split(", ")
        assert fit == [a for a in MECHANISMS if _admitted_by_caps(kind, a)], msg


def test_l2vit_lga_ablation_options_need_a_mechanism_that_takes_them():
    with pytest.raises(UserError, match="lga_attn='softmax' does not take"):
        timm.create_model("l2vit_micro", lga_attn="softmax", learnable_scale=False)
    m = timm.create_model("l2vit_micro", learnable_scale=False, clamp_min=50.0)
    attn = m.stages[0][1].attn
    assert attn.clamp_min == 50.0 and attn.temperature is None


def test_l2vit_lwa_is_the_window_form():
    """The LWA blocks reach WindowAttention's 'lwa' form through its adapter: no RPB, no shift, zero padding."""
    attn = timm.create_model("l2vit_micro").stages[0][0].attn
    assert (attn.pad_mode, attn.shift_size, attn.relative_position_bias_table) == ("zero", 0, None)
    assert attn.window_size == 4
