"""Checks of timm 1.0.31's model tests that run on the meta device: a low-precision meta forward, and a new head
that follows the model's train/eval mode."""

from __future__ import annotations

import pytest
import timm
import torch

import subquad

MICRO = sorted(n for n in subquad.list_models() if n.endswith("_micro") and "video" not in n)


@pytest.mark.parametrize("name", MICRO)
def test_meta_low_precision_forward_and_head_mode(name):
    m = timm.create_model(name, device="meta").to(torch.bfloat16).eval()
    size = m.pretrained_cfg["input_size"]
    with torch.no_grad():
        y = m(torch.empty(1, *size, device="meta", dtype=torch.bfloat16))
    assert y.device.type == "meta" and y.shape[0] == 1
    m.reset_classifier(0)
    m.reset_classifier(3)
    assert not m.get_classifier().training
    assert next(m.get_classifier().parameters()).dtype == torch.bfloat16
    m.train()
    m.reset_classifier(2)
    assert m.get_classifier().training
