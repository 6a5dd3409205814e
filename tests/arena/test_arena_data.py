"""The arena without Fashion-MNIST: each cell ends with the one line that says how to get the data."""

from __future__ import annotations

import pytest

from subquad.data.fashion_mnist import ENV_DIR
from subquad_cli.__main__ import main


@pytest.mark.slow  # the cell subprocess imports torch: about 15 s alone, a minute on a loaded machine
def test_fmnist_without_the_data_says_how_to_get_it(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv(ENV_DIR, str(empty))  # the cells run in subprocesses: the variable reaches them
    out = tmp_path / "arena"
    assert main(["arena", "run", "--task", "fmnist", "--attention", "softmax", "--seeds", "0", "--budget", "quick",
                 "--out", str(out)]) != 0
    text = capsys.readouterr().out
    failed = [ln for ln in text.splitlines() if "FAILED softmax seed 0" in ln]
    assert len(failed) == 1, text
    line = failed[0]
    assert f"{ENV_DIR}={empty} holds none of the Fashion-MNIST files train-images-idx3-ubyte.gz" in line
    assert "apt-get install dataset-fashion-mnist" in line and "Traceback" not in text
