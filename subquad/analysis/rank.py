"""Rank of equivalent attention maps (FLatten Fig. 5 style).

Plain kernel linear attention phi(Q) phi(K)^T (row-normalised) has rank at most the head dim d, whatever N is
(FLatten Sec. 4.2: 54/196 in a DeiT-T layer); softmax attention and linear attention with a depthwise-conv term (the
DWC of focused linear attention, or L2ViT's LCM added as a local matrix) are close to full rank.

Rank is numerical: singular values above `rtol * sigma_max`, computed in float64. For maps larger than `max_tokens`
the rank of a principal submatrix on `max_tokens` random token indices (fixed seed) is reported; it equals
min(rank, size) for generic low-rank maps, so the ratio rank / size stays comparable across sizes.
"""

from __future__ import annotations

import torch

__all__ = ["matrix_rank", "attention_rank"]


def matrix_rank(a: torch.Tensor, rtol: float = 1e-4) -> torch.Tensor:
    """Numerical rank of each matrix in a batch.

    Args:
        a: (..., M, K) matrices.
        rtol: singular values <= rtol * largest singular value count as zero (1e-4 suits maps computed in fp32).
    Returns:
        (...,) integer ranks.
    """
    s = torch.linalg.svdvals(a.detach().to(torch.float64))  # (..., min(M, K))
    top = s[..., :1].clamp_min(torch.finfo(torch.float64).tiny)
    return (s > rtol * top).sum(-1)


def attention_rank(attn: torch.Tensor, max_tokens: int = 256, rtol: float = 1e-4, seed: int = 0,
                   max_heads: int | None = None) -> dict:
    """Rank per head of an attention map.

    Args:
        attn: (h, N, n) one image's map per head (n may differ from N under spatial reduction).
        max_tokens: above this size a principal random submatrix of this many rows (and columns) is used.
        rtol: relative singular-value threshold.
        seed: seed of the index sample.
        max_heads: analyse only the first heads (None: all).
    Returns:
        {'ranks': [per head], 'size': matrix size used (min side), 'rank': mean rank, 'rank_ratio': mean / size,
         'sampled': whether a submatrix was used}.
    """
    if attn.dim() != 3:
        raise ValueError(f"attention_rank expects one image's map (h, N, n), got shape {tuple(attn.shape)}")
    a = attn if max_heads is None else attn[:max_heads]
    h, N, n = a.shape
    sampled = max(N, n) > max_tokens
    if sampled:
        g = torch.Generator().manual_seed(seed)
        m = min(max_tokens, N, n)
        rows = torch.randperm(N, generator=g)[:m].sort().values
        cols = rows if N == n else torch.randperm(n, generator=g)[:m].sort().values
        a = a[:, rows][:, :, cols]
    ranks = matrix_rank(a, rtol).tolist()
    size = min(a.shape[-2:])
    mean = sum(ranks) / len(ranks)
    return {"ranks": ranks, "size": size, "rank": mean, "rank_ratio": mean / size, "sampled": sampled}
