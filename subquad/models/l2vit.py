"""L2ViT: hierarchical backbone with alternating local-window (LWA) and linear-global (LGA) attention blocks.

`l2vit_tiny/small/base` and `l2vit_base_384` follow the official classes (same module names, so official
checkpoints load unchanged). `l2vit_micro` is a tiny variant for tests and the demo on 32 x 32 images: the stem has
stride 2 instead of 4 (its second conv keeps the resolution), so the stage strides are 2/4/8/16 and a 32 x 32 image
gives 16x16, 8x8, 4x4 and 2x2 maps; the LWA window is 4.

Paper: L2ViT (seed 000_7f865064b1288925), Sec. 3 (Eqs. 5-8), Tab. 2 (variants).
Official: ChuanyangZheng/L2ViT@fad0341 `classification/models/l2vit.py` (`L2ViT`, `LWABlock`, `LGABlock`).
Symbols: C_i stage width (dims), h heads, ws LWA window side, LCM local concentration module (paper Eq. 6-7).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from timm.layers import DropPath, trunc_normal_
from timm.models import generate_default_cfgs, register_model
from torch import nn

from ..attention import build_attention
from ..attention.enhanced_linear import LocalConcentrationModule
from ..errors import UserError
from ..layers.mlp import Mlp
from ..layers.patch_embed import L2ViTStem, PreNormDownsample
from ..layers.pos_embed import ConvPosEnc
from ._builder import build, unwrap_state_dict
from ._card import ModelCard, register_card
from ._pyramid import PyramidBackbone

__all__ = ["L2ViT", "LWABlock", "LGABlock", "remap_official"]


def _attn_kwargs(name: str, window_size: int, input_size: tuple[int, int] | None) -> dict:
    """Options for the mechanism `name` in an L2ViT block (the official settings for 'window'/'enhanced_linear')."""
    if name == "window":
        return dict(window_size=window_size, shift_size=0, rel_pos_bias=False, pad_mode="zero", qkv_bias=True,
                    input_size=input_size)
    return dict(qkv_bias=True, input_size=input_size)


class LWABlock(nn.Module):
    """Local window attention block (two CPEs). x: (B, H*W, C) with hw -> (B, H*W, C).

    s = CPE0(x); x = s + DropPath(WindowAttn(LN1(s))); x = CPE1(x); x = x + DropPath(MLP(LN2(x))).
    The window attention zero-pads LN1(s) to multiples of ws and keeps the padded tokens as keys (no mask).

    Paper: L2ViT Sec. 3.2 (LWA). Official: L2ViT `LWABlock` (keys `cpe.{0,1}.proj`, `norm1`, `attn.{qkv,proj}`,
    `norm2`, `mlp.{fc1,fc2}`).
    """

    def __init__(self, dim: int, num_heads: int, window_size: int = 7, mlp_ratio: float = 4.0,
                 drop_path: float = 0.0, attn: str = "window", input_size: tuple[int, int] | None = None,
                 device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.cpe = nn.ModuleList([ConvPosEnc(dim, 3, **dd), ConvPosEnc(dim, 3, **dd)])
        self.norm1 = nn.LayerNorm(dim, **dd)
        self.attn = build_attention(attn, dim, num_heads, **_attn_kwargs(attn, window_size, input_size), **dd)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, **dd)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), **dd)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        s = self.cpe[0](x, hw)
        x = s + self.drop_path(self.attn(self.norm1(s), hw))
        x = self.cpe[1](x, hw)
        return x + self.drop_path(self.mlp(self.norm2(x)))


class LGABlock(nn.Module):
    """Linear global attention block with LCM (one CPE). x: (B, H*W, C) with hw -> (B, H*W, C).

    x = CPE0(x); x = x + DropPath(LinearAttn(LN1(x))); x = x + DropPath(LCM(LN3(x), hw));
    x = x + DropPath(MLP(LN2(x))).

    Paper: L2ViT Sec. 3.1-3.2, Eq. 8 (LGA + LCM). Official: L2ViT `LGABlock(enhanced=True)` (keys `cpe.0.proj`,
    `norm1`, `attn.{temperature,qkv,proj}`, `norm2`, `mlp`, `norm3`, `local_mp.{conv1,bn,conv2}`).
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, drop_path: float = 0.0,
                 attn: str = "enhanced_linear", lcm_kernel_size: int = 7,
                 input_size: tuple[int, int] | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.cpe = nn.ModuleList([ConvPosEnc(dim, 3, **dd)])
        self.norm1 = nn.LayerNorm(dim, **dd)
        self.attn = build_attention(attn, dim, num_heads, **_attn_kwargs(attn, 0, input_size), **dd)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, **dd)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), **dd)
        self.norm3 = nn.LayerNorm(dim, **dd)
        self.local_mp = LocalConcentrationModule(dim, kernel_size=lcm_kernel_size, **dd)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        x = self.cpe[0](x, hw)
        x = x + self.drop_path(self.attn(self.norm1(x), hw))
        x = x + self.drop_path(self.local_mp(self.norm3(x), hw))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class L2ViT(PyramidBackbone):
    """L2ViT backbone: conv stem, 4 stages of alternating LWA (even j) / LGA (odd j) blocks, LN + mean + Linear.

    Shapes: images (B, in_chans, H, W), any H, W >= the total stride (padded internally as the official code
    does); stage i tokens (B, H_i * W_i, C_i) with H_1 = ceil(H / stem_stride) and H_{i+1} = ceil(H_i / 2).

    Paper: L2ViT (seed 000) Sec. 3.3, Tab. 2. Official: L2ViT `L2ViT` (block_type='mix_local_enhanced_vit',
    conv_stem=True); keys `downsample_layers.{i}`, `stages.{i}.{j}`, `norm`, `head`.

    Args:
        in_chans: image channels.
        num_classes: classifier outputs (0: no head).
        dims: stage widths C_i.
        depths: blocks per stage (LWA at even, LGA at odd positions).
        num_heads: heads per stage.
        mlp_ratio: MLP hidden ratio.
        window_size: LWA window side ws (7; 12 for the 384 model).
        stem_stride: 4 (official) or 2 (tiny layout).
        lwa_attn: mechanism of the LWA blocks ('window' as the official code; e.g. 'softmax' for a global baseline).
        lga_attn: mechanism of the LGA blocks ('enhanced_linear' as the official code).
        lcm_kernel_size: LCM depthwise kernel (7; 3 in the paper's ablation).
        drop_rate: dropout before the head.
        drop_path_rate: stochastic depth, linear over all blocks.
        img_size: nominal resolution (timm's cfg); the model runs at any size.
    """

    arch_name = "l2vit"

    def __init__(self, in_chans: int = 3, num_classes: int = 1000, dims: Sequence[int] = (96, 192, 384, 768),
                 depths: Sequence[int] = (2, 2, 6, 2), num_heads: Sequence[int] = (3, 6, 12, 24),
                 mlp_ratio: float = 4.0, window_size: int = 7, stem_stride: int = 4, lwa_attn: str = "window",
                 lga_attn: str = "enhanced_linear", lcm_kernel_size: int = 7, drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, img_size: int | tuple[int, int] = 224, device=None,
                 dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if not (len(dims) == len(depths) == len(num_heads) == 4):
            raise UserError(f"L2ViT needs 4 stages: got dims={tuple(dims)}, depths={tuple(depths)}, "
                            f"num_heads={tuple(num_heads)}")
        self.in_chans = in_chans
        self.num_classes = num_classes
        self.num_stages = 4
        self.total_stride = stem_stride * 8
        self.num_features = self.head_hidden_size = dims[-1]
        self.grad_checkpointing = False
        img_hw = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)

        self.downsample_layers = nn.ModuleList([L2ViTStem(in_chans, dims[0], stem_stride, **dd)])
        for i in range(1, 4):
            self.downsample_layers.append(PreNormDownsample(dims[i - 1], dims[i], 2, **dd))
        dpr = torch.linspace(0, drop_path_rate, sum(depths)).tolist()
        self.stages = nn.ModuleList()
        self.feature_info = []
        cur, stride = 0, stem_stride
        for i in range(4):
            grid = (-(-img_hw[0] // stride), -(-img_hw[1] // stride))
            blocks = []
            for j in range(depths[i]):
                if j % 2 == 0:
                    blocks.append(LWABlock(dims[i], num_heads[i], window_size, mlp_ratio, dpr[cur + j], lwa_attn,
                                           grid, **dd))
                else:
                    blocks.append(LGABlock(dims[i], num_heads[i], mlp_ratio, dpr[cur + j], lga_attn,
                                           lcm_kernel_size, grid, **dd))
            self.stages.append(nn.ModuleList(blocks))
            self.feature_info.append(dict(num_chs=dims[i], reduction=stride, module=f"stages.{i}"))
            cur += depths[i]
            stride *= 2
        self.norm = nn.LayerNorm(dims[-1], **dd)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(dims[-1], num_classes, **dd) if num_classes > 0 else nn.Identity()
        if not self.norm.weight.is_meta:
            self.apply(_init_weights)

    def _forward_stage(self, i: int, x: torch.Tensor, hw: tuple[int, int] | None):
        x, hw = self.downsample_layers[i](x) if i == 0 else self.downsample_layers[i](x, hw)
        return self._run_blocks(self.stages[i], x, hw), hw

    def _final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)

    def _truncate(self, num_stages: int) -> None:
        self.downsample_layers = self.downsample_layers[:num_stages]
        self.stages = self.stages[:num_stages]
        self.num_stages = num_stages

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Official exclusions: none by name (the optimiser skips 1-D tensors and biases; `temperature` decays)."""
        return set()

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(stem=r"^downsample_layers\.0",
                    blocks=r"^stages\.(\d+)" if coarse else [(r"^stages\.(\d+)\.(\d+)", None),
                                                             (r"^downsample_layers\.(\d+)", (0,)),
                                                             (r"^norm", (99999,))])


def _init_weights(m: nn.Module) -> None:
    """Official init: trunc_normal(0.02) on every Conv2d and Linear weight, zero biases; norms keep defaults."""
    if isinstance(m, (nn.Conv2d, nn.Linear)):
        trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)


def remap_official(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Official L2ViT checkpoint -> our state dict: the key layout is identical, so only the container is unwrapped.

    Args:
        state_dict: an official checkpoint (flat tensors or wrapped in `model` / `model_ema` / `state_dict`).
        model: the target L2ViT (unused: no key depends on it).
    """
    return dict(unwrap_state_dict(state_dict))


def _cfg(**kwargs) -> dict:
    return {"url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None, "crop_pct": 0.875,
            "interpolation": "bicubic", "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
            "first_conv": "downsample_layers.0.proj.proj.0", "classifier": "head", "license": "mit",
            "origin_url": "https://github.com/ChuanyangZheng/L2ViT",
            "paper_ids": "The Linear Attention Resurrection in Vision Transformer (seed 000)", **kwargs}


_REL = "GitHub release v1.0 of ChuanyangZheng/L2ViT: "
default_cfgs = generate_default_cfgs({
    "l2vit_micro": _cfg(input_size=(3, 32, 32), crop_pct=1.0, notes="tiny test/demo variant (stem stride 2)"),
    "l2vit_tiny.in1k": _cfg(notes=_REL + "L2ViT-Tiny-checkpoint-best-ema.pth"),
    "l2vit_small.in1k": _cfg(notes=_REL + "L2ViT-Small-checkpoint-best-ema.pth"),
    "l2vit_base.in1k": _cfg(notes=_REL + "L2ViT-Base-checkpoint-best-ema.pth"),
    "l2vit_base.in22k_ft_in1k": _cfg(notes=_REL + "L2ViT-Base-22k21k-finetune-224-checkpoint-best.pth"),
    "l2vit_base_384.in22k_ft_in1k": _cfg(input_size=(3, 384, 384), crop_pct=1.0, crop_mode="squash",
                                         notes=_REL + "L2ViT-Base-22k21k-finetune-384-checkpoint-best.pth"),
})


def _create(variant: str, pretrained: bool = False, **kwargs) -> L2ViT:
    if pretrained and not kwargs.get("pretrained_cfg_overlay"):
        raise UserError(f"{variant}: no weights are bundled; pass checkpoint_path=... or "
                        "pretrained_cfg_overlay=dict(file=...)")
    return build(L2ViT, variant, pretrained, remap=remap_official, **kwargs)


@register_model
def l2vit_micro(pretrained: bool = False, **kwargs) -> L2ViT:
    args = dict(dims=(32, 64, 96, 128), depths=(2, 2, 2, 2), num_heads=(1, 2, 3, 4), mlp_ratio=2.0,
                window_size=4, stem_stride=2, img_size=32)
    return _create("l2vit_micro", pretrained, **{**args, **kwargs})


@register_model
def l2vit_tiny(pretrained: bool = False, **kwargs) -> L2ViT:
    args = dict(dims=(96, 192, 384, 768), depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))
    return _create("l2vit_tiny", pretrained, **{**args, **kwargs})


@register_model
def l2vit_small(pretrained: bool = False, **kwargs) -> L2ViT:
    args = dict(dims=(96, 192, 384, 768), depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24))
    return _create("l2vit_small", pretrained, **{**args, **kwargs})


@register_model
def l2vit_base(pretrained: bool = False, **kwargs) -> L2ViT:
    args = dict(dims=(128, 256, 512, 1024), depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32))
    return _create("l2vit_base", pretrained, **{**args, **kwargs})


@register_model
def l2vit_base_384(pretrained: bool = False, **kwargs) -> L2ViT:
    args = dict(dims=(128, 256, 512, 1024), depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32), window_size=12,
                img_size=384)
    return _create("l2vit_base_384", pretrained, **{**args, **kwargs})


_SRC = "L2ViT paper Tab. 2/3 and official README (seed 000)"
_CODE = "ChuanyangZheng/L2ViT"
_MEAS = "ref_* measured from the official classes at fad0341 (fvcore GMACs)"
register_card(ModelCard("l2vit_micro", "l2vit", img_size=32, source="test/demo variant (stem stride 2, window 4)",
                        status="official-arch", notes="not a paper model"))
register_card(ModelCard("l2vit_tiny", "l2vit", 224, 29.0, 4.7, 83.1, _SRC, ref_params=28_596_781, ref_gmacs=4.71,
                        code=_CODE, notes=_MEAS))
register_card(ModelCard("l2vit_small", "l2vit", 224, 50.0, 9.0, 84.1, _SRC, ref_params=50_199_157,
                        ref_gmacs=9.02, code=_CODE, notes=_MEAS))
register_card(ModelCard("l2vit_base", "l2vit", 224, 89.0, 15.9, 84.4, _SRC, ref_params=88_577_188,
                        ref_gmacs=15.86, code=_CODE, notes=_MEAS + "; 86.0 top-1 with IN-22k pre-training"))
register_card(ModelCard("l2vit_base_384", "l2vit", 384, 89.0, 47.5, 87.0, _SRC + " (IN-22k -> 1k, 384)",
                        ref_params=88_577_188, ref_gmacs=47.47, code=_CODE, notes=_MEAS))
