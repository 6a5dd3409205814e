"""The check the three 1-D forms with a grid counterpart share (focused_linear, global_filter, structure_aware)."""

from __future__ import annotations

import pytest
import torch

from subquad.errors import UserError


def assert_refuses_grid_hw(m: torch.nn.Module, x: torch.Tensor) -> None:
    """`m`, built without input_size (the 1-D form), runs with hw=None and hw=(L,) alike, and refuses a grid hw in
    one line naming input_size, in its forward, forward_ref and attention_matrix (it used to ignore the grid)."""
    assert torch.equal(m(x), m(x, (x.shape[1],)))
    for call in (m, m.forward_ref, m.attention_matrix):
        for hw in ((9, 13), (13, 9), (1, x.shape[1]), (2, 3, 4)):
            with pytest.raises(UserError, match=r"built without input_size.*1-D.*input_size=\(H, W\)") as e:
                call(x, hw)
            assert "\n" not in str(e.value)
