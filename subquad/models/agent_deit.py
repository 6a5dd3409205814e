"""Agent-DeiT on the ViT host: DeiT whose blocks run agent attention (Agent Attention, arXiv 2312.08874, Tab. 1).

Thin variants of `subquad.models.vit.VisionTransformerAttn` (timm DeiT key layout, which the official checkpoints
use too), differing only in the per-block mechanism list and the agent count (`hints=dict(agent_num=A)`):
    - `agent_deit_tiny/small`, `agent_deit_small_448`: every block `agent` with A = 49 (official cfgs
      `agent_deit_{t,s,s_448}.yaml`, NUM 49-49-49-49).
    - `agent_deit_base`: blocks 1-4 `agent` with A = 81, blocks 5-12 softmax (official `agent_deit_base`,
      `agent_layer=4`, cfg `agent_deit_b.yaml` NUM 81-81-81-81).
    - `agent_deit_micro`: a tiny Agent-DeiT for tests and the demo (patch 4 on 32 x 32 images, A = 9).
The class token is a query and a key of every agent block with its own biases `ca_bias` / `ac_bias`; agents are
pooled from the patch grid only, and the DWC runs on the patch grid (official `agent_deit.py` `AgentAttention`).

Paper: Agent Attention (arXiv 2312.08874), Sec. 5.1 / Tab. 1 (DeiT rows).
Official: LeapLabTHU/Agent-Attention `agent_transformer/models/agent_deit.py` `VisionTransformer`, `AgentBlock`.
Symbols: C width, h heads, A agents (paper n), d = C / h = 64.
"""

from __future__ import annotations

import torch
from torch import nn

from ._agent_common import AGENT_CARD, AGENT_CFG, agent_release, resize_agent_tables
from ._builder import Variant, register_family
from .flatten_deit import remap_official as _remap_deit
from .vit import VisionTransformerAttn, vit_out_indices

__all__ = ["remap_official"]


def remap_official(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Official Agent-DeiT checkpoint -> our state dict (identical names: the timm DeiT layout plus the agent
    modules' `dwc`, `an_bias` ... `ca_bias`).

    Unwraps `model` / `model_ema` / `state_dict`, resamples `pos_embed` bicubically (timm's rule, class slot kept)
    and resizes the 1-D agent bias tables linearly to the model's grid when they differ (the run-time rules).

    Args:
        state_dict: official checkpoint (wrapped or flat).
        model: the target VisionTransformerAttn.
    """
    return resize_agent_tables(_remap_deit(state_dict, model), model)


def _agents_then_softmax(depth: int, n_agent: int) -> tuple[str, ...]:
    """Official `agent_layer`: the first n_agent blocks agent attention, the rest softmax."""
    return tuple("agent" if j < n_agent else "softmax" for j in range(depth))


_DEIT = dict(patch_size=16, depth=12)
_W = dict(input_size=(3, 448, 448), crop_pct=1.0)
register_family(__name__, VisionTransformerAttn, [
    Variant("agent_deit_micro", dict(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=2, mlp_ratio=2.0,
                                     attn="agent", hints=dict(agent_num=9)),
            dict(img_size=32, source="test/demo variant (patch 4, 9 agents)", notes="not a paper model"),
            cfg=dict(input_size=(3, 32, 32), crop_pct=1.0)),
    Variant("agent_deit_tiny", dict(**_DEIT, embed_dim=192, num_heads=3, attn="agent", hints=dict(agent_num=49)),
            dict(params_m=6.0, gmacs=1.2, top1=74.9, ref_params=6_015_640, ref_gmacs=1.168),
            weights={"in1k": agent_release("57e0904221824ee7b7af", 74.9)}),
    Variant("agent_deit_small", dict(**_DEIT, embed_dim=384, num_heads=6, attn="agent", hints=dict(agent_num=49)),
            dict(params_m=22.7, gmacs=4.4, top1=80.5, ref_params=22_647_112, ref_gmacs=4.427),
            weights={"in1k": agent_release("fdd43304372541db8ea7", 80.5)}),
    Variant("agent_deit_small_448", dict(**_DEIT, img_size=448, embed_dim=384, num_heads=6, attn="agent",
                                         hints=dict(agent_num=49)),
            dict(img_size=448, params_m=23.1, gmacs=17.7, top1=83.1, ref_params=23_070_472, ref_gmacs=17.64), cfg=_W,
            weights={"in1k": agent_release("a228f86241c445f1969b", 83.1)}),
    Variant("agent_deit_base", dict(**_DEIT, embed_dim=768, num_heads=12, attn=_agents_then_softmax(12, 4),
                                    hints=dict(agent_num=81)),
            dict(params_m=87.2, gmacs=17.6, top1=82.0, ref_params=87_204_904, ref_gmacs=17.53),
            weights={"in1k": agent_release("5115f15fdd7e4ab58fbc", 82.0)}),
], cfg=dict(first_conv="patch_embed.proj", **AGENT_CFG), stride=lambda a: a.get("patch_size", 16),
    remap=remap_official, card=AGENT_CARD, out_indices=vit_out_indices, non_std=True)
