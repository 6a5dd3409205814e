"""Semantic segmenters with any `features_only` backbone: Semantic FPN and UperNet.

- `semantic_fpn`: torchvision's FPN neck (256 channels) and the semantic branch of Panoptic FPN (Kirillov et al.,
  Panoptic Feature Pyramid Networks, arXiv 1901.02446 §3.2, Fig. 3): each level goes through
  [3x3 conv (128) + GroupNorm + ReLU + 2x bilinear upsampling] until the finest stride (one conv, no upsampling, at
  the finest level); the levels are summed, a 1x1 conv gives the class logits, and bilinear upsampling the input
  size. The FLatten (arXiv 2308.00442 §5.2) and LiSA (arXiv 2211.16289, Table 10) ADE20K results use this head
  (mmsegmentation's FPNHead, dropout 0.1 before the classifier).
- `upernet`: UperNet (Xiao et al., Unified Perceptual Parsing, arXiv 1807.10221 §3, Fig. 4): a pyramid pooling
  module (scales 1, 2, 3, 6) on the coarsest level, lateral 1x1 convs and a top-down path on the others, 3x3 convs,
  all levels upsampled to the finest and concatenated, a 3x3 fusion conv and a 1x1 classifier; plus the auxiliary
  FCN head on the third level (loss weight 0.4) of the mmsegmentation UperNet configs that Swin (arXiv 2103.14030
  §4.3), L2ViT ("The Linear Attention Resurrection in Vision Transformer" §5.3) and FLatten (§5.2) follow.

Norms are GroupNorm (Panoptic FPN's choice) in both heads, also where mmsegmentation's UperNet uses SyncBN, so that a
batch of one image or a CPU run trains the same (see docs/dense.md, "Detection and segmentation").

`model(x)` returns {'out': (B, K, H, W) logits at the input size} and, in training with an auxiliary head,
'aux' of the same shape. The input is padded to the backbone's total stride and the logits are cropped back.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UserError
from .backbone import FeatureBackbone

__all__ = ["SEGMENTER_KINDS", "build_segmenter", "Segmenter", "SemanticFPNHead", "UperNetHead", "segmentation_loss",
           "IGNORE_INDEX"]

SEGMENTER_KINDS = ("semantic_fpn", "upernet")
IGNORE_INDEX = 255


def _gn(c: int) -> nn.GroupNorm:
    """GroupNorm with up to 32 groups of at least 2 channels (a 1x1 map still normalises over several values)."""
    g = max(1, min(32, c // 2))
    while c % g:
        g -= 1
    return nn.GroupNorm(g, c)


def _conv(cin: int, cout: int, k: int = 3) -> nn.Sequential:
    """conv k x k (no bias) + GroupNorm + ReLU."""
    return nn.Sequential(nn.Conv2d(cin, cout, k, padding=k // 2, bias=False), _gn(cout), nn.ReLU(inplace=True))


class SemanticFPNHead(nn.Module):
    """Panoptic FPN semantic branch over FPN maps at `strides` (finest first).

    Shapes:
        feats: list of (B, C_fpn, H/s_l, W/s_l) -> (B, num_classes, H/s_0, W/s_0).
    """

    def __init__(self, in_channels: int, strides: Sequence[int], num_classes: int, channels: int = 128,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.scale_heads = nn.ModuleList()
        for i, s in enumerate(strides):
            ups = max(1, (int(s) // int(strides[0])).bit_length() - 1) if i else 1
            layers: list[nn.Module] = []
            for k in range(ups):
                layers.append(_conv(in_channels if k == 0 else channels, channels))
                if i:
                    layers.append(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False))
            self.scale_heads.append(nn.Sequential(*layers))
        self.dropout = nn.Dropout2d(dropout) if dropout > 0 else nn.Identity()
        self.cls = nn.Conv2d(channels, num_classes, 1)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        out = self.scale_heads[0](feats[0])
        for head, f in zip(self.scale_heads[1:], feats[1:]):
            y = head(f)
            if y.shape[-2:] != out.shape[-2:]:
                y = F.interpolate(y, size=out.shape[-2:], mode="bilinear", align_corners=False)
            out = out + y
        return self.cls(self.dropout(out))


class UperNetHead(nn.Module):
    """UperNet: PPM on the coarsest level + FPN fusion of all levels.

    Shapes:
        feats: list of (B, C_l, H/s_l, W/s_l) (finest first) -> (B, num_classes, H/s_0, W/s_0).
    """

    def __init__(self, in_channels: Sequence[int], num_classes: int, channels: int = 512,
                 pool_scales: Sequence[int] = (1, 2, 3, 6), dropout: float = 0.1) -> None:
        super().__init__()
        self.pool_scales = tuple(pool_scales)
        self.ppm = nn.ModuleList(_conv(in_channels[-1], channels, 1) for _ in self.pool_scales)
        self.ppm_bottleneck = _conv(in_channels[-1] + len(self.pool_scales) * channels, channels)
        self.lateral = nn.ModuleList(_conv(c, channels, 1) for c in in_channels[:-1])
        self.fpn_convs = nn.ModuleList(_conv(channels, channels) for _ in in_channels[:-1])
        self.fuse = _conv(len(in_channels) * channels, channels)
        self.dropout = nn.Dropout2d(dropout) if dropout > 0 else nn.Identity()
        self.cls = nn.Conv2d(channels, num_classes, 1)

    def _psp(self, x: torch.Tensor) -> torch.Tensor:
        outs = [x]
        for s, conv in zip(self.pool_scales, self.ppm):
            y = conv(F.adaptive_avg_pool2d(x, s))
            outs.append(F.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False))
        return self.ppm_bottleneck(torch.cat(outs, 1))

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        lat = [conv(f) for conv, f in zip(self.lateral, feats[:-1])] + [self._psp(feats[-1])]
        for i in range(len(lat) - 1, 0, -1):
            lat[i - 1] = lat[i - 1] + F.interpolate(lat[i], size=lat[i - 1].shape[-2:], mode="bilinear",
                                                    align_corners=False)
        outs = [conv(x) for conv, x in zip(self.fpn_convs, lat[:-1])] + [lat[-1]]
        size = outs[0].shape[-2:]
        outs = [outs[0]] + [F.interpolate(o, size=size, mode="bilinear", align_corners=False) for o in outs[1:]]
        return self.cls(self.dropout(self.fuse(torch.cat(outs, 1))))


class AuxFCNHead(nn.Module):
    """mmsegmentation's auxiliary FCNHead (one 3x3 conv, dropout, 1x1 classifier) on one backbone level."""

    def __init__(self, in_channels: int, num_classes: int, channels: int = 256, dropout: float = 0.1) -> None:
        super().__init__()
        self.conv = _conv(in_channels, channels)
        self.dropout = nn.Dropout2d(dropout) if dropout > 0 else nn.Identity()
        self.cls = nn.Conv2d(channels, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cls(self.dropout(self.conv(x)))


class Segmenter(nn.Module):
    """Backbone (+ FPN neck for semantic_fpn) + decode head (+ auxiliary head); logits at the input size.

    Shapes:
        x: (B, 3, H, W) images normalised by the data transforms -> {'out': (B, K, H, W)} (+ 'aux' in
            training when aux_head is set).
    """

    def __init__(self, kind: str, body: FeatureBackbone, head: nn.Module, neck: nn.Module | None = None,
                 aux_head: nn.Module | None = None, aux_level: int = -2, num_classes: int = 0) -> None:
        super().__init__()
        self.kind = kind
        self.num_classes = num_classes
        self.backbone = body
        self.neck = neck
        self.head = head
        self.aux_head = aux_head
        self.aux_level = aux_level

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h, w = x.shape[-2:]
        feats = list(self.backbone(x).values())
        dec = list(self.neck(dict(enumerate(feats))).values()) if self.neck is not None else feats
        out = {"out": F.interpolate(self.head(dec), size=(h + (-h) % self.backbone.stride,
                                                         w + (-w) % self.backbone.stride),
                                    mode="bilinear", align_corners=False)[..., :h, :w]}
        if self.aux_head is not None and self.training:
            a = self.aux_head(feats[self.aux_level])
            out["aux"] = F.interpolate(a, scale_factor=self.backbone.reductions[self.aux_level], mode="bilinear",
                                       align_corners=False)[..., :h, :w]
        return out


def segmentation_loss(outputs: dict[str, torch.Tensor], target: torch.Tensor, aux_weight: float = 0.4,
                      ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Pixel cross-entropy of 'out' (+ aux_weight x that of 'aux'), pixels equal to ignore_index left out.

    Shapes:
        outputs['out']: (B, K, H, W); target: (B, H, W) int64 in [0, K) or ignore_index.
    """
    loss = F.cross_entropy(outputs["out"], target, ignore_index=ignore_index)
    if "aux" in outputs and aux_weight:
        loss = loss + aux_weight * F.cross_entropy(outputs["aux"], target, ignore_index=ignore_index)
    return loss


def build_segmenter(kind: str, backbone: str | nn.Module, num_classes: int, *, channels: int | None = None,
                    fpn_channels: int = 256, aux_head: bool | None = None, out_indices: Sequence[int] | None = None,
                    drop_path_rate: float | None = None, pretrained_backbone: bool = False,
                    dropout: float = 0.1, backbone_kwargs: dict | None = None) -> Segmenter:
    """A semantic segmenter with a subquad backbone (through `features_only`).

    Args:
        kind: 'semantic_fpn' or 'upernet'.
        backbone: registered model name or a `features_only` module.
        num_classes: classes predicted (ADE20K: 150; label 255 is ignored).
        channels: decode-head width (default 128 for semantic_fpn, 512 for upernet, as in the papers' configs).
        fpn_channels: FPN neck width of semantic_fpn (256).
        aux_head: add the auxiliary FCN head (default: on for upernet, off for semantic_fpn).
        out_indices: backbone stages to use (default: all).
        drop_path_rate: backbone stochastic depth.
        pretrained_backbone: load the backbone's pretrained weights through timm.
        dropout: dropout before the classifiers (0.1 in the configs).
        backbone_kwargs: more options for timm.create_model.
    """
    if kind not in SEGMENTER_KINDS:
        raise UserError(f"unknown segmenter kind {kind!r}; allowed: {', '.join(SEGMENTER_KINDS)}")
    if num_classes < 1:
        raise UserError(f"num_classes must be >= 1, got {num_classes}")
    body = FeatureBackbone(backbone, out_indices, drop_path_rate, pretrained_backbone, **(backbone_kwargs or {}))
    if len(body.channels) < 2:
        raise UserError(f"{kind} needs a backbone with at least 2 feature levels; {body.name!r} gives "
                        f"{len(body.channels)}")
    use_aux = (kind == "upernet") if aux_head is None else aux_head
    aux = AuxFCNHead(body.channels[-2], num_classes, max(16, (channels or 512) // 2), dropout) if use_aux else None
    if kind == "semantic_fpn":
        from torchvision.ops import FeaturePyramidNetwork

        neck = FeaturePyramidNetwork(body.channels, fpn_channels)
        head: nn.Module = SemanticFPNHead(fpn_channels, body.reductions, num_classes, channels or 128, dropout)
        return Segmenter(kind, body, head, neck, aux, num_classes=num_classes)
    head = UperNetHead(body.channels, num_classes, channels or 512, dropout=dropout)
    return Segmenter(kind, body, head, None, aux, num_classes=num_classes)
