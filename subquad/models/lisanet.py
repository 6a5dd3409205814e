"""LiSANet / HyLiSANet backbones (image and video) built on LiSA structure-aware attention.

**Unofficial configurations** (spec/lisa.md section 8, register LI-8): LiSA has no released code and the seed text
lost the paper's Tab. 2, so every depth, width, head count and stem here is our choice, not the paper's Tab. 2.
The cards keep the paper's published accuracy only as a target; nothing produced here is a reproduction.

- `lisanet_i`: isotropic, patch 16, 14 x 14 tokens at every depth, D = 16.
- `lisanet_s/b`: 4 stages of LiSA blocks (56^2, 28^2, 14^2, 7^2 tokens at 224).
- `hylisanet_s/b`: depthwise-conv blocks in stages 1-2, LiSA blocks in stages 3-4.
- `hylisanet_s/b_video`: the hybrids on (B, 3, T, H, W) clips: Conv3d stem (3, 4, 4)/(2, 4, 4), later downsampling
  (1, 2, 2), 3-D LiSA over T x H x W; `inflate_image_weights` builds their weights from the image models.
- `lisanet_micro`, `hylisanet_micro`: tiny variants for tests.

Paper: seed 002 (LiSA, arXiv 2211.16289), Sec. 3-4; blocks per spec section 8.1.
Official: none published.
Symbols: D structural-pattern size; C stage width; h = C / 64 heads (at least 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from timm.layers import DropPath, trunc_normal_
from timm.models import generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from torch import nn

from .._shapes import as_hw, map_to_tokens
from ..attention import build_attention
from ..attention.functional.structure_aware import inflate_kernel, resize_kernel
from ..errors import UserError
from ..layers.conv_blocks import ConvMlp3d, ConvPosEnc3d, DWConvBlock, LayerNormChannels, conv_nd
from ..layers.mlp import ConvMlp
from ..layers.pos_embed import ConvPosEnc
from ._builder import build
from ._card import ModelCard, register_card
from ._pyramid import prune_isotropic

__all__ = ["LiSANet", "LiSANetIsotropic", "LiSABlock", "inflate_image_weights", "remap_checkpoint"]

_STAGE_TYPES = ("lisa", "conv")


class LiSABlock(nn.Module):
    """LiSA block: x <- x + CPE(x); x <- x + DropPath(LiSA(LN(x))); x <- x + DropPath(ConvMLP(LN(x))).

    Shapes: x (B, N, C) with grid (H, W) or (T, H, W) (video) -> (B, N, C). Keys `cpe.proj, norm1, attn.*, norm2,
    mlp.{fc1, dwconv.dwconv, fc2}` (spec lisa section 8.3).
    """

    def __init__(self, dim: int, num_heads: int, D: int, input_size: Sequence[int], mlp_ratio: float = 4.0,
                 drop_path: float = 0.0, attn_kwargs: dict | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        video = len(input_size) == 3
        self.cpe = ConvPosEnc3d(dim, **dd) if video else ConvPosEnc(dim, **dd)
        self.norm1 = nn.LayerNorm(dim, eps=1e-6, **dd)
        self.attn = build_attention("structure_aware", dim, num_heads, D=D, input_size=tuple(input_size),
                                    **(attn_kwargs or {}), **dd)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6, **dd)
        hidden = int(dim * mlp_ratio)
        self.mlp = ConvMlp3d(dim, hidden, **dd) if video else ConvMlp(dim, hidden, **dd)

    def forward(self, x: torch.Tensor, grid: tuple[int, ...]) -> torch.Tensor:
        x = self.cpe(x, grid)
        x = x + self.drop_path(self.attn(self.norm1(x), grid))
        return x + self.drop_path(self.mlp(self.norm2(x), grid))


class _Embed(nn.Module):
    """Strided conv + channels LN on a channels-first map; pads H, W (bottom/right) to the stride first.

    Keys `proj`, `norm` (stem: `patch_embed`; between stages: `stages.{s}.downsample`).
    """

    def __init__(self, in_chs: int, out_chs: int, kernel: Sequence[int], stride: Sequence[int],
                 padding: Sequence[int], device=None, dtype=None) -> None:
        super().__init__()
        self.stride = tuple(stride)
        self.proj = conv_nd(len(kernel))(in_chs, out_chs, tuple(kernel), self.stride, tuple(padding), device=device,
                                         dtype=dtype)
        self.norm = LayerNormChannels(out_chs, eps=1e-6, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        H, W = x.shape[-2:]
        sh, sw = self.stride[-2:]
        ph, pw = (-H) % sh, (-W) % sw
        if ph or pw:
            x = F.pad(x, (0, pw, 0, ph))
        return self.norm(self.proj(x))


class LiSAStage(nn.Module):
    """One stage: optional downsample, then blocks (LiSA blocks on tokens, or depthwise-conv blocks on the map).

    Shapes: x (B, C_in, *spatial) -> (B, C, *spatial') channels-first.
    """

    def __init__(self, in_dim: int, dim: int, depth: int, stage_type: str, num_heads: int, D: int,
                 input_size: Sequence[int], downsample: bool, video: bool, mlp_ratio: float,
                 drop_path: Sequence[float], attn_kwargs: dict | None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if stage_type not in _STAGE_TYPES:
            raise ValueError(f"stage type must be one of {_STAGE_TYPES}, got {stage_type!r}")
        self.stage_type = stage_type
        self.grad_checkpointing = False
        if downsample:
            k = (1, 2, 2) if video else (2, 2)
            self.downsample = _Embed(in_dim, dim, k, k, (0,) * len(k), **dd)
        else:
            self.downsample = nn.Identity()
        if stage_type == "lisa":
            blocks = [LiSABlock(dim, num_heads, D, input_size, mlp_ratio, drop_path[j], attn_kwargs, **dd)
                      for j in range(depth)]
        else:
            blocks = [DWConvBlock(dim, mlp_ratio, drop_path[j], ndim=3 if video else 2, **dd) for j in range(depth)]
        self.blocks = nn.ModuleList(blocks)

    def _run(self, blk: nn.Module, *args):
        if self.grad_checkpointing and torch.is_grad_enabled() and not torch.jit.is_scripting():
            return torch.utils.checkpoint.checkpoint(blk, *args, use_reentrant=False)
        return blk(*args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.downsample(x)
        if self.stage_type == "conv":
            for blk in self.blocks:
                x = self._run(blk, x)
            return x
        B, C = x.shape[:2]
        grid = tuple(x.shape[2:])
        t = x.flatten(2).transpose(1, 2)  # (B, N, C)
        for blk in self.blocks:
            t = self._run(blk, t, grid)
        return t.transpose(1, 2).reshape(B, C, *grid)


def _heads(dim: int, head_dim: int = 64) -> int:
    return max(1, dim // head_dim)


class _TimmInterface:
    """Shared timm plumbing of both LiSANet classes (head on pooled channels-first features)."""

    num_classes: int
    num_features: int
    global_pool: str

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        # LiSA kernels and struct_proj are decayed like conv weights; norms/biases fall under timm's 1-D rule.
        return set()

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        if global_pool is not None and global_pool != "avg":
            raise ValueError(f"global_pool must be 'avg', got {global_pool!r}")
        self.num_classes = num_classes
        ref = self.patch_embed.proj.weight
        self.head = (nn.Linear(self.num_features, num_classes, device=ref.device, dtype=ref.dtype)
                     if num_classes > 0 else nn.Identity())

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """x (B, C, *spatial) normed map -> mean over all token positions (T*H*W for video) -> head."""
        x = self.head_drop(x.flatten(2).mean(-1))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def _check_images(self, x: torch.Tensor) -> None:
        name = getattr(self, "pretrained_cfg", {}).get("architecture", type(self).__name__)
        want = 5 if self.video else 4
        if x.dim() != want:
            if self.video:
                raise ValueError(f"{name}: expected video clips (B, C, T, H, W), got shape {tuple(x.shape)}")
            hint = "; video needs hylisanet_*_video" if x.dim() == 5 else ""
            raise ValueError(f"{name}: expected images (B, C, H, W), got shape {tuple(x.shape)}{hint}")
        if x.shape[1] != self.in_chans:
            raise ValueError(f"{name}: expected {self.in_chans} input channels, got {x.shape[1]} "
                             f"(input shape {tuple(x.shape)})")


def _init_weights(m: nn.Module) -> None:
    """Linear trunc_normal(0.02), bias 0; Conv normal(0, sqrt(2 / fan_out)) (PVTv2); norms (1, 0)."""
    if isinstance(m, nn.Linear):
        trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, (nn.Conv2d, nn.Conv3d)):
        fan_out = math.prod(m.kernel_size) * m.out_channels // m.groups
        nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, (nn.LayerNorm, nn.BatchNorm2d, nn.BatchNorm3d)):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)


class LiSANet(_TimmInterface, nn.Module):
    """Hierarchical LiSANet / HyLiSANet (image or video), 4 stages, strides 4, 8, 16, 32.

    Shapes: images (B, in_chans, H, W) (any H, W: padded to the stride), or with `video=True` clips
    (B, in_chans, T, H, W) (T tokens = ceil(T / 2) after the stem). Stage outputs are channels-first maps.

    Args:
        img_size: construction resolution; LiSA kernels are sized for its token grids (img_size / 4, /8, ...)
            and resampled at run time for other sizes (`StructureAwareAttention`, 'pad' rule).
        in_chans, num_classes, global_pool ('avg' only).
        embed_dims, depths: per-stage width and depth.
        stage_types: per stage 'lisa' or 'conv' (depthwise-conv blocks).
        num_heads: per stage (ignored for 'conv'); default C / 64.
        D: structural-pattern size of every LiSA block.
        mlp_ratio, drop_rate, drop_path_rate: the usual (linear stochastic-depth rule).
        video, num_frames: 3-D form and the clip length the kernels are sized for.
        attn_kwargs: extra `structure_aware` options for every LiSA block.
    """

    def __init__(self, img_size: int | tuple[int, int] = 224, in_chans: int = 3, num_classes: int = 1000,
                 global_pool: str = "avg", embed_dims: Sequence[int] = (64, 128, 320, 512),
                 depths: Sequence[int] = (3, 4, 8, 3), stage_types: Sequence[str] = ("lisa",) * 4,
                 num_heads: Sequence[int] | None = None, D: int = 8, mlp_ratio: float = 4.0, drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, video: bool = False, num_frames: int = 16,
                 attn_kwargs: dict | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if global_pool != "avg":
            raise ValueError(f"global_pool must be 'avg', got {global_pool!r}")
        if not (len(embed_dims) == len(depths) == len(stage_types) == 4):
            raise ValueError(f"need 4 stages: embed_dims={embed_dims}, depths={depths}, stage_types={stage_types}")
        if not isinstance(D, int) or D < 1:
            raise ValueError(f"D (structural-pattern size) must be an int >= 1, got {D!r}")
        num_heads = tuple(num_heads) if num_heads is not None else tuple(_heads(c) for c in embed_dims)
        self.img_size = as_hw(img_size)
        self.in_chans = in_chans
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.video = video
        self.num_frames = num_frames
        self.num_features = self.head_hidden_size = embed_dims[-1]
        self.grad_checkpointing = False
        if video:
            self.patch_embed = _Embed(in_chans, embed_dims[0], (3, 4, 4), (2, 4, 4), (1, 0, 0), **dd)
            t_tokens = (num_frames + 1) // 2
        else:
            self.patch_embed = _Embed(in_chans, embed_dims[0], (4, 4), (4, 4), (0, 0), **dd)
        dpr = torch.linspace(0, drop_path_rate, sum(depths)).tolist()
        stages, start, in_dim = [], 0, embed_dims[0]
        self.feature_info = []
        for s in range(4):
            red = 4 * 2 ** s
            grid = (math.ceil(self.img_size[0] / red), math.ceil(self.img_size[1] / red))
            if video:
                grid = (t_tokens, *grid)
            stages.append(LiSAStage(in_dim, embed_dims[s], depths[s], stage_types[s], num_heads[s], D, grid,
                                    downsample=s > 0, video=video, mlp_ratio=mlp_ratio,
                                    drop_path=dpr[start:start + depths[s]], attn_kwargs=attn_kwargs, **dd))
            start += depths[s]
            in_dim = embed_dims[s]
            self.feature_info.append(dict(num_chs=embed_dims[s], reduction=red, module=f"stages.{s}"))
        self.stages = nn.ModuleList(stages)
        self.norm = LayerNormChannels(self.num_features, eps=1e-6, **dd)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(self.num_features, num_classes, **dd) if num_classes > 0 else nn.Identity()
        if not self.norm.weight.is_meta:
            self.apply(_init_weights)
            for m in self.modules():
                if hasattr(m, "kernel_a") and hasattr(m, "reset_parameters"):
                    m.reset_parameters()

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(stem=r"^patch_embed", blocks=r"^stages\.(\d+)" if coarse else [
            (r"^stages\.(\d+)\.downsample", (0,)), (r"^stages\.(\d+)\.blocks\.(\d+)", None), (r"^norm", (99999,))])

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable
        for s in self.stages:
            s.grad_checkpointing = enable

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C_in, [T,] H, W) -> normed last-stage map (B, C, [T',] H/32, W/32)."""
        self._check_images(x)
        x = self.patch_embed(x)
        for stage in self.stages:
            x = stage(x)
        return self.norm(x)

    def forward_intermediates(self, x: torch.Tensor, indices: int | list[int] | None = None, norm: bool = False,
                              stop_early: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False):
        """Stage outputs as channels-first maps (B, C_s, [T',] H/r_s, W/r_s), r_s = 4, 8, 16, 32."""
        if output_fmt != "NCHW":
            raise ValueError(f"output_fmt must be 'NCHW', got {output_fmt!r}")
        self._check_images(x)
        take, max_index = feature_take_indices(len(self.stages), indices)
        x = self.patch_embed(x)
        intermediates = []
        stages = self.stages if not stop_early else self.stages[: max_index + 1]
        last = len(self.stages) - 1
        for i, stage in enumerate(stages):
            x = stage(x)
            if i in take:
                intermediates.append(self.norm(x) if norm and i == last else x)
        if intermediates_only:
            return intermediates
        if len(stages) == len(self.stages):
            x = self.norm(x)
        return x, intermediates

    def prune_intermediate_layers(self, indices: int | list[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        take, max_index = feature_take_indices(len(self.stages), indices)
        self.stages = self.stages[: max_index + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0)
        return take


class LiSANetIsotropic(_TimmInterface, nn.Module):
    """Isotropic LiSANet-I: patch 16 (Conv 16x16/16 + LN), `depth` LiSA blocks at one token grid, LN, mean, head.

    Shapes: images (B, in_chans, H, W) (padded to the patch size) -> logits (B, num_classes); blocks see tokens
    (B, h*w, C). Keys `patch_embed.{proj, norm}`, `blocks.{j}.*`, `norm`, `head`.

    Args:
        img_size: construction resolution (kernels sized for img_size / patch_size tokens).
        patch_size, in_chans, num_classes, global_pool ('avg').
        embed_dim, depth, num_heads, D, mlp_ratio, drop_rate, drop_path_rate: the usual; D = 16 for LiSANet-I.
        attn_kwargs: extra `structure_aware` options.
    """

    video = False

    def __init__(self, img_size: int | tuple[int, int] = 224, patch_size: int = 16, in_chans: int = 3,
                 num_classes: int = 1000, global_pool: str = "avg", embed_dim: int = 384, depth: int = 12,
                 num_heads: int = 6, D: int = 16, mlp_ratio: float = 4.0, drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, attn_kwargs: dict | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if global_pool != "avg":
            raise ValueError(f"global_pool must be 'avg', got {global_pool!r}")
        self.img_size = as_hw(img_size)
        self.in_chans = in_chans
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.grad_checkpointing = False
        self.patch_embed = _Embed(in_chans, embed_dim, (patch_size,) * 2, (patch_size,) * 2, (0, 0), **dd)
        grid = (math.ceil(self.img_size[0] / patch_size), math.ceil(self.img_size[1] / patch_size))
        dpr = torch.linspace(0, drop_path_rate, depth).tolist()
        self.blocks = nn.ModuleList([LiSABlock(embed_dim, num_heads, D, grid, mlp_ratio, dpr[j], attn_kwargs, **dd)
                                     for j in range(depth)])
        self.norm = LayerNormChannels(embed_dim, eps=1e-6, **dd)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes, **dd) if num_classes > 0 else nn.Identity()
        self.feature_info = [dict(num_chs=embed_dim, reduction=patch_size, module=f"blocks.{i}")
                             for i in range(depth)]
        if not self.norm.weight.is_meta:
            self.apply(_init_weights)
            for m in self.modules():
                if hasattr(m, "kernel_a") and hasattr(m, "reset_parameters"):
                    m.reset_parameters()

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(stem=r"^patch_embed", blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))])

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def _blocks(self, x: torch.Tensor, take=None, stop: int | None = None):
        B, C = x.shape[:2]
        grid = tuple(x.shape[2:])
        t = map_to_tokens(x)
        out = []
        for i, blk in enumerate(self.blocks[:stop]):
            if self.grad_checkpointing and torch.is_grad_enabled() and not torch.jit.is_scripting():
                t = torch.utils.checkpoint.checkpoint(blk, t, grid, use_reentrant=False)
            else:
                t = blk(t, grid)
            if take is not None and i in take:
                out.append(t.transpose(1, 2).reshape(B, C, *grid))
        return t.transpose(1, 2).reshape(B, C, *grid), out

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        self._check_images(x)
        x, _ = self._blocks(self.patch_embed(x))
        return self.norm(x)

    def forward_intermediates(self, x: torch.Tensor, indices: int | list[int] | None = None, norm: bool = False,
                              stop_early: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False):
        """Block outputs as maps (B, C, h, w)."""
        if output_fmt != "NCHW":
            raise ValueError(f"output_fmt must be 'NCHW', got {output_fmt!r}")
        self._check_images(x)
        take, max_index = feature_take_indices(len(self.blocks), indices)
        x, inter = self._blocks(self.patch_embed(x), take, max_index + 1 if stop_early else None)
        if norm:
            inter = [self.norm(t) for t in inter]
        if intermediates_only:
            return inter
        return self.norm(x), inter

    def prune_intermediate_layers(self, indices: int | list[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        return prune_isotropic(self, indices, prune_norm, prune_head)


def inflate_image_weights(image_state: dict[str, torch.Tensor], video_model: nn.Module,
                          mode: str = "center") -> dict[str, torch.Tensor]:
    """Inflate a 2-D LiSANet/HyLiSANet state dict into the matching video model's state dict (spec section 9).

    Rules ('center', register LI-6): a conv kernel (O, I, kh, kw) becomes (O, I, kt, kh, kw) with the 2-D kernel at
    the temporal centre index kt // 2 and zeros elsewhere; LiSA kernels (C|h, D, H, W) are resized to the video
    model's spatial grid ('pad' rule) and placed at temporal offset 0 (`inflate_kernel`); everything else (norms,
    BN statistics, linears, struct_proj) is copied. With 'center' the video model computes, for any clip, the image
    model frame by frame on frames 0, 2, 4, ... (the stem's temporal stride 2 picks the centre frame of each window).
    'average' replicates every kernel over time and divides by the temporal size.

    Returns a state dict that loads into `video_model` with strict=True.
    """
    if mode not in ("center", "average"):
        raise ValueError(f"inflate mode must be 'center' or 'average', got {mode!r}")
    target = video_model.state_dict()
    out = {}
    for key, ref in target.items():
        if key not in image_state:
            raise UserError(f"image weights lack {key!r} needed by the video model")
        w = image_state[key]
        if tuple(w.shape) == tuple(ref.shape):
            out[key] = w.clone()
        elif key.endswith(("kernel_a", "kernel_b")) and w.dim() == ref.dim() - 1:
            w = resize_kernel(w, ref.shape[-2:])
            out[key] = inflate_kernel(w, ref.shape[-3], mode)
        elif w.dim() == 4 and ref.dim() == 5 and tuple(w.shape) == tuple(ref.shape[:2]) + tuple(ref.shape[3:]):
            kt = ref.shape[2]
            if mode == "center":
                new = w.new_zeros(ref.shape)
                new[:, :, kt // 2] = w
            else:
                new = w.unsqueeze(2).expand(ref.shape) / kt
            out[key] = new.clone()
        else:
            raise UserError(f"cannot inflate {key!r}: image shape {tuple(w.shape)} vs video shape {tuple(ref.shape)}")
    return out


def remap_checkpoint(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Fit a LiSANet checkpoint to `model` (timm `pretrained_filter_fn`; also used by `checkpoint_path=`).

    LiSA kernels (`*.attn.kernel_a`, `*.attn.kernel_b`) saved for another token grid are resampled to the model's
    grid with `resize_kernel(..., 'pad')`, the rule the module applies at run time (spec section 7): a model built at
    a new `img_size` from such a checkpoint computes what the original model computes at that size. Everything else
    passes unchanged (LiSA has no official checkpoints, so there is nothing else to rename).
    """
    own = model.state_dict()
    out = {}
    for key, w in state_dict.items():
        ref = own.get(key)
        if (ref is not None and key.endswith(("attn.kernel_a", "attn.kernel_b")) and w.dim() == ref.dim()
                and w.shape[:2] == ref.shape[:2] and w.shape != ref.shape):
            w = resize_kernel(w, ref.shape[2:], "pad")
        out[key] = w
    return out


def _cfg(**kwargs) -> dict:
    return {"url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": (7, 7), "crop_pct": 0.875,
            "interpolation": "bicubic", "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
            "first_conv": "patch_embed.proj", "classifier": "head", "license": "apache-2.0",
            "paper_ids": "arXiv:2211.16289",
            "notes": "unofficial configuration; not the paper's Tab. 2 (LiSA has no released code or weights)",
            **kwargs}


_VIDEO_NOTE = ("unofficial configuration; not the paper's Tab. 2; video clips (B, 3, 16, 224, 224) (timm's cfg "
               "input_size holds (C, H, W) only)")
default_cfgs = generate_default_cfgs({
    "lisanet_micro": _cfg(input_size=(3, 64, 64), pool_size=(2, 2), crop_pct=1.0,
                          notes="tiny test variant (unofficial)"),
    "hylisanet_micro": _cfg(input_size=(3, 64, 64), pool_size=(2, 2), crop_pct=1.0,
                            notes="tiny test variant (unofficial)"),
    "lisanet_i": _cfg(pool_size=(14, 14)),
    "lisanet_s": _cfg(),
    "lisanet_b": _cfg(),
    "hylisanet_s": _cfg(),
    "hylisanet_b": _cfg(),
    # timm's cfg holds (C, H, W) only; clips are (B, 3, num_frames=16, 224, 224).
    "hylisanet_s_video": _cfg(pool_size=(8, 7, 7), crop_pct=1.0, notes=_VIDEO_NOTE),
    "hylisanet_b_video": _cfg(pool_size=(8, 7, 7), crop_pct=1.0, notes=_VIDEO_NOTE),
})


def _create(cls: type[nn.Module], variant: str, pretrained: bool, args: dict, kwargs: dict) -> nn.Module:
    if pretrained and not kwargs.get("pretrained_cfg_overlay"):
        raise UserError(f"{variant}: no weights exist (LiSA has no released checkpoints); pass "
                        "checkpoint_path=... or pretrained_cfg_overlay=dict(file=...)")
    merged = {**args, **kwargs}
    if cls is LiSANetIsotropic:
        depth = merged.get("depth", 12)
        out_indices = tuple(sorted({max(0, depth * (i + 1) // 4 - 1) for i in range(4)}))
    else:
        out_indices = (0, 1, 2, 3)
    return build(cls, variant, pretrained, remap=remap_checkpoint, default_out_indices=out_indices, **merged)


_HIER_S = dict(embed_dims=(64, 128, 320, 512), depths=(3, 4, 8, 3), D=8)
_HIER_B = dict(embed_dims=(64, 128, 320, 512), depths=(5, 8, 20, 7), D=8)
_HYBRID = ("conv", "conv", "lisa", "lisa")
_MICRO = dict(img_size=64, embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2), D=2,
              mlp_ratio=2.0)


@register_model
def lisanet_micro(pretrained: bool = False, **kwargs) -> LiSANet:
    return _create(LiSANet, "lisanet_micro", pretrained, dict(_MICRO), kwargs)


@register_model
def hylisanet_micro(pretrained: bool = False, **kwargs) -> LiSANet:
    return _create(LiSANet, "hylisanet_micro", pretrained, dict(_MICRO, stage_types=_HYBRID), kwargs)


@register_model
def lisanet_i(pretrained: bool = False, **kwargs) -> LiSANetIsotropic:
    args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6, D=16)
    return _create(LiSANetIsotropic, "lisanet_i", pretrained, args, kwargs)


@register_model
def lisanet_s(pretrained: bool = False, **kwargs) -> LiSANet:
    return _create(LiSANet, "lisanet_s", pretrained, dict(_HIER_S), kwargs)


@register_model
def lisanet_b(pretrained: bool = False, **kwargs) -> LiSANet:
    return _create(LiSANet, "lisanet_b", pretrained, dict(_HIER_B), kwargs)


@register_model
def hylisanet_s(pretrained: bool = False, **kwargs) -> LiSANet:
    return _create(LiSANet, "hylisanet_s", pretrained, dict(_HIER_S, stage_types=_HYBRID), kwargs)


@register_model
def hylisanet_b(pretrained: bool = False, **kwargs) -> LiSANet:
    return _create(LiSANet, "hylisanet_b", pretrained, dict(_HIER_B, stage_types=_HYBRID), kwargs)


@register_model
def hylisanet_s_video(pretrained: bool = False, **kwargs) -> LiSANet:
    args = dict(_HIER_S, stage_types=_HYBRID, video=True, num_frames=16)
    return _create(LiSANet, "hylisanet_s_video", pretrained, args, kwargs)


@register_model
def hylisanet_b_video(pretrained: bool = False, **kwargs) -> LiSANet:
    args = dict(_HIER_B, stage_types=_HYBRID, video=True, num_frames=16)
    return _create(LiSANet, "hylisanet_b_video", pretrained, args, kwargs)


_SRC = "seed 002 (LiSA, arXiv 2211.16289); config ours (spec/lisa.md section 8.2)"
_UNOFF = ("unofficial configuration; not the paper's Tab. 2. Params exact for this definition; GMACs at 224 from "
          "subquad.count_macs (FFTs and complex products counted, kernel FFTs included as in a first forward)")
_card = partial(ModelCard, family="lisa", img_size=224, source=_SRC, status="unofficial", code="")
register_card(_card(arch="lisanet_micro", img_size=64, source="test variant", notes="tiny test variant (unofficial)"))
register_card(_card(arch="hylisanet_micro", img_size=64, source="test variant", notes="tiny test variant (unofficial)"))
register_card(_card(arch="lisanet_i", ref_params=36_956_008, ref_gmacs=4.761, notes=_UNOFF))
register_card(_card(arch="lisanet_s", ref_params=34_756_328, ref_gmacs=4.204, notes=_UNOFF))
register_card(_card(arch="lisanet_b", ref_params=76_886_504, ref_gmacs=9.268, notes=_UNOFF))
register_card(_card(arch="hylisanet_s", ref_params=26_458_344, ref_gmacs=3.648, notes=_UNOFF))
register_card(_card(arch="hylisanet_b", top1=85.0, ref_params=61_928_424, ref_gmacs=8.261,
                    notes=_UNOFF + "; top-1 85.0 is the paper's published HyLiSANet-B result (target, not reproduced)"))
register_card(_card(arch="hylisanet_s_video", ref_params=59_749_928,
                    notes=_UNOFF + "; clips (3, 16, 224, 224): 31.34 GMACs (count_module_macs); Kinetics not available "
                    "offline"))
register_card(_card(arch="hylisanet_b_video", ref_params=144_353_448,
                    notes=_UNOFF + "; clips (3, 16, 224, 224): 70.46 GMACs (count_module_macs); Kinetics not available "
                    "offline"))
