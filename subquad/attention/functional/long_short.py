"""Transformer-LS long-short attention: dynamic projection, dense references and the SDPA tile paths.

One functional core serves the three forms of Transformer-LS (arXiv 2107.02192) (bidirectional 1-D, 2-D vision, causal):
every query takes ONE softmax over the union of a few global keys (the dynamic projections, and a class token) and
its local window keys. The references build that union densely (N x (G + N) logits with an explicit mask); the fast
paths gather the window keys per query tile and call `F.scaled_dot_product_attention` once over the per-tile key sets
(docs/deviations.md).

Shapes: q, k, v (B, h, N, d) (the SDPA convention); global keys/values kg, vg (B, h, G, d); key_valid (B, N) bool
(True = real token); dynamic-projection logits (B, n, h*r) -> projection P (B, h, r, n).

Paper: Transformer-LS (arXiv 2107.02192), Eq. 3 (dynamic projection), Eq. 6-7 (aggregation with DualLN), Sec. 3.3
(causal).
Official: NVIDIA/transformer-ls @1527c5cc, `lra/attention_transformer_ls.py` (AttentionLS),
`imagenet/models/layers/transformer_ls.py` (AttentionLS), `autoregressive/model_lib/layer.py` (ChunkedLSAttention).

Symbols: w segment / tile / band length (paper w); ext = max(w // 2, 1) one-sided window extension (official);
r projection rank (paper r); l causal chunk length (paper l); G number of global keys (r, plus 1 per global token).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..._shapes import ceil_div, crop_index, known_equal
from ...layers.precision import compute_dtype as _softmax_dtype  # every LS softmax in fp32 (official); fp64 stays
from .softmax import export_mask, sdpa

__all__ = [
    "window_ext",
    "dynamic_projection",
    "window_mask_1d",
    "window_mask_2d",
    "rpe_table_size",
    "rpe_index_tile",
    "rpe_index_2d",
    "long_short_ref",
    "long_short_1d_sdpa",
    "long_short_2d_sdpa",
    "long_short_2d_gather",
    "long_short_global_sdpa",
    "post_cls_ref",
    "post_cls_sdpa",
    "xl_sinusoid",
    "long_short_causal_ref",
    "long_short_causal_sdpa",
]

_NEG_INF = float("-inf")


def window_ext(w: int) -> int:
    """One-sided window extension of the official code: ext = max(floor(w / 2), 1)."""
    return max(w // 2, 1)


def dynamic_projection(logits: torch.Tensor, num_heads: int, rank: int,
                       valid: torch.Tensor | None = None) -> torch.Tensor:
    """P = softmax over the sequence of the projection scores (paper Eq. 3, P_i = softmax_n(X W_i^P)).

    Args:
        logits: (B, n, h*r) output of W^P; channel = head * r + rank (official layout).
        num_heads: h.
        rank: r.
        valid: (B, n) bool, True = real token; padded tokens get zero weight. A row with no valid token is all
            zero (never NaN).

    Returns:
        P: (B, h, r, n), each (b, head, rank) row sums to 1 over valid tokens; in the dtype of `logits`.
    """
    B, n, hr = logits.shape
    if hr != num_heads * rank:
        raise ValueError(f"dynamic projection: logits have {hr} channels, expected num_heads*rank = "
                         f"{num_heads}*{rank}")
    # (B, h, r, n), softmax in float32 as the official code does
    s = logits.reshape(B, n, num_heads, rank).permute(0, 2, 3, 1).to(_softmax_dtype(logits.dtype))
    if valid is None:
        return s.softmax(dim=-1).to(logits.dtype)
    s = s.masked_fill(~valid[:, None, None, :], _NEG_INF)
    any_valid = valid.any(dim=-1)[:, None, None, None]
    s = torch.where(any_valid, s, torch.zeros_like(s))
    p = s.softmax(dim=-1)
    return torch.where(any_valid, p, torch.zeros_like(p)).to(logits.dtype)


def window_mask_1d(n: int, w: int, device: torch.device | None = None) -> torch.Tensor:
    """Dense (n, n) bool: query i may attend key j by the segment-wise sliding window.

    Query i lies in segment s = i // w; its keys are s*w - ext ... s*w + w + ext - 1 (official `get_tiles_v2`),
    clipped to [0, n).
    """
    i = torch.arange(n, device=device)
    start = (i // w) * w
    j = torch.arange(n, device=device)
    ext = window_ext(w)
    return (j[None, :] >= (start - ext)[:, None]) & (j[None, :] < (start + w + ext)[:, None])


def window_mask_2d(hw: tuple[int, int], w: int, device: torch.device | None = None) -> torch.Tensor:
    """Dense (H*W, H*W) bool: query (y, x) in tile (y // w, x // w) attends the (w + 2*ext)^2 keys of the square
    centred on its tile (official `get_overlapping_tiles`), clipped to the map."""
    H, W = hw
    ext = window_ext(w)
    ys = torch.arange(H, device=device).repeat_interleave(W)
    xs = torch.arange(W, device=device).repeat(H)
    ty, tx = (ys // w) * w, (xs // w) * w
    in_y = (ys[None, :] >= (ty - ext)[:, None]) & (ys[None, :] < (ty + w + ext)[:, None])
    in_x = (xs[None, :] >= (tx - ext)[:, None]) & (xs[None, :] < (tx + w + ext)[:, None])
    return in_y & in_x


def rpe_table_size(w: int) -> int:
    """Rows of the ViL-LS local relative-position table: 2 (w + e - 1)(w + 2e + 1) + 1 with e = w // 2."""
    e = w // 2
    return 2 * (w + e - 1) * (w + 2 * e + 1) + 1


def _rpe_index(qy: torch.Tensor, qx: torch.Tensor, ky: torch.Tensor, kx: torch.Tensor, w: int) -> torch.Tensor:
    """Official index formula on tile-relative offsets (aliasing kept)."""
    e = w // 2
    ry = qy - ky + (w + e - 1)
    rx = qx - kx + (w + e - 1)
    return ry * (w + 2 * e) + rx


def rpe_index_tile(w: int, device: torch.device | None = None) -> torch.Tensor:
    """(w^2, (w + 2e)^2) index into the table: query offsets [0, w)^2, key offsets [-e, w + e)^2, row-major."""
    e = w // 2
    q = torch.arange(w, device=device)
    k = torch.arange(-e, w + e, device=device)
    qy, qx = q.repeat_interleave(w), q.repeat(w)
    ky, kx = k.repeat_interleave(w + 2 * e), k.repeat(w + 2 * e)
    return _rpe_index(qy[:, None], qx[:, None], ky[None, :], kx[None, :], w)


def rpe_index_2d(hw: tuple[int, int], w: int, device: torch.device | None = None) -> torch.Tensor:
    """Dense (H*W, H*W) table index of the window pairs of `window_mask_2d` (clamped to 0 elsewhere)."""
    H, W = hw
    ys = torch.arange(H, device=device).repeat_interleave(W)
    xs = torch.arange(W, device=device).repeat(H)
    ty, tx = (ys // w) * w, (xs // w) * w
    # offsets of query and key relative to the query's tile origin
    idx = _rpe_index((ys - ty)[:, None], (xs - tx)[:, None], ys[None, :] - ty[:, None], xs[None, :] - tx[:, None], w)
    return idx.clamp(0, rpe_table_size(w) - 1)


def long_short_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kg: torch.Tensor, vg: torch.Tensor,
                   local_mask: torch.Tensor, key_valid: torch.Tensor | None = None,
                   local_bias: torch.Tensor | None = None, scale: float | None = None,
                   return_probs: bool = False):
    """Dense reference: one softmax over [global keys ; local keys] with an explicit mask.

    The two ablations of Transformer-LS (arXiv 2107.02192) Tab. 1 drop one term of the union: G = 0 global keys is
    the window-only form (rank r = 0), `local_mask=None` the dynamic-projection-only form (window w = 0).

    Args:
        q: (B, h, N, d) queries (unscaled).
        k, v: (B, h, N, d) local keys/values (all tokens; the mask picks each query's window).
        kg, vg: (B, h, G, d) global keys/values (projected keys, global tokens), visible to every query; G may be 0.
        local_mask: (N, N) bool, geometric window membership (query, key); None = no local keys at all.
        key_valid: (B, N) bool, True = real token (padding is never a key).
        local_bias: float bias on the local logits only, broadcastable to (B, h, N, N) (ViL RPE).
        scale: logit scale (default d^-1/2).
        return_probs: also return (probs_global (B, h, N, G), probs_local (B, h, N, N)).

    Returns:
        out: (B, h, N, d). A row with no visible key is zero.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    sd = _softmax_dtype(q.dtype)
    lg = ((q * scale) @ kg.transpose(-2, -1)).to(sd)  # (B, h, N, G)
    if local_mask is None:
        ll = lg.new_zeros(*lg.shape[:-1], 0)  # no local keys (dynamic-projection-only ablation)
    else:
        ll = ((q * scale) @ k.transpose(-2, -1)).to(sd)  # (B, h, N, N)
        if local_bias is not None:
            ll = ll + local_bias.to(sd)
        allowed = local_mask[None, None]
        if key_valid is not None:
            allowed = allowed & key_valid[:, None, None, :]
        ll = ll.masked_fill(~allowed, _NEG_INF)
    logits = torch.cat([lg, ll], dim=-1)
    any_key = torch.isfinite(logits).any(dim=-1, keepdim=True)
    logits = torch.where(any_key, logits, torch.zeros_like(logits))
    p = torch.where(any_key, logits.softmax(dim=-1), torch.zeros_like(logits)).to(q.dtype)
    G = kg.shape[-2]
    pg, pl = p[..., :G], p[..., G:]
    out = pg @ vg
    if local_mask is None:
        pl = p.new_zeros(*p.shape[:-1], k.shape[-2])
    else:
        out = out + pl @ v
    return (out, (pg, pl)) if return_probs else out


def long_short_global_sdpa(q: torch.Tensor, kg: torch.Tensor, vg: torch.Tensor, scale: float | None = None,
                           dropout_p: float = 0.0) -> torch.Tensor:
    """Fast path of the dynamic-projection-only ablation (Transformer-LS, arXiv 2107.02192, Tab. 1, w = 0): every
    query attends to the G global keys only (the projected keys and any global token), one SDPA call.

    Args:
        q: (B, h, N, d). kg, vg: (B, h, G, d), G >= 1 (global keys are never masked).

    Returns:
        (B, h, N, d), equal to `long_short_ref` with `local_mask=None`.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return sdpa(q, kg, vg, scale=scale, dropout_p=dropout_p)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
          dropout_p: float = 0.0, check: bool = True) -> torch.Tensor:
    """SDPA over tiles in tile-major layout: q (B, T, h, q_t, d), k/v (B, T, h, k_t, d), mask (B or 1, T, h or 1,
    q_t, k_t) -> (B, T, h, q_t, d).

    The tile axis is folded into the batch, (B*T, h, ...), because SDPA's fused CPU kernel takes 4-D inputs only
    (5-D inputs fall back to the slower math kernel). `check=False` skips the empty-row guard (callers whose
    rows always keep a key: the global keys are never masked).
    """
    B, T = q.shape[:2]

    def fold(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(B * T, *t.shape[2:])

    mask = mask.expand(B, *mask.shape[1:])
    out = _sdpa4(fold(q), fold(k), fold(v), fold(mask), scale, dropout_p, check)
    return out.reshape(B, T, *out.shape[1:])


def _sdpa4(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
           dropout_p: float = 0.0, check: bool = True) -> torch.Tensor:
    """SDPA with rows that have no visible key forced to zero (never NaN)."""
    if mask.is_meta or not check:
        # FLOP counting on the meta device: no data-dependent check is possible (or needed)
        pass
    elif mask.dtype == torch.bool:
        any_key = mask.any(dim=-1, keepdim=True)
        if not bool(any_key.all()):
            out = sdpa(q, k, v, attn_mask=mask | ~any_key, scale=scale, dropout_p=dropout_p)
            return out.masked_fill(~any_key, 0.0)
    else:
        any_key = torch.isfinite(mask).any(dim=-1, keepdim=True)
        if not bool(any_key.all()):
            out = sdpa(q, k, v, attn_mask=mask.masked_fill(~any_key, 0.0), scale=scale, dropout_p=dropout_p)
            return out.masked_fill(~any_key, 0.0)
    return sdpa(q, k, v, attn_mask=mask, scale=scale, dropout_p=dropout_p)


def long_short_1d_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kg: torch.Tensor, vg: torch.Tensor, w: int,
                       key_valid: torch.Tensor | None = None, scale: float | None = None, group: int | None = None,
                       dropout_p: float = 0.0) -> torch.Tensor:
    """Fast 1-D bidirectional path: SDPA over per-tile key sets [global ; window span].

    A tile is g = max(1, ceil(64 / w)) consecutive segments (g*w queries); its window keys span from the first
    segment start - ext to the last segment end + ext. A bool mask keeps, per query, the keys of its own segment
    window that are real tokens. Any n works (the tail is padded and cropped).

    Args:
        q, k, v: (B, h, n, d). kg, vg: (B, h, G, d). w: segment length. key_valid: (B, n) bool.
        group: segments per tile g (default as above).

    Returns:
        (B, h, n, d), equal to `long_short_ref` with `window_mask_1d`.
    """
    B, h, n, d = q.shape
    scale = d ** -0.5 if scale is None else scale
    ext = window_ext(w)
    g = group or max(1, math.ceil(64 / w))
    qt = g * w
    T = ceil_div(n, qt)  # integer ceil: a symbolic n stays symbolic (math.ceil of n / qt would not)
    npad = T * qt
    kt = qt + 2 * ext
    G = kg.shape[-2]
    valid = torch.ones(B, n, dtype=torch.bool, device=q.device) if key_valid is None else key_valid
    # (B, h, T, qt, d) query tiles
    q_t = F.pad(q, (0, 0, 0, npad - n)).reshape(B, h, T, qt, d)
    # keys padded by ext on the left and the tail + ext on the right; tile t spans [t*qt, t*qt + kt)
    k_p = F.pad(k, (0, 0, ext, npad - n + ext))
    v_p = F.pad(v, (0, 0, ext, npad - n + ext))
    valid_p = F.pad(valid, (ext, npad - n + ext), value=False)
    k_t = k_p.unfold(2, kt, qt).transpose(-1, -2)  # (B, h, T, kt, d)
    v_t = v_p.unfold(2, kt, qt).transpose(-1, -2)
    valid_t = valid_p.unfold(1, kt, qt)  # (B, T, kt)
    a = torch.arange(qt, device=q.device)
    b = torch.arange(kt, device=q.device)
    seg = (a // w) * w
    # key b (tile-relative position b - ext) is in the window of query a iff seg <= b < seg + w + 2 ext
    geo = (b[None, :] >= seg[:, None]) & (b[None, :] < (seg + w + 2 * ext)[:, None])  # (qt, kt)
    local = geo[None, None] & valid_t[:, :, None, :]  # (B, T, qt, kt)
    glob = torch.ones(B, T, qt, G, dtype=torch.bool, device=q.device)
    mask = torch.cat([glob, local], dim=-1)[:, :, None]  # (B, T, 1, qt, G + kt)
    # tile-major key sets (B, T, h, G + kt, d), built with one copy
    keys = torch.cat([kg[:, None].expand(B, T, h, G, d), k_t.transpose(1, 2)], dim=3)
    vals = torch.cat([vg[:, None].expand(B, T, h, G, d), v_t.transpose(1, 2)], dim=3)
    out = _sdpa(q_t.transpose(1, 2), keys, vals, mask, scale, dropout_p, check=G == 0)  # (B, T, h, qt, d)
    return out.transpose(1, 2).reshape(B, h, npad, d)[:, :, :n]


def long_short_2d_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kg: torch.Tensor, vg: torch.Tensor,
                       hw: tuple[int, int], w: int, key_valid: torch.Tensor | None = None,
                       tile_bias: torch.Tensor | None = None, scale: float | None = None,
                       dropout_p: float = 0.0) -> torch.Tensor:
    """Fast 2-D path: one SDPA over w x w query tiles with keys [global ; (w + 2 ext)^2 neighbourhood].

    Any H x W: the map is padded at the bottom/right to multiples of w; padded and out-of-image keys get -inf,
    padded query rows are cropped (docs/deviations.md).

    Args:
        q, k, v: (B, h, H*W, d) grid tokens (row-major). kg, vg: (B, h, G, d). hw: (H, W). w: tile side.
        key_valid: (B, H*W) bool.
        tile_bias: (h, w^2, (w + 2 ext)^2) float bias on the window logits (ViL RPE), or None.

    Returns:
        (B, h, H*W, d), equal to `long_short_ref` with `window_mask_2d` (and the dense RPE bias).
    """
    if torch.compiler.is_exporting():
        return long_short_2d_gather(q, k, v, kg, vg, hw, w, key_valid, tile_bias, scale, dropout_p)
    B, h, N, d = q.shape
    H, W = hw
    scale = d ** -0.5 if scale is None else scale
    ext = window_ext(w)
    kw = w + 2 * ext
    Hp, Wp = ceil_div(H, w) * w, ceil_div(W, w) * w
    ny, nx = Hp // w, Wp // w
    T = ny * nx
    G = kg.shape[-2]
    valid = torch.ones(B, N, dtype=torch.bool, device=q.device) if key_valid is None else key_valid
    # (B, h, T, w*w, d) query tiles
    q_m = F.pad(q.reshape(B, h, H, W, d), (0, 0, 0, Wp - W, 0, Hp - H))
    q_t = q_m.reshape(B, h, ny, w, nx, w, d).permute(0, 1, 2, 4, 3, 5, 6).reshape(B, h, T, w * w, d)

    K = G + kw * kw

    def keyset(t: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        # (B, h, H, W, d) -> tile-major (B, T, h, G + kw*kw, d): [global ; neighbourhood], zero outside the map,
        # written into one buffer (the unfolded tiles are never materialised separately)
        t = F.pad(t, (0, 0, ext, Wp - W + ext, ext, Hp - H + ext))
        u = t.unfold(2, kw, w).unfold(3, kw, w).permute(0, 2, 3, 1, 5, 6, 4)  # (B, ny, nx, h, kw, kw, d)
        out = t.new_empty(B, ny, nx, h, K, d)
        out[..., :G, :] = g[:, None, None]
        out[..., G:, :].view(B, ny, nx, h, kw, kw, d).copy_(u)
        return out.view(B, T, h, K, d)

    keys = keyset(k.reshape(B, h, H, W, d), kg)
    vals = keyset(v.reshape(B, h, H, W, d), vg)
    valid_m = F.pad(valid.reshape(B, H, W), (ext, Wp - W + ext, ext, Hp - H + ext), value=False)
    valid_t = valid_m.unfold(1, kw, w).unfold(2, kw, w).reshape(B, T, kw * kw)  # (B, T, kw*kw)
    if tile_bias is None:
        glob = torch.ones(B, T, w * w, G, dtype=torch.bool, device=q.device)
        local = valid_t[:, :, None, :].expand(B, T, w * w, kw * kw)
        mask = torch.cat([glob, local], dim=-1)[:, :, None]  # (B, T, 1, w*w, G + kw*kw)
    else:
        # (B, T, h, w*w, G + kw*kw): 0 on the global keys, RPE bias on the window, -inf outside the map
        mask = q.new_zeros(B, T, h, w * w, K)
        mask[..., G:] = tile_bias.to(q.dtype)
        mask[..., G:].masked_fill_(~valid_t[:, :, None, None, :], _NEG_INF)
    out = _sdpa(q_t.transpose(1, 2), keys, vals, mask, scale, dropout_p, check=G == 0)  # (B, T, h, w*w, d)
    out = out.transpose(1, 2).reshape(B, h, ny, nx, w, w, d).permute(0, 1, 2, 4, 3, 5, 6).reshape(B, h, Hp, Wp, d)
    if known_equal((Hp, Wp), (H, W)):
        return out.reshape(B, h, N, d)
    if isinstance(H, torch.SymInt) or isinstance(W, torch.SymInt):
        return out.reshape(B, h, Hp * Wp, d).index_select(2, crop_index((H, W), (Hp, Wp), out.device))
    return out[:, :, :H, :W].reshape(B, h, N, d)


def _tile_rows_2d(hw: tuple, w: int, device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The row indices of `long_short_2d_gather`, for an (H, W) map in w x w tiles (T = ceil(H/w) * ceil(W/w)).

    Returns:
        q_rows (T * w * w,): the map row of each tile's query slot (some row of the map for a slot past it:
            never read back);
        k_rows (T, kw * kw): the map row of each tile's (w + 2 ext)^2 neighbourhood slot (some row of the map for
            a slot outside it, masked by `inside`);
        inside (T, kw * kw) bool: the slot is on the map;
        out_rows (H * W,): for each map row, its slot in the tile-major output (T * w * w rows).
    """
    H, W = hw
    ext = window_ext(w)
    kw = w + 2 * ext
    ny, nx = ceil_div(H, w), ceil_div(W, w)
    ty = torch.arange(ny, device=device)[:, None] * w  # tile origins
    tx = torch.arange(nx, device=device)[:, None] * w

    def grid_rows(ys: torch.Tensor, xs: torch.Tensor):
        # ys (ny, n), xs (nx, n) -> rows (ny * nx, n * n) and on-map flags, row-major inside a tile; an off-map
        # coordinate is replaced by 0, so every row index stays on the map
        iy, ix = (ys >= 0) & (ys < H), (xs >= 0) & (xs < W)
        inside = iy[:, None, :, None] & ix[None, :, None, :]
        rows = torch.where(iy, ys, 0)[:, None, :, None] * W + torch.where(ix, xs, 0)[None, :, None, :]
        n = ys.shape[1]
        return rows.reshape(ny * nx, n * n), inside.reshape(ny * nx, n * n)

    a = torch.arange(w, device=device)
    q_rows, _ = grid_rows(ty + a, tx + a)
    b = torch.arange(kw, device=device) - ext
    k_rows, inside = grid_rows(ty + b, tx + b)
    t = torch.arange(H * W, device=device)
    y = t // W
    x = t - y * W
    out_rows = ((y // w) * nx + x // w) * (w * w) + (y % w) * w + x % w
    return q_rows.reshape(-1), k_rows, inside, out_rows


def long_short_2d_gather(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kg: torch.Tensor, vg: torch.Tensor,
                         hw: tuple[int, int], w: int, key_valid: torch.Tensor | None = None,
                         tile_bias: torch.Tensor | None = None, scale: float | None = None,
                         dropout_p: float = 0.0) -> torch.Tensor:
    """`long_short_2d_sdpa` with every tile re-layout done as one row gather (`index_select` of d-vectors).

    The same function: each w x w query tile attends to [global ; (w + 2 ext)^2 neighbourhood], off-map keys masked.
    Instead of padding the maps and unfolding and permuting them (exported, those permutes of 7-D tensors ran as
    `Transpose` nodes taking 36-43 % of `cvt_ls_13`'s int8 ONNX Runtime step on a Zen 3 EPYC), the queries, the key
    and value sets (global keys included) and the output are gathered by row indices computed from the map's sides,
    from the (B, h, rows, d) tensors: whole d-vectors move, heads stay in front. Off-map slots point at a row of
    the map and are masked (keys) or never read back (queries). This is the form exported programs take
    (`torch.compiler.is_exporting()`); eager keeps the unfold form, which writes its key sets in place.

    Args and returns: as `long_short_2d_sdpa`.
    """
    B, h, N, d = q.shape
    scale = d ** -0.5 if scale is None else scale
    ext = window_ext(w)
    kw = w + 2 * ext
    G = kg.shape[-2]
    q_rows, k_rows, inside, out_rows = _tile_rows_2d(hw, w, q.device)
    T = k_rows.shape[0]
    K = G + kw * kw
    # [global ; neighbourhood] rows into [kg ; k]: the global keys are the first G rows of every tile's set
    rows = torch.cat([torch.arange(G, device=q.device).expand(T, G), k_rows + G], dim=1)  # (T, K)
    keys = torch.cat([kg, k], dim=2).index_select(2, rows.reshape(-1)).reshape(B * h, T, K, d)
    vals = torch.cat([vg, v], dim=2).index_select(2, rows.reshape(-1)).reshape(B * h, T, K, d)
    q_t = q.index_select(2, q_rows).reshape(B * h, T, w * w, d)
    ok = inside[None]  # (1 or B, T, kw*kw): key slots that are real tokens
    if key_valid is not None:
        ok = ok & key_valid.index_select(1, k_rows.reshape(-1)).reshape(B, T, kw * kw)
    ok = torch.cat([torch.ones_like(ok[..., :1]).expand(*ok.shape[:2], G), ok], dim=-1)  # (1 or B, T, K)
    if tile_bias is None:
        mask = ok[:, None, :, None, :]  # (1 or B, 1, T, 1, K)
        if G:  # the global keys are never masked: no row is empty
            mask = export_mask(mask, q.dtype)
    else:
        bias = torch.cat([tile_bias.new_zeros(h, w * w, G), tile_bias], dim=-1).to(q.dtype)  # (h, w*w, K)
        mask = torch.where(ok[:, None, :, None, :], bias[None, :, None], _NEG_INF)  # (1 or B, h, T, w*w, K)
    mask = mask.expand(B, h, *mask.shape[2:]).reshape(B * h, T, *mask.shape[3:])
    if G:  # the global keys are never masked: every row keeps a key
        out = sdpa(q_t, keys, vals, attn_mask=mask, dropout_p=dropout_p, scale=scale)  # (B*h, T, w*w, d)
    else:
        # A tile whose keys are all padding has empty rows: zeros, decided in the graph (no data-dependent branch,
        # which an exported program cannot hold)
        empty = ~(mask if mask.dtype == torch.bool else torch.isfinite(mask)).any(dim=-1, keepdim=True)
        mask = mask | empty if mask.dtype == torch.bool else mask.masked_fill(empty, 0.0)
        out = sdpa(q_t, keys, vals, attn_mask=mask, dropout_p=dropout_p, scale=scale).masked_fill(empty, 0.0)
    return out.reshape(B, h, T * w * w, d).index_select(2, out_rows)


def post_cls_ref(q_cls: torch.Tensor, k_cls: torch.Tensor, v_cls: torch.Tensor, out: torch.Tensor,
                 valid: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """The official "post-CLS" rule for one global token: it attends to itself and to the OUTPUTS of all tokens.

    Args:
        q_cls, k_cls, v_cls: (B, h, 1, d). out: (B, h, N, d) token outputs (keys and values). valid: (B, N).

    Returns:
        (B, h, 1, d) = p_0 v_cls + sum_j p_j out_j, softmax over [q k_cls ; q out_j] (padded j excluded).
    """
    scale = q_cls.shape[-1] ** -0.5 if scale is None else scale
    sd = _softmax_dtype(q_cls.dtype)
    q = q_cls * scale
    l0 = (q @ k_cls.transpose(-2, -1)).to(sd)  # (B, h, 1, 1)
    lj = (q @ out.transpose(-2, -1)).to(sd)  # (B, h, 1, N)
    if valid is not None:
        lj = lj.masked_fill(~valid[:, None, None, :], _NEG_INF)
    p = torch.cat([l0, lj], dim=-1).softmax(dim=-1).to(q_cls.dtype)
    return p[..., :1] * v_cls + p[..., 1:] @ out


def post_cls_sdpa(q_cls: torch.Tensor, k_cls: torch.Tensor, v_cls: torch.Tensor, out: torch.Tensor,
                  valid: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """`post_cls_ref` as one SDPA call with keys [k_cls ; out] and values [v_cls ; out]."""
    B, h, N, d = out.shape
    scale = d ** -0.5 if scale is None else scale
    keys = torch.cat([k_cls, out], dim=2)
    vals = torch.cat([v_cls, out], dim=2)
    mask = None
    if valid is not None:
        mask = F.pad(valid, (1, 0), value=True)[:, None, None, :]  # (B, 1, 1, 1 + N)
    return sdpa(q_cls, keys, vals, attn_mask=mask, scale=scale)


def xl_sinusoid(pos: torch.Tensor, dim: int) -> torch.Tensor:
    """Transformer-XL sinusoid: (P,) positions -> (P, dim) = [sin(pos * f), cos(pos * f)] (concatenated),
    f_i = 1 / 10000^(2i / dim) (official `PositionalEmbedding`)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=pos.device, dtype=pos.dtype) / dim))
    x = pos[:, None] * inv_freq[None, :]
    return torch.cat([x.sin(), x.cos()], dim=-1)


def _causal_terms(q: torch.Tensor, kw: torch.Tensor, r_win: torch.Tensor, r_chunk: torch.Tensor, u: torch.Tensor,
                  vb: torch.Tensor, scale: float):
    """Shared XL pieces: (q s + r_r_bias) R_win^T (B, h, M, w), (q s) R_chunk^T (B, h, M, P), r_w_bias . k
    (B, h, 1, S)."""
    qs = q * scale
    q_rw = (qs + vb[None, :, None, :]) @ r_win.transpose(-2, -1)[None]  # (B, h, M, w)
    q_rc = qs @ r_chunk.transpose(-2, -1)[None]  # (B, h, M, P)
    u_k = (kw @ u[None, :, :, None]).transpose(-2, -1)  # (B, h, 1, S)
    return q_rw, q_rc, u_k


def long_short_causal_ref(q: torch.Tensor, kw: torch.Tensor, vw: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
                          r_win: torch.Tensor, r_chunk: torch.Tensor, r_w_bias: torch.Tensor, r_r_bias: torch.Tensor,
                          t0: int, w: int, chunk_size: int, rank: int, scale: float | None = None) -> torch.Tensor:
    """Dense causal reference (official ChunkedLSAttention semantics).

    Query t (absolute position) sees exactly the window keys t-w+1 ... t and the chunk vectors of chunks strictly
    before its own (c < t // l); ONE softmax over both. w = 0 (no window keys) or rank = 0 (no chunk vectors) are
    the ablations of Transformer-LS (arXiv 2107.02192) Tab. 1; a query with no key at all (w = 0, first chunk)
    gives zero. Logits (s = d^-1/2):
      window key j:  (q s + r_w_bias) . k_j + (q s + r_r_bias) . R_win[t - j]
      chunk vector m: (q s) . kc_m + (q s) . R_chunk[rho],  rho = (t // l) r - 1 - m.

    Args:
        q: (B, h, M, d) queries at absolute positions t0 ... t0 + M - 1 (unscaled).
        kw, vw: (B, h, S, d) window keys/values (LN_L applied) at positions t0 + M - S ... t0 + M - 1.
        kc, vc: (B, h, Nc, d) chunk vectors (LN_G applied); vector m belongs to chunk m // r (absolute).
        r_win: (h, w, d) R_win[delta] for delta = 0 ... w - 1. r_chunk: (h, P, d) R_chunk[rho], rho = 0 ... P - 1
            with P >= ((t0 + M - 1) // l) r.
        r_w_bias, r_r_bias: (h, d) Transformer-XL content / position biases.
        t0: absolute position of the first query. w: band length. chunk_size: l. rank: r.

    Returns:
        (B, h, M, d).
    """
    B, h, M, d = q.shape
    S, Nc = kw.shape[2], kc.shape[2]
    scale = d ** -0.5 if scale is None else scale
    sd = _softmax_dtype(q.dtype)
    dev = q.device
    q_rw, q_rc, u_k = _causal_terms(q, kw, r_win, r_chunk, r_w_bias, r_r_bias, scale)
    tq = t0 + torch.arange(M, device=dev)
    tk = t0 + M - S + torch.arange(S, device=dev)
    delta = tq[:, None] - tk[None, :]  # (M, S)
    allow_w = (delta >= 0) & (delta < w)
    lw = (q * scale) @ kw.transpose(-2, -1) + u_k
    if S:
        lw = lw + torch.gather(q_rw, 3, delta.clamp(0, w - 1)[None, None].expand(B, h, M, S))
    cq = tq // chunk_size
    m = torch.arange(Nc, device=dev)
    allow_c = (m[None, :] // rank) < cq[:, None]  # (M, Nc)
    lc = (q * scale) @ kc.transpose(-2, -1)
    if Nc:
        rho = (cq[:, None] * rank - 1 - m[None, :]).clamp(0, max(r_chunk.shape[1] - 1, 0))
        lc = lc + torch.gather(q_rc, 3, rho[None, None].expand(B, h, M, Nc))
    logits = torch.cat([lc.masked_fill(~allow_c, _NEG_INF), lw.masked_fill(~allow_w, _NEG_INF)], dim=-1).to(sd)
    any_key = torch.isfinite(logits).any(dim=-1, keepdim=True)
    logits = torch.where(any_key, logits, torch.zeros_like(logits))
    p = torch.where(any_key, logits.softmax(dim=-1), torch.zeros_like(logits)).to(q.dtype)
    return p[..., :Nc] @ vc + p[..., Nc:] @ vw


def long_short_causal_sdpa(q: torch.Tensor, kw: torch.Tensor, vw: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
                           r_win: torch.Tensor, r_chunk: torch.Tensor, r_w_bias: torch.Tensor,
                           r_r_bias: torch.Tensor, t0: int, w: int, chunk_size: int, rank: int,
                           scale: float | None = None, dropout_p: float = 0.0) -> torch.Tensor:
    """Fast causal path: tiles of w queries, keys [all chunk vectors ; 2w window keys], one SDPA call.

    The float mask carries the chunk mask and band mask (-inf) and the query-dependent XL terms.
    Same arguments and result as `long_short_causal_ref`; requires S - M <= w (at most w cached window keys are
    used; older ones are outside every band).
    """
    B, h, M, d = q.shape
    S, Nc = kw.shape[2], kc.shape[2]
    scale = d ** -0.5 if scale is None else scale
    dev = q.device
    if w == 0:
        return _causal_chunks_only_sdpa(q, kc, vc, r_chunk, t0, chunk_size, rank, scale, dropout_p)
    Sc = S - M
    if Sc > w:
        kw, vw, S, Sc = kw[:, :, Sc - w:], vw[:, :, Sc - w:], M + w, w
    q_rw, q_rc, u_k = _causal_terms(q, kw, r_win, r_chunk, r_w_bias, r_r_bias, scale)
    T = ceil_div(M, w)
    Mp = T * w
    # window keys at positions t0 - w ... t0 + Mp - 1: front-pad the missing cache, back-pad the query tail
    front, back = w - Sc, Mp - M
    kw_p = F.pad(kw, (0, 0, front, back))
    vw_p = F.pad(vw, (0, 0, front, back))
    uk_p = F.pad(u_k, (front, back))
    kvalid = torch.zeros(w + Mp, dtype=torch.bool, device=dev)
    kvalid[front:front + S] = True
    k_t = kw_p.unfold(2, 2 * w, w).transpose(-1, -2)  # (B, h, T, 2w, d)
    v_t = vw_p.unfold(2, 2 * w, w).transpose(-1, -2)
    uk_t = uk_p.unfold(3, 2 * w, w)  # (B, h, 1, T, 2w)
    valid_t = kvalid.unfold(0, 2 * w, w)  # (T, 2w)
    a = torch.arange(w, device=dev)
    j = torch.arange(2 * w, device=dev)
    # query a of a tile sits at tile offset a; key j at tile offset j - w: delta = a + w - j
    delta = a[:, None] + w - j[None, :]  # (w, 2w)
    allow_w = (delta >= 0) & (delta < w)
    allow_w = allow_w[None] & valid_t[:, None, :]  # (T, w, 2w)
    q_rw_t = F.pad(q_rw, (0, 0, 0, back)).reshape(B, h, T, w, w)
    bias_w = torch.gather(q_rw_t, 4, delta.clamp(0, w - 1)[None, None, None].expand(B, h, T, w, 2 * w))
    bias_w = (bias_w + uk_t.permute(0, 1, 3, 2, 4)).masked_fill(~allow_w[None, None], _NEG_INF)
    tq = t0 + torch.arange(Mp, device=dev)
    cq = tq // chunk_size
    m = torch.arange(Nc, device=dev)
    allow_c = (m[None, :] // rank) < cq[:, None]  # (Mp, Nc)
    if Nc:
        rho = (cq[:, None] * rank - 1 - m[None, :]).clamp(0, max(r_chunk.shape[1] - 1, 0))
        bias_c = torch.gather(F.pad(q_rc, (0, 0, 0, back)), 3, rho[None, None].expand(B, h, Mp, Nc))
    else:
        bias_c = q.new_zeros(B, h, Mp, 0)
    bias_c = bias_c.masked_fill(~allow_c, _NEG_INF).reshape(B, h, T, w, Nc)
    mask = torch.cat([bias_c.transpose(1, 2), bias_w.transpose(1, 2)], dim=-1)  # (B, T, h, w, Nc + 2w)
    keys = torch.cat([kc[:, None].expand(B, T, h, Nc, d), k_t.transpose(1, 2)], dim=3)
    vals = torch.cat([vc[:, None].expand(B, T, h, Nc, d), v_t.transpose(1, 2)], dim=3)
    q_t = F.pad(q, (0, 0, 0, back)).reshape(B, h, T, w, d).transpose(1, 2)
    # every row keeps a key: a real query sees itself, a tail query (only when w >= 2) sees the last real token
    out = _sdpa(q_t, keys, vals, mask, scale, dropout_p, check=False)  # (B, T, h, w, d)
    return out.transpose(1, 2).reshape(B, h, Mp, d)[:, :, :M]


def _causal_chunks_only_sdpa(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, r_chunk: torch.Tensor, t0: int,
                             chunk_size: int, rank: int, scale: float, dropout_p: float) -> torch.Tensor:
    """`long_short_causal_sdpa` without window keys (w = 0): each query attends to the chunk vectors of the chunks
    before its own, with the Transformer-XL chunk term in a float mask; rows with no earlier chunk are zero."""
    B, h, M, d = q.shape
    Nc = kc.shape[2]
    if Nc == 0:
        return q * 0.0
    tq = t0 + torch.arange(M, device=q.device)
    cq = tq // chunk_size
    m = torch.arange(Nc, device=q.device)
    allow_c = (m[None, :] // rank) < cq[:, None]  # (M, Nc)
    q_rc = (q * scale) @ r_chunk.transpose(-2, -1)[None]  # (B, h, M, P)
    rho = (cq[:, None] * rank - 1 - m[None, :]).clamp(0, max(r_chunk.shape[1] - 1, 0))
    bias = torch.gather(q_rc, 3, rho[None, None].expand(B, h, M, Nc)).masked_fill(~allow_c, _NEG_INF)
    return _sdpa4(q, kc, vc, bias, scale, dropout_p)
