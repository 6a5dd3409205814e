"""Load state dicts written by subquad <= 0.1, when some mechanisms had one set of parameter names per official form.

`remap_legacy(state_dict, model)` renames (and concatenates) the old keys of every long-short and focused linear
module in `model`, and the CvT*-LS dynamic projection that moved into its long-short module. Detection is by key
names only (no version field); a current state dict passes unchanged, so the function can run on every load of a
subquad checkpoint.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["remap_legacy"]


def remap_legacy(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Old subquad key names -> current ones for `model` (see the module docstring)."""
    from ..attention.focused_linear import remap_legacy as focused_legacy
    from ..attention.long_short import remap_legacy as long_short_legacy
    from ..models.cvt_ls import CvTLS
    from ..models.cvt_ls import remap_legacy as cvt_legacy

    if isinstance(model, CvTLS):
        state_dict = cvt_legacy(state_dict, model)
    return focused_legacy(long_short_legacy(state_dict, model), model)
