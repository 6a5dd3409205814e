"""Dense prediction with any subquad backbone: torchvision detectors and two semantic segmenters.

    from subquad.dense import build_detector, build_segmenter
    det = build_detector("maskrcnn", "l2vit_tiny", num_classes=80)       # torchvision MaskRCNN + FPN
    seg = build_segmenter("upernet", "flatten_swin_tiny", num_classes=150)

Backbones enter through timm's `features_only=True` (see `FeatureBackbone`). The CLI is `subquad detect` and
`subquad segment`; recipes are in subquad/configs/coco/ and subquad/configs/ade20k/. Attributes load lazily, so
importing this package does not import torchvision.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["build_detector", "build_segmenter", "DETECTOR_KINDS", "SEGMENTER_KINDS", "FeatureBackbone",
           "CocoDetection", "ADE20KSegmentation", "generate_synthetic", "coco_map", "segmentation_scores",
           "confusion_matrix", "detections_to_coco", "train_dense", "DenseConfig"]

_WHERE = {"build_detector": "detect", "DETECTOR_KINDS": "detect", "build_segmenter": "segment",
          "SEGMENTER_KINDS": "segment", "FeatureBackbone": "backbone", "CocoDetection": "data",
          "ADE20KSegmentation": "data", "generate_synthetic": "synthetic", "coco_map": "metrics",
          "segmentation_scores": "metrics", "confusion_matrix": "metrics", "detections_to_coco": "metrics",
          "train_dense": "engine", "DenseConfig": "config"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
