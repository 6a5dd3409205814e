"""L2ViT Tab. 11 with its LCM: `l2vit_deit_tiny` with `lcm_kernel_size=k` puts the LCM branch after the
enhanced-linear blocks only (the paper's enhanced linear attention is linear attention followed by the LCM,
Sec. 3.2); the default model keeps its layout; the class token passes the LCM unchanged."""

from __future__ import annotations

import pytest
import torch

import subquad
from subquad.errors import UserError
from subquad.models.vit import VisionTransformerAttn

DEFAULT_PARAMS = 5_717_434  # the card's ref_params of l2vit_deit_tiny (no LCM)


def _lcm_params(C: int, k: int) -> int:
    return 2 * C + 2 * (C * k * k + C) + 2 * C  # norm3, conv1, conv2, bn (affine)


def test_default_has_no_lcm_and_unchanged_keys():
    m = subquad.create_model("l2vit_deit_tiny", device="meta")
    assert all(b.local_mp is None for b in m.blocks)
    assert not any(".norm3." in k or ".local_mp." in k for k in m.state_dict())
    assert sum(p.numel() for p in m.parameters()) == DEFAULT_PARAMS


@pytest.mark.parametrize("k", [7, 3])
def test_lcm_after_enhanced_linear_blocks_only(k):
    m = subquad.create_model("l2vit_deit_tiny", lcm_kernel_size=k, device="meta")
    assert [b.local_mp is not None for b in m.blocks] == [n == "enhanced_linear" for n in m.attn_names]
    assert sum(b.local_mp is not None for b in m.blocks) == 6
    assert all(b.local_mp.conv1.kernel_size == (k, k) for b in m.blocks if b.local_mp is not None)
    assert sum(p.numel() for p in m.parameters()) == DEFAULT_PARAMS + 6 * _lcm_params(192, k)


def test_tab11_params_and_gmacs():
    """Tab. 11 gives 5.7 M / 1.3 G. Only a 3 x 3 LCM keeps the count at 5.7 M after rounding (5.745 M); the 7 x 7
    LCM of L2ViT-T gives 5.837 M (5.8 M). The LCM adds two depthwise k x k convs on the 14 x 14 grid per
    enhanced-linear block. The paper's 1.3 G is DeiT-T's own value (Tab. 11 lists both at 1.3 G although six
    softmax blocks become linear); our count is 1.20 G: the six linear blocks save 2 N^2 C - 4 N d C MACs each."""
    r0 = subquad.count_macs("l2vit_deit_tiny")
    r3 = subquad.count_macs("l2vit_deit_tiny", lcm_kernel_size=3)
    r7 = subquad.count_macs("l2vit_deit_tiny", lcm_kernel_size=7)
    assert round(r3["params"] / 1e6, 1) == 5.7 and round(r7["params"] / 1e6, 1) == 5.8
    for r, k in ((r3, 3), (r7, 7)):
        assert round((r["gmacs"] - r0["gmacs"]) * 1e9) == 6 * 2 * 196 * 192 * k * k
    assert round(r3["gmacs"], 2) == 1.20


def _micro(**kw):
    kw.setdefault("lcm_kernel_size", 3)
    kw.setdefault("lcm_after", "enhanced_linear")
    return VisionTransformerAttn(img_size=(28, 36), patch_size=4, num_classes=3, embed_dim=32, depth=2, num_heads=2,
                                 mlp_ratio=2.0, attn=("enhanced_linear", "softmax"), **kw)


def test_class_token_passes_the_lcm_unchanged():
    torch.manual_seed(0)
    blk = _micro().blocks[0].double().eval()
    hw = (7, 9)
    x = torch.randn(2, 1 + 63, 32, dtype=torch.float64)
    y = blk._lcm(x, hw)
    assert (y[:, 0] == 0).all()
    torch.testing.assert_close(y[:, 1:], blk.local_mp(blk.norm3(x[:, 1:]), hw), rtol=0, atol=0)
    x2 = x.clone()
    x2[:, 0] += 1.0
    torch.testing.assert_close(blk._lcm(x2, hw), y, rtol=0, atol=0)


def test_micro_forward_backward_with_lcm_and_class_token():
    torch.manual_seed(0)
    m = _micro()
    out = m(torch.randn(2, 3, 28, 36))
    assert out.shape == (2, 3) and torch.isfinite(out).all()
    out.logsumexp(-1).sum().backward()
    lcm = m.blocks[0].local_mp  # reaches the class token (read by the head) through block 1's softmax attention
    assert m.blocks[1].local_mp is None
    for name, p in lcm.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_bad_lcm_options_refused():
    with pytest.raises(UserError, match="lcm_after='focused_linear'"):
        _micro(lcm_after="focused_linear")
    with pytest.raises(UserError, match="lcm_kernel_size must be an odd int"):
        _micro(lcm_kernel_size=4)
