"""Agent-PVT: the PVT v1 host (`subquad.models.flatten_pvt.FlattenPVT`) with agent attention in every stage.

The official Agent-PVT (cfgs `agent_pvt_{t,s,m,m_256,b}.yaml`: ATTN_TYPE AAAA, NUM 9-16-49-49, PVT_LA_SR_RATIOS
1111) runs agent attention without key/value reduction in all four stages (`la_sr_ratios` 1, the host's
linear-attention reduction), with 9, 16, 49, 49 agents (`stage_hints`); the host has no class token and no final norm
(the official `forward_features` averages the last stage's tokens). `agent_pvt_micro` is a tiny variant for tests and
the demo on 32 x 32 images (patch 2, 4 agents per stage).

Paper: Agent Attention (arXiv 2312.08874), Tab. 1 (PVT rows); PVT v1 (arXiv 2102.12122) for the host.
Official: LeapLabTHU/Agent-Attention `agent_transformer/models/agent_pvt.py` (`PyramidVisionTransformer`, `Block`,
`AgentAttention`).
Symbols: C_i stage width, h heads (d = C_i / h = 64), A_i agents of stage i (paper n).
"""

from __future__ import annotations

import torch
from torch import nn

from ..attention.agent import AgentAttention
from ..attention.focused_linear import remap_q_kv
from ._agent_common import AGENT_CARD, AGENT_CFG, agent_release, resize_agent_tables
from ._builder import Variant, register_family, unwrap_state_dict
from ._flatten_common import resize_token_tables
from .flatten_pvt import FlattenPVT

__all__ = ["remap_official"]


def remap_official(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Official Agent-PVT checkpoint -> our state dict.

    Unwraps `model` / `model_ema` / `state_dict`, concatenates each agent module's official `q` and `kv` into our
    `qkv`, and resizes `pos_embed{i}` (bilinear) and the 1-D agent bias tables (linear) whose grid differs from the
    model's construction grid (the run-time rules, so a resized load equals running the source model there).

    Args:
        state_dict: official checkpoint (wrapped or flat).
        model: the target FlattenPVT with agent stages.
    """
    sd = dict(unwrap_state_dict(state_dict))
    for name, m in model.named_modules():
        if isinstance(m, AgentAttention):
            sd = remap_q_kv(sd, f"{name}.")
    return resize_agent_tables(resize_token_tables(sd, model), model)


_PVT = dict(embed_dims=(64, 128, 320, 512), num_heads=(1, 2, 5, 8), mlp_ratios=(8, 8, 4, 4), attn="agent",
            stage_hints=tuple(dict(agent_num=a) for a in (9, 16, 49, 49)))
register_family(__name__, FlattenPVT, [
    Variant("agent_pvt_micro", dict(img_size=32, patch_size=2, embed_dims=(32, 64, 96, 128), num_heads=(1, 2, 3, 4),
                                    mlp_ratios=(2, 2, 2, 2), depths=(1, 1, 1, 1), attn="agent",
                                    stage_hints=tuple(dict(agent_num=4) for _ in range(4))),
            dict(img_size=32, source="test/demo variant (patch 2, 4 agents per stage)", notes="not a paper model"),
            cfg=dict(input_size=(3, 32, 32), crop_pct=1.0)),
    Variant("agent_pvt_tiny", dict(**_PVT, depths=(2, 2, 2, 2)),
            dict(params_m=11.6, gmacs=2.0, top1=78.4, ref_params=11_570_352, ref_gmacs=1.986),
            weights={"in1k": agent_release("13fdf0e0a7c5498c934f", 78.4)}),
    Variant("agent_pvt_small", dict(**_PVT, depths=(3, 4, 6, 3)),
            dict(params_m=20.6, gmacs=4.0, top1=82.2, ref_params=20_635_066, ref_gmacs=3.955),
            weights={"in1k": agent_release("36b8be9a8863456685a3", 82.2)}),
    Variant("agent_pvt_medium", dict(**_PVT, depths=(3, 4, 18, 3)),
            dict(params_m=35.9, gmacs=7.0, top1=83.4, ref_params=35_921_746, ref_gmacs=6.999),
            weights={"in1k": agent_release("4d00ecacf18b45f9b88c", 83.4)}),
    Variant("agent_pvt_medium_256", dict(**_PVT, depths=(3, 4, 18, 3), img_size=256),
            dict(img_size=256, params_m=36.1, gmacs=9.2, top1=83.8, ref_params=36_083_682, ref_gmacs=9.142),
            cfg=dict(input_size=(3, 256, 256), crop_pct=1.0),
            weights={"in1k": agent_release("654df734121643b19c52", 83.8)}),
    Variant("agent_pvt_large", dict(**_PVT, depths=(3, 8, 27, 3)),
            dict(params_m=48.7, gmacs=10.4, top1=83.7, ref_params=48_738_180, ref_gmacs=10.34),
            weights={"in1k": agent_release("040cfe0cfbbe4762ad09", 83.7)}),
], cfg=dict(first_conv="patch_embed1.proj", **AGENT_CFG), stride=lambda a: a.get("patch_size", 4) * 8,
    remap=remap_official, card=AGENT_CARD)
