"""The associative-recall host: Zoology's two-layer stack with a short causal convolution before each mixer.

    tokens -> embedding -> depth x [h = h + mixer(conv(LN(h))); h = h + MLP(LN(h))] -> LN -> linear head

`conv` is a depthwise causal convolution over the sequence (kernel `conv_size`, 4 by default), the short
convolution Based (arXiv 2402.18668, Sec. 4) and Zoology's hybrid mixers (arXiv 2312.04927, Sec. 4) put in front of
every attention mixer; it is also the host's only source of order: no position embedding is added for any mechanism
(mechanisms that encode positions themselves, e.g. causal long-short's relative terms, keep them), so every
mechanism sees the same inputs and the model can run at lengths it was not trained on. The mixer is any registered
mechanism with a 1-D form (`build_stage_attention` with a causal or a bidirectional 1-D stage). The head is scored
only at the query positions the caller names (`forward(tokens, positions)`), so training pays for kv logits per
example, not seq_len.

Shapes: tokens (B, L) int64; positions (B, Q) int64 -> logits (B, Q, vocab).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import build_stage_attention
from ..errors import UserError

__all__ = ["RecallModel", "ShortConv"]


class ShortConv(nn.Module):
    """Depthwise causal convolution over the sequence: y[t] = sum_j w[j] x[t - k + 1 + j] + b (zero before t = 0).
    x (B, L, C) -> (B, L, C)."""

    def __init__(self, dim: int, kernel_size: int = 4, device=None, dtype=None) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.conv = nn.Conv1d(dim, dim, kernel_size, groups=dim, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.pad(x.transpose(1, 2), (self.kernel_size - 1, 0))
        return self.conv(y).transpose(1, 2)


class RecallBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, attention: str, attn_kw: dict, causal: bool, conv_size: int,
                 mlp_ratio: float, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        stage = dict(causal=causal, sequence=True, host="the recall host")
        self.norm1 = nn.LayerNorm(dim, **dd)
        self.conv = ShortConv(dim, conv_size, **dd)
        self.attn = build_stage_attention(attention, dim, num_heads, stage, attn_kw, **dd)
        self.norm2 = nn.LayerNorm(dim, **dd)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden, **dd), nn.GELU(), nn.Linear(hidden, dim, **dd))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attn(self.conv(self.norm1(h)))
        return h + self.mlp(self.norm2(h))


class RecallModel(nn.Module):
    """Args:
        vocab_size: tokens.
        dim: d_model (64 or 128 in the arena tasks: the state-size axis).
        depth: mixer layers (2, Zoology's MQAR stack).
        num_heads: heads of every mixer.
        attention: a registered mechanism with a 1-D form; `attn_kw` its options.
        causal: build the mixers' causal forms (recall_causal) or bidirectional ones (recall).
        conv_size: kernel of the short causal convolution before each mixer.
        mlp_ratio: MLP hidden width / dim.
    """

    def __init__(self, vocab_size: int, dim: int = 64, depth: int = 2, num_heads: int = 1,
                 attention: str = "softmax", attn_kw: dict | None = None, causal: bool = False, conv_size: int = 4,
                 mlp_ratio: float = 2.0, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, dim, **dd)
        self.blocks = nn.ModuleList(RecallBlock(dim, num_heads, attention, dict(attn_kw or {}), causal, conv_size,
                                                mlp_ratio, **dd) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, **dd)
        self.head = nn.Linear(dim, vocab_size, **dd)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        if tokens.dtype != torch.int64 or tokens.dim() != 2:
            raise UserError(f"RecallModel takes int64 tokens (B, L), got {tuple(tokens.shape)} {tokens.dtype}")
        h = self.embed(tokens)
        for blk in self.blocks:
            h = blk(h)
        if positions is not None:
            h = torch.gather(h, 1, positions.unsqueeze(-1).expand(-1, -1, h.shape[-1]))
        return self.head(self.norm(h))
