"""LiSANet / HyLiSANet backbones (image and video) built on LiSA structure-aware attention.

**Unofficial configurations** (docs/deviations.md): LiSA has no released code and the paper's Tab. 2 is not
available in a usable form, so every depth, width, head count and stem here is our choice, not the paper's Tab. 2.
The cards keep the paper's published accuracy only as a target; nothing produced here is a reproduction.

- `lisanet_i`: isotropic, patch 16, 14 x 14 tokens at every depth, D = 16.
- `lisanet_s/b`: 4 stages of LiSA blocks (56^2, 28^2, 14^2, 7^2 tokens at 224).
- `hylisanet_s/b`: depthwise-conv blocks in stages 1-2, LiSA blocks in stages 3-4.
- `hylisanet_s/b_video`: the hybrids on (B, 3, T, H, W) clips: Conv3d stem (3, 4, 4)/(2, 4, 4), later downsampling
  (1, 2, 2), 3-D LiSA over T x H x W; `inflate_image_weights` builds their weights from the image models.
- `lisanet_micro`, `hylisanet_micro`: tiny variants for tests.

Paper: LiSA (arXiv 2211.16289), Sec. 3-4; blocks ours (docs/deviations.md).
Official: none published.
Symbols: D structural-pattern size; C stage width; h = C / 64 heads (at least 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.fx
import torch.utils.checkpoint
from timm.layers import DropPath, register_notrace_module
from torch import nn

from .._shapes import as_hw, pad_to_multiple
from ..attention import build_stage_attention
from ..attention.functional.structure_aware import inflate_kernel, resize_kernel
from ..errors import UserError
from ..layers.conv_blocks import ConvMlp3d, ConvPosEnc3d, DWConvBlock, LayerNormChannels, conv_nd
from ..layers.mlp import ConvMlp
from ..layers.pos_embed import ConvPosEnc
from ._base import Backbone, drop_path_rates, stage_mechanisms, tokens_to_nchw
from ._builder import Variant, register_family

__all__ = ["LiSANet", "LiSANetIsotropic", "LiSABlock", "inflate_image_weights", "remap_checkpoint"]

_STAGE_TYPES = ("lisa", "conv")


@register_notrace_module
class LiSABlock(nn.Module):
    """LiSA block: x <- x + CPE(x); x <- x + DropPath(LiSA(LN(x))); x <- x + DropPath(ConvMLP(LN(x))).

    Shapes: x (B, N, C) with grid (H, W) or (T, H, W) (video) -> (B, N, C). Keys `cpe.proj, norm1, attn.*, norm2,
    mlp.{fc1, dwconv.dwconv, fc2}`. `attn` is any registered mechanism that fits the grid (LiSA by default, which
    takes `D` from the stage hints); a spatial one must declare the grid's rank (`AttentionCaps.grid_ndims`).
    """

    def __init__(self, dim: int, num_heads: int, D: int, input_size: Sequence[int], mlp_ratio: float = 4.0,
                 drop_path: float = 0.0, attn_kwargs: dict | None = None, attn: str = "structure_aware",
                 device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        video = len(input_size) == 3
        self.cpe = ConvPosEnc3d(dim, **dd) if video else ConvPosEnc(dim, **dd)
        self.norm1 = nn.LayerNorm(dim, eps=1e-6, **dd)
        stage = dict(grid=tuple(input_size), hints=dict(D=D), host="LiSANet's attention blocks")
        self.attn = build_stage_attention(attn, dim, num_heads, stage, attn_kwargs, **dd)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6, **dd)
        hidden = int(dim * mlp_ratio)
        self.mlp = ConvMlp3d(dim, hidden, **dd) if video else ConvMlp(dim, hidden, **dd)

    def forward(self, x: torch.Tensor, grid: tuple[int, ...]) -> torch.Tensor:
        x = self.cpe(x, grid)
        x = x + self.drop_path(self.attn(self.norm1(x), grid))
        return x + self.drop_path(self.mlp(self.norm2(x), grid))


@register_notrace_module
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
        sh, sw = self.stride[-2:]
        x, _ = pad_to_multiple(x, (sh, sw))  # the last two dims: an image (B, C, H, W) or a clip (B, C, T, H, W)
        return self.norm(self.proj(x))


@register_notrace_module
class LiSAStage(nn.Module):
    """One stage: optional downsample, then blocks (LiSA blocks on tokens, or depthwise-conv blocks on the map).

    Shapes: x (B, C_in, *spatial) -> (B, C, *spatial') channels-first.
    """

    def __init__(self, in_dim: int, dim: int, depth: int, stage_type: str, num_heads: int, D: int,
                 input_size: Sequence[int], downsample: bool, video: bool, mlp_ratio: float,
                 drop_path: Sequence[float], attn_kwargs: dict | None, attn: str = "structure_aware", device=None,
                 dtype=None) -> None:
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
            blocks = [LiSABlock(dim, num_heads, D, input_size, mlp_ratio, drop_path[j], attn_kwargs, attn, **dd)
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


def lisa_to_tokens(x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
    """Map (B, C, H, W) -> tokens (B, H*W, C) and the grid (H, W)."""
    return x.flatten(2).transpose(1, 2), (x.shape[-2], x.shape[-1])


def as_clip(x: torch.Tensor) -> torch.Tensor:
    """A video model's input: clips (B, C, T, H, W) as they are, an image (B, C, H, W) as a one-frame clip."""
    return x.unsqueeze(2) if x.dim() == 4 else x


def as_input_map(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A video model's map y (B, C, T', H', W') for its input x: (B, C, H', W') when x was an image (a one-frame
    clip leaves T' = 1), so that an image in gives an image-shaped map out (timm's image-model contract: features
    (B, C, H', W') with H' x W' = the cfg's `pool_size`)."""
    return y.squeeze(2) if x.dim() == 4 else y


torch.fx.wrap("lisa_to_tokens")
torch.fx.wrap("as_clip")
torch.fx.wrap("as_input_map")


class _LiSAHost(Backbone):
    """Shared parts of both LiSANet hosts: channels-first features, the official-style init and cfg patterns."""

    init_convs = "fan_out"
    init_norms = True

    output_fmt = "NCHW"


    def _init_extra(self) -> None:
        # LiSA kernels keep their own init after the generic Linear/Conv rule.
        for m in self.modules():
            if hasattr(m, "kernel_a") and hasattr(m, "reset_parameters"):
                m.reset_parameters()


class LiSANet(_LiSAHost):
    """Hierarchical LiSANet / HyLiSANet (image or video), 4 stages, strides 4, 8, 16, 32.

    Shapes: images (B, in_chans, H, W) (any H, W: padded to the stride), or with `video=True` clips
    (B, in_chans, T, H, W) (T tokens = ceil(T / 2) after the stem). Stage outputs are channels-first maps.

    Args:
        img_size: construction resolution; LiSA kernels are sized for its token grids (img_size / 4, /8, ...)
            and resampled at run time for other sizes (`StructureAwareAttention`, 'pad' rule).
        in_chans, num_classes, global_pool ('avg', or '' for the unpooled map).
        embed_dims, depths: per-stage width and depth.
        stage_types: per stage 'lisa' or 'conv' (depthwise-conv blocks).
        num_heads: per stage (ignored for 'conv'); default C / 64.
        D: structural-pattern size of every LiSA block.
        mlp_ratio, drop_rate, drop_path_rate: the usual (linear stochastic-depth rule).
        video, num_frames: 3-D form and the clip length the kernels are sized for.
        attn_kwargs: extra mechanism options for every attention block.
        attn: the mechanism: a name for every stage, or 4 names (one per stage; a 'conv' stage's entry is not
            used): 'structure_aware' (LiSA, default) or any registered mechanism whose capabilities fit the stage
            grids (2-D, or 3-D with `video`). The softmax rungs of LiSA
            Tab. 3(b): 'softmax' (SA without RPE); 'window' with `attn_kwargs=dict(window_size=S,
            clip_window=False)`, S >= the largest grid side (SA with RPE: one window over the whole grid, padded
            keys masked, Swin's relative position bias).
    """

    group_patterns = dict(stem=r"^patch_embed", blocks=[(r"^stages\.(\d+)\.downsample", (0,)),
                                                        (r"^stages\.(\d+)\.blocks\.(\d+)", None),
                                                        (r"^norm", (99999,))])
    group_patterns_coarse = dict(stem=r"^patch_embed", blocks=r"^stages\.(\d+)")

    def __init__(self, img_size: int | tuple[int, int] = 224, in_chans: int = 3, num_classes: int = 1000,
                 global_pool: str = "avg", embed_dims: Sequence[int] = (64, 128, 320, 512),
                 depths: Sequence[int] = (3, 4, 8, 3), stage_types: Sequence[str] = ("lisa",) * 4,
                 num_heads: Sequence[int] | None = None, D: int = 8, mlp_ratio: float = 4.0, drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, video: bool = False, num_frames: int = 16,
                 attn_kwargs: dict | None = None, attn: str | Sequence[str] = "structure_aware", device=None,
                 dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if not (len(embed_dims) == len(depths) == len(stage_types) == 4):
            raise ValueError(f"need 4 stages: embed_dims={embed_dims}, depths={depths}, stage_types={stage_types}")
        self.attn_names = stage_mechanisms("lisanet", attn, 4)
        if not isinstance(D, int) or D < 1:
            raise ValueError(f"D (structural-pattern size) must be an int >= 1, got {D!r}")
        num_heads = tuple(num_heads) if num_heads is not None else tuple(_heads(c) for c in embed_dims)
        self.img_size = as_hw(img_size)
        self.in_chans = in_chans
        self.video = video
        self.input_ndim = 5 if video else 4
        self.total_stride = 32
        self.num_frames = num_frames
        self.num_features = self.head_hidden_size = embed_dims[-1]
        self.grad_checkpointing = False
        if video:
            self.patch_embed = _Embed(in_chans, embed_dims[0], (3, 4, 4), (2, 4, 4), (1, 0, 0), **dd)
            t_tokens = (num_frames + 1) // 2
        else:
            self.patch_embed = _Embed(in_chans, embed_dims[0], (4, 4), (4, 4), (0, 0), **dd)
        dpr = drop_path_rates(drop_path_rate, depths)
        stages, in_dim = [], embed_dims[0]
        self.feature_info = []
        for s in range(4):
            red = 4 * 2 ** s
            grid = (math.ceil(self.img_size[0] / red), math.ceil(self.img_size[1] / red))
            if video:
                grid = (t_tokens, *grid)
            stages.append(LiSAStage(in_dim, embed_dims[s], depths[s], stage_types[s], num_heads[s], D, grid,
                                    downsample=s > 0, video=video, mlp_ratio=mlp_ratio,
                                    drop_path=dpr[s], attn_kwargs=attn_kwargs, attn=self.attn_names[s], **dd))
            in_dim = embed_dims[s]
            self.feature_info.append(dict(num_chs=embed_dims[s], reduction=red, module=f"stages.{s}"))
        self.stages = nn.ModuleList(stages)
        self.num_stages = 4
        self.norm = LayerNormChannels(self.num_features, eps=1e-6, **dd)
        self._init_head(num_classes, global_pool, drop_rate, **dd)
        self._finish_init()

    def _num_levels(self) -> int:
        return len(self.stages)

    def _forward_level(self, i: int, x: torch.Tensor, hw):
        if i == 0:
            x = self.patch_embed(as_clip(x) if self.video else x)
        return self.stages[i](x), None

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H', W') for images; a video model gives (B, C, T', H', W') for clips (B, C, T, H, W) and, for an
        image (a one-frame clip), the image-shaped (B, C, H', W')."""
        y = super().forward_features(x)
        return as_input_map(y, x) if self.video else y

    def forward_intermediates(self, x: torch.Tensor, *args, **kwargs):
        """As `Backbone.forward_intermediates`; a video model's maps are image-shaped for an image input."""
        out = super().forward_intermediates(x, *args, **kwargs)
        if not self.video:
            return out
        if isinstance(out, list):
            return [as_input_map(t, x) for t in out]
        final, inter = out
        return as_input_map(final, x), [as_input_map(t, x) for t in inter]

    def _level_map(self, i: int, x: torch.Tensor, hw, fmt: str) -> torch.Tensor:
        return x

    def _truncate(self, num_levels: int) -> None:
        self.stages = self.stages[:num_levels]


class LiSANetIsotropic(_LiSAHost):
    """Isotropic LiSANet-I: patch 16 (Conv 16x16/16 + LN), `depth` LiSA blocks at one token grid, LN, mean, head.

    Shapes: images (B, in_chans, H, W) (padded to the patch size) -> logits (B, num_classes); blocks see tokens
    (B, h*w, C). Keys `patch_embed.{proj, norm}`, `blocks.{j}.*`, `norm`, `head`.

    Args:
        img_size: construction resolution (kernels sized for img_size / patch_size tokens).
        patch_size, in_chans, num_classes, global_pool ('avg').
        embed_dim, depth, num_heads, D, mlp_ratio, drop_rate, drop_path_rate: the usual; D = 16 for LiSANet-I.
        attn_kwargs: extra mechanism options.
        attn: the mechanism: a name for every block, or `depth` names (one per block): 'structure_aware' (LiSA,
            default) or any registered mechanism that fits; LiSA
            Tab. 3(b)'s softmax rungs: 'softmax' (SA), and 'window' with `attn_kwargs=dict(window_size=S,
            clip_window=False)`, S >= the grid's larger side (SA with RPE; see `LiSANet`).
    """

    video = False
    norm_every_level = True
    group_patterns = dict(stem=r"^patch_embed", blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))])

    def __init__(self, img_size: int | tuple[int, int] = 224, patch_size: int = 16, in_chans: int = 3,
                 num_classes: int = 1000, global_pool: str = "avg", embed_dim: int = 384, depth: int = 12,
                 num_heads: int = 6, D: int = 16, mlp_ratio: float = 4.0, drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, attn_kwargs: dict | None = None,
                 attn: str | Sequence[str] = "structure_aware", device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.attn_names = stage_mechanisms("lisanet_i", attn, depth, "block")
        self.img_size = as_hw(img_size)
        self.in_chans = in_chans
        self.total_stride = patch_size
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.grad_checkpointing = False
        self.patch_embed = _Embed(in_chans, embed_dim, (patch_size,) * 2, (patch_size,) * 2, (0, 0), **dd)
        grid = (math.ceil(self.img_size[0] / patch_size), math.ceil(self.img_size[1] / patch_size))
        dpr = drop_path_rates(drop_path_rate, [depth])[0]
        self.blocks = nn.ModuleList([LiSABlock(embed_dim, num_heads, D, grid, mlp_ratio, dpr[j], attn_kwargs, name,
                                               **dd) for j, name in enumerate(self.attn_names)])
        self.norm = LayerNormChannels(embed_dim, eps=1e-6, **dd)
        self._init_head(num_classes, global_pool, drop_rate, **dd)
        self.feature_info = [dict(num_chs=embed_dim, reduction=patch_size, module=f"blocks.{i}")
                             for i in range(depth)]
        self._finish_init()

    def _num_levels(self) -> int:
        return len(self.blocks)

    def _forward_level(self, i: int, x: torch.Tensor, hw):
        if i == 0:
            x, hw = lisa_to_tokens(self.patch_embed(x))
        return self._run(self.blocks[i], x, hw), hw

    def _final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The channels LayerNorm of the map, applied to tokens (B, N, C)."""
        return nn.LayerNorm.forward(self.norm, x) if isinstance(self.norm, nn.LayerNorm) else self.norm(x)

    def _finish(self, x: torch.Tensor, hw) -> torch.Tensor:
        return tokens_to_nchw(self._final_norm(x), hw)

    def _truncate(self, num_levels: int) -> None:
        self.blocks = self.blocks[:num_levels]


def inflate_image_weights(image_state: dict[str, torch.Tensor], video_model: nn.Module,
                          mode: str = "center") -> dict[str, torch.Tensor]:
    """Inflate a 2-D LiSANet/HyLiSANet state dict into the matching video model's state dict.

    Rules ('center'; docs/deviations.md): a conv kernel (O, I, kh, kw) becomes (O, I, kt, kh, kw) with the 2-D kernel at
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
    grid with `resize_kernel(..., 'pad')`, the rule the module applies at run time: a model built at
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


_PAPER = "Lightweight Structure-Aware Attention for Visual Understanding (LiSA, arXiv 2211.16289)"
_UNOFF = ("unofficial configuration (see docs/deviations.md); not the paper's Tab. 2. Params exact for this "
          "definition; GMACs at 224 from subquad.count_macs (FFTs and complex products counted, kernel FFTs included "
          "as in a first forward)")
_CFG = dict(first_conv="patch_embed.proj", license="apache-2.0", paper_ids="arXiv:2211.16289",
            origin_url="https://arxiv.org/abs/2211.16289",
            notes="unofficial configuration; LiSA has no released code or weights")
_CARD = dict(family="lisa", source=_PAPER + "; configuration ours", status="unofficial", code="", notes=_UNOFF)
_HIER_S = dict(embed_dims=(64, 128, 320, 512), depths=(3, 4, 8, 3), D=8)
_HIER_B = dict(embed_dims=(64, 128, 320, 512), depths=(5, 8, 20, 7), D=8)
_HYBRID = ("conv", "conv", "lisa", "lisa")
_MICRO = dict(img_size=64, embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 2), D=2,
              mlp_ratio=2.0)
_TINY = dict(img_size=64, source="test variant", notes="tiny test variant (unofficial)")
register_family(__name__, LiSANet, [
    Variant("lisanet_micro", _MICRO, _TINY, cfg=dict(input_size=(3, 64, 64), crop_pct=1.0)),
    Variant("hylisanet_micro", dict(_MICRO, stage_types=_HYBRID), _TINY, cfg=dict(input_size=(3, 64, 64),
                                                                                   crop_pct=1.0)),
    Variant("lisanet_s", _HIER_S, dict(ref_params=34_756_328, ref_gmacs=4.204)),
    Variant("lisanet_b", _HIER_B, dict(ref_params=76_886_504, ref_gmacs=9.268)),
    Variant("hylisanet_s", dict(_HIER_S, stage_types=_HYBRID), dict(ref_params=26_458_344, ref_gmacs=3.648)),
    Variant("hylisanet_b", dict(_HIER_B, stage_types=_HYBRID),
            dict(top1=85.0, ref_params=61_928_424, ref_gmacs=8.261,
                 notes=_UNOFF + "; top-1 85.0 is the paper's published HyLiSANet-B result (target, not reproduced)")),
], cfg=_CFG, stride=lambda a: 32, remap=remap_checkpoint, card=_CARD)
register_family(__name__, LiSANetIsotropic, [
    Variant("lisanet_i", dict(patch_size=16, embed_dim=384, depth=12, num_heads=6, D=16),
            dict(ref_params=36_956_008, ref_gmacs=4.761)),
], cfg=_CFG, stride=lambda a: a.get("patch_size", 16), remap=remap_checkpoint, card=_CARD,
    out_indices=lambda a: tuple(sorted({max(0, a.get("depth", 12) * (i + 1) // 4 - 1) for i in range(4)})))
# timm's cfg holds (C, H, W) only: the clips are (B, 3, 16, 224, 224); an image (B, 3, H, W) is a one-frame clip.
_VIDEO = dict(crop_pct=1.0, notes="unofficial configuration; video clips (B, 3, 16, 224, 224) (an image is a "
                                  "one-frame clip); no released weights")
register_family(__name__, LiSANet, [
    Variant("hylisanet_micro_video", dict(_MICRO, img_size=32, stage_types=_HYBRID, video=True, num_frames=8),
            dict(_TINY, img_size=32), cfg=dict(_VIDEO, input_size=(3, 32, 32))),
    Variant("hylisanet_s_video", dict(_HIER_S, stage_types=_HYBRID, video=True, num_frames=16),
            dict(ref_params=59_749_928, notes=_UNOFF + "; clips (3, 16, 224, 224): 31.34 GMACs (count_module_macs); "
                                                       "Kinetics not available offline"), cfg=_VIDEO),
    Variant("hylisanet_b_video", dict(_HIER_B, stage_types=_HYBRID, video=True, num_frames=16),
            dict(ref_params=144_353_448, notes=_UNOFF + "; clips (3, 16, 224, 224): 70.46 GMACs "
                                                        "(count_module_macs); Kinetics not available offline"),
            cfg=_VIDEO),
], cfg=_CFG, stride=lambda a: 32, remap=remap_checkpoint, card=_CARD)
