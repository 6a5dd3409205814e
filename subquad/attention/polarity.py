"""PolaFormer polarity-aware linear attention (`"polarity"`): `PolarityLinearAttention` (fused q/k/v/gate
projection `qkvg`, the polarity core, a shared 5 x 5 DWC, the gate and `proj`).

One set of parameter names (the Pola-Swin checkpoints'): the Pola-PVT checkpoints' `qg` + `kv` are concatenated
into `qkvg` by `remap_qg_kv`.
"""

from __future__ import annotations

import torch
from timm.layers import trunc_normal_
from torch import nn

from .._shapes import as_hw, check_heads
from ..errors import UserError
from ..layers.precision import fp32_island
from .base import AttentionCaps, TokenMixer
from .focused_linear import ResizedPECache
from .functional.polarity import (
    polarity_attention_maps,
    polarity_linear_attention_kv,
    polarity_linear_attention_ref,
)
from .registry import register_attention

__all__ = ["PolarityLinearAttention", "remap_qg_kv"]


@register_attention("polarity")
class PolarityLinearAttention(ResizedPECache, TokenMixer):
    """PolaFormer polarity-aware linear attention with its projections.

    Shapes: x (B, N, C) with hw=(H, W), N = H * W -> (B, N, C). `qkvg` projects x to q, k, v and the gate g (rows
    [0:C], [C:2C], [2C:3C], [3C:4C]); the learned key positional encoding is added to k; see
    `functional/polarity.py` for the operator.
    Paper: PolaFormer (arXiv 2501.15061), Sec. 4.1 Eq. 6-9, Sec. 4.2 (learnable power), Fig. 3 (DWC, gate).
    Official: ZacharyMeng/PolaFormer `models/pola_swin.py` / `models/pola_pvt.py` `PolaLinearAttention`.
        Official code: `positional_encoding` has exactly the construction token count (a window of Pola-Swin, the
        stage grid of Pola-PVT) and the DWC takes H = W = sqrt(N) / subquad: the PE is resized bicubically to the
        run-time grid and hw is explicit, so any grid, square or not, runs (docs/deviations.md); a float32 core
        under autocast (docs/deviations.md, "Every backbone"). The official PVT form's key/value spatial reduction
        (`la_sr_ratio` > 1) is not built: every released model uses 1.
    Symbols: h heads, d = C / h, alpha power range (exponent 1 + alpha * sigmoid(power)), k = kernel_size.

    Args:
        dim: channels C.
        num_heads: heads h.
        input_size: (H, W) grid at construction; sizes `positional_encoding`.
        alpha: power range (official 4).
        kernel_size: DWC kernel k (odd); 0 builds no DWC.
        qkv_bias: bias on `qkvg`.
        proj_drop: dropout after `proj`.
        fused: K^T V fast path (True) or the dense reference (False); both compute the same function.
    """

    caps = AttentionCaps(bidirectional=True, causal=False, needs_hw=True, supports_mask=False, complexity="O(N)",
                         sequence=False, notes="PolaFormer; no 1-D form: the DWC and the key PE need the grid; "
                                               "PE resized bicubically at other grids")

    @classmethod
    def stage_kwargs(cls, stage: dict) -> dict:
        """Refuses the official PVT key/value reduction (`la_sr_ratio` > 1; 1 in every released model)."""
        if stage.get("la_sr_ratio", 1) != 1:
            raise UserError(f"attention 'polarity' has no key/value spatial reduction: la_sr_ratio="
                            f"{stage['la_sr_ratio']} is not allowed; use 1 (every released Pola-PVT)")
        return super().stage_kwargs(stage)

    def __init__(self, dim: int, num_heads: int = 8, input_size: tuple[int, int] | int | None = None,
                 alpha: float = 4.0, kernel_size: int = 5, qkv_bias: bool = True, proj_drop: float = 0.0,
                 fused: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        who = "polarity attention"
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = d = check_heads(dim, num_heads, who)
        if input_size is None:
            raise UserError(f"{who} needs input_size=(H, W) to size positional_encoding")
        self.input_size = as_hw(input_size, "input_size")
        if not isinstance(kernel_size, int) or isinstance(kernel_size, bool) or kernel_size < 0 or \
                (kernel_size and kernel_size % 2 == 0):
            raise UserError(f"{who}: kernel_size={kernel_size!r} must be a positive odd int, or 0 for no DWC")
        if not alpha > 0:
            raise UserError(f"{who}: alpha={alpha!r} must be > 0 (the power is 1 + alpha * sigmoid(power))")
        self.alpha = float(alpha)
        self.fused = fused
        # Construction order = the official module's (qkvg, proj, dwc, power, scale, positional_encoding).
        self.qkvg = nn.Linear(dim, 4 * dim, bias=qkv_bias, **dd)
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self.dwc = nn.Conv2d(d, d, kernel_size, padding=kernel_size // 2, groups=d, **dd) if kernel_size else None
        self.power = nn.Parameter(torch.empty(1, num_heads, 1, d, **dd))
        self.scale = nn.Parameter(torch.empty(1, 1, dim, **dd))
        self.pe_hw = self.input_size
        self.positional_encoding = nn.Parameter(torch.empty(1, self.pe_hw[0] * self.pe_hw[1], dim, **dd))
        self._pe_cache = None  # eval-only cache of the resized PE (`ResizedPECache`)
        if not self.scale.is_meta:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Official init: zero `power`, `scale` and `positional_encoding`; Linear trunc_normal(0.02) with zero bias
        (the hosts' `_init_weights`); `dwc` keeps PyTorch's default."""
        for p in (self.power, self.scale, self.positional_encoding):
            nn.init.zeros_(p)
        for m in (self.qkvg, self.proj):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def _forward(self, x: torch.Tensor, hw, mask, fused: bool) -> torch.Tensor:
        hw = self._check_input(x, hw, mask)
        B, N, C = x.shape
        q, k, v, g = self.qkvg(x).reshape(B, N, 4, C).unbind(2)
        k = k + self._resized_pe(tuple(hw))
        fn = polarity_linear_attention_kv if fused else polarity_linear_attention_ref
        dw = None if self.dwc is None else self.dwc.weight
        db = None if self.dwc is None else self.dwc.bias
        o = fp32_island(fn, q, k, v, g, self.scale, self.power, dw, db, hw=tuple(hw), num_heads=self.num_heads,
                        alpha=self.alpha)
        return self.proj_drop(self.proj(o))

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        return self._forward(x, hw, mask, self.fused)

    def forward_ref(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
        """Dense reference of `forward` (explicit kernel and DWC matrices)."""
        return self._forward(x, hw, mask, False)

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw: tuple[int, int] | None = None) -> torch.Tensor:
        """(B, N, C) -> (B, h, N, N): the mean of the same-sign map (which mixes the first half of each head's value
        channels) and the opposite-sign map (the second half), before the DWC and the gate."""
        hw = self._check_input(x, hw)
        B, N, C = x.shape
        q, k, _, _ = self.qkvg(x).reshape(B, N, 4, C).unbind(2)
        k = k + self._resized_pe(tuple(hw))
        a_sim, a_opp = polarity_attention_maps(q.float(), k.float(), self.scale.float(), self.power.float(),
                                               num_heads=self.num_heads, alpha=self.alpha)
        return (a_sim + a_opp) / 2

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, alpha={self.alpha}, pe_grid={self.pe_hw}"


def remap_qg_kv(state_dict: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Pola-PVT keys -> ours for every `PolarityLinearAttention` in `model`: `qg` ([q; g]) and `kv` ([k; v]) ->
    `qkvg` = [q; k; v; g] (weights and biases). Other keys, and modules already in our layout, pass unchanged."""
    sd = dict(state_dict)
    for name, m in model.named_modules():
        if not isinstance(m, PolarityLinearAttention):
            continue
        pre = f"{name}." if name else ""
        for t in ("weight", "bias"):
            qg, kv = sd.pop(f"{pre}qg.{t}", None), sd.pop(f"{pre}kv.{t}", None)
            if qg is None and kv is None:
                continue
            if qg is None or kv is None:
                raise UserError(f"Pola-PVT checkpoint: {pre}qg.{t} and {pre}kv.{t} must both be present")
            C = qg.shape[0] // 2
            sd[f"{pre}qkvg.{t}"] = torch.cat([qg[:C], kv, qg[C:]], dim=0)
    return sd
