"""2-D window attention (Swin W-MSA / SW-MSA, L2ViT LWA) and CSwin stripe helpers: geometry, partition/reverse,
shift and padding masks, relative position bias, a dense reference over the whole map and the SDPA fast path.

Shapes: q, k, v (B, h, N, d) with N = H * W (row-major grid, head-major channels); bias tables ((2w-1)^2, h);
outputs (B, h, N, d). Windows are square (w x w); stripes (CSwin) are (sh x sw) rectangles.

Paper: Swin (Liu et al. 2021, Eq. 4 and the cyclic-shift masking); L2ViT paper section 3.2 (LWA);
    CSwin (Dong et al. 2022, cross-shaped stripes with LePE).
Official: microsoft Swin-Transformer `window_partition`, `window_reverse`, `WindowAttention`, `SwinTransformerBlock`
    (as copied into LeapLabTHU/FLatten-Transformer `models/flatten_swin.py`); ChuanyangZheng/L2ViT
    `classification/models/l2vit.py` (`LWABlock`); FLatten `models/flatten_cswin.py` (`img2windows`, `windows2img`).
Symbols: w window side (paper M), s shift (paper floor(M/2)), H x W map, Hp x Wp padded map,
    L = w * w tokens per window, nW windows per image.

Masking rules (same in the reference and the fast path):
    * tokens attend only within their (shifted) window;
    * cyclic shift: keys from another region of the rolled map get -100 added to the logit (official Swin value, not
      -inf), so results equal the official code bit for bit up to rounding;
    * pad_mode="mask" **[ours]**: padded keys are excluded (-inf) for real queries; padded query rows are computed
      unmasked and cropped (so no row is ever empty);
    * pad_mode="zero" (L2ViT): padded tokens are real keys carrying the fill values `pad_kv` (the qkv bias in L2ViT,
      since zero tokens are projected), no mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..._shapes import ceil_div, known_equal, sizes
from .softmax import sdpa, softmax_attention_probs

__all__ = [
    "SHIFT_MASK_VALUE",
    "WindowGeometry",
    "window_geometry",
    "window_partition",
    "window_reverse",
    "relative_position_index",
    "relative_position_bias",
    "window_mask",
    "window_gather_index",
    "window_attention_ref",
    "window_attention_probs_ref",
    "window_attention",
    "stripe_partition",
    "stripe_reverse",
]

# Additive logit penalty of the official Swin shift mask.
SHIFT_MASK_VALUE = -100.0


@dataclass(frozen=True)
class WindowGeometry:
    """Effective window layout of one call.

    Attributes:
        window: effective window side w (after clipping).
        shift: effective cyclic shift s (0 <= s < w).
        hw: the real map (H, W).
        padded: the padded map (Hp, Wp), multiples of w.
    """

    window: int
    shift: int
    hw: tuple[int, int]
    padded: tuple[int, int]

    @property
    def num_windows(self) -> int:
        return (self.padded[0] // self.window) * (self.padded[1] // self.window)


def _mod(t: torch.Tensor, n) -> torch.Tensor:
    """t mod n for a non-negative integer tensor: `t % n`, written as t - (t // n) * n when n is a symbolic size
    (ONNX's exporter has no remainder of a tensor by a symbolic scalar)."""
    return t - (t // n) * n if isinstance(n, torch.SymInt) else t % n


def window_geometry(hw: tuple[int, int], window_size: int, shift_size: int = 0, clip: bool = True) -> WindowGeometry:
    """Effective window and shift for a map `hw`.

    With `clip=True` (Swin rule, as `SwinTransformerBlock.__init__` applies it at its input resolution): when
    min(H, W) <= window_size the window becomes min(H, W) and the shift 0. With `clip=False` (L2ViT) the window is
    kept and the map is padded up to it.
    """
    H, W = sizes(hw)
    if window_size < 1:
        raise ValueError(f"window_size must be >= 1, got {window_size}")
    if shift_size < 0 or shift_size >= window_size:
        raise ValueError(f"shift_size must satisfy 0 <= shift_size < window_size={window_size}, got {shift_size}")
    if H < 1 or W < 1:
        raise ValueError(f"window attention needs a non-empty map, got hw={H}x{W}")
    w, s = window_size, shift_size
    if isinstance(H, torch.SymInt) or isinstance(W, torch.SymInt):
        # Traced with a symbolic size (torch.export / dynamic torch.compile): the same rule without a branch on
        # the size, so one program covers clipped and unclipped maps.
        if clip:
            m = torch.sym_min(H, W)
            w, s = torch.sym_min(m, w), torch.sym_ite(m <= w, 0, s) if s else 0
    elif clip and min(H, W) <= w:
        w, s = min(H, W), 0
    Hp, Wp = ceil_div(H, w) * w, ceil_div(W, w) * w
    return WindowGeometry(w, s, (H, W), (Hp, Wp))


def window_partition(x: torch.Tensor, window: int) -> torch.Tensor:
    """(B, Hp, Wp, C) -> (B * nW, w * w, C), windows in row-major order; Hp, Wp multiples of w."""
    B, Hp, Wp, C = x.shape
    x = x.view(B, Hp // window, window, Wp // window, window, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(B * (Hp // window) * (Wp // window), window * window, C)


def window_reverse(windows: torch.Tensor, window: int, Hp: int, Wp: int) -> torch.Tensor:
    """(B * nW, w * w, C) -> (B, Hp, Wp, C), the inverse of `window_partition`."""
    C = windows.shape[-1]
    nh, nw = Hp // window, Wp // window
    x = windows.view(-1, nh, nw, window, window, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, Hp, Wp, C)


def relative_position_index(window: int, table_window: int | None = None, device=None) -> torch.Tensor:
    """(L, L) long index into a ((2 w_t - 1)^2, h) table for a w x w window (w <= w_t = table_window).

    Equals the official `relative_position_index` when w == w_t; for a clipped window (w < w_t) it picks the
    central offsets of the larger table, i.e. the same relative offsets (exact, no interpolation).
    """
    wt = window if table_window is None else table_window
    if not statically_known_true(window <= wt):
        raise ValueError(f"window {window} is larger than the bias table's window {wt}")
    coords = torch.stack(torch.meshgrid(torch.arange(window, device=device), torch.arange(window, device=device),
                                        indexing="ij")).flatten(1)  # (2, L)
    rel = coords[:, :, None] - coords[:, None, :]  # (2, L, L)
    return (rel[0] + wt - 1) * (2 * wt - 1) + (rel[1] + wt - 1)


def relative_position_bias(table: torch.Tensor, window: int, table_window: int) -> torch.Tensor:
    """((2 w_t - 1)^2, h) table -> (h, L, L) bias for a w x w window."""
    idx = relative_position_index(window, table_window, table.device)
    L = window * window
    return table[idx.view(-1)].view(L, L, -1).permute(2, 0, 1)


def _token_layout(geo: WindowGeometry, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per padded-and-shifted position (row-major over Hp x Wp): window id, region label, is-padding flag."""
    (H, W), (Hp, Wp), w, s = geo.hw, geo.padded, geo.window, geo.shift
    r = torch.arange(Hp, device=device)
    c = torch.arange(Wp, device=device)
    # Region labels of the rolled map (the official h_slices / w_slices): 0 body, 1 last window, 2 the wrapped strip.
    if isinstance(s, torch.SymInt) or s > 0:  # with s = 0 the labels are constant per window (no mask)
        lr = (r >= Hp - w).long() + (r >= Hp - s).long()
        lc = (c >= Wp - w).long() + (c >= Wp - s).long()
    else:
        lr, lc = torch.zeros_like(r), torch.zeros_like(c)
    label = lr[:, None] * 3 + lc[None, :]  # (Hp, Wp)
    # Position (r, c) of the rolled map holds the padded-map token ((r + s) % Hp, (c + s) % Wp).
    pad = (_mod(r + s, Hp) >= H)[:, None] | (_mod(c + s, Wp) >= W)[None, :]  # (Hp, Wp)
    win = (r // w)[:, None] * (Wp // w) + (c // w)[None, :]  # (Hp, Wp)
    return win, label, pad


def window_mask(geo: WindowGeometry, mask_padding: bool, device=None,
                dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """Additive mask (nW, L, L) of one image for the partitioned windows, or None when nothing is masked.

    Entries: 0 allowed; -100 other shift region; -inf padded key of a real query (when `mask_padding`).
    """
    need_pad = mask_padding and not known_equal(geo.padded, geo.hw)
    if known_equal((geo.shift,), (0,)) and not need_pad:
        return None
    (H, W), (Hp, Wp), w, s = geo.hw, geo.padded, geo.window, geo.shift
    # Region label and padding flag of every window-order position, from its rolled-map coordinates (a gather
    # form: partitioning the (Hp, Wp) label map would reshape over the window count, which a traced program
    # guards at 1).
    r, c = _window_coords(geo, device)
    if isinstance(s, torch.SymInt) or s > 0:
        lr = (r >= Hp - w).long() + (r >= Hp - s).long()
        lc = (c >= Wp - w).long() + (c >= Wp - s).long()
        label_w = (lr * 3 + lc).view(-1, w * w)  # (nW, L)
    else:
        label_w = torch.zeros_like(r).view(-1, w * w)
    pad_w = ((_mod(r + s, Hp) >= H) | (_mod(c + s, Wp) >= W)).view(-1, w * w)  # (nW, L)
    m = torch.zeros(label_w.shape[0], w * w, w * w, device=device, dtype=dtype)
    m = m.masked_fill(label_w[:, :, None] != label_w[:, None, :], SHIFT_MASK_VALUE)
    if need_pad:
        m = m.masked_fill(~pad_w[:, :, None] & pad_w[:, None, :], float("-inf"))
    return m


def _window_coords(geo: WindowGeometry, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rolled-map (row, column) of every window-order position (row-major windows, row-major inside), each
    (nW * L,), from one flat arange: no broadcast over a window-count axis, whose size-1 checks would specialise a
    traced program."""
    (Hp, Wp), w = geo.padded, geo.window
    nw = Wp // w
    p = torch.arange((Hp // w) * nw * w * w, device=device)
    win, inside = p // (w * w), _mod(p, w * w)
    return (win // nw) * w + inside // w, _mod(win, nw) * w + _mod(inside, w)


def window_gather_index(geo: WindowGeometry, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Index maps that fuse pad + cyclic shift + partition (and their inverse) into one gather each.

    Returns:
        fwd: (nW * L,) long; window-order position -> source token in [0, N], where N stands for a zero pad token
            (append one zero token to x before gathering).
        inv: (N,) long; real token -> its window-order position (reverse + unshift + crop).
    """
    (H, W), (Hp, Wp), w, s = geo.hw, geo.padded, geo.window, geo.shift
    nw = Wp // w
    r, c = _window_coords(geo, device)
    pr, pc = _mod(r + s, Hp), _mod(c + s, Wp)  # padded-map source coordinates
    real = (pr < H) & (pc < W)
    fwd = torch.where(real, pr * W + pc, torch.full_like(pr, H * W)).flatten()
    # The inverse in closed form (a scatter would write every pad position into one slot; ONNX Runtime's
    # ScatterElements leaves duplicate writes undefined): token (i, j) sits at rolled-map position
    # ((i - s) mod Hp, (j - s) mod Wp), i.e. in window (r // w, c // w) at offset (r mod w, c mod w).
    t = torch.arange(H * W, device=device)
    ri, ci = _mod(t // W + (Hp - s), Hp), _mod(_mod(t, W) + (Wp - s), Wp)
    inv = ((ri // w) * nw + ci // w) * (w * w) + _mod(ri, w) * w + _mod(ci, w)
    return fwd, inv


def _pad_fill(x: torch.Tensor, hw: tuple[int, int], padded: tuple[int, int], fill: torch.Tensor | None) -> torch.Tensor:
    """(B, h, N, d) tokens -> (B, h, Hp, Wp, d) map, padded bottom/right with `fill` (h, d) (zeros when None)."""
    B, h, N, d = x.shape
    (H, W), (Hp, Wp) = hw, padded
    m = x.reshape(B, h, H, W, d)
    if known_equal((Hp, Wp), (H, W)):
        return m
    m = F.pad(m, (0, 0, 0, Wp - W, 0, Hp - H))
    if fill is not None:
        valid = torch.zeros(Hp, Wp, dtype=torch.bool, device=x.device)
        valid[:H, :W] = True
        m = torch.where(valid[:, :, None], m, fill.to(m.dtype)[None, :, None, None, :])
    return m


def window_attention_probs_ref(q: torch.Tensor, k: torch.Tensor, hw: tuple[int, int], window_size: int,
                               shift_size: int = 0, bias_table: torch.Tensor | None = None,
                               table_window: int | None = None, pad_mode: str = "mask", clip: bool = True,
                               scale: float | None = None, k_fill: torch.Tensor | None = None) -> torch.Tensor:
    """Dense attention probabilities over the whole padded map: (B, h, Np, Np) with Np = Hp * Wp (row-major).

    Every pair (i, j) of the padded map is allowed iff both fall in the same window after the cyclic shift; the
    bias is the table entry of their offset inside that window, plus -100 across shift regions, plus -inf on padded
    keys of real queries (pad_mode="mask"). Rows of padded queries are kept (they are cropped by the caller).
    """
    geo = window_geometry(hw, window_size, shift_size, clip)
    (Hp, Wp), w, s = geo.padded, geo.window, geo.shift
    qm = _pad_fill(q, geo.hw, geo.padded, None).flatten(2, 3)  # (B, h, Np, d)
    km = _pad_fill(k, geo.hw, geo.padded, k_fill).flatten(2, 3)
    # Original padded-map position (i) of each rolled-map position, so tokens keep their identity.
    r = torch.arange(Hp, device=q.device)
    c = torch.arange(Wp, device=q.device)
    src = (_mod(r + s, Hp)[:, None] * Wp + _mod(c + s, Wp)[None, :]).flatten()  # (Np,) rolled pos -> padded pos
    win, label, pad = (t.flatten() for t in _token_layout(geo, q.device))
    # Inverse permutation: padded position -> rolled position, so every quantity is indexed by padded position.
    inv = torch.empty_like(src)
    inv[src] = torch.arange(src.numel(), device=q.device)
    win, label, pad = win[inv], label[inv], pad[inv]
    rr = (inv // Wp) % w
    cc = _mod(inv, Wp) % w
    logits_bias = torch.zeros(qm.shape[1], src.numel(), src.numel(), dtype=q.dtype, device=q.device)
    if bias_table is not None:
        wt = w if table_window is None else table_window
        idx = (rr[:, None] - rr[None, :] + wt - 1) * (2 * wt - 1) + (cc[:, None] - cc[None, :] + wt - 1)
        same = win[:, None] == win[None, :]
        idx = torch.where(same, idx, torch.zeros_like(idx))
        logits_bias = logits_bias + bias_table.to(q.dtype)[idx].permute(2, 0, 1)
    logits_bias = logits_bias.masked_fill(label[:, None] != label[None, :], SHIFT_MASK_VALUE)
    allowed = win[:, None] == win[None, :]  # (Np, Np)
    if pad_mode == "mask":
        allowed = allowed & ~(~pad[:, None] & pad[None, :])
    elif pad_mode != "zero":
        raise ValueError(f"pad_mode must be 'mask' or 'zero', got {pad_mode!r}")
    return softmax_attention_probs(qm, km, scale, allowed, logits_bias)


def window_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: tuple[int, int], window_size: int,
                         shift_size: int = 0, bias_table: torch.Tensor | None = None, table_window: int | None = None,
                         pad_mode: str = "mask", clip: bool = True, scale: float | None = None,
                         pad_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Reference window attention: one dense masked (Np x Np) softmax over the whole padded map, then crop.

    Args:
        q, k, v: (B, h, N, d), N = H * W.
        hw: the map (H, W).
        window_size, shift_size: nominal window w and shift s (clipped per `clip`, see `window_geometry`).
        bias_table: ((2 w_t - 1)^2, h) relative position bias table or None.
        table_window: w_t of the table (defaults to the effective window).
        pad_mode: 'mask' (padded keys excluded) or 'zero' (padded tokens are keys with the `pad_kv` fill).
        clip: Swin window clipping (True) or L2ViT padding of small maps (False).
        scale: logit scale (default d^-1/2).
        pad_kv: (k_fill, v_fill), each (h, d): key/value of a padded token (zeros when None).

    Returns:
        (B, h, N, d).
    """
    geo = window_geometry(hw, window_size, shift_size, clip)
    k_fill, v_fill = pad_kv if pad_kv is not None else (None, None)
    p = window_attention_probs_ref(q, k, hw, window_size, shift_size, bias_table, table_window, pad_mode, clip,
                                   scale, k_fill)
    vm = _pad_fill(v, geo.hw, geo.padded, v_fill).flatten(2, 3)  # (B, h, Np, d)
    out = (p @ vm).unflatten(2, geo.padded)  # (B, h, Hp, Wp, d)
    H, W = geo.hw
    return out[:, :, :H, :W].flatten(2, 3)


def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: tuple[int, int], window_size: int,
                     shift_size: int = 0, bias_table: torch.Tensor | None = None, table_window: int | None = None,
                     pad_mode: str = "mask", clip: bool = True, scale: float | None = None,
                     pad_kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Fast path of `window_attention_ref`: pad, roll, partition, one SDPA call over all windows, reverse, unroll,
    crop. Same arguments and result: (B, h, N, d)."""
    if pad_mode not in ("mask", "zero"):
        raise ValueError(f"pad_mode must be 'mask' or 'zero', got {pad_mode!r}")
    geo = window_geometry(hw, window_size, shift_size, clip)
    B, h, N, d = q.shape
    (H, W), (Hp, Wp), w, s = geo.hw, geo.padded, geo.window, geo.shift
    k_fill, v_fill = pad_kv if pad_kv is not None else (None, None)
    # (B, h, Hp, Wp, 3d): q, k, v side by side so one pad/roll/partition moves all three.
    qkv = torch.cat([_pad_fill(q, geo.hw, geo.padded, None), _pad_fill(k, geo.hw, geo.padded, k_fill),
                     _pad_fill(v, geo.hw, geo.padded, v_fill)], dim=-1)
    if s:
        qkv = torch.roll(qkv, shifts=(-s, -s), dims=(2, 3))
    nW = geo.num_windows
    # (B*h, Hp, Wp, 3d) -> (B*h*nW, L, 3d) -> (B, h, nW, L, 3d) -> (B, nW, h, L, 3d)
    win = window_partition(qkv.reshape(B * h, Hp, Wp, 3 * d), w).view(B, h, nW, w * w, 3 * d).transpose(1, 2)
    qw, kw, vw = (t.reshape(B, nW * h, w * w, d) for t in win.split(d, dim=-1))
    attn_mask = None
    if bias_table is not None:
        attn_mask = relative_position_bias(bias_table, w, w if table_window is None else table_window)
        attn_mask = attn_mask.to(q.dtype)[None]  # (1, h, L, L)
    m = window_mask(geo, pad_mode == "mask", q.device, q.dtype)  # (nW, L, L) or None
    if m is not None:
        attn_mask = m[:, None] if attn_mask is None else attn_mask + m[:, None]  # (nW, h or 1, L, L)
    if attn_mask is not None:
        attn_mask = attn_mask.expand(nW, h, w * w, w * w).reshape(1, nW * h, w * w, w * w)
    o = sdpa(qw, kw, vw, attn_mask=attn_mask, scale=scale)  # (B, nW*h, L, d)
    # (B, nW, h, L, d) -> (B, h, nW, L, d) -> (B*h*nW, L, d) -> (B*h, Hp, Wp, d)
    o = o.view(B, nW, h, w * w, d).transpose(1, 2).reshape(B * h * nW, w * w, d)
    o = window_reverse(o, w, Hp, Wp)
    if s:
        o = torch.roll(o, shifts=(s, s), dims=(1, 2))
    return o[:, :H, :W].reshape(B, h, N, d)


def stripe_partition(x: torch.Tensor, sh: int, sw: int) -> torch.Tensor:
    """CSwin `img2windows` on a channels-last map: (B, Hp, Wp, C) -> (B * n, sh * sw, C), Hp % sh == Wp % sw == 0."""
    B, Hp, Wp, C = x.shape
    x = x.view(B, Hp // sh, sh, Wp // sw, sw, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, sh * sw, C)


def stripe_reverse(x: torch.Tensor, sh: int, sw: int, Hp: int, Wp: int) -> torch.Tensor:
    """CSwin `windows2img`: (B * n, sh * sw, C) -> (B, Hp, Wp, C)."""
    C = x.shape[-1]
    x = x.view(-1, Hp // sh, Wp // sw, sh, sw, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, Hp, Wp, C)
