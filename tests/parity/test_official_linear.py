"""Parity of `enhanced_linear`, `focused_linear` and the LCM with the official modules (loaded by file path).

Needs SUBQUAD_OFFICIAL_ROOT with `L2ViT/` and `FLatten-Transformer/` checkouts. The official files import einops
(only used by code we do not call) and register timm models; both are neutralised while loading.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import types
from unittest import mock

import pytest
import torch

from subquad.attention.enhanced_linear import EnhancedLinearAttention, LocalConcentrationModule
from subquad.attention.focused_linear import FocusedLinearAttention, FocusedLinearCore, remap_q_kv
from tests._tol import assert_close

pytestmark = pytest.mark.parity


@contextlib.contextmanager
def _quiet_imports():
    fake = {}
    # Another test module may already have put a stub in sys.modules (find_spec then raises on its missing __spec__).
    if "einops" not in sys.modules and importlib.util.find_spec("einops") is None:
        layers = types.ModuleType("einops.layers")
        torch_layers = types.ModuleType("einops.layers.torch")
        torch_layers.Rearrange = None
        fake = {"einops": types.SimpleNamespace(rearrange=None), "einops.layers": layers,
                "einops.layers.torch": torch_layers}
    import timm.models

    added = [k for k in fake if k not in sys.modules]
    sys.modules.update({k: fake[k] for k in added})
    try:
        with mock.patch.object(timm.models, "register_model", lambda f: f), mock.patch("builtins.print"), \
                mock.patch("warnings.warn"):
            import timm.models.registry as reg

            with mock.patch.object(reg, "register_model", lambda f: f):
                yield
    finally:
        for k in added:
            sys.modules.pop(k, None)


def _load(root: str, rel: str):
    path = os.path.join(root, rel)
    if not os.path.exists(path):
        pytest.skip(f"{path} not found")
    name = "_official_" + rel.replace("/", "_").replace(".", "_")
    with _quiet_imports():
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
        except ImportError as e:
            pytest.skip(f"official module {rel} needs a missing package: {e}")
    return mod


def _randomise(m):
    with torch.no_grad():
        m.scale.normal_(0, 1)
        m.positional_encoding.normal_(0, 0.5)


def test_enhanced_linear_and_lcm(official_root):
    off = _load(official_root, "L2ViT/classification/models/l2vit.py")
    o = off.LinearAttention(96, 3, qkv_bias=True)
    with torch.no_grad():
        o.temperature.uniform_(0.1, 1.0)
    ours = EnhancedLinearAttention(96, 3)
    ours.load_state_dict(o.state_dict(), strict=True)
    for scale in (0.5, 8.0):  # clamped and free regimes
        x = torch.randn(2, 13 * 11, 96) * scale
        assert_close(ours(x, (13, 11)), o(x), torch.float32, "enhanced_linear vs official")
    lo = off.LCM(96).eval()
    lcm = LocalConcentrationModule(96).eval()
    lcm.load_state_dict(lo.state_dict(), strict=True)
    x = torch.randn(2, 7 * 9, 96)
    assert_close(lcm(x, (7, 9)), lo(x, (7, 9)), torch.float32, "LCM vs official")


def test_focused_swin_style(official_root):
    off = _load(official_root, "FLatten-Transformer/models/flatten_swin.py")
    o = off.FocusedLinearAttention(96, (14, 14), 3)
    _randomise(o)
    ours = FocusedLinearAttention(96, 3, input_size=(14, 14))
    ours.load_state_dict(o.state_dict(), strict=True)
    x = torch.randn(2, 196, 96)
    assert_close(ours(x, (14, 14)), o(x), torch.float32, "focused (swin) vs official")


@pytest.mark.parametrize("sr_ratio", [1, 2])
def test_focused_pvt_v2_style(official_root, sr_ratio):
    off = _load(official_root, "FLatten-Transformer/models/flatten_pvt_v2.py")
    o = off.FocusedLinearAttention(64, 14 * 14, 2, qkv_bias=True, sr_ratio=sr_ratio).eval()
    _randomise(o)
    ours = FocusedLinearAttention(64, 2, input_size=(14, 14), sr_ratio=sr_ratio, sr_mode="flat1d",
                                  dwc_init="pvt_v2").eval()
    ours.load_state_dict(remap_q_kv(o.state_dict()), strict=True)  # official q + kv -> our fused qkv
    x = torch.randn(2, 196, 64)
    assert_close(ours(x, (14, 14)), o(x, 14, 14), torch.float32, "focused (pvt_v2) vs official")


def test_focused_cswin_style(official_root):
    off = _load(official_root, "FLatten-Transformer/models/flatten_cswin.py")
    o = off.FocusedLinearAttention(64, 14, -1, split_size=14, num_heads=2).eval()
    _randomise(o)
    ours = FocusedLinearCore(64, 2, input_size=(14, 14), lepe=True)
    ours.load_state_dict(o.state_dict(), strict=True)
    q, k, v = torch.randn(3, 2, 196, 64)
    assert_close(ours.forward_qkv(q, k, v, (14, 14)), o(torch.stack([q, k, v])), torch.float32,
                 "focused (cswin) vs official")
