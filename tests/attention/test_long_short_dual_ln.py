"""long_short without DualLN (dual_ln=False): the two LayerNorms become the identity, nothing else changes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from subquad import build_attention
from tests._tol import assert_close


@pytest.mark.parametrize("rule,hw,prefix", [("lra", None, 0), ("lra", None, 1), ("vision", (4, 6), 0),
                                            ("vision", (4, 6), 1)])
def test_no_dual_ln_equals_dual_ln_with_identity_norms(rule, hw, prefix):
    kw = dict(window_size=2, rank=3, global_token_rule=rule, num_prefix_tokens=prefix, dims=2 if hw else 1)
    torch.manual_seed(0)
    on = build_attention("long_short", 16, 2, **kw).double()
    off = build_attention("long_short", 16, 2, dual_ln=False, **kw).double()
    ln = ("dual_ln_full", "dual_ln_dp")
    assert not any(k.startswith(ln) for k in off.state_dict())
    off.load_state_dict({k: v for k, v in on.state_dict().items() if not k.startswith(ln)}, strict=True)
    for name in ln:
        setattr(on, name, nn.Identity())
    x = torch.randn(2, prefix + (hw[0] * hw[1] if hw else 19), 16, dtype=torch.float64)
    assert_close(off(x, hw), on(x, hw), name="no-DualLN output")
    # fast paths and the dense reference agree without DualLN too
    assert_close(off(x, hw), off.forward_ref(x, hw), name="no-DualLN fast vs reference")


def test_dual_ln_changes_the_output():
    torch.manual_seed(0)
    on = build_attention("long_short", 16, 2, window_size=2, rank=3, global_token_rule="lra")
    off = build_attention("long_short", 16, 2, window_size=2, rank=3, global_token_rule="lra", dual_ln=False)
    off.load_state_dict({k: v for k, v in on.state_dict().items() if "dual_ln" not in k})
    x = torch.randn(2, 12, 16)
    assert not torch.allclose(on(x), off(x))
