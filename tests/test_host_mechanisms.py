"""Every host family takes every registered mechanism its stages admit, through the one keyword `attn=`, and refuses
the others at build time.

The families come from the registry: every module that registered models (`register_family`) and each of its micro
variants (`*_micro*`), so a new family is covered without an edit here. The hosts never name a mechanism: each one
describes its stages (grid, class token, ...) to `build_stage_attention`, and the mechanism's adapter
(`TokenMixer.stage_kwargs`) picks its options or refuses the stage with one line. Here every micro model is built
with `attn=` set to every registered mechanism:
    - a mechanism whose declared capabilities admit the model's stages builds, and a forward on a small non-square
      input gives finite logits of the right shape;
    - any other mechanism is refused while the model is built, with one line (ValueError / UserError) that names
      it and says what is missing and what would fit; never a crash inside torch at the first forward.
The expected admission is computed from the declared capabilities alone (not from the adapters), applied to the
stage facts each host hands to `build_stage_attention` when it is built with its own mechanisms, plus a short
table of refusals that depend on a stage's size rather than on capabilities.
"""

from __future__ import annotations

import functools
import sys
import warnings

import pytest
import timm
import torch

import subquad  # noqa: F401  (registers the models)
from subquad.attention import Request, check, get_attention_cls, list_attention, registry
from subquad.errors import UserError
from subquad.models._builder import FAMILY_MODULES
from subquad.sequence import create_sequence_model

MECHANISMS = list_attention()
# Every registered family's micro variants, and one host configuration beyond them (a ViT without class token).
MODELS = [n for m in sorted(FAMILY_MODULES) for n in timm.list_models("*_micro*", module=m)]
HOSTS = [(n, ()) for n in MODELS] + [("vit_attn_micro", (("class_token", False), ("global_pool", "avg")))]


def _host_id(host) -> str:
    name, kw = host
    return name + "".join(f"-{k}={v}" for k, v in kw)


def test_every_family_has_a_micro_model():
    """The derivation above covers a family only through its micro variant(s): each registered family has one."""
    assert FAMILY_MODULES and all(timm.list_models("*_micro*", module=m) for m in FAMILY_MODULES)
    assert {"vit", "flatten_deit", "l2vit", "flatten_pvt", "flatten_pvt_v2", "flatten_swin", "flatten_cswin",
            "vil_ls", "cvt_ls", "lisanet"} <= FAMILY_MODULES


@functools.cache
def _stages(host) -> tuple[dict, ...]:
    """The stage facts (plus `host_qkv`: the host projects q, k, v itself, and the `mechanism` it asks for)
    that `host` hands to `build_stage_attention` while it is built, on the meta device, with its own mechanisms."""
    name, kw = host
    seen = []
    real = registry.build_stage_attention

    def spy(mech, dim, heads, stage, overrides=None, **kwargs):
        seen.append({**stage, "host_qkv": bool(kwargs.get("host_qkv")), "mechanism": mech})
        return real(mech, dim, heads, stage, overrides, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        # every module that imported the function (the hosts), not the registry's own module
        for mod in list(sys.modules.values()):
            if getattr(mod, "__name__", "").startswith("subquad.") and mod is not registry and \
                    getattr(mod, "build_stage_attention", None) is real:
                mp.setattr(mod, "build_stage_attention", spy)
        timm.create_model(name, num_classes=3, device="meta", **dict(kw))
    assert seen, f"{name}: no stage reached build_stage_attention"
    return tuple(seen)


def _fits(stage: dict, mech: str) -> bool:
    """Whether `mech`'s declared capabilities serve `stage` (its causal mode, grid rank and class tokens)."""
    cls = get_attention_cls(mech)
    if check(cls.caps, Request(causal=bool(stage.get("causal")), sequence=bool(stage.get("sequence")))):
        return False
    grid = stage.get("grid")
    if grid is not None and len(grid) not in cls.caps.grid_ndims:
        return False
    return not stage.get("num_prefix_tokens") or cls.takes_prefix_tokens()


def _has_host_qkv_form(mech: str) -> bool:
    try:
        registry.get_attention_form(mech, "host_qkv")
    except UserError:
        return False
    return True


def _admitted(host, mech: str) -> bool:
    stages = _stages(host)
    if any(s["host_qkv"] for s in stages) and not _has_host_qkv_form(mech):
        return False
    return all(_fits(s, mech) for s in stages)


# Refusals that depend on a stage's sizes, not on capabilities: (model, mechanism) -> a word of the message.
_ODD_HEADS = "even num_heads"  # CSwin's two stripe branches split the heads; these micro models have a 1-head stage
SIZE_REFUSALS = {(n, "cswin"): _ODD_HEADS for n in ("l2vit_micro", "flatten_pvt_micro", "flatten_pvt_v2_micro",
                                                    "flatten_swin_micro", "lisanet_micro", "cvt_ls_micro",
                                                    "pola_pvt_micro", "pola_swin_micro",
                                                    "agent_pvt_micro", "agent_swin_micro", "mlla_micro")}


def _input(model) -> torch.Tensor:
    """A small non-square input: the model's default size, 8 pixels wider (a clip of its frames for video)."""
    c, h, w = model.pretrained_cfg["input_size"]
    frames = (model.num_frames,) if getattr(model, "input_ndim", 4) == 5 else ()
    return torch.randn(1, c, *frames, h, w + 8, generator=torch.Generator().manual_seed(0))


CASES = [(h, a) for h in HOSTS for a in MECHANISMS]


@pytest.mark.parametrize("host", HOSTS, ids=_host_id)
def test_own_mechanisms_are_admitted(host):
    """Each stage's own mechanism (the model as registered) declares capabilities that serve the stage."""
    for stage in _stages(host):
        assert _fits(stage, stage["mechanism"]), stage
        assert not stage["host_qkv"] or _has_host_qkv_form(stage["mechanism"]), stage


@pytest.mark.parametrize("host,mech", CASES, ids=[f"{_host_id(h)}-{a}" for h, a in CASES])
def test_family_builds_or_refuses(host, mech):
    name, kw = host
    build = functools.partial(timm.create_model, name, num_classes=3, attn=mech, **dict(kw))
    refusal = SIZE_REFUSALS.get((name, mech))
    if _admitted(host, mech) and refusal is None:
        model = build().eval()
        with torch.no_grad():
            y = model(_input(model))
        assert tuple(y.shape) == (1, 3) and torch.isfinite(y).all(), (name, mech)
        return
    with pytest.raises((UserError, ValueError)) as info:
        build()
    msg = str(info.value)
    assert type(info.value) in (UserError, ValueError), f"{name}/{mech}: refused by {type(info.value).__name__}"
    assert "\n" not in msg and mech in msg, f"{name}/{mech}: refusal must be one line naming the mechanism: {msg!r}"
    stages = _stages(host)
    if refusal is not None:
        assert refusal in msg, msg
    elif any(s["host_qkv"] for s in stages) and not _has_host_qkv_form(mech):
        # The host projects q, k, v: the refusal lists the mechanisms that have that form.
        can = msg.split("mechanisms that can: ")[1].split(", ")
        assert can == [a for a in MECHANISMS if _has_host_qkv_form(a)], msg
    else:
        # A capability refusal, at the first stage the mechanism cannot serve, lists exactly the mechanisms whose
        # capabilities fit that stage.
        first = next(s for s in stages if not _fits(s, mech))
        fit = msg.split("mechanisms that fit: ")[1].split(", ")
        assert fit == [a for a in MECHANISMS if _fits(first, a)], msg


def _char_lm(mech: str):
    return create_sequence_model("char_lm", vocab_size=20, dim=16, depth=1, num_heads=2, attention=mech)


def _lm_admitted(mech: str) -> bool:
    return not check(get_attention_cls(mech).caps, Request(causal=True, sequence=True))


@pytest.mark.parametrize("mech", MECHANISMS)
def test_char_lm_builds_or_refuses(mech):
    """The sequence host (a causal LM) takes every mechanism with a causal 1-D form and refuses the others."""
    if _lm_admitted(mech):
        with torch.no_grad():
            y = _char_lm(mech).eval()(torch.randint(0, 20, (1, 13), generator=torch.Generator().manual_seed(0)))
        assert tuple(y.shape) == (1, 13, 20) and torch.isfinite(y).all()
        return
    with pytest.raises(ValueError) as info:
        _char_lm(mech)
    msg = str(info.value)
    assert "\n" not in msg and mech in msg, msg
    assert msg.split("mechanisms with a causal 1-D form: ")[1].split(", ") == [a for a in MECHANISMS
                                                                               if _lm_admitted(a)], msg


def test_the_admission_rule_can_refuse():
    """The expected admissions above are not all 'yes': a class token, a video grid and host-projected q, k, v each
    leave some mechanism out."""
    by_host = {h[0]: [a for a in MECHANISMS if _admitted(h, a)] for h in HOSTS if not h[1]}
    assert "global_filter" not in by_host["vit_attn_micro"]  # a class token
    assert "window" not in by_host["hylisanet_micro_video"]  # a (T, H, W) grid
    assert "linear_relu" not in by_host["flatten_cswin_micro"]  # no "host_qkv" form
    assert "global_filter" in by_host["l2vit_micro"] and "softmax" in by_host["cvt_ls_micro"]


# ----- the one keyword: attn=, its per-stage and per-kind forms, and the deprecated spellings -----

def test_per_stage_tuple_and_l2vit_block_kinds():
    m = timm.create_model("flatten_pvt_micro", attn=("focused_linear", "softmax", "softmax", "linear_relu"),
                          device="meta")
    assert m.attn_names == ("focused_linear", "softmax", "softmax", "linear_relu")
    assert [type(b[0].attn).name for b in (m.block1, m.block2, m.block3, m.block4)] == list(m.attn_names)
    m = timm.create_model("l2vit_micro", attn={"lga": "focused_linear"}, attn_kwargs={"lwa": {"window_size": 2}},
                          device="meta")
    lwa, lga = m.stages[0][0].attn, m.stages[0][1].attn
    assert (type(lwa).name, lwa.window_size, type(lga).name) == ("window", 2, "focused_linear")
    m = timm.create_model("l2vit_micro", attn="softmax", device="meta")
    assert {type(b.attn).name for s in m.stages for b in s} == {"softmax"}
    with pytest.raises(UserError, match=r"attn= takes a mechanism name or 4 names"):
        timm.create_model("flatten_swin_micro", attn=("window",) * 3)
    with pytest.raises(UserError, match="block kinds"):
        timm.create_model("l2vit_micro", attn={"lgb": "softmax"})


@pytest.mark.parametrize("name,old,new", [
    ("flatten_pvt_micro", dict(stage_attn=("softmax",) * 4), dict(attn=("softmax",) * 4)),
    ("flatten_pvt_v2_micro", dict(stage_attn=("softmax",) * 4), dict(attn="softmax")),
    ("flatten_swin_micro", dict(stage_attn=("window",) * 4), dict(attn="window")),
    ("flatten_cswin_micro", dict(stage_attn=("cswin",) * 4), dict(attn="cswin")),
    ("vil_ls_micro", dict(stage_attn=("full",) * 4), dict(attn="full")),
    ("l2vit_micro", dict(lwa_attn="softmax", lga_attn="linear_relu"),
     dict(attn={"lwa": "softmax", "lga": "linear_relu"})),
])
def test_old_keywords_warn_and_build_the_same_model(name, old, new):
    torch.manual_seed(0)
    with pytest.warns(DeprecationWarning, match="deprecated; pass attn=") as record:
        a = timm.create_model(name, **old)
    assert record[0].filename == __file__  # the warning points at the caller, where Python's filters show it
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        b = timm.create_model(name, **new)
    assert a.attn_names == b.attn_names
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    with pytest.raises(UserError, match="not both") as info:
        timm.create_model(name, **old, **new)
    assert "\n" not in str(info.value)


def test_l2vit_lga_ablation_options_need_a_mechanism_that_takes_them():
    with pytest.raises(UserError, match="the LGA blocks' 'softmax' does not take"):
        timm.create_model("l2vit_micro", attn={"lga": "softmax"}, learnable_scale=False)
    m = timm.create_model("l2vit_micro", learnable_scale=False, clamp_min=50.0)
    attn = m.stages[0][1].attn
    assert attn.clamp_min == 50.0 and attn.temperature is None


def test_l2vit_lwa_is_the_window_form():
    """The LWA blocks reach WindowAttention's 'lwa' form through its adapter: no RPB, no shift, zero padding."""
    attn = timm.create_model("l2vit_micro").stages[0][0].attn
    assert (attn.pad_mode, attn.shift_size, attn.relative_position_bias_table) == ("zero", 0, None)
    assert attn.window_size == 4
