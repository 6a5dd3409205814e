"""The backbone contract, registry-driven: timm's own model checks (its `tests/test_models.py`, mirrored here) and
construction on the meta device, for every model timm lists under subquad's family modules.

The tiny `*_micro` variants run every check for real in the default suite; the full sizes run under `slow`
(cheap ones, the meta-device build and the cfg checks, run for every name by default; the feature-map check for
the smaller sizes of each family). The upstream file itself
runs with `python -m tests.models.timm_suite PATH/TO/test_models.py` (README, development section).
"""

from __future__ import annotations

import math

import pytest
import timm
import torch
from timm.layers import get_channel_dim, get_spatial_dim
from timm.models import get_notrace_functions, get_notrace_modules

from subquad.models import CARDS, NON_STD
from subquad.models._builder import FAMILY_MODULES, REQUIRED_CFG_KEYS

NAMES = timm.list_models(module=sorted(FAMILY_MODULES))
MICRO = [n for n in NAMES if n.endswith("_micro")]
FULL = [n for n in NAMES if n not in MICRO]
STD = [n for n in NAMES if n not in NON_STD]


def _cfg(name):
    return timm.models.get_pretrained_cfg(name)


def _small(name) -> tuple[int, ...]:
    """timm's test size rule: the cfg size, or `min_input_size` when the cfg size exceeds the test target."""
    return tuple(_cfg(name).min_input_size)


def test_registry_and_cards_agree():
    """Every model timm lists under our modules has a card, and every card a model."""
    assert len(NAMES) >= 50 and MICRO
    assert set(NAMES) == set(CARDS)


@pytest.mark.parametrize("name", NAMES)
def test_cfg_complete(name):
    cfg = _cfg(name).to_dict(remove_null=False)
    missing = [k for k in REQUIRED_CFG_KEYS if cfg.get(k) is None and not (k == "pool_size" and name in NON_STD)]
    assert not missing, f"{name}: cfg lacks {missing}"
    # released weights have their official URL; the others say so in the cfg's first words
    assert cfg["url"] or cfg["notes"].startswith("no released weights"), name


def _pool_size_params():
    """Every standard model; the larger sizes of a family (base, medium, large, PVTv2 b2-b5: the code of its smaller
    sizes at more width and depth, 0.5-2.5 s each on the meta device) under slow."""
    import re

    small = re.compile(r"_(micro|tiny|small|s|i|b0|b1)(_\d+)?(_video)?$")
    return [n if small.search(n) else pytest.param(n, marks=pytest.mark.slow) for n in STD]


@pytest.mark.parametrize("name", _pool_size_params())
def test_pool_size_is_the_feature_map(name):
    """forward_features at the cfg size is (B, H, W, C) / (B, C, H, W) with (H, W) == pool_size (meta device)."""
    m = timm.create_model(name, device="meta")
    x = torch.empty(1, *_cfg(name).input_size, device="meta")
    out = m.forward_features(x)
    spatial = get_spatial_dim(m.output_fmt)
    assert (out.shape[spatial[0]], out.shape[spatial[1]]) == tuple(_cfg(name).pool_size)
    assert out.shape[get_channel_dim(m.output_fmt)] == m.num_features


def _meta_build_and_init(name, size):
    with torch.device("meta"):
        m = timm.create_model(name)
    assert all(p.is_meta for p in m.parameters())
    m.to_empty(device="cpu")
    m.init_weights()
    m.eval()
    with torch.no_grad():
        out = m(torch.randn(1, 3, size, size))
    assert torch.isfinite(out).all(), name


@pytest.mark.parametrize("name", MICRO)
def test_meta_device_build_then_init(name):
    """`with torch.device('meta')` builds the model; `to_empty` + `init_weights()` gives finite outputs."""
    _meta_build_and_init(name, _small(name)[-1] * 2)


@pytest.mark.slow
@pytest.mark.parametrize("name", FULL)
def test_meta_device_build_then_init_full(name):
    _meta_build_and_init(name, _small(name)[-1] * 2)


def _contract(name, size):
    """timm's test_model_forward / backward / default_cfgs / forward_intermediates checks, on one model."""
    m = timm.create_model(name).eval()
    x = torch.randn(1, *size)
    out = m(x)
    assert out.shape == (1, m.num_classes) and torch.isfinite(out).all()
    m.set_grad_checkpointing()
    torch.testing.assert_close(m(x), out, rtol=1e-4, atol=1e-5)
    m.set_grad_checkpointing(False)

    feats = m.forward_features(x)
    pre = m.forward_head(feats, pre_logits=True)
    assert pre.shape == (1, m.head_hidden_size)
    final, inter = m.forward_intermediates(x)
    torch.testing.assert_close(final, feats)
    assert len(inter) == len(m.feature_info) >= 3
    for info, t in zip(m.feature_info, inter):
        assert t.shape[1] == info["num_chs"] and t.shape[-1] <= math.ceil(size[-1] / info["reduction"]) + 1
    m.reset_classifier(0)
    assert m.num_classes == 0 and m(x).shape == pre.shape
    if name not in NON_STD:
        m.reset_classifier(0, "")
        assert m(x).shape == feats.shape
        unpooled = timm.create_model(name, num_classes=0, global_pool="").eval()
        assert unpooled(x).shape == feats.shape
    sd = m.state_dict()
    assert _cfg(name).first_conv + ".weight" in sd

    m = timm.create_model(name, num_classes=42).train()
    m(torch.randn(2, *size)).mean().backward()
    assert [n for n, p in m.named_parameters() if p.grad is None] == []


@pytest.mark.parametrize("name", MICRO)
def test_timm_contract(name):
    _contract(name, _small(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", FULL)
def test_timm_contract_full(name):
    _contract(name, _small(name))


@pytest.mark.parametrize("name", MICRO)
def test_prune_contract(name):
    """timm's test_prune_intermediate_layers_contract: a model pruned at level i gives level i's tap, its features
    (without the final norm) end at that tap in their own format, and every kept parameter trains. ViL-LS once
    failed it: a pruned model kept the last stage's prefix-token count and output format."""
    import copy

    size = _small(name)
    model = timm.create_model(name).eval()
    x = torch.randn(2, *size)
    last = len(model.feature_info) - 1
    with torch.no_grad():
        expected = model(x)
        taps = model.forward_intermediates(x, intermediates_only=True)
        keep = copy.deepcopy(model)
        keep.prune_intermediate_layers([last], prune_head=False)
        torch.testing.assert_close(keep(x), expected)
    for i in range(last + 1):
        pruned = copy.deepcopy(model)
        take = pruned.prune_intermediate_layers([i], prune_norm=True)
        with torch.no_grad():
            torch.testing.assert_close(pruned.forward_intermediates(x, indices=take, intermediates_only=True)[0],
                                       taps[i])
            feats = pruned.forward_features(x)
        if i < last and feats.ndim == 4:
            torch.testing.assert_close(feats if feats.shape == taps[i].shape else feats.permute(0, 3, 1, 2), taps[i])
        pruned.train()
        sel = pruned.forward_intermediates(x, indices=take, intermediates_only=True)
        (sum(t.sum() for t in sel) + pruned.forward_features(x).sum()).backward()
        assert [n for n, p in pruned.named_parameters() if p.grad is None] == [], (name, i)


def _fx(model, train: bool):
    from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

    kw = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions(),
              param_shapes_constant=True)
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=kw)
    return create_feature_extractor(model, train_return_nodes=[train_nodes[-1]], eval_return_nodes=[eval_nodes[-1]],
                                    tracer_kwargs=kw)


@pytest.mark.parametrize("name", MICRO)
def test_fx_trace_forward_and_backward(name):
    """timm's test_model_forward_fx / backward_fx: symbolic tracing (torchvision feature extraction with timm's leaf
    modules) gives the same output, and every parameter a gradient."""
    size = _small(name)
    m = timm.create_model(name).eval()
    x = torch.randn(1, *size)
    with torch.inference_mode():
        ref = m(x)
        got = next(iter(_fx(m, False)(x).values()))
    assert torch.equal(got, ref)
    m = timm.create_model(name, num_classes=42).train()
    n_params = sum(p.numel() for p in m.parameters())
    fx = _fx(m, True)
    next(iter(fx(torch.randn(2, *size)).values())).mean().backward()
    assert sum(p.grad.numel() for p in fx.parameters() if p.grad is not None) == n_params


@pytest.mark.parametrize("name", MICRO)
def test_features_only(name):
    m = timm.create_model(name, features_only=True).eval()
    size = _small(name)
    outs = m(torch.randn(1, *size))
    assert len(outs) == len(m.feature_info.channels()) >= 3
    for c, r, o in zip(m.feature_info.channels(), m.feature_info.reduction(), outs):
        assert o.shape[1] == c and o.shape[-1] <= math.ceil(size[-1] / r) + 1 and torch.isfinite(o).all()
