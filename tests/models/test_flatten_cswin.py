"""FLatten-CSwin: official key layout (fixture), strict loading, stage configuration, any resolution, parity."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import torch

import subquad
from subquad.attention.cswin import LePEAttention
from subquad.attention.focused_linear import FocusedLinearCore
from subquad.models._builder import load_into
from subquad.models.flatten_cswin import remap_official
from tests._official import load_flatten
from tests.models.test_flatten_swin import fixture

FIXTURE = Path(__file__).resolve().parents[1] / "_fixtures" / "flatten_cswin_keys.json"


@pytest.mark.parametrize("name", list(fixture(FIXTURE)))
def test_official_layout_loads_strictly(name):
    """Every official key and shape (fixture) loads with strict=True after remap_official (meta tensors)."""
    keys = fixture(FIXTURE)[name]
    m = subquad.create_model(name, device="meta")
    load_into(m, remap_official({"state_dict": {k: torch.empty(s, device="meta") for k, s in keys.items()}}, m))
    assert {k: list(v.shape) for k, v in m.state_dict().items()} == keys


def test_checkpoint_file_roundtrip(tmp_path):
    src = subquad.create_model("flatten_cswin_micro")
    sd = {k: torch.randn_like(v) for k, v in src.state_dict().items()}
    path = tmp_path / "official.pth"
    torch.save({"model_ema": sd, "epoch": 299}, path)
    m = subquad.create_model("flatten_cswin_micro", checkpoint_path=str(path))
    for k, v in m.state_dict().items():
        assert torch.equal(v, sd[k]), k


def test_stage_configuration():
    m = subquad.create_model("flatten_cswin_tiny", device="meta")
    a = m.stage1[0].attns
    assert len(a) == 1 and isinstance(a[0], FocusedLinearCore) and not hasattr(a[0], "qkv")
    assert a[0].get_v is not None and a[0].pe_hw == (56, 56) and m.stage2[3].attns[0].pe_hw == (28, 28)
    s3, s4 = m.stage3[0].attns, m.stage4[0].attns
    assert [(b.idx, b.dim, b.num_heads, b.split_size) for b in s3] == [(0, 128, 4, 7), (1, 128, 4, 7)]
    assert len(s4) == 1 and isinstance(s4[0], LePEAttention) and s4[0].idx == -1 and s4[0].dim == 512
    b384 = subquad.create_model("flatten_cswin_base_384", device="meta")
    assert b384.stage1[0].attns[0].pe_hw == (96, 96) and b384.stage3[0].attns[0].split_size == 12
    assert m.no_weight_decay() == set()


def test_full_size_any_resolution_on_meta():
    m = subquad.create_model("flatten_cswin_tiny", device="meta").eval()
    for size in [(256, 320), (320, 192), (1024, 1024)]:
        feats = m.forward_intermediates(torch.empty(1, 3, *size, device="meta"), intermediates_only=True)
        h, w = (size[0] - 3) // 4 + 1, (size[1] - 3) // 4 + 1
        want = []
        for i in range(4):
            want.append((64 * 2 ** i, h, w))
            h, w = -(-h // 2), -(-w // 2)
        assert [tuple(f.shape[1:]) for f in feats] == want


def test_micro_odd_size_and_init():
    m = subquad.create_model("flatten_cswin_micro", num_classes=3).eval()
    with torch.no_grad():
        out = m(torch.randn(1, 3, 72, 100))
    assert out.shape == (1, 3) and torch.isfinite(out).all()
    a = m.stage1[0].attns[0]
    assert not a.scale.any() and not a.positional_encoding.any()
    assert torch.equal(m.norm.weight, torch.ones_like(m.norm.weight)) and not m.head.bias.any()


def test_cswin_baseline_and_bad_inputs():
    m = subquad.create_model("flatten_cswin_micro", attn="cswin").eval()
    assert all(isinstance(b, LePEAttention) for b in m.stage1[0].attns)
    with torch.no_grad():
        assert torch.isfinite(m(torch.randn(1, 3, 64, 48))).all()
    with pytest.raises(ValueError, match="host_qkv"):
        subquad.create_model("flatten_cswin_micro", attn="window")
    with pytest.raises(ValueError, match="unknown attention 'LLSS'"):
        subquad.create_model("flatten_cswin_micro", attn="LLSS")
    with pytest.raises(ValueError, match="smaller than the model's total stride"):
        subquad.create_model("flatten_cswin_micro")(torch.randn(1, 3, 64, 20))


def test_resized_load_equals_runtime_resize():
    """PE loaded into a model built at 80 (resized by remap_official) gives the source model's logits at 80."""
    src = subquad.create_model("flatten_cswin_micro", num_classes=5).eval()
    with torch.no_grad():
        for n, p in src.named_parameters():
            if n.endswith(("positional_encoding", "scale")):
                p.normal_(0, 0.3)
    dst = subquad.create_model("flatten_cswin_micro", num_classes=5, img_size=80).eval()
    dst.load_state_dict(remap_official({"model": src.state_dict()}, dst), strict=True)
    x = torch.randn(1, 3, 80, 80)
    with torch.no_grad():
        torch.testing.assert_close(dst(x), src(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parity
def test_logits_match_official(official_root):
    """A small official CSWinTransformer at 224 (LLSS: global focused stages 1-2, two-branch stage 3, global 4)."""
    mod = load_flatten(official_root, "flatten_cswin")
    kw = dict(embed_dim=16, depth=[1, 1, 2, 1], num_heads=[2, 2, 4, 4], split_size=[1, 2, 7, 7])
    with contextlib.redirect_stdout(io.StringIO()):
        off = mod.CSWinTransformer(img_size=224, patch_size=4, la_split_size="56-28-14-7", attn_type="LLSS",
                                   num_classes=10, **kw)
    with torch.no_grad():
        for n, p in off.named_parameters():
            if n.endswith(("scale", "positional_encoding")):
                p.normal_(0, 0.2)
    ours = subquad.create_model("flatten_cswin_micro", img_size=224, embed_dim=16, depths=(1, 1, 2, 1),
                                num_heads=(2, 2, 4, 4), split_size=(1, 2, 7, 7), mlp_ratio=4.0, num_classes=10)
    ours.load_state_dict(remap_official({"model": off.state_dict()}, ours), strict=True)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        want = off.eval()(x)
        got = ours.eval()(x)
    from tests._tol import assert_close

    assert_close(got, want.double(), torch.float32)
