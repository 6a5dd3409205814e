"""FLatten-Swin (Swin-v1 host with focused linear attention in the early stages).

Module names follow the official file (`patch_embed`, `layers.{s}.blocks.{b}`, `layers.{s}.downsample`, `norm`,
`head`), so the official checkpoints load with an identity remap (recomputed buffers dropped). Each stage takes its
mechanism from `attn` (one name, or one per stage): the default `("focused_linear", "focused_linear", "window",
"window")` is FLatten-Swin (official `ATTN_TYPE='LLSS'`); `attn="window"` is the Swin baseline (the key layout of timm's
`swin_*` differs). Any registered mechanism may be named for a stage; it is built with `input_size` = the stage grid.

Paper: FLatten Transformer (arXiv 2308.00442), Tab. 2 (Swin rows), Tab. 6-7 (LA window,
stages); Swin (Liu et al. 2021) for the host.
Official: LeapLabTHU/FLatten-Transformer@abdb115 `models/flatten_swin.py` (`FLattenSwinTransformer`).
    Paper: FLatten blocks in the early stages / Official code: 'L' blocks run one global window (56^2 / 28^2 at 224),
    no RPB, no shift; 'S' blocks are Swin W-MSA/SW-MSA with window 7 (12 when the L window > 56), clipped to the stage
    resolution / subquad: the code (docs/deviations.md), plus explicit (H, W) with padding, masked padded keys and the
    focused PE resized at run time, so every model runs at any resolution (docs/deviations.md).
Symbols: C embed dim, w 'S' window (paper M), w_L 'L' window (`la_window`), p focusing factor (3), k DWC kernel (5).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from timm.layers import DropPath, PatchEmbed, register_notrace_module
from torch import nn

from .._shapes import as_hw, round_up, tracing
from ..attention import build_stage_attention, get_attention_cls
from ..attention.functional.window import window_geometry, window_partition, window_reverse
from ..errors import UserError
from ..layers.mlp import Mlp
from ._base import Backbone, deprecated_attn_keywords, drop_path_rates, stage_mechanisms
from ._builder import Variant, register_family, unwrap_state_dict
from ._flatten_common import FLATTEN_CARD, FLATTEN_CFG, flatten_release
from ._flatten_common import resize_token_tables as _resize_tables

__all__ = ["FlattenSwin", "SwinBlock", "PatchMerging", "remap_official"]

_DROPPED_SUFFIXES = (".relative_position_index", ".attn_mask", ".relative_coords_table")


@register_notrace_module
class SwinBlock(nn.Module):
    """Pre-norm Swin block with any mechanism: x + DropPath(attn(LN(x), hw)), then x + DropPath(MLP(LN(x))).

    Shapes: x (B, N, C) with hw=(H, W), N = H * W -> (B, N, C).

    'window' blocks pass (window, shift) to the mechanism, which pads / shifts / masks the full map itself. 'L' blocks
    ('focused_linear') are global by default; with `la_window` they reproduce the official windowed ablation: roll
    by w_L // 2 on odd blocks, partition into w_L x w_L windows **without** the shift mask (the official focused
    attention ignores it, issue #16), zero-pad maps that are not multiples of w_L **[ours]**, run the mechanism per
    window, reverse and unroll.

    Args:
        dim: channels C.
        num_heads: heads h.
        input_size: stage grid at construction (sets the 'S' clipping and the 'L' positional encoding).
        attn: mechanism name.
        window_size: 'S' window w.
        shifted: odd block of a stage (shift w // 2 for 'S'; w_L // 2 for windowed 'L' with `la_shift`).
        la_window: None (global 'L' attention) or the 'L' window w_L.
        la_shift: shift windowed 'L' blocks on odd blocks (official behaviour).
        mlp_ratio, qkv_bias, drop, drop_path: the usual block options.
        attn_kwargs: the user's mechanism options; hints: host options for whichever mechanism takes them.
    """

    def __init__(self, dim: int, num_heads: int, input_size: tuple[int, int], attn: str = "window",
                 window_size: int = 7, shifted: bool = False, la_window: int | None = None, la_shift: bool = True,
                 mlp_ratio: float = 4.0, qkv_bias: bool = True, drop: float = 0.0, drop_path: float = 0.0,
                 attn_kwargs: dict | None = None, hints: dict | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.attn_name = attn
        self.la_window = None
        self.la_shift = 0
        self.norm1 = nn.LayerNorm(dim, **dd)
        stage = dict(grid=input_size, qkv_bias=qkv_bias, proj_drop=drop, window_size=window_size, shifted=shifted,
                     hints=hints or {}, host="Swin stages")
        if la_window is not None and "window_size" not in get_attention_cls(attn).stage_kwargs(stage):
            # A global mechanism in a windowed-'L' model: the host windows it (the official ablation).
            geo = window_geometry(input_size, la_window, la_window // 2 if (shifted and la_shift) else 0)
            self.la_window, self.la_shift = geo.window, geo.shift
            stage["grid"] = (geo.window, geo.window)
        self.attn = build_stage_attention(attn, dim, num_heads, stage, attn_kwargs, **dd)
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, **dd)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop, **dd)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def _windowed_linear(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """Official windowed 'L' ablation on (B, N, C): roll, partition (no mask), attention per window, reverse."""
        B, N, C = x.shape
        H, W = hw
        geo = window_geometry(hw, self.la_window, self.la_shift)
        (Hp, Wp), w, s = geo.padded, geo.window, geo.shift
        xm = x.view(B, H, W, C)
        if (Hp, Wp) != (H, W):
            xm = F.pad(xm, (0, 0, 0, Wp - W, 0, Hp - H))
        if s:
            xm = torch.roll(xm, (-s, -s), (1, 2))
        o = window_reverse(self.attn(window_partition(xm, w), (w, w)), w, Hp, Wp)
        if s:
            o = torch.roll(o, (s, s), (1, 2))
        return o[:, :H, :W].reshape(B, N, C)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        y = self.norm1(x)
        y = self._windowed_linear(y, hw) if self.la_window is not None else self.attn(y, hw)
        x = x + self.drop_path1(y)
        return x + self.drop_path2(self.mlp(self.norm2(x)))


@register_notrace_module
class PatchMerging(nn.Module):
    """Swin patch merging: 2 x 2 gather in the order (0,0), (1,0), (0,1), (1,1), LN(4C), Linear(4C, 2C, no bias).

    Shapes: x (B, H * W, C) with hw -> (B, ceil(H / 2) * ceil(W / 2), 2C). Odd sides are zero-padded at the
    bottom/right **[ours]** (the official code asserts even sides; timm pads the same way).
    Official: FLatten `flatten_swin.PatchMerging` (`norm`, `reduction`).
    """

    def __init__(self, dim: int, device=None, dtype=None) -> None:
        super().__init__()
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False, device=device, dtype=dtype)
        self.norm = nn.LayerNorm(4 * dim, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> tuple[torch.Tensor, tuple[int, int]]:
        B, N, C = x.shape
        H, W = hw
        xm = x.view(B, H, W, C)
        ph, pw = round_up(H, 2) - H, round_up(W, 2) - W
        if tracing() or ph or pw:  # a traced program always pads (by zero at even sides): no branch on the parity
            xm = F.pad(xm, (0, 0, 0, pw, 0, ph))
        xm = torch.cat([xm[:, 0::2, 0::2], xm[:, 1::2, 0::2], xm[:, 0::2, 1::2], xm[:, 1::2, 1::2]], dim=-1)
        h2, w2 = xm.shape[1:3]
        return self.reduction(self.norm(xm.reshape(B, h2 * w2, 4 * C))), (h2, w2)


class SwinStage(nn.Module):
    """`layers.{s}`: `blocks` and the `downsample` that follows them (None in the last stage)."""

    def __init__(self, blocks: list[nn.Module], downsample: nn.Module | None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.downsample = downsample


#: FLatten-Swin's stages (official `ATTN_TYPE='LLSS'`): focused linear attention early, Swin's windows late.
_LLSS = ("focused_linear", "focused_linear", "window", "window")


class FlattenSwin(Backbone):
    """Swin-v1 host with a mechanism per stage.

    Shapes: images (B, in_chans, H, W), any H, W >= 32 (padded to the patch size); stage i tokens
    (B, H_i * W_i, C * 2^i) with H_0 = ceil(H / 4) and H_{i+1} = ceil(H_i / 2). No absolute position embedding.

    Paper: FLatten Transformer (arXiv 2308.00442) Tab. 2; Swin (arXiv 2103.14030). Official:
    LeapLabTHU/FLatten-Transformer `models/flatten_swin.py` `FLattenSwinTransformer`.

    Args:
        img_size: construction resolution (sets 'L' PE grids and 'S' clipping as the official code does).
        patch_size: patch side (4).
        in_chans, num_classes: input channels, classifier outputs (0: no head).
        embed_dim, depths, num_heads, mlp_ratio: Swin sizes.
        attn: the mechanism: a name for every stage, or one entry per stage, each a name or a tuple of one name
            per block (a stage that mixes mechanisms, as InLine-Swin-B's and Agent-Swin-B's stage 3); None:
            FLatten-Swin's ("focused_linear", "focused_linear", "window", "window"); "window" is the Swin baseline.
        window_size: 'S' window w (7; 12 for the 384 model).
        la_window: None ('L' blocks global at any resolution, the official 224/384 behaviour) or w_L for the
            windowed ablation (paper Tab. 6).
        la_shift: shift windowed 'L' blocks on odd blocks (official).
        focusing_factor, kernel_size: FLatten p and DWC k.
        qkv_bias: bias of the qkv projections.
        attn_kwargs: extra options for every stage's mechanism.
        drop_rate, drop_path_rate: dropout (MLP, head) and stochastic depth (linear over all blocks; the official
            recipes use 0.2 / 0.3 / 0.5 for T / S / B).
        global_pool: 'avg' or '' (unpooled (B, H, W, C) features).
        stage_attn: deprecated spelling of `attn` (DeprecationWarning).
        stage_hints: one dict per stage of host options for whichever stage mechanism takes them (e.g. Agent-Swin's
            per-stage `agent_num`); None: none.
    """

    init_norms = True
    deprecated_attn = ("stage_attn",)

    group_patterns = dict(stem=r"^patch_embed", blocks=[(r"^layers\.(\d+)\.downsample", (0,)),
                                                        (r"^layers\.(\d+)\.blocks\.(\d+)", None), (r"^norm", (99999,))])
    group_patterns_coarse = dict(stem=r"^patch_embed", blocks=r"^layers\.(\d+)")
    no_decay = (r"relative_position_bias_table$",)

    def __init__(self, img_size: int | tuple[int, int] = 224, patch_size: int = 4, in_chans: int = 3,
                 num_classes: int = 1000, embed_dim: int = 96, depths: Sequence[int] = (2, 2, 6, 2),
                 num_heads: Sequence[int] = (3, 6, 12, 24), mlp_ratio: float = 4.0,
                 attn: str | Sequence[str] | None = None, window_size: int = 7, la_window: int | None = None,
                 la_shift: bool = True, focusing_factor: float = 3, kernel_size: int = 5, qkv_bias: bool = True,
                 attn_kwargs: dict | None = None, drop_rate: float = 0.0, drop_path_rate: float = 0.0,
                 global_pool: str = "avg", stage_attn: Sequence[str] | None = None,
                 stage_hints: Sequence[dict] | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        attn = deprecated_attn_keywords("flatten_swin", attn, stage_attn=stage_attn).get("stage_attn", attn)
        depths, num_heads = tuple(depths), tuple(num_heads)
        if len(depths) != len(num_heads):
            raise UserError(f"flatten_swin: depths {depths} and num_heads {num_heads} must have one entry per stage")
        per_block = _per_block(attn, depths)
        if per_block:  # the stage's first block names the stage for the checks below
            attn = tuple(per_block[i][0] if i in per_block else a for i, a in enumerate(attn))
        names = stage_mechanisms("flatten_swin", _LLSS if attn is None else attn, len(depths))
        self.img_size = as_hw(img_size, "img_size")
        self.in_chans = in_chans
        self.num_stages = len(depths)
        self.attn_names = tuple(per_block.get(i, n) for i, n in enumerate(names))
        self.embed_dim = embed_dim
        self.num_features = self.head_hidden_size = embed_dim * 2 ** (self.num_stages - 1)
        self.total_stride = patch_size * 2 ** (self.num_stages - 1)
        self.grad_checkpointing = False
        self.patch_embed = PatchEmbed(self.img_size, patch_size, in_chans, embed_dim, norm_layer=nn.LayerNorm,
                                      strict_img_size=False, dynamic_img_pad=True, output_fmt="NHWC", **dd)
        grid = tuple(-(-s // patch_size) for s in self.img_size)
        dpr = drop_path_rates(drop_path_rate, depths)
        hints = dict(focusing_factor=focusing_factor, kernel_size=kernel_size)
        stages, self.feature_info = [], []
        if stage_hints is not None and len(stage_hints) != len(depths):
            raise UserError(f"flatten_swin: stage_hints needs one dict per stage ({len(depths)}), got {stage_hints!r}")
        for i, (depth, heads, attn) in enumerate(zip(depths, num_heads, names)):
            dim = embed_dim * 2 ** i
            h_i = {**hints, **(stage_hints[i] if stage_hints else {})}
            kinds = per_block.get(i, (attn,) * depth)
            blocks = [SwinBlock(dim, heads, grid, kinds[j], window_size, j % 2 == 1, la_window, la_shift, mlp_ratio,
                                qkv_bias, drop_rate, dpr[i][j], attn_kwargs, h_i, **dd)
                      for j in range(depth)]
            last = i == self.num_stages - 1
            stages.append(SwinStage(blocks, None if last else PatchMerging(dim, **dd)))
            self.feature_info.append(dict(num_chs=dim, reduction=patch_size * 2 ** i, module=f"layers.{i}"))
            grid = tuple(-(-s // 2) for s in grid)
        self.layers = nn.ModuleList(stages)
        self.norm = nn.LayerNorm(self.num_features, **dd)
        self._init_head(num_classes, global_pool, drop_rate, **dd)
        self._finish_init()

    def _forward_level(self, i: int, x: torch.Tensor, hw: tuple[int, int] | None):
        if i == 0:
            x = self.patch_embed(x)  # (B, H0, W0, C)
            B, H, W, C = x.shape
            x, hw = x.reshape(B, H * W, C), (H, W)
        else:
            x, hw = self.layers[i - 1].downsample(x, hw)
        return self._run_blocks(self.layers[i].blocks, x, hw), hw

    def _truncate(self, num_stages: int) -> None:
        self.layers = self.layers[:num_stages]
        self.layers[-1].downsample = None
        self.num_stages = num_stages

    @torch.jit.ignore
    def no_weight_decay_keywords(self) -> set[str]:
        """The official keyword rule (`absolute_pos_embed` is absent; `scale` and `positional_encoding` decay)."""
        return {"relative_position_bias_table"}



def _per_block(attn, depths: tuple[int, ...]) -> dict[int, tuple[str, ...]]:
    """The stages of `attn` given as one mechanism name per block (a tuple inside the per-stage sequence, e.g.
    InLine-Swin-B's and Agent-Swin-B's stage 3), checked: `depths[i]` names, each a string."""
    if not isinstance(attn, (list, tuple)) or len(attn) != len(depths):
        return {}
    out = {}
    for i, a in enumerate(attn):
        if isinstance(a, (list, tuple)):
            if len(a) != depths[i] or not all(isinstance(n, str) for n in a):
                raise UserError(f"flatten_swin: attn for stage {i} takes a name or {depths[i]} names (one per "
                                f"block), got {a!r}")
            out[i] = tuple(a)
    return out


def _resize_rpb(sd: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Bicubic resize of `relative_position_bias_table` ((2w'-1)^2, h) to the model's ((2w-1)^2, h), as the
    official Swin fine-tuning loader does."""
    own = model.state_dict()
    out = {}
    for k, v in sd.items():
        if k.endswith("relative_position_bias_table") and k in own and own[k].shape != v.shape \
                and v.shape[1] == own[k].shape[1]:
            s_old, s_new = round(v.shape[0] ** 0.5), round(own[k].shape[0] ** 0.5)
            if s_old * s_old != v.shape[0]:
                raise UserError(f"cannot resize {k} of shape {tuple(v.shape)}: not a square table")
            t = v.t().reshape(1, -1, s_old, s_old).float()
            t = F.interpolate(t, size=(s_new, s_new), mode="bicubic", align_corners=False)
            v = t.reshape(-1, s_new * s_new).t().to(v.dtype)
        out[k] = v
    return out


def remap_official(state_dict: dict[str, torch.Tensor], model: nn.Module, resize: bool = True) -> dict:
    """Official FLatten-Swin checkpoint -> our state dict (identical names).

    Unwraps `model` / `model_ema` / `state_dict`, drops the recomputed buffers (`relative_position_index`,
    `attn_mask`) and, with `resize`, bicubic-resizes `positional_encoding` and `relative_position_bias_table` whose
    size differs from the model's construction size (the official fine-tuning loader's rule).

    Args:
        state_dict: official checkpoint (wrapped or flat).
        model: the target FlattenSwin.
        resize: resize size-bound tables to the model's construction sizes.
    """
    sd = {k: v for k, v in unwrap_state_dict(state_dict).items() if not k.endswith(_DROPPED_SUFFIXES)}
    return _resize_rpb(_resize_tables(sd, model), model) if resize else sd


_T = dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24))
_S = dict(embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24))
_B = dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32))
register_family(__name__, FlattenSwin, [
    Variant("flatten_swin_micro", dict(img_size=64, embed_dim=32, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8),
                                       mlp_ratio=2.0, window_size=3),
            dict(img_size=64, source="test/demo variant (stage grids 16/8/4/2, 'S' window 3: padded, shifted, "
                                     "masked)", notes="not a paper model"),
            cfg=dict(input_size=(3, 64, 64), crop_pct=1.0)),
    Variant("flatten_swin_tiny", _T,
            dict(params_m=29.0, gmacs=4.5, top1=82.1, ref_params=29_192_384, ref_gmacs=4.50,
                 source=FLATTEN_CARD["source"] + " (README eval 82.106)"),
            weights={"in1k": flatten_release("e1518e76703e4e57a7f2", 82.1)}),
    Variant("flatten_swin_small", _S,
            dict(params_m=51.0, gmacs=8.7, top1=83.5, ref_params=50_510_288, ref_gmacs=8.76),
            weights={"in1k": flatten_release("94188e52af354bf4a88b", 83.5)}),
    Variant("flatten_swin_base", _B,
            dict(params_m=89.0, gmacs=15.4, top1=83.8, ref_params=88_972_488, ref_gmacs=15.46),
            weights={"in1k": flatten_release("7a9e5186bad04e7fb3a9", 83.8)}),
    Variant("flatten_swin_base_384", dict(**_B, img_size=384, window_size=12),
            dict(img_size=384, params_m=91.0, gmacs=46.5, top1=85.0, ref_params=91_433_928, ref_gmacs=46.49),
            cfg=dict(input_size=(3, 384, 384), crop_pct=1.0),
            weights={"in1k": flatten_release("0d0330cf2e5249f1abb6", 85.0)}),
], cfg=dict(first_conv="patch_embed.proj", **FLATTEN_CFG), stride=lambda a: 32, remap=remap_official,
    card=FLATTEN_CARD)
