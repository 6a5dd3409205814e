"""LRA encoder classifier: token + learned position embeddings, pre-LN blocks with any 1-D mechanism, pooling, head.

The model of the Transformer-LS LRA experiments (and of the Nystromformer code it derives from): 2 layers, d = 64,
2 heads, FFN 128, a class token inserted in the last layer only, a final LayerNorm and an MLP head. The attention is
any registered mechanism whose caps say `sequence=True`; it is built with `build_attention(name, dim, heads, **kw)`
and called as `attn(x, None, mask)` with x: (B, N, C) and mask: (B, N) bool (True = real token).

Image-like tasks (Pathfinder, pixel-level CIFAR) may give the token grid: with `grid=(H, W)` (T = H * W tokens in
row-major order) every block calls `attn(x, (H, W), mask)` and the mechanism is built with `input_size=(H, W)`, so
spatial mechanisms (structure_aware, focused_linear, window, global_filter, cswin, 2-D long_short) can run. A
spatial mechanism needs the grid intact up to the pooling: mean pooling, no class token.

Module names follow the official code (`model.embeddings.{word_embeddings, position_embeddings}`, `model.cls_embed`,
`model.transformer_{i}.{norm1, mha, norm2, mlpblock}`, `model.norm`, `seq_classifer.mlpblock`), so an official LRA
state dict whose `mha` keys match the mechanism loads with `strict=True`.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch
from torch import nn

from ..attention import Request, build_attention, check, get_attention_cls
from ..errors import UserError
from .registry import register_sequence_model

__all__ = ["LRAEncoder", "LRAClassifier", "POOLING", "lra_encoder", "grid_refusal"]

_logger = logging.getLogger(__name__)

# Pooling modes. cls_last: class token in the last layer only (official --cls_last_layer, every LS script);
# cls: class token through every layer; mean: official mean over the padded length (padded rows zeroed);
# masked_mean: mean over real tokens only.
POOLING = ("cls_last", "cls", "mean", "masked_mean")


def _attn_options(name: str, attn_kw: dict[str, Any] | None, attn_drop: float) -> dict[str, Any]:
    """Mechanism options: `attn_kw` plus `attn_drop` when > 0 and the mechanism accepts it."""
    kw = dict(attn_kw or {})
    if attn_drop > 0 and "attn_drop" not in kw:
        params = inspect.signature(get_attention_cls(name).__init__).parameters
        if "attn_drop" in params or any(p.kind == p.VAR_KEYWORD for p in params.values()):
            kw["attn_drop"] = attn_drop
        else:
            _logger.warning("attention %r has no attn_drop option; attention dropout %.2f is not applied", name,
                            attn_drop)
    return kw


def _check_grid(grid, max_len: int) -> tuple[int, int] | None:
    if grid is None:
        return None
    if len(grid) != 2 or any(int(g) != g or g < 1 for g in grid):
        raise UserError(f"grid must be two positive integers (H, W), got {grid!r}")
    H, W = int(grid[0]), int(grid[1])
    if H * W > max_len:
        raise UserError(f"grid {H}x{W} makes {H * W} tokens, more than max_len={max_len}")
    return H, W


def grid_refusal(attention: str, grid: tuple[int, int] | list[int] | None, pool: str) -> str | None:
    """Why `attention` cannot run in the encoder with this token grid and pooling (None: it can); caps only."""
    caps = get_attention_cls(attention).caps
    reasons = check(caps, Request(sequence=grid is None))
    if reasons:
        what = "1-D sequences" if grid is None else f"a {grid[0]}x{grid[1]} token grid"
        return f"attention {attention!r} cannot encode {what}: it {'; '.join(reasons)}"
    if grid is not None and caps.needs_hw and pool in ("cls_last", "cls"):
        return (f"attention {attention!r} needs the {grid[0]}x{grid[1]} grid intact, which a class token (pool "
                f"{pool!r}) breaks; use pool mean or masked_mean")
    return None


class Embeddings(nn.Module):
    """Token embedding + learned absolute position embedding, both normal(0, 0.02), then dropout.

    Shapes: tokens (B, T) int64 -> (B, T, C).
    Official: NVIDIA/transformer-ls lra/model.py, Embeddings (from mlpen/Nystromformer).
    """

    def __init__(self, vocab_size: int, dim: int, max_len: int, drop: float = 0.0, device=None,
                 dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.max_len = max_len
        self.word_embeddings = nn.Embedding(vocab_size, dim, **dd)
        self.position_embeddings = nn.Embedding(max_len, dim, **dd)
        self.dropout = nn.Dropout(drop)
        if self.word_embeddings.weight.device.type != "meta":
            nn.init.normal_(self.word_embeddings.weight, std=0.02)
            nn.init.normal_(self.position_embeddings.weight, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        T = tokens.shape[1]
        if T > self.max_len:
            raise ValueError(f"sequence length {T} exceeds the model's max_len={self.max_len}; truncate the input "
                             f"or build the model with a larger max_len")
        pos = torch.arange(T, device=tokens.device)
        # (B, T, C)
        return self.dropout(self.word_embeddings(tokens) + self.position_embeddings(pos)[None])


class Block(nn.Module):
    """Pre-LN block: x + attn(LN(x)), then x + FFN(LN(x)); FFN = Linear -> GELU -> drop -> Linear -> drop.

    With a class token `cls` (B, 1, C) (official last-layer rule), the mechanism sees [cls; LN(x)] (the class token
    is **not** normalised) and the residual is [cls; x]; the output then has N + 1 tokens.

    Shapes: x (B, N, C), mask (B, N) bool or None, cls (B, 1, C) or None -> (B, N (+1), C).
    Official: NVIDIA/transformer-ls lra/model.py, Transformer.
    """

    def __init__(self, dim: int, num_heads: int, mlp_dim: int, attention: str, attn_kw: dict[str, Any],
                 drop: float = 0.0, grid: tuple[int, int] | None = None, lcm_kernel_size: int = 0, device=None,
                 dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.hw = grid
        self.norm1 = nn.LayerNorm(dim, **dd)
        size = {"input_size": grid} if grid is not None else {}
        self.mha = build_attention(attention, dim, num_heads, **size, **attn_kw, **dd)
        # L2ViT LGA block (Eq. 8): x + LCM(LN(x)) after the attention branch (needs the grid).
        self.lcm = None
        if lcm_kernel_size:
            from ..attention.enhanced_linear import LocalConcentrationModule

            self.norm_lcm = nn.LayerNorm(dim, **dd)
            self.lcm = LocalConcentrationModule(dim, lcm_kernel_size, **dd)
        # Mechanisms without key-padding masks see padding as ordinary tokens (warned once per model).
        self.use_mask = bool(getattr(self.mha, "caps", None) and self.mha.caps.supports_mask)
        self.dropout1 = nn.Dropout(drop)
        self.norm2 = nn.LayerNorm(dim, **dd)
        self.mlpblock = nn.Sequential(nn.Linear(dim, mlp_dim, **dd), nn.GELU(), nn.Dropout(drop),
                                      nn.Linear(mlp_dim, dim, **dd), nn.Dropout(drop))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, cls: torch.Tensor | None = None) -> torch.Tensor:
        if not self.use_mask:
            mask = None
        if cls is None:
            x = x + self.dropout1(self.mha(self.norm1(x), self.hw, mask))
            if self.lcm is not None:
                x = x + self.lcm(self.norm_lcm(x), self.hw)
        else:
            cls = cls.expand(x.shape[0], -1, -1)
            if mask is not None:
                mask = torch.cat([mask.new_ones(mask.shape[0], 1), mask], dim=1)
            # (B, 1 + N, C)
            h = torch.cat([cls, self.norm1(x)], dim=1)
            x = torch.cat([cls, x], dim=1) + self.dropout1(self.mha(h, self.hw, mask))
        return x + self.mlpblock(self.norm2(x))


class LRAEncoder(nn.Module):
    """Embeddings, `depth` pre-LN blocks and the final LayerNorm, pooled to one vector per sequence.

    Shapes: tokens (B, T) int64, mask (B, T) bool (True = real token) or None -> (B, C).
    Paper: Transformer-LS (arXiv 2107.02192) Sec. 4.1 / App. A, LRA setting (2 layers, d = 64, 2 heads, FFN 128).
    Official: NVIDIA/transformer-ls lra/model.py, Model (`--cls_last_layer`).
    Symbols: C model width (transformer_dim), h heads (num_head), T padded length (max_seq_len).
    """

    def __init__(self, vocab_size: int = 512, dim: int = 64, depth: int = 2, num_heads: int = 2, mlp_dim: int = 128,
                 max_len: int = 2048, attention: str = "softmax", attn_kw: dict[str, Any] | None = None,
                 cls_attn_kw: dict[str, Any] | None = None, pool: str = "cls_last", drop: float = 0.0,
                 attn_drop: float = 0.0, grid: tuple[int, int] | list[int] | None = None, lcm_kernel_size: int = 0,
                 odd_attn_kw: dict[str, Any] | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if pool not in POOLING:
            raise UserError(f"unknown pooling {pool!r}; allowed: {', '.join(POOLING)}")
        if depth < 1:
            raise UserError(f"depth must be >= 1, got {depth}")
        grid = _check_grid(grid, max_len)
        reasons = grid_refusal(attention, grid, pool)
        if reasons:
            raise UserError(reasons)
        if lcm_kernel_size and (grid is None or pool in ("cls_last", "cls")):
            raise UserError(f"lcm_kernel_size={lcm_kernel_size} needs a token grid (grid=(H, W)) and mean pooling "
                            f"(pool mean or masked_mean), got grid={grid} and pool {pool!r}")
        self.grid = grid
        self.pool = pool
        self.num_layers = depth
        self.embeddings = Embeddings(vocab_size, dim, max_len, drop, **dd)
        self.cls_embed = nn.Parameter(torch.zeros(1, 1, dim, **dd)) if pool in ("cls_last", "cls") else None
        kw = _attn_options(attention, attn_kw, attn_drop)
        # With a grid every sequence has exactly H * W tokens (no padding).
        if grid is None and not get_attention_cls(attention).caps.supports_mask:
            _logger.warning("attention %r does not support key-padding masks: padded tokens act as keys", attention)
        for i in range(depth):
            layer_kw = kw
            if odd_attn_kw and i % 2 == 1:
                layer_kw = {**layer_kw, **odd_attn_kw}
            if cls_attn_kw and (pool == "cls" or (pool == "cls_last" and i == depth - 1)):
                layer_kw = {**layer_kw, **cls_attn_kw}
            setattr(self, f"transformer_{i}", Block(dim, num_heads, mlp_dim, attention, layer_kw, drop, grid,
                                                    lcm_kernel_size, **dd))
        self.norm = nn.LayerNorm(dim, **dd)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (B, T) int64, got shape {tuple(tokens.shape)}")
        if mask is not None and (mask.dtype != torch.bool or mask.shape != tokens.shape):
            raise ValueError(f"mask must be a bool tensor of shape {tuple(tokens.shape)}, got {mask.dtype} "
                             f"{tuple(mask.shape)}")
        if self.grid is not None and tokens.shape[1] != self.grid[0] * self.grid[1]:
            raise ValueError(f"grid {self.grid[0]}x{self.grid[1]} needs sequences of {self.grid[0] * self.grid[1]} "
                             f"tokens, got T={tokens.shape[1]}")
        x = self.embeddings(tokens)
        if self.pool == "cls":
            x = torch.cat([self.cls_embed.expand(x.shape[0], -1, -1).to(x.dtype), x], dim=1)
            if mask is not None:
                mask = torch.cat([mask.new_ones(mask.shape[0], 1), mask], dim=1)
        for i in range(self.num_layers):
            cls = self.cls_embed if self.pool == "cls_last" and i == self.num_layers - 1 else None
            x = getattr(self, f"transformer_{i}")(x, mask, cls)
        if self.pool in ("cls_last", "cls"):
            return self.norm(x[:, 0])
        x = self.norm(x)
        if mask is None:
            return x.mean(dim=1)
        m = mask[..., None].to(x.dtype)
        if self.pool == "mean":
            # Official: padded rows zeroed, divided by the padded length.
            return (x * m).mean(dim=1)
        return (x * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)


class ClassifierHead(nn.Module):
    """Linear(in, hidden) -> ReLU -> Linear(hidden, classes). Official: lra/model_wrapper.py, SCHead / SCHeadDual."""

    def __init__(self, in_dim: int, hidden: int, num_classes: int, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.mlpblock = nn.Sequential(nn.Linear(in_dim, hidden, **dd), nn.ReLU(),
                                      nn.Linear(hidden, num_classes, **dd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlpblock(x)


class LRAClassifier(nn.Module):
    """LRA classifier: one encoder and an MLP head; with `dual=True` the two-tower model of the Retrieval task.

    Dual: both documents are encoded by the same encoder, then [x0, x1, x0 * x1, x0 - x1] -> head.

    Shapes: tokens (B, T) int64, mask (B, T) bool or None (and tokens_1, mask_1 likewise when dual) ->
    logits (B, num_classes).
    Paper: Transformer-LS (arXiv 2107.02192) Sec. 4.1, LRA ListOps / Text / Retrieval.
    Official: NVIDIA/transformer-ls lra/model_wrapper.py, ModelForSC / ModelForSCDual.

    Args:
        vocab_size: embedding rows (official 512 for every task; the data need 15-257).
        num_classes: classes of the task.
        dim: model width C.
        depth: blocks.
        num_heads: heads h.
        mlp_dim: FFN hidden width; also the head's hidden width (official transformer_hidden_dim).
        max_len: rows of the position embedding (the padded length).
        attention: a registered mechanism with `caps.sequence` (softmax, linear, long_short, ...).
        attn_kw: options for `build_attention` (e.g. window_size=8, rank=32 for long_short).
        cls_attn_kw: extra options for the block(s) that see the class token (e.g. a mechanism's CLS rule).
        pool: one of `POOLING`.
        drop: dropout on embeddings, residual branches and the FFN.
        attn_drop: attention dropout (only for mechanisms that take `attn_drop`).
        dual: two-tower Retrieval model.
        grid: (H, W) token grid of image-like tasks (T = H * W, row-major): passed to every block as `hw` and to
            the mechanism as `input_size`, which lets spatial mechanisms run (with mean pooling only).
        odd_attn_kw: extra options for the odd-numbered blocks (1, 3, ...), e.g. Swin's alternating
            `shift_size = window_size // 2` for `window`.
        lcm_kernel_size: > 0 adds the L2ViT LCM branch x + LCM(LN(x)) after each attention (L2ViT Eq. 8; needs
            `grid`), e.g. 7 to turn `enhanced_linear` into the paper's enhanced linear attention.
    """

    def __init__(self, vocab_size: int = 512, num_classes: int = 10, dim: int = 64, depth: int = 2,
                 num_heads: int = 2, mlp_dim: int = 128, max_len: int = 2048, attention: str = "softmax",
                 attn_kw: dict[str, Any] | None = None, cls_attn_kw: dict[str, Any] | None = None,
                 pool: str = "cls_last", drop: float = 0.0, attn_drop: float = 0.0, dual: bool = False,
                 grid: tuple[int, int] | list[int] | None = None, lcm_kernel_size: int = 0,
                 odd_attn_kw: dict[str, Any] | None = None, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if num_classes < 2:
            raise UserError(f"num_classes must be >= 2, got {num_classes}")
        self.num_classes = num_classes
        self.dual = dual
        self.model = LRAEncoder(vocab_size, dim, depth, num_heads, mlp_dim, max_len, attention, attn_kw,
                                cls_attn_kw, pool, drop, attn_drop, grid, lcm_kernel_size, odd_attn_kw, **dd)
        self.seq_classifer = ClassifierHead(4 * dim if dual else dim, mlp_dim, num_classes, **dd)

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None, tokens_1: torch.Tensor | None = None,
                mask_1: torch.Tensor | None = None) -> torch.Tensor:
        x0 = self.model(tokens, mask)
        if not self.dual:
            if tokens_1 is not None:
                raise ValueError("tokens_1 given to a single-tower classifier; build it with dual=True")
            return self.seq_classifer(x0)
        if tokens_1 is None:
            raise ValueError("the two-tower (dual=True) classifier needs tokens_1 (the second document)")
        x1 = self.model(tokens_1, mask_1)
        return self.seq_classifer(torch.cat([x0, x1, x0 * x1, x0 - x1], dim=-1))


@register_sequence_model("lra_encoder")
def lra_encoder(**kwargs: Any) -> LRAClassifier:
    """Build an `LRAClassifier` (defaults: the papers' LRA model, 2 layers, d = 64, 2 heads, FFN 128, CLS last)."""
    return LRAClassifier(**kwargs)
