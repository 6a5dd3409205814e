"""CSwin stripe attention with LePE: dense reference over the whole map and the SDPA fast path.

Shapes: q, k, v (B, h, N, d) with N = H * W (row-major, head-major channels c = head * d + j); LePE weight
(h * d, 1, 3, 3), bias (h * d,); stripes are (sh, sw) rectangles tiling the map padded to (Hp, Wp); output
(B, h, N, d).

Paper: CSwin (Dong et al. 2022) Eq. 1-3: horizontal/vertical stripe self-attention, LePE = DWConv3x3(V) added to the
    attention output inside each stripe.
Official: LeapLabTHU/FLatten-Transformer `models/flatten_cswin.py` `LePEAttention` (`im2cswin`, `get_lepe`,
    `img2windows`, `windows2img`), from microsoft/CSWin-Transformer.
Symbols: sw stripe width (paper sw, `split_size`), (sh, sw) = (H, sw) vertical branch (`idx=0`), (sw, W) horizontal
    branch (`idx=1`), (H, W) one global branch (`idx=-1`, last stage).

Padding **[ours]** (docs/deviations.md): a map whose side is not a multiple of the stripe is padded with zeros at the
bottom/right (after the qkv projection), padded keys are excluded for real queries, LePE runs on the padded stripe
(so at a real token it equals the 3x3 conv of the cut stripe with zero padding) and the result is cropped. Where the
official code runs (divisible maps) this is exactly the official computation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..._shapes import known_equal, round_up
from .softmax import export_mask, sdpa, softmax_attention_probs
from .window import stripe_partition

__all__ = ["stripe_shape", "stripe_ids", "cswin_attention_probs_ref", "lepe_ref", "cswin_attention_ref",
           "cswin_attention", "cswin_attention_packed", "cswin_attention_gathered", "stripe_gather_index"]


def stripe_shape(hw: tuple[int, int], idx: int, split_size: int) -> tuple[int, int]:
    """(sh, sw) of a branch: idx 0 vertical (H, s), 1 horizontal (s, W), -1 global (H, W)."""
    H, W = hw
    if split_size < 1:
        raise ValueError(f"CSwin split_size must be >= 1, got {split_size}")
    if idx == 0:
        return H, split_size
    if idx == 1:
        return split_size, W
    if idx == -1:
        return H, W
    raise ValueError(f"CSwin branch idx must be 0 (vertical), 1 (horizontal) or -1 (global), got {idx}")


def stripe_ids(hw: tuple[int, int], stripe: tuple[int, int], device=None) -> torch.Tensor:
    """(N,) stripe index of every token of the (H, W) map (row-major)."""
    H, W = hw
    sh, sw = stripe
    r = torch.arange(H, device=device) // sh
    c = torch.arange(W, device=device) // sw
    return (r[:, None] * (round_up(W, sw) // sw) + c[None, :]).flatten()


def cswin_attention_probs_ref(q: torch.Tensor, k: torch.Tensor, hw: tuple[int, int], stripe: tuple[int, int],
                              scale: float | None = None) -> torch.Tensor:
    """Dense (B, h, N, N) probabilities: token i attends to the real tokens of its own stripe."""
    sid = stripe_ids(hw, stripe, q.device)
    return softmax_attention_probs(q, k, scale, sid[:, None] == sid[None, :])


def lepe_ref(v: torch.Tensor, hw: tuple[int, int], stripe: tuple[int, int], weight: torch.Tensor,
             bias: torch.Tensor | None) -> torch.Tensor:
    """LePE written out: out_i = b + sum over the 3x3 neighbours j of i inside i's stripe of w[:, offset] * v_j.

    v (B, h, N, d) -> (B, h, N, d); weight (h * d, 1, 3, 3), bias (h * d,).
    """
    B, h, N, d = v.shape
    H, W = hw
    sid = stripe_ids(hw, stripe, v.device).view(H, W)
    vm = v.permute(0, 1, 3, 2).reshape(B, h * d, H, W)  # (B, C, H, W)
    out = torch.zeros_like(vm)
    rows = torch.arange(H, device=v.device)[:, None]
    cols = torch.arange(W, device=v.device)[None, :]
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            rj, cj = rows + dy, cols + dx
            inside = (rj >= 0) & (rj < H) & (cj >= 0) & (cj < W)
            rj_c, cj_c = rj.clamp(0, H - 1).expand(H, W), cj.clamp(0, W - 1).expand(H, W)
            ok = inside & (sid[rj_c, cj_c] == sid)  # (H, W)
            neighbour = vm[:, :, rj_c, cj_c]  # (B, C, H, W)
            out = out + weight[:, 0, dy + 1, dx + 1][None, :, None, None] * neighbour * ok
    if bias is not None:
        out = out + bias[None, :, None, None]
    return out.reshape(B, h, d, N).transpose(-2, -1)


def cswin_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: tuple[int, int],
                        stripe: tuple[int, int], lepe_weight: torch.Tensor | None = None,
                        lepe_bias: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """Reference: dense stripe-masked softmax over the whole map plus the written-out LePE. Returns (B, h, N, d)."""
    out = cswin_attention_probs_ref(q, k, hw, stripe, scale) @ v
    if lepe_weight is not None:
        out = out + lepe_ref(v, hw, stripe, lepe_weight, lepe_bias)
    return out


def cswin_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: tuple[int, int],
                    stripe: tuple[int, int], lepe_weight: torch.Tensor | None = None,
                    lepe_bias: torch.Tensor | None = None, scale: float | None = None,
                    dropout_p: float = 0.0) -> torch.Tensor:
    """Fast path on (B, h, N, d) tensors (packs them and calls `cswin_attention_packed`). Same arguments and result
    as `cswin_attention_ref`."""
    B, h, N, d = q.shape
    H, W = hw
    qkv = torch.stack([q, k, v], dim=2).view(B, h, 3, H, W, d).permute(0, 3, 4, 2, 1, 5)  # (B, H, W, 3, h, d)
    o = cswin_attention_packed(qkv, stripe, lepe_weight, lepe_bias, scale, dropout_p)  # (B, H, W, h, d)
    return o.reshape(B, N, h, d).transpose(1, 2)


def cswin_attention_packed(qkv: torch.Tensor, stripe: tuple[int, int], lepe_weight: torch.Tensor | None = None,
                           lepe_bias: torch.Tensor | None = None, scale: float | None = None,
                           dropout_p: float = 0.0) -> torch.Tensor:
    """Fast path on the channels-last qkv map: pad, partition into stripes (one copy), one SDPA call (padded keys
    masked), LePE as a depthwise conv on the stripes, reverse (one copy), crop.

    Args:
        qkv: (B, H, W, 3, h, d), any strides (e.g. a channel slice of a qkv projection viewed as a map).
        stripe, lepe_weight, lepe_bias, scale: as `cswin_attention_ref`.
        dropout_p: dropout on the probabilities (training).

    Returns:
        (B, H, W, h, d).
    """
    B, H, W, _, h, d = qkv.shape
    if any(isinstance(t, torch.SymInt) for t in (H, W)):
        # Traced with a symbolic map (torch.export --dynamic): the padded reshapes below would leave guards on
        # the stripe count; the gather form has none.
        return cswin_attention_gathered(qkv, stripe, lepe_weight, lepe_bias, scale, dropout_p)
    sh, sw = stripe
    Hp, Wp = round_up(H, sh), round_up(W, sw)
    nh, nw, L, C = Hp // sh, Wp // sw, sh * sw, h * d
    if not known_equal((Hp, Wp), (H, W)):
        qkv = F.pad(qkv, (0, 0, 0, 0, 0, 0, 0, Wp - W, 0, Hp - H))
    # (B, nh, sh, nw, sw, 3, h, d) -> (3, B, nh, nw, h, sh, sw, d) -> (3, B*nS, h, L, d)
    qs, ks, vs = qkv.reshape(B, nh, sh, nw, sw, 3, h, d).permute(5, 0, 1, 3, 6, 2, 4, 7).reshape(
        3, B * nh * nw, h, L, d).unbind(0)
    mask = None
    if not known_equal((Hp, Wp), (H, W)):
        r = torch.arange(Hp, device=qkv.device)[:, None] < H
        c = torch.arange(Wp, device=qkv.device)[None, :] < W
        real = stripe_partition((r & c)[None, :, :, None], sh, sw)[..., 0]  # (nS, L)
        # Real queries never read padded keys; padded query rows stay unmasked (cropped later).
        mask = export_mask(~(real[:, :, None] & ~real[:, None, :]), qkv.dtype)  # (nS, L, L)
        mask = mask[:, None].repeat(B, 1, 1, 1)  # (B*nS, 1, L, L)
    o = sdpa(qs, ks, vs, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    if lepe_weight is not None:
        # (B*nS, h, L, d) -> (B*nS, C, sh, sw): channel head * d + j, as the official get_lepe.
        lepe = F.conv2d(vs.transpose(-2, -1).reshape(B * nh * nw, C, sh, sw), lepe_weight, lepe_bias, padding=1,
                        groups=C)
        o = o + lepe.view(B * nh * nw, h, d, L).transpose(-2, -1)
    # (B, nh, nw, h, sh, sw, d) -> (B, nh, sh, nw, sw, h, d) -> (B, Hp, Wp, h, d), cropped.
    o = o.view(B, nh, nw, h, sh, sw, d).permute(0, 1, 4, 2, 5, 3, 6).reshape(B, Hp, Wp, h, d)
    return o[:, :H, :W]


def _mod(t: torch.Tensor, n) -> torch.Tensor:
    """t mod n for non-negative t, without a remainder by a symbolic scalar (ONNX's exporter has none)."""
    return t - (t // n) * n if isinstance(n, torch.SymInt) else t % n


def stripe_gather_index(hw: tuple[int, int], stripe: tuple[int, int],
                        device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Index maps of the stripe partition of an (H, W) map padded bottom/right to multiples of (sh, sw).

    Returns:
        fwd: (nS * L,) long; stripe-order position (row-major stripes, row-major inside) -> source token in [0, N],
            where N stands for a zero pad token.
        inv: (N,) long; token -> its stripe-order position.
        real: (nS, L) bool; which stripe positions hold a real token.
    """
    H, W = hw
    sh, sw = stripe
    nw = round_up(W, sw) // sw
    L = sh * sw
    p = torch.arange((round_up(H, sh) // sh) * nw * L, device=device)
    sid, inside = p // L, _mod(p, L)
    r = (sid // nw) * sh + inside // sw
    c = _mod(sid, nw) * sw + _mod(inside, sw)
    real = (r < H) & (c < W)
    fwd = torch.where(real, r * W + c, torch.full_like(r, H * W))
    t = torch.arange(H * W, device=device)
    tr, tc = t // W, _mod(t, W)
    inv = ((tr // sh) * nw + tc // sw) * L + _mod(tr, sh) * sw + _mod(tc, sw)
    return fwd, inv, real.view(-1, L)


def _stripe_lepe(v: torch.Tensor, stripe: tuple[int, int], weight: torch.Tensor,
                 bias: torch.Tensor | None) -> torch.Tensor:
    """LePE on the whole map: the depthwise 3x3 conv with every tap that crosses a stripe border taken out.

    v (B, C, H, W) -> (B, C, H, W); equal to the conv on each zero-padded stripe (`lepe_ref`). A CSwin stripe spans
    the map's full height or width, so only one direction has inner borders.
    """
    B, C, H, W = v.shape
    sh, sw = stripe
    out = F.conv2d(v, weight, bias, padding=1, groups=C)
    for axis, side, n in ((3, sw, W), (2, sh, H)):
        if side is n or known_equal((side,), (n,)):
            continue  # the stripe spans this axis: no inner border
        pos = torch.arange(n, device=v.device)
        for tap, cut in ((2, _mod(pos, side) == side - 1), (0, _mod(pos, side) == 0)):
            # The taps reading the next (tap 2) or previous (tap 0) row/column, at positions whose neighbour there
            # lies in another stripe.
            w_tap = torch.zeros_like(weight)
            if axis == 3:
                w_tap[..., tap] = weight[..., tap]
                m = cut.to(v.dtype)[None, None, None, :]
            else:
                w_tap[..., tap, :] = weight[..., tap, :]
                m = cut.to(v.dtype)[None, None, :, None]
            out = out - m * F.conv2d(v, w_tap, None, padding=1, groups=C)
    return out


def cswin_attention_gathered(qkv: torch.Tensor, stripe: tuple[int, int], lepe_weight: torch.Tensor | None = None,
                             lepe_bias: torch.Tensor | None = None, scale: float | None = None,
                             dropout_p: float = 0.0) -> torch.Tensor:
    """`cswin_attention_packed` as gathers (the form a dynamic-size program traces): the padded stripe partition is
    one index into the tokens plus a zero token, the reverse one index back, and LePE runs on the whole map with the
    cross-stripe taps removed. The batch is never merged with the stripe count. Same arguments and result."""
    B, H, W, _, h, d = qkv.shape
    sh, sw = stripe
    C, L = h * d, sh * sw
    fwd, inv, real = stripe_gather_index((H, W), stripe, qkv.device)
    nS = real.shape[0]
    tok = qkv.reshape(B, H * W, 3 * C)
    tok = torch.cat([tok, tok.new_zeros(B, 1, 3 * C)], dim=1)
    # (B, nS, L, 3, h, d) -> (3, B, nS * h, L, d)
    qs, ks, vs = tok[:, fwd.view(nS, L)].view(B, nS, L, 3, h, d).permute(3, 0, 1, 4, 2, 5).reshape(
        3, B, nS * h, L, d).unbind(0)
    # Real queries never read padded keys; padded query rows stay unmasked (dropped by the reverse gather).
    mask = export_mask(~(real[:, :, None] & ~real[:, None, :]), qkv.dtype)  # (nS, L, L)
    mask = mask[:, None].expand(nS, h, L, L).reshape(1, nS * h, L, L)
    o = sdpa(qs, ks, vs, attn_mask=mask, dropout_p=dropout_p, scale=scale)
    o = o.view(B, nS, h, L, d).transpose(2, 3).reshape(B, nS * L, C)
    o = torch.index_select(o, 1, inv).view(B, H, W, h, d)
    if lepe_weight is not None:
        vmap = qkv[:, :, :, 2].reshape(B, H, W, C).permute(0, 3, 1, 2)  # (B, C, H, W), channel head * d + j
        o = o + _stripe_lepe(vmap, stripe, lepe_weight, lepe_bias).permute(0, 2, 3, 1).view(B, H, W, h, d)
    return o
