"""fp16 autocast at long sequences and large activations: the FLatten-Transformer overflow reports (issues #15, #18,
#32: the kv product and the normaliser of linear attention overflow fp16). Linear-attention cores accumulate in
fp32 under autocast (`fp32_island`); the outputs stay finite and within fp16 tolerance of the fp32 result."""

from __future__ import annotations

import pytest
import torch

from subquad.attention import build_attention
from tests._tol import TOL, rel_rms

HW = (128, 128)  # N = 16,384 tokens
MECHS = ["focused_linear", "enhanced_linear", "linear_relu", "linear_elu1", "linear_leaky_relu", "linear_cosformer",
         "linear_softmax", "linear_l1"]


@pytest.mark.parametrize("name", MECHS)
def test_fp16_autocast_long_sequence_stays_finite_and_close(name):
    torch.manual_seed(0)
    m = build_attention(name, 64, 2, input_size=HW).eval()
    # Activations of a late, un-normalised stage: |x| up to ~100, so q.k sums over 16k tokens pass fp16's 65504.
    x = torch.randn(1, HW[0] * HW[1], 64) * 30.0
    with torch.no_grad():
        ref = m(x, HW)
        with torch.autocast("cpu", dtype=torch.float16):
            out = m(x, HW)
    assert out.dtype == torch.float16
    assert torch.isfinite(out).all(), f"{name}: fp16 autocast output has NaN/Inf"
    tol, floor = TOL[torch.float16]
    err = rel_rms(out, ref, floor)
    # 4x the fp16 row: the qkv and proj GEMMs themselves run in fp16 under autocast (their rounding, not the core's).
    assert err <= 4 * tol, f"{name}: relative RMS error {err:.2e} against fp32"
