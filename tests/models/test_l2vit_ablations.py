"""L2ViT paper ablation switches (Tab. 6, 7, 10, 12): each off by default (the released models are unchanged), each
builds what the official code builds, runs forward/backward on the micro model, and matches the paper's params /
GMACs where the table gives them and our definition reproduces them."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

import subquad
from subquad.errors import UserError
from tests._tol import assert_close

_DN = dict(dims=(64, 128, 256, 512), depths=(4, 4, 18, 4), num_heads=(2, 4, 8, 16))  # Tab. 7 deep-narrow
# Tab. 6's last rows (the paper gives top-1 / AP only: 82.3 / 44.7 and 82.5 / 44.8).
# Enhanced Swin-T-V1, CPE instead of RPE
SWIN_V1 = dict(attn={"lga": "window"}, lga_window="shifted", lcm_kernel_size=0)
SWIN_V2 = dict(attn={"lga": "window"}, lga_window="lwa")  # Enhanced Swin-T-V2, window attention in LGA blocks, with LCM
TAB7 = {"4L": dict(conv_stem_type="4L"), "last_proj": dict(conv_stem_type="4L", last_proj=True),
        "overlapped": dict(conv_stem_type="4L", last_proj=True, overlapped=True)}


def _params(**kw) -> int:
    m = subquad.create_model("l2vit_tiny", device="meta", **kw)
    return sum(p.numel() for p in m.parameters())


def test_defaults_unchanged():
    """Default keys equal the official key fixture and the count equals the card's official count."""
    m = subquad.create_model("l2vit_tiny", device="meta")
    assert sum(p.numel() for p in m.parameters()) == 28_596_781
    official = json.loads((Path(__file__).parents[1] / "_fixtures" / "l2vit_keys.json").read_text())
    official = official["models"]["l2vit_tiny"]
    assert {k: list(v.shape) for k, v in m.state_dict().items()} == official
    assert m.last_proj is None and m.head.in_features == 768
    assert m.downsample_layers[1].proj.kernel_size == (2, 2)


def test_tab7_switches_build_the_official_modules():
    m = subquad.create_model("l2vit_tiny", conv_stem_type="4L", last_proj=True, overlapped=True, device="meta")
    stem = m.downsample_layers[0].proj.proj
    assert [type(x).__name__ for x in stem] == ["Conv2d", "BatchNorm2d", "ReLU"] * 3 + ["Conv2d"]
    assert stem[0].kernel_size == (7, 7) and stem[0].stride == (2, 2) and stem[0].bias is None
    assert stem[9].kernel_size == (2, 2) and stem[9].stride == (2, 2) and stem[9].bias is not None
    for i in (1, 2, 3):
        p = m.downsample_layers[i].proj
        assert (p.kernel_size, p.stride, p.padding) == ((3, 3), (2, 2), (1, 1))
    assert (m.last_proj.in_features, m.last_proj.out_features) == (768, 1280)
    assert m.head.in_features == 1280 and m.num_features == 768 and m.head_hidden_size == 1280
    base = set(subquad.create_model("l2vit_tiny", device="meta").state_dict())
    keys = set(m.state_dict())
    assert {"last_proj.weight", "last_proj.bias"} <= keys
    assert {k for k in keys - base if not k.startswith(("downsample_layers.0.", "last_proj."))} == set()


@pytest.mark.parametrize("kw", [dict(conv_stem_type="4L", last_proj=True, overlapped=True),
                                dict(conv_stem_type="patchify", lcm_kernel_size=0, learnable_scale=False),
                                dict(clamp_min=1.0, mlp_type="pvtv2", lcm_kernel_size=0),
                                dict(lcm_kernel_size=3), SWIN_V1, SWIN_V2])
def test_micro_forward_backward(kw):
    torch.manual_seed(0)
    m = subquad.create_model("l2vit_micro", num_classes=4, **kw)
    x = torch.randn(2, 3, 37, 29)  # odd, non-square: padding paths
    y = m(x)
    assert y.shape == (2, 4)
    y.logsumexp(-1).mean().backward()
    for n, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n
    m.reset_classifier(7)
    assert m.eval()(x).shape == (2, 7)
    assert m.forward_head(m.forward_features(x), pre_logits=True).shape[-1] == m.head_hidden_size


def test_last_proj_is_official_order():
    """norm -> Linear(C, 1280) -> ReLU per token -> mean -> head, written out."""
    m = subquad.create_model("l2vit_micro", num_classes=3, last_proj=True).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        f = m.forward_features(x)  # normed (B, H, W, C)
        expect = m.head(torch.relu(m.last_proj(f)).flatten(1, 2).mean(1))
        assert_close(m(x), expect, name="last_proj logits")


def test_lga_options_reach_the_attention():
    m = subquad.create_model("l2vit_micro", clamp_min=1.0, learnable_scale=False, lcm_kernel_size=0)
    lga = [b for s in m.stages for b in s if type(b).__name__ == "LGABlock"]
    assert all(b.attn.clamp_min == 1.0 and b.attn.temperature is None and b.local_mp is None for b in lga)
    keys = set(m.state_dict())
    assert not any(k.endswith(".temperature") or ".local_mp." in k or ".norm3." in k for k in keys)
    # s = 1 equals the learnable form with the temperature set to ones
    a = subquad.build_attention("enhanced_linear", 16, 2, learnable_scale=False).double()
    b = subquad.build_attention("enhanced_linear", 16, 2).double()
    b.load_state_dict(a.state_dict(), strict=False)
    with torch.no_grad():
        b.temperature.fill_(1.0)
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    assert_close(a(x), b(x), name="learnable_scale=False vs temperature = 1")
    assert_close(a(x), a.forward_ref(x), name="learnable_scale=False fast vs reference")


def test_bad_switch_values_refused():
    for kw, word in ((dict(conv_stem_type="3L"), "conv_stem_type"), (dict(mlp_type="moat"), "mlp_type"),
                     (dict(lcm_kernel_size=4), "lcm_kernel_size"), (dict(clamp_min=0.0), "clamp_min"),
                     (dict(attn={"lga": "softmax"}, clamp_min=1.0), "clamp_min"),
                     (dict(lga_window="lwa"), "lga_window"),
                     (dict(attn={"lga": "softmax"}, lga_window="shifted"), "lga_window"),
                     (dict(attn={"lga": "window"}, lga_window="swin"), "lga_window")):
        with pytest.raises(UserError, match=word):
            subquad.create_model("l2vit_micro", **kw)


def _blocks(m, name):
    return [b for s in m.stages for b in s if type(b).__name__ == name]


def test_tab6_enhanced_swin_rows():
    """Tab. 6 "Enhanced Swin-T-V1" (window attention everywhere, Swin's shift in alternate blocks, CPE instead of RPE)
    and "-V2" (L2ViT-T with window attention in place of the linear attention, LCM kept), on the L2ViT-T macro
    architecture: what each block gets, and that everything else is L2ViT-T's."""
    base = subquad.create_model("l2vit_tiny", device="meta")
    v1 = subquad.create_model("l2vit_tiny", device="meta", **SWIN_V1)
    v2 = subquad.create_model("l2vit_tiny", device="meta", **SWIN_V2)
    for m in (v1, v2):
        assert all((b.attn.window_size, b.attn.shift_size, b.attn.pad_mode) == (7, 0, "zero")
                   for b in _blocks(m, "LWABlock"))
        assert all(type(b.attn).__name__ == "WindowAttention" and b.attn.relative_position_bias_table is None
                   for b in _blocks(m, "LGABlock"))
    # V2: the LGA blocks are local blocks like the LWA blocks (window 7, no shift, zero padding), the LCM stays.
    assert all((b.attn.window_size, b.attn.shift_size, b.attn.pad_mode) == (7, 0, "zero") and b.local_mp is not None
               and b.local_mp.conv1.kernel_size == (7, 7) for b in _blocks(v2, "LGABlock"))
    # V1: Swin's shifted windows (shift 3) in every LGA position but stage 4, whose 7 x 7 map is one window (Swin's
    # rule); no LCM.
    v1_lga = [(i, b) for i, s in enumerate(v1.stages) for b in s if type(b).__name__ == "LGABlock"]
    assert [(b.attn.window_size, b.attn.shift_size) for _, b in v1_lga] == [(7, 3)] * 5 + [(7, 0)]
    assert all(b.local_mp is None and b.attn.pad_mode == "mask" for _, b in v1_lga)
    # Same macro architecture: V2's keys are L2ViT-T's without the 69 per-head temperatures (3 + 6 + 3 * 12 + 24),
    # V1's further without the LCM.
    keys = {k: v.shape for k, v in base.state_dict().items()}
    k2 = {k: v.shape for k, v in v2.state_dict().items()}
    assert k2 == {k: v for k, v in keys.items() if not k.endswith(".attn.temperature")}
    assert set(v1.state_dict()) == {k for k in k2 if ".local_mp." not in k and ".norm3." not in k}
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(v2) == n(base) - 69 == 28_596_712
    assert n(v1) == 28_367_080


def test_lga_window_default_unchanged():
    """Without `lga_window` a window mechanism in the LGA blocks keeps its own defaults (Swin W-MSA with RPB,
    window 7, clipped to the construction maps 16, 8, 4, 2 of the micro model), as before the option existed; the
    LCM stays in the block."""
    m = subquad.create_model("l2vit_micro", attn={"lga": "window"}, device="meta")
    lga = _blocks(m, "LGABlock")
    assert [(b.attn.window_size, b.attn.shift_size, b.attn.pad_mode) for b in lga] == [
        (7, 0, "mask"), (7, 0, "mask"), (4, 0, "mask"), (2, 0, "mask")]
    assert all(b.attn.relative_position_bias_table is not None and b.local_mp is not None for b in lga)


def test_tab6_tab12_params_match_the_paper():
    """Published params (M), rounded to 1 M: ours within half a unit (the card tolerance is 1 % of an exact
    count; the paper gives none). Rows our definition does not reproduce are listed in `test_paper_rows_we_miss`."""
    rows = {  # Tab. 6 / Tab. 12 row: (options, paper params M)
        "primitive (patchify, no scale, no LCM)": (dict(conv_stem_type="patchify", lcm_kernel_size=0,
                                                        learnable_scale=False), 28),
        "+ conv stem": (dict(lcm_kernel_size=0, learnable_scale=False), 28),
        "+ scale": (dict(lcm_kernel_size=0), 28),
        "+ LCM 7x7 (L2ViT-T)": (dict(), 29),
        "Tab. 12 PVTv2 MLP": (dict(lcm_kernel_size=0, mlp_type="pvtv2"), 29),
    }
    for name, (kw, paper) in rows.items():
        n = _params(**kw) / 1e6
        assert abs(n - paper) <= 0.5, f"{name}: {n:.2f}M vs paper {paper}M"


def test_tab7_steps_match_the_paper_deltas():
    """Tab. 7 is cumulative on a deep-narrow T; the steps' param deltas (+0, +1, +1 M) hold to within the rounding
    of two rounded endpoints (1 M)."""
    prev = _params(**_DN)
    for (step, kw), paper_delta in zip(TAB7.items(), (0, 1, 1)):
        n = _params(**_DN, **kw)
        assert abs((n - prev) / 1e6 - paper_delta) <= 1.0, f"{step}: +{(n - prev) / 1e6:.2f}M vs +{paper_delta}M"
        prev = n


@pytest.mark.slow
def test_tab6_tab7_gmacs():
    """GMACs at 224 (rounded to 0.1 G in the paper): within 0.05 G (+ 2 % card tolerance) for the rows we reproduce;
    the Tab. 7 steps' deltas (+0.2, +0.0, +0.1 G) within 0.1 G."""
    g = lambda **kw: subquad.count_macs("l2vit_tiny", 224, **kw)["gmacs"]  # noqa: E731
    for kw, paper in ((dict(conv_stem_type="patchify", lcm_kernel_size=0, learnable_scale=False), 4.5),
                      (dict(), 4.7), (dict(lcm_kernel_size=3), 4.6), (dict(lcm_kernel_size=0, mlp_type="pvtv2"), 4.7)):
        assert abs(g(**kw) - paper) <= 0.05 + 0.02 * paper, (kw, g(**kw), paper)
    prev = g(**_DN)
    for (step, kw), paper_delta in zip(TAB7.items(), (0.2, 0.0, 0.1)):
        cur = g(**_DN, **kw)
        assert abs(cur - prev - paper_delta) <= 0.1, (step, cur - prev, paper_delta)
        prev = cur


@pytest.mark.parity
@pytest.mark.parametrize("kw,off_kw", [
    (dict(conv_stem_type="4L", last_proj=True, overlapped=True),
     dict(conv_stem=True, conv_stem_type="4L", last_proj=True, overlapped=True)),
    (dict(conv_stem_type="patchify"), dict(conv_stem=False)),
])
def test_switches_match_official_model(official_root, kw, off_kw):
    """The official L2ViT class with the same switches (small dims, randomised BN statistics): identical keys,
    same logits at odd sizes."""
    from tests._official import load_l2vit

    off_mod = load_l2vit(official_root)
    with contextlib.redirect_stdout(io.StringIO()):
        off = off_mod.L2ViT(depths=[2, 2, 2, 2], dims=[32, 64, 96, 128], num_heads=[1, 2, 3, 4],
                            block_type="mix_local_enhanced_vit", num_classes=10, **off_kw).eval()
    with torch.no_grad():
        for n, b in off.named_buffers():
            if n.endswith("running_var"):
                b.uniform_(0.5, 2.0)
            elif n.endswith("running_mean"):
                b.normal_()
    ours = subquad.create_model("l2vit_tiny", dims=(32, 64, 96, 128), depths=(2, 2, 2, 2), num_heads=(1, 2, 3, 4),
                                num_classes=10, **kw).eval()
    ours.load_state_dict(off.state_dict(), strict=True)
    for hw in [(224, 224), (225, 300)]:
        x = torch.randn(2, 3, *hw)
        with torch.no_grad():
            ref, out = off(x), ours(x)
        rel = ((out - ref).norm() / ref.norm()).item()
        assert rel < 1e-5, f"{hw}: relative error {rel:.2e}"
