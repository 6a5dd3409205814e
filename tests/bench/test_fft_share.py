"""benchmarks/fft_share.py: the FFT share of a LiSA model's step and the Amdahl bounds it sets."""

from __future__ import annotations

import csv

import pytest

from subquad.errors import UserError

from ._scripts import load_benchmark


def test_rows_bounds_and_refusals(tmp_path):
    share = load_benchmark("fft_share")
    out = tmp_path / "f.csv"
    argv = ["--model", "lisanet_micro", "--img-size", "64", "40", "--rounds", "1", "--threads", "1", "--out", str(out)]
    assert share.main(argv) == 0
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == share.COLUMNS
    assert [(r["model"], r["img_size"]) for r in rows] == [("lisanet_micro", "64"), ("lisanet_micro", "40")]
    for r in rows:
        fp32, fft = float(r["fp32_ms"]), float(r["fft_ms_fp32"])
        assert 0 < fft < fp32  # a LiSA model runs FFTs, and they are not all of its step
        assert float(r["fft_share_fp32"]) == pytest.approx(fft / fp32, abs=1e-3)
        assert float(r["bound_vs_fp32_eager"]) == pytest.approx(fp32 / fft, rel=1e-2)
        assert float(r["bound_vs_fp32_eager"]) > 1
        assert float(r["dft_vs_fft_fp32"]) == pytest.approx(float(r["dft_fp32_ms"]) / fp32, rel=1e-2)
    assert {r["bf16_fft"] for r in rows} == {str(int(share.bf16_fft_supported()))}
    with pytest.raises(UserError, match="exists"):
        share.main(argv)
    with pytest.raises(UserError, match="positive"):
        share.main(argv[:-1] + [str(tmp_path / "new.csv")] + ["--rounds", "0"])


def test_fft_fraction_sees_ffts_and_only_them():
    import torch

    share = load_benchmark("fft_share")

    class Spectral(torch.nn.Module):
        def forward(self, x):
            return torch.fft.irfft2(torch.fft.rfft2(x), s=x.shape[-2:])

    x = torch.randn(1, 3, 256, 256)
    assert share.fft_fraction(Spectral(), x, bf16=False) > 0.2
    assert share.fft_fraction(torch.nn.Conv2d(3, 3, 3), x, bf16=False) == 0.0


def test_bounds_arithmetic():
    """Worked by hand: a 100 ms fp32 step with 20 ms of FFTs, 70 ms in bf16 with 25 ms of FFTs."""
    share = load_benchmark("fft_share")
    b = share.bounds(100.0, 70.0, 20.0, 25.0)
    assert b["fft_share_fp32"] == 0.2 and b["bound_vs_fp32_eager"] == 5.0
    assert b["rest_speedup_bf16"] == round(80 / 45, 3)  # the rest: 80 ms in fp32, 45 ms in bf16
    assert b["rest_speedup_needed"] == round(80 / (100 / 1.5 - 20), 3)  # 1.5x leaves 46.7 ms for the rest
    assert share.bounds(100.0, 70.0, 70.0, 70.0)["rest_speedup_needed"] == "inf"  # FFTs alone exceed 66.7 ms
    assert share.bounds(100.0, 70.0, 70.0, 70.0)["rest_speedup_bf16"] == "inf"
    assert share.bounds(100.0, 70.0, 0.0, 0.0)["bound_vs_fp32_eager"] == "inf"
