"""Character-level causal language model (Transformer-LS enwik8/text8 model) with cached incremental decoding.

`CharLM(vocab_size, dim, depth, num_heads, attention="long_short", **attn_kw)` stacks `depth` layers of causal
attention + FFN over byte/character tokens. With `attention="long_short"` it is the official autoregressive model:
token embedding times sqrt(d), the "pre-LN" quirk (the residual is taken from the normalised input,
`h = norm1(h); h = h + attn(h)`), no final LayerNorm, and an output layer tied to the input embedding with its own
bias (`residual="official"`). `residual="standard"` is the textbook pre-LN causal LM (`h = h + attn(LN(h))`,
`h = h + FFN(LN(h))`, final LN), the host the arena's `charlm` task trains with every mechanism. Any registered
mechanism whose declared capabilities include a causal mode works (it is built with `causal=True`); mechanisms that
do not encode positions themselves (`AttentionCaps.relative_positions`) get absolute sinusoid positions added to
the embeddings.

Decoding: `cache = model.init_cache(B)`, then `model(tokens_block, cache=cache)` for consecutive blocks; the
logits equal those of one parallel `model(all_tokens)`. Mechanisms with an `init_cache` method (long_short) keep
their own compressed state; others are recomputed over the kept context (correct, not incremental).

Paper: Transformer-LS (arXiv 2107.02192), Sec. 4.2 (character-level LM) and App. D.
Official: NVIDIA/transformer-ls, `autoregressive/model_lib/model.py` TransformerLSModel / TransformerLSLayer.
Symbols: w window_size, l chunk_size, r rank (see `subquad.attention.long_short.ChunkedLongShortAttention`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import Request, build_stage_attention, check, get_attention_cls, list_attention
from ..attention.functional.long_short import xl_sinusoid
from .registry import register_sequence_model

__all__ = ["CharLM", "CharLMCache", "char_lm"]


#: What a causal LM asks of its mechanism (`build_stage_attention`): the causal mode on 1-D token sequences; each
#: mechanism's adapter turns it into its options (e.g. `causal=True`).
LM_STAGE = dict(causal=True, sequence=True, host="a causal language model")


class FeedForward(nn.Module):
    """fc1 -> GELU (exact) -> dropout -> fc2 -> dropout. x (B, T, C) -> (B, T, C). Official: FeedForwardLayer."""

    def __init__(self, dim: int, hidden: int, drop: float = 0.0, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.fc1 = nn.Linear(dim, hidden, **dd)
        self.fc2 = nn.Linear(hidden, dim, **dd)
        self.dropout = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc2(self.dropout(F.gelu(self.fc1(x)))))


class CharLMLayer(nn.Module):
    """One layer: attention + FFN with the official normalised-input residual or a textbook pre-LN residual.

    `drop` is applied to the attention output (before the residual add) and inside the FFN, for every mechanism
    alike (official: the attention's output dropout and FeedForwardLayer's).

    Shapes: h (B, T, C) -> (B, T, C). Official: TransformerLSLayer (keys `attn`, `norm1`, `ff`, `norm2`).
    """

    def __init__(self, dim: int, num_heads: int, ffn_dim: int, attention: str, attn_kw: dict, drop: float,
                 residual: str, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.residual = residual
        self.attn = build_stage_attention(attention, dim, num_heads, LM_STAGE, attn_kw, **dd)
        self.norm1 = nn.LayerNorm(dim, **dd)
        self.attn_dropout = nn.Dropout(drop)
        self.ff = FeedForward(dim, ffn_dim, drop, **dd)
        self.norm2 = nn.LayerNorm(dim, **dd)

    def _attend(self, h: torch.Tensor, state) -> torch.Tensor:
        if state is None or not hasattr(self.attn, "init_cache"):
            return self.attn_dropout(self.attn(h))
        return self.attn_dropout(self.attn(h, cache=state))

    def forward(self, h: torch.Tensor, state=None) -> torch.Tensor:
        if self.residual == "official":
            h = self.norm1(h)
            h = h + self._attend(h, state)
            h = self.norm2(h)
            return h + self.ff(h)
        h = h + self._attend(self.norm1(h), state)
        return h + self.ff(self.norm2(h))


@dataclass
class CharLMCache:
    """Incremental-decoding state of one `CharLM` (from `init_cache`; updated in place by forward).

    Attributes:
        owner: id of the model that made it.
        batch_size: B.
        t: tokens consumed so far.
        layers: per-layer attention caches (mechanisms with `init_cache`), else None.
        tokens: (B, t) consumed tokens, kept only when some layer must be recomputed (no `init_cache`).
    """

    owner: int
    batch_size: int
    t: int = 0
    layers: list = field(default_factory=list)
    tokens: torch.Tensor | None = None


class CharLM(nn.Module):
    """Causal character-level LM over any causal mechanism (default: Transformer-LS long-short attention).

    Shapes: tokens (B, T) int64 in [0, vocab_size) -> logits (B, T, vocab_size).

    Args:
        vocab_size: number of symbols (256 for bytes).
        dim: model width d.
        depth: layers.
        num_heads: heads h.
        attention: registered mechanism name whose caps declare a causal mode; built for the stage `LM_STAGE`
            (causal, 1-D) by its adapter, plus `**attn_kw`.
        ffn_dim: FFN width (default 4 d).
        dropout: dropout on the attention output and in the FFN (official `dropout`).
        emb_dropout: dropout on the embeddings and the final hidden state (official `emb_dropout`).
        residual: "official" (normalised-input residual, no final LN) or "standard" (pre-LN + final LN).
        pos_embed: "none", "sinusoid" (absolute, added to the embeddings) or None (none when the mechanism encodes
            positions itself, `caps.relative_positions`, e.g. causal long_short; sinusoid otherwise).
        max_context: tokens kept for recomputed (non-incremental) mechanisms during decoding (None: all).
        **attn_kw: mechanism options (e.g. window_size=512, chunk_size=16, rank=1).
    """

    def __init__(self, vocab_size: int, dim: int, depth: int, num_heads: int, attention: str = "long_short",
                 ffn_dim: int | None = None, dropout: float = 0.0, emb_dropout: float = 0.0,
                 residual: str = "official", pos_embed: str | None = None, max_context: int | None = None,
                 device=None, dtype=None, **attn_kw) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if vocab_size < 1 or dim < 1 or depth < 1:
            raise ValueError(f"CharLM: vocab_size, dim and depth must be >= 1, got {vocab_size}, {dim}, {depth}")
        if residual not in ("official", "standard"):
            raise ValueError(f"CharLM: residual must be 'official' or 'standard', got {residual!r}")
        if pos_embed not in (None, "none", "sinusoid"):
            raise ValueError(f"CharLM: pos_embed must be 'none' or 'sinusoid', got {pos_embed!r}")
        reasons = check(get_attention_cls(attention).caps, Request(causal=True, sequence=True))
        if reasons:
            causal = [n for n in list_attention() if not check(get_attention_cls(n).caps,
                                                               Request(causal=True, sequence=True))]
            raise ValueError(f"CharLM: attention {attention!r} {'; '.join(reasons)}, which a language model needs; "
                             f"mechanisms with a causal 1-D form: {', '.join(causal)}")
        self.vocab_size, self.dim, self.depth, self.num_heads = vocab_size, dim, depth, num_heads
        self.attention, self.residual, self.max_context = attention, residual, max_context
        self.in_emb = nn.Embedding(vocab_size, dim, **dd)
        self.emb_dropout = nn.Dropout(emb_dropout)
        self.layers = nn.ModuleList([
            CharLMLayer(dim, num_heads, ffn_dim or 4 * dim, attention, attn_kw, dropout, residual, **dd)
            for _ in range(depth)])
        if pos_embed is None:
            own = all(layer.attn.caps.relative_positions and layer.attn.caps.causal for layer in self.layers)
            pos_embed = "none" if own else "sinusoid"
        self.pos_embed = pos_embed
        self.norm = nn.LayerNorm(dim, **dd) if residual == "standard" else None
        self.out_emb = nn.Linear(dim, vocab_size, **dd)
        self.out_emb.weight = self.in_emb.weight
        if not self.in_emb.weight.is_meta:
            self.apply(self._init_module)

    @staticmethod
    def _init_module(m: nn.Module) -> None:
        """Official `_init_weights`: Linear/Embedding normal(0, 0.02), biases 0, LayerNorm weight normal(1, 0.02);
        Transformer-XL biases normal(0, 0.02)."""
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.normal_(m.weight, 1.0, 0.02)
            nn.init.zeros_(m.bias)
        for name in ("r_w_bias", "r_r_bias"):
            if isinstance(getattr(m, name, None), nn.Parameter):
                nn.init.normal_(getattr(m, name), 0.0, 0.02)

    def _incremental(self) -> bool:
        return all(hasattr(layer.attn, "init_cache") for layer in self.layers)

    def init_cache(self, batch_size: int) -> CharLMCache:
        """An empty decoding cache for `batch_size` sequences."""
        layers = [layer.attn.init_cache(batch_size) if hasattr(layer.attn, "init_cache") else None
                  for layer in self.layers]
        return CharLMCache(owner=id(self), batch_size=batch_size, layers=layers)

    def _embed(self, tokens: torch.Tensor, t0: int) -> torch.Tensor:
        h = self.in_emb(tokens) * math.sqrt(self.dim)
        if self.pos_embed == "sinusoid":
            pos = torch.arange(t0, t0 + tokens.shape[1], device=tokens.device, dtype=h.dtype)
            h = h + xl_sinusoid(pos, self.dim)
        return self.emb_dropout(h)

    def _check_tokens(self, tokens: torch.Tensor) -> None:
        if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"CharLM: tokens must be an integer tensor (B, T), got {tuple(tokens.shape)} "
                             f"{tokens.dtype}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise ValueError(f"CharLM: token ids must lie in [0, {self.vocab_size}), got range "
                             f"[{int(tokens.min())}, {int(tokens.max())}]")

    def _run(self, tokens: torch.Tensor, t0: int, states: list | None) -> torch.Tensor:
        h = self._embed(tokens, t0)
        for i, layer in enumerate(self.layers):
            h = layer(h, None if states is None else states[i])
        if self.norm is not None:
            h = self.norm(h)
        return self.out_emb(self.emb_dropout(h))

    def forward(self, tokens: torch.Tensor, cache: CharLMCache | None = None) -> torch.Tensor:
        """tokens (B, T) -> logits (B, T, vocab). With `cache`, tokens continue the cached text (cache updated)."""
        self._check_tokens(tokens)
        if cache is None:
            return self._run(tokens, 0, None)
        if not isinstance(cache, CharLMCache) or cache.owner != id(self):
            raise ValueError("CharLM: cache was made by another model; use this model's init_cache()")
        if cache.batch_size != tokens.shape[0]:
            raise ValueError(f"CharLM: cache holds batch {cache.batch_size}, tokens have batch {tokens.shape[0]}")
        T = tokens.shape[1]
        if self._incremental():
            logits = self._run(tokens, cache.t, cache.layers)
        else:
            ctx = tokens if cache.tokens is None else torch.cat([cache.tokens, tokens], dim=1)
            if self.max_context is not None:
                ctx = ctx[:, -max(self.max_context, T):]
            start = cache.t + T - ctx.shape[1]
            logits = self._run(ctx, start if self.pos_embed == "sinusoid" else 0, None)[:, -T:]
            cache.tokens = ctx
        cache.t += T
        return logits

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, max_new: int, temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Sample `max_new` tokens after `prompt` (B, T0) with cached decoding; returns (B, T0 + max_new).

        temperature 0 picks the most likely token (greedy); top_k keeps the k most likely tokens.
        """
        self._check_tokens(prompt)
        if prompt.shape[1] < 1:
            raise ValueError("CharLM.generate: the prompt needs at least one token")
        if max_new < 0 or temperature < 0 or (top_k is not None and top_k < 1):
            raise ValueError(f"CharLM.generate: need max_new >= 0, temperature >= 0, top_k >= 1; got {max_new}, "
                             f"{temperature}, {top_k}")
        cache = self.init_cache(prompt.shape[0])
        logits = self(prompt, cache=cache)[:, -1]
        out = [prompt]
        for _ in range(max_new):
            if temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                lg = logits.float() / temperature
                if top_k is not None and top_k < lg.shape[-1]:
                    kth = lg.topk(top_k, dim=-1).values[:, -1:]
                    lg = lg.masked_fill(lg < kth, float("-inf"))
                nxt = torch.multinomial(lg.softmax(dim=-1), 1, generator=generator)
            out.append(nxt)
            logits = self(nxt, cache=cache)[:, -1]
        return torch.cat(out, dim=1)


@register_sequence_model("char_lm")
def char_lm(vocab_size: int = 256, dim: int = 512, depth: int = 12, num_heads: int = 8,
            attention: str = "long_short", **kwargs) -> CharLM:
    """Generic CharLM builder (defaults: the official base size)."""
    return CharLM(vocab_size, dim, depth, num_heads, attention=attention, **kwargs)


@register_sequence_model("charlm_ls_base")
def charlm_ls_base(vocab_size: int = 256, **kwargs) -> CharLM:
    """Official base: 12 layers, d 512, 8 heads, FFN 2048, dropout 0.2, w 512, l 16, r 1 (launch/*base*.sh)."""
    args = dict(dim=512, depth=12, num_heads=8, ffn_dim=2048, dropout=0.2, emb_dropout=0.2, window_size=512,
                chunk_size=16, rank=1)
    return CharLM(vocab_size, **{**args, **kwargs})


@register_sequence_model("charlm_ls_large")
def charlm_ls_large(vocab_size: int = 256, **kwargs) -> CharLM:
    """Official large: 30 layers, d 512, 8 heads, FFN 2048, dropout 0.4, w 512, l 16, r 1 (launch/*large*.sh)."""
    args = dict(dim=512, depth=30, num_heads=8, ffn_dim=2048, dropout=0.4, emb_dropout=0.4, window_size=512,
                chunk_size=16, rank=1)
    return CharLM(vocab_size, **{**args, **kwargs})
