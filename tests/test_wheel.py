"""The wheel works outside the source tree.

`test_wheel_installed_outside_the_source_tree` (slow) builds the wheel from a copy of the sources, installs it
(non-editable) into a fresh virtual environment that borrows this environment's dependencies through a .pth file
(nothing is downloaded), and runs, from another directory: `subquad models`, `import subquad; timm.create_model`,
`subquad analyze` on the bundled image, `subquad train --data digits` (1 epoch) and `subquad arena run --task fmnist
--budget quick` (its YAML from the wheel; Fashion-MNIST from generated IDX files when the Debian package is absent).

The default suite checks the cheap part: every data file the package reads is declared as package data.
"""

from __future__ import annotations

import fnmatch
import gzip
import os
import shutil
import struct
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as pip vendors it
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _package_data_globs() -> list[str]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return cfg["tool"]["setuptools"]["package-data"]["subquad"]


def test_every_data_file_is_package_data():
    """A non-Python file under subquad/ that no package-data glob covers would be missing from the wheel."""
    globs = _package_data_globs()
    pkg = ROOT / "subquad"
    data = [p.relative_to(pkg).as_posix() for p in pkg.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert data, "expected the recipes and the sample image under subquad/"
    # setuptools' '**' also matches zero folders: configs/**/*.yaml covers configs/x.yaml and configs/a/b.yaml.
    missing = [f for f in data if not any(fnmatch.fnmatch(f, g) or fnmatch.fnmatch(f, g.replace("**/", ""))
                                          for g in globs)]
    assert missing == [], f"not declared as package data in pyproject.toml: {missing}"


def _write_idx(path: Path, array: np.ndarray) -> None:
    """An IDX file as the Fashion-MNIST release has them (big-endian magic 0x08 0x<ndim>, dims, uint8 data)."""
    head = struct.pack(">I", 0x0800 | array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(head + array.astype(np.uint8).tobytes())


def _fake_fashion_mnist(root: Path, train_per_class: int = 520, test_per_class: int = 10) -> Path:
    """Class-dependent 28 x 28 images in the release's four IDX files (val holds out 500 training images a class)."""
    rng = np.random.RandomState(0)
    root.mkdir(parents=True)
    for _split, n, stem in (("train", train_per_class, "train"), ("test", test_per_class, "t10k")):
        labels = np.repeat(np.arange(10), n)
        images = rng.randint(0, 60, size=(len(labels), 28, 28))
        for c in range(10):
            images[labels == c, 2 * c: 2 * c + 6, :] += 150
        _write_idx(root / f"{stem}-images-idx3-ubyte.gz", images)
        _write_idx(root / f"{stem}-labels-idx1-ubyte.gz", labels)
    return root


def _venv_with_wheel(tmp: Path) -> Path:
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    for package in ("subquad", "subquad_cli"):  # the library and its command line
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp / "dist"
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", str(src), "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(dist)],
                   check=True, capture_output=True, text=True, timeout=600)
    (wheel,) = dist.glob("subquad-*-py3-none-any.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    # The dependencies (torch, timm, ...) come from this environment; a .pth adds its site-packages after the
    # venv's own, without running that folder's .pth files (so an editable subquad there stays invisible).
    shared = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(purelib, "_shared_site.pth").write_text("\n".join(sorted(shared)) + "\n")
    subprocess.run([*pip, "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)], check=True,
                   capture_output=True, text=True, timeout=600)
    return venv


@pytest.mark.slow
def test_wheel_installed_outside_the_source_tree(tmp_path):
    venv = _venv_with_wheel(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    data = tmp_path / "data"
    fmnist = _fake_fashion_mnist(data / "fashion-mnist")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", SUBQUAD_CACHE=str(tmp_path / "cache"), SUBQUAD_DATA=str(data),
               SUBQUAD_FASHION_MNIST_DIR=str(fmnist), MPLBACKEND="Agg")
    subquad = str(venv / "bin" / "subquad")

    def run(*cmd: str) -> str:
        r = subprocess.run(cmd, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        return r.stdout + r.stderr

    out = run(str(venv / "bin" / "python"), "-c",
              "import subquad, timm, torch, importlib.metadata as md; "
              "m = timm.create_model('l2vit_micro', num_classes=10); "
              "print(subquad.__file__, md.version('subquad'), tuple(m(torch.randn(1, 3, 32, 32)).shape))")
    where, version, shape = out.split(maxsplit=2)
    assert Path(where).is_relative_to(venv) and version == __import__("subquad").__version__, out
    assert shape.strip() == "(1, 10)"

    assert "l2vit_tiny" in run(subquad, "models", "--no-count", "--filter", "l2vit")

    run(subquad, "analyze", "--model", "l2vit_micro", "--out", "analysis")  # the bundled image
    assert (elsewhere / "analysis" / "layer_stats.csv").is_file()

    run(subquad, "train", "--model", "l2vit_micro", "--data", "digits", "--img-size", "16", "--epochs", "1",
        "--log-interval", "0", "--output", "run")
    assert (elsewhere / "run" / "best.safetensors").is_file()

    run(subquad, "arena", "run", "--task", "fmnist", "--budget", "quick", "--attention", "softmax", "--seeds", "0",
        "--out", "arena")
    assert (elsewhere / "arena" / "leaderboard.csv").is_file()
    assert not list(elsewhere.glob("**/subquad/configs"))  # recipes were read from the installed package
