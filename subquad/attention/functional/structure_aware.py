"""LiSA structure-aware attention: the explicit operators of the paper's chain and the fast FFT form.

Paper: LiSA (arXiv 2211.16289), Eq. 8-13; this file rebuilds the operator from the paper's equations
(docs/deviations.md). LiSA has no official code: these functions are the reference.
Official: none published.

Layout: q, k, v: (B, h, N, d) (SDPA layout), already L2-normalised where the operator needs it (the module does it).
The token grid `grid` is (H, W) for images or (T, H, W) for video; N = prod(grid); tokens in raster order.

Symbol map (paper -> code):
    Q-bar, K-bar      q, k (L2-normalised over the head dim d)
    V                 v
    D                 structural-pattern size (trailing kernel dim before the grid dims)
    W^a (N x C x D)   kernel_a: (C, D, *K) real, C = h * d, channel c of head c // d
    W^b (N x D)       kernel_b: (h, D, *K) per head, or (1, D, *K) shared by all heads
    B (C x D)         struct_proj: (C, D); head g uses rows g*d ... (g+1)*d - 1
    S (N x D)         structural vector, per head: (B, h, N, D)
    A-hat             equivalent token-mixing kernel, per head: (B, h, N, N)

Kernel conventions (our choice; docs/deviations.md). A kernel is stored in the token domain, indexed by
the offset delta = (key position - query position) along each grid axis:
    - 'circular': K == grid; entry for delta sits at index delta mod grid (circulant RPE; Eq. 13);
    - 'zero' (Toeplitz): K == 2 * grid - 1; entry for delta sits at index delta + (grid - 1) (Eq. 11; no wrap);
    - local k x k kernels: K == (k, k) (odd k); entry for delta sits at delta + k // 2, i.e. a zero-padded
      cross-correlation (Tab. 3(d) local LiSA kernels), which equals the Toeplitz form of the kernel embedded in zeros.
Every correlation below is G[i] = sum_n w[n - i] x[n]; with FFTs: ifft(fft(x) * F(w)[-f]), = conj(F(w)) for real w.
"""

from __future__ import annotations

import functools
import math
import threading
import weakref
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from ..._shapes import known_equal, sizes
from ...backend import cpu_schedules

__all__ = [
    "relative_index",
    "rpe_matrix",
    "lisa_eq8_ref",
    "lisa_eq9_ref",
    "lisa_eq10_ref",
    "lisa_eq10_dense",
    "lisa_circulant_ref",
    "lisa_toeplitz_ref",
    "lisa_fft",
    "lisa_dft",
    "lisa_local",
    "kernel_spectra",
    "plan_tiles",
    "dense_blocks",
    "release_workspaces",
    "toeplitz_to_circular",
    "local_to_toeplitz",
    "resize_kernel",
    "inflate_kernel",
    "offsets_range",
]

_BOUNDARIES = ("circular", "zero")

# Inference workspaces of `lisa_fft` (CPU schedule, no autograd), kept per thread across calls: a fresh
# multi-MiB buffer per call is paid again in page faults on first touch (one per 4 KiB page), which at
# 56 x 56 grids cost more than the spectral product written into it. A slot keeps its largest size up to
# WORKSPACE_KEEP_BYTES; a larger request (large batches) gets a buffer for that call only. Only CPU buffers are
# kept (elsewhere the caching allocator already reuses memory, stream-aware). `release_workspaces()` frees them.
WORKSPACE_KEEP_BYTES = 64 * 2 ** 20
_workspace_lock = threading.Lock()
_thread_slots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # thread -> {key: buffer}


def _workspace(name: str, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A (shape, dtype) view of this thread's reusable buffer `name` on `device` (contents undefined)."""
    n = math.prod(shape)
    if torch.device(device).type != "cpu" or n * dtype.itemsize > WORKSPACE_KEEP_BYTES:
        return torch.empty(*shape, dtype=dtype, device=device)
    thread = threading.current_thread()
    with _workspace_lock:
        slots = _thread_slots.get(thread)
        if slots is None:
            slots = _thread_slots[thread] = {}
    # A tensor made under inference_mode may not be updated in place outside it: one slot per mode.
    key = (name, dtype, torch.is_inference_mode_enabled())
    buf = slots.get(key)
    if buf is None or buf.numel() < n:
        buf = slots[key] = torch.empty(n, dtype=dtype, device=device)
    return buf[:n].view(*shape)


def release_workspaces(all_threads: bool = False) -> None:
    """Free the LiSA inference workspaces `lisa_fft` keeps across calls: the calling thread's, or every thread's
    (`all_threads`; a thread running `lisa_fft` at that moment keeps the buffer it holds until its call ends)."""
    with _workspace_lock:
        if all_threads:
            _thread_slots.clear()
        else:
            _thread_slots.pop(threading.current_thread(), None)


def _check_boundary(boundary: str) -> None:
    if boundary not in _BOUNDARIES:
        raise ValueError(f"boundary must be one of {_BOUNDARIES}, got {boundary!r}")


def _kernel_shape(grid: Sequence[int], boundary: str) -> tuple[int, ...]:
    _check_boundary(boundary)
    return tuple(grid) if boundary == "circular" else tuple(2 * g - 1 for g in grid)


def relative_index(grid: Sequence[int], boundary: str = "circular", device=None) -> torch.Tensor:
    """Flat kernel index of every (query i, key n) pair: (N, N) long.

    Offsets are taken per grid axis from the 2-D/3-D coordinates (never from flat-index differences):
    'circular' -> delta mod grid, kernel shape == grid; 'zero' -> delta + grid - 1, kernel shape == 2 * grid - 1.
    """
    ksize = _kernel_shape(grid, boundary)
    coords = torch.stack(torch.meshgrid(*[torch.arange(g, device=device) for g in grid], indexing="ij"))
    coords = coords.flatten(1)  # (nd, N), raster order
    delta = coords[:, None, :] - coords[:, :, None]  # (nd, N_query, N_key): key - query
    flat = torch.zeros(delta.shape[1:], dtype=torch.long, device=device)
    for ax, (g, ks) in enumerate(zip(grid, ksize)):
        idx = delta[ax] % g if boundary == "circular" else delta[ax] + (g - 1)
        flat = flat * ks + idx
    return flat


def rpe_matrix(kernel: torch.Tensor, grid: Sequence[int], boundary: str = "circular") -> torch.Tensor:
    """The explicit relative-position tensor R[..., i, n] = kernel[..., delta(n - i)].

    Shapes: kernel (..., *K) with K = grid ('circular') or 2 * grid - 1 ('zero') -> (..., N, N).
    Paper: R = T(e) (Toeplitz, Eq. 8-11) or its circulant approximation (Eq. 13).
    """
    nd = len(grid)
    ksize = _kernel_shape(grid, boundary)
    if tuple(kernel.shape[-nd:]) != ksize:
        raise ValueError(f"kernel of shape {tuple(kernel.shape)} does not fit grid {tuple(grid)} with boundary "
                         f"{boundary!r}: expected trailing dims {ksize}")
    idx = relative_index(grid, boundary, kernel.device)
    return kernel.flatten(-nd)[..., idx]


def _head_struct_proj(struct_proj: torch.Tensor, h: int) -> torch.Tensor:
    """(C, D) -> (h, d, D): head g owns rows g*d ... (g+1)*d - 1."""
    C, D = struct_proj.shape
    return struct_proj.reshape(h, C // h, D)


def lisa_eq8_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: torch.Tensor, grid: Sequence[int],
                 boundary: str = "circular") -> torch.Tensor:
    """Eq. 8, multiplicative RPE: Y = (A-bar * R) V with A-bar = q k^T (cosine similarities), no softmax.

    Shapes: q, k, v (B, h, N, d); kernel (h, *K) one RPE kernel per head -> (B, h, N, d).
    Paper: LiSA (arXiv 2211.16289) Eq. 8 ("SA" with multiplicative RPE; called Eq. 4 in the ablation prose).
    """
    attn = q @ k.transpose(-2, -1)  # (B, h, N, N)
    return (attn * rpe_matrix(kernel, grid, boundary)) @ v


def lisa_eq9_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel_a: torch.Tensor, kernel_b: torch.Tensor,
                 struct_proj: torch.Tensor, grid: Sequence[int], boundary: str = "circular") -> torch.Tensor:
    """Eq. 9, structure-aware SA with dot-product correlation.

    S[i, d] = sum_n A-bar[i, n] R^a[d, i, n];  A-hat[i, j] = sum_d S[i, d] R^b[d, i, j];  Y = A-hat V + S B^T.

    Shapes: q, k, v (B, h, N, dh); kernel_a (h, D, *K) per head; kernel_b (h or 1, D, *K); struct_proj (C, D)
    -> (B, h, N, dh).
    Paper: LiSA (arXiv 2211.16289) Eq. 9 (called Eq. 5 in the ablation prose).
    """
    h = q.shape[1]
    attn = q @ k.transpose(-2, -1)  # (B, h, N, N)
    ra = rpe_matrix(kernel_a, grid, boundary)  # (h, D, N, N)
    s = torch.einsum("bhin,hdin->bhid", attn, ra)  # (B, h, N, D)
    rb = rpe_matrix(kernel_b, grid, boundary).expand(h, -1, -1, -1)  # (h, D, N, N)
    a_hat = torch.einsum("bhid,hdij->bhij", s, rb)  # (B, h, N, N)
    feat = torch.einsum("bhid,hcd->bhic", s, _head_struct_proj(struct_proj, h))
    return a_hat @ v + feat


def lisa_eq10_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel_a: torch.Tensor, kernel_b: torch.Tensor,
                  struct_proj: torch.Tensor, grid: Sequence[int], boundary: str = "circular",
                  return_structure: bool = False):
    """Eq. 10, structure-aware SA with the Hadamard correlation, evaluated literally (O(N^2 C D)).

    A-bar[i, n, c] = q[i, c] k[n, c];  S[i, d] = sum_{n, c in head} A-bar[i, n, c] R^a[c, d, i, n];
    A-hat[i, j] = sum_d S[i, d] R^b[d, i, j];  Y = A-hat V + S B^T (per head).

    Shapes: q, k, v (B, h, N, dh); kernel_a (C, D, *K); kernel_b (h or 1, D, *K); struct_proj (C, D) -> (B, h, N, dh).
    With `return_structure=True` returns (Y, S (B, h, N, D), A-hat (B, h, N, N)).
    Paper: LiSA (arXiv 2211.16289) Eq. 10 (the final SA), whose circulant form Eq. 13 computes with FFTs.
    """
    B, h, N, dh = q.shape
    D = kernel_a.shape[1]
    ra = rpe_matrix(kernel_a, grid, boundary).reshape(h, dh, D, N, N)  # R^a[c, d, i, n] per head
    hadamard = q[:, :, :, None, :] * k[:, :, None, :, :]  # (B, h, N_i, N_n, dh)
    s = torch.einsum("bhinc,hcdin->bhid", hadamard, ra)  # (B, h, N, D)
    rb = rpe_matrix(kernel_b, grid, boundary).expand(h, -1, -1, -1)  # (h, D, N, N)
    a_hat = torch.einsum("bhid,hdij->bhij", s, rb)  # (B, h, N, N)
    y = a_hat @ v + torch.einsum("bhid,hcd->bhic", s, _head_struct_proj(struct_proj, h))
    return (y, s, a_hat) if return_structure else y


def lisa_eq10_dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel_a: torch.Tensor,
                    kernel_b: torch.Tensor, struct_proj: torch.Tensor, grid: Sequence[int],
                    boundary: str = "circular") -> torch.Tensor:
    """Eq. 10 with dense RPE tensors, evaluated in the order of Eq. 11-12: the trainable slow form.

    Ga[i, c, d] = sum_n R^a[c, d, i, n] k[n, c] (a dense depthwise global convolution with channel multiplier D),
    S[i, d] = sum_c q[i, c] Ga[i, c, d], A-hat[i, j] = sum_d S[i, d] R^b[d, i, j], Y = A-hat V + S B^T (per head).
    Same function as `lisa_eq10_ref`, but without its (B, h, N, N, d) Hadamard tensor: the only O(N^2) tensors are
    the parameter-derived R^a (C, D, N, N), R^b and A-hat (B, h, N, N). O(N^2 C D) MACs, as the paper states for SA.

    Shapes: q, k, v (B, h, N, dh); kernel_a (C, D, *K); kernel_b (h or 1, D, *K); struct_proj (C, D) -> (B, h, N, dh).
    Paper: LiSA (arXiv 2211.16289) Eq. 10-12 (with Toeplitz R for boundary='zero'; circulant R for 'circular').
    """
    B, h, N, dh = q.shape
    D = kernel_a.shape[1]
    ra = rpe_matrix(kernel_a, grid, boundary).reshape(h, dh, D, N, N)
    ga = torch.einsum("hcdin,bhnc->bhicd", ra, k)  # (B, h, N, dh, D)
    s = (ga * q[..., None]).sum(-2)  # (B, h, N, D)
    rb = rpe_matrix(kernel_b, grid, boundary).expand(h, -1, -1, -1)  # (h, D, N, N)
    a_hat = torch.einsum("bhid,hdij->bhij", s, rb)
    return a_hat @ v + torch.einsum("bhid,hcd->bhic", s, _head_struct_proj(struct_proj, h))


def lisa_circulant_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel_a: torch.Tensor,
                       kernel_b: torch.Tensor, struct_proj: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
    """Eq. 10 with circulant RPE tensors (kernels (C, D, *grid), (h|1, D, *grid)): what `lisa_fft` must equal."""
    return lisa_eq10_ref(q, k, v, kernel_a, kernel_b, struct_proj, grid, "circular")


def lisa_toeplitz_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel_a: torch.Tensor,
                      kernel_b: torch.Tensor, struct_proj: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
    """Eq. 10 with Toeplitz RPE tensors (kernels (C, D, *(2*grid-1))): no wrap-around, keys outside contribute 0."""
    return lisa_eq10_ref(q, k, v, kernel_a, kernel_b, struct_proj, grid, "zero")


def toeplitz_to_circular(kernel: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
    """Place a Toeplitz kernel (..., *(2*grid - 1)) on the doubled grid (..., *(2*grid)), offset delta at
    delta mod 2*grid. Exact: every needed offset has a unique residue (`boundary='zero'`)."""
    nd = len(grid)
    out = kernel
    for ax, g in enumerate(grid):
        dim = kernel.dim() - nd + ax
        # Index delta + g - 1 for delta in [-(g-1), g-1]; new index delta mod 2g; index g (delta = +-g) stays zero.
        pos, neg = out.narrow(dim, g - 1, g), out.narrow(dim, 0, g - 1)
        zero = torch.zeros_like(out.narrow(dim, 0, 1))
        out = torch.cat([pos, zero, neg], dim=dim)
    return out


def local_to_toeplitz(kernel: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
    """Embed a local kernel (..., *k) (odd k, centred) in a zero Toeplitz kernel (..., *(2*grid - 1)); offsets the
    grid cannot reach are dropped."""
    nd = len(grid)
    out = kernel
    for ax, g in enumerate(grid):
        dim = kernel.dim() - nd + ax
        r = out.shape[dim] // 2
        if r > g - 1:
            out = out.narrow(dim, r - (g - 1), 2 * g - 1)
        else:
            pad = [0, 0] * (out.dim() - 1 - dim) + [g - 1 - r, g - 1 - r]
            out = F.pad(out, pad)
    return out


def kernel_spectra(kernel_a: torch.Tensor, kernel_b: torch.Tensor,
                   fft_grid: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Correlation spectra of both kernels on `fft_grid`, in the packed form `lisa_fft` uses.

    Shapes: kernel_a (C, D, *K) real -> (C, ceil(D/2), *fft_grid) complex; kernel_b (hb, D, *K) real ->
    (hb, D, *fft_grid) complex (K <= fft_grid, zero-padded at the end).
    For any kernel w, real or complex, the correlation G[i] = sum_n w[n - i] x[n] has spectrum F(x)[f] F(w)[-f].
    kernel_a is packed in pattern pairs w = w_{2e} + i w_{2e+1} (a zero pattern completes an odd D): with a real
    input x, real and imaginary parts of the one complex correlation are the two real correlations. For
    w = w1 + i w2, F(w)[-f] = conj(F(w1 - i w2)[f]), which is what is stored; for kernel_b it is conj(F(w)).
    """
    fft_grid = tuple(int(g) for g in fft_grid)
    dims = tuple(range(-len(fft_grid), 0))
    if kernel_a.shape[1] % 2:
        kernel_a = torch.cat([kernel_a, kernel_a.new_zeros(kernel_a.shape[0], 1, *kernel_a.shape[2:])], 1)
    packed = torch.complex(kernel_a[:, 0::2], -kernel_a[:, 1::2])
    wa = torch.fft.fftn(packed, s=fft_grid, dim=dims).conj().resolve_conj()
    wb = torch.fft.fftn(kernel_b, s=fft_grid, dim=dims).conj().resolve_conj()
    return wa, wb


def plan_tiles(batch: int, heads: int, head_dim: int, D: int, n: int, d_chunk: int | None = None,
               tile_elems: int = 2 ** 21) -> tuple[int, int]:
    """Tile sizes (heads per tile, structural patterns per tile) of the chunked FFT evaluation.

    Heads are independent and Y is a sum over d, so any tiling is exact. Patterns go in pairs (one complex
    transform carries two, see `kernel_spectra`), so the pattern count of a tile is even (the last tile may hold
    fewer). Each Ga/Gb tile holds about batch * heads_per_tile * head_dim * patterns_per_tile * n floats. With
    `d_chunk` given, D is cut into chunks of that size rounded up to even; otherwise whole pairs are kept together
    while one head's tile fits `tile_elems` (default 2^21 floats = 8 MiB), as many as evenly divide the pairs.
    Then as many heads as fit join a tile (at least 1).
    """
    per_d = max(1, batch * head_dim * n)
    pairs = (D + 1) // 2
    if d_chunk is None:
        fit = [c for c in range(1, pairs + 1) if pairs % c == 0 and 2 * c * per_d <= tile_elems]
        p_tile = max(fit) if fit else 1
    elif d_chunk < 1:
        raise ValueError(f"d_chunk must be >= 1, got {d_chunk}")
    else:
        p_tile = min(pairs, (d_chunk + 1) // 2)
    return max(1, min(heads, tile_elems // (per_d * 2 * p_tile))), min(D, 2 * p_tile)


def _chunks(D: int, d_chunk: int | None) -> list[slice]:
    if d_chunk is None or d_chunk >= D:
        return [slice(0, D)]
    if d_chunk < 1:
        raise ValueError(f"d_chunk must be >= 1, got {d_chunk}")
    return [slice(s, min(s + d_chunk, D)) for s in range(0, D, d_chunk)]


def _to_map(t: torch.Tensor, grid: Sequence[int]) -> torch.Tensor:
    """(B, h, N, d) -> (B, h, d, *grid)."""
    B, h, N, d = t.shape
    return t.transpose(-1, -2).reshape(B, h, d, *grid)


def _contract(q_cn: torch.Tensor, ga: torch.Tensor, gb: torch.Tensor, bproj: torch.Tensor) -> torch.Tensor:
    """One D-chunk of steps 5, 7, 8.

    Shapes: q_cn (B, h, d, N); ga, gb (B, h, d, Dc, N); bproj (h, d, Dc) -> y chunk (B, h, d, N).
    """
    # Memory-bound batched dot products over c (and over d below) as multiply + reduce: einsum would route them
    # through bmm with a permuted copy of the large Ga/Gb tiles.
    s = (ga * q_cn[:, :, :, None]).sum(2)  # structural vector S chunk, (B, h, Dc, N)
    y = (gb * s[:, :, None]).sum(3)  # kernel path sum_d S_d Gb_d, (B, h, d, N)
    return y + torch.einsum("bhen,hce->bhcn", s, bproj)  # feature path S B^T


def _fft_of_real(x: torch.Tensor, fft_grid: Sequence[int]) -> torch.Tensor:
    """fftn of a real x over its trailing len(fft_grid) dims (zero-padded to fft_grid), full complex spectrum.

    Equals torch.fft.fftn(x, s=fft_grid) but runs rfftn and fills the missing half from the Hermitian symmetry
    X[k', w] = conj(X[-k', W - w]); torch's fftn of a real input runs a full complex transform (~6x slower here).
    """
    nd = len(fft_grid)
    dims = tuple(range(-nd, 0))
    half = torch.fft.rfftn(x, s=tuple(fft_grid), dim=dims)  # (..., *lead, W // 2 + 1)
    W = fft_grid[-1]
    n_mirror = W - (W // 2 + 1)
    if n_mirror == 0:
        return half
    mirror = half[..., 1:1 + n_mirror]
    if nd > 1:  # negate the leading frequency indices: k -> (-k) mod size is a flip then a roll by one
        lead = dims[:-1]
        mirror = torch.roll(torch.flip(mirror, lead), (1,) * len(lead), lead)
    return torch.cat([half, torch.flip(mirror, (-1,)).conj()], -1)


def lisa_fft(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel_a: torch.Tensor, kernel_b: torch.Tensor,
             struct_proj: torch.Tensor, grid: Sequence[int], boundary: str = "circular", d_chunk: int | None = None,
             spectra: tuple[torch.Tensor, ...] | None = None, checkpoint_chunks: bool = False,
             tile_elems: int = 2 ** 21, dense_b: bool | None = None) -> torch.Tensor:
    """Eq. 13: LiSA through FFTs over the grid (2-D for (H, W), 3-D over (T, H, W) for video).

    Ga[c, d, i] = sum_n kernel_a[c, d, n - i] k[c, n];  S[g, i, d] = sum_{c in g} q[c, i] Ga[c, d, i];
    Gb[c, d, i] = sum_j kernel_b[g(c), d, j - i] v[c, j];  Y[c, i] = sum_d S[g(c), i, d] (Gb[c, d, i] + B[c, d]).
    Both correlations are inverse FFTs of products with the kernels' correlation spectra. Two
    real correlations ride on one complex transform: Ga packs pattern pairs (kernel_a as w_{2e} + i w_{2e+1}, real
    k), Gb packs channel pairs of a head (v_c + i v_{c + ceil(d/2)}, real kernel_b shared by the head). So the
    2*C*D real inverse transforms of the plain form become C*D/2 + C*D/2 complex ones, the fastest form on CPU
    (pocketfft/MKL) and cuFFT alike, with no half-spectrum reshuffles. The work is tiled over heads and pattern
    pairs (`plan_tiles`; exact: heads are independent, S_d needs only Ga_d and Y is a sum over d), so the peak
    of Ga/Gb is one tile (<= 8 MiB by default) instead of B*C*D*N. The tiles and the reused inference workspace
    are CPU schedules (`subquad.backend`): elsewhere, and while tracing, one batched tile runs unless `d_chunk`
    asks for tiles.

    On small grids the kernel path is cheaper as the dense product of Eq. 10 than as correlations (`dense_b`):
    A-hat[i, j] = sum_d S[i, d] kernel_b[d, delta(j - i)] is a GEMM S kernel_b (N x D by D x K) read out at each
    pair's offset, then Y = A-hat V + S B^T, two more GEMMs. That replaces h * ceil(dh/2) * D inverse transforms by
    about N^2 (dh + D) multiply-adds per head, faster on a 2-core AMD EPYC up to 16 x 16 grids at D = 8 (the limit
    N <= DENSE_B_TOKENS_PER_PATTERN * D); the structural vector S still comes from the FFT correlations of kernel_a.

    Shapes: q, k, v (B, h, N, dh); kernel_a (C, D, *K); kernel_b (h or 1, D, *K); struct_proj (C, D)
    -> (B, h, N, dh). K = grid ('circular', equals `lisa_circulant_ref`) or 2*grid-1 ('zero': evaluated on the
    doubled grid, equals `lisa_toeplitz_ref`).
    Args:
        spectra: optional precomputed `kernel_spectra(kernel_a, kernel_b, fft_grid)` (fft_grid = grid for
            'circular', 2*grid for 'zero'); input-independent, cached by the module in eval with a third element,
            kernel_b on fft_grid flattened (h or 1, D, prod F), which spares `dense_b` its inverse transform.
        d_chunk: structural patterns per tile (rounded up to even); None = automatic (`plan_tiles`).
        checkpoint_chunks: recompute each tile's Ga/Gb in backward instead of saving them.
        tile_elems: float budget of one Ga/Gb tile (see `plan_tiles`).
        dense_b: the kernel path as the dense product A-hat V; None = on the CPU inference schedule (no autograd)
            when N <= DENSE_B_TOKENS_PER_PATTERN * D.
    """
    _check_boundary(boundary)
    B, h, N, dh = q.shape
    if math.prod(grid) != N:
        raise ValueError(f"grid {tuple(grid)} makes {math.prod(grid)} tokens but q has N={N}")
    D = kernel_a.shape[1]
    fft_grid = tuple(grid) if boundary == "circular" else tuple(2 * g for g in grid)
    if spectra is None:
        ka = kernel_a if boundary == "circular" else toeplitz_to_circular(kernel_a, grid)
        kb = kernel_b if boundary == "circular" else toeplitz_to_circular(kernel_b, grid)
        spectra = kernel_spectra(ka, kb, fft_grid)
    bproj = _head_struct_proj(struct_proj, h)  # (h, dh, D)
    # Without autograd (on the CPU schedule) the tiles reuse one workspace and work in place (see `_lisa_tile_fn`).
    cpu = cpu_schedules(q.device)
    inference = cpu and not (torch.is_grad_enabled() and any(
        t.requires_grad for t in (q, k, v, kernel_a, kernel_b, struct_proj, *spectra)))
    dense_b = _resolve_dense_b(dense_b, inference, N, D)
    if B == 0:  # an empty batch: torch's FFTs refuse zero-length batches
        return q * v.sum(-1, keepdim=True) * 0
    kf, vf, waf, wbf, q2 = _lisa_spectra(q, k, v, spectra, D, grid, fft_grid, with_v=not dense_b)
    chunk = _lisa_tile_fn(B, N, dh, grid, boundary, inference, q.device, structure_only=dense_b)
    h_tile, d_tile = plan_tiles(B, h, dh, D, N, d_chunk, tile_elems) if cpu or d_chunk is not None else (h, D)
    p_tile = (d_tile + 1) // 2
    # Tiles through split (backward: one concatenation), not slicing (backward: a zero-filled gradient per tile).
    kf_t, q_t = kf.split(h_tile, 1), q2.split(h_tile, 1)
    vf_t = (None,) * len(kf_t) if vf is None else vf.split(h_tile, 1)
    waf_t = [w.split(p_tile, 2) for w in waf.split(h_tile, 0)]
    wbf_t = [w.split(2 * p_tile, 2) for w in ((wbf,) * len(kf_t) if wbf.shape[0] == 1 else wbf.split(h_tile, 0))]
    bproj_t = [b.split(2 * p_tile, 2) for b in bproj.split(h_tile, 0)]
    outs = []
    for g in range(len(kf_t)):
        parts = []
        for e in range(len(waf_t[g])):
            args = (kf_t[g], vf_t[g], waf_t[g][e], wbf_t[g][e], q_t[g], bproj_t[g][e])
            if checkpoint_chunks and torch.is_grad_enabled():
                parts.append(torch.utils.checkpoint.checkpoint(chunk, *args, use_reentrant=False))
            else:
                parts.append(chunk(*args))
        # Y is a sum over pattern tiles; with `dense_b` a tile's part is its slice of S.
        outs.append(torch.cat(parts, 2) if dense_b else functools.reduce(torch.add, parts))
    y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
    if dense_b:
        return _dense_kernel_path(y, v, spectra[1], bproj, grid, fft_grid, tile_elems, (*spectra, None)[2])
    return y.transpose(-1, -2)  # (B, h, N, dh)


# `lisa_fft` takes the dense kernel path on the CPU inference schedule up to N = this * D tokens. Measured at D = 8
# only (one call, 5 heads of 64 channels, 2-core AMD EPYC; benchmarks/results/lisa-dense-b): faster than the FFT
# correlations at 7 x 7 to 16 x 16 grids (1.13-1.17x at 16 x 16), about even at 20 x 20 (1.04x), slower at 28 x 28
# (N = 98 D); the limit (N = 32 D, 16 x 16 at D = 8) stops short of 20 x 20.
DENSE_B_TOKENS_PER_PATTERN = 32


@functools.lru_cache(maxsize=16)
def _offset_index(grid: tuple[int, ...], fft_grid: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Flat index into a kernel laid out circularly on `fft_grid` (offset delta at delta mod fft_grid per axis) of
    every (query i, key n) pair of `grid`: (N, N) long. With fft_grid == grid it is `relative_index(grid)`.
    Built outside inference mode: a cached inference tensor could not be saved for backward by a later autograd
    call."""
    with torch.inference_mode(False):
        coords = torch.stack(torch.meshgrid(*[torch.arange(g, device=device) for g in grid],
                                            indexing="ij")).flatten(1)
        delta = coords[:, None, :] - coords[:, :, None]  # (nd, N_query, N_key): key - query
        flat = torch.zeros(delta.shape[1:], dtype=torch.long, device=device)
        for ax, f in enumerate(fft_grid):
            flat = flat * f + delta[ax] % f
        return flat


def _resolve_dense_b(dense_b: bool | None, inference: bool, N: int, D: int) -> bool:
    """`lisa_fft`'s dense_b: True / False as given; None -> the automatic rule (inference and N <= limit * D)."""
    if dense_b is None:
        return inference and N <= DENSE_B_TOKENS_PER_PATTERN * D
    if not isinstance(dense_b, bool):
        raise TypeError(f"dense_b must be True, False or None (automatic), got {dense_b!r}")
    return dense_b


def _dense_kernel_path(s: torch.Tensor, v: torch.Tensor, wb_spectra: torch.Tensor, bproj: torch.Tensor,
                       grid: Sequence[int], fft_grid: Sequence[int], tile_elems: int = 2 ** 21,
                       kernel_b: torch.Tensor | None = None) -> torch.Tensor:
    """Y = A-hat V + S B^T with A-hat[i, j] = sum_d S[i, d] kernel_b[d, delta(j - i)] (Eq. 10), evaluated densely.

    Shapes: s (B, h, D, N); v (B, h, N, dh); wb_spectra (h or 1, D, *F) the correlation spectra of kernel_b
    (`kernel_spectra`); bproj (h, dh, D) -> (B, h, N, dh); kernel_b: optional, the kernel those spectra invert to
    (`_kernel_from_spectra`, (h or 1, D, prod F)), used when it has s's dtype and the spectra need no gradient.
    The kernel comes back from its spectra (laid out circularly on F, the operator the FFT path applies, whatever
    size the module's kernel is stored at); S kernel_b gives every query row's value at every offset (B, h, N, F),
    and A-hat reads it at each (query, key) pair's offset. Those two (., N, max(N, prod F)) intermediates run in
    blocks of batch items and heads of at most `tile_elems` floats (`dense_blocks`), as the FFT path's tiles do."""
    B, h, D, N = s.shape
    # A given kernel_b is used only where no gradient has to reach the spectra through it.
    if kernel_b is None or kernel_b.dtype != s.dtype or (torch.is_grad_enabled() and wb_spectra.requires_grad):
        kernel_b = _kernel_from_spectra(wb_spectra, len(fft_grid), s.dtype)  # (h or 1, D, prod F)
    st = s.transpose(-1, -2)  # (B, h, N, D)
    vt = v.to(st.dtype)
    index = _offset_index(tuple(grid), tuple(fft_grid), s.device)
    b_block, h_block = dense_blocks(B, h, N, math.prod(fft_grid), tile_elems)
    rows = []
    for b0 in range(0, B, b_block):
        heads = []
        for h0 in range(0, h, h_block):
            sb = st[b0:b0 + b_block, h0:h0 + h_block]
            kb = kernel_b if kernel_b.shape[0] == 1 else kernel_b[h0:h0 + h_block]
            at_offset = sb @ kb  # (b, hb, N, prod F)
            a_hat = at_offset.gather(-1, index.expand(*sb.shape[:2], N, N))  # (b, hb, N, N)
            bp = bproj[h0:h0 + h_block].transpose(-1, -2).to(st.dtype)
            heads.append(a_hat @ vt[b0:b0 + b_block, h0:h0 + h_block] + sb @ bp)
        rows.append(heads[0] if len(heads) == 1 else torch.cat(heads, 1))
    return rows[0] if len(rows) == 1 else torch.cat(rows, 0)


def _kernel_from_spectra(spectra: torch.Tensor, ndim: int, dtype: torch.dtype) -> torch.Tensor:
    """The real kernel whose correlation spectra are `spectra` (..., *F) over the last `ndim` axes, flattened:
    (..., prod F) in `dtype`."""
    # conj_physical, not a lazy conj view: inside a compiled graph (subquad::lisa_core) the conjugate bit of a view
    # is not honoured by the FFT (torch 2.14.1 excludes the Conjugate dispatch key there).
    return torch.fft.ifftn(spectra.conj_physical(), dim=tuple(range(-ndim, 0))).real.to(dtype).flatten(-ndim)


def dense_blocks(B: int, h: int, N: int, fft_tokens: int, tile_elems: int = 2 ** 21) -> tuple[int, int]:
    """(batch items, heads) per block of the dense kernel path: the most whose S kernel_b and A-hat
    (block * N * max(N, fft_tokens) floats each) fit `tile_elems`, heads first; at least one of each."""
    per_head = N * max(N, fft_tokens)
    h_block = max(1, min(h, tile_elems // per_head))
    b_block = max(1, min(B, tile_elems // (h_block * per_head))) if h_block == h else 1
    return b_block, h_block


def _lisa_spectra(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spectra: tuple[torch.Tensor, torch.Tensor],
                  D: int, grid: Sequence[int], fft_grid: tuple[int, ...],
                  with_v: bool = True) -> tuple[torch.Tensor, ...]:
    """The operands of `lisa_fft`'s tiles: (kf (B, h, dh, 1, *F), vf (B, h, ceil(dh/2), 1, *F) with channel pairs
    packed as re/im (None unless `with_v`), waf (h, dh, P, *F) the kernel_a pattern-pair spectra, wbf (h or 1, 1, D,
    *F), q2 (B, h, dh, 1, 2N) with every token value doubled to meet the interleaved (re, im) layout of Ga)."""
    B, h, N, dh = q.shape
    dims = tuple(range(-len(grid), 0))
    pairs = (D + 1) // 2
    waf = spectra[0].reshape(h, dh, pairs, *fft_grid)  # conj-corr spectra of kernel_a pattern pairs
    wbf = spectra[1][:, None]  # (h or 1, 1, D, *F)
    kf = _fft_of_real(_to_map(k, grid), fft_grid)[:, :, :, None]  # (B, h, dh, 1, *F)
    q2 = q.transpose(-1, -2).repeat_interleave(2, -1)[:, :, :, None]
    if not with_v:
        return kf, None, waf, wbf, q2
    half = (dh + 1) // 2
    vmap = _to_map(v, grid)
    v_hi = vmap[:, :, half:]
    if dh % 2:  # odd head dim: the last pair carries a zero channel
        v_hi = torch.cat([v_hi, v_hi.new_zeros(B, h, 1, *grid)], 2)
    vf = torch.fft.fftn(torch.complex(vmap[:, :, :half], v_hi), s=fft_grid, dim=dims)[:, :, :, None]
    return kf, vf, waf, wbf, q2


def _lisa_tile_fn(B: int, N: int, dh: int, grid: Sequence[int], boundary: str, inference: bool,
                  device: torch.device, structure_only: bool = False) -> Callable[..., torch.Tensor]:
    """`lisa_fft`'s work on one tile of heads and pattern pairs: (kf, vf, waf, wbf, q2, bproj) -> Y (B, hn, dh, N),
    or with `structure_only` the tile's slice of S (B, hn, dc, N) (the kernel path then runs densely).

    With `inference` (no autograd, CPU schedule) the spectral products of every tile and both correlations go
    through one workspace, reused across tiles and calls (`_workspace`), and the contractions run in place on the
    inverse transforms: fresh multi-MiB tensors per tile cost page faults that rival the FFTs on CPU.
    (torch.fft's out= computes into a temporary and copies, so the inverse transforms keep their own outputs.)
    With autograd every intermediate is a new tensor (autograd may save it)."""
    nd = len(grid)
    dims = tuple(range(-nd, 0))
    half = (dh + 1) // 2

    def crop(t: torch.Tensor) -> torch.Tensor:
        """(..., *F) complex -> (..., 2N) real, (re, im) interleaved per token."""
        if boundary == "zero":
            for ax, g in enumerate(grid):
                t = t.narrow(t.dim() - nd + ax, 0, g)
        return torch.view_as_real(t.reshape(*t.shape[:-nd], N).contiguous()).flatten(-2)

    def correlate(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if not inference:
            return crop(torch.fft.ifftn(x * w, dim=dims))
        shape = torch.broadcast_shapes(x.shape, w.shape)
        prod = torch.mul(x, w, out=_workspace("lisa_prod", shape, x.dtype, device))
        return crop(torch.fft.ifftn(prod, dim=dims))

    def weighted_sum(t: torch.Tensor, weight: torch.Tensor, dim: int) -> torch.Tensor:
        return (t.mul_(weight) if inference else t * weight).sum(dim)

    def chunk(kf, vf, waf_c, wbf_c, q2, bproj_c):
        hn, dc = bproj_c.shape[0], bproj_c.shape[2]
        # Ga for pattern pairs e: re = pattern 2e, im = pattern 2e + 1. S chunk: (B, hn, dc, N).
        ga = correlate(kf, waf_c)  # (B, hn, dh, P, 2N)
        s = weighted_sum(ga, q2, 2).unflatten(-1, (N, 2)).transpose(-1, -2).flatten(2, 3)[:, :, :dc]
        if structure_only:
            return s
        # Gb for channel pairs c: re = channel c, im = channel c + half. Kernel path sum_d S_d Gb_d.
        gb = correlate(vf, wbf_c)  # (B, hn, half, dc, 2N)
        y = weighted_sum(gb, s.repeat_interleave(2, -1)[:, :, None], 3)  # (B, hn, half, 2N)
        y = y.unflatten(-1, (N, 2)).movedim(-1, 2).reshape(B, hn, 2 * half, N)[:, :, :dh]
        return y + torch.einsum("bhen,hce->bhcn", s, bproj_c)  # feature path S B^T

    return chunk


def lisa_dft(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel_a: torch.Tensor, kernel_b: torch.Tensor,
             struct_proj: torch.Tensor, grid: Sequence[int], boundary: str = "circular") -> torch.Tensor:
    """Eq. 13 in real arithmetic: the correlations of `lisa_fft` with DFT matrices instead of complex FFTs.

    The form for runtimes without complex tensors (ONNX export; `subquad.backend.real_dft`). Same result as
    `lisa_fft`: Ga = Re IDFT(DFT(k) conj(DFT(kernel_a))), Gb likewise with v and kernel_b, then the contraction of
    Eq. 10 (S = sum_c q Ga; Y = sum_d S_d Gb_d + S B^T). No packing of pairs and no tiles: it is a graph for
    deployment, not the training path.

    Shapes: as `lisa_fft` (kernels in the token domain: K = grid for 'circular', 2*grid-1 for 'zero').
    """
    from .dft import irdft_real, rdft

    _check_boundary(boundary)
    B, h, N, dh = q.shape
    grid = tuple(grid)
    C, D = kernel_a.shape[:2]
    if boundary == "circular":
        fft_grid = grid
    else:
        kernel_a, kernel_b = toeplitz_to_circular(kernel_a, grid), toeplitz_to_circular(kernel_b, grid)
        fft_grid = tuple(2 * g for g in grid)
    war, wai = rdft(kernel_a.reshape(h, dh, D, *kernel_a.shape[2:]), fft_grid)  # (h, dh, D, *F)
    wbr, wbi = rdft(kernel_b[:, None], fft_grid)  # (h or 1, 1, D, *F)
    kr, ki = rdft(_to_map(k, grid)[:, :, :, None], fft_grid)  # (B, h, dh, 1, *F)
    vr, vi = rdft(_to_map(v, grid)[:, :, :, None], fft_grid)
    # x conj(w) = (xr wr + xi wi) + i (xi wr - xr wi): correlation with a real kernel, cropped to the grid.
    ga = irdft_real(kr * war + ki * wai, ki * war - kr * wai, grid).flatten(-len(grid))  # (B, h, dh, D, N)
    gb = irdft_real(vr * wbr + vi * wbi, vi * wbr - vr * wbi, grid).flatten(-len(grid))
    y = _contract(q.transpose(-1, -2), ga, gb, _head_struct_proj(struct_proj, h))  # (B, h, dh, N)
    return y.transpose(-1, -2)


def _local_correlate(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Zero-padded depthwise cross-correlation with channel multiplier.

    Shapes: x (B, C, *grid); weight (C, Dc, *k) -> (B, C, Dc, *grid);
    out[c, e, i] = sum_u weight[c, e, u] x[c, i + u - k//2].
    """
    nd = weight.dim() - 2
    C, Dc = weight.shape[:2]
    conv = F.conv2d if nd == 2 else F.conv3d
    out = conv(x, weight.reshape(C * Dc, 1, *weight.shape[2:]), padding=[s // 2 for s in weight.shape[2:]], groups=C)
    return out.reshape(x.shape[0], C, Dc, *x.shape[2:])


def lisa_local(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel_a: torch.Tensor, kernel_b: torch.Tensor,
               struct_proj: torch.Tensor, grid: Sequence[int], d_chunk: int | None = None) -> torch.Tensor:
    """Local LiSA (Tab. 3(d)): the correlations of Eq. 11 with k x k (k x k x k for video) kernels, zero padding.

    Equals `lisa_toeplitz_ref` with the kernels embedded by `local_to_toeplitz`; computed by grouped convolutions.
    Shapes: q, k, v (B, h, N, dh); kernel_a (C, D, *k); kernel_b (h or 1, D, *k); struct_proj (C, D) -> (B, h, N, dh).
    """
    B, h, N, dh = q.shape
    nd = len(grid)
    if nd not in (2, 3):
        raise ValueError(f"local LiSA needs a 2-D or 3-D grid, got {tuple(grid)}")
    if any(s % 2 == 0 for s in kernel_a.shape[2:]):
        raise ValueError(f"local kernels must have odd sizes, got {tuple(kernel_a.shape[2:])}")
    C, D = kernel_a.shape[:2]
    kmap = _to_map(k, grid).reshape(B, C, *grid)
    vmap = _to_map(v, grid).reshape(B, C, *grid)
    # Per-channel copy of the per-head kernel_b: channel c uses kernel_b[c // dh].
    kb = kernel_b.expand(h, -1, *kernel_b.shape[2:]).repeat_interleave(dh, dim=0)  # (C, D, *k)
    q_cn = q.transpose(-1, -2)
    bproj = _head_struct_proj(struct_proj, h)
    y = None
    for sl in _chunks(D, d_chunk):
        ga = _local_correlate(kmap, kernel_a[:, sl]).reshape(B, h, dh, -1, N)  # (B, h, dh, Dc, N)
        gb = _local_correlate(vmap, kb[:, sl]).reshape(B, h, dh, -1, N)
        part = _contract(q_cn, ga, gb, bproj[..., sl])
        y = part if y is None else y + part
    return y.transpose(-1, -2)


def offsets_range(n: int) -> tuple[int, int]:
    """O_L = [-floor(L/2), ceil(L/2) - 1]: the offsets a circular axis of length L represents."""
    return -(n // 2), (n + 1) // 2 - 1


def _pad_axis(kernel: torch.Tensor, dim: int, new: int) -> torch.Tensor:
    """Axis `dim` of length K0 -> `new`: new[delta mod new] = old[delta mod K0] on the offsets both represent, 0
    elsewhere. One gather over the output positions, so a symbolic `new` (bigger or smaller than K0) needs no
    branch."""
    old = kernel.shape[dim]
    i = torch.arange(new, device=kernel.device)
    delta = torch.where(i <= (new + 1) // 2 - 1, i, i - new)  # the offset output position i represents
    lo, hi = offsets_range(old)
    valid = (delta >= lo) & (delta <= hi)
    # delta mod K0 for the valid offsets (|delta| < K0), without `%` by a size (ONNX's exporter has none).
    src = torch.where(delta < 0, delta + old, delta).clamp(0, old - 1)
    shape = [1] * kernel.dim()
    shape[dim] = -1
    picked = kernel.index_select(dim, src)
    return torch.where(valid.view(shape), picked, picked.new_zeros(()))


def resize_kernel(kernel: torch.Tensor, size: Sequence[int], mode: str = "pad") -> torch.Tensor:
    """Resample circular token-domain kernels (..., *K0) to a new grid (..., *size) (docs/deviations.md).

    'pad' (default): new[delta mod size] = old[delta mod K0] for delta in O_size x O_K0 (intersection), 0 elsewhere:
        centred zero-padding or cropping in token-offset units; local structure is kept exactly; same size = identity.
    'interp': the centred kernel is resampled (bicubic for 2-D, trilinear for 3-D, align_corners=False) and scaled
        by prod(K0) / prod(size) to keep the DC gain; spatial extent then scales with the image.
    """
    size = sizes(size)
    nd = len(size)
    old = tuple(kernel.shape[-nd:])
    if known_equal(old, size):
        return kernel
    if mode == "pad":
        out = kernel
        for ax, s in enumerate(size):
            out = _pad_axis(out, kernel.dim() - nd + ax, s)
        return out
    if mode != "interp":
        raise ValueError(f"kernel_resize must be 'pad' or 'interp', got {mode!r}")
    dims = tuple(range(-nd, 0))
    centred = torch.roll(kernel, [o // 2 for o in old], dims)
    lead = centred.shape[:-nd]
    flat = centred.reshape(1, -1, *old)
    res = F.interpolate(flat, size=size, mode="bicubic" if nd == 2 else "trilinear", align_corners=False)
    res = res.reshape(*lead, *size) * (math.prod(old) / math.prod(size))
    return torch.roll(res, [-(s // 2) for s in size], dims)


def inflate_kernel(kernel: torch.Tensor, frames: int, mode: str = "center") -> torch.Tensor:
    """Inflate 2-D circular kernels (..., H, W) to video kernels (..., T, H, W) (docs/deviations.md).

    'center': the 2-D kernel at temporal offset 0 (index 0 of the circular T axis), zeros elsewhere, so 3-D LiSA
        equals 2-D LiSA applied frame by frame. 'average': replicated over T and divided by T.
    """
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    if mode == "center":
        out = kernel.new_zeros(*kernel.shape[:-2], frames, *kernel.shape[-2:])
        out[..., 0, :, :] = kernel
        return out
    if mode == "average":
        return kernel.unsqueeze(-3).expand(*kernel.shape[:-2], frames, *kernel.shape[-2:]) / frames
    raise ValueError(f"inflate mode must be 'center' or 'average', got {mode!r}")
