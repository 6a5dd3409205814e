"""The one timm backbone contract every subquad host derives from.

A host (pyramid, isotropic, prefix-token or video) describes itself as a sequence of *levels*, the units its
`feature_info` lists (stages of a pyramid, blocks of an isotropic model), and implements:

- `_forward_level(i, x, hw) -> (x, hw)`: level i; level 0 receives the checked input and hw=None;
- `_truncate(n)`: drop the levels from n on (with their parameters);
- optionally `_final_norm(x)`, `_level_prefix(i)` (prefix tokens carried by level i), `_level_map(i, x, hw, fmt)`
  (a level's output as an intermediate map) and `_init_module(m)` (the official per-module init).

`Backbone` owns, once: the input check (`InputShapeError`), `forward_features` (final features in
`output_fmt`: 'NHWC' maps, 'NCHW' maps or 'NLC' tokens with prefix tokens first), `forward_head(pre_logits=)`,
`forward_intermediates`, `prune_intermediate_layers`, `reset_classifier(num_classes, global_pool)` (including
`global_pool=''`), `get_classifier`, `set_grad_checkpointing`, `group_matcher`, `no_weight_decay` and
`init_weights` (also the routine after `to_empty()` of a model built on the meta device).

`torch.fx` (timm's feature extraction): every block and embedding module is registered as a leaf with
`timm.layers.register_notrace_module`, and the few shape-dependent helpers below are wrapped with `torch.fx.wrap`,
so symbolic tracing never branches on a traced shape.
"""

from __future__ import annotations

import math
import os
import re
import sys
import warnings
from typing import Any

import torch
import torch.fx
import torch.utils.checkpoint
from timm.models._features import feature_take_indices
from torch import nn

from ..errors import UserError

__all__ = ["Backbone", "InputShapeError", "check_input", "tokens_to_nchw", "tokens_to_nhwc", "drop_path_rates",
           "POOLS_MAP", "POOLS_TOKENS", "stage_mechanisms", "deprecated_attn_keywords"]

POOLS_MAP = ("avg", "")
POOLS_TOKENS = ("token", "avg", "")


class InputShapeError(UserError):
    """An input the model cannot take (rank, channels, or a size below what the architecture needs)."""


def check_input(x: torch.Tensor, ndim: int, in_chans: int, min_size: int, name: str) -> torch.Tensor:
    """Return x, or raise `InputShapeError` in one line: a floating-point dtype, rank `ndim` (a video model, ndim 5,
    also takes images as one-frame clips), `in_chans` channels, and every spatial side at least `min_size` (the
    model's total stride: every host pads or floors below it into an empty map)."""
    what = "video clips (B, C, T, H, W) or images (B, C, H, W)" if ndim == 5 else "images (B, C, H, W)"
    if not x.is_floating_point():
        raise InputShapeError(f"{name}: expected a floating-point input (normalised pixels), got {x.dtype}; convert "
                              "uint8 images with x.float() / 255 and normalise them with the mean and std of the "
                              "model's pretrained_cfg")
    if x.dim() != ndim and not (ndim == 5 and x.dim() == 4):
        hint = "; video needs a *_video model" if x.dim() == 5 and ndim == 4 else ""
        raise InputShapeError(f"{name}: expected {what}, got shape {tuple(x.shape)}{hint}")
    if x.shape[1] != in_chans:
        raise InputShapeError(f"{name}: expected {in_chans} input channels, got {x.shape[1]} "
                              f"(input shape {tuple(x.shape)})")
    H, W = x.shape[-2:]
    if H < min_size or W < min_size:
        raise InputShapeError(f"{name}: image {H}x{W} is smaller than the model's total stride {min_size}; "
                              f"use at least {min_size}x{min_size}")
    return x


def tokens_to_nchw(x: torch.Tensor, hw: tuple[int, int], prefix: int = 0) -> torch.Tensor:
    """(B, prefix + H*W, C) -> contiguous (B, C, H, W), prefix tokens dropped (the layout the official stages hand
    to their next convolution)."""
    return x[:, prefix:].transpose(1, 2).reshape(x.shape[0], -1, hw[0], hw[1])


def tokens_to_nhwc(x: torch.Tensor, hw: tuple[int, int], prefix: int = 0) -> torch.Tensor:
    """(B, prefix + H*W, C) -> (B, H, W, C), prefix tokens dropped."""
    B, _, C = x.shape
    return x[:, prefix:].reshape(B, hw[0], hw[1], C)


for _fn in ("check_input", "tokens_to_nchw", "tokens_to_nhwc"):
    torch.fx.wrap(_fn)


def drop_path_rates(rate: float, depths: list[int] | tuple[int, ...]) -> list[list[float]]:
    """Stochastic-depth rates, linear from 0 to `rate` over all blocks, split per stage (plain floats, so a model
    builds on the meta device)."""
    total = sum(depths)
    flat = [rate * j / (total - 1) if total > 1 else 0.0 for j in range(total)]
    out, start = [], 0
    for d in depths:
        out.append(flat[start:start + d])
        start += d
    return out


def stage_mechanisms(host: str, attn: Any, n: int, what: str = "stage") -> tuple[str, ...]:
    """A host's `attn=` as one mechanism name per stage: one name (every stage) or a sequence of `n` names.

    Anything else is refused in one line naming the host and what `attn=` takes; an unknown name is refused by the
    attention registry when the stage is built (with the names that are close)."""
    if n < 1:  # a depth (or stage count) below one: say that, not that attn= is wrong
        raise UserError(f"{host}: needs at least one {what}, got {n} (a depth must be >= 1)")
    names = (attn,) * n if isinstance(attn, str) else tuple(attn) if isinstance(attn, (list, tuple)) else None
    if names is None or len(names) != n or not all(isinstance(a, str) for a in names):
        raise UserError(f"{host}: attn= takes a mechanism name or {n} names (one per {what}), got {attn!r}")
    return names


_OWN_FILES = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),)


def deprecated_attn_keywords(host: str, attn: Any, hint: str = "the same value", **old: Any) -> dict[str, Any]:
    """The deprecated spellings of `attn=` a caller passed: `old` maps each keyword to its value (None when not
    passed); the keywords given are returned with their values.

    Each one given warns (`DeprecationWarning`, attributed to the first caller outside subquad and timm, so that
    Python's default filters show it to a script); one given beside `attn=` is refused in one line. `hint` says
    what to pass as `attn=` instead."""
    given = {k: v for k, v in old.items() if v is not None}
    if not given:
        return given
    spelled = " / ".join(f"{k}=" for k in given)
    if attn is not None:
        raise UserError(f"{host}: {spelled} is the deprecated spelling of attn=; pass attn= alone, not both")
    import timm

    own = (*_OWN_FILES, os.path.dirname(os.path.abspath(timm.__file__)))
    frame, level = sys._getframe(0), 1
    while frame is not None and frame.f_code.co_filename.startswith(own):
        frame, level = frame.f_back, level + 1
    warnings.warn(f"{host}: {spelled} is deprecated; pass attn= ({hint})", DeprecationWarning, stacklevel=level)
    return given


class Backbone(nn.Module):
    """Base of every subquad image/video backbone; see the module docstring for the hooks a host implements.

    A host sets in `__init__`: `in_chans`, `num_features` (= `head_hidden_size`), `feature_info`, `total_stride`,
    `grad_checkpointing`, and calls `_init_head(num_classes, global_pool, drop_rate)`; it sets `output_fmt`
    ('NHWC' default), `num_prefix_tokens` of the final features (0 default) and `input_ndim` (4; 5 for video).
    Class attributes `group_patterns` (timm `group_matcher` regexes, fine and coarse) and `no_decay` (regexes of
    parameter names excluded from weight decay, as the official recipes do) replace per-host methods;
    `deprecated_attn` names the host's deprecated spellings of `attn=` (a caller's one replaces a variant's `attn`).
    """

    output_fmt: str = "NHWC"
    num_prefix_tokens: int = 0
    input_ndim: int = 4
    norm_every_level: bool = False
    intermediate_fmts: tuple[str, ...] = ("NCHW",)
    group_patterns: dict = {}
    group_patterns_coarse: dict | None = None
    no_decay: tuple[str, ...] = ()
    deprecated_attn: tuple[str, ...] = ()

    # ----- hooks -----
    def _forward_level(self, i: int, x: torch.Tensor, hw):
        raise NotImplementedError

    def _truncate(self, num_levels: int) -> None:
        raise NotImplementedError

    def _num_levels(self) -> int:
        return self.num_stages

    def _final_norm(self, x: torch.Tensor) -> torch.Tensor:
        norm = getattr(self, "norm", None)
        return x if norm is None else norm(x)

    def _level_prefix(self, i: int) -> int:
        return 0

    def _level_map(self, i: int, x: torch.Tensor, hw, fmt: str) -> torch.Tensor:
        p = self._level_prefix(i)
        return tokens_to_nchw(x, hw, p) if fmt == "NCHW" else x[:, p:]

    #: Official per-module init, declared: Linear trunc_normal(0.02) with zero bias always; conv weights
    #: `init_convs` = None (PyTorch's default), 'trunc_normal' (std 0.02, zero bias) or 'fan_out'
    #: (normal(0, sqrt(2 / fan_out)), fan_out = prod(kernel) * out / groups, zero bias); norms (1, 0) when
    #: `init_norms` (else PyTorch's default, which is the same for freshly built norms).
    init_convs: str | None = None
    init_norms: bool = False

    def _init_module(self, m: nn.Module) -> None:
        if isinstance(m, nn.Linear) or (self.init_convs == "trunc_normal" and isinstance(m, nn.Conv2d)):
            nn.init.trunc_normal_(m.weight, std=0.02)
        elif self.init_convs == "fan_out" and isinstance(m, (nn.Conv2d, nn.Conv3d)):
            fan_out = math.prod(m.kernel_size) * m.out_channels // m.groups
            nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
        elif self.init_norms and isinstance(m, (nn.LayerNorm, nn.BatchNorm2d, nn.BatchNorm3d)):
            nn.init.ones_(m.weight)
        else:
            return
        if m.bias is not None:
            nn.init.zeros_(m.bias)

    def _init_extra(self) -> None:
        """Host parameters that no module owns (position embeddings, class tokens)."""

    # ----- construction helpers -----
    def _init_head(self, num_classes: int, global_pool: str, drop_rate: float, device=None, dtype=None) -> None:
        self.head_drop = nn.Dropout(drop_rate)
        self.global_pool = self._check_pool(global_pool)
        self.num_classes = num_classes
        self.head = nn.Linear(self.num_features, num_classes, device=device, dtype=dtype) if num_classes > 0 \
            else nn.Identity()

    def _finish_init(self) -> None:
        """Call last in a host's `__init__`: initialise weights unless built on the meta device."""
        if not any(p.is_meta for p in self.parameters()):
            self.init_weights()

    def _check_pool(self, global_pool: str | None) -> str:
        allowed = POOLS_TOKENS if self.output_fmt == "NLC" else POOLS_MAP
        if global_pool not in allowed:
            raise UserError(f"{self._arch()}: global_pool must be one of {allowed}, got {global_pool!r}")
        if global_pool == "token" and self.num_prefix_tokens == 0:
            raise UserError(f"{self._arch()}: global_pool='token' needs a class token")
        return global_pool

    def _arch(self) -> str:
        return getattr(self, "pretrained_cfg", {}).get("architecture", type(self).__name__)

    def _check(self, x: torch.Tensor) -> torch.Tensor:
        return check_input(x, self.input_ndim, self.in_chans, self.total_stride, self._arch())

    def _run(self, blk: nn.Module, *args):
        """Call a block, through activation checkpointing when it is on and gradients are needed."""
        if self.grad_checkpointing and torch.is_grad_enabled() and not torch.jit.is_scripting():
            return torch.utils.checkpoint.checkpoint(blk, *args, use_reentrant=False)
        return blk(*args)

    def _run_blocks(self, blocks, x: torch.Tensor, hw) -> torch.Tensor:
        for blk in blocks:
            x = self._run(blk, x, hw)
        return x

    def _finish(self, x: torch.Tensor, hw) -> torch.Tensor:
        x = self._final_norm(x)
        return tokens_to_nhwc(x, hw, self.num_prefix_tokens) if self.output_fmt == "NHWC" else x

    # ----- the timm interface -----
    def init_weights(self) -> None:
        """Initialise every parameter and recomputed buffer: each module's own `reset_parameters` (children before
        parents), `init_non_persistent_buffers`, then the host's official per-module init and its own tables. The
        routine after `model.to_empty(device=...)` of a model built under `torch.device('meta')`."""
        for m in reversed(list(self.modules())):
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()
            if hasattr(m, "init_non_persistent_buffers"):
                m.init_non_persistent_buffers()
        self.apply(self._init_module)
        self._init_extra()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Input -> final features in `output_fmt` ((B, H, W, C), (B, C, [T,] H, W) or (B, P + N, C))."""
        x, hw = self._check(x), None
        for i in range(self._num_levels()):
            x, hw = self._forward_level(i, x, hw)
        return self._finish(x, hw)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Features -> pooled (B, C) (`pre_logits=True`) or logits; with global_pool='' the map is kept."""
        pool = self.global_pool
        if pool == "token":
            x = x[:, 0]
        elif pool == "avg":
            if self.output_fmt == "NLC":
                x = x[:, self.num_prefix_tokens:].mean(dim=1)
            elif self.output_fmt == "NHWC":
                x = x.flatten(1, 2).mean(dim=1)
            else:
                x = x.flatten(2).mean(dim=-1)
        x = self.head_drop(x)
        if pre_logits:
            return x
        if pool == "" and self.output_fmt == "NCHW":
            return self.head(x.movedim(1, -1)).movedim(-1, 1)
        return self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(self, x: torch.Tensor, indices: int | list[int] | None = None, norm: bool = False,
                              stop_early: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False):
        """Level outputs as maps (B, C_i, H_i, W_i) (prefix tokens dropped; strides in `feature_info`), and the
        final features as `forward_features` returns them.

        Args:
            x: input images (B, C_in, H, W) (clips (B, C_in, T, H, W) for video models).
            indices: levels to return (an int n takes the last n; None takes all).
            norm: apply the final norm to the last level's map (every level's for isotropic hosts).
            stop_early: stop after the last requested level (the returned features are then that level's tokens).
            output_fmt: 'NCHW' (isotropic token hosts also take 'NLC').
            intermediates_only: return only the list of maps.
        """
        if output_fmt not in self.intermediate_fmts:
            raise UserError(f"{self._arch()}: output_fmt must be one of {self.intermediate_fmts}, got {output_fmt!r}")
        n = self._num_levels()
        take, max_index = feature_take_indices(n, indices)
        x, hw = self._check(x), None
        last = max_index if stop_early else n - 1
        intermediates = []
        for i in range(last + 1):
            x, hw = self._forward_level(i, x, hw)
            if i in take:
                y = self._final_norm(x) if norm and (self.norm_every_level or i == n - 1) else x
                intermediates.append(self._level_map(i, y, hw, output_fmt))
        if intermediates_only:
            return intermediates
        return (self._finish(x, hw) if last == n - 1 else x), intermediates

    def prune_intermediate_layers(self, indices: int | list[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """Keep the levels up to the last taken index (the others go with their parameters); optionally drop the
        final norm and the head. Returns the taken indices."""
        take, max_index = feature_take_indices(self._num_levels(), indices)
        self._truncate(max_index + 1)
        if prune_norm and hasattr(self, "norm"):
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        for m in self.modules():
            if hasattr(m, "grad_checkpointing"):
                m.grad_checkpointing = enable

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(self.group_patterns_coarse if coarse and self.group_patterns_coarse else self.group_patterns)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Parameter names the official recipes exclude from weight decay (1-D tensors and biases are excluded by
        timm's optimizer factory anyway)."""
        pats = [re.compile(p) for p in self.no_decay]
        return {n for n, _ in self.named_parameters() if any(p.search(n) for p in pats)}

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """New head with `num_classes` outputs (0: identity); `global_pool` '' keeps the unpooled features."""
        if global_pool is not None:
            self.global_pool = self._check_pool(global_pool)
        self.num_classes = num_classes
        ref = next(self.parameters())
        self.head = nn.Linear(self.num_features, num_classes, device=ref.device, dtype=ref.dtype) \
            if num_classes > 0 else nn.Identity()
        self.head.train(self.training)  # a new head follows the model's mode
