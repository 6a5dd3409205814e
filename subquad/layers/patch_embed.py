"""Stems and downsampling layers of the hierarchical backbones (token in, token out, with the grid `hw`).

Every layer returns tokens (B, N, C) together with their grid (H, W). Padding rules follow the official code of the
family that uses the layer (L2ViT pads to the stride; PVT v1 floors; PVTv2's overlapping convs pad by k // 2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import register_notrace_module
from torch import nn

from .._shapes import known_equal, map_to_tokens, pad_to_multiple, tokens_to_map
from ..errors import UserError

__all__ = ["ConvStem", "ConvStem4L", "L2ViTStem", "PreNormDownsample", "PatchEmbedLN", "OverlapPatchEmbed",
           "resize_pos_embed_2d"]


class ConvStem(nn.Module):
    """Two-conv stem: Conv3x3 s2 -> BN -> ReLU -> Conv3x3 s(stride/2) -> BN. (B, C_in, H, W) -> (B, C, H/s, W/s).

    Paper: L2ViT paper, Tab. 6 "conv stem"; details are code-only (docs/deviations.md).
    Official: L2ViT `classification/models/l2vit.py`, `ConvStem` ('2L'), keys `proj.{0,1,3,4}`.

    Args:
        in_chans: image channels.
        embed_dim: output channels C (the hidden width is C // 2).
        stride: total stride 4 (official) or 2 (the tiny test layout: the second conv keeps the resolution).
    """

    def __init__(self, in_chans: int, embed_dim: int, stride: int = 4, device=None, dtype=None) -> None:
        super().__init__()
        if stride not in (2, 4):
            raise ValueError(f"ConvStem: stride must be 2 or 4, got {stride}")
        dd = {"device": device, "dtype": dtype}
        hid = embed_dim // 2
        self.proj = nn.Sequential(
            nn.Conv2d(in_chans, hid, 3, 2, 1, **dd),
            nn.BatchNorm2d(hid, **dd),
            nn.ReLU(),
            nn.Conv2d(hid, embed_dim, 3, stride // 2, 1, **dd),
            nn.BatchNorm2d(embed_dim, **dd),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class ConvStem4L(nn.Module):
    """Four-layer stem: Conv7x7 s2 -> (BN -> ReLU -> Conv3x3) x 2 -> BN -> ReLU -> Conv (stride/2) patchify.
    (B, C_in, H, W) -> (B, C, H/s, W/s); the three first convs have no bias, the hidden width is C // 2.

    Paper: L2ViT paper Tab. 7, "+ 4L conv stem" (the "Scaled ReLU" stem). Official: L2ViT
    `classification/models/l2vit.py`, `ConvStem_4L` (keys `proj.{0,1,3,4,6,7,9}`).

    Args:
        in_chans, embed_dim: input channels and output channels C.
        stride: total stride 4 (official) or 2 (the tiny test layout: the last conv is 1x1).
    """

    def __init__(self, in_chans: int, embed_dim: int, stride: int = 4, device=None, dtype=None) -> None:
        super().__init__()
        if stride not in (2, 4):
            raise ValueError(f"ConvStem4L: stride must be 2 or 4, got {stride}")
        dd = {"device": device, "dtype": dtype}
        hid = embed_dim // 2
        last = stride // 2
        self.proj = nn.Sequential(
            nn.Conv2d(in_chans, hid, 7, 2, 3, bias=False, **dd),
            nn.BatchNorm2d(hid, **dd),
            nn.ReLU(),
            nn.Conv2d(hid, hid, 3, 1, 1, bias=False, **dd),
            nn.BatchNorm2d(hid, **dd),
            nn.ReLU(),
            nn.Conv2d(hid, hid, 3, 1, 1, bias=False, **dd),
            nn.BatchNorm2d(hid, **dd),
            nn.ReLU(),
            nn.Conv2d(hid, embed_dim, last, last, **dd),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


STEM_TYPES = ("2L", "4L", "patchify")


@register_notrace_module
class L2ViTStem(nn.Module):
    """L2ViT patch embedding of stage 1: zero-pad to the stride, stem, tokens, LayerNorm.

    Shapes: images (B, C_in, H, W) -> tokens (B, ceil(H/s) * ceil(W/s), C) and hw = (ceil(H/s), ceil(W/s)).
    Paper: L2ViT paper Sec. 3.3 (conv stem), Tab. 6 (patchify stem) and Tab. 7 (4L stem).
    Official: L2ViT `PatchEmbed(patch_size=4)`: `conv_stem=True` with `conv_stem_type` '2L' / '4L' (keys
    `proj.proj.*`, `norm`), or `conv_stem=False`, a k = s conv (keys `proj`, `norm`).

    Args:
        stem_type: '2L' (`ConvStem`, every released model), '4L' (`ConvStem4L`) or 'patchify' (Conv k = s = stride,
            as Swin: the "primitive L2ViT" of Tab. 6).
    """

    def __init__(self, in_chans: int, embed_dim: int, patch_size: int = 4, stem_type: str = "2L", device=None,
                 dtype=None) -> None:
        super().__init__()
        if stem_type not in STEM_TYPES:
            raise UserError(f"L2ViT stem: conv_stem_type={stem_type!r} is not one of {STEM_TYPES}")
        self.patch_size = patch_size
        self.in_chans = in_chans
        dd = {"device": device, "dtype": dtype}
        if stem_type == "2L":
            self.proj = ConvStem(in_chans, embed_dim, patch_size, **dd)
        elif stem_type == "4L":
            self.proj = ConvStem4L(in_chans, embed_dim, patch_size, **dd)
        else:
            self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, patch_size, **dd)
        self.norm = nn.LayerNorm(embed_dim, **dd)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x, _ = pad_to_multiple(x, (self.patch_size, self.patch_size))
        x = self.proj(x)  # (B, C, h, w)
        hw = (x.shape[2], x.shape[3])
        return self.norm(map_to_tokens(x)), hw


@register_notrace_module
class PreNormDownsample(nn.Module):
    """LayerNorm on tokens, then a k=s=2 conv on the map (zero-padded to even sizes). (B, H*W, C_in) -> (B, N', C_out).

    `overlapped=True`: a 3x3 conv, stride 2, padding 1 on the same zero-padded map (same output grid), the
    "overlapped downsample layer" of L2ViT paper Tab. 7.

    Paper: L2ViT paper, downsampling between stages (details code-only; docs/deviations.md).
    Official: L2ViT `PatchEmbed(patch_size=2, overlapped=...)` (keys `norm` over C_in, `proj`).
    """

    def __init__(self, in_dim: int, out_dim: int, patch_size: int = 2, overlapped: bool = False, device=None,
                 dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.patch_size = patch_size
        self.norm = nn.LayerNorm(in_dim, **dd)
        if overlapped:
            self.proj = nn.Conv2d(in_dim, out_dim, 3, patch_size, 1, **dd)
        else:
            self.proj = nn.Conv2d(in_dim, out_dim, patch_size, patch_size, **dd)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> tuple[torch.Tensor, tuple[int, int]]:
        x = tokens_to_map(self.norm(x), hw)  # (B, C_in, H, W)
        x, _ = pad_to_multiple(x, (self.patch_size, self.patch_size))
        x = self.proj(x)  # (B, C_out, H', W')
        return map_to_tokens(x), (x.shape[2], x.shape[3])


@register_notrace_module
class PatchEmbedLN(nn.Module):
    """Non-overlapping patch embedding: Conv k=s=p, tokens, LayerNorm (eps 1e-5). Sizes are floored (no padding).

    Shapes: (B, C_in, H, W) -> (B, floor(H/p) * floor(W/p), C) and hw.
    Paper: PVT v1 (Wang et al. 2021) patch embedding, host of FLatten-PVT (arXiv 2308.00442).
    Official: FLatten `models/flatten_pvt.py`, `PatchEmbed` (keys `proj`, `norm`).
    """

    def __init__(self, in_chans: int, embed_dim: int, patch_size: int, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, patch_size, **dd)
        self.norm = nn.LayerNorm(embed_dim, **dd)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x = self.proj(x)
        return self.norm(map_to_tokens(x)), (x.shape[2], x.shape[3])


@register_notrace_module
class OverlapPatchEmbed(nn.Module):
    """Overlapping patch embedding: Conv k, stride s, padding k // 2, tokens, LayerNorm (eps 1e-5).

    Shapes: (B, C_in, H, W) -> (B, H' * W', C) with H' = floor((H - 1) / s) + 1 (and W' alike), and hw = (H', W').
    Paper: PVTv2 (Wang et al. 2022) overlapping patch embedding, host of FLatten-PVTv2 (arXiv 2308.00442).
    Official: FLatten `models/flatten_pvt_v2.py`, `OverlapPatchEmbed` (keys `proj`, `norm`).
    """

    def __init__(self, in_chans: int, embed_dim: int, patch_size: int = 7, stride: int = 4, device=None,
                 dtype=None) -> None:
        super().__init__()
        if patch_size <= stride:
            raise ValueError(f"OverlapPatchEmbed: patch_size={patch_size} must exceed stride={stride}")
        dd = {"device": device, "dtype": dtype}
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride, patch_size // 2, **dd)
        self.norm = nn.LayerNorm(embed_dim, **dd)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x = self.proj(x)
        return self.norm(map_to_tokens(x)), (x.shape[2], x.shape[3])


def resize_pos_embed_2d(pos: torch.Tensor, src_hw: tuple[int, int], dst_hw: tuple[int, int],
                        mode: str = "bilinear") -> torch.Tensor:
    """Resize an absolute position embedding (1, h*w, C) on its grid to (1, H*W, C) (align_corners=False).

    Official: PVT v1 `_get_pos_embed` (bilinear) and FLatten `utils.load_pretrained` (bicubic).
    """
    # known_equal: a traced (symbolic) grid always resamples, which is the identity at the same size.
    if known_equal(tuple(src_hw), tuple(dst_hw)):
        return pos
    C = pos.shape[-1]
    grid = pos.reshape(1, src_hw[0], src_hw[1], C).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=tuple(dst_hw), mode=mode, align_corners=False)
    return grid.flatten(2).transpose(1, 2)
