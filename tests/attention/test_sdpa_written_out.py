"""The written-out softmax attention that bf16 takes under torch.compile on a CPU
(`subquad.backend.decompose_attention`): the same function as SDPA and as the float64 reference, on outputs and every
gradient, and the dispatch's rule."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from subquad import backend
from subquad.attention.functional import softmax as fs
from subquad.attention.functional.softmax import sdpa, sdpa_written_out, softmax_attention_ref
from tests._tol import assert_close, compare_fn

SHAPES = [(2, 3, 7, 11, 5), (1, 2, 13, 9, 8)]  # B, h, N (queries), n (keys), d: odd and non-square


def _qkv(B, h, N, n, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, h, N, d, generator=g), torch.randn(B, h, n, d, generator=g),
            torch.randn(B, h, n, d, generator=g)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", [None, 0.3])
def test_unmasked_matches_reference(dtype, shape, scale):
    compare_fn(lambda q, k, v: sdpa_written_out(q, k, v, scale=scale),
               lambda q, k, v: softmax_attention_ref(q, k, v, scale=scale), _qkv(*shape), dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
def test_float_mask_matches_reference_with_its_gradient(dtype, shape):
    """A float attn_mask is added to the logits (Swin's relative-position bias arrives this way), so it has a gradient;
    here broadcast over the batch."""
    B, h, N, n, d = shape
    bias = torch.randn(1, h, N, n, generator=torch.Generator().manual_seed(1))
    compare_fn(lambda q, k, v, b: sdpa_written_out(q, k, v, b),
               lambda q, k, v, b: softmax_attention_ref(q, k, v, bias=b), _qkv(*shape) + [bias], dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("as_float", [False, True])
def test_rows_without_keys_are_zero_with_finite_gradients(dtype, as_float):
    """Bool (True = may attend) and float (-inf = masked) masks, one query row with every key masked and one item with
    none left: zeros there, as SDPA's CPU kernel gives, and finite, matching gradients."""
    B, h, N, n, d = 2, 2, 5, 6, 4
    mask = torch.ones(B, 1, N, n, dtype=torch.bool)
    mask[0, :, :, 4:] = False
    mask[0, :, 2] = False  # one row with no key
    mask[1] = False  # an item with no key at all
    attn = torch.zeros(mask.shape).masked_fill(~mask, float("-inf")) if as_float else mask
    compare_fn(lambda q, k, v: sdpa_written_out(q, k, v, attn.to(q.dtype) if as_float else attn),
               lambda q, k, v: softmax_attention_ref(q, k, v, mask=mask), _qkv(B, h, N, n, d), dtype)
    q, k, v = _qkv(B, h, N, n, d)
    out = sdpa_written_out(q, k, v, attn)
    assert (out[1] == 0).all() and (out[0, :, 2] == 0).all()
    assert_close(out, F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=attn if not as_float
                                                     else attn.double()), torch.float32, "vs SDPA")


def test_bf16_output_dtype_and_sdpa_agreement():
    """bf16 in, bf16 out (as SDPA); close to SDPA's own bf16 result at bf16 tolerance."""
    q, k, v = (t.bfloat16() for t in _qkv(1, 3, 33, 33, 16))
    mask = torch.randn(1, 3, 33, 33).bfloat16()
    out = sdpa_written_out(q, k, v, mask)
    assert out.dtype == torch.bfloat16
    ref = softmax_attention_ref(q.double(), k.double(), v.double(), bias=mask.double())
    assert_close(out, ref, torch.bfloat16, "written out")
    assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), ref, torch.bfloat16, "SDPA")


@pytest.fixture
def compiling(monkeypatch):
    """Pretend torch.compile is tracing (the only place the written-out form is chosen)."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: False)


def _bf16(*shape):
    return torch.randn(*shape).bfloat16()


def test_decomposes_only_under_compile():
    q = _bf16(1, 2, 9, 8)
    assert not backend.decompose_attention(q, q, q)  # eager


def test_decompose_rule(compiling, monkeypatch):
    q, k, v = _bf16(1, 2, 9, 8), _bf16(1, 2, 11, 8), _bf16(1, 2, 11, 8)
    with torch.no_grad():
        assert backend.decompose_attention(q, k, v)
        assert not backend.decompose_attention(q.float(), k.float(), v.float())  # fp32: the fused kernel is as fast
        assert not backend.decompose_attention(q, k, v, dropout_p=0.1)
        assert not backend.decompose_attention(q, k, v, attn_mask=torch.ones(9, 11, dtype=torch.bool))
        assert backend.decompose_attention(q, k, v, attn_mask=torch.zeros(9, 11, dtype=torch.bfloat16))
        with backend.use_backend("plain"):
            assert not backend.decompose_attention(q, k, v)
        monkeypatch.setattr(backend, "DECOMPOSE_MAX_LOGITS", 2 * 9 * 11 - 1)
        assert not backend.decompose_attention(q, k, v)  # 198 logits, one more than allowed
        monkeypatch.setattr(backend, "DECOMPOSE_MAX_LOGITS", 2 * 9 * 11)
        assert backend.decompose_attention(q, k, v)
    # autograd: the fused kernel's backward, whichever input autograd tracks
    for i in range(4):
        ts = [q, k, v, torch.zeros(9, 11, dtype=torch.bfloat16)]
        ts[i] = ts[i].clone().requires_grad_()
        assert not backend.decompose_attention(*ts[:3], attn_mask=ts[3]), i
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    assert not backend.decompose_attention(q, k, v)


def test_sdpa_routes_by_the_rule(compiling, monkeypatch):
    calls = []
    monkeypatch.setattr(fs, "sdpa_written_out", lambda *a: calls.append(a) or sdpa_written_out(*a))
    q, k, v = (t.bfloat16() for t in _qkv(1, 2, 7, 5, 4))
    with torch.no_grad():
        sdpa(q, k, v)
        assert len(calls) == 1
        sdpa(q.float(), k.float(), v.float())
        assert len(calls) == 1
        mask = torch.zeros(1, 1, 7, 5, dtype=torch.bfloat16)
        mask[..., 0, :] = float("-inf")
        out = sdpa(q, k, v, attn_mask=mask, scale=0.5)
        assert len(calls) == 2 and calls[1][3] is mask and calls[1][4] == 0.5
        assert (out[..., 0, :] == 0).all()
        sdpa(q, k, v, attn_mask=mask == 0)  # a bool mask: the fused kernel
    assert len(calls) == 2


def _traced_targets(fn, *args):
    """The function calls of the graphs torch.compile traces for fn(*args) (dynamo only, eager backend: no
    inductor compile)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    counter = CompileCounterWithBackend("eager")
    torch._dynamo.reset()
    try:
        torch.compile(fn, backend=counter)(*args)
    finally:
        torch._dynamo.reset()
    return [str(n.target) for g in counter.graphs for n in g.graph.nodes if n.op in ("call_function", "call_method")]


def test_traced_graph_takes_the_rule():
    """What torch.compile really traces: bf16 without autograd gets GEMMs and a softmax, no fused kernel; fp32, and bf16
    under the 'plain' backend, keep the fused kernel."""
    q, k, v = (t.bfloat16() for t in _qkv(1, 2, 7, 5, 4))

    def fn(q, k, v):
        return sdpa(q, k, v)

    with torch.no_grad():
        written = _traced_targets(fn, q, k, v)
        fused32 = _traced_targets(fn, q.float(), k.float(), v.float())
        with backend.use_backend("plain"):
            fused16 = _traced_targets(fn, q, k, v)
    assert "softmax" in written and not any("scaled_dot_product" in t for t in written), written
    for traced in (fused32, fused16):
        assert any("scaled_dot_product" in t for t in traced) and "softmax" not in traced, traced


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vit_attn_micro", "flatten_swin_micro", "flatten_cswin_micro", "agent_deit_micro"])
def test_compiled_bf16_model_matches_eager(name):
    """A compiled bf16 model (attention written out) against the float64 eager model, and the same compiled model
    under 'plain' (fused kernel): both within bf16 tolerance of the reference."""
    import subquad

    torch.manual_seed(0)
    net = subquad.create_model(name).eval()
    x = torch.randn(2, 3, 40, 56)
    with torch.no_grad():
        ref = net.double()(x.double())
        net.float()
        compiled = torch.compile(net)
        with torch.autocast("cpu", torch.bfloat16):
            written = compiled(x)
            with backend.use_backend("plain"):
                fused = compiled(x)
    assert_close(written.float(), ref, torch.bfloat16, "written out")
    assert_close(fused.float(), ref, torch.bfloat16, "fused")


@pytest.mark.parametrize("mask", [None, "float", "bool"])
@pytest.mark.parametrize("shape", SHAPES)
def test_onnx_graph_form_matches_reference(mask, shape, monkeypatch):
    """Traced for ONNX (`backend.onnx_graph`, while exporting), `sdpa` without a bool mask is written out as plain
    operators: the float64 reference's output and every gradient, a float mask added to the logits; a bool mask still
    goes to the fused kernel (its empty rows are zeros there)."""
    q, k, v = _qkv(*shape)
    B, h, N, n, _ = shape
    g = torch.Generator().manual_seed(3)
    keep = torch.rand(B, 1, N, n, generator=g) > 0.3
    keep[..., 0] = True  # every row keeps a key
    attn = {None: None, "float": torch.zeros(keep.shape).masked_fill(~keep, float("-inf")), "bool": keep}[mask]
    calls = []
    monkeypatch.setattr(fs, "_attention_for_onnx", lambda *a, real=fs._attention_for_onnx: calls.append(1) or real(*a))
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    with backend.onnx_graph():
        compare_fn(lambda q, k, v: sdpa(q, k, v, attn_mask=None if attn is None else attn.to(q.dtype)
                                        if mask == "float" else attn, scale=0.3),
                   lambda q, k, v: softmax_attention_ref(q, k, v, scale=0.3, mask=None if mask is None else keep),
                   [q, k, v], torch.float64)
    assert bool(calls) == (mask != "bool")
    calls.clear()
    sdpa(q, k, v)  # outside the block: the fused kernel
    assert not calls
