"""One set of parameter names per mechanism: the "host_qkv" forms, the long-short factory, and checkpoints of
subquad <= 0.1 (the `layout` / `qkv_layout` era) loading through `subquad.engine.legacy.remap_legacy`.

`tests/_fixtures/legacy_names.safetensors` (118 KB) was written by the code at commit 86abbea, before the change:
state dicts, inputs and outputs of an LRA classifier with `layout="lra"` long-short attention (keys `W_q`, `W_k`,
`W_v`, `W_o`, `dual_ln_l`, `dual_ln_s`, `dconv_fc`), a focused linear attention with `qkv_layout="q_kv"` and
`sr_ratio=2` (keys `q`, `kv`), and a CvT*-LS model (keys `attn.dp_conv`, `attn.dp_fc`, `attn.ls.*`).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import load_file

import subquad
from subquad.attention import build_attention, get_attention_form, list_attention
from subquad.attention.focused_linear import FocusedLinearCore, remap_q_kv
from subquad.attention.long_short import (
    ChunkedLongShortAttention,
    LongShortAttention,
    LongShortCore,
    remap_lra_official,
)
from subquad.engine.legacy import remap_legacy
from subquad.sequence.encoder import LRAClassifier

FIXTURE = Path(__file__).resolve().parents[1] / "_fixtures" / "legacy_names.safetensors"


def _case(blob: dict[str, torch.Tensor], name: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    pre = f"{name}/sd/"
    sd = {k[len(pre):]: v for k, v in blob.items() if k.startswith(pre)}
    rest = {k[len(name) + 1:]: v for k, v in blob.items() if k.startswith(name + "/") and not k.startswith(pre)}
    return sd, rest


def _build(name: str) -> torch.nn.Module:
    if name == "lra":
        return LRAClassifier(vocab_size=12, num_classes=3, dim=16, depth=2, num_heads=2, mlp_dim=16, max_len=32,
                             attention="long_short",
                             attn_kw={"global_token_rule": "lra", "window_size": 4, "rank": 3},
                             cls_attn_kw={"num_prefix_tokens": 1})
    if name == "focused_q_kv":
        return build_attention("focused_linear", 16, 2, input_size=(6, 6), sr_ratio=2)
    return timm.create_model("cvt_ls_micro", num_classes=3, embed_dims=(8, 8, 16), depths=(1, 1, 1),
                             num_heads=(1, 1, 2), rank=2, window_size=3)


def _run(name: str, m: torch.nn.Module, io: dict[str, torch.Tensor]) -> torch.Tensor:
    if name == "lra":
        return m(io["tokens"], io["mask"])
    if name == "focused_q_kv":
        return m(io["x"], (6, 6))
    return m(io["x"])


@pytest.mark.parametrize("name", ["lra", "focused_q_kv", "cvt_ls"])
def test_old_checkpoints_load_strictly_and_give_the_old_outputs(name):
    sd, io = _case(load_file(str(FIXTURE)), name)
    m = _build(name).eval()
    old_names = set(sd) - set(m.state_dict())
    assert old_names, "the fixture must hold pre-change names"
    m.load_state_dict(remap_legacy(sd, m), strict=True)
    with torch.no_grad():
        # bit-identical on the machine that wrote the fixture; a tight tolerance for other CPUs' GEMM blocking
        torch.testing.assert_close(_run(name, m, io), io["out"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["lra", "focused_q_kv", "cvt_ls"])
def test_current_state_dicts_pass_unchanged(name):
    m = _build(name)
    sd = m.state_dict()
    out = remap_legacy(sd, m)
    assert list(out) == list(sd) and all(out[k] is sd[k] for k in sd)


def test_lra_official_names_map_onto_the_fused_projection():
    C = 16
    old = {f"W_{c}.{t}": torch.randn(C, C) if t == "weight" else torch.randn(C) for c in "qkvo"
           for t in ("weight", "bias")}
    old.update({"dual_ln_l.weight": torch.randn(C), "dual_ln_s.bias": torch.randn(C),
                "dconv_fc.weight": torch.randn(6, C)})
    new = remap_lra_official(old)
    assert torch.equal(new["qkv.weight"], torch.cat([old["W_q.weight"], old["W_k.weight"], old["W_v.weight"]]))
    assert torch.equal(new["qkv.bias"], torch.cat([old["W_q.bias"], old["W_k.bias"], old["W_v.bias"]]))
    assert new["proj.weight"] is old["W_o.weight"] and new["dual_ln_full.weight"] is old["dual_ln_l.weight"]
    assert new["dual_ln_dp.bias"] is old["dual_ln_s.bias"]
    assert new["to_dynamic_projection.weight"] is old["dconv_fc.weight"]
    with pytest.raises(ValueError, match="all be present"):
        remap_lra_official({k: v for k, v in old.items() if k != "W_k.bias"})
    with pytest.raises(ValueError, match="both be present"):
        remap_q_kv({"q.weight": torch.zeros(C, C), "kv.weight": torch.zeros(2 * C, C), "q.bias": torch.zeros(C)})


def test_one_set_of_long_short_names_whatever_the_form():
    def names(**kw):
        return {n for n, _ in build_attention("long_short", 16, 2, window_size=2, rank=3, **kw).named_parameters()}

    base = {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias", "to_dynamic_projection.weight",
            "to_dynamic_projection.bias", "dual_ln_dp.weight", "dual_ln_dp.bias", "dual_ln_full.weight",
            "dual_ln_full.bias"}
    assert names() == names(global_token_rule="lra") == names(global_token_rule="lra", dims=2) == base
    assert names(dims=2) == base | {"local_relative_position_bias_table"}
    core = build_attention("long_short", 16, 2, window_size=2, rank=3, dims=2, dp_conv=True, rpe=False,
                           host_qkv=True)
    assert type(core) is LongShortCore
    assert {n for n, _ in core.named_parameters()} == (base - {"qkv.weight", "qkv.bias", "proj.weight",
                                                               "proj.bias"}) | {"dp_conv.weight"}


def test_causal_form_is_built_by_the_factory_not_by_new():
    assert "__new__" not in vars(LongShortAttention) and "__new__" not in vars(LongShortCore)
    m = build_attention("long_short", 16, 2, causal=True, window_size=4, chunk_size=2)
    assert type(m) is ChunkedLongShortAttention and m.name == "long_short"
    with pytest.raises(ValueError, match="causal=True only"):
        build_attention("long_short", 16, 2, chunk_size=4)
    with pytest.raises(ValueError, match="bidirectional form"):
        LongShortAttention(16, 2, causal=True)


def test_removed_layout_option_is_translated_with_a_warning():
    with pytest.warns(DeprecationWarning, match="global_token_rule='lra'"):
        m = build_attention("long_short", 16, 2, window_size=2, rank=3, layout="lra")
    assert m.global_token_rule == "lra" and not m.rpe
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert type(build_attention("long_short", 16, 2, layout="external", dims=2)) is LongShortCore
    with pytest.raises(ValueError, match="removed"):
        build_attention("long_short", 16, 2, layout="kqv")
    with pytest.raises(ValueError, match="unknown option.*qkv_layout"):
        build_attention("focused_linear", 16, 2, input_size=4, qkv_layout="q_kv")


def test_host_qkv_forms_and_one_line_refusal():
    have = [n for n in list_attention() if n in ("long_short", "focused_linear", "softmax", "cswin")]
    assert len(have) == 4
    for n in have:
        m = build_attention(n, 16, 2, host_qkv=True, input_size=(4, 4))
        assert hasattr(m, "forward_qkv") and not hasattr(m, "qkv") and not hasattr(m, "proj"), n
        q, k, v = torch.randn(3, 1, 16, 16)
        with torch.no_grad():
            assert m.forward_qkv(q, k, v, (4, 4), x=q).shape == (1, 16, 16), n
    assert type(build_attention("focused_linear", 16, 2, host_qkv=True, input_size=4)) is FocusedLinearCore
    with pytest.raises(subquad.errors.UserError, match="cannot take q, k, v projected by its host") as e:
        get_attention_form("linear", "host_qkv")
    assert "\n" not in str(e.value)


def test_cswin_branch_form_reads_the_packed_projection_without_a_copy():
    from subquad.attention.host_forms import _packed

    qkv = torch.randn(2, 12, 3, 16)
    q, k, v = qkv.unbind(2)
    assert _packed(q, k, v).data_ptr() == qkv.data_ptr() and torch.equal(_packed(q, k, v), qkv)
    q2 = q.clone()
    assert torch.equal(_packed(q2, k, v), qkv)
