"""Exported files agree with eager, and a file that disagrees is never left behind.

Each dynamic H x W export is checked at 224 x 224, 256 x 320 and sizes that are not multiples of the total stride.
The default suite exports l2vit_micro (padded windows, linear global attention) to ONNX, one LiSA block in the ViT
host to ONNX (LiSA's FFTs as real DFT matrices), one block each of Transformer-LS, InLine and PolaFormer and a
micro Agent-DeiT to ONNX, and single-window and single-tile stages to .pt2; under `slow` (make test-all):
l2vit_micro, flatten_swin_micro (shifted, masked windows) and lisanet_micro in both formats, the Agent and MLLA
blocks, and every Tiny and Small image model in both. One more dynamic export is checked at other sizes and batch
sizes.
"""

from __future__ import annotations

import pytest
import timm
import torch

import subquad  # noqa: F401  (registers the models)
from subquad import export as ex

# The acceptance sizes of every dynamic export below. The last is not a multiple of any model's total stride: eager
# pads it, and so must the program. PyTorch may narrow a program's range where a model's code needs it (a last stage
# of a single token: from 64 for a stride of 32; cvt_ls_13's long-short stages: from 115), so it is above those.
SIZES = [(224, 224), (256, 320), (129, 163)]
# Smaller sizes, not multiples of the stride, that a model's program covers: 40 x 40 is where l2vit_micro's ONNX
# file once went wrong in ONNX Runtime.
# At 97 x 131, FLatten-CSwin's third stage holds a single 7-row stripe, which its program once refused.
# At 32 x 32 (l2vit_micro's default size) its last two stages hold a single window, one of them padded.
SMALL = {"l2vit_micro": [(40, 40), (57, 75), (32, 32)], "flatten_swin_micro": [(57, 75)],
         "flatten_cswin_tiny": [(97, 131)], "flatten_cswin_small": [(97, 131)]}
# A dynamic program (and any ONNX file) computes LiSA's FFTs with real DFT matrices (subquad.backend.real_dft).
# An ONNX export of a micro model costs 40-130 s of one core here, most of it in torch.onnx's decompositions and
# optimizer: the default suite exports one micro model; the slow test covers the others and the other format.
CASES = [("l2vit_micro", "onnx")]
SLOW_CASES = [("l2vit_micro", "pt2"), ("flatten_swin_micro", "onnx"), ("flatten_swin_micro", "pt2"),
              ("lisanet_micro", "onnx"), ("lisanet_micro", "pt2")]


def _tiny_small() -> list[str]:
    """From the registry: each family's *_tiny and *_small models; a family with neither contributes its two
    smallest image models at 224 (the cards' parameter counts; video models excepted)."""
    from subquad.models import CARDS
    from subquad.models._builder import FAMILY_MODULES

    out = []
    for module in sorted(FAMILY_MODULES):
        names = timm.list_models(module=module)
        named = [n for n in names if n.endswith(("_tiny", "_small"))]
        sized = sorted((CARDS[n].ref_params, n) for n in names
                       if CARDS[n].ref_params and CARDS[n].img_size == 224 and "video" not in n)
        out += named or [n for _, n in sized[:2]]
    return out


TINY_SMALL = _tiny_small()


def _run(path, fmt: str, x: torch.Tensor) -> torch.Tensor:
    """The written file run on `x`, loaded here (not through subquad.export)."""
    if fmt == "pt2":
        with torch.no_grad():
            return torch.export.load(str(path)).module()(x)
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0])


def _assert_file_matches_eager(m, path, fmt: str, sizes, batch: int = 1) -> None:
    """The file and the eager model agree on inputs drawn here, at every size: max |file - eager| is at most 1e-4
    of max |eager| (export_model's own report is not used)."""
    g = torch.Generator().manual_seed(1234)
    for h, w in sizes:
        x = torch.randn(batch, m.pretrained_cfg["input_size"][0], h, w, generator=g)
        with torch.no_grad():
            ref = m(x)
        out = _run(path, fmt, x)
        assert out.shape == ref.shape, (h, w, out.shape, ref.shape)
        err = (out.double() - ref.double()).abs().max() / ref.double().abs().max()
        assert err <= 1e-4, f"{fmt} file vs eager at {h}x{w}: relative error {err:.2e}"


def _dynamic(name: str, fmt: str, tmp_path, sizes=None, **kwargs) -> dict:
    m = timm.create_model(name, **kwargs).eval()
    sizes = sizes or SIZES + SMALL.get(name, [])
    res = ex.export_model(m, fmt, tmp_path / f"m.{fmt}", sizes[0], dynamic=True, check_sizes=sizes,
                          log=lambda *a: None)
    assert [tuple(c["size"]) for c in res["checks"]] == sizes
    if fmt == "onnx":  # an ONNX graph has no range check: the file names the sides it was checked for
        import onnxruntime as ort

        meta = ort.InferenceSession(str(tmp_path / "m.onnx")).get_modelmeta().custom_metadata_map
        assert meta["subquad.input_height"] == "{}-{}".format(*res["covers"]["H"])
        assert meta["subquad.input_width"] == "{}-{}".format(*res["covers"]["W"])
    _assert_file_matches_eager(m, tmp_path / f"m.{fmt}", fmt, sizes)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"m.{fmt}"]  # no temporary left
    return res


@pytest.mark.parametrize("name, fmt", CASES)
def test_micro_dynamic_export_matches_eager(name, fmt, tmp_path):
    _dynamic(name, fmt, tmp_path)


def test_lisa_block_dynamic_onnx_matches_eager(tmp_path):
    """One LiSA block (structure-aware attention) in the ViT host, dynamic ONNX: its FFTs as real DFT matrices over
    symbolic sides, at sizes that are not multiples of the patch. (lisanet_micro's own exports run under slow.)"""
    res = _dynamic("vit_attn_micro", "onnx", tmp_path, [(64, 64), (36, 52), (29, 43)], attn="structure_aware",
                   depth=1, class_token=False, global_pool="avg")
    assert res["covers"]["H"][0] <= 29 and res["covers"]["W"][0] <= 43


def test_long_short_block_dynamic_onnx_matches_eager(tmp_path):
    """One Transformer-LS block in the ViT host (2-D tiles, dynamic-projection global keys, relative-position bias),
    dynamic ONNX: the exported form gathers its tiles by row indices computed from the symbolic sides
    (`long_short_2d_gather`), checked at a size that is not a multiple of the window."""
    res = _dynamic("vit_attn_micro", "onnx", tmp_path, [(32, 32), (29, 43)], attn="long_short", depth=1,
                   class_token=False, global_pool="avg", img_size=32)
    assert res["covers"]["H"][0] <= 29 and res["covers"]["W"][0] <= 43


# Agent's ONNX graph is exported in the default suite by Agent-DeiT below, MLLA's under slow (~10 s each here).
@pytest.mark.parametrize("attn", [pytest.param("agent", marks=pytest.mark.slow), "inline", "polarity",
                                  pytest.param("mlla", marks=pytest.mark.slow)])
def test_successor_block_dynamic_onnx_matches_eager(attn, tmp_path):
    """One block of each of FLatten's successors in the ViT host, dynamic ONNX, checked in ONNX Runtime at batch 2
    and at batch 1 on a size that is not a multiple of the patch (the Tiny/Small models of each family run under
    slow). InLine's per-sample 3 x 3 convolution once made a Conv whose group count was the symbolic batch times C,
    which ONNX cannot hold."""
    res = _dynamic("vit_attn_micro", "onnx", tmp_path, [(32, 32), (29, 43)], attn=attn, depth=1,
                   class_token=False, global_pool="avg", img_size=32)
    assert res["covers"]["H"][0] <= 29 and res["covers"]["W"][0] <= 43


def test_agent_deit_dynamic_onnx_pools_agents_at_every_size(tmp_path):
    """Agent-DeiT (class token, 3 x 3 agents) traced at a size whose grid the agent grid does not divide: ONNX's
    graph of adaptive_avg_pool2d over symbolic sides ran off its gather bounds in ONNX Runtime (every Agent
    Tiny/Small model failed its dynamic ONNX export); the agents are now pooled by bin matrices in the program."""
    res = _dynamic("agent_deit_micro", "onnx", tmp_path, [(64, 64), (29, 43)], depth=1)
    assert res["covers"]["H"][0] <= 29 and res["covers"]["W"][0] <= 43


@pytest.mark.slow
@pytest.mark.parametrize("name, fmt", SLOW_CASES)
def test_micro_dynamic_export_other_format(name, fmt, tmp_path):
    _dynamic(name, fmt, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
@pytest.mark.parametrize("name", TINY_SMALL)
def test_tiny_small_dynamic_export_matches_eager(name, fmt, tmp_path):
    _dynamic(name, fmt, tmp_path)


def test_tiny_small_list_covers_every_family():
    """The slow test's list, derived from the registry, holds every *_tiny / *_small model and at least one model
    of every family."""
    from subquad.models._builder import FAMILY_MODULES

    names = {n for n in subquad.list_models() if n.endswith(("_tiny", "_small"))}
    assert names <= set(TINY_SMALL), sorted(names - set(TINY_SMALL))
    assert all(set(TINY_SMALL) & set(timm.list_models(module=m)) for m in FAMILY_MODULES)
    assert {"cvt_ls_13", "vil_ls_medium", "lisanet_s", "hylisanet_s", "flatten_pvt_v2_b1"} <= set(TINY_SMALL)


def test_static_export_matches_eager(tmp_path):
    """A static ONNX export (the default) at the model's own size, checked at batch 2. The ViT host: the property is
    the static path, and l2vit_micro's graph is exported (dynamic) above."""
    m = timm.create_model("vit_attn_micro").eval()
    res = ex.export_model(m, "onnx", tmp_path / "m.onnx", log=lambda *a: None)
    assert [c["size"] for c in res["checks"]] == [list(m.pretrained_cfg["input_size"][1:])]
    _assert_file_matches_eager(m, tmp_path / "m.onnx", "onnx", [tuple(m.pretrained_cfg["input_size"][1:])], 2)


def test_dynamic_export_runs_at_other_sizes_and_batches(tmp_path, monkeypatch):
    m = timm.create_model("vit_attn_micro").eval()
    stride = m.total_stride
    loads = []
    monkeypatch.setattr(torch.export, "load", lambda *a, load=torch.export.load, **k: loads.append(a) or load(*a, **k))
    res = ex.export_model(m, "pt2", tmp_path / "m.pt2", (8 * stride, 8 * stride), dynamic=True, log=lambda *a: None)
    assert len(loads) == 1  # the written program is loaded once for both checks
    monkeypatch.undo()
    # the second check is at a size that is not a multiple of the stride: the program's padding runs
    assert len(res["checks"]) == 2 and res["checks"][1]["size"] == [9 * stride + 3, 10 * stride - 5]
    _assert_file_matches_eager(m, tmp_path / "m.pt2", "pt2", [tuple(c["size"]) for c in res["checks"]])
    _assert_file_matches_eager(m, tmp_path / "m.pt2", "pt2", [(6 * stride - 1, 11 * stride + 7)], batch=3)
    with torch.no_grad():  # the comparison can fail: an eager model that computes otherwise disagrees with the file
        m.head.bias[0] += 0.01 * m(torch.randn(1, 3, 8 * stride, 8 * stride)).abs().max()
    with pytest.raises(AssertionError, match="relative error"):
        _assert_file_matches_eager(m, tmp_path / "m.pt2", "pt2", [(8 * stride, 8 * stride)])


@pytest.mark.slow  # ~65 s each on a 2-core Zen 3; the default suite keeps the dynamic micro exports
def test_dynamic_window_model_takes_single_window_stages(tmp_path):
    """l2vit_micro's window stages: one pt2 program, exported at a larger size (batch 2), runs at the default size,
    where the last stages hold a single (padded) window, and at non-square sizes. One block a stage: each stage's
    first block is its window (LWA) block, and the property is the stages' grids, not their depth."""
    m = timm.create_model("l2vit_micro", depths=(1, 1, 1, 1)).eval()
    stride = m.total_stride
    s0 = m.pretrained_cfg["input_size"][1]
    res = ex.export_model(m, "pt2", tmp_path / "m.pt2", (7 * stride, 7 * stride), dynamic=True,
                          check_sizes=[(7 * stride, 7 * stride), (s0, s0), (2 * stride, 3 * stride),
                                       (s0, 5 * stride)], log=lambda *a: None)
    _assert_file_matches_eager(m, tmp_path / "m.pt2", "pt2", [tuple(c["size"]) for c in res["checks"]])


@pytest.mark.slow  # ~65 s each on a 2-core Zen 3; the default suite keeps the dynamic micro exports
def test_dynamic_long_short_model_takes_single_tile_stages(tmp_path):
    """cvt_ls_micro's long-short stages: the program once required two tiles a side (it covered 35-2048); now it
    runs at 40 x 40, where a stage holds a single tile, and at odd, non-square sizes."""
    m = timm.create_model("cvt_ls_micro").eval()
    res = ex.export_model(m, "pt2", tmp_path / "m.pt2", (64, 64), dynamic=True,
                          check_sizes=[(64, 64), (40, 40), (57, 75)], log=lambda *a: None)
    assert res["covers"]["H"][0] < 35 and res["covers"]["W"][0] < 35
    _assert_file_matches_eager(m, tmp_path / "m.pt2", "pt2", [(64, 64), (40, 40), (57, 75)])


def test_a_disagreeing_file_is_removed(tmp_path, monkeypatch):
    m = timm.create_model("vit_attn_micro").eval()
    monkeypatch.setattr(ex, "_load_file", lambda path, fmt: lambda x: m(x) + 1.0)
    with pytest.raises(ex.ExportCheckError, match="disagrees with eager"):
        ex.export_model(m, "pt2", tmp_path / "m.pt2", log=lambda *a: None)
    assert list(tmp_path.iterdir()) == []


def test_cli_export_writes_a_checked_file(tmp_path, capsys):
    from subquad_cli.__main__ import main

    out = tmp_path / "vit.pt2"
    assert main(["export", "--model", "vit_attn_micro", "--format", "pt2", "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out and out.is_file()
    assert main(["export", "--model", "vit_attn_micro", "--format", "pt2", "--out", str(out)]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert torch.is_grad_enabled()


def test_onnx_optimizer_runs_without_its_quadratic_rewrite_rules(tmp_path, monkeypatch):
    """torch.onnx's optimizer runs inside `_linear_time_rewrites`: onnxscript's rules of several output nodes (whose
    matcher rescans the whole graph per candidate, O(Slices x nodes): minutes on a dynamic CSwin graph) are left out,
    every other default rule stays, and the rule list is restored afterwards."""
    from onnxscript import rewriter

    before = rewriter._DEFAULT_REWRITE_RULES
    multi = [r for r in before if not r._target_pattern.has_single_output_node]
    assert multi, "onnxscript's defaults hold a rule of several output nodes (the test's premise)"
    seen = []

    class Stop(Exception):
        pass

    def spy(*args, **kwargs):  # records the rules the optimizer would run with, then stops the export
        seen.append(rewriter._DEFAULT_REWRITE_RULES)
        raise Stop

    monkeypatch.setattr(torch.onnx, "export", spy)
    model = subquad.create_model("l2vit_micro")
    with pytest.raises(Stop):
        ex.export_model(model, "onnx", tmp_path / "m.onnx", img_size=(32, 32), log=lambda *_: None)
    assert not list(tmp_path.iterdir())  # nothing left behind
    (during,) = seen
    assert set(during) == set(before) - set(multi) and len(during) == len(before) - len(multi)
    assert rewriter._DEFAULT_REWRITE_RULES is before
