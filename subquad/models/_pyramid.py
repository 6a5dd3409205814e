"""Shared timm interface of the 4-stage hierarchical backbones (L2ViT, FLatten-PVT, FLatten-PVTv2).

A host subclasses `PyramidBackbone` and implements `_forward_stage(i, x, hw)` (stage i: downsampling, then blocks;
stage 0 receives the image) and `_truncate(n)` (drop the stages from n on). The base class provides the timm
methods: `forward_features` (final tokens (B, N, C)), `forward_head` (mean of tokens, then `head`),
`forward_intermediates` (the stage outputs as NCHW maps (B, C_i, H_i, W_i) with reductions `feature_info`),
`prune_intermediate_layers`, `set_grad_checkpointing`, `get_classifier`, `reset_classifier`.
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint
from timm.models._features import feature_take_indices
from torch import nn

from .._shapes import tokens_to_map
from ..errors import UserError

__all__ = ["PyramidBackbone", "prune_isotropic"]


def prune_isotropic(model: nn.Module, indices: int | list[int] = 1, prune_norm: bool = False,
                    prune_head: bool = True) -> list[int]:
    """timm's `prune_intermediate_layers` for an isotropic host (`blocks`, `norm`, `reset_classifier`): keep the
    blocks up to the last taken index; returns the taken indices."""
    take, max_index = feature_take_indices(len(model.blocks), indices)
    model.blocks = model.blocks[: max_index + 1]
    if prune_norm:
        model.norm = nn.Identity()
    if prune_head:
        model.reset_classifier(0)
    return take


class PyramidBackbone(nn.Module):
    """Base class: see the module docstring. Subclasses set `arch_name`, `in_chans`, `total_stride`,
    `num_stages`, `num_features`, `head`, `head_drop`, `feature_info` and `grad_checkpointing`."""

    arch_name: str = "pyramid"

    def _check_image(self, x: torch.Tensor) -> None:
        """One-line ValueError for a wrong rank, channel count or an image smaller than the total stride."""
        name = getattr(self, "pretrained_cfg", {}).get("architecture", self.arch_name)
        if x.dim() != 4:
            raise UserError(f"{name}: expected images (B, C, H, W), got shape {tuple(x.shape)}")
        if x.shape[1] != self.in_chans:
            raise UserError(f"{name}: expected {self.in_chans} input channels, got {x.shape[1]} "
                            f"(input shape {tuple(x.shape)})")
        H, W = x.shape[-2:]
        if H < self.total_stride or W < self.total_stride:
            raise UserError(f"{name}: image {H}x{W} is smaller than the model's total stride {self.total_stride}; "
                            f"use at least {self.total_stride}x{self.total_stride}")

    def _forward_stage(self, i: int, x: torch.Tensor, hw: tuple[int, int] | None):
        raise NotImplementedError

    def _truncate(self, num_stages: int) -> None:
        raise NotImplementedError

    def _stage_map(self, i: int, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        """Stage-i output as the NCHW map handed to dense-prediction heads."""
        return tokens_to_map(x, hw)

    def _final_norm(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def _run_blocks(self, blocks: nn.Module, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        for blk in blocks:
            if self.grad_checkpointing and not torch.jit.is_scripting() and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(blk, x, hw, use_reentrant=False)
            else:
                x = blk(x, hw)
        return x

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C_in, H, W) -> final tokens (B, N4, C4)."""
        self._check_image(x)
        hw = None
        for i in range(self.num_stages):
            x, hw = self._forward_stage(i, x, hw)
        return self._final_norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """(B, N, C) -> (B, num_classes), or the pooled (B, C) with pre_logits=True."""
        x = self.head_drop(x.mean(dim=1))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(self, x: torch.Tensor, indices: int | list[int] | None = None, norm: bool = False,
                              stop_early: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False):
        """Stage outputs as maps (B, C_i, H_i, W_i) (strides in `feature_info`), plus the final tokens.

        Args:
            x: images (B, C_in, H, W).
            indices: stages to return (an int n takes the last n; None takes all).
            norm: apply the final norm to the last stage's map (where the model has one).
            stop_early: stop after the last requested stage.
            output_fmt: 'NCHW' only (the dense-prediction layout).
            intermediates_only: return only the list of maps.
        """
        if output_fmt != "NCHW":
            raise UserError(f"output_fmt must be 'NCHW', got {output_fmt!r}")
        take, max_index = feature_take_indices(self.num_stages, indices)
        self._check_image(x)
        last = max_index if stop_early else self.num_stages - 1
        intermediates, hw = [], None
        for i in range(last + 1):
            x, hw = self._forward_stage(i, x, hw)
            if i in take:
                y = self._final_norm(x) if (norm and i == self.num_stages - 1) else x
                intermediates.append(self._stage_map(i, y, hw))
        if intermediates_only:
            return intermediates
        return self._final_norm(x), intermediates

    def prune_intermediate_layers(self, indices: int | list[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        take, max_index = feature_take_indices(self.num_stages, indices)
        self._truncate(max_index + 1)
        if prune_norm and hasattr(self, "norm"):
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0)
        return take

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """New head with `num_classes` outputs (0: identity); only 'avg' pooling exists."""
        if global_pool not in (None, "avg"):
            raise UserError(f"global_pool must be 'avg', got {global_pool!r}")
        self.num_classes = num_classes
        ref = next(self.parameters())
        self.head = nn.Linear(self.num_features, num_classes, device=ref.device, dtype=ref.dtype) \
            if num_classes > 0 else nn.Identity()
