"""Plain ViT / DeiT host with a pluggable attention per block.

`vit_attn_tiny/small/base` are DeiT-T/S/B with any registered mechanism (`attn="softmax"` or one name per block);
the parameter layout equals timm's `vision_transformer` so DeiT checkpoints load unchanged. `vit_attn_micro` is a
tiny variant for tests and the demo (patch 4 on 32 x 32 images).

Paper: DeiT (Touvron et al. 2021), the host of FLatten Tab. 2 and L2ViT Tab. 11.
Official: timm `vision_transformer.VisionTransformer` (key layout).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
import torch.fx
from timm.layers import DropPath, PatchEmbed, register_notrace_module, resample_abs_pos_embed, trunc_normal_
from torch import nn

from .._shapes import as_hw, known_equal
from ..attention import build_stage_attention
from ..errors import UserError
from ..layers.mlp import Mlp
from ._base import Backbone, drop_path_rates, stage_mechanisms
from ._builder import Variant, register_family

__all__ = ["VisionTransformerAttn", "Block", "vit_out_indices"]


def vit_pos_embed(x: torch.Tensor, pos: torch.Tensor, hw: tuple[int, int], grid: tuple[int, int],
                  num_prefix_tokens: int) -> torch.Tensor:
    """x + the learned position table, resampled bicubically (timm's `resample_abs_pos_embed`) when the patch grid
    hw differs from the construction grid (always while tracing with a symbolic grid: resampling to the same size is
    the identity, and a size branch would specialise the traced program)."""
    if not known_equal(hw, grid):
        pos = resample_abs_pos_embed(pos, (hw[0], hw[1]), grid, num_prefix_tokens=num_prefix_tokens)
    return x + pos


torch.fx.wrap("vit_pos_embed")


def vit_out_indices(args: dict) -> tuple[int, ...]:
    """Four evenly spaced blocks (the usual ViT feature pyramid taps)."""
    depth = args.get("depth", 12)
    return tuple(sorted({max(0, depth * (i + 1) // 4 - 1) for i in range(4)}))


class ConvStem(nn.Module):
    """Convolutional patch embedding of total stride 2: 3x3 conv (stride 1) -> BatchNorm -> GELU -> 3x3 conv
    (stride 2). (B, C_in, H, W) -> (B, C, ceil(H / 2), ceil(W / 2)).

    The "early convolutions" stem of Xiao et al., "Early Convolutions Help Transformers See Better" (arXiv
    2106.14881, Sec. 3), at stride 2: a linear 2 x 2 patch embedding gives tokens of 4 pixels each, from which a small
    ViT learns far more slowly (see subquad/configs/arena/fmnist.yaml for the measurement).
    """

    def __init__(self, in_chans: int, embed_dim: int, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.in_channels = in_chans
        hidden = max(8, embed_dim // 2)
        self.conv1 = nn.Conv2d(in_chans, hidden, 3, 1, 1, **dd)
        self.bn = nn.BatchNorm2d(hidden, **dd)
        self.act = nn.GELU()
        self.conv2 = nn.Conv2d(hidden, embed_dim, 3, 2, 1, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.act(self.bn(self.conv1(x))))


@register_notrace_module
class Block(nn.Module):
    """Pre-norm transformer block: x + attn(LN(x), hw), then x + MLP(LN(x)). x: (B, N, C).

    With `lcm_kernel_size` the block adds L2ViT's Local Concentration Module as its own residual branch after the
    attention, x + LCM(LN(x), hw), as L2ViT's LGA block does (paper Sec. 3.2, Eq. 8; official
    `classification/models/l2vit.py` `LGABlock`, keys `norm3`, `local_mp`): L2ViT defines its enhanced linear
    attention as linear attention followed by the LCM. The LCM mixes the token grid only: prefix (class) tokens
    pass it unchanged (their row of the branch is 0; our rule for L2ViT Tab. 11's DeiT, which has no official code).
    """

    def __init__(self, dim: int, num_heads: int, attn: str = "softmax", attn_kwargs: dict | None = None,
                 mlp_ratio: float = 4.0, drop_path: float = 0.0, norm_layer: type[nn.Module] = nn.LayerNorm,
                 stage: dict | None = None, lcm_kernel_size: int | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.norm1 = norm_layer(dim, **dd)
        self.attn = build_stage_attention(attn, dim, num_heads, stage or {}, attn_kwargs, **dd)
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim, **dd)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), **dd)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        if lcm_kernel_size is not None:
            from ..attention.enhanced_linear import LocalConcentrationModule

            self.norm3 = norm_layer(dim, **dd)
            self.local_mp = LocalConcentrationModule(dim, kernel_size=lcm_kernel_size, **dd)
        else:
            self.local_mp = None
        self.num_prefix_tokens = (stage or {}).get("num_prefix_tokens", 0)

    def _lcm(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """LCM branch on the patch tokens; prefix tokens get 0."""
        p = self.num_prefix_tokens
        y = self.local_mp(self.norm3(x[:, p:]), hw)
        return torch.cat([y.new_zeros(y.shape[0], p, y.shape[2]), y], 1) if p else y

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x), hw))
        if self.local_mp is not None:
            x = x + self.drop_path1(self._lcm(x, hw))
        return x + self.drop_path2(self.mlp(self.norm2(x)))


class VisionTransformerAttn(Backbone):
    """DeiT-style ViT whose blocks take any registered attention.

    Shapes: images (B, in_chans, H, W) with any H, W (padded to the patch size); tokens (B, 1 + h*w, C).

    Args:
        img_size: construction resolution (sets the learned position-embedding grid; other sizes resample it
            bicubically at run time, as timm's dynamic_img_size does).
        patch_size: patch side.
        in_chans: input channels.
        num_classes: classifier outputs (0: no head).
        global_pool: 'token' (class token), 'avg' (mean of patch tokens) or '' (the tokens unpooled).
        class_token: prepend a class token. Spatial mechanisms receive it as a prefix token (`num_prefix_tokens=1`).
        embed_dim, depth, num_heads, mlp_ratio: the usual ViT sizes.
        attn: the mechanism: a name for every block, or a sequence of `depth` names (one per block).
        attn_kwargs: options for every block's mechanism.
        drop_rate, drop_path_rate: head dropout and stochastic depth (linear rule).
        lcm_kernel_size: add L2ViT's LCM branch (k x k depthwise convs) after the attention (see `Block`); the
            class token passes it unchanged. None: no LCM.
        lcm_after: None (the LCM follows every block's attention) or a mechanism name: the LCM follows only the
            blocks of that mechanism (`l2vit_deit_tiny` sets 'enhanced_linear': L2ViT Tab. 11 with its LCM is
            `create_model("l2vit_deit_tiny", lcm_kernel_size=k)`).
        stem: 'patch' (timm's linear patch embedding, the DeiT layout) or 'conv' (`ConvStem`, patch_size 2 only).
        hints: host options for whichever block mechanism takes them (e.g. Agent-DeiT's `agent_num`); the others
            ignore them.
    """

    output_fmt = "NLC"
    norm_every_level = True
    intermediate_fmts = ("NCHW", "NLC")
    group_patterns = dict(stem=r"^cls_token|pos_embed|patch_embed",
                          blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))])
    no_decay = (r"^pos_embed$", r"^cls_token$")

    def __init__(self, img_size: int | tuple[int, int] = 224, patch_size: int = 16, in_chans: int = 3,
                 num_classes: int = 1000, global_pool: str = "token", class_token: bool = True,
                 embed_dim: int = 192, depth: int = 12, num_heads: int = 3, mlp_ratio: float = 4.0,
                 attn: str | Sequence[str] = "softmax", attn_kwargs: dict | None = None, drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, lcm_kernel_size: int | None = None, lcm_after: str | None = None,
                 stem: str = "patch", hints: dict | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if lcm_kernel_size is not None and (not isinstance(lcm_kernel_size, int) or lcm_kernel_size < 1
                                            or lcm_kernel_size % 2 == 0):
            raise UserError(f"lcm_kernel_size must be an odd int >= 1 or None (no LCM), got {lcm_kernel_size!r}")
        if stem not in ("patch", "conv"):
            raise UserError(f"stem must be 'patch' or 'conv', got {stem!r}")
        if stem == "conv" and patch_size != 2:
            raise UserError(f"stem='conv' has total stride 2 and needs patch_size=2, got {patch_size}")
        attns = stage_mechanisms("vit", attn, depth, "block")
        if lcm_after is not None and lcm_after not in attns:
            raise UserError(f"lcm_after={lcm_after!r} names no block's mechanism; the blocks use {sorted(set(attns))}")
        self.img_size = as_hw(img_size)
        self.in_chans = in_chans
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.num_prefix_tokens = 1 if class_token else 0
        self.total_stride = patch_size
        self.grad_checkpointing = False

        self.patch_embed = PatchEmbed(self.img_size, patch_size, in_chans, embed_dim, strict_img_size=False,
                                      dynamic_img_pad=True, output_fmt="NHWC", **dd)
        if stem == "conv":
            self.patch_embed.proj = ConvStem(in_chans, embed_dim, **dd)
        self.grid_size = self.patch_embed.grid_size
        self.patch_size = patch_size
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim, **dd)) if class_token else None
        num_pos = self.grid_size[0] * self.grid_size[1] + self.num_prefix_tokens
        self.pos_embed = nn.Parameter(torch.zeros(1, num_pos, embed_dim, **dd))
        dpr = drop_path_rates(drop_path_rate, [depth])[0]
        stage = dict(grid=self.grid_size, num_prefix_tokens=self.num_prefix_tokens, host="ViT blocks",
                     hints=dict(hints or {}))
        self.blocks = nn.ModuleList([Block(embed_dim, num_heads, name, attn_kwargs, mlp_ratio, dpr[i],
                                           partial(nn.LayerNorm, eps=1e-6), stage,
                                           lcm_kernel_size if lcm_after in (None, name) else None, **dd)
                                     for i, name in enumerate(attns)])
        self.attn_names = tuple(attns)
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6, **dd)
        self._init_head(num_classes, global_pool, drop_rate, **dd)
        self.feature_info = [dict(num_chs=embed_dim, reduction=patch_size, module=f"blocks.{i}") for i in range(depth)]
        self._finish_init()

    def _init_extra(self) -> None:
        trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)

    def _num_levels(self) -> int:
        return len(self.blocks)

    def _level_prefix(self, i: int) -> int:
        return self.num_prefix_tokens

    def _truncate(self, num_levels: int) -> None:
        self.blocks = self.blocks[:num_levels]

    def _embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """(B, C_in, H, W) -> tokens (B, prefix + h*w, C) and the patch grid (h, w)."""
        x = self.patch_embed(x)  # (B, h, w, C)
        B, h, w, C = x.shape
        x = x.reshape(B, h * w, C)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1)
        return vit_pos_embed(x, self.pos_embed, (h, w), self.grid_size, self.num_prefix_tokens), (h, w)

    def _forward_level(self, i: int, x: torch.Tensor, hw):
        if i == 0:
            x, hw = self._embed(x)
        return self._run(self.blocks[i], x, hw), hw


_DEIT = "DeiT paper Tab. 1 (arXiv 2012.12877); timm deit_*_patch16_224"
register_family(__name__, VisionTransformerAttn, [
    Variant("vit_attn_micro", dict(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=2, mlp_ratio=2.0),
            dict(img_size=32, source="test/demo variant (patch 4)", code="", notes="not a paper model"),
            cfg=dict(input_size=(3, 32, 32), crop_pct=1.0)),
    Variant("vit_attn_tiny", dict(patch_size=16, embed_dim=192, depth=12, num_heads=3),
            dict(params_m=5.7, gmacs=1.3, top1=72.2, ref_params=5_717_416, ref_gmacs=1.25)),
    Variant("vit_attn_small", dict(patch_size=16, embed_dim=384, depth=12, num_heads=6),
            dict(params_m=22.1, gmacs=4.6, top1=79.8, ref_params=22_050_664, ref_gmacs=4.60)),
    Variant("vit_attn_base", dict(patch_size=16, embed_dim=768, depth=12, num_heads=12),
            dict(params_m=86.6, gmacs=17.6, top1=81.8, ref_params=86_567_656, ref_gmacs=17.58)),
], cfg=dict(first_conv="patch_embed.proj", license="apache-2.0", paper_ids="arXiv:2012.12877",
            origin_url="https://github.com/facebookresearch/deit"),
    stride=lambda a: a.get("patch_size", 16), card=dict(family="vit", source=_DEIT, code="facebookresearch/deit"),
    out_indices=vit_out_indices, non_std=True)
