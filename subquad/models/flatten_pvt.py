"""FLatten-PVT (PVT v1 host with focused linear attention in every stage).

PVT v1 is not in timm, so the host is written here with the official module names (`patch_embed{i}`,
`pos_embed{i}`, `block{i}.{j}`, `head`). Each stage takes its mechanism from the tuple `stage_attn`:
`("focused_linear",) * 4` is FLatten-PVT (as released: sr 1 everywhere); `("softmax",) * 4` with the default
`sr_ratios=(8, 4, 2, 1)` is the PVT v1 spatial-reduction baseline. `flatten_pvt_micro` is a tiny variant for tests
and the demo on 32 x 32 images (patch 2, so the stage strides are 2/4/8/16).

Paper: FLatten Transformer (seed 001_95cca12290c6a157, arXiv 2308.00442), Tab. 2 (PVT rows); PVT v1 (Wang et al.
2021) for the host.
Official: LeapLabTHU/FLatten-Transformer@abdb115 `models/flatten_pvt.py` (`PyramidVisionTransformer`, `Block`).
Symbols: C_i stage width, h heads (d = C_i / h = 64), p focusing factor (3), k DWC kernel (5), sr spatial reduction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from timm.layers import DropPath, trunc_normal_
from timm.models import generate_default_cfgs, register_model
from torch import nn

from ..attention import build_attention
from ..attention.functional.focused import resize_pe
from ..errors import UserError
from ..layers.mlp import ConvMlp, Mlp
from ..layers.patch_embed import PatchEmbedLN, resize_pos_embed_2d
from ._builder import build, unwrap_state_dict
from ._card import ModelCard, register_card
from ._pyramid import PyramidBackbone

__all__ = ["FlattenPVT", "PVTBlock", "remap_official", "stage_attn_kwargs", "resize_token_grid"]


def stage_attn_kwargs(name: str, grid: tuple[int, int], qkv_bias: bool, sr_ratio: int, la_sr_ratio: int,
                      focusing_factor: int, kernel_size: int, linear_sr: bool = False, dwc_init: str = "default",
                      extra: dict | None = None) -> dict:
    """Options of a PVT-style stage for mechanism `name`.

    'focused_linear': the FLatten settings (`q`/`kv` projections, PE at the construction grid, sr = la_sr_ratio);
    'softmax': the PVT spatial-reduction attention (sr = sr_ratio); any other mechanism gets `input_size` and
    `qkv_bias`. `extra` (the host's `attn_kwargs`) overrides these.
    """
    if name == "focused_linear":
        kw = dict(input_size=grid, qkv_layout="q_kv", qkv_bias=qkv_bias, focusing_factor=focusing_factor,
                  kernel_size=kernel_size, sr_ratio=la_sr_ratio)
        if linear_sr:
            kw["linear_sr"] = True
        if dwc_init != "default":
            kw["dwc_init"] = dwc_init
    elif name == "softmax":
        kw = dict(qkv_bias=qkv_bias, input_size=grid)
        if sr_ratio > 1 or linear_sr:
            kw["sr_ratio"] = sr_ratio
        if linear_sr:
            kw["linear_sr"] = True
    else:
        kw = dict(qkv_bias=qkv_bias, input_size=grid)
    return {**kw, **(extra or {})}


class PVTBlock(nn.Module):
    """Pre-norm PVT block: x + attn(LN1(x), hw), then x + MLP(LN2(x)). x: (B, H*W, C) -> (B, H*W, C).

    Paper: PVT v1/v2 block, FLatten seed 001 Sec. 4. Official: FLatten `flatten_pvt.Block` / `flatten_pvt_v2.Block`
    (keys `norm1`, `attn`, `norm2`, `mlp.{fc1,fc2}` (+ `mlp.dwconv.dwconv` with conv_mlp)).

    Args:
        dim, num_heads, mlp_ratio: sizes.
        attn: mechanism name; attn_kwargs: its options.
        conv_mlp: PVTv2 MLP with a depthwise 3x3 conv after fc1.
        drop: MLP dropout; drop_path: stochastic depth.
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, attn: str, attn_kwargs: dict,
                 conv_mlp: bool = False, drop: float = 0.0, drop_path: float = 0.0, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.norm1 = nn.LayerNorm(dim, eps=1e-6, **dd)
        self.attn = build_attention(attn, dim, num_heads, **attn_kwargs, **dd)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6, **dd)
        hidden = int(dim * mlp_ratio)
        self.conv_mlp = conv_mlp
        self.mlp = ConvMlp(dim, hidden, drop=drop, **dd) if conv_mlp else Mlp(dim, hidden, drop=drop, **dd)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), hw))
        y = self.norm2(x)
        return x + self.drop_path(self.mlp(y, hw) if self.conv_mlp else self.mlp(y))


def _check_stages(**lists: Sequence) -> None:
    bad = {k: tuple(v) for k, v in lists.items() if len(v) != 4}
    if bad:
        raise UserError(f"PVT hosts need 4 stages; got {bad}")
    for a in lists.get("stage_attn", ()):
        if not isinstance(a, str):
            raise UserError(f"stage_attn must hold 4 mechanism names, got {tuple(lists['stage_attn'])!r}")


class FlattenPVT(PyramidBackbone):
    """PVT v1 host (FLatten layout: no cls token, no final norm), any mechanism per stage.

    Shapes: images (B, in_chans, H, W) with H, W >= 8 * patch_size; stage i tokens (B, H_i * W_i, C_i) with
    H_0 = floor(H / patch_size), H_{i+1} = floor(H_i / 2) (the official convs floor; nothing is padded).
    The learned `pos_embed{i}` (1, h_i * w_i, C_i) is bilinearly resized (align_corners False) to the runtime grid
    when it differs, as PVT's `_get_pos_embed` does.

    Paper: FLatten (seed 001) Tab. 2; PVT v1. Official: FLatten `flatten_pvt.PyramidVisionTransformer`.

    Args:
        img_size: construction resolution (sets the pos-embed and focused-attention PE grids).
        patch_size: stem patch (4; 2 in the tiny layout).
        in_chans, num_classes: input channels, classifier outputs (0: no head).
        embed_dims, num_heads, mlp_ratios, depths: per-stage sizes.
        stage_attn: mechanism per stage (e.g. ("focused_linear",) * 4 or ("softmax",) * 4).
        sr_ratios: spatial reduction of 'softmax' stages (the PVT baseline).
        la_sr_ratios: spatial reduction of 'focused_linear' stages (1 in every released model).
        focusing_factor, kernel_size: FLatten p and DWC k.
        qkv_bias: bias of the q/kv projections.
        attn_kwargs: extra options passed to every stage's mechanism.
        drop_rate, drop_path_rate: dropout (pos embed, MLP, head) and stochastic depth (linear rule).
    """

    arch_name = "flatten_pvt"

    def __init__(self, img_size: int | tuple[int, int] = 224, patch_size: int = 4, in_chans: int = 3,
                 num_classes: int = 1000, embed_dims: Sequence[int] = (64, 128, 320, 512),
                 num_heads: Sequence[int] = (1, 2, 5, 8), mlp_ratios: Sequence[float] = (8, 8, 4, 4),
                 depths: Sequence[int] = (2, 2, 2, 2),
                 stage_attn: Sequence[str] = ("focused_linear",) * 4, sr_ratios: Sequence[int] = (8, 4, 2, 1),
                 la_sr_ratios: Sequence[int] = (1, 1, 1, 1), focusing_factor: int = 3, kernel_size: int = 5,
                 qkv_bias: bool = True, attn_kwargs: dict | None = None, drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if isinstance(stage_attn, str):
            stage_attn = (stage_attn,) * 4
        _check_stages(embed_dims=embed_dims, num_heads=num_heads, mlp_ratios=mlp_ratios, depths=depths,
                      stage_attn=stage_attn, sr_ratios=sr_ratios, la_sr_ratios=la_sr_ratios)
        img_hw = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        self.in_chans = in_chans
        self.num_classes = num_classes
        self.num_stages = 4
        self.total_stride = patch_size * 8
        self.num_features = self.head_hidden_size = embed_dims[-1]
        self.stage_attn = tuple(stage_attn)
        self.grad_checkpointing = False
        dpr = torch.linspace(0, drop_path_rate, sum(depths)).tolist()
        grid = (img_hw[0] // patch_size, img_hw[1] // patch_size)
        self.grids: list[tuple[int, int]] = []
        self.feature_info = []
        cur, stride = 0, patch_size
        for i in range(4):
            if i > 0:
                grid, stride = (grid[0] // 2, grid[1] // 2), stride * 2
            self.grids.append(grid)
            p = patch_size if i == 0 else 2
            setattr(self, f"patch_embed{i + 1}",
                    PatchEmbedLN(in_chans if i == 0 else embed_dims[i - 1], embed_dims[i], p, **dd))
            setattr(self, f"pos_embed{i + 1}", nn.Parameter(torch.zeros(1, grid[0] * grid[1], embed_dims[i], **dd)))
            setattr(self, f"pos_drop{i + 1}", nn.Dropout(drop_rate))
            kw = stage_attn_kwargs(stage_attn[i], grid, qkv_bias, sr_ratios[i], la_sr_ratios[i], focusing_factor,
                                   kernel_size, extra=attn_kwargs)
            setattr(self, f"block{i + 1}", nn.ModuleList([
                PVTBlock(embed_dims[i], num_heads[i], mlp_ratios[i], stage_attn[i], kw, False, drop_rate,
                         dpr[cur + j], **dd) for j in range(depths[i])]))
            self.feature_info.append(dict(num_chs=embed_dims[i], reduction=stride, module=f"block{i + 1}"))
            cur += depths[i]
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dims[-1], num_classes, **dd) if num_classes > 0 else nn.Identity()
        if not self.pos_embed1.is_meta:
            for i in range(4):
                trunc_normal_(getattr(self, f"pos_embed{i + 1}"), std=0.02)
            self.apply(_init_pvt)

    def _forward_stage(self, i: int, x: torch.Tensor, hw: tuple[int, int] | None):
        if i > 0:
            x = x.transpose(1, 2).reshape(x.shape[0], -1, *hw)
        x, hw = getattr(self, f"patch_embed{i + 1}")(x)
        pos = resize_pos_embed_2d(getattr(self, f"pos_embed{i + 1}"), self.grids[i], hw)
        x = getattr(self, f"pos_drop{i + 1}")(x + pos)
        return self._run_blocks(getattr(self, f"block{i + 1}"), x, hw), hw

    def _truncate(self, num_stages: int) -> None:
        for i in range(num_stages, self.num_stages):
            for name in (f"patch_embed{i + 1}", f"pos_embed{i + 1}", f"pos_drop{i + 1}", f"block{i + 1}"):
                delattr(self, name)
        self.num_stages = num_stages

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Official exclusions: only `cls_token`, which FLatten-PVT does not have (so `pos_embed{i}` decay)."""
        return set()

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(stem=r"^patch_embed1|^pos_embed1",
                    blocks=[(r"^block(\d+)\.(\d+)", None), (r"^(?:patch_embed|pos_embed)(\d+)", (0,))])


def _init_pvt(m: nn.Module) -> None:
    """Official PVT v1 init: Linear trunc_normal(0.02) with zero bias, LayerNorm (1, 0); convs keep defaults."""
    if isinstance(m, nn.Linear):
        trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)


def resize_token_grid(t: torch.Tensor, dst_hw: tuple[int, int], prefix: int = 0, what: str = "tensor",
                      mode: str = "bicubic") -> torch.Tensor:
    """Resize a (1, prefix + n, C) token table from its square official grid to `dst_hw` (prefix slots kept).

    Official checkpoints are trained at square sizes, so the source side is sqrt(n) (checked exactly).
    """
    n = t.shape[1] - prefix
    side = math.isqrt(n)
    if side * side != n:
        raise UserError(f"cannot resize {what} of shape {tuple(t.shape)}: {n} grid tokens are not a square grid")
    grid = resize_pos_embed_2d(t[:, prefix:], (side, side), dst_hw, mode=mode)
    return torch.cat([t[:, :prefix], grid.to(t.dtype)], dim=1) if prefix else grid.to(t.dtype)


def _resize_tables(sd: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Resize `pos_embed{i}` / `*.attn.positional_encoding` whose token count differs from the model's.

    Targets are the model's construction grids: `model.grids[i]` for `pos_embed{i+1}` (bilinear, PVT's run-time rule)
    and the owning attention's `pe_hw` for its PE (bicubic through `resize_pe`, the FLatten loader's and the
    mechanism's run-time rule). Loading at another size therefore equals running the source model at that size.
    """
    own = model.state_dict()
    grids = getattr(model, "grids", None)
    out = {}
    for k, v in sd.items():
        if k in own and own[k].shape != v.shape and v.dim() == 3 and own[k].shape[-1] == v.shape[-1]:
            if k.startswith("pos_embed") and grids:
                v = resize_token_grid(v, grids[int(k[len("pos_embed"):]) - 1], what=k, mode="bilinear")
            elif k.endswith(".positional_encoding"):
                attn = model.get_submodule(k[: -len(".positional_encoding")])
                prefix = getattr(attn, "num_prefix_tokens", 0)
                n = v.shape[1] - prefix
                side = math.isqrt(n)
                if side * side != n:
                    raise UserError(f"cannot resize {k} of shape {tuple(v.shape)}: {n} tokens are not a square grid")
                v = resize_pe(v, (side, side), tuple(attn.pe_hw), prefix)
        out[k] = v
    return out


def remap_official(state_dict: dict[str, torch.Tensor], model: nn.Module, resize: bool = True) -> dict:
    """Official FLatten-PVT checkpoint -> our state dict.

    Unwraps `model` / `model_ema` / `state_dict`, drops the unused final `norm.*` (not built here), and, with
    `resize`, resizes `pos_embed{i}` (bilinear) and `positional_encoding` (bicubic) tables whose grid differs from
    the model's construction grid (the run-time rules, so a resized load equals running the source model there).

    Args:
        state_dict: official checkpoint (wrapped or flat).
        model: the target FlattenPVT.
        resize: resize size-bound tables to the model's construction grids.
    """
    sd = {k: v for k, v in unwrap_state_dict(state_dict).items() if k not in ("norm.weight", "norm.bias")}
    return _resize_tables(sd, model) if resize else sd


def _cfg(**kwargs) -> dict:
    return {"url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None, "crop_pct": 0.875,
            "interpolation": "bicubic", "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
            "first_conv": "patch_embed1.proj", "classifier": "head", "license": "mit",
            "origin_url": "https://github.com/LeapLabTHU/FLatten-Transformer", "paper_ids": "arXiv:2308.00442",
            **kwargs}


default_cfgs = generate_default_cfgs({
    "flatten_pvt_micro": _cfg(input_size=(3, 32, 32), crop_pct=1.0, notes="tiny test/demo variant (patch 2)"),
    "flatten_pvt_tiny.in1k": _cfg(notes="official README: FLatten-PVT-T weights (TsinghuaCloud link, 77.758 top-1)"),
    "flatten_pvt_small": _cfg(),
    "flatten_pvt_medium": _cfg(),
    "flatten_pvt_large": _cfg(),
})


def _create(variant: str, pretrained: bool = False, **kwargs) -> FlattenPVT:
    if pretrained and not kwargs.get("pretrained_cfg_overlay"):
        raise UserError(f"{variant}: no weights are bundled; pass checkpoint_path=... or "
                        "pretrained_cfg_overlay=dict(file=...)")
    return build(FlattenPVT, variant, pretrained, remap=remap_official, **kwargs)


_PVT = dict(embed_dims=(64, 128, 320, 512), num_heads=(1, 2, 5, 8), mlp_ratios=(8, 8, 4, 4))


@register_model
def flatten_pvt_micro(pretrained: bool = False, **kwargs) -> FlattenPVT:
    args = dict(img_size=32, patch_size=2, embed_dims=(32, 64, 96, 128), num_heads=(1, 2, 3, 4),
                mlp_ratios=(2, 2, 2, 2), depths=(1, 1, 1, 1))
    return _create("flatten_pvt_micro", pretrained, **{**args, **kwargs})


@register_model
def flatten_pvt_tiny(pretrained: bool = False, **kwargs) -> FlattenPVT:
    return _create("flatten_pvt_tiny", pretrained, **{**_PVT, "depths": (2, 2, 2, 2), **kwargs})


@register_model
def flatten_pvt_small(pretrained: bool = False, **kwargs) -> FlattenPVT:
    return _create("flatten_pvt_small", pretrained, **{**_PVT, "depths": (3, 4, 6, 3), **kwargs})


@register_model
def flatten_pvt_medium(pretrained: bool = False, **kwargs) -> FlattenPVT:
    return _create("flatten_pvt_medium", pretrained, **{**_PVT, "depths": (3, 4, 18, 3), **kwargs})


@register_model
def flatten_pvt_large(pretrained: bool = False, **kwargs) -> FlattenPVT:
    return _create("flatten_pvt_large", pretrained, **{**_PVT, "depths": (3, 8, 27, 3), **kwargs})


_SRC = "FLatten paper main table (arXiv 2308.00442) and official README"
_CODE = "LeapLabTHU/FLatten-Transformer"
_MEAS = ("ref_* measured from the official classes at abdb115 minus the unused final norm (2 x 512 = 1024 params, "
         "dropped here; spec flatten.md 5.2)")
register_card(ModelCard("flatten_pvt_micro", "flatten", img_size=32, source="test/demo variant (patch 2)",
                        status="official-arch", notes="not a paper model"))
register_card(ModelCard("flatten_pvt_tiny", "flatten", 224, 12.2, 2.0, 77.8, _SRC, ref_params=12_150_504 - 1024,
                        ref_gmacs=2.05, code=_CODE, notes=_MEAS))
register_card(ModelCard("flatten_pvt_small", "flatten", 224, 21.7, 4.0, 81.7, _SRC, ref_params=21_670_248 - 1024,
                        ref_gmacs=4.05, code=_CODE, notes=_MEAS))
register_card(ModelCard("flatten_pvt_medium", "flatten", 224, None, 7.0, 83.0, _SRC + " (read off Fig. 6, approx.)",
                        ref_params=37_242_216 - 1024, ref_gmacs=7.06, code=_CODE, notes=_MEAS))
register_card(ModelCard("flatten_pvt_large", "flatten", 224, None, None, None, "paper appendix only (not available)",
                        ref_params=50_649_192 - 1024, ref_gmacs=10.41, code=_CODE, notes=_MEAS))
