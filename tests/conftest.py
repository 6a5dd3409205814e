"""Test environment: seed 0, few threads (CI has 2 cores; xdist runs 2 workers), markers, official-code root."""

from __future__ import annotations

import os

import pytest
import torch

# Two xdist workers share the 2 cores: one thread each; a plain run uses both.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def official_root():
    """Path of official checkouts (SUBQUAD_OFFICIAL_ROOT); tests that need it are marked `parity`."""
    root = os.environ.get("SUBQUAD_OFFICIAL_ROOT")
    if not root:
        pytest.skip("SUBQUAD_OFFICIAL_ROOT is not set (parity tests need the official repositories)")
    return root
