"""InLine attention (`"inline"`): injective linear attention plus the local residual whose 3 x 3 depthwise kernel is
predicted per sample from the token mean. `InLineAttention` owns the fused `qkv` projection (the PVT checkpoints'
`q` + `kv` are concatenated into it by `remap_q_kv`), the kernel predictor `residual` and `proj`; `InLineCore` is the
"host_qkv" form (CSwin blocks project q, k, v themselves) with `residual` and CSwin's LePE `get_v`."""

from __future__ import annotations

import torch
from timm.layers import trunc_normal_
from torch import nn

from .._shapes import check_heads
from ..errors import UserError
from ..layers.precision import fp32_island
from .base import AttentionCaps, TokenMixer
from .functional.inline import KERNELS, LOCAL_K, inline_attention_kv, inline_attention_matrix, inline_attention_ref
from .functional.linear import depthwise_conv_matrix
from .registry import register_attention, register_attention_form

__all__ = ["InLineAttention", "InLineCore"]



def _check_options(who: str, kernel_func: str, num_prefix_tokens: int) -> None:
    """The options both InLine forms share: one line naming a bad value and what is allowed."""
    if kernel_func not in KERNELS:
        raise UserError(f"{who}: kernel_func={kernel_func!r} is not one of {KERNELS}")
    if int(num_prefix_tokens) != num_prefix_tokens or num_prefix_tokens < 0:
        raise UserError(f"{who}: num_prefix_tokens={num_prefix_tokens!r} must be an int >= 0")

@register_attention("inline")
class InLineAttention(TokenMixer):
    """InLine attention: out = InL_phi(Q, K) V + DWC_b(V) (before `proj`), over all N tokens of x.

    InL_phi is the injective linear attention, A_ij = s / N phi(q_i).phi(k_j) - s / N^2 sum_m phi(q_i).phi(k_m)
    + 1 / N (every row sums to 1), computed as phi(Q) (s / N phi(K)^T V) + (1 - s phi(Q) mean(phi(K))) mean(V).
    DWC_b is a depthwise 3 x 3 conv (zero padding, no bias) of the value map whose kernel (C, 3, 3) the branch
    `residual` (grouped 1x1 Conv1d -> GELU -> grouped 1x1 Conv1d to 9 C, groups = h) predicts from the mean of the
    sample's tokens (all N, class token included, as the official DeiT code).

    Shapes: x (B, N, C) with hw=(H, W), N = num_prefix_tokens + H * W -> (B, N, C).
    Paper: Bridging the Divide: Reconsidering Softmax and Linear Attention (arXiv 2412.06590), Sec. 4.1 Eq. 5 and
        Sec. 4.2 (local attention residual).
    Official: LeapLabTHU/InLine `models/inline_{deit,pvt,swin,cswin}.py` `InLineAttention`.
        Official code: the scale s / N folded into the kernel product (their comment); x.mean over every token;
        residual on the grid tokens only in DeiT (`x[:, 1:]`). subquad: the same, for any (H, W) grid (the
        official code takes H = W = sqrt(N)), and a float32 core under autocast (docs/deviations.md).
    Symbols: phi = kernel_func (paper phi), s = d^-0.5, N tokens, h heads, d = C / h.
    No 1-D (sequence) form: the local residual is a 3 x 3 kernel on the token grid, so hw is required.

    Args:
        dim: channels C.
        num_heads: h.
        input_size: (H, W) grid at construction (accepted for interface uniformity: no size-bound parameters).
        qkv_bias: bias on `qkv`.
        kernel_func: phi: 'identity' (every released model), 'relu', 'leakyrelu' or 'exp' (exp(0.2 x)).
        local_residual: build `residual` and add the local term (False: the injective linear attention alone, the
            paper's ablation without local residual, Sec. 5.3).
        num_prefix_tokens: P leading class tokens: they attend and are attended to, get no local term, and enter the
            token mean.
        proj_drop: dropout after `proj`.
        fused: K^T V fast path (True) or the dense reference (False); both compute the same function.
    """

    caps = AttentionCaps(bidirectional=True, causal=False, needs_hw=True, supports_mask=False, complexity="O(N)",
                         sequence=False, notes="InLine; the local residual needs the grid (no 1-D form)")
    name = "inline"

    @classmethod
    def stage_kwargs(cls, stage: dict) -> dict:
        """The generic options, plus CSwin's `lepe` hint for the "host_qkv" form (`InLineCore`), the one form a
        host that hints `lepe` (CSwin blocks, which project q, k, v themselves) builds."""
        kw = super().stage_kwargs(stage)
        if stage.get("hints", {}).get("lepe"):
            kw["lepe"] = True
        return kw

    def __init__(self, dim: int, num_heads: int = 8, input_size: tuple[int, int] | int | None = None,
                 qkv_bias: bool = True, kernel_func: str = "identity", local_residual: bool = True,
                 num_prefix_tokens: int = 0, proj_drop: float = 0.0, fused: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        who = "inline attention"
        self.dim, self.num_heads = dim, num_heads
        self.head_dim = check_heads(dim, num_heads, who)
        _check_options(who, kernel_func, num_prefix_tokens)
        self.kernel_func = kernel_func
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.fused = fused
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.residual = nn.Sequential(
            nn.Conv1d(dim, dim, 1, groups=num_heads, **dd),
            nn.GELU(),
            nn.Conv1d(dim, dim * LOCAL_K * LOCAL_K, 1, groups=num_heads, **dd),
        ) if local_residual else None
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        if not self.qkv.weight.is_meta:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Official init: Linear trunc_normal(0.02) with zero bias; the `residual` convs keep PyTorch's default."""
        for m in (self.qkv, self.proj):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def local_kernels(self, x: torch.Tensor) -> torch.Tensor | None:
        """(B, N, C) -> the per-sample depthwise kernels (B, C, 3, 3) predicted from the token mean (None without
        the local residual). Output channel 9 c + t of `residual` is tap t (row-major) of channel c."""
        if self.residual is None:
            return None
        B, _, C = x.shape
        return self.residual(x.mean(dim=1).unsqueeze(-1)).reshape(B, C, LOCAL_K, LOCAL_K)

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        return self._forward(x, hw, mask, self.fused)

    def forward_ref(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
        """Dense reference of `forward` (explicit N x N map and local-conv matrices)."""
        return self._forward(x, hw, mask, False)

    def _forward(self, x: torch.Tensor, hw, mask, fused: bool) -> torch.Tensor:
        hw = self._check_input(x, hw, mask)
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, C).unbind(2)
        w = self.local_kernels(x)
        fn = inline_attention_kv if fused else inline_attention_ref
        o = fp32_island(fn, q, k, v, w, hw=tuple(hw), num_heads=self.num_heads, kernel=self.kernel_func,
                        prefix=self.num_prefix_tokens)
        return self.proj_drop(self.proj(o))

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor, hw: tuple[int, int] | None = None,
                         channel: int | None = None) -> torch.Tensor:
        """(B, N, C) -> (B, h, N, N) equivalent map, before `proj`: out_head[:, c] = M @ v_head[:, c].

        The injective part is shared by a head's channels; the local residual is per channel, so the map is exact
        for head channel `channel` (kernel of channel head * d + channel), and with channel=None it adds the mean
        of the head's d local-conv matrices. Prefix rows and columns of the local part are 0.
        """
        hw = self._check_input(x, hw)
        B, N, C = x.shape
        q, k, _ = self.qkv(x).reshape(B, N, 3, C).unbind(2)
        a = inline_attention_matrix(q, k, num_heads=self.num_heads, kernel=self.kernel_func)
        w = self.local_kernels(x)
        if w is None:
            return a
        h, d, P = self.num_heads, self.head_dim, self.num_prefix_tokens
        w = w.reshape(B, h, d, LOCAL_K, LOCAL_K)
        w = w.mean(2) if channel is None else w[:, :, int(channel)]  # (B, h, 3, 3)
        m = depthwise_conv_matrix(w.reshape(B * h, 1, LOCAL_K, LOCAL_K).to(a.dtype), tuple(hw))
        a = a.clone()
        a[:, :, P:, P:] += m.reshape(B, h, *m.shape[-2:])
        return a

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, kernel_func={self.kernel_func}, "
                f"local_residual={self.residual is not None}, prefix={self.num_prefix_tokens}")


@register_attention_form("inline", "host_qkv")
class InLineCore(TokenMixer):
    """InLine attention on q, k, v that the host projects (`forward_qkv`): the form of InLine-CSwin's 'I' blocks,
    one global branch with every head, whose block owns `qkv` and `proj`. It owns the kernel predictor `residual` and,
    with `lepe=True`, CSwin's LePE `get_v` (depthwise 3 x 3 with bias on the value map, added to the output).

    Shapes: `forward_qkv(q, k, v, hw, x)`: q, k, v (B, N, C), N = H * W, x (B, N', C) whose token mean predicts the
    local kernels -> (B, N, C), no output projection.
    Paper: arXiv 2412.06590, Sec. 4.1 Eq. 5 and Sec. 4.2.
    Official: LeapLabTHU/InLine `models/inline_cswin.py` `InLineAttention` (with `CSWinBlock.forward`, which passes
        the mean of the block input before `norm1`; `InLineCSWin` does the same by `reads_block_input`).
    Symbols: as `InLineAttention`.

    Args:
        dim, num_heads, input_size, kernel_func, local_residual, num_prefix_tokens, fused: as `InLineAttention`.
        lepe: build `get_v` and add LePE(V) on the grid tokens.
    """

    caps = InLineAttention.caps
    name = "inline"
    #: The host passes the block input before its norm as `x` (the official InLine-CSwin token mean).
    reads_block_input = True

    def __init__(self, dim: int, num_heads: int = 8, input_size: tuple[int, int] | int | None = None,
                 kernel_func: str = "identity", local_residual: bool = True, lepe: bool = False,
                 num_prefix_tokens: int = 0, fused: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        who = "inline attention (host_qkv)"
        self.dim, self.num_heads = dim, num_heads
        self.head_dim = check_heads(dim, num_heads, who)
        _check_options(who, kernel_func, num_prefix_tokens)
        self.kernel_func, self.fused = kernel_func, fused
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.get_v = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, **dd) if lepe else None
        self.residual = nn.Sequential(
            nn.Conv1d(dim, dim, 1, groups=num_heads, **dd),
            nn.GELU(),
            nn.Conv1d(dim, dim * LOCAL_K * LOCAL_K, 1, groups=num_heads, **dd),
        ) if local_residual else None

    local_kernels = InLineAttention.local_kernels

    def forward(self, x: torch.Tensor, hw=None, mask=None) -> torch.Tensor:
        raise ValueError("inline attention built with host_qkv=True has no projections; call "
                         "forward_qkv(q, k, v, hw, x)")

    def forward_qkv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw: tuple[int, int],
                    x: torch.Tensor | None = None, fused: bool | None = None) -> torch.Tensor:
        """(B, N, C) q, k, v on the grid hw -> (B, N, C); x: the tokens whose mean predicts the local kernels
        (required with the local residual)."""
        hw = self._check_input(q, hw)
        if k.shape != q.shape or v.shape != q.shape:
            raise ValueError(f"inline forward_qkv: q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} "
                             "must have the same shape")
        if self.residual is not None and (x is None or x.shape[0] != q.shape[0] or x.shape[-1] != q.shape[-1]):
            raise ValueError("inline forward_qkv: x (B, N', C), whose token mean predicts the local kernels, is needed")
        fused = self.fused if fused is None else fused
        w = self.local_kernels(x)
        fn = inline_attention_kv if fused else inline_attention_ref
        P = self.num_prefix_tokens
        o = fp32_island(fn, q, k, v, w, hw=tuple(hw), num_heads=self.num_heads, kernel=self.kernel_func, prefix=P)
        if self.get_v is None:
            return o
        B, N, C = v.shape
        vg = v[:, P:]  # (B, H*W, C)
        if fused:
            lepe = self.get_v(vg.transpose(1, 2).reshape(B, C, *hw)).flatten(2).transpose(1, 2)
        else:
            m = depthwise_conv_matrix(self.get_v.weight, tuple(hw))  # (C, N_g, N_g)
            lepe = torch.einsum("cij,bjc->bic", m.to(v.dtype), vg) + self.get_v.bias
        return torch.cat([o[:, :P], o[:, P:] + lepe.to(o.dtype)], dim=1) if P else o + lepe.to(o.dtype)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, kernel_func={self.kernel_func}, "
                f"local_residual={self.residual is not None}, lepe={self.get_v is not None}")
