"""L2ViT: hierarchical backbone with alternating local-window (LWA) and linear-global (LGA) attention blocks.

`l2vit_tiny/small/base` and `l2vit_base_384` follow the official classes (same module names, so official
checkpoints load unchanged). `l2vit_micro` is a tiny variant for tests and the demo on 32 x 32 images: the stem has
stride 2 instead of 4 (its second conv keeps the resolution), so the stage strides are 2/4/8/16 and a 32 x 32 image
gives 16x16, 8x8, 4x4 and 2x2 maps; the LWA window is 4.

Paper: L2ViT (The Linear Attention Resurrection in Vision Transformer), Sec. 3 (Eqs. 5-8), Tab. 2 (variants).
Official: ChuanyangZheng/L2ViT@fad0341 `classification/models/l2vit.py` (`L2ViT`, `LWABlock`, `LGABlock`).
Symbols: C_i stage width (dims), h heads, ws LWA window side, LCM local concentration module (paper Eq. 6-7).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from timm.layers import DropPath, register_notrace_module
from torch import nn

from ..attention import build_stage_attention, get_attention_cls
from ..attention.enhanced_linear import LocalConcentrationModule
from ..errors import UserError
from ..layers.mlp import ConvMlp, Mlp
from ..layers.patch_embed import L2ViTStem, PreNormDownsample
from ..layers.pos_embed import ConvPosEnc
from ._base import Backbone, deprecated_attn_keywords, drop_path_rates, stage_mechanisms
from ._builder import Variant, register_family, unwrap_state_dict

__all__ = ["L2ViT", "LWABlock", "LGABlock", "remap_official"]


MLP_TYPES = ("plain", "pvtv2")
LGA_WINDOWS = ("lwa", "shifted")
#: L2ViT's two kinds of block and the official mechanism of each: the keys of `attn={"lwa": ..., "lga": ...}`.
BLOCK_KINDS = {"lwa": "window", "lga": "enhanced_linear"}


def block_mechanisms(attn, attn_kwargs: dict | None) -> tuple[dict[str, tuple[str, ...]], dict[str, dict | None]]:
    """L2ViT's `attn` and `attn_kwargs` per block kind: ({kind: the mechanism of each of the 4 stages},
    {kind: options}).

    `attn`: None (the official mechanisms), a name or 4 names (one per stage) for the blocks of both kinds, or a
    mapping from block kind ('lwa', 'lga') to a name or 4 names (a kind left out keeps its official mechanism).
    `attn_kwargs`: options for every block's mechanism, or a mapping from block kind to options.
    """
    if isinstance(attn, Mapping):
        unknown = sorted(set(attn) - set(BLOCK_KINDS))
        if unknown:
            raise UserError(f"l2vit: the keys of an attn= mapping are the block kinds {list(BLOCK_KINDS)}, got "
                            f"{unknown}")
        per_kind = {k: attn.get(k, official) for k, official in BLOCK_KINDS.items()}
    else:
        per_kind = {k: official if attn is None else attn for k, official in BLOCK_KINDS.items()}
    names = {k: stage_mechanisms("l2vit", a, 4) for k, a in per_kind.items()}
    options = dict(attn_kwargs or {})
    if not set(options) & set(BLOCK_KINDS):
        return names, {k: attn_kwargs for k in BLOCK_KINDS}
    if not set(options) <= set(BLOCK_KINDS):
        raise UserError(f"l2vit: attn_kwargs holds options for every block or a mapping from block kind "
                        f"{list(BLOCK_KINDS)} to options, not both: got keys {sorted(options)}")
    return names, {k: options.get(k) for k in BLOCK_KINDS}


def _check_lga_options(names: Sequence[str], lga_extra: dict, lga_window: str | None) -> None:
    """Refuse LGA ablation options (learnable_scale / clamp_min, `lga_window`) that an LGA mechanism does not take,
    instead of dropping them silently."""
    if lga_window is not None and lga_window not in LGA_WINDOWS:
        raise UserError(f"L2ViT: lga_window={lga_window!r} is not one of {LGA_WINDOWS} (or None)")
    for a in dict.fromkeys(names):
        cls = get_attention_cls(a)
        if lga_extra and any(k not in cls.stage_kwargs(lga_stage(None, lga_extra)) for k in lga_extra):
            raise UserError(f"L2ViT: learnable_scale / clamp_min are options of the LGA mechanism, which the LGA "
                            f"blocks' {a!r} does not take (the official 'enhanced_linear' does)")
        # The window facts are for a windowed mechanism: refused for one whose adapter takes no window.
        if lga_window is not None and "window_size" not in cls.stage_kwargs(lga_stage(None, {}, lga_window)):
            raise UserError(f"L2ViT: lga_window={lga_window!r} gives the LGA blocks windows, which the LGA blocks' "
                            f"{a!r} does not take (use a windowed mechanism, e.g. 'window')")


def lwa_stage(grid: tuple[int, int] | None, window_size: int) -> dict:
    """The stage facts of an LWA block for `build_stage_attention`: the official local window attention is the
    form 'lwa' (window ws, no shift, no RPB, zero-padded keys); a global mechanism ignores the window."""
    return dict(grid=grid, qkv_bias=True, window_size=window_size, form="lwa", host="L2ViT's LWA blocks")


def lga_stage(grid: tuple[int, int] | None, hints: dict | None = None, window: str | None = None,
              window_size: int = 7) -> dict:
    """The stage facts of an LGA block: `hints` are the LGA ablation options (learnable_scale, clamp_min) for a
    mechanism that takes them.

    `window` describes the LGA blocks as local blocks for a windowed mechanism (L2ViT paper Tab. 6, "Enhanced
    Swin-T" rows): None (default) gives no window facts; 'lwa' the facts of the LWA blocks (window ws, no shift, no
    RPB, zero-padded keys); 'shifted' Swin's shifted-window block (window ws, shift ws // 2, padded keys masked, the
    Swin clipping rule on small maps) without the relative position bias, whose place the block's CPE takes.
    """
    hints = dict(hints or {})
    if window == "lwa":
        return {**lwa_stage(grid, window_size), "hints": hints, "host": "L2ViT's LGA blocks"}
    if window == "shifted":
        return dict(grid=grid, qkv_bias=True, window_size=window_size, shifted=True,
                    hints={"rel_pos_bias": False, **hints}, host="L2ViT's LGA blocks")
    return dict(grid=grid, qkv_bias=True, hints=hints, host="L2ViT's LGA blocks")


def _build_mlp(dim: int, hidden: int, mlp_type: str, dd: dict) -> nn.Module:
    """'plain' (fc1 -> GELU -> fc2, every released model) or 'pvtv2' (fc1 -> depthwise 3x3 -> GELU -> fc2, the
    PVTv2 MLP of L2ViT paper Tab. 12 / Fig. 4 middle)."""
    if mlp_type == "pvtv2":
        return ConvMlp(dim, hidden, **dd)
    return Mlp(dim, hidden, **dd)


def _run_mlp(mlp: nn.Module, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    return mlp(x, hw) if isinstance(mlp, ConvMlp) else mlp(x)


@register_notrace_module
class LWABlock(nn.Module):
    """Local window attention block (two CPEs). x: (B, H*W, C) with hw -> (B, H*W, C).

    s = CPE0(x); x = s + DropPath(WindowAttn(LN1(s))); x = CPE1(x); x = x + DropPath(MLP(LN2(x))).
    The window attention zero-pads LN1(s) to multiples of ws and keeps the padded tokens as keys (no mask).

    Paper: L2ViT Sec. 3.2 (LWA). Official: L2ViT `LWABlock` (keys `cpe.{0,1}.proj`, `norm1`, `attn.{qkv,proj}`,
    `norm2`, `mlp.{fc1,fc2}`).
    """

    def __init__(self, dim: int, num_heads: int, window_size: int = 7, mlp_ratio: float = 4.0,
                 drop_path: float = 0.0, attn: str = "window", input_size: tuple[int, int] | None = None,
                 mlp_type: str = "plain", attn_kwargs: dict | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.cpe = nn.ModuleList([ConvPosEnc(dim, 3, **dd), ConvPosEnc(dim, 3, **dd)])
        self.norm1 = nn.LayerNorm(dim, **dd)
        self.attn = build_stage_attention(attn, dim, num_heads, lwa_stage(input_size, window_size), attn_kwargs,
                                          **dd)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, **dd)
        self.mlp = _build_mlp(dim, int(dim * mlp_ratio), mlp_type, dd)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        s = self.cpe[0](x, hw)
        x = s + self.drop_path(self.attn(self.norm1(s), hw))
        x = self.cpe[1](x, hw)
        return x + self.drop_path(_run_mlp(self.mlp, self.norm2(x), hw))


@register_notrace_module
class LGABlock(nn.Module):
    """Linear global attention block with LCM (one CPE). x: (B, H*W, C) with hw -> (B, H*W, C).

    x = CPE0(x); x = x + DropPath(LinearAttn(LN1(x))); x = x + DropPath(LCM(LN3(x), hw));
    x = x + DropPath(MLP(LN2(x))). `lcm_kernel_size=0` builds no LCM and no LN3 (official `enhanced=False`; the
    "without LCM" rows of L2ViT paper Tab. 6 and 12). The LCM belongs to the block, so it stays whatever `attn` is
    (e.g. window attention, Tab. 6 "Enhanced Swin-T-V2"); `window` / `window_size` are the stage's window facts
    (`lga_stage`).

    Paper: L2ViT Sec. 3.1-3.2, Eq. 8 (LGA + LCM). Official: L2ViT `LGABlock(enhanced=True)` (keys `cpe.0.proj`,
    `norm1`, `attn.{temperature,qkv,proj}`, `norm2`, `mlp`, `norm3`, `local_mp.{conv1,bn,conv2}`).
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, drop_path: float = 0.0,
                 attn: str = "enhanced_linear", lcm_kernel_size: int = 7,
                 input_size: tuple[int, int] | None = None, mlp_type: str = "plain",
                 hints: dict | None = None, window: str | None = None, window_size: int = 7,
                 attn_kwargs: dict | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.cpe = nn.ModuleList([ConvPosEnc(dim, 3, **dd)])
        self.norm1 = nn.LayerNorm(dim, **dd)
        stage = lga_stage(input_size, hints, window, window_size)
        self.attn = build_stage_attention(attn, dim, num_heads, stage, attn_kwargs, **dd)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, **dd)
        self.mlp = _build_mlp(dim, int(dim * mlp_ratio), mlp_type, dd)
        if lcm_kernel_size:
            self.norm3 = nn.LayerNorm(dim, **dd)
            self.local_mp = LocalConcentrationModule(dim, kernel_size=lcm_kernel_size, **dd)
        else:
            self.local_mp = None

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        x = self.cpe[0](x, hw)
        x = x + self.drop_path(self.attn(self.norm1(x), hw))
        if self.local_mp is not None:
            x = x + self.drop_path(self.local_mp(self.norm3(x), hw))
        return x + self.drop_path(_run_mlp(self.mlp, self.norm2(x), hw))


class L2ViT(Backbone):
    """L2ViT backbone: conv stem, 4 stages of alternating LWA (even j) / LGA (odd j) blocks, LN + mean + Linear.

    Shapes: images (B, in_chans, H, W), any H, W >= the total stride (padded internally as the official code
    does); stage i tokens (B, H_i * W_i, C_i) with H_1 = ceil(H / stem_stride) and H_{i+1} = ceil(H_i / 2).

    Paper: L2ViT paper Sec. 3.3, Tab. 2. Official: L2ViT `L2ViT` (block_type='mix_local_enhanced_vit',
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
        attn: the mechanism: None (the official 'window' in the LWA blocks, 'enhanced_linear' in the LGA blocks); a
            name, or 4 names (one per stage), for the blocks of both kinds (e.g. 'softmax' for a global baseline);
            or a mapping from block kind to a name or 4 names, e.g. `{"lga": "focused_linear"}` (a kind left out
            keeps its official mechanism).
        lcm_kernel_size: LCM depthwise kernel (7; 3 in the paper's ablation); 0 = no LCM (Tab. 6, Tab. 12).
        Ablation switches of the L2ViT paper (each off by default; the default builds the released models):
        conv_stem_type: '2L' (default, `ConvStem`), '4L' (Tab. 7, `ConvStem_4L` of the official code) or
            'patchify' (Tab. 6 "primitive L2ViT": a k = s conv as Swin, official `conv_stem=False`).
        last_proj: Linear(C_4, 1280) + ReLU on the final tokens before pooling, head from 1280 (Tab. 7; official
            `last_proj`, keys `last_proj.*`). `forward_features` stays the normed C_4 tokens; the projection is
            part of `forward_head` (so `num_features` stays C_4 and `head_hidden_size` becomes 1280).
        overlapped: 3x3 stride-2 downsampling convs (padding 1) instead of 2x2 (Tab. 7; official `overlapped`).
        learnable_scale: the per-head temperature of the enhanced linear attention (default); False uses s = 1
            (Tab. 6 "without scale parameter").
        clamp_min: the denominator clamp C_min of the enhanced linear attention (default 100; Tab. 10).
        mlp_type: 'plain' (default) or 'pvtv2' (fc1 -> depthwise 3x3 -> GELU -> fc2 in every block; Tab. 12,
            usually with `lcm_kernel_size=0`).
        lga_window: None (default) or the window facts of the LGA blocks for a windowed LGA mechanism (Tab. 6's
            "Enhanced Swin-T" rows; refused for a mechanism that takes no window): 'lwa' makes them local blocks
            like the LWA blocks (window `window_size`, no shift; with `attn={"lga": "window"}` and the LCM kept this is
            "Enhanced Swin-T-V2: linear attention replaced by window attention, with LCM"); 'shifted' makes them
            Swin's shifted-window blocks (shift `window_size` // 2) with CPE instead of the relative position bias
            (with `attn={"lga": "window"}, lcm_kernel_size=0`: "Enhanced Swin-T-V1, CPE instead of RPE").
        drop_rate: dropout before the head.
        drop_path_rate: stochastic depth, linear over all blocks.
        img_size: nominal resolution (timm's cfg); the model runs at any size.
        global_pool: 'avg' (mean of the final tokens) or '' (unpooled (B, H, W, C) features).
        attn_kwargs: extra options for every block's mechanism, or a mapping from block kind to options (e.g.
            `{"lwa": {"window_size": 8}}`).
        lwa_attn, lga_attn: deprecated spellings of `attn={"lwa": ..., "lga": ...}` (DeprecationWarning).
    """

    init_convs = "trunc_normal"
    deprecated_attn = ("lwa_attn", "lga_attn")

    group_patterns = dict(stem=r"^downsample_layers\.0", blocks=[(r"^stages\.(\d+)\.(\d+)", None),
                                                                 (r"^downsample_layers\.(\d+)", (0,)),
                                                                 (r"^norm", (99999,))])
    group_patterns_coarse = dict(stem=r"^downsample_layers\.0", blocks=r"^stages\.(\d+)")

    def __init__(self, in_chans: int = 3, num_classes: int = 1000, dims: Sequence[int] = (96, 192, 384, 768),
                 depths: Sequence[int] = (2, 2, 6, 2), num_heads: Sequence[int] = (3, 6, 12, 24),
                 mlp_ratio: float = 4.0, window_size: int = 7, stem_stride: int = 4,
                 attn: str | Sequence[str] | Mapping | None = None, lcm_kernel_size: int = 7, drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, img_size: int | tuple[int, int] = 224, global_pool: str = "avg",
                 conv_stem_type: str = "2L", last_proj: bool = False, overlapped: bool = False,
                 learnable_scale: bool = True, clamp_min: float = 100.0, mlp_type: str = "plain",
                 lga_window: str | None = None, attn_kwargs: dict | None = None, lwa_attn: str | None = None,
                 lga_attn: str | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        given = deprecated_attn_keywords("l2vit", attn, 'attn={"lwa": ..., "lga": ...}', lwa_attn=lwa_attn,
                                         lga_attn=lga_attn)
        names, options = block_mechanisms({k[:3]: v for k, v in given.items()} if given else attn, attn_kwargs)
        if not (len(dims) == len(depths) == len(num_heads) == 4):
            raise UserError(f"L2ViT needs 4 stages: got dims={tuple(dims)}, depths={tuple(depths)}, "
                            f"num_heads={tuple(num_heads)}")
        if mlp_type not in MLP_TYPES:
            raise UserError(f"L2ViT: mlp_type={mlp_type!r} is not one of {MLP_TYPES}")
        if isinstance(lcm_kernel_size, bool) or not isinstance(lcm_kernel_size, int) or lcm_kernel_size < 0 or \
                (lcm_kernel_size and lcm_kernel_size % 2 == 0):
            raise UserError(f"L2ViT: lcm_kernel_size={lcm_kernel_size!r} must be a positive odd int, or 0 for no LCM")
        # Ablation options of the LGA mechanism (L2ViT's enhanced linear attention takes them).
        lga_extra = {} if learnable_scale and clamp_min == 100.0 else dict(learnable_scale=learnable_scale,
                                                                           clamp_min=clamp_min)
        _check_lga_options(names["lga"], lga_extra, lga_window)
        self.attn_names = names
        self.in_chans = in_chans
        self.num_stages = 4
        self.total_stride = stem_stride * 8
        self.num_features = self.head_hidden_size = dims[-1]
        if last_proj:
            self.head_hidden_size = 1280
        self.grad_checkpointing = False
        img_hw = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)

        self.downsample_layers = nn.ModuleList([L2ViTStem(in_chans, dims[0], stem_stride, conv_stem_type, **dd)])
        for i in range(1, 4):
            self.downsample_layers.append(PreNormDownsample(dims[i - 1], dims[i], 2, overlapped, **dd))
        dpr = drop_path_rates(drop_path_rate, depths)
        self.stages = nn.ModuleList()
        self.feature_info = []
        stride = stem_stride
        for i in range(4):
            grid = (-(-img_hw[0] // stride), -(-img_hw[1] // stride))
            blocks = []
            for j in range(depths[i]):
                if j % 2 == 0:
                    blocks.append(LWABlock(dims[i], num_heads[i], window_size, mlp_ratio, dpr[i][j],
                                           names["lwa"][i], grid, mlp_type, options["lwa"], **dd))
                else:
                    blocks.append(LGABlock(dims[i], num_heads[i], mlp_ratio, dpr[i][j], names["lga"][i],
                                           lcm_kernel_size, grid, mlp_type, lga_extra, lga_window, window_size,
                                           options["lga"], **dd))
            self.stages.append(nn.ModuleList(blocks))
            self.feature_info.append(dict(num_chs=dims[i], reduction=stride, module=f"stages.{i}"))
            stride *= 2
        self.norm = nn.LayerNorm(dims[-1], **dd)
        if last_proj:
            self.last_proj = nn.Linear(dims[-1], 1280, **dd)
            self.last_act = nn.ReLU()
        else:
            self.last_proj = None
        self._init_head(num_classes, global_pool, drop_rate, **dd)
        self._fit_head()
        self._finish_init()

    def _fit_head(self) -> None:
        """With `last_proj` the classifier reads the 1280 projected channels."""
        if self.last_proj is not None and isinstance(self.head, nn.Linear):
            ref = self.last_proj.weight
            self.head = nn.Linear(self.head_hidden_size, self.num_classes, device=ref.device, dtype=ref.dtype)

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        super().reset_classifier(num_classes, global_pool)
        if self.last_proj is not None and isinstance(self.head, nn.Linear):
            self._fit_head()
            if not self.head.weight.is_meta:
                self._init_module(self.head)
            self.head.train(self.training)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Features (B, H, W, C_4) -> logits; with `last_proj`, Linear(C_4, 1280) + ReLU per token first (official
        order: norm, projection, ReLU, mean)."""
        if self.last_proj is not None:
            x = self.last_act(self.last_proj(x))
        return super().forward_head(x, pre_logits)

    def _forward_level(self, i: int, x: torch.Tensor, hw: tuple[int, int] | None):
        x, hw = self.downsample_layers[i](x) if i == 0 else self.downsample_layers[i](x, hw)
        return self._run_blocks(self.stages[i], x, hw), hw


    def _truncate(self, num_stages: int) -> None:
        self.downsample_layers = self.downsample_layers[:num_stages]
        self.stages = self.stages[:num_stages]
        self.num_stages = num_stages


def remap_official(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Official L2ViT checkpoint -> our state dict: the key layout is identical, so only the container is unwrapped.

    Args:
        state_dict: an official checkpoint (flat tensors or wrapped in `model` / `model_ema` / `state_dict`).
        model: the target L2ViT (unused: no key depends on it).
    """
    return dict(unwrap_state_dict(state_dict))


_REL = "https://github.com/ChuanyangZheng/L2ViT/releases/download/v1.0/"
_PAPER = "The Linear Attention Resurrection in Vision Transformer"
_SRC = f"{_PAPER} (L2ViT paper) Tab. 2/3 and the official README"
_CODE = "ChuanyangZheng/L2ViT"
_MEAS = "ref_* measured from the official classes at fad0341 (fvcore GMACs)"
_T, _B = dict(dims=(96, 192, 384, 768), num_heads=(3, 6, 12, 24)), dict(dims=(128, 256, 512, 1024),
                                                                         num_heads=(4, 8, 16, 32))


def _release(file: str, top1: float, **cfg) -> dict:
    return dict(url=_REL + file, notes=f"official release (GitHub release v1.0 of {_CODE}): {top1} top-1", **cfg)


register_family(__name__, L2ViT, [
    Variant("l2vit_micro", dict(dims=(32, 64, 96, 128), depths=(2, 2, 2, 2), num_heads=(1, 2, 3, 4), mlp_ratio=2.0,
                                window_size=4, stem_stride=2, img_size=32),
            dict(img_size=32, source="test/demo variant (stem stride 2, window 4)", notes="not a paper model"),
            cfg=dict(input_size=(3, 32, 32), crop_pct=1.0)),
    Variant("l2vit_tiny", dict(**_T, depths=(2, 2, 6, 2)),
            dict(params_m=29.0, gmacs=4.7, top1=83.1, ref_params=28_596_781, ref_gmacs=4.71),
            weights={"in1k": _release("L2ViT-Tiny-checkpoint-best-ema.pth", 83.1)}),
    Variant("l2vit_small", dict(**_T, depths=(2, 2, 18, 2)),
            dict(params_m=50.0, gmacs=9.0, top1=84.1, ref_params=50_199_157, ref_gmacs=9.02),
            weights={"in1k": _release("L2ViT-Small-checkpoint-best-ema.pth", 84.1)}),
    Variant("l2vit_base", dict(**_B, depths=(2, 2, 18, 2)),
            dict(params_m=89.0, gmacs=15.9, top1=84.4, ref_params=88_577_188, ref_gmacs=15.86,
                 notes=_MEAS + "; 86.0 top-1 with IN-22k pre-training"),
            weights={"in1k": _release("L2ViT-Base-checkpoint-best-ema.pth", 84.4),
                     "in22k_ft_in1k": _release("L2ViT-Base-22k21k-finetune-224-checkpoint-best.pth", 86.0)}),
    Variant("l2vit_base_384", dict(**_B, depths=(2, 2, 18, 2), window_size=12, img_size=384),
            dict(img_size=384, params_m=89.0, gmacs=47.5, top1=87.0, ref_params=88_577_188, ref_gmacs=47.47,
                 source=_SRC + " (IN-22k -> 1k, 384)"),
            cfg=dict(input_size=(3, 384, 384), crop_pct=1.0, crop_mode="squash"),
            weights={"in22k_ft_in1k": _release("L2ViT-Base-22k21k-finetune-384-checkpoint-best.pth", 87.0)}),
], cfg=dict(first_conv="downsample_layers.0.proj.proj.0", license="mit", origin_url="https://github.com/" + _CODE,
            paper_ids=_PAPER, paper_name=_PAPER),
    stride=lambda a: a.get("stem_stride", 4) * 8, remap=remap_official,
    card=dict(family="l2vit", source=_SRC, code=_CODE, notes=_MEAS))
