"""What the FLatten families share: their release facts (paper, code, pretrained cfg, card, checkpoint URLs) and
the resizing of size-bound token tables (`pos_embed{i}`, the attention PE) when an official checkpoint is loaded at
another grid. The FLatten-PVT, -PVTv2, -Swin, -DeiT and -CSwin files import from here.

Paper: FLatten Transformer (arXiv 2308.00442). Official: LeapLabTHU/FLatten-Transformer@abdb115.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..attention.functional.focused import resize_pe
from ..errors import UserError
from ..layers.patch_embed import resize_pos_embed_2d

__all__ = ["FLATTEN_CODE", "FLATTEN_PAPER", "FLATTEN_CFG", "FLATTEN_CARD", "flatten_release", "resize_token_grid",
           "resize_token_tables"]

FLATTEN_CODE = "LeapLabTHU/FLatten-Transformer"
FLATTEN_PAPER = "FLatten Transformer: Vision Transformer using Focused Linear Attention (arXiv 2308.00442)"
#: The pretrained-cfg fields of every FLatten family (no LICENSE file is published in the official repository).
FLATTEN_CFG = dict(license="unknown (the official repository publishes no license)", paper_ids="arXiv:2308.00442",
                   origin_url="https://github.com/" + FLATTEN_CODE)
FLATTEN_CARD = dict(family="flatten", source=FLATTEN_PAPER + " Tab. 2 and the official README", code=FLATTEN_CODE,
                    notes="ref_* measured from the official classes at abdb115 (fvcore GMACs)")


def flatten_release(key: str, top1: float) -> dict:
    """The cfg of a checkpoint linked from the official README (TsinghuaCloud, `?dl=1`)."""
    return dict(url=f"https://cloud.tsinghua.edu.cn/f/{key}/?dl=1",
                notes=f"official release ({FLATTEN_CODE} README, TsinghuaCloud): {top1} top-1")


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


def resize_token_tables(sd: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
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
