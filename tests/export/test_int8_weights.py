"""`subquad export --quantize int8`'s weight schemes (`--int8-weights`): 7-bit weights compute exactly in ONNX
Runtime on every CPU; 8-bit weights do too where uint8 x int8 products do not saturate (VNNI, AMX, Arm) and are
clipped where they do (x86 without VNNI, `subquad.backend.int8_saturates`)."""

from __future__ import annotations

import numpy as np
import pytest

from subquad import backend
from subquad.errors import UserError
from subquad.export import DEFAULT_INT8_WEIGHTS, INT8_WEIGHTS, check_int8_weights, quantize_int8

pytest.importorskip("onnxruntime", reason="the export extra is a dev dependency")  # installed by `make test`

K, N, ROWS = 96, 40, 29  # odd, non-square


def _matmul_file(path, weight: np.ndarray) -> None:
    """An ONNX file computing X (rows, K) @ W (K, N) with W a float initializer (what torch.onnx writes for a Linear
    without bias)."""
    import onnx
    from onnx import TensorProto, helper

    w = helper.make_tensor("W", TensorProto.FLOAT, weight.shape, weight.astype(np.float32).tobytes(), raw=True)
    graph = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["Y"])], "mm",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["rows", weight.shape[0]])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["rows", weight.shape[1]])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _quantized_weight(path) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weight (K, N), its scale: a scalar or one per output column) of a quantized one-MatMul file."""
    import onnx
    from onnx import numpy_helper

    inits = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    (wq,) = [v for v in inits.values() if v.dtype == np.int8 and v.ndim == 2]
    (scale,) = [v for k, v in inits.items() if k.startswith("W") and "scale" in k]
    return wq, scale


def _run(path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"X": x})[0]


@pytest.fixture(scope="module")
def operands():
    """Activations whose dynamic uint8 quantization is exact (integers spanning [0, 255]: scale 1, zero point 0),
    most in [200, 255], and full-range float weights: the worst case for 16-bit pair sums."""
    g = np.random.default_rng(0)
    x = g.integers(200, 256, (ROWS, K)).astype(np.float32)
    x[0, 0], x[1, 1] = 0.0, 255.0
    w = g.uniform(-1.0, 1.0, (K, N)).astype(np.float32)
    w[0, 0], w[1, 1] = 1.0, -1.0
    return x, w


@pytest.mark.parametrize("weights", INT8_WEIGHTS)
def test_int8_weights_compute_the_quantized_product(weights, operands, tmp_path):
    """ONNX Runtime's output against a float64 reference of the same quantized function: uint8 activations (exact
    here) times the file's int8 weights and scales. Exact (to fp32 rounding) for 7-bit weights on every CPU and for
    8-bit weights where products do not saturate; off by several percent where they do."""
    x, w = operands
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    _matmul_file(src, w)
    quantize_int8(src, dst, weights)
    wq, scale = _quantized_weight(dst)
    bound = 64 if weights.startswith("7bit") else 127
    assert int(np.abs(wq.astype(np.int32)).max()) == bound  # the scheme's range, used in full
    assert (np.ndim(scale) == 1) is weights.endswith("per-channel")
    ref = (x.astype(np.float64) @ wq.astype(np.float64)) * scale.astype(np.float64)
    got = _run(dst, x)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    if weights.startswith("8bit") and backend.int8_saturates():
        assert err > 0.01, err  # clipped: why 7-bit weights are the default
    else:
        assert err < 1e-6, err
    # and the quantized file is close to the float product (the quantization error itself)
    assert np.abs(ref - x @ w).max() / np.abs(x @ w).max() < (0.02 if bound == 64 else 0.01)


def test_default_scheme_and_metadata(operands, tmp_path):
    """The default: 7-bit weights with one scale per output channel (exact on every CPU; the lowest logit error of the
    four schemes on trained checkpoints, docs/benchmarks.md)."""
    import onnx

    assert DEFAULT_INT8_WEIGHTS == "7bit-per-channel"
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    _matmul_file(src, operands[1])
    quantize_int8(src, dst)
    meta = {p.key: p.value for p in onnx.load(str(dst)).metadata_props}
    assert meta["subquad.quantize"] == "int8 dynamic (MatMul, Gemm), 7bit-per-channel weights"
    wq, scale = _quantized_weight(dst)
    assert scale.shape == (N,)
    assert (np.abs(wq.astype(np.int32)).max(0) == 64).all()  # every output channel spans the 7-bit range


def test_unknown_scheme_is_refused(tmp_path):
    with pytest.raises(UserError, match=r"--int8-weights '6bit' is unknown; choose one of 7bit, 8bit, "):
        check_int8_weights("6bit")
    src = tmp_path / "f.onnx"
    _matmul_file(src, np.ones((K, N), np.float32))
    with pytest.raises(UserError, match="unknown"):
        quantize_int8(src, tmp_path / "q.onnx", "int4")
    assert not (tmp_path / "q.onnx").exists()


def test_cli_names_match_the_library():
    """The CLI spells the schemes out (building its parser imports no torch); they must stay the library's."""
    import subquad_cli.export as cli

    assert cli.INT8_WEIGHTS == INT8_WEIGHTS and cli.DEFAULT_INT8_WEIGHTS == DEFAULT_INT8_WEIGHTS


@pytest.mark.parametrize("saturates", [True, False])
def test_8bit_weights_on_a_clipping_cpu_warn_once(saturates, monkeypatch, tmp_path, caplog):
    """quantize_int8 (the library, so `subquad export`, the benchmarks and Python callers alike) warns once per process
    and scheme where 8-bit weights are written on a CPU that clips them; never for 7-bit weights or elsewhere."""
    import logging

    import subquad.export as export

    monkeypatch.setattr(backend, "int8_saturates", lambda: saturates)
    monkeypatch.setattr(export, "_clip_warned", set())
    src = tmp_path / "f.onnx"
    _matmul_file(src, np.ones((K, N), np.float32))
    with caplog.at_level(logging.WARNING, logger="subquad"):
        for i, weights in enumerate(INT8_WEIGHTS + INT8_WEIGHTS):
            quantize_int8(src, tmp_path / f"q{i}.onnx", weights)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if not saturates:
        assert said == []
        return
    assert len(said) == 2  # 8bit and 8bit-per-channel, once each
    assert all("x86 without VNNI" in m and "7-bit weights are exact" in m for m in said)
    assert "the 8bit file" in said[0] and "the 8bit-per-channel file" in said[1]


def test_export_model_refuses_a_scheme_without_quantize(tmp_path):
    from subquad.export import export_model
    from subquad.models import create_model

    with pytest.raises(UserError, match="--int8-weights 8bit needs --quantize int8"):
        export_model(create_model("l2vit_micro"), "onnx", tmp_path / "m.onnx", int8_weights="8bit")
    assert not list(tmp_path.iterdir())
