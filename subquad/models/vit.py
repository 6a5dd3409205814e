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
import torch.utils.checkpoint
from timm.layers import DropPath, PatchEmbed, resample_abs_pos_embed, trunc_normal_
from timm.models import generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from torch import nn

from .._shapes import as_hw
from ..attention import build_attention, get_attention_cls
from ..errors import UserError
from ..layers.mlp import Mlp
from ._builder import build
from ._card import ModelCard, register_card
from ._pyramid import prune_isotropic

__all__ = ["VisionTransformerAttn", "Block"]


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


def _takes_prefix_tokens(name: str) -> bool:
    """Whether mechanism `name` must be told about prefix tokens; a grid-only one without the option is refused."""
    import inspect

    cls = get_attention_cls(name)
    takes = "num_prefix_tokens" in inspect.signature(cls.__init__).parameters
    if cls.caps.needs_hw and not takes:
        raise ValueError(f"attention {name!r} mixes the token grid and cannot take a class token; build the host "
                         "with class_token=False, global_pool='avg'")
    return cls.caps.needs_hw or takes


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(LN(x), hw), then x + MLP(LN(x)). x: (B, N, C).

    With `lcm_kernel_size` the block adds L2ViT's Local Concentration Module as its own residual branch after the
    attention, x + LCM(LN(x), hw), as L2ViT's LGA block does (paper Sec. 3.2, Eq. 8; official
    `classification/models/l2vit.py` `LGABlock`, keys `norm3`, `local_mp`): L2ViT defines its enhanced linear
    attention as linear attention followed by the LCM. The LCM needs the token grid, so it refuses prefix tokens.
    """

    def __init__(self, dim: int, num_heads: int, attn: str = "softmax", attn_kwargs: dict | None = None,
                 mlp_ratio: float = 4.0, drop_path: float = 0.0, norm_layer: type[nn.Module] = nn.LayerNorm,
                 lcm_kernel_size: int | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.norm1 = norm_layer(dim, **dd)
        self.attn = build_attention(attn, dim, num_heads, **(attn_kwargs or {}), **dd)
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

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x), hw))
        if self.local_mp is not None:
            x = x + self.drop_path1(self.local_mp(self.norm3(x), hw))
        return x + self.drop_path2(self.mlp(self.norm2(x)))


class VisionTransformerAttn(nn.Module):
    """DeiT-style ViT whose blocks take any registered attention.

    Shapes: images (B, in_chans, H, W) with any H, W (padded to the patch size); tokens (B, 1 + h*w, C).

    Args:
        img_size: construction resolution (sets the learned position-embedding grid; other sizes resample it
            bicubically at run time, as timm's dynamic_img_size does).
        patch_size: patch side.
        in_chans: input channels.
        num_classes: classifier outputs (0: no head).
        global_pool: 'token' (class token) or 'avg' (mean of patch tokens).
        class_token: prepend a class token. Spatial mechanisms receive it as a prefix token (`num_prefix_tokens=1`).
        embed_dim, depth, num_heads, mlp_ratio: the usual ViT sizes.
        attn: a mechanism name for every block, or a sequence of `depth` names.
        attn_kwargs: options for every mechanism.
        lcm_kernel_size: add L2ViT's LCM branch after every attention (see `Block`); needs class_token=False.
        stem: 'patch' (timm's linear patch embedding, the DeiT layout) or 'conv' (`ConvStem`, patch_size 2 only).
        drop_rate, drop_path_rate: head dropout and stochastic depth (linear rule).
    """

    def __init__(self, img_size: int | tuple[int, int] = 224, patch_size: int = 16, in_chans: int = 3,
                 num_classes: int = 1000, global_pool: str = "token", class_token: bool = True,
                 embed_dim: int = 192, depth: int = 12, num_heads: int = 3, mlp_ratio: float = 4.0,
                 attn: str | Sequence[str] = "softmax", attn_kwargs: dict | None = None, drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, lcm_kernel_size: int | None = None, stem: str = "patch", device=None,
                 dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if global_pool not in ("token", "avg"):
            raise ValueError(f"global_pool must be 'token' or 'avg', got {global_pool!r}")
        if global_pool == "token" and not class_token:
            raise ValueError("global_pool='token' needs class_token=True")
        if lcm_kernel_size is not None and class_token:
            raise ValueError("lcm_kernel_size (L2ViT's LCM branch) mixes the token grid and cannot take a class "
                             "token; use class_token=False, global_pool='avg'")
        attns = [attn] * depth if isinstance(attn, str) else list(attn)
        if len(attns) != depth:
            raise ValueError(f"attn lists {len(attns)} mechanisms for depth={depth}")
        self.img_size = as_hw(img_size)
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.num_prefix_tokens = 1 if class_token else 0
        self.grad_checkpointing = False

        if stem not in ("patch", "conv"):
            raise ValueError(f"stem must be 'patch' or 'conv', got {stem!r}")
        if stem == "conv" and patch_size != 2:
            raise ValueError(f"stem='conv' has total stride 2 and needs patch_size=2, got {patch_size}")
        self.patch_embed = PatchEmbed(self.img_size, patch_size, in_chans, embed_dim, strict_img_size=False,
                                      dynamic_img_pad=True, output_fmt="NHWC", **dd)
        if stem == "conv":
            self.patch_embed.proj = ConvStem(in_chans, embed_dim, **dd)
        self.grid_size = self.patch_embed.grid_size
        self.patch_size = patch_size
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim, **dd)) if class_token else None
        num_pos = self.grid_size[0] * self.grid_size[1] + self.num_prefix_tokens
        self.pos_embed = nn.Parameter(torch.zeros(1, num_pos, embed_dim, **dd))
        dpr = torch.linspace(0, drop_path_rate, depth).tolist()
        blocks = []
        for i, name in enumerate(attns):
            kw = {"input_size": self.grid_size, **(attn_kwargs or {})}
            if self.num_prefix_tokens and _takes_prefix_tokens(name):
                # Every mechanism that can see the token grid is told about the class token (and refuses it at
                # build time when it cannot take one), never left to fail at the first forward.
                kw["num_prefix_tokens"] = self.num_prefix_tokens
            blocks.append(Block(embed_dim, num_heads, name, kw, mlp_ratio, dpr[i],
                                partial(nn.LayerNorm, eps=1e-6), lcm_kernel_size, **dd))
        self.blocks = nn.ModuleList(blocks)
        self.attn_names = tuple(attns)
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6, **dd)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes, **dd) if num_classes > 0 else nn.Identity()
        self.feature_info = [dict(num_chs=embed_dim, reduction=patch_size, module=f"blocks.{i}") for i in range(depth)]
        if not self.pos_embed.is_meta:
            self.init_weights()

    def init_weights(self) -> None:
        trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        self.apply(self._init_module)

    @staticmethod
    def _init_module(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {"pos_embed", "cls_token"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(stem=r"^cls_token|pos_embed|patch_embed", blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))])

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = num_classes
        if global_pool is not None:
            if global_pool not in ("token", "avg"):
                raise ValueError(f"global_pool must be 'token' or 'avg', got {global_pool!r}")
            self.global_pool = global_pool
        ref = self.pos_embed
        dd = {"device": ref.device, "dtype": ref.dtype}
        self.head = nn.Linear(self.embed_dim, num_classes, **dd) if num_classes > 0 else nn.Identity()

    def _embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """(B, C_in, H, W) -> tokens (B, prefix + h*w, C) and the patch grid (h, w)."""
        if x.dim() != 4:
            raise ValueError(f"{type(self).__name__}: expected images (B, C, H, W), got shape {tuple(x.shape)}")
        in_chans = self.patch_embed.proj.in_channels
        if x.shape[1] != in_chans:
            raise ValueError(f"{type(self).__name__}: expected {in_chans} input channels, got {x.shape[1]} "
                             f"(input shape {tuple(x.shape)})")
        if min(x.shape[-2:]) < self.patch_size:
            name = getattr(self, "pretrained_cfg", {}).get("architecture", type(self).__name__)
            raise UserError(f"{name}: image {x.shape[-2]}x{x.shape[-1]} is smaller than the model's total stride "
                            f"{self.patch_size}; use at least {self.patch_size}x{self.patch_size}")
        x = self.patch_embed(x)  # (B, h, w, C)
        B, h, w, C = x.shape
        x = x.reshape(B, h * w, C)
        pos = self.pos_embed
        if (h, w) != tuple(self.grid_size):
            pos = resample_abs_pos_embed(pos, (h, w), self.grid_size, num_prefix_tokens=self.num_prefix_tokens)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1)
        return x + pos, (h, w)

    def _run_block(self, blk: nn.Module, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        if self.grad_checkpointing and not torch.jit.is_scripting() and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(blk, x, hw, use_reentrant=False)
        return blk(x, hw)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x, hw = self._embed(x)
        for blk in self.blocks:
            x = self._run_block(blk, x, hw)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = x[:, 0] if self.global_pool == "token" else x[:, self.num_prefix_tokens:].mean(dim=1)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(self, x: torch.Tensor, indices: int | list[int] | None = None, norm: bool = False,
                              stop_early: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False):
        """Block outputs as maps (B, C, h, w) (prefix tokens dropped), as timm's ViT returns them."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take, max_index = feature_take_indices(len(self.blocks), indices)
        x, (h, w) = self._embed(x)
        intermediates = []
        blocks = self.blocks if not stop_early else self.blocks[: max_index + 1]
        for i, blk in enumerate(blocks):
            x = self._run_block(blk, x, (h, w))
            if i in take:
                y = self.norm(x) if norm else x
                y = y[:, self.num_prefix_tokens:]
                if output_fmt == "NCHW":
                    y = y.transpose(1, 2).reshape(y.shape[0], -1, h, w)
                intermediates.append(y)
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    def prune_intermediate_layers(self, indices: int | list[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        return prune_isotropic(self, indices, prune_norm, prune_head)


def _cfg(**kwargs) -> dict:
    return {"url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None, "crop_pct": 0.875,
            "interpolation": "bicubic", "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
            "first_conv": "patch_embed.proj", "classifier": "head", "license": "apache-2.0", **kwargs}


default_cfgs = generate_default_cfgs({
    "vit_attn_micro": _cfg(input_size=(3, 32, 32), crop_pct=1.0, notes="tiny test/demo variant (patch 4)"),
    "vit_attn_tiny": _cfg(paper_ids="arXiv:2012.12877", origin_url="https://github.com/facebookresearch/deit"),
    "vit_attn_small": _cfg(paper_ids="arXiv:2012.12877", origin_url="https://github.com/facebookresearch/deit"),
    "vit_attn_base": _cfg(paper_ids="arXiv:2012.12877", origin_url="https://github.com/facebookresearch/deit"),
})


def _check_out_indices(depth: int) -> tuple[int, ...]:
    """Four evenly spaced blocks (the usual ViT feature pyramid taps)."""
    return tuple(sorted({max(0, depth * (i + 1) // 4 - 1) for i in range(4)}))


def _create(variant: str, pretrained: bool = False, **kwargs) -> VisionTransformerAttn:
    depth = kwargs.get("depth", 12)
    if pretrained and not kwargs.get("pretrained_cfg_overlay"):
        raise UserError(f"{variant}: no weights are bundled; pass checkpoint_path=... or "
                        "pretrained_cfg_overlay=dict(file=...)")
    return build(VisionTransformerAttn, variant, pretrained, default_out_indices=_check_out_indices(depth), **kwargs)


@register_model
def vit_attn_micro(pretrained: bool = False, **kwargs) -> VisionTransformerAttn:
    args = dict(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=2, mlp_ratio=2.0)
    return _create("vit_attn_micro", pretrained, **{**args, **kwargs})


@register_model
def vit_attn_tiny(pretrained: bool = False, **kwargs) -> VisionTransformerAttn:
    args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3)
    return _create("vit_attn_tiny", pretrained, **{**args, **kwargs})


@register_model
def vit_attn_small(pretrained: bool = False, **kwargs) -> VisionTransformerAttn:
    args = dict(patch_size=16, embed_dim=384, depth=12, num_heads=6)
    return _create("vit_attn_small", pretrained, **{**args, **kwargs})


@register_model
def vit_attn_base(pretrained: bool = False, **kwargs) -> VisionTransformerAttn:
    args = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12)
    return _create("vit_attn_base", pretrained, **{**args, **kwargs})


_DEIT = "DeiT paper Tab. 1 (arXiv 2012.12877); timm deit_*_patch16_224"
register_card(ModelCard("vit_attn_micro", "vit", img_size=32, source="test/demo variant", status="official-arch"))
register_card(ModelCard("vit_attn_tiny", "vit", 224, 5.7, 1.3, 72.2, _DEIT, ref_params=5_717_416, ref_gmacs=1.25,
                        code="facebookresearch/deit"))
register_card(ModelCard("vit_attn_small", "vit", 224, 22.1, 4.6, 79.8, _DEIT, ref_params=22_050_664, ref_gmacs=4.60,
                        code="facebookresearch/deit"))
register_card(ModelCard("vit_attn_base", "vit", 224, 86.6, 17.6, 81.8, _DEIT, ref_params=86_567_656,
                        ref_gmacs=17.58, code="facebookresearch/deit"))
