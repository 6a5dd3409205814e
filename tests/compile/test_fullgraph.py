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
    zero = _exactly_zero_grads(m, x, HW)
    scale = torch.cat([g.flatten() for g in grads_e.values()]).pow(2).mean().sqrt()
    for n, g in grads_e.items():
        gc = m.get_parameter(n).grad
        if n in zero:
            # Zero in exact arithmetic: eager and compiled both hold rounding noise, which need not agree; both must
            # be noise-sized against the other gradients (the fp32 row of the tolerance table).
            for label, t in (("eager", g), ("compiled", gc)):
                rel = float(t.pow(2).mean().sqrt() / scale)
                assert rel <= 1e-5, f"{name} grad {n} ({label}) should be ~0, relative RMS {rel:.1e}"
            continue
        assert_close(gc, g, torch.float32, f"{name} grad {n}")


def _exactly_zero_grads(m: torch.nn.Module, x: torch.Tensor, hw) -> set[str]:
    """Parameters whose gradient is zero in exact arithmetic, found in float64 (relative RMS < 1e-12 against all
    gradients). E.g. Transformer-LS's `to_dynamic_projection.bias`: it adds the same value to one (head, rank) row of
    logits at every token, and the dynamic projection is a softmax over the tokens (arXiv 2107.02192 Eq. 3), which
    a shift of a whole row leaves unchanged."""
    import copy

    m64 = copy.deepcopy(m).double()
    m64.zero_grad(set_to_none=True)
    m64(x.double(), hw).square().mean().backward()
    grads = {n: p.grad for n, p in m64.named_parameters() if p.grad is not None}
    scale = torch.cat([g.flatten() for g in grads.values()]).pow(2).mean().sqrt()
    return {n for n, g in grads.items() if float(g.pow(2).mean().sqrt() / scale) < 1e-12}


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


def test_only_the_dynamic_projection_bias_has_an_exactly_zero_gradient():
    """The exemption in `_mechanism_case` covers what exact arithmetic says and nothing more: among every mechanism's
    parameters only Transformer-LS's `to_dynamic_projection.bias` has a zero gradient (a shift of the logits along
    the softmax's own axis), and shifting it leaves the output unchanged."""
    found = {}
    for name in NAMES:
        torch.manual_seed(0)
        m = subquad.build_attention(name, DIM, HEADS, input_size=HW).train()
        zero = _exactly_zero_grads(m, torch.randn(2, HW[0] * HW[1], DIM), HW)
        if zero:
            found[name] = zero
    assert found == {"long_short": {"to_dynamic_projection.bias"}}, found
    torch.manual_seed(0)
    m = subquad.build_attention("long_short", DIM, HEADS, input_size=HW).eval().double()
    x = torch.randn(2, HW[0] * HW[1], DIM, dtype=torch.float64)
    with torch.no_grad():
        y0 = m(x, HW)
        m.to_dynamic_projection.bias.add_(torch.randn_like(m.to_dynamic_projection.bias))
        y1 = m(x, HW)
    assert_close(y1, y0, torch.float64, "long_short output after shifting the projection bias")
