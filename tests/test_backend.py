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


_FAULTS_SCRIPT = """
import resource, sys, torch
from subquad.backend import keep_freed_memory, keep_freed_memory_from_env, kept_freed_memory
applied = keep_freed_memory_from_env(default_mib=0)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(2):
    torch.ones(48 << 18); torch.ones(10 << 18)
f0 = faults()
for _ in range(5):
    torch.ones(48 << 18); torch.ones(10 << 18)  # 48 and 10 MiB, touched and freed
print(applied, kept_freed_memory(), (faults() - f0) / 5, resource.getpagesize())
"""


def _faults_run(mib: str) -> tuple[str, str, float, int]:
    import os

    env = dict(os.environ, SUBQUAD_KEEP_FREED_MIB=mib)
    out = subprocess.run([sys.executable, "-c", _FAULTS_SCRIPT], env=env, capture_output=True, text=True, check=True)
    applied, kept, faults, page = out.stdout.split()
    return applied, kept, float(faults), int(page)


def test_keep_freed_memory_stops_refaulting_large_blocks_on_glibc():
    """With glibc's defaults a 48 MiB block is mmapped, and every allocation faults its pages in again (12,288 of
    4 KiB; counted with the page size the system reports);
    keep_freed_memory (here from SUBQUAD_KEEP_FREED_MIB, in fresh processes) keeps the freed memory for reuse.
    Elsewhere than glibc it reports that it did nothing."""
    import os

    glibc = bool(os.confstr("CS_GNU_LIBC_VERSION"))
    default, kept = _faults_run("0"), _faults_run("256")
    assert default[:2] == ("False", "0")
    if not glibc:
        assert kept[:2] == ("False", "0")
        return
    assert kept[:2] == ("True", str(256 * 2 ** 20))
    pages = (48 << 20) // default[3]
    assert default[2] > 0.8 * pages, f"glibc's defaults did not refault the 48 MiB block ({pages} pages): {default}"
    # kept: 0 faults per step, or 512 (one 2 MiB range) in about half of the processes on the 2-core AMD EPYC
    assert kept[2] < 0.1 * pages, f"freed memory was faulted in again with keep_freed_memory: {kept}"


@pytest.mark.parametrize("bad", [-1, 1.5, True, "256"])
def test_keep_freed_memory_refuses_what_is_not_a_byte_count(bad):
    with pytest.raises(UserError, match="whole number of bytes"):
        backend.keep_freed_memory(bad)
    assert backend.keep_freed_memory(0) is False


@pytest.mark.parametrize("raw", ["abc", "-5", "1.5", "\u0663", "\u00b2"])  # an Arabic-Indic 3, a superscript 2
def test_keep_freed_mib_variable_is_checked(monkeypatch, raw):
    monkeypatch.setenv("SUBQUAD_KEEP_FREED_MIB", raw)
    with pytest.raises(UserError, match=f"SUBQUAD_KEEP_FREED_MIB={raw!r}"):
        backend.keep_freed_memory_from_env()
    monkeypatch.setenv("SUBQUAD_KEEP_FREED_MIB", "0")
    assert backend.keep_freed_memory_from_env() is False
