"""benchmarks/lisa_idft.py: LiSA's inverse FFTs against the same inverse DFT as two bf16 GEMMs."""

from __future__ import annotations

import csv

import pytest
import torch

from subquad.errors import UserError
from tests._tol import assert_close

from ._scripts import load_benchmark


@pytest.mark.parametrize("side,count", [(5, 3), (6, 2), (1, 4)])
def test_gemm_form_is_the_inverse_dft(side, count):
    """Both GEMM forms equal torch's inverse FFT (fp32 to fp32 tolerance, bf16 to bf16's), odd and even sides."""
    idft = load_benchmark("lisa_idft")
    g = torch.Generator().manual_seed(side)
    spec = torch.complex(torch.randn(count, side, side, generator=g), torch.randn(count, side, side, generator=g))
    ref = torch.view_as_real(torch.fft.ifftn(spec.to(torch.complex128), dim=(-2, -1)))
    for dtype in (torch.float32, torch.bfloat16):
        got = torch.view_as_real(idft.GemmIdft(count, side, dtype).as_complex(spec))
        assert_close(got, ref, dtype, f"GEMM inverse DFT in {dtype}")


def test_rows_and_refusals(tmp_path, monkeypatch):
    idft = load_benchmark("lisa_idft")
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # --threads 1 must not outlive the test
    out = tmp_path / "i.csv"
    argv = ["--cases", "7x3", "4x2", "--rounds", "1", "--threads", "1", "--out", str(out)]
    assert idft.main(argv) == 0
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == idft.COLUMNS
    assert [(r["grid"], r["transforms"]) for r in rows] == [("7x7", "3"), ("4x4", "2")]
    for r in rows:
        assert float(r["gemm_bf16_vs_fft"]) == pytest.approx(float(r["fft_ms"]) / float(r["gemm_bf16_ms"]), rel=2e-2)
        assert 0 < float(r["bf16_rel_err"]) < 2e-2  # bf16 rounding, not a wrong transform
        assert float(r["fft_faults"]) >= 0
    with pytest.raises(UserError, match="exists"):
        idft.main(argv)
    new = str(tmp_path / "new.csv")
    for bad in ("7", "\u00b2x3", "0x3"):
        with pytest.raises(UserError, match="SIDExTRANSFORMS"):
            idft.main(["--cases", bad, "--out", new])
    with pytest.raises(UserError, match="positive"):
        idft.main(["--threads", "0", "--out", new])
    with pytest.raises(UserError, match="positive"):
        idft.main(["--rounds", "0", "--out", new])
