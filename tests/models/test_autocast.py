"""Mixed precision: a bf16 and an fp16 autocast training step of every `*_micro` model gives a finite loss and
finite gradients, and the output dtype under autocast does not depend on the input size."""

from __future__ import annotations

import pytest
import timm
import torch

import subquad  # noqa: F401  (registers the models)
from tests.models.test_contract import MICRO


def _input(m, scale: int = 1) -> torch.Tensor:
    _, h, w = m.pretrained_cfg["input_size"]
    if getattr(m, "input_ndim", 4) == 5:
        return torch.randn(2, 3, 2, h * scale, w * scale)
    return torch.randn(2, 3, h * scale, w * scale)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", MICRO)
def test_autocast_train_step_is_finite(name, dtype):
    torch.manual_seed(0)
    m = timm.create_model(name, num_classes=5).train()
    x, y = _input(m), torch.tensor([1, 3])
    with torch.autocast("cpu", dtype=dtype):
        logits = m(x)
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
    assert logits.dtype == dtype
    loss.backward()
    assert torch.isfinite(loss), f"{name}: loss {loss.item()} under {dtype} autocast"
    bad = [n for n, p in m.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"{name}: non-finite gradients under {dtype} autocast: {bad[:5]}"
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())


@pytest.mark.parametrize("name", MICRO)
def test_autocast_output_dtype_same_at_every_size(name):
    m = timm.create_model(name, num_classes=5).eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        dtypes = {m(_input(m, s)).dtype for s in (1, 2)}
    assert dtypes == {torch.bfloat16}
