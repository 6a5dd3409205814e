"""A subquad (or any timm) backbone seen through `features_only`, as the multi-level feature source of a dense head.

`FeatureBackbone` asks timm for `features_only=True` (the shared backbone contract), returns the stage maps as an
ordered dict of NCHW tensors keyed '0', '1', ... (the keys torchvision's FPN and RoI pooling expect), and pads the
input on the bottom/right to a multiple of the total stride S, so any input size gives maps of exactly
(ceil(H / S) * S / r) x (ceil(W / S) * S / r) at reduction r (consistent across levels, as FPN needs). NHWC
feature outputs (timm's Swin) are permuted to NCHW. A LayerNorm per returned level follows, as the official
detection/segmentation backbones of Swin (SwinTransformer/Swin-Transformer-Object-Detection,
mmdet/models/backbones/swin_transformer.py, `norm{i}`) and L2ViT add to each output (the classification models'
stage outputs are un-normalised).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UserError

__all__ = ["FeatureBackbone", "create_feature_backbone"]


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def create_feature_backbone(name: str, out_indices: Sequence[int] | None = None, drop_path_rate: float | None = None,
                            pretrained: bool = False, **kwargs) -> nn.Module:
    """`timm.create_model(name, features_only=True, ...)` with one-line errors for unknown or refusing models."""
    import timm

    from .. import models as _models  # noqa: F401  (registers the subquad families)

    if name not in timm.list_models():
        from ..errors import unknown_name

        raise unknown_name("model", name, timm.list_models())
    kw = dict(kwargs)
    if out_indices is not None:
        kw["out_indices"] = tuple(int(i) for i in out_indices)
    if drop_path_rate is not None:
        kw["drop_path_rate"] = drop_path_rate
    try:
        return timm.create_model(name, pretrained=pretrained, features_only=True, **kw)
    except (RuntimeError, AssertionError, ValueError, TypeError, KeyError) as e:
        raise UserError(f"backbone {name!r} cannot be built with features_only=True ({_first_line(e)}); dense heads "
                        "need a model that gives multi-level feature maps (see subquad.list_models())") from e


class FeatureBackbone(nn.Module):
    """Multi-level NCHW feature maps of a `features_only` backbone, padded to the total stride.

    Args:
        backbone: a registered model name, or a module built with `features_only=True` (it must have
            `feature_info` with `channels()` and `reduction()`).
        out_indices: which stages to return (default: all the backbone gives).
        drop_path_rate: stochastic depth of the backbone (the dense recipes set it; default: the model's).
        pretrained: load the model's pretrained weights through timm (needs a local file in its pretrained_cfg).
        out_norms: a LayerNorm over channels on each returned level.
        **kwargs: more options for `timm.create_model`.

    Shapes:
        x: (B, C_in, H, W) -> OrderedDict {'0': (B, C_0, H_p/r_0, W_p/r_0), '1': ...}, H_p, W_p = H, W padded up
            to multiples of the total stride.

    Attributes:
        channels: list of channel counts per returned level.
        reductions: list of strides per returned level (strictly increasing).
        stride: the largest reduction; inputs are padded to a multiple of it, and an input side below it is refused.
    """

    def __init__(self, backbone: str | nn.Module, out_indices: Sequence[int] | None = None,
                 drop_path_rate: float | None = None, pretrained: bool = False, out_norms: bool = True,
                 **kwargs) -> None:
        super().__init__()
        if isinstance(backbone, str):
            self.name = backbone
            body = create_feature_backbone(backbone, out_indices, drop_path_rate, pretrained, **kwargs)
        else:
            self.name = type(backbone).__name__
            body = backbone
        info = getattr(body, "feature_info", None)
        if info is None or not hasattr(info, "reduction") or not callable(getattr(info, "reduction", None)):
            raise UserError(f"backbone {self.name!r} has no features_only feature_info (channels, reduction); build "
                            "it with timm.create_model(name, features_only=True)")
        self.body = body
        self.channels = [int(c) for c in info.channels()]
        self.reductions = [int(r) for r in info.reduction()]
        if any(b <= a for a, b in zip(self.reductions, self.reductions[1:])):
            raise UserError(f"backbone {self.name!r} gives features at strides {self.reductions}; dense heads need a "
                            "hierarchical backbone (strictly increasing strides)")
        fmt = getattr(body, "output_fmt", "NCHW")
        self.channels_last_out = str(getattr(fmt, "value", fmt)).upper() == "NHWC"
        self.stride = self.reductions[-1]
        from timm.layers import LayerNorm2d

        self.norms = nn.ModuleList(LayerNorm2d(c) if out_norms else nn.Identity() for c in self.channels)

    def check_size(self, h: int, w: int) -> None:
        """Refuse an input side below the total stride (its coarsest map would be empty or all padding)."""
        if h < self.stride or w < self.stride:
            raise UserError(f"image size {h}x{w} is smaller than the total stride {self.stride} of backbone "
                            f"{self.name!r}; use images of at least {self.stride}x{self.stride}")

    def forward(self, x: torch.Tensor) -> OrderedDict[str, torch.Tensor]:
        h, w = x.shape[-2:]
        self.check_size(h, w)
        s = self.stride
        ph, pw = (-h) % s, (-w) % s
        if ph or pw:
            x = F.pad(x, (0, pw, 0, ph))
        feats = self.body(x)
        out: OrderedDict[str, torch.Tensor] = OrderedDict()
        for i, f in enumerate(feats):
            if self.channels_last_out:
                # (B, H, W, C) -> (B, C, H, W)
                f = f.permute(0, 3, 1, 2)
            out[str(i)] = self.norms[i](f.contiguous())
        return out
