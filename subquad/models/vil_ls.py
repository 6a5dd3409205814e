"""ViL-LS: the multi-scale ViL host of Transformer-LS (long-short attention in stages 1-2, full attention in 3-4).

Four stages, each: a per-stage patch embedding (conv p x p stride p, LayerNorm `norm_embed`, a fresh class token when
the stage has one), then alternating attention blocks (LN -> attention -> DropPath residual) and MLP blocks
(LN -> MLP -> DropPath residual) as separate sequence items. The class token is discarded at every stage boundary.
Stages 1-2 use "long_short" attention (2-D form, ViL relative-position bias on the window logits); stages 3-4 use
full softmax attention with the ViL relative-position tables (local table over the whole stage map plus
global-to-local / global-to-global biases). Head: final LN, then the class token (or the mean of the tokens when the
last stage has none, as in every released model), then Linear.

Any input size works: the image is padded to the patch size at each embedding, long-short attention pads and masks
its tiles, and the full-attention tables are resized bicubically to the stage grid at run time [ours,
docs/deviations.md; the official loader resizes a mismatched table bilinearly and the official model asserts its size].

`vil_medium` / `vil_base` are the same host with full attention in every stage (the papers' softmax baselines;
not the Vision Longformer attention of the original ViL).

Paper: Transformer-LS (arXiv 2107.02192), Sec. 4.3 and Table 5 (ViL-LS-Medium / Base).
Official: NVIDIA/transformer-ls `imagenet/models/msvit.py` MsViT, `imagenet/models/layers/{transformer_ls,
full_attention}.py` (key layout kept: `layer{s}.0.{proj, norm_embed, cls_token}`, `layer{s}.{2j+1}.{norm, attn}`,
`layer{s}.{2j+2}.{norm, mlp.fc1, mlp.fc2}`, `norm`, `head`).
Symbols: w window/tile size (official arch `f`), r projection rank (arch `r`), p patch size (arch `p`), g global
tokens (arch `g`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from timm.layers import DropPath, register_notrace_module, trunc_normal_
from torch import nn

from .._shapes import as_hw, known_equal, merge_heads, split_packed_heads
from ..attention import build_stage_attention, list_attention
from ..attention.functional.softmax import softmax_attention, softmax_attention_ref
from ..errors import UserError
from ..layers.mlp import Mlp
from ._base import Backbone, deprecated_attn_keywords, drop_path_rates, stage_mechanisms, tokens_to_nchw
from ._builder import Variant, register_family

__all__ = ["ViLLS", "ViLFullAttention", "remap_official"]

_OFFICIAL_NO_DECAY = ("pos_embed", "cls_token", "norm.weight", "norm.bias", "norm_embed", "head.bias",
                      "relative_position")


def _vil_rel_index(hw: tuple[int, int], device=None) -> torch.Tensor:
    """(HW, HW) index into a ((2H - 1)(2W - 1)) table: (dy + H - 1)(2W - 1) + (dx + W - 1) (official)."""
    H, W = hw
    # Row and column of every token from one arange (repeat / repeat_interleave by a symbolic count export to
    # ONNX with the example's lengths).
    t = torch.arange(H * W, device=device)
    ys = t // W
    xs = t - ys * W
    return (ys[:, None] - ys[None, :] + H - 1) * (2 * W - 1) + (xs[:, None] - xs[None, :] + W - 1)


def resize_rel_table(table: torch.Tensor, src: tuple[int, int], dst: tuple[int, int]) -> torch.Tensor:
    """Bicubic resize of a ((2H - 1)(2W - 1), h) ViL table from grid `src` to grid `dst` [ours; docs/deviations.md]."""
    # known_equal: a traced (symbolic) grid always takes the resize, which is exact at equal sizes (bicubic at
    # scale 1 samples the grid points), so one program serves every size without a guard on the grid.
    if known_equal(tuple(src), tuple(dst)):
        return table
    (H, W), (H2, W2) = src, dst
    h = table.shape[1]
    t = table.transpose(0, 1).reshape(1, h, 2 * H - 1, 2 * W - 1)
    t = F.interpolate(t, size=(2 * H2 - 1, 2 * W2 - 1), mode="bicubic", align_corners=False)
    return t.reshape(h, -1).transpose(0, 1)


@register_notrace_module
class ViLFullAttention(nn.Module):
    """ViL full attention with relative-position biases (stages 3-4 of ViL-LS), through SDPA.

    Shapes: x (B, g + H*W, C) with hw = (H, W) -> (B, g + H*W, C).
    Official: `imagenet/models/layers/full_attention.py` Attention (keys `qkv`, `proj`,
    `local_relative_position_bias_table` ((2H-1)(2W-1), h), `g2l_relative_position_bias` (2, h, g),
    `g2g_relative_position_bias` (h, g, g)).

    Args:
        dim, num_heads: C and h. input_size: (H, W) the tables are built for. nglo: global tokens g.
        qkv_bias: bias on qkv. attn_drop, proj_drop: dropout. fused: SDPA (True) or the dense reference.
    """

    def __init__(self, dim: int, num_heads: int, input_size: tuple[int, int], nglo: int = 1, qkv_bias: bool = True,
                 attn_drop: float = 0.0, proj_drop: float = 0.0, fused: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.dim, self.num_heads, self.nglo, self.fused = dim, num_heads, nglo, fused
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.input_size = as_hw(input_size, "input_size")
        H, W = self.input_size
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self.local_relative_position_bias_table = nn.Parameter(torch.zeros((2 * H - 1) * (2 * W - 1), num_heads, **dd))
        if nglo >= 1:
            self.g2l_relative_position_bias = nn.Parameter(torch.zeros(2, num_heads, nglo, **dd))
            self.g2g_relative_position_bias = nn.Parameter(torch.zeros(num_heads, nglo, nglo, **dd))
        if not self.qkv.weight.is_meta:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Official init of the bias tables: trunc_normal(0.02) (the Linear layers keep the host's init)."""
        for p in self.parameters():
            if p.dim() >= 2 and p is not self.qkv.weight and p is not self.proj.weight:
                trunc_normal_(p, std=0.02)

    def bias(self, hw: tuple[int, int]) -> torch.Tensor:
        """(h, N, N) relative-position bias at grid hw (table resized when hw differs from input_size)."""
        table = resize_rel_table(self.local_relative_position_bias_table, self.input_size, hw)
        idx = _vil_rel_index(hw, table.device)
        n = hw[0] * hw[1]
        local = table[idx.reshape(-1)].reshape(n, n, -1).permute(2, 0, 1)  # (h, n, n)
        if self.nglo == 0:
            return local
        g2g, g2l = self.g2g_relative_position_bias, self.g2l_relative_position_bias
        top = torch.cat([g2g, g2l[0].unsqueeze(-1).expand(-1, -1, n)], dim=-1)  # (h, g, g + n)
        bottom = torch.cat([g2l[1].unsqueeze(1).expand(-1, n, -1), local], dim=-1)  # (h, n, g + n)
        return torch.cat([top, bottom], dim=1)

    def _qkv(self, x: torch.Tensor):
        return split_packed_heads(self.qkv(x), 3, self.num_heads)  # (B, h, N, d) each

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        q, k, v = self._qkv(x)
        bias = self.bias(hw)[None]
        if self.fused and not (self.training and self.attn_drop > 0):
            o = softmax_attention(q, k, v, self.scale, None, bias)
        else:
            o = softmax_attention_ref(q, k, v, self.scale, None, bias)
        return self.proj_drop(self.proj(merge_heads(o)))


@register_notrace_module
class PatchEmbed(nn.Module):
    """Conv p x p stride p (input padded to a multiple of p), LN `norm_embed`, optional class token.

    Shapes: (B, C_in, H, W) -> tokens (B, g + h*w, C) and (h, w). Official: msvit.PatchEmbed (keys `proj`,
    `norm_embed`, `cls_token`)."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int, nglo: int = 1, device=None,
                 dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, **dd)
        self.norm_embed = nn.LayerNorm(embed_dim, eps=1e-6, **dd)
        self.cls_token = nn.Parameter(torch.zeros(1, nglo, embed_dim, **dd)) if nglo else None
        if self.cls_token is not None and not self.cls_token.is_meta:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.cls_token is not None:
            trunc_normal_(self.cls_token, std=0.02)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        p = self.patch_size
        H, W = x.shape[-2:]
        x = F.pad(x, (0, (-W) % p, 0, (-H) % p))
        x = self.proj(x)
        hw = (x.shape[-2], x.shape[-1])
        x = self.norm_embed(x.flatten(2).transpose(1, 2))
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return x, hw


@register_notrace_module
class AttnBlock(nn.Module):
    """x + DropPath(attn(LN(x), hw)). Official: msvit.AttnBlock (keys `norm`, `attn`)."""

    def __init__(self, dim: int, attn: nn.Module, drop_path: float, device=None, dtype=None) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-6, device=device, dtype=dtype)
        self.attn = attn
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        return x + self.drop_path(self.attn(self.norm(x), hw))


@register_notrace_module
class MlpBlock(nn.Module):
    """x + DropPath(MLP(LN(x))), MLP ratio 4 with GELU. Official: msvit.MlpBlock (keys `norm`, `mlp.fc1/fc2`)."""

    def __init__(self, dim: int, mlp_ratio: float, drop: float, drop_path: float, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.norm = nn.LayerNorm(dim, eps=1e-6, **dd)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=drop, **dd)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        return x + self.drop_path(self.mlp(self.norm(x)))


#: The host's own token mixers (by `attn` entry); every other entry is built through the attention registry.
HOST_ATTN = {"full": ViLFullAttention}
#: ViL-LS: long-short attention in the first two stages, ViL's full attention in the last two.
_LS = ("long_short", "long_short", "full", "full")


class ViLLS(Backbone):
    """ViL-LS / ViL host (MsViT) with per-stage attention.

    Shapes: images (B, in_chans, H, W), any H and W -> logits (B, num_classes); stage maps NCHW at strides
    patch_sizes cumulative (4, 8, 16, 32).

    Args:
        img_size: construction resolution (sizes the full-attention tables).
        in_chans, num_classes: input channels, classifier outputs (0: no head).
        embed_dims, depths, num_heads, patch_sizes, nglos: per stage C, blocks, h, p, global tokens g.
        attn: the mechanism: a name for every stage, or one name per stage, each a registered mechanism (built by
            `build_stage_attention` from the stage facts: grid, window, global tokens) or "full" (ViL's full
            attention, the host's own); None: ViL-LS's ("long_short", "long_short", "full", "full").
        window_sizes, ranks: per stage w and r of the long-short stages.
        mlp_ratio, qkv_bias, drop_rate, attn_drop_rate, drop_path_rate: the usual; drop path is linear over all
            blocks (the attention and MLP block of one block share a rate).
        global_pool: 'auto' (the class token when the last stage has one, else the mean), 'token', 'avg' or ''.
        attn_kwargs: extra options for the mechanism of every registered-mechanism stage (not the "full" ones).
        stage_attn: deprecated spelling of `attn` (DeprecationWarning).
    """

    deprecated_attn = ("stage_attn",)

    init_norms = True

    group_patterns = dict(stem=r"^layer1\.0\.", blocks=[(r"^layer(\d+)\.(\d+)", None), (r"^norm", (99999,))])
    no_decay = ("pos_embed", "cls_token", r"norm\.weight", r"norm\.bias", "norm_embed", r"head\.bias",
                "relative_position")

    def __init__(self, img_size: int | tuple[int, int] = 224, in_chans: int = 3, num_classes: int = 1000,
                 embed_dims: Sequence[int] = (96, 192, 384, 768), depths: Sequence[int] = (1, 4, 16, 1),
                 num_heads: Sequence[int] = (3, 3, 6, 12), patch_sizes: Sequence[int] = (4, 2, 2, 2),
                 nglos: Sequence[int] = (1, 1, 1, 0), attn: str | Sequence[str] | None = None,
                 window_sizes: Sequence[int] = (7, 7, 7, 7), ranks: Sequence[int] = (8, 8, 8, 8),
                 mlp_ratio: float = 4.0, qkv_bias: bool = True, drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, global_pool: str = "auto", attn_kwargs: dict | None = None,
                 stage_attn: Sequence[str] | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        attn = deprecated_attn_keywords("vil_ls", attn, stage_attn=stage_attn).get("stage_attn", attn)
        n = len(depths)
        for name, seq in (("embed_dims", embed_dims), ("num_heads", num_heads), ("patch_sizes", patch_sizes),
                          ("nglos", nglos), ("window_sizes", window_sizes), ("ranks", ranks)):
            if len(seq) != n:
                raise ValueError(f"ViLLS: {name} has {len(seq)} entries for {n} stages")
        names = stage_mechanisms("vil_ls", _LS if attn is None else attn, n)
        for a in names:
            if a not in HOST_ATTN and a not in list_attention():
                raise UserError(f"vil_ls: attn entry {a!r} is neither the host's {sorted(HOST_ATTN)} nor a "
                                f"registered mechanism ({', '.join(list_attention())})")
        self.img_size = as_hw(img_size)
        self.in_chans = in_chans
        self.nglos = tuple(nglos)
        self.attn_names = names
        self.num_prefix_tokens = nglos[-1]
        self.output_fmt = "NLC" if nglos[-1] else "NHWC"
        self.total_stride = math.prod(patch_sizes)
        self.num_features = self.head_hidden_size = embed_dims[-1]
        self.grad_checkpointing = False
        dpr = drop_path_rates(drop_path_rate, depths)
        H, W = self.img_size
        in_dim, stride = in_chans, 1
        self.feature_info = []
        for s in range(n):
            p = patch_sizes[s]
            H, W, stride = math.ceil(H / p), math.ceil(W / p), stride * p
            dim = embed_dims[s]
            layers: list[nn.Module] = [PatchEmbed(p, in_dim, dim, nglos[s], **dd)]
            for rate in dpr[s]:
                if names[s] in HOST_ATTN:
                    attn = HOST_ATTN[names[s]](dim, num_heads[s], (H, W), nglos[s], qkv_bias, attn_drop_rate,
                                               drop_rate, **dd)
                else:
                    stage = dict(grid=(H, W), window_size=window_sizes[s], num_prefix_tokens=nglos[s],
                                 qkv_bias=qkv_bias, proj_drop=drop_rate,
                                 hints=dict(rank=ranks[s], rpe=True, attn_drop=attn_drop_rate))
                    attn = build_stage_attention(names[s], dim, num_heads[s], stage, attn_kwargs, **dd)
                layers.append(AttnBlock(dim, attn, rate, **dd))
                layers.append(MlpBlock(dim, mlp_ratio, drop_rate, rate, **dd))
            self.add_module(f"layer{s + 1}", nn.Sequential(*layers))
            self.feature_info.append(dict(num_chs=dim, reduction=stride, module=f"layer{s + 1}"))
            in_dim = dim
        self.num_stages = n
        self.norm = nn.LayerNorm(embed_dims[-1], eps=1e-6, **dd)
        if global_pool == "auto":
            global_pool = "token" if nglos[-1] > 0 else "avg"
        self._init_head(num_classes, global_pool, drop_rate, **dd)
        self._finish_init()


    def _forward_level(self, s: int, x: torch.Tensor, hw):
        """Stage s: the previous stage's tokens as a map (global tokens dropped), embedding, blocks."""
        if s:
            x = tokens_to_nchw(x, hw, self.nglos[s - 1])
        layers = getattr(self, f"layer{s + 1}")
        x, hw = layers[0](x)
        for i in range(1, len(layers)):
            x = self._run(layers[i], x, hw)
        return x, hw

    def _level_prefix(self, i: int) -> int:
        return self.nglos[i]

    def _truncate(self, num_levels: int) -> None:
        for s in range(num_levels, self.num_stages):
            delattr(self, f"layer{s + 1}")
        self.num_stages = num_levels
        # the features now end at stage num_levels - 1, with that stage's global tokens (if any) in front
        self.num_prefix_tokens = self.nglos[num_levels - 1]
        self.output_fmt = "NLC" if self.num_prefix_tokens else "NHWC"


def remap_official(state_dict: dict, model: nn.Module) -> dict:
    """Official MsViT checkpoint -> this layout: unwrap `net` / `model`, strip `module.`, drop the recomputed
    `relative_position_index` buffers, and resize full-attention tables whose grid differs (bicubic, [ours])."""
    if "net" in state_dict and isinstance(state_dict["net"], dict):
        state_dict = state_dict["net"]
    if "model" in state_dict and isinstance(state_dict["model"], dict):
        state_dict = state_dict["model"]
    out = {}
    own = model.state_dict()
    for k, v in state_dict.items():
        k = k[len("module."):] if k.startswith("module.") else k
        if k.endswith("relative_position_index"):
            continue
        if k.endswith("local_relative_position_bias_table") and k in own and own[k].shape != v.shape:
            attn = model.get_submodule(k.rsplit(".", 1)[0])
            if isinstance(attn, ViLFullAttention):
                src = _grid_of_table(v.shape[0])
                v = resize_rel_table(v, src, attn.input_size)
        out[k] = v
    return out


def _grid_of_table(rows: int) -> tuple[int, int]:
    """Square grid (H, H) with (2H - 1)^2 == rows (official checkpoints are trained on square maps)."""
    side = (math.isqrt(rows) + 1) // 2
    if (2 * side - 1) ** 2 != rows:
        raise UserError(f"cannot infer the grid of a ViL relative-position table with {rows} rows")
    return side, side


_MEDIUM = dict(embed_dims=(96, 192, 384, 768), depths=(1, 4, 16, 1), num_heads=(3, 3, 6, 12),
               patch_sizes=(4, 2, 2, 2), nglos=(1, 1, 1, 0), window_sizes=(7, 7, 7, 7), ranks=(8, 8, 8, 8))
_BASE = {**_MEDIUM, "depths": (1, 8, 24, 1)}
_FULL = "full"
_PAPER = "Long-Short Transformer: Efficient Transformers for Language and Vision (arXiv 2107.02192)"
_CODE = "NVIDIA/transformer-ls"


def _release(key: str, top1: float) -> dict:
    """A checkpoint linked from `imagenet/README.md` of the official repository (Dropbox; `?dl=1` asks for the file
    rather than its preview page)."""
    return dict(url=f"https://www.dropbox.com/s/{key}/model_best.pth?dl=1",
                notes=f"official release ({_CODE} imagenet/README.md): {top1} top-1")


_BASELINE = ("softmax-attention host; the published ViL uses Vision Longformer attention in stages 1-2, so the "
             "published numbers are context, not a target")
register_family(__name__, ViLLS, [
    Variant("vil_ls_micro", dict(img_size=32, embed_dims=(16, 24, 32, 48), depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 2),
                                 patch_sizes=(4, 2, 2, 2), nglos=(1, 1, 1, 0), window_sizes=(2, 2, 2, 2),
                                 ranks=(2, 2, 2, 2), attn=_LS),
            dict(img_size=32, source="test/demo variant", notes="not a paper model"),
            cfg=dict(input_size=(3, 32, 32), crop_pct=1.0)),
    Variant("vil_ls_medium", {**_MEDIUM, "attn": _LS},
            dict(params_m=39.8, gmacs=8.7, top1=83.8, ref_params=39_799_423, ref_gmacs=8.72,
                 notes="measured official MsViT @1527c5cc: 39.80M / 8.72G"),
            weights={"in1k": _release("ng14pebstaaydug", 83.8)}),
    Variant("vil_ls_base", {**_BASE, "attn": _LS},
            dict(params_m=55.8, gmacs=13.4, top1=84.1, ref_params=55_834_363, ref_gmacs=13.39,
                 notes="measured official MsViT @1527c5cc: 55.83M / 13.39G"),
            weights={"in1k": _release("80u5p5eh4txad10", 84.1)}),
    Variant("vil_ls_medium_384", {**_MEDIUM, "window_sizes": (8, 8, 8, 8), "attn": _LS, "img_size": 384},
            dict(img_size=384, params_m=39.8, gmacs=28.7, top1=84.4, ref_params=39_947_653, ref_gmacs=28.74,
                 notes="measured official MsViT @1527c5cc: 39.95M / 28.74G (full-attention RPB tables grow with "
                       "resolution)"),
            cfg=dict(input_size=(3, 384, 384)),
            weights={"in1k": _release("390tzi2ll3sfibl", 84.4)}),
    Variant("vil_medium", {**_MEDIUM, "attn": _FULL},
            dict(gmacs=8.7, top1=83.5, source=_PAPER + " Table 5 (ViL-Medium)", status="unofficial", code="",
                 notes=_BASELINE)),
    Variant("vil_base", {**_BASE, "attn": _FULL},
            dict(gmacs=13.4, top1=83.7, source=_PAPER + " Table 5 (ViL-Base)", status="unofficial", code="",
                 notes=_BASELINE)),
], cfg=dict(first_conv="layer1.0.proj", license="mit", paper_ids="arXiv:2107.02192",
            origin_url="https://github.com/" + _CODE),
    stride=lambda a: math.prod(a.get("patch_sizes", (4, 2, 2, 2))), remap=remap_official,
    card=dict(family="long_short", source=_PAPER + " Table 5 and the official imagenet/README.md", code=_CODE))
