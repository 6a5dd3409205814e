"""LiSA kernels as images (LiSA Fig. 4).

The "structure_aware" mechanism documents its learnable token-domain kernels `kernel_b` (h, D, H0, W0) (and
`kernel_a` (C, D, H0, W0)), indexed by circular offset (key - query) mod (H0, W0). For display the offsets are
rolled so that offset (0, 0) sits at the centre of each image.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from ..errors import UserError
from ..files import atomic_savefig

__all__ = ["structure_kernels", "plot_kernels", "fit_suptitle"]


def structure_kernels(module: nn.Module, heads: Sequence[int] = (0,)) -> torch.Tensor | None:
    """Kernels W^b of chosen heads, centred: (len(heads), D, H0, W0); None when `module` has no `kernel_b`.

    Args:
        module: a mechanism; only modules with a 4-D `kernel_b` parameter (LiSA) have kernels to show.
        heads: head indices (a shared kernel has one head, 0).
    """
    kb = getattr(module, "kernel_b", None)
    if not isinstance(kb, torch.Tensor) or kb.dim() != 4:
        return None
    bad = [h for h in heads if not 0 <= h < kb.shape[0]]
    if bad:
        raise UserError(f"kernel head(s) {bad} out of range: this layer has {kb.shape[0]} kernel head(s) "
                        f"(0..{kb.shape[0] - 1})")
    k = kb.detach().float()[list(heads)]  # (heads, D, H0, W0)
    H0, W0 = k.shape[-2:]
    return torch.roll(k, shifts=(H0 // 2, W0 // 2), dims=(-2, -1))


def fit_suptitle(fig, title: str, fontsize: float = 10, margin: float = 0.02) -> None:
    """Set `title` as the figure's suptitle, wrapped onto as many lines as it takes to fit the figure's width (a
    narrow grid of a few kernels is narrower than one line of title), and lay the axes out below it."""
    import textwrap

    renderer = fig.canvas.get_renderer()
    limit = fig.bbox.width * (1 - 2 * margin)
    text = title
    width = len(title)
    t = fig.suptitle(text, fontsize=fontsize)
    while t.get_window_extent(renderer).width > limit and width > 8:
        width -= 2
        text = textwrap.fill(title, width, break_long_words=False)
        t.set_text(text)
    fig.tight_layout()
    # Room for the title's lines above the axes.
    top = 1 - (t.get_window_extent(renderer).height / fig.bbox.height) - margin
    fig.subplots_adjust(top=min(fig.subplotpars.top, top))


def plot_kernels(kernels: torch.Tensor, path: str | Path, heads: Sequence[int], title: str = "") -> Path:
    """Grid of kernel images (rows: heads, columns: d = 1..D), diverging colours centred on 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nh, D = kernels.shape[:2]
    fig, axes = plt.subplots(nh, D, figsize=(1.6 * D + 0.6, 1.7 * nh + 0.6), squeeze=False)
    for i in range(nh):
        for d in range(D):
            k = kernels[i, d].numpy()
            lim = float(abs(k).max()) or 1.0
            ax = axes[i][d]
            ax.imshow(k, cmap="RdBu_r", vmin=-lim, vmax=lim)
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(f"d={d}", fontsize=8)
            if d == 0:
                ax.set_ylabel(f"head {heads[i]}", fontsize=8)
    fit_suptitle(fig, title or "LiSA kernels W^b (offset 0 at the centre)", fontsize=10)
    path = Path(path)
    atomic_savefig(fig, path, dpi=100)
    plt.close(fig)
    return path
