"""LiSA's FFT core as the opaque operator `subquad::lisa_core` inside compiled inference graphs.

While torch.compile traces an inference call on the CPU, `StructureAwareAttention` hands its core to the operator,
which runs the eager code (CPU tiles, workspaces, dense kernel path, spectra cache) inside the graph. These tests
compare the compiled module with the float64 reference of the same module, check where the operator is and is not
in the graph, that it finds its module after a deep copy or pickling, and that kernels of no known module are
transformed on the call."""

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
    # The operator found its module: the first call filled the module's spectra cache inside the graph (forward_ref
    # does not fill it); eager calls after it read that cache.
    from subquad.attention import structure_aware as sa

    assert sa._kernel_owner(m.kernel_a, m.kernel_b, m.struct_proj, m.boundary, m.kernel_resize, m.d_chunk) is m
    assert m._spectra_cache
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


def test_a_copy_that_did_not_register_is_transformed_on_the_call():
    """A copy the registry does not know (made without `__init__` or `__setstate__`; here taken out of it) still runs
    the operator, which transforms its kernels on the call: the right output."""
    from subquad.attention import structure_aware as sa

    m = _module((5, 7))
    c = copy.deepcopy(m)
    sa._MIXERS.pop(id(c))
    x = torch.randn(1, 35, 12)
    with torch.no_grad():
        c.kernel_a.mul_(2.0)
        out, code = _graphs(lambda t: c(t, (5, 7)), x)
        assert "lisa_core" in code
        assert sa._kernel_owner(c.kernel_a, c.kernel_b, c.struct_proj, c.boundary, c.kernel_resize, None) is None
        assert_close(out, c(x, (5, 7)), torch.float32, "unregistered copy")


def test_graphs_of_two_equal_modules_are_the_same():
    """The graph carries the configuration, not its module: two modules built alike compile to the same code (which
    is what lets Inductor's on-disk cache serve a LiSA model in another process)."""
    x = torch.randn(1, 35, 12)
    with torch.no_grad():
        codes = [_graphs(lambda t, mod=mod: mod(t, (5, 7)), x)[1] for mod in (_module((5, 7)), _module((5, 7)))]
    assert "lisa_core" in codes[0] and codes[0] == codes[1]


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_copies_find_their_own_module(how):
    """The operator looks up the module that owns the kernels it is given: a copy made by deepcopy or pickle registers
    itself, and its compiled graph runs the copy's kernels, not the original's."""
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


@pytest.mark.parametrize("boundary,resize,grid,d_chunk", [
    ("circular", "pad", (6, 4), None), ("zero", "pad", (6, 4), None), ("zero", "interp", (6, 4), None),
    ("circular", "interp", (6, 4), 2), ("circular", "pad", (16, 9), None), ("zero", "pad", (17, 9), 2)])
def test_operator_without_a_module_equals_the_module_at_another_grid(boundary, resize, grid, d_chunk):
    """Kernels no registered module owns (copies of a module's, which is built for 5 x 7) at other grids: the
    operator resamples and transforms them as the module does, on every boundary and resize mode, on the dense
    kernel path (6 x 4) and the FFT one (16 x 9, 17 x 9: N > 32 D), with automatic and fixed tiles."""
    torch.manual_seed(1)
    m = StructureAwareAttention(12, num_heads=2, D=3, input_size=(5, 7), boundary=boundary, kernel_resize=resize,
                                d_chunk=d_chunk).eval()
    x = torch.randn(2, grid[0] * grid[1], 12)
    with torch.no_grad():
        q, k, v = m._qkv(x)
        kernels = [t.clone() for t in (m.kernel_a, m.kernel_b, m.struct_proj)]
        out = torch.ops.subquad.lisa_core(q, k, v, *kernels, list(grid), boundary, resize,
                                          -1 if d_chunk is None else d_chunk)
        assert_close(out, m._mix(q, k, v, grid), torch.float32, "operator without a module")
        assert out.is_contiguous()


def test_operator_without_a_module_in_the_1d_and_3d_forms():
    """The 1-D form (a sequence of 40 tokens, module built for 33) and the 3-D video form (3 x 4 x 5, built for
    2 x 4 x 5) through the operator with kernels no module owns."""
    torch.manual_seed(2)
    for m, x, grid in ((StructureAwareAttention1d(12, num_heads=2, D=3, seq_len=33).eval(), torch.randn(1, 40, 12),
                        (40,)),
                       (StructureAwareAttention(12, num_heads=2, D=3, input_size=(2, 4, 5)).eval(),
                        torch.randn(1, 60, 12), (3, 4, 5))):
        with torch.no_grad():
            q, k, v = m._qkv(x)
            kernels = [t.clone() for t in (m.kernel_a, m.kernel_b, m.struct_proj)]
            out = torch.ops.subquad.lisa_core(q, k, v, *kernels, list(grid), m.boundary, m.kernel_resize, -1)
            assert_close(out, m._mix(q, k, v, grid), torch.float32, f"operator without a module, grid {grid}")


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


_CACHE_PROBE = """
import torch, subquad
from torch._dynamo.utils import counters
torch.manual_seed(0)
m = subquad.create_model("lisanet_micro").eval()
x = torch.randn(1, 3, 64, 48)
with torch.no_grad():
    out = torch.compile(m, fullgraph=True)(x)
    assert (out - m(x)).abs().max() < 1e-3
print("HITS", counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"])
"""


@pytest.mark.slow
def test_inductor_cache_serves_a_lisa_model_in_the_next_process(tmp_path):
    """Two processes compile the same LiSA model with one on-disk Inductor cache: the second hits it for every graph
    (the graph names no module)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _CACHE_PROBE], env=env, capture_output=True, text=True,
                              timeout=900)
        assert done.returncode == 0, done.stderr[-2000:]
        line = next(ln for ln in done.stdout.splitlines() if ln.startswith("HITS"))
        runs.append(tuple(int(t) for t in line.split()[1:]))
    (hit1, miss1), (hit2, miss2) = runs
    assert miss1 >= 1 and hit1 == 0
    assert hit2 == miss1 and miss2 == 0
