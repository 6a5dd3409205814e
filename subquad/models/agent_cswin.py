"""Agent-CSwin: the CSwin host (`subquad.models.flatten_cswin.FlattenCSWin`) with agent attention in stages 1-2.

The official Agent-CSwin (cfgs `agent_cswin_{t,s,b,b_384}.yaml`: ATTN_TYPE AABB, NUM 9-16-49-49, CSWIN_LA_SPLIT_SIZE
equal to the stage grids, 56-28-14-7 at 224 and 96-48-24-12 at 384) runs its 'A' blocks as one branch over the whole
stage map: the block projects q, k, v, agent attention mixes them and CSwin's LePE `get_v` (3 x 3 depthwise on v)
is added, at `attns.0` (our `AgentCore`, the mechanism's "host_qkv" form); 'B' blocks are CSwin stripes.
`agent_cswin_micro` is a tiny variant for tests and the demo on 64 x 64 images (4 agents per stage).
Agent-CSwin-S is depths (3, 6, 29, 2) (official `Agent_CSWin_64_36292_small_224`), not FLatten-CSwin-S's.

Paper: Agent Attention (arXiv 2312.08874), Tab. 1 (CSwin rows); CSWin (arXiv 2107.00652) for the host.
Official: LeapLabTHU/Agent-Attention `agent_transformer/models/agent_cswin.py` (`CSWinTransformer`, `CSWinBlock`,
`AgentAttention`).
Symbols: C embed dim, sw stripe width, A_i agents of stage i (paper n).
"""

from __future__ import annotations

import torch
from torch import nn

from ._agent_common import AGENT_CARD, AGENT_CFG, agent_release, resize_agent_tables
from ._builder import Variant, register_family
from .flatten_cswin import FlattenCSWin
from .flatten_cswin import remap_official as _remap_cswin

__all__ = ["remap_official"]


def remap_official(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Official Agent-CSwin checkpoint -> our state dict (identical names).

    Unwraps `model` / `model_ema` / `state_dict` / `state_dict_ema` and resizes the 1-D agent bias tables linearly
    (the run-time rule) when their grid differs from the model's construction grid.

    Args:
        state_dict: official checkpoint (wrapped or flat).
        model: the target FlattenCSWin with agent stages.
    """
    return resize_agent_tables(_remap_cswin(state_dict, model), model)


_AABB = ("agent", "agent", "cswin", "cswin")
_AGENTS = tuple(dict(agent_num=a) for a in (9, 16, 49, 49))
_B = dict(embed_dim=96, depths=(3, 6, 29, 2), num_heads=(4, 8, 16, 32), attn=_AABB, stage_hints=_AGENTS)
register_family(__name__, FlattenCSWin, [
    Variant("agent_cswin_micro", dict(img_size=64, embed_dim=32, depths=(1, 1, 2, 1), num_heads=(2, 2, 4, 8),
                                      mlp_ratio=2.0, split_size=(1, 2, 3, 3), attn=_AABB,
                                      stage_hints=tuple(dict(agent_num=4) for _ in range(4))),
            dict(img_size=64, source="test/demo variant (stage grids 16/8/4/2, 4 agents per stage)",
                 notes="not a paper model"),
            cfg=dict(input_size=(3, 64, 64), crop_pct=1.0)),
    Variant("agent_cswin_tiny", dict(embed_dim=64, depths=(2, 4, 18, 1), num_heads=(2, 4, 8, 16), attn=_AABB,
                                     stage_hints=_AGENTS),
            dict(params_m=21.0, gmacs=4.3, top1=83.1, ref_params=20_458_672, ref_gmacs=4.292),
            weights={"in1k": agent_release("8c562a74441e46d5902b", 83.1)}),
    Variant("agent_cswin_small", dict(embed_dim=64, depths=(3, 6, 29, 2), num_heads=(2, 4, 8, 16), attn=_AABB,
                                      stage_hints=_AGENTS),
            dict(params_m=33.0, gmacs=6.8, top1=83.9, ref_params=32_814_100, ref_gmacs=6.744),
            weights={"in1k": agent_release("30eb8af675bc4b7a8747", 83.9)}),
    Variant("agent_cswin_base", _B, dict(params_m=73.0, gmacs=14.9, top1=84.7, ref_params=73_249_696, ref_gmacs=14.87),
            weights={"in1k": agent_release("c8035b0839b2410c8c9f", 84.7)}),
    Variant("agent_cswin_base_384", dict(**_B, img_size=384, split_size=(1, 2, 12, 12)),
            dict(img_size=384, params_m=73.0, gmacs=46.3, top1=85.8, ref_params=73_328_416, ref_gmacs=46.18),
            cfg=dict(input_size=(3, 384, 384), crop_pct=1.0),
            weights={"in1k": agent_release("1239be0df44b47719432", 85.8)}),
], cfg=dict(first_conv="stage1_conv_embed.0", crop_pct=0.9, **AGENT_CFG), stride=lambda a: 32,
    remap=remap_official, card=AGENT_CARD)
