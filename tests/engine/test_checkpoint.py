from __future__ import annotations

import pickle

import pytest
import torch
from safetensors.torch import load_file

from subquad.engine import checkpoint as ck
from subquad.errors import UserError


def test_crash_mid_write_leaves_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.safetensors"
    old = {"w": torch.arange(6.0).reshape(2, 3)}
    ck.save_weights(old, path, {"epoch": "0"})
    import safetensors.torch as st

    def crash(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(st, "save_file", crash)
    with pytest.raises(OSError, match="disk full"):
        ck.save_weights({"w": torch.zeros(2, 3)}, path, {"epoch": "1"})
    torch.testing.assert_close(load_file(str(path))["w"], old["w"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.safetensors"]


def test_crash_mid_json_and_state_writes(tmp_path, monkeypatch):
    ck.write_json({"epoch": 0}, tmp_path / "last.json")
    ck.save_state({"epoch": 0, "t": torch.ones(2)}, tmp_path / "last_state.pth")

    def boom(*a, **k):
        raise RuntimeError("killed")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(RuntimeError):
        ck.save_state({"epoch": 1}, tmp_path / "last_state.pth")
    assert ck.load_state(tmp_path / "last_state.pth")["epoch"] == 0
    monkeypatch.setattr(ck.json, "dump", boom)
    with pytest.raises(RuntimeError):
        ck.write_json({"epoch": 1}, tmp_path / "last.json")
    assert ck.read_json(tmp_path / "last.json") == {"epoch": 0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.json", "last_state.pth"]


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, ("touch EVIL_MARKER",))


def test_state_loader_refuses_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open(tmp_path / "evil.pth", "wb") as f:
        pickle.dump({"optimizer": _Evil()}, f)
    with pytest.raises(UserError, match="refusing to load"):
        ck.load_state(tmp_path / "evil.pth")
    assert not (tmp_path / "EVIL_MARKER").exists()
    with pytest.raises(UserError, match="not found"):
        ck.load_state(tmp_path / "missing.pth")
