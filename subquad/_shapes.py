"""Shape vocabulary and the only place where layout conversions live.

Conventions used across subquad:
    B batch, N query tokens, n key/value tokens, C channels, h heads, d = C / h head dim,
    H x W token grid (N = H * W), T frames.
    Token mixers take x: (B, N, C) with hw=(H, W); the functional core works on (B, h, N, d) (SDPA layout);
    backbone stage outputs are NCHW (B, C, H, W).

Channel layout is head-major: channel c belongs to head c // d.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .errors import UserError

__all__ = [
    "as_hw",
    "sizes",
    "known_equal",
    "tracing",
    "check_tokens",
    "check_hw",
    "check_sequence_hw",
    "check_heads",
    "check_mask",
    "tokens_to_map",
    "map_to_tokens",
    "split_heads",
    "split_packed_heads",
    "merge_heads",
    "pad_to_multiple",
    "ceil_div",
    "round_up",
    "crop_index",
    "crop",
]


def as_hw(size: int | Sequence[int] | None, name: str = "size") -> tuple[int, int] | None:
    """Normalise an int or (H, W) pair to a tuple of two positive ints (None passes through)."""
    if size is None:
        return None
    if isinstance(size, bool):
        raise ValueError(f"{name} must hold whole numbers, got {size!r}")
    if isinstance(size, int):
        size = (size, size)
    vals = tuple(size)
    if any(isinstance(s, bool) or (not _is_int(s) and int(s) != s) for s in vals):
        raise ValueError(f"{name} must hold whole numbers, got {vals!r}")
    # Symbolic sizes (torch.export / torch.compile with dynamic shapes) stay symbolic: int() would specialise them.
    size = tuple(s if _is_int(s) else int(s) for s in vals)
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"{name} must be a positive int or an (H, W) pair of positive ints, got {size!r}")
    return size  # type: ignore[return-value]


def _is_int(s) -> bool:
    return isinstance(s, (int, torch.SymInt)) and not isinstance(s, bool)


def sizes(vals: Sequence) -> tuple:
    """A tuple of whole sizes: ints stay ints, symbolic sizes (torch.export / torch.compile with dynamic shapes) stay
    symbolic (int() would specialise them to the example's value), anything else goes through int()."""
    return tuple(v if _is_int(v) else int(v) for v in vals)


def known_equal(a: Sequence, b: Sequence) -> bool:
    """Whether two sizes are equal without a guard: plain ints compare as usual; symbolic sizes count as equal only
    when provably so. Shape branches use it so that a traced program (torch.export, torch.compile with dynamic
    shapes) takes the general path instead of specialising to the example's size."""
    a, b = tuple(a), tuple(b)
    return len(a) == len(b) and all(statically_known_true(x == y) for x, y in zip(a, b))


def ceil_div(a, b):
    """ceil(a / b) for positive sizes, as (a + b - 1) // b: the `-(-a // b)` idiom floors a negative quotient, which
    ONNX's integer Div (it truncates toward zero) gets wrong once the exporter emits it for a symbolic size."""
    return (a + b - 1) // b


def round_up(n, m):
    """The smallest multiple of m that is >= n; n itself when m is n (a full-extent stripe or window), which a
    symbolic size needs said: (n + n - 1) // n * n does not simplify to n, and a traced program would keep guards
    on it."""
    if m is n or known_equal((m,), (n,)):
        return n
    return ceil_div(n, m) * m


def crop_index(hw: tuple, padded: tuple, device=None) -> torch.Tensor:
    """(H * W,) long: the row-major positions of an (H, W) map inside its (Hp, Wp) padding, so that
    `flat.index_select(dim, crop_index(...))` crops a flattened padded map. A traced program takes this instead of
    `[:H, :W]` plus a reshape: the slice's size is min(H, Hp) and the reshape asks whether Hp == H, both guards on a
    symbolic size."""
    (H, W), (_, Wp) = hw, padded
    t = torch.arange(H * W, device=device)
    r = t // W
    return r * Wp + (t - r * W)


def tracing() -> bool:
    """True inside torch.compile / torch.export tracing: modules must not cache tensors made there (they are fake)."""
    return torch.compiler.is_compiling()


def size_oblivious():
    """Inside `torch.export` (non-strict), reason about derived sizes without specialising them at 1.

    PyTorch guards every size it sees as 1 or not 1 (contiguity, reshapes). For a size derived from a dynamic input
    side, such as the number of windows of a stage, that guard is `!= 1` at a generic example size, so the program
    would refuse every input with a single window per stage (224 x 224 for a 7 x 7 last stage). The spatial code
    runs under this context, which asks PyTorch to decide those checks for every size instead of the example's. A
    no-op outside export (eager, and under torch.compile, whose tracer keeps its own rules).
    """
    import contextlib

    if not torch.compiler.is_exporting():
        return contextlib.nullcontext()
    from torch.fx.experimental import _config

    return _config.patch(backed_size_oblivious=True)


def check_tokens(x: torch.Tensor, dim: int | None = None, who: str = "attention") -> None:
    """Raise ValueError unless x is (B, N, C) (with C == dim when given)."""
    if x.dim() != 3:
        raise ValueError(f"{who}: expected x of shape (B, N, C), got {tuple(x.shape)}")
    if dim is not None and x.shape[-1] != dim:
        raise ValueError(f"{who}: expected {dim} channels, got x of shape {tuple(x.shape)}")


def check_hw(x: torch.Tensor, hw: Sequence[int] | None, who: str = "attention", prefix: int = 0) -> tuple[int, int]:
    """Return (H, W) after checking that prefix + H * W equals the token count of x: (B, N, C).

    `prefix` counts leading non-spatial tokens (a class token) that precede the H x W grid tokens.
    """
    if hw is None:
        raise ValueError(f"{who} is spatial and needs hw=(H, W) for x of shape {tuple(x.shape)}")
    H, W = as_hw(hw, "hw")  # type: ignore[misc]
    if prefix + H * W != x.shape[1]:
        extra = f" + {prefix} prefix token(s)" if prefix else ""
        raise ValueError(f"{who}: grid hw={H}x{W}{extra} makes {prefix + H * W} tokens but x has N={x.shape[1]} "
                         f"(shape {tuple(x.shape)})")
    return H, W


def check_sequence_hw(x: torch.Tensor, hw: Sequence[int] | None, who: str = "attention") -> None:
    """Refuse a token grid for the 1-D (sequence) form of a mechanism that also has a grid form (the form that
    `build_attention` builds without input_size): hw must be None, or (N,) the sequence length of x (B, N, C)."""
    if hw is None:
        return
    hw = tuple(hw)
    if len(hw) == 1 and known_equal(hw, x.shape[1:2]):
        return
    raise UserError(f"{who} was built without input_size, so it is the 1-D (sequence) form and cannot take the grid "
                    f"hw={'x'.join(map(str, hw))}; pass input_size=(H, W) to build the grid form, or call it with "
                    f"hw=None")


def check_heads(dim: int, num_heads: int, who: str = "attention") -> int:
    """Return the head dim d = dim // num_heads, raising ValueError unless it divides exactly."""
    if num_heads < 1 or dim < 1 or dim % num_heads != 0:
        raise ValueError(f"{who}: dim={dim} must be a positive multiple of num_heads={num_heads}")
    return dim // num_heads


def check_mask(mask: torch.Tensor | None, x: torch.Tensor, who: str = "attention") -> torch.Tensor | None:
    """Validate a key-padding mask (B, N) of bools, True = keep; returns it (or None)."""
    if mask is None:
        return None
    B, N = x.shape[:2]
    if mask.dtype != torch.bool:
        raise ValueError(f"{who}: mask must be a bool tensor (True = real token), got dtype {mask.dtype}")
    if tuple(mask.shape) != (B, N):
        raise ValueError(f"{who}: mask must have shape (B, N) = {(B, N)}, got {tuple(mask.shape)}")
    return mask


def tokens_to_map(x: torch.Tensor, hw: Sequence[int]) -> torch.Tensor:
    """(B, N, C) -> (B, C, H, W), a channels-last view of contiguous tokens (no copy).

    Convolutions run on it in channels-last layout and `map_to_tokens` turns their output back into tokens without a
    copy either; at high resolution this saves two full-size transposes per convolution.
    """
    H, W = hw
    B, N, C = x.shape
    return x.reshape(B, H, W, C).permute(0, 3, 1, 2)


def map_to_tokens(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, H*W, C) (a view when x is channels-last, else one copy)."""
    B, C, H, W = x.shape
    return x.permute(0, 2, 3, 1).reshape(B, H * W, C)


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, N, C) -> (B, h, N, d)."""
    B, N, C = x.shape
    return x.reshape(B, N, num_heads, C // num_heads).transpose(1, 2)


def split_packed_heads(x: torch.Tensor, parts: int, num_heads: int) -> tuple[torch.Tensor, ...]:
    """A packed projection (B, N, parts * C) -> `parts` tensors (B, h, N, d), d = C / h: q, k, v from a fused
    `qkv` (parts=3) or k, v from a `kv` (parts=2). Packed channels are part-major, then head-major (the layout of
    timm's and the official `qkv` Linear layers). The results are views of x."""
    B, N, _ = x.shape
    return x.reshape(B, N, parts, num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, h, N, d) -> (B, N, h*d)."""
    B, h, N, d = x.shape
    if torch.compiler.is_exporting():
        # An explicit copy: the traced reshape would be recorded as a view if the example's strides allowed one,
        # and an exported program's SDPA decomposition may hand it other strides (ONNX: "cannot view").
        return x.transpose(1, 2).clone(memory_format=torch.contiguous_format).view(B, N, h * d)
    return x.transpose(1, 2).reshape(B, N, h * d)


def pad_to_multiple(x: torch.Tensor, multiple: Sequence[int],
                    value: float = 0.0) -> tuple[torch.Tensor, tuple[int, int]]:
    """Zero-pad a map (B, C, H, W) at the bottom/right so H, W are multiples of `multiple` = (mh, mw).

    Returns the padded map and the (pad_h, pad_w) amounts (crop with `crop`).
    """
    H, W = x.shape[-2:]
    mh, mw = multiple
    ph, pw = round_up(H, mh) - H, round_up(W, mw) - W
    # A traced program (torch.export with symbolic sides) always pads, possibly by zero: a branch on the amount would
    # tie the program to the example's remainder.
    if tracing() or ph or pw:
        x = F.pad(x, (0, pw, 0, ph), value=value)
    return x, (ph, pw)


def crop(x: torch.Tensor, hw: Sequence[int]) -> torch.Tensor:
    """Crop a map (..., H', W') back to (..., H, W) (top-left corner kept)."""
    H, W = hw
    return x[..., :H, :W]
