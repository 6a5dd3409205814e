"""Agent-Swin: the Swin-v1 host (`subquad.models.flatten_swin.FlattenSwin`) with agent attention in the early stages.

The official Agent-Swin 'A' blocks run agent attention over the whole stage map (WINDOW_SIZE 56 at 224, 72 at 288:
one window per stage, no shift), the 'B' blocks Swin W-MSA / SW-MSA with window max(7, WINDOW_SIZE // 8) (7 at 224,
9 at 288), with 9, 16, 49, 49 agents per stage (`stage_hints`):
    - `agent_swin_tiny`: ATTN_TYPE AAAB (cfg `agent_swin_t.yaml`);
    - `agent_swin_small`, `agent_swin_small_288`: AABB (cfgs `agent_swin_s.yaml`, `agent_swin_s_288.yaml`);
    - `agent_swin_micro`: a tiny variant for tests and the demo on 64 x 64 images (AAAB, 4 agents per stage).
    - `agent_swin_base`, `agent_swin_base_384`: AAMB2 (cfgs `agent_swin_b.yaml`, `agent_swin_b_384.yaml`): stage 3
      mixes mechanisms, its first 2 blocks agent and the other 16 window, given to the host as a tuple of one name per
      block; the 384 model's WINDOW_SIZE 96 makes its 'B' window max(7, 96 // 8) = 12.

Paper: Agent Attention (arXiv 2312.08874), Tab. 1 (Swin rows); Swin (arXiv 2103.14030) for the host.
Official: LeapLabTHU/Agent-Attention `agent_transformer/models/agent_swin.py` (`AgentSwinTransformer`,
`SwinTransformerBlock`, `AgentAttention`).
Symbols: C embed dim, w 'B' window, A_i agents of stage i (paper n).
"""

from __future__ import annotations

import torch
from torch import nn

from ._agent_common import AGENT_CARD, AGENT_CFG, agent_release, resize_agent_tables
from ._builder import Variant, register_family
from .flatten_swin import FlattenSwin
from .flatten_swin import remap_official as _remap_swin

__all__ = ["remap_official"]


def remap_official(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Official Agent-Swin checkpoint -> our state dict (identical names).

    Unwraps `model` / `model_ema` / `state_dict`, drops the recomputed buffers (`relative_position_index`,
    `attn_mask`), resizes `relative_position_bias_table` bicubically (the official Swin fine-tuning rule) and the 1-D
    agent bias tables linearly (the run-time rule) when their size differs from the model's construction size.

    Args:
        state_dict: official checkpoint (wrapped or flat).
        model: the target FlattenSwin with agent stages.
    """
    return resize_agent_tables(_remap_swin(state_dict, model), model)


def _stages(kinds: str) -> tuple[str, ...]:
    """Official ATTN_TYPE letters: 'A' agent attention, 'B' Swin window attention."""
    return tuple({"A": "agent", "B": "window"}[c] for c in kinds)


_AGENTS = tuple(dict(agent_num=a) for a in (9, 16, 49, 49))
_T = dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), attn=_stages("AAAB"), stage_hints=_AGENTS)
_S = dict(embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24), attn=_stages("AABB"), stage_hints=_AGENTS)
_B = dict(embed_dim=128, depths=(2, 2, 18, 2), num_heads=(4, 8, 16, 32),
          attn=(*_stages("AA"), _stages("AA" + "B" * 16), "window"), stage_hints=_AGENTS)
register_family(__name__, FlattenSwin, [
    Variant("agent_swin_micro", dict(img_size=64, embed_dim=32, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8),
                                     mlp_ratio=2.0, window_size=3, attn=_stages("AAAB"),
                                     stage_hints=tuple(dict(agent_num=4) for _ in range(4))),
            dict(img_size=64, source="test/demo variant (stage grids 16/8/4/2, 4 agents per stage)",
                 notes="not a paper model"),
            cfg=dict(input_size=(3, 64, 64), crop_pct=1.0)),
    Variant("agent_swin_tiny", _T, dict(params_m=29.0, gmacs=4.5, top1=82.6, ref_params=28_902_964, ref_gmacs=4.499),
            weights={"in1k": agent_release("a2ddc1190c224f768a41", 82.6)}),
    Variant("agent_swin_small", _S, dict(params_m=50.0, gmacs=8.7, top1=83.7, ref_params=49_666_684, ref_gmacs=8.701),
            weights={"in1k": agent_release("f607172c9fea4d6e99bb", 83.7)}),
    Variant("agent_swin_small_288", dict(**_S, img_size=288, window_size=9),
            dict(img_size=288, params_m=50.0, gmacs=14.6, top1=84.1, ref_params=49_707_964, ref_gmacs=14.53),
            cfg=dict(input_size=(3, 288, 288), crop_pct=1.0),
            weights={"in1k": agent_release("09760394e93b4046a25e", 84.1)}),
    Variant("agent_swin_base", _B, dict(params_m=88.0, gmacs=15.4, top1=84.0, ref_params=88_095_096, ref_gmacs=15.4),
            weights={"in1k": agent_release("4fcd2d0114bb490483c3", 84.0)}),
    Variant("agent_swin_base_384", dict(**_B, img_size=384, window_size=12),
            dict(img_size=384, params_m=88.0, gmacs=46.3, top1=84.9, ref_params=88_305_016, ref_gmacs=46.21),
            cfg=dict(input_size=(3, 384, 384), crop_pct=1.0),
            weights={"in1k": agent_release("bb84ee9058954706a557", 84.9)}),
], cfg=dict(first_conv="patch_embed.proj", **AGENT_CFG), stride=lambda a: 32, remap=remap_official, card=AGENT_CARD)
