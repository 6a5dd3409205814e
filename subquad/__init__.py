"""subquad: sub-quadratic attention for vision transformers and long sequences.

Importing subquad registers every mechanism (`build_attention`) and every model into timm's registry
(`timm.create_model('l2vit_tiny')` works after `import subquad`).
"""

from __future__ import annotations

from . import attention, models, sequence  # noqa: F401  (registration)
from .attention import build_attention, list_attention
from .bench.flops import count_macs
from .errors import UserError
from .models import create_model, list_models
from .version import __version__

__all__ = ["create_model", "list_models", "build_attention", "list_attention", "count_macs", "UserError",
           "__version__"]
