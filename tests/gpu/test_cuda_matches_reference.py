"""CUDA paths against the float64 reference on the CPU (marker `gpu`: `pytest -m gpu` on a machine with CUDA; the
default and the full suites deselect it, and without CUDA these tests fail with one line instead of skipping).

Every registered mechanism, in its bidirectional form on an odd, non-square grid and in its causal form where it has
one: the module in float32 on CUDA (TF32 off, so fp32 means fp32) against the same module in float64 on the CPU, on
the output, the input's gradient and every parameter's gradient, under the float32 row of tests/_tol.py. This is
where the CUDA schedule (`subquad.backend.schedule`: the plain batched paths) meets the CPU's chunked ones.
Then every `*_micro` model: logits and every gradient at a non-square size in eval mode (the same comparison),
and a bf16 autocast forward on CUDA, finite and within the bfloat16 row against fp32.
"""

from __future__ import annotations

import copy
import os

import pytest
import timm
import torch

import subquad
from subquad.attention import get_attention_cls
from tests._tol import assert_close

pytestmark = pytest.mark.gpu

DIM, HEADS, HW, SEQ = 32, 2, (5, 7), 37
# SUBQUAD_TEST_DEVICE=cpu runs the same comparisons on the CPU: a check of these tests themselves, not of CUDA.
DEVICE = os.environ.get("SUBQUAD_TEST_DEVICE", "cuda")


@pytest.fixture(autouse=True)
def _cuda():
    if DEVICE == "cuda" and not torch.cuda.is_available():
        pytest.fail("the gpu tests need a CUDA device (run them with `pytest -m gpu` on a machine with one)",
                    pytrace=False)
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def _compare(m: torch.nn.Module, x: torch.Tensor, call, factor: float = 1.0) -> None:
    """m (any dtype, CPU) in float64 on the CPU vs float32 on CUDA: output, input gradient, parameter gradients.

    A parameter whose float64 gradient is zero in exact arithmetic (relative RMS < 1e-12 against all gradients: a
    bias right before a normalization, or Transformer-LS's `to_dynamic_projection.bias`, a shift along its softmax's
    own axis; see tests/compile/test_fullgraph.py) holds rounding noise in float32, which has no reference to match:
    it must be noise-sized against the other gradients instead (the float32 row's 1e-5, times `factor`)."""
    ref = copy.deepcopy(m).double()
    fast = copy.deepcopy(m).float().to(DEVICE)
    x64 = x.double().requires_grad_(True)
    x32 = x.float().to(DEVICE).requires_grad_(True)
    y64 = call(ref, x64)
    y32 = call(fast, x32)
    assert y32.device.type == DEVICE and y32.dtype == torch.float32
    cot = torch.randn(y64.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y64.backward(cot)
    y32.backward(cot.float().to(DEVICE))
    assert_close(y32.cpu(), y64, torch.float32, "output", factor)
    assert_close(x32.grad.cpu(), x64.grad, torch.float32, "input gradient", factor)
    grads = [p.grad.flatten() for p in ref.parameters() if p.grad is not None]
    scale = torch.cat(grads).pow(2).mean().sqrt() if grads else None
    for (name, p64), (_, p32) in zip(ref.named_parameters(), fast.named_parameters()):
        if p64.grad is None:
            assert p32.grad is None, f"{name}: a gradient on {DEVICE} and none on the CPU"
            continue
        assert p32.grad is not None, f"{name}: no gradient on {DEVICE}"
        if float(p64.grad.pow(2).mean().sqrt() / scale) < 1e-12:
            rel = float(p32.grad.double().cpu().pow(2).mean().sqrt() / scale)
            assert rel <= 1e-5 * factor, f"grad of {name} is 0 in exact arithmetic; on {DEVICE} relative RMS {rel:.1e}"
            continue
        assert_close(p32.grad.cpu(), p64.grad, torch.float32, f"grad of {name}", factor)


@pytest.mark.parametrize("name", subquad.list_attention())
def test_mechanism_on_cuda_matches_float64_on_cpu(name):
    torch.manual_seed(0)
    m = subquad.build_attention(name, DIM, HEADS, input_size=HW).train()
    x = torch.randn(2, HW[0] * HW[1], DIM)
    _compare(m, x, lambda mod, t: mod(t, HW))


CAUSAL = [n for n in subquad.list_attention() if get_attention_cls(n).caps.causal]


@pytest.mark.parametrize("name", CAUSAL)
def test_causal_form_on_cuda_matches_float64_on_cpu(name):
    torch.manual_seed(0)
    m = subquad.build_attention(name, DIM, HEADS, causal=True).train()
    x = torch.randn(2, SEQ, DIM)
    _compare(m, x, lambda mod, t: mod(t, None))


MICRO = subquad.list_models("*_micro")


def _non_square(name: str) -> tuple[int, int]:
    cfg = timm.models.get_pretrained_cfg(name)
    _, h, w = cfg.input_size
    return h + h // 2, max(w - w // 4, cfg.min_input_size[-1])


def _micro(name: str) -> torch.nn.Module:
    kw = {"num_frames": 4} if name.endswith("_video") else {}
    return subquad.create_model(name, num_classes=7, **kw)


def _shape(name: str, batch: int) -> tuple[int, ...]:
    frames = (4,) if name.endswith("_video") else ()
    return (batch, 3, *frames, *_non_square(name))


@pytest.mark.parametrize("name", MICRO)
def test_micro_model_on_cuda_matches_float64_on_cpu(name):
    torch.manual_seed(0)
    m = _micro(name).eval()  # eval: no dropout or drop-path draws that would differ between the two devices
    x = torch.randn(_shape(name, 2))
    _compare(m, x, lambda mod, t: mod(t), factor=10.0)  # a whole network: 10 x the op tolerance, as in tests/compile


@pytest.mark.parametrize("name", MICRO)
def test_micro_model_bf16_autocast_on_cuda(name):
    torch.manual_seed(0)
    m = _micro(name).eval().to(DEVICE)
    x = torch.randn(_shape(name, 16), device=DEVICE)
    with torch.no_grad():
        y32 = m(x)
        with torch.autocast(DEVICE, torch.bfloat16):
            y16 = m(x)
    assert torch.isfinite(y16).all()
    assert_close(y16.float(), y32.double(), torch.bfloat16, "bf16 logits")
