"""`analyze`: every analysis of one model on one image, written as figures, a CSV table and `summary.json`."""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import UserError
from ..files import atomic_savefig, atomic_write, atomic_write_text
from .kernels import plot_kernels, structure_kernels
from .linear_stats import attention_entropy, attention_locality, clamp_share, token_cosine
from .maps import (
    MixerCall,
    collect_mixer_calls,
    grad_cam,
    load_image,
    load_image_with,
    local_matrix,
    mixer_attention,
    plot_grad_cam,
    plot_query_maps,
    query_map,
)
from .rank import attention_rank

__all__ = ["layer_stats", "analyze_model", "STAT_COLUMNS"]

_log = logging.getLogger(__name__)

STAT_COLUMNS = ["layer", "module", "mechanism", "grid", "tokens", "keys", "heads", "rank", "rank_size", "rank_ratio",
                "rank_with_local", "rank_with_local_ratio", "entropy", "entropy_ratio", "locality", "token_cosine",
                "clamp_share"]


def _round(v: Any, nd: int = 4) -> Any:
    return round(v, nd) if isinstance(v, float) else v


def layer_stats(call: MixerCall, attn: torch.Tensor | None = None, locality_k: int = 3, rank_max_tokens: int = 256,
                rank_heads: int | None = 4) -> dict:
    """Rank, entropy, locality, over-smoothing and clamp share of one attention call (first image).

    Args:
        call: a recorded call (`collect_mixer_calls`).
        attn: its map (h, N, n) if already computed.
        locality_k: neighbourhood side for `attention_locality`.
        rank_max_tokens: larger maps use a principal random submatrix of this size for the rank.
        rank_heads: heads used for the rank (None: all).
    """
    attn = mixer_attention(call) if attn is None else attn
    h, N, n = attn.shape
    row: dict[str, Any] = dict.fromkeys(STAT_COLUMNS, None)
    row.update(layer=call.index, module=call.path, mechanism=getattr(call.module, "name", "?"),
               grid=None if call.hw is None else f"{call.hw[0]}x{call.hw[1]}", tokens=N, keys=n, heads=h)
    r = attention_rank(attn, rank_max_tokens, max_heads=rank_heads)
    row.update(rank=r["rank"], rank_size=r["size"], rank_ratio=r["rank_ratio"])
    local = local_matrix(call)
    if local is not None and n == N and local.shape[-1] == N - call.prefix:
        full = attn.clone()
        full[:, call.prefix:, call.prefix:] += local
        rl = attention_rank(full, rank_max_tokens, max_heads=rank_heads)
        row.update(rank_with_local=rl["rank"], rank_with_local_ratio=rl["rank_ratio"])
    row.update(attention_entropy(attn))
    if call.hw is not None:
        row["locality"] = attention_locality(attn, call.hw, locality_k, call.prefix)
    row["token_cosine"] = token_cosine(call.x[:1], call.prefix)
    row["clamp_share"] = clamp_share(call.module, call.x[:1])
    return {k: _round(v) for k, v in row.items()}


def _plot_stats(rows: list[dict], path: Path, title: str, k: int) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = [r["layer"] for r in rows]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    ax = axes[0][0]
    ax.plot(layers, [r["rank_ratio"] for r in rows], "o-", label="attention map")
    if any(r["rank_with_local_ratio"] is not None for r in rows):
        ax.plot(layers, [r["rank_with_local_ratio"] if r["rank_with_local_ratio"] is not None else float("nan")
                         for r in rows], "s--", label="map + local module (LCM)")
    ax.set_ylabel("rank / size (1 = full rank)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=8)
    ax.set_title("rank of the equivalent attention matrix", fontsize=9)
    ax = axes[0][1]
    ax.plot(layers, [r["entropy_ratio"] for r in rows], "o-")
    ax.set_ylabel("entropy / log(keys) (1 = uniform)")
    ax.set_ylim(0, 1.05)
    ax.set_title("attention entropy (per query, mean)", fontsize=9)
    ax = axes[1][0]
    ax.plot(layers, [r["locality"] if r["locality"] is not None else float("nan") for r in rows], "o-")
    ax.set_ylabel(f"mass within {k}x{k} neighbourhood")
    ax.set_ylim(0, 1.05)
    ax.set_title("locality", fontsize=9)
    ax = axes[1][1]
    ax.plot(layers, [r["token_cosine"] for r in rows], "o-")
    ax.set_ylabel("mean pairwise cosine similarity")
    ax.set_title("token similarity across depth (over-smoothing)", fontsize=9)
    for a in [a for rr in axes for a in rr]:
        a.set_xlabel("attention layer (call order)")
        a.grid(True, alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=100)
    plt.close(fig)
    return path


def _resolve_layers(layers: Sequence[int] | None, count: int) -> list[int]:
    if layers is None:
        if count <= 4:
            return list(range(count))
        return sorted({round(i * (count - 1) / 3) for i in range(4)})
    bad = [i for i in layers if not -count <= i < count]
    if bad:
        raise UserError(f"layer index {bad[0]} is out of range: the model has {count} attention layers "
                        f"(0..{count - 1}, or negative from the end)")
    return [i % count for i in layers]


def analyze_model(model: nn.Module, image: str | Path, out: str | Path, img_size: int | None = None,
                  layers: Sequence[int] | None = None, queries: Sequence[tuple[float, float]] | None = None,
                  kernel_heads: Sequence[int] = (0,), locality_k: int = 3, rank_max_tokens: int = 256,
                  rank_heads: int | None = 4, model_name: str = "", transform: Any = None,
                  data_config: dict | None = None, classes: Sequence[str] | None = None) -> dict:
    """Attention maps, Grad-CAM, per-layer statistics and LiSA kernels of `model` on one image.

    Writes to `out`: `attention_maps.png`, `gradcam.png`, `layer_stats.png`, `layer_stats.csv`, `summary.json`, and
    `kernels_layer<i>.png` for each shown layer whose mechanism has kernels (LiSA).

    Args:
        model: an image classifier built from registered mechanisms.
        image: path of the image.
        out: output folder, created only once the model ran and every option was checked (a refused call writes
            nothing).
        img_size: square input side (default: the model's pretrained_cfg size, at most 224).
        layers: attention layers (call order) for the maps and kernels (default: up to 4 spread over depth).
        queries: (x, y) fractions of the image (default: centre and two off-centre points).
        kernel_heads, locality_k, rank_max_tokens, rank_heads: see `kernels`, `linear_stats`, `rank`.
        model_name: the name shown in titles.
        transform: the model's eval transform (PIL image -> tensor), e.g. the one a checkpoint's sidecar describes,
            with `data_config` its `img_size`, `in_chans`, `mean` and `std`; default: resize the shorter side to
            `img_size`, centre-crop, normalise with the model's pretrained_cfg.
        classes: class names (a sidecar's), for the predicted class.
    Returns:
        the summary dict written to summary.json.
    """
    size, queries, arr, x = _prepare_input(model, image, img_size, queries, transform, data_config)
    model.eval()
    device = next(model.parameters()).device
    x = x.to(device)
    calls, logits = collect_mixer_calls(model, x)
    shown = _resolve_layers(layers, len(calls))
    name = model_name or type(model).__name__
    rows, maps, kernels = _layer_rows(calls, shown, queries, kernel_heads, locality_k, rank_max_tokens, rank_heads)
    cam, cls = grad_cam(model, x)
    # Everything is computed and every option checked: only now is `out` created and written.
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    if maps:
        files["attention_maps"] = plot_query_maps(arr, maps, queries, out / "attention_maps.png",
                                                  f"{name}: attention of query points (mean |A| over heads)").name
    label = classes[cls] if classes and cls < len(classes) else None
    files["gradcam"] = plot_grad_cam(arr, cam, out / "gradcam.png",
                                     f"Grad-CAM, class {cls}" + (f" ({label})" if label else "")).name
    files["layer_stats"] = _plot_stats(rows, out / "layer_stats.png", f"{name} on {Path(image).name} ({size}x{size})",
                                       locality_k).name
    def write_table(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=STAT_COLUMNS)
            w.writeheader()
            w.writerows([{k: ("" if v is None else v) for k, v in r.items()} for r in rows])

    atomic_write(out / "layer_stats.csv", write_table)
    files["table"] = "layer_stats.csv"
    if kernels:
        files["kernels"] = {
            i: plot_kernels(k, out / f"kernels_layer{i}.png", list(kernel_heads),
                            f"{name} layer {i}: LiSA kernels W^b (offset 0 at centre)").name
            for i, k in kernels.items()}
    probs = logits[0].float().softmax(-1)
    shown_path = Path(image).resolve()
    try:
        shown_path = shown_path.relative_to(Path.cwd())
    except ValueError:
        pass
    summary = {"model": name, "image": str(shown_path), "img_size": size, "predicted_class": cls,
               "predicted_label": label, "predicted_prob": round(float(probs[cls]), 6),
               "num_attention_layers": len(calls),
               "layers_shown": shown, "queries": [list(q) for q in queries], "locality_k": locality_k,
               "rank_max_tokens": rank_max_tokens, "rank_heads": rank_heads, "layers": rows, "files": files}
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2))
    return summary


def _prepare_input(model: nn.Module, image: str | Path, img_size: int | None,
                   queries: Sequence[tuple[float, float]] | None, transform: Any,
                   data_config: dict | None) -> tuple[int, list[tuple[float, float]], Any, torch.Tensor]:
    """(input side, checked query points, the image as shown, the model's input (1, C, size, size))."""
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    if transform is not None:
        size = int(data_config["img_size"])
    else:
        size = img_size or min(224, int(cfg.get("input_size", (3, 224, 224))[-1]))
    queries = list(queries) if queries else [(0.5, 0.5), (0.3, 0.35), (0.7, 0.7)]
    bad = [q for q in queries if not (0 <= q[0] <= 1 and 0 <= q[1] <= 1)]
    if bad:
        raise UserError(f"query point {bad[0]} is outside the image: give x,y as fractions in [0, 1]")
    if transform is not None:
        arr, x = load_image_with(image, transform, int(data_config["in_chans"]), data_config["mean"],
                                 data_config["std"])
    else:
        arr, x = load_image(image, size, cfg.get("mean", (0.485, 0.456, 0.406)),
                            cfg.get("std", (0.229, 0.224, 0.225)))
    return size, queries, arr, x


def _layer_rows(calls: list, shown: list[int], queries: list[tuple[float, float]], kernel_heads: Sequence[int],
                locality_k: int, rank_max_tokens: int,
                rank_heads: int | None) -> tuple[list[dict], dict[str, list], dict[str, torch.Tensor]]:
    """Per attention call: its statistics row; for the shown layers, the query maps and (LiSA) the kernels to plot,
    by layer index. Writes nothing."""
    rows, maps, kernels = [], {}, {}
    for call in calls:
        attn = mixer_attention(call).cpu()
        rows.append(layer_stats(call, attn, locality_k, rank_max_tokens, rank_heads))
        if call.index in shown and call.hw is not None and attn.shape[-1] == attn.shape[-2]:
            label = f"layer {call.index} ({rows[-1]['mechanism']}, {call.hw[0]}x{call.hw[1]})"
            maps[label] = [query_map(attn, call.hw, q, call.prefix) for q in queries]
        if call.index in shown:
            k = structure_kernels(call.module, kernel_heads)
            if k is not None:
                kernels[str(call.index)] = k
    return rows, maps, kernels
