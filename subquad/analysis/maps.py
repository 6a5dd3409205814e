"""Attention inputs of every block, attention maps of query points, Grad-CAM, and image overlays.

Every block's attention is found as the outermost `TokenMixer` modules of a model; forward pre-hooks record the
input x (B, N, C) and the grid hw each one receives, so `attention_matrix(x, hw)` can be evaluated afterwards for any
mechanism. A sibling module of the mixer in the same block with `equivalent_matrix(x, hw)` (L2ViT's LCM) is recorded
too, so its linearised token-mixing map can be added (the block's local + global map, FLatten Eq. 11 style).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..attention.base import TokenMixer
from ..errors import UserError
from ..files import atomic_savefig

__all__ = ["MixerCall", "find_mixers", "collect_mixer_calls", "mixer_attention", "query_map", "grad_cam",
           "load_image", "plot_query_maps", "plot_grad_cam"]

_log = logging.getLogger(__name__)


@dataclass
class MixerCall:
    """One call of a block's attention.

    Attributes:
        index: position in call order (the layer index users pass to --layers).
        path: module path in the model.
        module: the mechanism.
        x: (B, N, C) its input (detached).
        hw: the token grid it was given (None for sequence calls).
        local: (module path, module, input (B, N, C)) of sibling modules that have `equivalent_matrix`.
    """

    index: int
    path: str
    module: TokenMixer
    x: torch.Tensor
    hw: tuple[int, int] | None
    local: list[tuple[str, nn.Module, torch.Tensor]] = field(default_factory=list)

    @property
    def prefix(self) -> int:
        """Leading non-grid tokens (a class token): N - H * W when the grid is known."""
        if self.hw is None:
            return 0
        return max(0, self.x.shape[1] - self.hw[0] * self.hw[1])


def find_mixers(model: nn.Module) -> list[tuple[str, TokenMixer]]:
    """Outermost TokenMixer modules of `model` (a mixer nested inside another mixer is part of it)."""
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, TokenMixer)]
    outer = []
    for name, m in found:
        if not any(name.startswith(o + ".") for o, _ in outer):
            outer.append((name, m))
    return outer


def _hw_from(args: tuple, kwargs: dict) -> tuple[int, int] | None:
    hw = args[1] if len(args) > 1 else kwargs.get("hw")
    return None if hw is None else (int(hw[0]), int(hw[1]))


def collect_mixer_calls(model: nn.Module, images: torch.Tensor) -> tuple[list[MixerCall], torch.Tensor]:
    """Run `model(images)` without gradients and record every attention call.

    Args:
        model: an image model in eval mode.
        images: (B, 3, H, W).
    Returns:
        (calls in call order, logits).
    """
    mixers = find_mixers(model)
    if not mixers:
        raise UserError(f"{type(model).__name__} has no attention modules (no subquad TokenMixer inside); "
                        "analyze works on models built from registered mechanisms")
    modules = dict(model.named_modules())
    calls: list[MixerCall] = []
    last_by_parent: dict[str, MixerCall] = {}
    handles = []

    def mixer_hook(path: str):
        def hook(mod, args, kwargs):
            call = MixerCall(len(calls), path, mod, args[0].detach(), _hw_from(args, kwargs))
            calls.append(call)
            last_by_parent[path.rpartition(".")[0]] = call

        return hook

    def local_hook(path: str, parent: str):
        def hook(mod, args, kwargs):
            call = last_by_parent.get(parent)
            if call is not None:
                call.local.append((path, mod, args[0].detach()))

        return hook

    for path, mod in mixers:
        handles.append(mod.register_forward_pre_hook(mixer_hook(path), with_kwargs=True))
        parent = path.rpartition(".")[0]
        siblings = modules[parent].named_children() if parent in modules else []
        for child_name, child in siblings:
            if child is not mod and callable(getattr(child, "equivalent_matrix", None)):
                child_path = f"{parent}.{child_name}" if parent else child_name
                handles.append(child.register_forward_pre_hook(local_hook(child_path, parent), with_kwargs=True))
    try:
        with torch.no_grad():
            logits = model(images)
    finally:
        for h in handles:
            h.remove()
    if not calls:
        raise UserError(f"{type(model).__name__}: none of its {len(mixers)} attention modules was called through "
                        "forward(x, hw) (hosts that call another method, e.g. forward_qkv, cannot be analysed)")
    return calls, logits


def mixer_attention(call: MixerCall) -> torch.Tensor:
    """The equivalent map of one call for the first image: (h, N, n). One-line UserError if unsupported."""
    try:
        with torch.no_grad():
            a = call.module.attention_matrix(call.x[:1], call.hw)
    except NotImplementedError:
        raise UserError(f"layer {call.index} ({call.path}): mechanism {getattr(call.module, 'name', '?')!r} "
                        "does not provide attention_matrix(); analyze needs it") from None
    return a[0].detach().float()


def local_matrix(call: MixerCall, max_elements: float = 1.5e8) -> torch.Tensor | None:
    """(N, N) mean linearised map of the block's local module(s) (LCM), or None.

    `equivalent_matrix` builds per-channel (C, N, N) conv matrices; calls with C * N^2 above `max_elements` are
    skipped (None) to bound memory (at 224 px this skips L2ViT's first stage, 96 x 3136^2).
    """
    mats = []
    for _, mod, x in call.local:
        if x.shape[-1] * x.shape[-2] ** 2 > max_elements:
            return None
        try:
            with torch.no_grad():
                mats.append(mod.equivalent_matrix(x[:1], call.hw)[0].float())
        except Exception as e:  # noqa: BLE001 - the local map is optional; the layer keeps its other statistics
            _log.warning("layer %d: %s.equivalent_matrix failed at grid %s (%s: %s); rank_with_local left empty",
                         call.index, type(mod).__name__, call.hw, type(e).__name__, str(e).splitlines()[0][:120])
            return None
    return sum(mats) if mats else None


def query_token(query: tuple[float, float], hw: tuple[int, int], prefix: int) -> int:
    """Token index of an image point given as fractions (x, y) in [0, 1]."""
    H, W = hw
    col = min(W - 1, max(0, int(query[0] * W)))
    row = min(H - 1, max(0, int(query[1] * H)))
    return prefix + row * W + col


def query_map(attn: torch.Tensor, hw: tuple[int, int], query: tuple[float, float], prefix: int = 0) -> np.ndarray:
    """Head-mean |attention| of one query over the key grid: (H, W) array (None-safe for square maps only).

    Args:
        attn: (h, N, N) with N = prefix + H * W.
        hw: grid (H, W).
        query: (x, y) fractions of the image.
        prefix: leading non-grid tokens.
    """
    H, W = hw
    if attn.shape[-1] != prefix + H * W:
        raise UserError(f"attention map has {attn.shape[-1]} keys, not the {prefix + H * W} grid tokens of "
                        f"{H}x{W} (spatial reduction): query maps need token-to-token maps")
    row = attn[:, query_token(query, hw, prefix), prefix:].abs().mean(0)  # (H*W,)
    return row.reshape(H, W).numpy()


def grad_cam(model: nn.Module, images: torch.Tensor, target: int | None = None) -> tuple[np.ndarray, int]:
    """Grad-CAM of the predicted (or `target`) class on the last attention call with a token grid (L2ViT Fig. 1).

    The activations are the tokens entering the block that holds that attention module (its residual stream; the
    mixer's own input when the block's input is not a (B, N, C) token tensor); weights are the gradient averaged
    over tokens per channel. The block input is used, not its output, because in class-token models the grid
    tokens leaving the last block no longer reach the logits.

    Args:
        model: image classifier in eval mode.
        images: (1, 3, H, W).
        target: class index (None: the arg-max).
    Returns:
        (cam (h, w) in [0, 1] on that attention grid, class index).
    """
    mixers = find_mixers(model)
    if not mixers:
        raise UserError(f"{type(model).__name__} has no attention modules for Grad-CAM")
    modules = dict(model.named_modules())
    records: list[dict] = []
    pending: dict[str, torch.Tensor] = {}

    def keep_block(path: str):
        def hook(mod, args, kwargs):
            x = args[0] if args else None
            if isinstance(x, torch.Tensor) and x.requires_grad and x.dim() == 3:
                x.retain_grad()
                pending[path] = x

        return hook

    def keep_mixer(path: str):
        def hook(mod, args, kwargs):
            x, hw = args[0], _hw_from(args, kwargs)
            if hw is None or not x.requires_grad or x.shape[1] < hw[0] * hw[1]:
                return
            x.retain_grad()
            block = pending.pop(path.rpartition(".")[0], None)
            records.append({"hw": hw, "n": x.shape[1], "mixer": x, "block": block})

        return hook

    handles = []
    for path, mixer in mixers:
        handles.append(mixer.register_forward_pre_hook(keep_mixer(path), with_kwargs=True))
        parent = path.rpartition(".")[0]
        if parent and parent in modules:
            handles.append(modules[parent].register_forward_pre_hook(keep_block(parent), with_kwargs=True))
    try:
        with torch.enable_grad():
            logits = model(images)
            cls = int(logits[0].argmax()) if target is None else int(target)
            model.zero_grad(set_to_none=True)
            logits[0, cls].backward()
    finally:
        for h in handles:
            h.remove()
    if not records:
        raise UserError("Grad-CAM needs an attention layer on a token grid (hw); no attention call had one")
    rec = records[-1]
    hw, n = rec["hw"], rec["n"]
    act = rec["block"]
    if not (isinstance(act, torch.Tensor) and act.shape[1] == n and act.grad is not None):
        act = rec["mixer"]
    if act.grad is None:
        raise UserError("Grad-CAM: the logits do not depend on the last attention layer's tokens")
    prefix = n - hw[0] * hw[1]
    a, g = act[0, prefix:].detach(), act.grad[0, prefix:]  # (H*W, C)
    cam = torch.relu((a * g.mean(0, keepdim=True)).sum(-1)).reshape(hw)
    cam = cam / cam.max().clamp_min(1e-12)
    return cam.float().numpy(), cls


def load_image(path: str | Path, size: int, mean: Sequence[float], std: Sequence[float]
               ) -> tuple[np.ndarray, torch.Tensor]:
    """Read an image, resize its shorter side to `size`, centre-crop size x size.

    Returns:
        (uint8 array (size, size, 3) for display, normalised tensor (1, 3, size, size)).
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im = im.convert("RGB")
            w, h = im.size
            scale = size / min(w, h)
            im = im.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.BICUBIC)
            w, h = im.size
            left, top = (w - size) // 2, (h - size) // 2
            im = im.crop((left, top, left + size, top + size))
            arr = np.asarray(im, dtype=np.uint8).copy()
    except FileNotFoundError:
        raise UserError(f"cannot read image {str(path)!r}: no such file") from None
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise UserError(f"cannot read image {str(path)!r}: {str(e).splitlines()[0] if str(e) else 'not an image'}"
                        ) from None
    t = torch.from_numpy(arr).permute(2, 0, 1).float().div(255.0)
    t = (t - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    return arr, t.unsqueeze(0)


def load_image_with(path: str | Path, transform, in_chans: int, mean: Sequence[float], std: Sequence[float]
                    ) -> tuple[np.ndarray, torch.Tensor]:
    """Read an image through a model's eval transform (e.g. a checkpoint sidecar's), grey for 1-channel models.

    Returns:
        (uint8 array (H, W, 3) of exactly what the model sees, un-normalised, for display; tensor (1, C, H, W)).
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            x = transform(im.convert("L" if in_chans == 1 else "RGB"))
    except FileNotFoundError:
        raise UserError(f"cannot read image {str(path)!r}: no such file") from None
    except (UnidentifiedImageError, OSError) as e:
        raise UserError(f"cannot read image {str(path)!r}: {str(e).splitlines()[0] if str(e) else 'not an image'}"
                        ) from None
    shown = x * torch.tensor(std)[:, None, None] + torch.tensor(mean)[:, None, None]
    shown = shown.expand(3, -1, -1) if shown.shape[0] == 1 else shown[:3]
    arr = (shown.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy().copy()
    return arr, x.unsqueeze(0)


def _upsample(heat: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    t = torch.from_numpy(np.ascontiguousarray(heat, dtype=np.float32))[None, None]
    return torch.nn.functional.interpolate(t, size=size, mode="bilinear", align_corners=False)[0, 0].numpy()


def plot_query_maps(image: np.ndarray, maps: dict, queries: Sequence[tuple[float, float]], path: str | Path,
                    title: str = "") -> Path:
    """Overlay grid: rows = layers, columns = query points; each panel the head-mean |attention| of the query.

    Args:
        image: (S, S, 3) uint8.
        maps: {layer label: [(H, W) map per query]}.
        queries: (x, y) fractions, marked with a star.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    S = image.shape[:2]
    nr, nc = len(maps), len(queries)
    fig, axes = plt.subplots(nr, nc, figsize=(2.3 * nc + 0.4, 2.3 * nr + 0.6), squeeze=False)
    for i, (label, per_query) in enumerate(maps.items()):
        for j, m in enumerate(per_query):
            ax = axes[i][j]
            heat = _upsample(m / max(float(m.max()), 1e-12), S)
            ax.imshow(image)
            ax.imshow(heat, cmap="jet", alpha=0.5, vmin=0, vmax=1)
            ax.plot(queries[j][0] * S[1], queries[j][1] * S[0], marker="*", color="white", ms=12, mec="black")
            ax.set_xticks([])
            ax.set_yticks([])
            if j == 0:
                ax.set_ylabel(label, fontsize=8)
            if i == 0:
                ax.set_title(f"query ({queries[j][0]:.2f}, {queries[j][1]:.2f})", fontsize=8)
    fig.suptitle(title or "attention of query points (mean over heads, |A|)", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    atomic_savefig(fig, path, dpi=90)
    plt.close(fig)
    return path


def plot_grad_cam(image: np.ndarray, cam: np.ndarray, path: str | Path, title: str = "") -> Path:
    """Image beside its Grad-CAM overlay."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(6.4, 3.4))
    axes[0].imshow(image)
    axes[0].set_title("input", fontsize=9)
    axes[1].imshow(image)
    axes[1].imshow(_upsample(cam, image.shape[:2]), cmap="jet", alpha=0.5, vmin=0, vmax=1)
    axes[1].set_title(title or "Grad-CAM", fontsize=9)
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    path = Path(path)
    atomic_savefig(fig, path, dpi=100)
    plt.close(fig)
    return path
