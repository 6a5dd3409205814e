"""Precision dispatch (subquad.backend): CPU bf16 / int8 detection, the bf16 -> fp32 fallback, the autocast context."""

from __future__ import annotations

import logging

import pytest
import torch

from subquad import backend
from subquad.errors import UserError

ZEN4 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
ZEN3 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 fma\n"
SPR = "flags\t\t: avx512f avx_vnni amx_bf16 amx_tile amx_int8\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd asimddp bf16 i8mm\n"


@pytest.mark.parametrize("text, bf16, int8, amx", [(ZEN4, True, True, False), (ZEN3, False, False, False),
                                                   (SPR, True, True, True), (ARM, True, True, False)])
def test_parse_cpu_flags(text, bf16, int8, amx):
    f = backend.parse_cpu_flags(text)
    assert (f.bf16, f.int8_dot, f.amx, f.source) == (bf16, int8, amx, "/proc/cpuinfo")


def test_parse_cpu_flags_without_a_flags_line():
    assert backend.parse_cpu_flags("processor\t: 0\nmodel name\t: x\n") is None


def test_detection_runs_once_and_agrees_with_torch():
    a, b = backend.cpu_features(), backend.cpu_features()
    assert a is b  # cached: read once per process
    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    if a.source == "/proc/cpuinfo" and callable(probe) and "avx512_bf16" in open("/proc/cpuinfo").read():
        assert probe() and a.bf16


def _fake(monkeypatch, bf16: bool) -> None:
    monkeypatch.setattr(backend, "cpu_features", lambda: backend.CpuFeatures(bf16, bf16, False, "test"))
    monkeypatch.setattr(backend, "_fallback_warned", set())


def test_bf16_kept_where_the_cpu_has_it(monkeypatch, caplog):
    _fake(monkeypatch, True)
    with caplog.at_level(logging.WARNING, logger="subquad.backend"):
        assert backend.resolve_precision("bf16", "cpu") == "bf16"
    assert not caplog.records


def test_bf16_falls_back_to_fp32_with_one_warning(monkeypatch, caplog):
    _fake(monkeypatch, False)
    with caplog.at_level(logging.WARNING, logger="subquad.backend"):
        got = [backend.resolve_precision("bf16", "cpu") for _ in range(3)]
    assert got == ["fp32"] * 3
    warned = [r for r in caplog.records if "bf16" in r.getMessage()]
    assert len(warned) == 1 and "running fp32 instead" in warned[0].getMessage()
    # Off the CPU the CPU's flags do not matter.
    assert backend.resolve_precision("bf16", "cuda") == "bf16"
    assert backend.resolve_precision("fp32", "cpu") == "fp32"


def test_int8_kept_on_a_cpu_with_int8_dot_products_and_refused_off_the_cpu(monkeypatch, caplog):
    _fake(monkeypatch, True)
    with caplog.at_level(logging.WARNING, logger="subquad.backend"):
        assert backend.resolve_precision("int8", "cpu") == "int8"
    assert not caplog.records
    with pytest.raises(UserError, match="int8 runs on the CPU only"):
        backend.resolve_precision("int8", "cuda")


def test_int8_falls_back_to_fp32_with_one_warning(monkeypatch, caplog):
    _fake(monkeypatch, False)
    with caplog.at_level(logging.WARNING, logger="subquad.backend"):
        got = [backend.resolve_precision("int8", "cpu") for _ in range(3)]
        backend.resolve_precision("bf16", "cpu")
    assert got == ["fp32"] * 3
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 2 and "int8 dot products" in msgs[0] and "bf16" in msgs[1]


def test_precision_model_converts_for_int8_only():
    from subquad.layers.int8 import Int8DynamicLinear, precision_model

    m = torch.nn.Sequential(torch.nn.Linear(4, 3))
    assert precision_model(m, "fp32") is m and precision_model(m, "bf16") is m
    q = precision_model(m, "int8")
    assert q is not m and isinstance(q[0], Int8DynamicLinear) and type(m[0]) is torch.nn.Linear
    with pytest.raises(UserError):
        precision_model(m, "fp16")


@pytest.mark.parametrize("bad", ["fp16", "int4", "BF16", ""])
def test_unknown_precision_is_one_line_user_error(bad):
    with pytest.raises(UserError, match="choose one of fp32, bf16, int8") as e:
        backend.resolve_precision(bad)
    assert "\n" not in str(e.value)


def test_precision_context_autocasts_bf16_only():
    a, b = torch.randn(3, 5), torch.randn(5, 2)
    with backend.precision_context("bf16", "cpu"):
        assert (a @ b).dtype == torch.bfloat16
    for name in ("fp32", "int8"):
        with backend.precision_context(name, "cpu"):
            assert (a @ b).dtype == torch.float32
    with pytest.raises(UserError):
        backend.precision_context("fp64")


ARM_NO_DOT = "processor\t: 0\nFeatures\t: fp asimd\n"
SKYLAKE_SP = "flags\t\t: fpu sse4_1 avx2 avx512f avx512bw avx512vl\n"  # AVX-512 before VNNI


@pytest.mark.parametrize("machine, text, saturates", [("x86_64", ZEN3, True), ("x86_64", ZEN4, False),
                                                      ("AMD64", SPR, False), ("aarch64", ARM, False),
                                                      ("aarch64", ARM_NO_DOT, False), ("i686", ZEN3, True),
                                                      ("x86_64", SKYLAKE_SP, True)])
def test_int8_saturates(machine, text, saturates):
    """uint8 x int8 products saturate on x86 without VNNI / AMX-INT8 (vpmaddubsw's 16-bit pairs) only."""
    assert backend.int8_saturates(machine, backend.parse_cpu_flags(text)) is saturates


def test_int8_saturates_reads_this_machine():
    import platform

    assert backend.int8_saturates() is backend.int8_saturates(platform.machine(), backend.cpu_features())
