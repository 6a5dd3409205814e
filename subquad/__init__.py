"""subquad: sub-quadratic attention for vision transformers and long sequences.

`import subquad` loads the library, as importing a timm plugin does: every mechanism is registered for
`build_attention` and every model into timm's registry, so `import subquad, timm; timm.create_model('l2vit_tiny')`
works, and so does timm's `--device-modules subquad`. It imports torch and timm. The `subquad` command keeps its
`--help` fast by living in the separate, torch-free `subquad_cli` package, which imports this one only when a
command runs.
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
