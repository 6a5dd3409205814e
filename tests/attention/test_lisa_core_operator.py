"""LiSA's FFT core as the opaque operator `subquad::lisa_core` inside compiled inference graphs.

While torch.compile traces an inference call on the CPU, `StructureAwareAttention` hands its core to the operator,
which runs the eager code (CPU tiles, workspaces, dense kernel path, spectra cache) inside the graph. These tests
compare the compiled module with the float64 reference of the same module, check where the operator is and is not
in the graph, and that it finds its module after a deep copy or pickling."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

import subquad
from subquad import backend
from subquad.attention.structure_aware import StructureAwareAttention, StructureAwareAttention1d
from tests._tol import assert_close, rel_rms


def _graphs(fn, *args):
    """Run `fn` compiled (fullgraph, AOTAutograd without Inductor: the operator runs as in a compiled graph) and return
    (output, the code of every captured FX graph)."""
    codes = []

    def capture(gm, example_inputs):
        codes.append(gm.code)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    torch._dynamo.reset()
    out = torch.compile(fn, backend=capture, fullgraph=True)(*args)
    return out, "\n".join(codes)


def _module(grid, D=3):
    torch.manual_seed(0)
    return StructureAwareAttention(12, num_heads=2, D=D, input_size=grid).eval()


@pytest.mark.parametrize("grid", [(5, 7), (3, 4, 5), (16, 9)])
def test_compiled_inference_runs_the_core_operator_and_equals_the_reference(grid):
    """Odd, non-square and 3-D grids; (16, 9) takes the FFT kernel path (N > 32 D), the others the dense one."""
    m = _module(grid)
    N = 1
    for g in grid:
        N *= g
    x = torch.randn(2, N, 12)
    with torch.no_grad():
        ref = m.double().forward_ref(x.double(), grid)
        m.float()
        out, code = _graphs(lambda t: m(t, grid), x)
    assert "lisa_core" in code
    # The first call fills the module's spectra cache inside the graph; eager calls after it read that cache.
    assert_close(out, ref, torch.float32, "compiled LiSA")
    with torch.no_grad():
        assert_close(m(x, grid), ref, torch.float32, "eager LiSA after the compiled call")


def test_one_dimensional_form_under_compile():
    torch.manual_seed(1)
    m = StructureAwareAttention1d(12, num_heads=2, D=4, seq_len=40).eval()
    x = torch.randn(2, 33, 12)
    with torch.no_grad():
        ref = m.double().forward_ref(x.double())
        m.float()
        out, code = _graphs(m, x)
    assert "lisa_core" in code
    assert_close(out, ref, torch.float32, "compiled 1-D LiSA")


def test_autograd_traces_the_core_instead():
    """Where gradients are needed the core is traced (the operator has no backward), and they match eager's."""
    m = _module((5, 7)).train()
    x = torch.randn(2, 35, 12, requires_grad=True)
    out, code = _graphs(lambda t: m(t, (5, 7)), x)
    assert "lisa_core" not in code
    out.square().sum().backward()
    got = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    m(x, (5, 7)).square().sum().backward()
    for n, p in m.named_parameters():
        assert_close(got[n], p.grad, torch.float32, f"grad {n}", factor=10.0)  # two float32 evaluations


def test_plain_schedule_and_local_kernels_trace_the_core():
    x = torch.randn(1, 35, 12)
    m = _module((5, 7))
    with torch.no_grad(), backend.use_backend("plain"):
        _, code = _graphs(lambda t: m(t, (5, 7)), x)
    assert "lisa_core" not in code
    torch.manual_seed(0)
    local = StructureAwareAttention(12, num_heads=2, D=2, input_size=(5, 7), local_kernel=3).eval()
    with torch.no_grad():
        _, code = _graphs(lambda t: local(t, (5, 7)), x)
    assert "lisa_core" not in code


def test_export_traces_the_core():
    m = _module((5, 7))
    x = torch.randn(1, 35, 12)

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, t):
            return self.m(t, (5, 7))

    with torch.no_grad():
        ep = torch.export.export(Wrap(), (x,))
    assert "lisa_core" not in str(ep.graph)
    assert_close(ep.module()(x), m(x, (5, 7)), torch.float32, "exported LiSA")


def test_kernels_given_to_the_graph_are_the_ones_used():
    """torch.func.functional_call with other kernels, and a kernel changed in place earlier in the same graph: the
    operator computes with the tensors the graph passes, not with the module's (cached) own."""
    m = _module((5, 7))
    x = torch.randn(2, 35, 12)
    names = ("kernel_a", "kernel_b", "struct_proj")
    other = {n: getattr(m, n).detach() * 3.0 for n in names}
    with torch.no_grad():
        m(x, (5, 7))  # the module's own spectra in its cache
        out, code = _graphs(lambda p, t: torch.func.functional_call(m, p, (t, (5, 7))), other, x)
        assert "lisa_core" in code
        ref = torch.func.functional_call(m, other, (x, (5, 7)))
        assert_close(out, ref, torch.float32, "compiled functional_call")
        assert rel_rms(out, m(x, (5, 7))) > 0.1

        def scale_then_run(t):
            m.kernel_a.mul_(2.0)
            return m(t, (5, 7))

        out, code = _graphs(scale_then_run, x)
        assert "lisa_core" in code
        m.kernel_a.div_(2.0)
        assert_close(out, scale_then_run(x), torch.float32, "kernel scaled inside the graph")


def test_a_copy_that_did_not_register_traces_its_core():
    """A copy made without `__init__` or `__setstate__` (here: its registration forged away) is not handed to the
    operator; its core is traced and the output is still right."""
    m = _module((5, 7))
    c = copy.deepcopy(m)
    c._mixer_id = id(m)
    x = torch.randn(1, 35, 12)
    with torch.no_grad():
        out, code = _graphs(lambda t: c(t, (5, 7)), x)
        assert "lisa_core" not in code
        assert_close(out, c(x, (5, 7)), torch.float32, "traced copy")


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_find_their_own_module(how):
    """The operator looks its module up by id: a copy made by deepcopy or pickle registers itself, and its compiled
    graph runs the copy's kernels, not the original's."""
    m = _module((5, 7))
    if how == "deepcopy":
        c = copy.deepcopy(m)
    else:
        buf = io.BytesIO()
        pickle.dump(m, buf)
        c = pickle.loads(buf.getvalue())
    with torch.no_grad():
        c.kernel_a.mul_(2.0)
        x = torch.randn(2, 35, 12)
        out, code = _graphs(lambda t: c(t, (5, 7)), x)
        assert "lisa_core" in code
        assert_close(out, c(x, (5, 7)), torch.float32, "compiled copy")
        assert rel_rms(out, m(x, (5, 7))) > 0.1  # the copy's kernels, not the original's


def test_operator_without_its_module_says_so():
    q = torch.randn(1, 1, 4, 2)
    with pytest.raises(RuntimeError, match="no longer exists"):
        torch.ops.subquad.lisa_core(q, q, q, q, q, q, -1, [2, 2])


def test_eager_schedule_is_asked_while_compiling():
    seen = []

    def f(t):
        seen.append((backend.schedule(t.device), backend.eager_schedule(t.device)))
        return t + 1

    torch._dynamo.reset()
    torch.compile(f, backend="eager")(torch.zeros(2))
    assert seen == [("plain", "cpu")]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lisanet_micro", "hylisanet_micro"])
def test_compiled_micro_model_in_bf16_equals_eager(name):
    """Inductor, bf16 autocast: the compiled model with the core operator against eager bf16 (same casts)."""
    torch._dynamo.reset()
    m = subquad.create_model(name).eval()
    x = torch.randn(1, 3, 72, 100)
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        ref = m(x)
        got = torch.compile(m, fullgraph=True)(x)
    assert_close(got.float(), ref.float(), torch.bfloat16, f"{name} bf16 logits")
