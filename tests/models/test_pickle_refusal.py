"""Library loading of a checkpoint that is not plain tensors: refused with the project's message, no code run."""

from __future__ import annotations

import pickle

import pytest

from subquad.errors import UserError
from subquad.models._builder import read_state_dict


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, ("touch EVIL_MARKER",))


def test_read_state_dict_refuses_code_without_torchs_advice(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pth"
    with open(path, "wb") as f:
        pickle.dump({"state_dict": _Evil()}, f)
    with pytest.raises(UserError) as e:
        read_state_dict(path)
    msg = str(e.value)
    assert "cannot be loaded safely" in msg and "weights_only=False" not in msg and "safetensors" in msg
    assert not (tmp_path / "EVIL_MARKER").exists()
