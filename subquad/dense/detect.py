"""Detectors on torchvision's detection models with any `features_only` backbone and torchvision's FPN.

`build_detector(kind, backbone, num_classes)` gives a torchvision `MaskRCNN`, `FasterRCNN` or `RetinaNet` whose
backbone is `FeatureBackbone` + `torchvision.ops.FeaturePyramidNetwork`:
- Mask/Faster R-CNN (He et al., Mask R-CNN, arXiv 1703.06870; FPN, Lin et al., arXiv 1612.03144 §4.1): FPN on every
  returned level plus a max-pooled extra level; anchors of side 8 x stride, aspect ratios 0.5/1/2; RoIAlign 7x7
  (boxes) and 14x14 (masks) over the non-pooled levels.
- RetinaNet (Lin et al., Focal Loss, arXiv 1708.02002 §4): FPN on the last three levels (C3-C5) plus P6/P7 computed
  from C5 (mmdetection's `add_extra_convs='on_input'`, used by the Swin/PVT/L2ViT RetinaNet configs); anchors of side
  4 x stride with scales 2^(0, 1/3, 2/3).

Labels follow torchvision: object classes are 1..num_classes and 0 is background, so the heads are built with
num_classes + 1 outputs. Images are resized inside the model (GeneralizedRCNNTransform): `min_size` may be a tuple,
from which training draws one short side per batch (the papers' multi-scale training); evaluation uses its last
value. The batch is padded to a multiple of the backbone's total stride.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn

from ..data.registry import IMAGENET_MEAN, IMAGENET_STD
from ..errors import UserError
from .backbone import FeatureBackbone

__all__ = ["DETECTOR_KINDS", "build_detector", "FPNBackbone"]

DETECTOR_KINDS = ("maskrcnn", "fasterrcnn", "retinanet")


class FPNBackbone(nn.Module):
    """`FeatureBackbone` followed by torchvision's FPN; `out_channels` is what torchvision's detectors read.

    Args:
        body: the feature backbone.
        levels: which of the body's levels feed the FPN (indices into its outputs).
        out_channels: FPN width (256 in the papers' configs).
        extra: 'pool' (LastLevelMaxPool, R-CNN) or 'p6p7' (LastLevelP6P7 from C5, RetinaNet).

    Shapes:
        x: (B, 3, H, W) -> OrderedDict of (B, out_channels, h_l, w_l), one per level plus the extra ones.
    """

    def __init__(self, body: FeatureBackbone, levels: Sequence[int], out_channels: int, extra: str) -> None:
        super().__init__()
        from torchvision.ops import FeaturePyramidNetwork
        from torchvision.ops.feature_pyramid_network import LastLevelMaxPool, LastLevelP6P7

        self.body = body
        self.levels = [int(i) for i in levels]
        in_chs = [body.channels[i] for i in self.levels]
        if extra == "pool":
            blocks: nn.Module = LastLevelMaxPool()
        else:
            blocks = LastLevelP6P7(in_chs[-1], out_channels)
        self.fpn = FeaturePyramidNetwork(in_chs, out_channels, extra_blocks=blocks)
        self.out_channels = out_channels
        self.strides = [body.reductions[i] for i in self.levels]
        self.strides += [self.strides[-1] * 2 ** (k + 1) for k in range(1 if extra == "pool" else 2)]

    def forward(self, x: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
        feats = self.body(x)
        keys = list(feats)
        picked = OrderedDict((str(j), feats[keys[i]]) for j, i in enumerate(self.levels))
        return self.fpn(picked)


def _levels(body: FeatureBackbone, kind: str) -> list[int]:
    n = len(body.channels)
    if kind == "retinanet":
        if n < 3:
            raise UserError(f"RetinaNet needs a backbone with at least 3 feature levels; {body.name!r} gives {n}")
        return list(range(n - 3, n))
    if n < 2:
        raise UserError(f"{kind} needs a backbone with at least 2 feature levels; {body.name!r} gives {n}")
    return list(range(n))


def build_detector(kind: str, backbone: str | nn.Module, num_classes: int, *, min_size: int | Sequence[int] = 800,
                   max_size: int = 1333, fpn_channels: int = 256, representation_size: int = 1024,
                   mask_head_channels: int = 256, out_indices: Sequence[int] | None = None,
                   drop_path_rate: float | None = None, pretrained_backbone: bool = False,
                   image_mean: Sequence[float] = IMAGENET_MEAN, image_std: Sequence[float] = IMAGENET_STD,
                   detections_per_img: int = 100, score_thresh: float | None = None,
                   rpn_batch_size_per_image: int = 256, box_batch_size_per_image: int = 512,
                   rpn_proposals: int | None = None, anchor_scale: float | None = None,
                   backbone_kwargs: dict | None = None) -> nn.Module:
    """A torchvision detector with a subquad backbone (through `features_only`) and torchvision's FPN.

    Args:
        kind: 'maskrcnn', 'fasterrcnn' or 'retinanet'.
        backbone: registered model name (any family with `features_only`) or a `features_only` module.
        num_classes: object classes, background excluded (COCO: 80); labels are 1..num_classes.
        min_size: short side(s) of the resized input; a tuple means multi-scale training (one drawn per batch).
        max_size: cap on the long side (1333 in the 1x recipe).
        fpn_channels: FPN width (256 in the papers).
        representation_size: width of the R-CNN box head's two FC layers (1024 in the papers).
        mask_head_channels: width of the four mask-head convolutions (256 in the papers).
        out_indices: backbone stages to use (default: all).
        drop_path_rate: backbone stochastic depth (the recipes: 0.2 for tiny models, as in Swin's 1x config).
        pretrained_backbone: load the backbone's pretrained weights through timm.
        image_mean, image_std: normalisation inside the model (inputs are 0-1 RGB tensors).
        detections_per_img: kept detections per image at inference.
        score_thresh: minimum score kept at inference (default: torchvision's, 0.05).
        rpn_batch_size_per_image, box_batch_size_per_image: anchors / proposals sampled per image for the losses.
        rpn_proposals: R-CNN proposals kept per image before and after NMS, in training and at inference (default:
            torchvision's 2000 in training, 1000 at inference).
        anchor_scale: anchor side in units of the level's stride (default 8 for R-CNN, 4 for RetinaNet, the papers'
            values; smaller for small images).
        backbone_kwargs: more options for timm.create_model.

    Returns:
        A torchvision detection model: `model(images)` at eval returns one dict (boxes (K, 4) xyxy in input
        pixels, labels (K,), scores (K,), masks (K, 1, H, W) for Mask R-CNN) per image; in training
        `model(images, targets)` returns a dict of losses.
    """
    if kind not in DETECTOR_KINDS:
        raise UserError(f"unknown detector kind {kind!r}; allowed: {', '.join(DETECTOR_KINDS)}")
    if num_classes < 1:
        raise UserError(f"num_classes must be >= 1, got {num_classes}")
    body = FeatureBackbone(backbone, out_indices, drop_path_rate, pretrained_backbone, **(backbone_kwargs or {}))
    sizes = tuple(int(s) for s in (min_size if isinstance(min_size, Sequence) else (min_size,)))
    if min(sizes) < body.stride:
        raise UserError(f"min_size {min(sizes)} is smaller than the total stride {body.stride} of backbone "
                        f"{body.name!r}")
    extra = "p6p7" if kind == "retinanet" else "pool"
    fpn = FPNBackbone(body, _levels(body, kind), fpn_channels, extra)
    common = dict(min_size=sizes, max_size=max_size, image_mean=list(image_mean), image_std=list(image_std),
                  size_divisible=max(32, body.stride), detections_per_img=detections_per_img)
    if kind == "retinanet":
        model = _retinanet(fpn, num_classes, common, anchor_scale, score_thresh)
    else:
        heads = dict(representation_size=representation_size, mask_head_channels=mask_head_channels,
                     rpn_batch_size_per_image=rpn_batch_size_per_image,
                     box_batch_size_per_image=box_batch_size_per_image)
        model = _rcnn(kind, fpn, num_classes, common, anchor_scale, score_thresh, rpn_proposals, **heads)
    model.kind = kind
    model.num_object_classes = num_classes
    return model


def _retinanet(fpn: FPNBackbone, num_classes: int, common: dict, anchor_scale: float | None,
               score_thresh: float | None) -> nn.Module:
    """torchvision's RetinaNet on `fpn`: three anchor sizes per level (octave scales 2^(k/3)), three ratios."""
    from torchvision.models.detection import RetinaNet
    from torchvision.models.detection.anchor_utils import AnchorGenerator

    a = 4.0 if anchor_scale is None else float(anchor_scale)
    anchor_sizes = tuple((int(a * s), int(a * s * 2 ** (1 / 3)), int(a * s * 2 ** (2 / 3))) for s in fpn.strides)
    anchors = AnchorGenerator(anchor_sizes, ((0.5, 1.0, 2.0),) * len(anchor_sizes))
    kw = dict(common, anchor_generator=anchors)
    if score_thresh is not None:
        kw["score_thresh"] = score_thresh
    return RetinaNet(fpn, num_classes + 1, **kw)


def _rcnn(kind: str, fpn: FPNBackbone, num_classes: int, common: dict, anchor_scale: float | None,
          score_thresh: float | None, rpn_proposals: int | None, *, representation_size: int,
          mask_head_channels: int, rpn_batch_size_per_image: int, box_batch_size_per_image: int) -> nn.Module:
    """torchvision's Faster or Mask R-CNN on `fpn` (heads built in the order that fixes their initialisation)."""
    from torchvision.models.detection import FasterRCNN, MaskRCNN
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
    from torchvision.ops import MultiScaleRoIAlign

    a = 8.0 if anchor_scale is None else float(anchor_scale)
    anchors = AnchorGenerator(tuple((int(a * s),) for s in fpn.strides), ((0.5, 1.0, 2.0),) * len(fpn.strides))
    names = [str(i) for i in range(len(fpn.levels))]
    box_pool = MultiScaleRoIAlign(names, output_size=7, sampling_ratio=2)
    box_head = TwoMLPHead(fpn.out_channels * 7 * 7, representation_size)
    kw = dict(common, rpn_anchor_generator=anchors, box_roi_pool=box_pool, box_head=box_head,
              box_predictor=FastRCNNPredictor(representation_size, num_classes + 1),
              rpn_batch_size_per_image=rpn_batch_size_per_image,
              box_batch_size_per_image=box_batch_size_per_image)
    if rpn_proposals is not None:
        kw.update({f"rpn_{a}_nms_top_n_{b}": int(rpn_proposals) for a in ("pre", "post") for b in ("train", "test")})
    if score_thresh is not None:
        kw["box_score_thresh"] = score_thresh
    if kind == "fasterrcnn":
        return FasterRCNN(fpn, None, **kw)
    from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor

    mask_pool = MultiScaleRoIAlign(names, output_size=14, sampling_ratio=2)
    return MaskRCNN(fpn, None, mask_roi_pool=mask_pool,
                    mask_head=MaskRCNNHeads(fpn.out_channels, (mask_head_channels,) * 4, 1),
                    mask_predictor=MaskRCNNPredictor(mask_head_channels, mask_head_channels, num_classes + 1), **kw)
