"""The single tolerance table and the comparison used by every numerical test.

rel = rms(candidate - reference) / (rms(reference) + floor); the reference is float64, the candidate is up-cast.
Non-finite values fail first, with the tensor named.
"""

from __future__ import annotations

import torch

TOL = {
    torch.float64: (1e-10, 1e-12),
    torch.float32: (1e-5, 1e-8),
    torch.float16: (5e-3, 1e-4),
    torch.bfloat16: (2e-2, 1e-3),
}


def rel_rms(candidate: torch.Tensor, reference: torch.Tensor, floor: float = 0.0) -> float:
    c, r = candidate.detach().double(), reference.detach().double()
    return ((c - r).pow(2).mean().sqrt() / (r.pow(2).mean().sqrt() + floor)).item()


def assert_close(candidate: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype | None = None,
                 name: str = "tensor", factor: float = 1.0) -> None:
    """Assert candidate ~ reference under the tolerance row of `dtype` (default: the candidate's dtype).

    `factor` scales the bound; a value above 1 must be justified where it is used.
    """
    dtype = dtype or candidate.dtype
    assert candidate.shape == reference.shape, f"{name}: shape {tuple(candidate.shape)} != {tuple(reference.shape)}"
    assert torch.isfinite(candidate).all(), f"{name}: candidate has NaN/Inf"
    assert torch.isfinite(reference).all(), f"{name}: reference has NaN/Inf"
    tol, floor = TOL[dtype]
    err = rel_rms(candidate, reference, floor)
    assert err <= tol * factor, f"{name}: relative RMS error {err:.3e} > {tol * factor:.1e} ({dtype})"


def _cast_inputs(inputs, dtype):
    return [x.detach().to(dtype).requires_grad_(True) if isinstance(x, torch.Tensor) and x.is_floating_point()
            else x for x in inputs]


def compare_fn(fast, ref, inputs: list, dtype: torch.dtype = torch.float64, factor: float = 1.0,
               seed: int = 0) -> None:
    """Compare output and every floating input's gradient of fast(*inputs) (in `dtype`) vs ref(*inputs) (float64),
    with a random cotangent."""
    g = torch.Generator().manual_seed(seed)
    xs_ref, xs_fast = _cast_inputs(inputs, torch.float64), _cast_inputs(inputs, dtype)
    out_ref = ref(*xs_ref)
    cot = torch.randn(out_ref.shape, generator=g, dtype=torch.float64)
    out_ref.backward(cot)
    out_fast = fast(*xs_fast)
    assert_close(out_fast, out_ref, dtype, "output", factor)
    out_fast.backward(cot.to(out_fast.dtype))
    for i, (a, b) in enumerate(zip(xs_fast, xs_ref)):
        if isinstance(b, torch.Tensor) and b.grad is not None:
            assert a.grad is not None, f"grad of input {i} missing in the fast path"
            assert_close(a.grad, b.grad, dtype, f"grad of input {i}", factor)
        elif isinstance(a, torch.Tensor):
            assert a.grad is None or not a.grad.any(), f"grad of input {i} in the fast path but not in the reference"


def compare_module(module: torch.nn.Module, fast, ref, inputs: list, dtype: torch.dtype = torch.float64,
                   factor: float = 1.0, seed: int = 0) -> None:
    """Compare fast(m, *inputs) on a `dtype` copy of `module` with ref(m, *inputs) on a float64 copy: output,
    every floating input gradient and every parameter gradient (by name), with one random cotangent."""
    import copy

    g = torch.Generator().manual_seed(seed)
    m_ref = copy.deepcopy(module).double()
    m_fast = copy.deepcopy(module).to(dtype)
    xs_ref, xs_fast = _cast_inputs(inputs, torch.float64), _cast_inputs(inputs, dtype)
    out_ref = ref(m_ref, *xs_ref)
    cot = torch.randn(out_ref.shape, generator=g, dtype=torch.float64)
    out_ref.backward(cot)
    out_fast = fast(m_fast, *xs_fast)
    assert_close(out_fast, out_ref, dtype, "output", factor)
    out_fast.backward(cot.to(out_fast.dtype))
    for i, (a, b) in enumerate(zip(xs_fast, xs_ref)):
        if isinstance(b, torch.Tensor) and b.grad is not None:
            assert a.grad is not None, f"grad of input {i} missing in the fast path"
            assert_close(a.grad, b.grad, dtype, f"grad of input {i}", factor)
    ref_params = dict(m_ref.named_parameters())
    for name, p in m_fast.named_parameters():
        pr = ref_params[name]
        if pr.grad is None:
            assert p.grad is None or not p.grad.any(), f"parameter {name}: grad in fast path but not in reference"
            continue
        assert p.grad is not None, f"parameter {name}: grad missing in the fast path"
        assert_close(p.grad, pr.grad, dtype, f"grad of {name}", factor)
