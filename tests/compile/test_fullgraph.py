"""`torch.compile(fullgraph=True)`: every mechanism's forward and backward, and every model's forward, are captured
as one graph (no graph break) and agree with eager.

The default suite captures through AOTAutograd without code generation (`backend="aot_eager"`: Dynamo and the joint
forward/backward graph, seconds per case); `slow` compiles with Inductor, the default backend.
"""

from __future__ import annotations

import pytest
import timm
import torch

import subquad
from tests._tol import assert_close

NAMES = subquad.list_attention()
DIM, HEADS, HW = 32, 2, (5, 7)


def _mechanism_case(name: str, backend: str) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = subquad.build_attention(name, DIM, HEADS, input_size=HW).train()
    x = torch.randn(2, HW[0] * HW[1], DIM)
    xe, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ye = m(xe, HW)
    ye.square().mean().backward()
    grads_e = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad(set_to_none=True)
    fn = torch.compile(lambda t: m(t, HW), backend=backend, fullgraph=True)
    yc = fn(xc)
    yc.square().mean().backward()
    assert_close(yc, ye, torch.float32, f"{name} output")
    assert_close(xc.grad, xe.grad, torch.float32, f"{name} input grad")
    for n, g in grads_e.items():
        assert_close(m.get_parameter(n).grad, g, torch.float32, f"{name} grad {n}")


@pytest.mark.parametrize("name", NAMES)
def test_mechanism_forward_backward_one_graph(name):
    _mechanism_case(name, "aot_eager")


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_mechanism_forward_backward_inductor(name):
    _mechanism_case(name, "inductor")


MICRO = sorted(n for n in timm.list_models("*_micro") if timm.get_pretrained_cfg(n) is not None
               and n in subquad.list_models())


def _model_case(name: str, backend: str) -> None:
    torch._dynamo.reset()
    m = timm.create_model(name).eval()
    cfg = m.pretrained_cfg
    x = torch.randn(1, *cfg["input_size"])  # (C, H, W), or (C, T, H, W) for video
    with torch.no_grad():
        ref = m(x)
        got = torch.compile(m, backend=backend, fullgraph=True)(x)
    assert_close(got, ref, torch.float32, f"{name} logits", factor=10.0)  # a whole network: 10 x the op tolerance


@pytest.mark.slow
@pytest.mark.parametrize("name", MICRO)
def test_model_forward_one_graph_inductor(name):
    _model_case(name, "inductor")


def test_one_model_forward_one_graph():
    _model_case("l2vit_micro", "aot_eager")
