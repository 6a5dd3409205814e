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


def _save_with_fake_yacs(path, obj_factory):
    """torch.save an object that holds a yacs CfgNode, with a stand-in `yacs.config` module that is gone on load."""
    import sys
    import types

    import torch

    mod, pkg = types.ModuleType("yacs.config"), types.ModuleType("yacs")
    pkg.config = mod

    class CfgNode(dict):  # what yacs' CfgNode is: a dict subclass with attributes of its own
        def __init__(self, d=None):
            super().__init__(d or {})
            self.__dict__["__immutable__"] = True

    CfgNode.__module__, CfgNode.__qualname__ = "yacs.config", "CfgNode"
    mod.CfgNode = CfgNode
    sys.modules.update({"yacs": pkg, "yacs.config": mod})
    try:
        torch.save(obj_factory(CfgNode), path)
    finally:
        del sys.modules["yacs"], sys.modules["yacs.config"]


def test_official_training_checkpoints_load_without_unpickling_code(tmp_path):
    """L2ViT's `save_model` stores `args` (argparse.Namespace); FLatten's Swin-style `save_checkpoint` stores `config`
    (a yacs CfgNode). Both are read with weights_only=True; the weights come out, nothing else is run."""
    import argparse

    import torch

    w = {"head.weight": torch.arange(6.0).reshape(2, 3)}
    l2vit = tmp_path / "l2vit.pth"
    torch.save({"model": w, "epoch": 299, "args": argparse.Namespace(model="L2ViT_Tiny", lr=1e-3)}, l2vit)
    flatten = tmp_path / "flatten.pth"
    _save_with_fake_yacs(flatten, lambda C: {"model": w, "max_accuracy": 82.1, "epoch": 299,
                                             "config": C({"MODEL": C({"TYPE": "swin"}), "TRAIN": C({"LR": 1e-3})})})
    for path in (l2vit, flatten):
        sd = read_state_dict(path)
        assert list(sd) == ["head.weight"] and torch.equal(sd["head.weight"], w["head.weight"]), path
    # Without the allowance these files are refused (what a user of the real releases hit).
    with pytest.raises(pickle.UnpicklingError):
        torch.load(flatten, weights_only=True)
    # Any other global is still refused.
    evil = tmp_path / "evil.pth"
    with open(evil, "wb") as f:
        pickle.dump({"model": w, "args": _Evil()}, f)
    with pytest.raises(UserError, match="cannot be loaded safely"):
        read_state_dict(evil)
