"""Backbone families. Importing this package registers every model into timm's registry.

One import per family file (at the end of this file); each holds its blocks and host class, `remap_official` and a
table of `Variant`s that `register_family` (`_builder.py`) turns into timm entry points, `default_cfgs` and model
cards. Every host takes its mechanism as `attn=` and the mechanism's options as `attn_kwargs=`.
"""

from __future__ import annotations

from . import vit  # noqa: F401
from ._base import InputShapeError
from ._builder import NON_STD
from ._card import CARDS, ModelCard, get_card
from ..errors import UserError

__all__ = ["CARDS", "NON_STD", "InputShapeError", "ModelCard", "get_card", "create_model", "list_models",
           "is_subquad_model"]


def is_subquad_model(name: str) -> bool:
    return name.split(".")[0] in set(list_models())


def list_models(filter: str = "") -> list[str]:  # noqa: A002 - mirrors timm.list_models(filter=...)
    """Models registered by subquad (tiny `*_micro` variants included), optionally filtered by a glob/substring.

    The list is timm's registry restricted to subquad's family modules (not the cards: a card without a model, or
    a model without a card, is then a test failure rather than invisible)."""
    import timm

    from ._builder import FAMILY_MODULES

    if filter and not any(c in filter for c in "*?["):
        filter = f"*{filter}*"  # noqa: A001
    return timm.list_models(filter or "", module=sorted(FAMILY_MODULES))


def _check_img_size(name: str, img_size) -> None:
    """Refuse an `img_size` below a subquad model's smallest input (its pretrained cfg's `min_input_size`: the total
    stride, or what its stages need) in one line, before any stage is built with an empty grid."""
    if img_size is None or not is_subquad_model(name.split(".")[0]):
        return
    import timm

    cfg = timm.models.get_pretrained_cfg(name.split(".")[0])
    least = getattr(cfg, "min_input_size", None) if cfg is not None else None
    if not least:
        return
    sides = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    if len(sides) == 2 and all(isinstance(v, int) for v in sides) and (sides[0] < least[-2] or sides[1] < least[-1]):
        raise UserError(f"{name}: img_size {img_size} is smaller than the model's total stride or smallest input "
                        f"{least[-2]}x{least[-1]} (its pretrained cfg's min_input_size); use at least "
                        f"{least[-2]}x{least[-1]}")


class ModelOptionError(UserError, TypeError):
    """A keyword the model's constructor does not take: one line for the command line, and still a TypeError for
    code that catches one."""


def create_model(name: str, pretrained: bool = False, checkpoint_path: str | None = None, **kwargs):
    """Build a registered model by name (subquad's or any timm model) through `timm.create_model`.

    Args:
        name: a registered name (`subquad.list_models()`, or any timm model).
        pretrained: load the released weights of the tag in `name` (e.g. `l2vit_base.in22k_ft_in1k`; the first
            tag without one): downloaded once from the official release URL into
            `<torch.hub.get_dir()>/checkpoints/subquad/<name>.<tag>-<url hash>.pth` (`TORCH_HOME` moves it) and read
            from there afterwards, or read from `pretrained_cfg_overlay=dict(file=PATH)` (a file downloaded by
            hand; no network). Offline, a one-line `UserError` names the URL.
        checkpoint_path: an official `.pth` or a subquad `.safetensors` file, loaded safely (weights only) through
            the family's remap function with strict key checking.
        **kwargs: model options (`num_classes`, `img_size`, `features_only`, `device`, attention choices, ...).
    """
    import timm

    from ..errors import unknown_name

    if not timm.is_model(name.split(".")[0]):
        raise unknown_name("model", name, list_models() or timm.list_models())
    _check_img_size(name, kwargs.get("img_size"))
    if checkpoint_path is not None and is_subquad_model(name):
        kwargs["subquad_checkpoint"] = checkpoint_path
        checkpoint_path = None
    try:
        model = timm.create_model(name, pretrained=pretrained, **kwargs)
    except TypeError as e:
        if "unexpected keyword argument" not in str(e):
            raise
        raise ModelOptionError(f"cannot build model {name!r}: {str(e).splitlines()[0]}") from e
    except AssertionError as e:  # timm's feature wrapper asserts on out_indices
        if not kwargs.get("features_only"):
            raise
        raise UserError(f"cannot build model {name!r} with features_only: {str(e).splitlines()[0]}") from e
    if checkpoint_path is not None:
        from ._builder import load_checkpoint

        load_checkpoint(model, checkpoint_path)
    return model


# Backbone family modules added by the family owners (one per line; each registers its models and cards).
from . import l2vit  # noqa: E402,F401,I001
from . import flatten_pvt  # noqa: E402,F401
from . import flatten_pvt_v2  # noqa: E402,F401
from . import flatten_deit  # noqa: E402,F401
from . import vil_ls  # noqa: E402,F401
from . import lisanet  # noqa: E402,F401
from . import flatten_swin  # noqa: E402,F401
from . import flatten_cswin  # noqa: E402,F401
from . import cvt_ls  # noqa: E402,F401
from . import pola_pvt  # noqa: E402,F401
from . import pola_swin  # noqa: E402,F401
from . import inline_deit  # noqa: E402,F401
from . import inline_pvt  # noqa: E402,F401
from . import inline_swin  # noqa: E402,F401
from . import inline_cswin  # noqa: E402,F401
from . import mlla  # noqa: E402,F401
from . import agent_deit  # noqa: E402,F401
from . import agent_pvt  # noqa: E402,F401
from . import agent_swin  # noqa: E402,F401
from . import agent_cswin  # noqa: E402,F401
