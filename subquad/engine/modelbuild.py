"""Building an image model by name with the options every image model takes, and checking its input size (used
by training and by every command that loads a checkpoint)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import UserError

__all__ = ["build_model", "model_input", "check_img_size", "first_line"]


def first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def build_model(name: str, num_classes: int, img_size: int | tuple[int, int] | None = None,
                drop_path: float | None = None,
                drop: float = 0.0, device: torch.device | str = "cpu",
                model_kwargs: dict[str, Any] | None = None) -> nn.Module:
    """create_model with the options every image model takes (plus `model_kwargs` for the model's constructor);
    unknown names and refused sizes are a UserError."""
    from ..models import create_model

    kw: dict[str, Any] = {**(model_kwargs or {}), "num_classes": num_classes}
    if drop_path is not None:
        kw["drop_path_rate"] = drop_path
    if drop:
        kw["drop_rate"] = drop
    if img_size is not None:
        if min((img_size,) if isinstance(img_size, int) else img_size) < 1:
            raise UserError(f"--img-size must be >= 1, got {img_size}")
        kw["img_size"] = img_size
    try:
        try:
            model = create_model(name, **kw)
        except TypeError as e:
            if "img_size" not in str(e):
                raise
            kw.pop("img_size")
            model = create_model(name, **kw)
    except UserError:
        raise
    except (ValueError, AssertionError, RuntimeError, TypeError) as e:
        raise UserError(f"cannot build model {name!r} with {kw}: {first_line(e)}") from e  # SUBQUAD_DEBUG shows e
    return model.to(device)


def model_input(model: nn.Module, img_size: int | None) -> tuple[int, int]:
    """(in_chans, side) the model takes: its pretrained_cfg's input_size unless `img_size` is given."""
    c, h, _ = (getattr(model, "pretrained_cfg", None) or {}).get("input_size", (3, 224, 224))
    return int(c), int(img_size or h)


@torch.no_grad()
def check_img_size(model: nn.Module, name: str, in_chans: int, img_size: int | tuple[int, int],
                   device: torch.device) -> None:
    """One eval forward at the requested size (S or (H, W)); a model that cannot take it gives a one-line
    UserError."""
    h, w = (img_size, img_size) if isinstance(img_size, int) else img_size
    was_training = model.training
    model.eval()
    try:
        model(torch.zeros(1, in_chans, h, w, device=device))
    except (RuntimeError, ValueError, AssertionError, IndexError) as e:
        shown = h if h == w else f"{h}x{w}"
        raise UserError(f"model {name!r} cannot take --img-size {shown}: {first_line(e)}") from e
    finally:
        model.train(was_training)
