"""benchmarks/attention_share.py: the core-free stand-in and the CSV it writes."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import timm
import torch

from tests.bench._scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    return load_benchmark("attention_share")


def test_free_core_skips_only_the_core_and_restores():
    bench = _bench()
    m = timm.create_model("swin_tiny_patch4_window7_224", img_size=64, window_size=2, depths=(1, 1, 1, 1),
                          embed_dim=16, num_heads=(1, 1, 1, 1)).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        y = m(x)
        with bench.free_core(m) as n:
            assert n == 4
            y_free = m(x)
            # The stand-in is proj(v): check one block's attention against that formula.
            attn = m.layers[0].blocks[0].attn
            t = torch.randn(3, 4, 16)
            assert torch.allclose(attn(t), attn.proj(attn.qkv(t)[..., 32:]))
        assert y_free.shape == y.shape and not torch.allclose(y_free, y)
        assert torch.equal(m(x), y)  # restored


def test_main_writes_csv_and_refuses_foreign_file(tmp_path, monkeypatch):
    bench = _bench()
    calls = []

    def fake_measure(ours, baseline, size, batch_size, rounds):
        calls.append((ours, baseline, size))
        return {"model": ours, "baseline": baseline, "img_size": size, "batch_size": batch_size, "ours_ms": 1.0,
                "baseline_ms": 2.0, "baseline_no_core_ms": 1.5, "speedup": 2.0, "core_share": 0.25,
                "amdahl_bound": 1.333, "threads": 1, "device": "cpu", "torch": torch.__version__}

    monkeypatch.setattr(bench, "measure", fake_measure)
    out = tmp_path / "share.csv"
    assert bench.main(["--img-size", "224", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert calls == [("flatten_swin_tiny", "swin_tiny_patch4_window7_224", 224)]
    assert rows[0]["amdahl_bound"] == "1.333"
    assert bench.main(["--img-size", "224", "--out", str(out)]) == 0  # an earlier output may be replaced
    foreign = tmp_path / "notes.csv"
    foreign.write_text("a,b\n1,2\n")
    with pytest.raises(Exception, match="not an earlier"):
        bench.main(["--out", str(foreign)])
    assert foreign.read_text() == "a,b\n1,2\n"


@pytest.mark.parametrize("argv,msg", [(["--rounds", "0"], "--rounds must be >= 1, got 0"),
                                      (["--img-size", "224", "8"], "--img-size must be >= 32, got 8")])
def test_bad_flags_one_line(argv, msg, capsys):
    with pytest.raises(SystemExit) as e:
        _bench().main(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err
