"""What the InLine families share: their release facts (paper, code, pretrained cfg, card, checkpoint URLs) and the
official `q` + `kv` -> `qkv` rename of the PVT checkpoints. The InLine-DeiT, -PVT, -Swin and -CSwin files import from
here.

Paper: Bridging the Divide: Reconsidering Softmax and Linear Attention (arXiv 2412.06590).
Official: LeapLabTHU/InLine@e463a6f.
"""

from __future__ import annotations

import torch
from torch import nn

from ..attention.focused_linear import remap_q_kv
from ..attention.inline import InLineAttention

__all__ = ["INLINE_CODE", "INLINE_PAPER", "INLINE_CFG", "INLINE_CARD", "inline_release", "remap_inline_q_kv"]

INLINE_CODE = "LeapLabTHU/InLine"
INLINE_PAPER = "Bridging the Divide: Reconsidering Softmax and Linear Attention (arXiv 2412.06590)"
#: The pretrained-cfg fields of every InLine family (the official repository publishes no LICENSE file).
INLINE_CFG = dict(license="unknown (the official repository publishes no license)", paper_ids="arXiv:2412.06590",
                  origin_url="https://github.com/" + INLINE_CODE)
INLINE_CARD = dict(family="inline", source=INLINE_PAPER + " Tab. 3 and the official README", code=INLINE_CODE,
                   notes="params_m / gmacs / top1: official README; ref_params measured from the official classes "
                         "at e463a6f")


def inline_release(key: str, top1: float) -> dict:
    """The cfg of a checkpoint linked from the official README (TsinghuaCloud, `?dl=1`)."""
    return dict(url=f"https://cloud.tsinghua.edu.cn/f/{key}/?dl=1",
                notes=f"official release ({INLINE_CODE} README, TsinghuaCloud): {top1} top-1")


def remap_inline_q_kv(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """The official InLine-PVT keys `attn.q` and `attn.kv` of every `InLineAttention` in `model` -> our fused
    `attn.qkv` (row-wise [q; kv]); state dicts that already hold `qkv` pass unchanged."""
    for name, m in model.named_modules():
        if isinstance(m, InLineAttention):
            state_dict = remap_q_kv(state_dict, f"{name}." if name else "")
    return state_dict
