"""Every hierarchical family builds each detector and segmenter kind, trains a step and evaluates at a non-square
size; the backbone contract's refusals are one-line UserErrors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from subquad.dense import DETECTOR_KINDS, SEGMENTER_KINDS, build_detector, build_segmenter
from subquad.dense.backbone import FeatureBackbone
from subquad.dense.segment import segmentation_loss
from subquad.errors import UserError


def _hierarchical_micro_models() -> list[str]:
    """From the registry: every image micro model whose feature levels have strictly increasing strides (the
    backbones dense heads take; the isotropic ViT hosts and the video models are left out)."""
    import subquad

    out = []
    for name in subquad.list_models("*_micro*"):
        m = subquad.create_model(name, device="meta")
        red = [f["reduction"] for f in m.feature_info]
        if m.input_ndim == 4 and all(b > a for a, b in zip(red, red[1:])):
            out.append(name)
    return out


FAMILIES = _hierarchical_micro_models()
# Non-square, and not a multiple of 32 (the padding path is exercised).
H, W = 72, 104
TINY = dict(fpn_channels=16, representation_size=32, mask_head_channels=16, rpn_batch_size_per_image=16,
            box_batch_size_per_image=16, rpn_proposals=32, detections_per_img=10)


def _targets(with_masks: bool) -> list[dict[str, torch.Tensor]]:
    boxes = [torch.tensor([[10.0, 8.0, 40.0, 36.0], [50.0, 30.0, 90.0, 66.0]]),
             torch.tensor([[20.0, 20.0, 60.0, 50.0]])]
    out = []
    for b, lab in zip(boxes, ([1, 2], [3])):
        t = {"boxes": b, "labels": torch.tensor(lab)}
        if with_masks:
            m = torch.zeros(len(b), H, W, dtype=torch.uint8)
            for k, (x0, y0, x1, y1) in enumerate(b.int().tolist()):
                m[k, y0:y1, x0:x1] = 1
            t["masks"] = m
        out.append(t)
    return out


def _step(model: nn.Module, loss: torch.Tensor) -> None:
    assert torch.isfinite(loss), loss
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    opt.zero_grad()
    loss.backward()
    body = [p for p in model.modules() if isinstance(p, FeatureBackbone)][0]
    grads = [p.grad for p in body.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads), "no gradient reached the backbone"
    opt.step()


def _detector(kind: str, family: str, images: list[torch.Tensor]) -> None:
    model = build_detector(kind, family, 3, min_size=H, max_size=W, **TINY)
    model.train()
    losses = model(images, _targets(kind == "maskrcnn"))
    expected = {"loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg"} if kind != "retinanet" \
        else {"classification", "bbox_regression"}
    if kind == "maskrcnn":
        expected.add("loss_mask")
    assert set(losses) == expected
    _step(model, sum(losses.values()))
    model.eval()
    with torch.no_grad():
        outs = model(images)
    for o, im in zip(outs, images):
        assert o["boxes"].shape[1] == 4 and len(o["boxes"]) == len(o["scores"]) == len(o["labels"])
        if len(o["labels"]):
            assert int(o["labels"].min()) >= 1 and int(o["labels"].max()) <= 3
        if kind == "maskrcnn":
            assert o["masks"].shape[1:] == (1, *im.shape[-2:])


def _segmenter(kind: str, family: str) -> None:
    model = build_segmenter(kind, family, 5, channels=16, fpn_channels=16)
    x = torch.randn(2, 3, H, W)
    y = torch.randint(0, 5, (2, H, W))
    y[:, :4] = 255
    model.train()
    out = model(x)
    assert out["out"].shape == (2, 5, H, W)
    assert ("aux" in out) == (kind == "upernet")
    _step(model, segmentation_loss(out, y))
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, H + 8, W - 8))
    assert set(out) == {"out"} and out["out"].shape == (1, 5, H + 8, W - 8)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_all_kinds(family):
    images = [torch.rand(3, H, W), torch.rand(3, H, W)]
    for kind in DETECTOR_KINDS:
        _detector(kind, family, images)
    for kind in SEGMENTER_KINDS:
        _segmenter(kind, family)


def test_features_are_padded_to_the_stride():
    fb = FeatureBackbone("flatten_swin_micro")
    feats = fb(torch.randn(1, 3, 70, 99))
    assert fb.stride == 32
    for f, r in zip(feats.values(), fb.reductions):
        assert f.shape[-2:] == (96 // r, 128 // r)


def test_every_hierarchical_family_is_covered():
    assert {"l2vit_micro", "flatten_swin_micro", "flatten_pvt_micro", "flatten_pvt_v2_micro", "flatten_cswin_micro",
            "vil_ls_micro", "cvt_ls_micro", "lisanet_micro", "hylisanet_micro"} <= set(FAMILIES)
    assert "vit_attn_micro" not in FAMILIES and "hylisanet_micro_video" not in FAMILIES


def test_backbone_without_features_only():
    with pytest.raises(UserError, match="features_only"):
        FeatureBackbone(nn.Conv2d(3, 8, 3))
    with pytest.raises(UserError, match="hierarchical"):
        build_detector("fasterrcnn", "flatten_deit_micro", 3)
    with pytest.raises(UserError, match="unknown model"):
        build_segmenter("upernet", "no_such_backbone", 3)
    with pytest.raises(UserError, match="unknown detector kind 'cascade'"):
        build_detector("cascade", "l2vit_micro", 3)


def test_image_smaller_than_stride():
    seg = build_segmenter("semantic_fpn", "flatten_swin_micro", 3, channels=8, fpn_channels=8).eval()
    with pytest.raises(UserError, match=r"image size 20x64 is smaller than the total stride 32"):
        seg(torch.randn(1, 3, 20, 64))
    with pytest.raises(UserError, match="min_size 16 is smaller than the total stride 32"):
        build_detector("retinanet", "flatten_swin_micro", 3, min_size=16)
