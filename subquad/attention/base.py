"""Declared capabilities of attention mechanisms and the shared module base class.

Capabilities are declared, not discovered: each mechanism sets `caps` and callers ask `check(caps, request)` for the
reasons a request would be refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .._shapes import check_hw, check_mask, check_tokens

__all__ = ["AttentionCaps", "Request", "check", "TokenMixer"]


# Every registered mechanism class by name, filled by `registry.register_attention` (this module imports nothing
# from the registry, which imports it): what a refusal lists as the mechanisms that would fit.
REGISTERED: dict[str, type] = {}


@dataclass(frozen=True)
class AttentionCaps:
    """What a mechanism supports.

    Attributes:
        bidirectional: every query may attend to every position (encoder use).
        causal: has a causal mode (query t sees keys <= t only).
        needs_hw: spatial; forward needs hw=(H, W) with H * W == N (the form built with input_size, when the
            mechanism also has a 1-D form: `sequence`).
        supports_mask: honours a key-padding mask (B, N) of bools (True = real token).
        dtypes: floating dtypes the module computes in (others are refused).
        complexity: cost in tokens N, e.g. "O(N)" or "O(N^2)".
        sequence: usable on 1-D token sequences without a grid (LRA, LM); for a `needs_hw` mechanism, the form
            built without input_size.
        relative_positions: the module encodes token positions itself (e.g. Transformer-XL relative terms); a host
            then adds no absolute position embedding.
        grid_ndims: ranks of the token grids (hw) the mechanism can be given: (2,) for (H, W) maps; (2, 3) when it
            also takes (T, H, W) video grids (it mixes them, or it ignores hw and mixes the flattened tokens).
    """

    bidirectional: bool = True
    causal: bool = False
    needs_hw: bool = False
    supports_mask: bool = False
    dtypes: tuple[torch.dtype, ...] = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
    complexity: str = "O(N^2)"
    sequence: bool = True
    notes: str = ""
    relative_positions: bool = False
    grid_ndims: tuple[int, ...] = (2,)


@dataclass(frozen=True)
class Request:
    """What a caller needs from a mechanism (every field optional)."""

    causal: bool = False
    mask: bool = False
    sequence: bool = False
    dtype: torch.dtype | None = None
    extra: dict = field(default_factory=dict)


def check(caps: AttentionCaps, request: Request) -> list[str]:
    """Return the reasons `caps` cannot serve `request` (empty list: supported)."""
    reasons = []
    if request.causal and not caps.causal:
        reasons.append("has no causal mode")
    if not request.causal and not caps.bidirectional:
        reasons.append("is causal only")
    if request.mask and not caps.supports_mask:
        reasons.append("does not support key-padding masks")
    if request.sequence and not caps.sequence:
        reasons.append("needs a 2-D token grid (hw), not a 1-D sequence")
    if request.dtype is not None and request.dtype not in caps.dtypes:
        reasons.append(f"does not compute in {request.dtype}")
    return reasons


def _stage_request(stage: dict) -> Request:
    return Request(causal=bool(stage.get("causal")), sequence=bool(stage.get("sequence")))


def _stage_reasons(cls: type[TokenMixer], stage: dict) -> list[str]:
    """Why the mechanism class `cls` cannot serve `stage` (see `TokenMixer.stage_refusal`), from its declarations."""
    caps = cls.caps
    reasons = check(caps, _stage_request(stage))
    grid = stage.get("grid")
    if grid is not None and len(grid) not in caps.grid_ndims:
        reasons.append(f"takes {'/'.join(f'{n}-D' for n in caps.grid_ndims)} token grids only, not the "
                       f"{len(grid)}-D grid {tuple(grid)}")
    if stage.get("num_prefix_tokens") and not cls.takes_prefix_tokens():
        reasons.append("mixes the token grid and cannot take a class token (build the host with class_token=False,"
                       " global_pool='avg')")
    return reasons


class TokenMixer(nn.Module):
    """Base class of every registered mechanism.

    Subclasses implement `forward(x, hw=None, mask=None)` with x: (B, N, C) -> (B, N, C) and, for the analysis
    tools and tests, `attention_matrix(x, hw)` -> (B, h, N, N), the equivalent token-mixing matrix.
    """

    caps: AttentionCaps = AttentionCaps()
    name: str = "?"
    # Leading non-grid tokens (a class token) in x; spatial mechanisms that accept them set this in __init__.
    num_prefix_tokens: int = 0

    @classmethod
    def stage_refusal(cls, stage: dict) -> str | None:
        """Why this mechanism cannot serve a host stage (None: it can), from its declared capabilities only.

        The stage asks for a causal mode (`causal`), a 1-D sequence without a grid (`sequence`), through the rank of
        `grid` for a 2-D map or a (T, H, W) video grid, and with `num_prefix_tokens` for leading class tokens
        (`takes_prefix_tokens`). The answer is one line that names the mechanism, what it lacks and the registered
        mechanisms that would serve the same stage.
        """
        reasons = _stage_reasons(cls, stage)
        if not reasons:
            return None
        ok = [n for n in sorted(REGISTERED) if not _stage_reasons(REGISTERED[n], stage)]
        who = stage.get("host", "this host")
        return (f"attention {cls.name!r} cannot serve {who}: it {'; '.join(reasons)}; mechanisms that fit: "
                f"{', '.join(ok) or 'none'}")

    @classmethod
    def stage_kwargs(cls, stage: dict) -> dict:
        """The mechanism's adapter: this mechanism's options from what a host knows about a stage.

        `stage` may hold `grid` (construction map (H, W), or (T, H, W) for video), `qkv_bias`, `proj_drop`,
        `num_prefix_tokens`, `window_size`, `shifted` (odd block of a shifted-window pair), `sr_ratio` (the host's
        spatial reduction), `conv_proj` (CvT: the host projects q, k, v by convolutions; hosts that project q, k, v
        themselves pass `host_qkv=True` to `build_stage_attention`), `form` (a
        named official block form, e.g. 'lwa' for L2ViT's local window attention blocks), `causal` (the host needs
        the causal mode, e.g. a language model), `sequence` (1-D tokens without a grid), `host` (the host's name,
        for messages) and `hints` (host options meant for whichever mechanism accepts them, e.g. FLatten's
        `focusing_factor`, LiSA's `D` or L2ViT's `clamp_min`). The default refuses a stage the mechanism's
        capabilities cannot serve (`stage_refusal`, one ValueError line) and passes the generic options this class
        accepts; mechanisms with stage structure (windows, spatial reduction, projection layouts) extend it.
        """
        import inspect

        why = cls.stage_refusal(stage)
        if why is not None:
            raise ValueError(why)
        params = inspect.signature(cls.__init__).parameters
        kw = {"input_size": stage.get("grid"), "qkv_bias": stage.get("qkv_bias"), "proj_drop": stage.get("proj_drop"),
              "causal": True if stage.get("causal") else None, **stage.get("hints", {})}
        if stage.get("num_prefix_tokens"):
            # Every mechanism that can see the token grid is told about prefix (class) tokens (one that mixes the
            # grid and cannot take them was refused above, when the host is built, never at the first forward).
            kw["num_prefix_tokens"] = stage["num_prefix_tokens"]
        return {k: v for k, v in kw.items() if k in params and v is not None}

    @classmethod
    def takes_prefix_tokens(cls) -> bool:
        """Whether leading non-grid tokens (a class token) can precede the grid: always for a mechanism that ignores
        the grid, else when it accepts `num_prefix_tokens`. A grid mixer that has the option but no rule for such
        tokens overrides this."""
        import inspect

        return not cls.caps.needs_hw or "num_prefix_tokens" in inspect.signature(cls.__init__).parameters

    def _check_input(self, x: torch.Tensor, hw=None, mask: torch.Tensor | None = None):
        """Validate x (B, N, C), hw and mask; returns (H, W) or None per `caps.needs_hw`."""
        who = f"{type(self).__name__} ({self.name!r})"
        check_tokens(x, getattr(self, "dim", None), who)
        if mask is not None and not self.caps.supports_mask:
            raise ValueError(f"{who} does not support masks; pass mask=None")
        check_mask(mask, x, who)
        if self.caps.needs_hw:
            return check_hw(x, hw, who, self.num_prefix_tokens)
        # Non-spatial mechanisms ignore hw (it may describe a grid behind prefix tokens).
        return None

    def attention_matrix(self, x: torch.Tensor, hw=None) -> torch.Tensor:
        """(B, N, C) -> (B, h, N, N): the equivalent attention map. Mechanisms override this."""
        raise NotImplementedError(f"mechanism {self.name!r} does not provide attention_matrix()")
