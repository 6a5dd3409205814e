"""The schedule dispatch point (subquad.backend): decisions per device and override, asked without a GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import subquad.layers.mlp as mlp_mod
from subquad import backend
from subquad.attention.functional.structure_aware import lisa_fft, plan_tiles
from subquad.errors import UserError


def test_auto_picks_cpu_schedules_on_cpu_only():
    assert backend.get_backend() == "auto"
    assert backend.schedule("cpu") == "cpu"
    assert backend.schedule(torch.device("cuda", 0)) == "plain"
    assert backend.schedule("mps") == "plain"
    with torch.no_grad():
        assert mlp_mod._chunked(10 ** 9, "cpu")
        assert not mlp_mod._chunked(10 ** 9, torch.device("cuda"))


@pytest.mark.parametrize("name, cpu, cuda", [("cpu", "cpu", "cpu"), ("plain", "plain", "plain"),
                                             ("auto", "cpu", "plain")])
def test_override_and_restore(name, cpu, cuda):
    with backend.use_backend(name):
        assert (backend.schedule("cpu"), backend.schedule("cuda")) == (cpu, cuda)
    assert backend.get_backend() == "auto"


_SEEN: list[str] = []


class _Probe(torch.nn.Module):
    def forward(self, x):
        _SEEN.append(backend.schedule(x.device))
        return x + 1


def test_plain_while_tracing():
    _SEEN.clear()
    torch.export.export(_Probe(), (torch.ones(2),), strict=False)
    _Probe()(torch.ones(2))
    assert _SEEN == ["plain", "cpu"]


def test_unknown_backend_is_one_line():
    with pytest.raises(UserError, match="unknown backend 'gpu'; choose one of auto, cpu, plain"):
        backend.set_backend("gpu")
    r = subprocess.run([sys.executable, "-c", "import subquad.backend as b; print(b.get_backend())"],
                       env={"SUBQUAD_BACKEND": "plain", "PATH": ""}, capture_output=True, text=True)
    assert r.stdout.strip() == "plain", r.stderr


def test_lisa_plain_schedule_equals_cpu_tiles_and_uses_one_tile():
    torch.manual_seed(0)
    B, h, dh, D, grid = 2, 3, 5, 6, (5, 7)
    N = grid[0] * grid[1]
    q, k, v = (torch.randn(B, h, N, dh, dtype=torch.float64) for _ in range(3))
    ka = torch.randn(h * dh, D, *grid, dtype=torch.float64)
    kb = torch.randn(h, D, *grid, dtype=torch.float64)
    bp = torch.randn(h * dh, D, dtype=torch.float64)
    assert plan_tiles(B, h, dh, D, N, None, tile_elems=64) != (h, D)  # the CPU schedule tiles at this budget
    with torch.no_grad():
        tiled = lisa_fft(q, k, v, ka, kb, bp, grid, tile_elems=64)
        with backend.use_backend("plain"):
            plain = lisa_fft(q, k, v, ka, kb, bp, grid, tile_elems=64)
    torch.testing.assert_close(plain, tiled, rtol=1e-12, atol=1e-12)


def test_banded_mlp_keeps_the_autocast_dtype(monkeypatch):
    monkeypatch.setattr(mlp_mod, "CHUNK_ELEMS", 40)
    m = mlp_mod.ConvMlp(4, 8).eval()
    f = mlp_mod.Mlp(4, 8).eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for hw in [(2, 2), (9, 7)]:  # plain (one band) and banded
            x = torch.randn(2, hw[0] * hw[1], 4)
            assert m(x, hw).dtype == torch.bfloat16
            assert f(x).dtype == torch.bfloat16


@pytest.mark.parametrize("name", ["plain", "cpu"])
def test_lisa_each_schedule_matches_the_reference_outputs_and_gradients(name):
    from subquad.attention.functional.structure_aware import lisa_circulant_ref
    from tests._tol import compare_fn

    torch.manual_seed(1)
    B, h, dh, D, grid = 2, 2, 3, 5, (3, 5)  # odd head dim and D, odd non-square grid
    N = grid[0] * grid[1]
    ops = [torch.randn(B, h, N, dh), torch.randn(B, h, N, dh), torch.randn(B, h, N, dh),
           torch.randn(h * dh, D, *grid), torch.randn(h, D, *grid), torch.randn(h * dh, D)]
    with backend.use_backend(name):
        compare_fn(lambda *a: lisa_fft(*a, grid, tile_elems=16), lambda *a: lisa_circulant_ref(*a, grid), ops,
                   torch.float64)
