"""What the Agent-Attention families share: their release facts (paper, code, pretrained cfg, card, checkpoint URLs)
and the resizing of the grid-bound agent bias tables when an official checkpoint is loaded at another grid. The
Agent-DeiT, -PVT and -Swin files import from here.

Paper: Agent Attention: On the Integration of Softmax and Linear Attention (arXiv 2312.08874).
Official: LeapLabTHU/Agent-Attention@207ce3e (`agent_transformer/`).
"""

from __future__ import annotations

import torch
from torch import nn

from ..attention.functional.agent import resize_axis

__all__ = ["AGENT_CODE", "AGENT_PAPER", "AGENT_CFG", "AGENT_CARD", "agent_release", "resize_agent_tables"]

AGENT_CODE = "LeapLabTHU/Agent-Attention"
AGENT_PAPER = "Agent Attention: On the Integration of Softmax and Linear Attention (arXiv 2312.08874)"
#: The pretrained-cfg fields of every Agent family (no LICENSE file is published in the official repository).
AGENT_CFG = dict(license="unknown (the official repository publishes no license)", paper_ids="arXiv:2312.08874",
                 origin_url="https://github.com/" + AGENT_CODE)
AGENT_CARD = dict(family="agent", source="official README (agent_transformer/README.md), " + AGENT_PAPER,
                  code=AGENT_CODE, notes="ref_params counted from the official classes at 207ce3e")

# Grid axis of each 1-D agent bias table (1, h, A, H, 1) / (1, h, A, 1, W) / (1, h, H, 1, A) / (1, h, 1, W, A).
_AXIS = {"ah_bias": 3, "aw_bias": 4, "ha_bias": 2, "wa_bias": 3}


def agent_release(key: str, top1: float) -> dict:
    """The cfg of a checkpoint linked from the official README (TsinghuaCloud, `?dl=1`)."""
    return dict(url=f"https://cloud.tsinghua.edu.cn/f/{key}/?dl=1",
                notes=f"official release ({AGENT_CODE} agent_transformer/README.md, TsinghuaCloud): {top1} top-1")


def resize_agent_tables(sd: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Resize the 1-D agent bias tables (`ah_bias`, `aw_bias`, `ha_bias`, `wa_bias`) whose grid size differs from
    the model's construction grid, linearly (align_corners False): the mechanism's run-time rule
    (`subquad.attention.functional.agent.resize_axis`), so a resized load equals running the source model there."""
    own = model.state_dict()
    out = {}
    for k, v in sd.items():
        leaf = k.rsplit(".", 1)[-1]
        if leaf in _AXIS and k in own and own[k].shape != v.shape and v.dim() == own[k].dim():
            ax = _AXIS[leaf]
            v = resize_axis(v.float(), own[k].shape[ax], ax).to(v.dtype)
        out[k] = v
    return out
