"""FLatten-CSwin (CSwin host with global focused linear attention in the early stages).

Module names follow the official file (`stage1_conv_embed.{0,2}`, `stage{i}.{j}.{norm1, qkv, attns, proj, norm2,
mlp}`, `merge{i}.{conv, norm}`, `norm`, `head`), so the official checkpoints load with an identity remap. Each stage
takes its mechanism from `attn` (one name, or one per stage): the default `("focused_linear", "focused_linear",
"cswin", "cswin")` is FLatten-CSwin (official `ATTN_TYPE='LLSS'`); `attn="cswin"` is the CSwin baseline with
FLatten's depths.

Paper: FLatten Transformer (arXiv 2308.00442), Tab. 2 (CSwin rows); CSwin (Dong et al.
2022) for the host.
Official: LeapLabTHU/FLatten-Transformer@abdb115 `models/flatten_cswin.py` (`CSWinTransformer`, `CSWinBlock`,
    `LePEAttention`, `FocusedLinearAttention`, `Merge_Block`).
    Paper: FLatten blocks in the early stages / Official code: 'L' blocks use a split equal to the stage resolution,
    i.e. one global branch with all heads, focused linear attention + DWC + LePE; T/B depths changed to [2, 4, 18, 1]
    / [3, 6, 29, 2] / subquad: the code (docs/deviations.md), with explicit (H, W), padded and masked 'S' stripes and
    the
    focused PE resized at run time, so every model runs at any resolution (docs/deviations.md).
Symbols: C embed dim, sw stripe width (paper sw, `split_size`), p focusing factor (3), k DWC kernel (5).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from timm.layers import DropPath, register_notrace_module
from torch import nn

from .._shapes import as_hw, map_to_tokens, tokens_to_map
from ..attention import build_stage_attention, get_attention_form
from ..errors import UserError
from ..layers.mlp import Mlp
from ._base import Backbone, deprecated_attn_keywords, drop_path_rates, stage_mechanisms
from ._builder import Variant, register_family, unwrap_state_dict
from ._flatten_common import FLATTEN_CARD, FLATTEN_CFG, flatten_release
from ._flatten_common import resize_token_tables as _resize_tables

__all__ = ["FlattenCSWin", "CSWinBlock", "MergeBlock", "remap_official"]

@register_notrace_module
class CSWinBlock(nn.Module):
    """CSwin block: x + DropPath(proj(attention(qkv(LN(x))))), then x + DropPath(MLP(LN(x))).

    Shapes: x (B, N, C) with hw=(H, W), N = H * W -> (B, N, C).

    The block owns `qkv` and `proj`; its token mixer is the stage mechanism's "host_qkv" form (built through the
    registry, called as `forward_qkv(q, k, v, hw)`), kept at `attns`: 'cswin' runs two stripe branches (`attns.0`
    vertical, `attns.1` horizontal, h / 2 heads each) or, in the last stage / when the construction grid equals
    (sw, sw), one global branch (the official rule); 'focused_linear' runs one FocusedLinearCore (LePE on) over the
    whole map at `attns.0`. Any mechanism with a "host_qkv" form can run here.

    Args:
        dim: channels C.
        num_heads: heads h.
        input_size: stage grid at construction (sizes the 'L' PE; the official single-branch rule).
        attn: a mechanism with a "host_qkv" form ('focused_linear', 'cswin', ...).
        split_size: 'S' stripe width sw.
        last_stage: one global 'S' branch.
        mlp_ratio, qkv_bias, drop, drop_path: the usual block options.
        attn_kwargs: the user's mechanism options; hints: host options for whichever mechanism takes them (p, k).
    """

    def __init__(self, dim: int, num_heads: int, input_size: tuple[int, int], attn: str = "cswin",
                 split_size: int = 7, last_stage: bool = False, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 drop: float = 0.0, drop_path: float = 0.0, attn_kwargs: dict | None = None,
                 hints: dict | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.norm1 = nn.LayerNorm(dim, **dd)
        # CSwin's stage facts: stripe width, last stage, LePE on the values (every official CSwin attention has it)
        stage = dict(grid=input_size, hints={**(hints or {}), "split_size": split_size, "last_stage": last_stage,
                                             "lepe": True})
        mixer = build_stage_attention(attn, dim, num_heads, stage, attn_kwargs, host_qkv=True, **dd)
        # a ModuleList form (CSwin's branches) is `attns` itself; a single module sits at `attns.0` (official keys)
        self.attns = mixer if isinstance(mixer, nn.ModuleList) else nn.ModuleList([mixer])
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop, **dd)
        self.norm2 = nn.LayerNorm(dim, **dd)

    @property
    def mixer(self) -> nn.Module:
        """The stage mechanism's module (`attns` itself or `attns.0`)."""
        return self.attns if hasattr(self.attns, "forward_qkv") else self.attns[0]

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        B, N, C = x.shape
        h = self.norm1(x)
        qkv = self.qkv(h).view(B, N, 3, C)
        y = self.mixer.forward_qkv(*qkv.unbind(2), hw, x=h)
        x = x + self.drop_path(self.proj_drop(self.proj(y)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


@register_notrace_module
class MergeBlock(nn.Module):
    """`merge{i}`: Conv2d(C, C_out, 3, stride 2, padding 1) on the map, then LN. (B, H*W, C) -> (B, H'*W', C_out)
    with H' = ceil(H / 2). Official: FLatten `flatten_cswin.Merge_Block`."""

    def __init__(self, dim: int, dim_out: int, device=None, dtype=None) -> None:
        super().__init__()
        self.conv = nn.Conv2d(dim, dim_out, 3, 2, 1, device=device, dtype=dtype)
        self.norm = nn.LayerNorm(dim_out, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> tuple[torch.Tensor, tuple[int, int]]:
        y = self.conv(tokens_to_map(x, hw))
        return self.norm(map_to_tokens(y)), tuple(y.shape[-2:])


class _ToTokens(nn.Module):
    """(B, C, H, W) -> (B, H*W, C): the parameter-free middle of `stage1_conv_embed` (official einops Rearrange)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return map_to_tokens(x)


#: FLatten-CSwin's stages (official `ATTN_TYPE='LLSS'`): focused linear attention early, CSwin's stripes late.
_LLSS = ("focused_linear", "focused_linear", "cswin", "cswin")


class FlattenCSWin(Backbone):
    """CSwin host with a mechanism per stage ('focused_linear' or 'cswin').

    Shapes: images (B, in_chans, H, W), any H, W >= 32; stage-1 grid H_0 = floor((H - 3) / 4) + 1 (conv 7, stride 4,
    padding 2), then H_{i+1} = ceil(H_i / 2); tokens (B, H_i * W_i, C * 2^i).

    Paper: FLatten Transformer (arXiv 2308.00442) Tab. 2; CSWin (arXiv 2107.00652). Official:
    LeapLabTHU/FLatten-Transformer `models/flatten_cswin.py` `CSWinTransformer`.

    Args:
        img_size: construction resolution (sets the 'L' PE grids and the single-branch rule).
        in_chans, num_classes: input channels, classifier outputs (0: no head).
        embed_dim, depths, num_heads, mlp_ratio: CSwin sizes.
        attn: the mechanism: a name for every stage, or one name per stage, each with a "host_qkv" form (the
            block projects q, k, v); None: FLatten-CSwin's ("focused_linear", "focused_linear", "cswin", "cswin");
            "cswin" is the CSwin baseline.
        split_size: 'S' stripe width per stage ([1, 2, 7, 7] at 224, [1, 2, 12, 12] at 384).
        focusing_factor, kernel_size: FLatten p and DWC k.
        qkv_bias: bias of the block qkv projections.
        attn_kwargs: extra options for every stage's mechanism.
        drop_rate, drop_path_rate: dropout (MLP, head) and stochastic depth (linear over all blocks; the official
            recipes use 0.2 / 0.4 / 0.5 for T / S / B).
        global_pool: 'avg' or '' (unpooled (B, H, W, C) features).
        stage_attn: deprecated spelling of `attn` (DeprecationWarning).
        stage_hints: one dict per stage of host options for whichever stage mechanism takes them (e.g.
            Agent-CSwin's per-stage `agent_num`); None: none.
    """

    init_norms = True
    deprecated_attn = ("stage_attn",)

    group_patterns = dict(stem=r"^stage1_conv_embed",
                          blocks=[(r"^stage(\d+)\.(\d+)", None), (r"^merge(\d+)", (0,)), (r"^norm", (99999,))])

    def __init__(self, img_size: int | tuple[int, int] = 224, in_chans: int = 3, num_classes: int = 1000,
                 embed_dim: int = 64, depths: Sequence[int] = (2, 4, 18, 1), num_heads: Sequence[int] = (2, 4, 8, 16),
                 mlp_ratio: float = 4.0,
                 attn: str | Sequence[str] | None = None, split_size: Sequence[int] = (1, 2, 7, 7),
                 focusing_factor: float = 3, kernel_size: int = 5, qkv_bias: bool = True,
                 attn_kwargs: dict | None = None, drop_rate: float = 0.0, drop_path_rate: float = 0.0,
                 global_pool: str = "avg", stage_attn: Sequence[str] | None = None,
                 stage_hints: Sequence[dict] | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        attn = deprecated_attn_keywords("flatten_cswin", attn, stage_attn=stage_attn).get("stage_attn", attn)
        depths, num_heads, split_size = tuple(depths), tuple(num_heads), tuple(split_size)
        if not (len(depths) == len(num_heads) == len(split_size)):
            raise UserError(f"flatten_cswin: depths {depths}, num_heads {num_heads} and split_size {split_size} "
                            "must have one entry per stage")
        names = stage_mechanisms("flatten_cswin", _LLSS if attn is None else attn, len(depths))
        if stage_hints is not None and len(stage_hints) != len(depths):
            raise UserError(f"flatten_cswin: stage_hints needs one dict per stage ({len(depths)}), got {stage_hints!r}")
        for a in dict.fromkeys(names):
            try:  # the block projects q, k, v itself: a mechanism needs a "host_qkv" form
                get_attention_form(a, "host_qkv")
            except UserError as e:
                raise UserError(f"flatten_cswin: {e}") from None
        self.img_size = as_hw(img_size, "img_size")
        self.in_chans = in_chans
        self.num_stages = len(depths)
        self.attn_names = names
        self.num_features = self.head_hidden_size = embed_dim * 2 ** (self.num_stages - 1)
        self.total_stride = 4 * 2 ** (self.num_stages - 1)
        self.grad_checkpointing = False
        self.stage1_conv_embed = nn.Sequential(nn.Conv2d(in_chans, embed_dim, 7, 4, 2, **dd), _ToTokens(),
                                               nn.LayerNorm(embed_dim, **dd))
        grid = tuple((s - 3) // 4 + 1 for s in self.img_size)
        dpr = drop_path_rates(drop_path_rate, depths)
        self.feature_info = []
        hints = dict(focusing_factor=focusing_factor, kernel_size=kernel_size)
        for i in range(self.num_stages):
            dim = embed_dim * 2 ** i
            if i > 0:
                setattr(self, f"merge{i}", MergeBlock(dim // 2, dim, **dd))
                grid = tuple(-(-s // 2) for s in grid)
            h_i = {**hints, **(stage_hints[i] if stage_hints else {})}
            blocks = [CSWinBlock(dim, num_heads[i], grid, names[i], split_size[i], i == self.num_stages - 1,
                                 mlp_ratio, qkv_bias, drop_rate, dpr[i][j], attn_kwargs, h_i, **dd)
                      for j in range(depths[i])]
            setattr(self, f"stage{i + 1}", nn.ModuleList(blocks))
            self.feature_info.append(dict(num_chs=dim, reduction=4 * 2 ** i, module=f"stage{i + 1}"))
        self.norm = nn.LayerNorm(self.num_features, **dd)
        self._init_head(num_classes, global_pool, drop_rate, **dd)
        self._finish_init()

    def _forward_level(self, i: int, x: torch.Tensor, hw: tuple[int, int] | None):
        if i == 0:
            conv, to_tokens, norm = self.stage1_conv_embed
            y = conv(x)
            x, hw = norm(to_tokens(y)), (y.shape[-2], y.shape[-1])
        else:
            x, hw = getattr(self, f"merge{i}")(x, hw)
        return self._run_blocks(getattr(self, f"stage{i + 1}"), x, hw), hw

    def _truncate(self, num_stages: int) -> None:
        for i in range(num_stages, self.num_stages):
            delattr(self, f"stage{i + 1}")
            delattr(self, f"merge{i}")
        self.num_stages = num_stages



def remap_official(state_dict: dict[str, torch.Tensor], model: nn.Module, resize: bool = True) -> dict:
    """Official FLatten-CSwin checkpoint -> our state dict (identical names).

    Unwraps `model` / `model_ema` / `state_dict` / `state_dict_ema` and, with `resize`, bicubic-resizes
    `positional_encoding` tables whose grid differs from the model's construction grid (the official loader's rule).

    Args:
        state_dict: official checkpoint (wrapped or flat).
        model: the target FlattenCSWin.
        resize: resize size-bound tables to the model's construction grids.
    """
    sd = dict(unwrap_state_dict(state_dict))
    return _resize_tables(sd, model) if resize else sd


register_family(__name__, FlattenCSWin, [
    Variant("flatten_cswin_micro", dict(img_size=64, embed_dim=32, depths=(1, 1, 2, 1), num_heads=(2, 2, 4, 8),
                                        mlp_ratio=2.0, split_size=(1, 2, 3, 3)),
            dict(img_size=64, source="test/demo variant (stage grids 16/8/4/2, 'S' stripes of width 3 in stage 3: "
                                     "padded, masked)", notes="not a paper model"),
            cfg=dict(input_size=(3, 64, 64), crop_pct=1.0)),
    Variant("flatten_cswin_tiny", dict(embed_dim=64, depths=(2, 4, 18, 1), num_heads=(2, 4, 8, 16)),
            dict(params_m=21.0, gmacs=4.3, top1=83.1, ref_params=21_201_768, ref_gmacs=4.34,
                 source=FLATTEN_CARD["source"] + " (README eval 83.130)"),
            weights={"in1k": flatten_release("48ba765ba8b0451d9d5a", 83.1)}),
    Variant("flatten_cswin_small", dict(embed_dim=64, depths=(2, 4, 32, 2), num_heads=(2, 4, 8, 16)),
            dict(params_m=35.0, gmacs=6.9, top1=83.8, ref_params=35_451_752, ref_gmacs=6.81)),
    Variant("flatten_cswin_base", dict(embed_dim=96, depths=(3, 6, 29, 2), num_heads=(4, 8, 16, 32)),
            dict(params_m=75.0, gmacs=15.0, top1=84.5, ref_params=74_867_032, ref_gmacs=14.96)),
    Variant("flatten_cswin_base_384", dict(img_size=384, embed_dim=96, depths=(3, 6, 29, 2), num_heads=(4, 8, 16, 32),
                                           split_size=(1, 2, 12, 12)),
            dict(img_size=384, params_m=78.0, gmacs=46.4, top1=85.5, ref_params=78_369_112, ref_gmacs=46.43),
            cfg=dict(input_size=(3, 384, 384), crop_pct=1.0)),
], cfg=dict(first_conv="stage1_conv_embed.0", crop_pct=0.9, **FLATTEN_CFG), stride=lambda a: 32,
    remap=remap_official, card=FLATTEN_CARD)
