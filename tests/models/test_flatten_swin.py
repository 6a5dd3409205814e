"""FLatten-Swin: official key layout (fixture), strict loading, stage configuration, any resolution, parity."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

import subquad
from subquad.attention.focused_linear import FocusedLinearAttention
from subquad.attention.window import WindowAttention
from subquad.models._builder import load_into
from subquad.models.flatten_swin import remap_official
from tests._official import load_flatten

FIXTURE = Path(__file__).resolve().parents[1] / "_fixtures" / "flatten_swin_keys.json"
DROPPED = (".relative_position_index", ".attn_mask")


def fixture(path: Path = FIXTURE) -> dict[str, dict[str, list[int]]]:
    return json.loads(path.read_text())["models"]


@pytest.mark.parametrize("name", list(fixture()))
def test_official_layout_loads_strictly(name):
    """Every official key and shape (fixture) loads with strict=True after remap_official (meta tensors)."""
    keys = fixture()[name]
    sd = {k: torch.empty(shape, device="meta") for k, shape in keys.items()}
    m = subquad.create_model(name, device="meta")
    out = remap_official({"model": sd}, m)
    assert set(keys) - set(out) == {k for k in keys if k.endswith(DROPPED)}
    load_into(m, out, strict=True)
    assert {k: list(v.shape) for k, v in m.state_dict().items()} == \
        {k: v for k, v in keys.items() if not k.endswith(DROPPED)}


def test_checkpoint_file_roundtrip(tmp_path):
    """An official-style .pth (wrapped, with recomputed buffers) loads through create_model(checkpoint_path=...)."""
    src = subquad.create_model("flatten_swin_micro")
    sd = {k: torch.randn_like(v) if v.is_floating_point() else v for k, v in src.state_dict().items()}
    sd["layers.2.blocks.1.attn_mask"] = torch.zeros(4, 9, 9)
    sd["layers.2.blocks.1.attn.relative_position_index"] = torch.zeros(9, 9, dtype=torch.int64)
    path = tmp_path / "official.pth"
    torch.save({"model": sd, "epoch": 299}, path)
    m = subquad.create_model("flatten_swin_micro", checkpoint_path=str(path))
    for k, v in m.state_dict().items():
        assert torch.equal(v, sd[k]), k
    with pytest.raises(ValueError, match="does not fit model 'flatten_swin_micro'"):
        subquad.create_model("flatten_swin_micro", embed_dim=48, checkpoint_path=str(path))


def test_stage_configuration_at_224_and_384():
    m = subquad.create_model("flatten_swin_tiny", device="meta")
    l0, l1 = m.layers[0].blocks[1].attn, m.layers[1].blocks[0].attn
    assert isinstance(l0, FocusedLinearAttention) and l0.pe_hw == (56, 56) and l1.pe_hw == (28, 28)
    s = [(b.attn.window_size, b.attn.shift_size) for b in m.layers[2].blocks] + \
        [(b.attn.window_size, b.attn.shift_size) for b in m.layers[3].blocks]
    assert s == [(7, 0), (7, 3)] * 3 + [(7, 0), (7, 0)]
    assert all(isinstance(b.attn, WindowAttention) for b in m.layers[3].blocks)
    b384 = subquad.create_model("flatten_swin_base_384", device="meta")
    assert b384.layers[0].blocks[0].attn.pe_hw == (96, 96)
    assert [(b.attn.window_size, b.attn.shift_size) for b in b384.layers[2].blocks[:2]] == [(12, 0), (12, 6)]
    assert b384.layers[3].blocks[1].attn.shift_size == 0
    assert m.no_weight_decay() == {n for n, _ in m.named_parameters() if n.endswith("relative_position_bias_table")}


def test_swin_baseline_is_one_keyword_away():
    """attn='window' is Swin-T: the parameter count of timm's swin_tiny_patch4_window7_224."""
    import timm

    ours = subquad.create_model("flatten_swin_tiny", attn="window", device="meta")
    theirs = timm.create_model("swin_tiny_patch4_window7_224", device="meta")
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())


def test_full_size_any_resolution_on_meta():
    m = subquad.create_model("flatten_swin_tiny", device="meta").eval()
    for size in [(256, 320), (320, 192), (1024, 1024)]:
        feats = m.forward_intermediates(torch.empty(1, 3, *size, device="meta"), intermediates_only=True)
        want = [(96 * 2 ** i, -(-size[0] // (4 * 2 ** i)), -(-size[1] // (4 * 2 ** i))) for i in range(4)]
        assert [tuple(f.shape[1:]) for f in feats] == want


@pytest.mark.parametrize("size", [(80, 112), (72, 40)])
def test_micro_odd_sizes_and_pyramid(size):
    m = subquad.create_model("flatten_swin_micro", num_classes=3).eval()
    with torch.no_grad():
        out, feats = m.forward_intermediates(torch.randn(1, 3, *size))
        logits = m(torch.randn(1, 3, *size))
    assert logits.shape == (1, 3) and torch.isfinite(logits).all()
    assert [f.shape[-2:] for f in feats] == [(-(-size[0] // s), -(-size[1] // s)) for s in (4, 8, 16, 32)]
    assert [f["reduction"] for f in m.feature_info] == [4, 8, 16, 32]


def test_la_window_ablation_runs_and_sizes_pe():
    m = subquad.create_model("flatten_swin_micro", la_window=4).eval()
    a0, a1 = m.layers[0].blocks[0], m.layers[1].blocks[0]
    assert a0.la_window == 4 and a0.attn.pe_hw == (4, 4) and a1.attn.pe_hw == (4, 4)
    with torch.no_grad():
        assert torch.isfinite(m(torch.randn(1, 3, 72, 40))).all()
    # A window covering the whole grid is the global block.
    g = subquad.create_model("flatten_swin_micro", la_window=16).eval()
    blk = g.layers[0].blocks[0]
    assert blk.la_window == 16 and blk.la_shift == 0
    y = torch.randn(2, 256, 32)
    with torch.no_grad():
        torch.testing.assert_close(blk._windowed_linear(y, (16, 16)), blk.attn(y, (16, 16)))


def test_init_as_official():
    m = subquad.create_model("flatten_swin_micro")
    a = m.layers[0].blocks[0].attn
    assert not a.scale.any() and not a.positional_encoding.any()
    t = m.layers[2].blocks[0].attn.relative_position_bias_table
    assert 0.01 < t.std().item() < 0.03
    assert torch.equal(m.norm.weight, torch.ones_like(m.norm.weight)) and not m.head.bias.any()


def test_remap_drops_buffers_and_resizes_tables():
    src = subquad.create_model("flatten_swin_micro")
    sd = dict(src.state_dict())
    sd["layers.2.blocks.1.attn_mask"] = torch.zeros(4, 9, 9)
    sd["layers.2.blocks.1.attn.relative_position_index"] = torch.zeros(9, 9, dtype=torch.int64)
    dst = subquad.create_model("flatten_swin_micro", img_size=96, window_size=4)
    out = remap_official({"model_ema": sd}, dst)
    dst.load_state_dict(out, strict=True)
    assert out["layers.0.blocks.0.attn.positional_encoding"].shape == (1, 24 * 24, 32)
    assert out["layers.2.blocks.0.attn.relative_position_bias_table"].shape == (49, 4)


def test_bad_inputs():
    m = subquad.create_model("flatten_swin_micro")
    with pytest.raises(ValueError, match="smaller than the model's total stride"):
        m(torch.randn(1, 3, 16, 64))
    with pytest.raises(ValueError, match="channels"):
        m(torch.randn(1, 4, 64, 64))
    with pytest.raises(ValueError, match="unknown attention 'LLSS'"):
        subquad.create_model("flatten_swin_micro", attn="LLSS")
    with pytest.raises(ValueError, match="attn= takes a mechanism name or 4 names"):
        subquad.create_model("flatten_swin_micro", attn=["window", 3, "window", "window"])
    with pytest.raises(ValueError, match="unknown attention"):
        subquad.create_model("flatten_swin_micro", attn=("focused_linear", "focused_linear", "windw", "window"))


@pytest.mark.parity
def test_logits_match_official(official_root):
    """A small official FLattenSwinTransformer at 224 (LLSS, shifted stage-3 windows) vs ours, same weights."""
    off_mod = load_flatten(official_root, "flatten_swin")
    kw = dict(embed_dim=16, depths=[1, 1, 2, 1], num_heads=[1, 2, 2, 4])
    with contextlib.redirect_stdout(io.StringIO()):
        off = off_mod.FLattenSwinTransformer(img_size=224, window_size=56, attn_type="LLSS", num_classes=10, **kw)
    with torch.no_grad():
        for n, p in off.named_parameters():
            if n.endswith(("scale", "positional_encoding")):
                p.normal_(0, 0.2)
    ours = subquad.create_model("flatten_swin_micro", img_size=224, window_size=7, mlp_ratio=4.0, num_classes=10,
                                **{k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()})
    ours.load_state_dict(remap_official({"model": off.state_dict()}, ours), strict=True)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        want = off.eval()(x)
        got = ours.eval()(x)
    from tests._tol import assert_close

    assert_close(got, want.double(), torch.float32)
