"""timm interoperability: checkpoints of timm's train.py load in `subquad eval` / `predict` with the accuracy of a
validate.py-shaped script, and `subquad timm SCRIPT` runs timm's scripts with subquad's models registered."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from subquad_cli.__main__ import main

# A script shaped like timm's validate.py (which is not in the wheel) run with --no-prefetcher: create_model, then
# timm's load_checkpoint (as validate.py does for --checkpoint / --use-ema), resolve_data_config + create_transform
# for the eval transform, and timm's accuracy.
VALIDATE = textwrap.dedent('''
    import argparse, json

    import torch
    from timm.data import create_dataset, create_transform, resolve_data_config
    from timm.models import create_model
    from timm.utils import accuracy

    p = argparse.ArgumentParser()
    p.add_argument("--data-dir")
    p.add_argument("--split", default="val")
    p.add_argument("--model")
    p.add_argument("--checkpoint")
    p.add_argument("--num-classes", type=int)
    p.add_argument("--img-size", type=int, default=None)
    p.add_argument("--use-ema", action="store_true")
    p.add_argument("--out")
    args = p.parse_args()
    model = create_model(args.model, num_classes=args.num_classes)
    from timm.models import load_checkpoint
    load_checkpoint(model, args.checkpoint, use_ema=args.use_ema)
    model.eval()
    cfg = resolve_data_config(vars(args), model=model)
    ds = create_dataset("", root=args.data_dir, split=args.split, transform=create_transform(**cfg))
    loader = torch.utils.data.DataLoader(ds, batch_size=7)
    n = top1 = loss = 0.0
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            loss += torch.nn.functional.cross_entropy(out, y, reduction="sum").item()
            top1 += accuracy(out, y, topk=(1,))[0].item() * len(y)
            n += len(y)
    json.dump({"top1": top1 / n, "loss": loss / n, "images": n}, open(args.out, "w"))
''')

# timm numbers folder classes in natural order (c2 before c10), subquad in sorted order (c10 before c2): eval must
# score a timm checkpoint by timm's numbering.
CLASSES = ("c1", "c2", "c10")


def _image_folder(root: Path) -> Path:
    """train/ and val/ of three digit classes, as 40 x 36 PNGs (non-square: the eval resize and crop matter)."""
    from PIL import Image

    from subquad.data.small import digits_arrays

    images, labels = digits_arrays()["train"]
    counts = {"train": 10, "val": 7}
    for c, _ in enumerate(CLASSES):
        idx = [i for i, lab in enumerate(labels) if lab == c]
        k = 0
        for split, n in counts.items():
            d = root / split / CLASSES[c]
            d.mkdir(parents=True)
            for _ in range(n):
                Image.fromarray(images[idx[k]], mode="L").resize((40, 36), Image.BILINEAR).save(d / f"{k:03d}.png")
                k += 1
    return root


@pytest.fixture(scope="module")
def timm_run(tmp_path_factory):
    """One epoch of l2vit_micro at 32 px trained with timm's pieces and saved by timm's CheckpointSaver, exactly as
    timm's train.py saves (args = argparse.Namespace, state_dict, state_dict_ema, optimizer, arch, epoch, ...)."""
    from timm.data import create_dataset, create_transform
    from timm.models import create_model
    from timm.optim import create_optimizer_v2
    from timm.utils import CheckpointSaver, ModelEmaV3

    tmp = tmp_path_factory.mktemp("timmrun")
    data = _image_folder(tmp / "data")
    torch.manual_seed(0)
    model = create_model("l2vit_micro", num_classes=len(CLASSES))
    ema = ModelEmaV3(model, decay=0.5)
    opt = create_optimizer_v2(model, "adamw", lr=3e-3, weight_decay=0.0)
    ds = create_dataset("", root=str(data), split="train", transform=create_transform(32, is_training=False))
    model.train()
    for x, y in torch.utils.data.DataLoader(ds, batch_size=10, shuffle=True):  # one epoch
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ema.update(model)
    args = argparse.Namespace(model="l2vit_micro", num_classes=len(CLASSES), img_size=32, input_size=None,
                              in_chans=None, mean=None, std=None, crop_pct=None, interpolation="", data_dir=str(data),
                              dataset="", model_kwargs={}, epochs=1, lr=3e-3)
    out = tmp / "output"
    out.mkdir()
    saver = CheckpointSaver(model, opt, args=args, model_ema=ema, checkpoint_dir=str(out), recovery_dir=str(out),
                            decreasing=False, max_history=1)
    saver.save_checkpoint(0, metric=50.0)
    best = out / "model_best.pth.tar"
    assert best.is_file() and (out / "checkpoint-0.pth.tar").is_file()
    return data, best


def _validate(tmp_path, data, ckpt, *extra) -> dict:
    script = tmp_path / "validate.py"
    script.write_text(VALIDATE)
    res = tmp_path / "timm_val.json"
    assert main(["timm", str(script), "--data-dir", str(data), "--model", "l2vit_micro", "--num-classes",
                 str(len(CLASSES)), "--img-size", "32", "--checkpoint", str(ckpt), "--out", str(res), *extra]) == 0
    return json.loads(res.read_text())


def _eval(tmp_path, ckpt, name, *extra) -> dict:
    res = tmp_path / f"{name}.json"
    assert main(["eval", "--checkpoint", str(ckpt), "--split", "val", "--device", "cpu", "--results-file", str(res),
                 *extra]) == 0
    return json.loads(res.read_text())


def test_timm_checkpoint_holds_a_namespace(timm_run):
    """The file really is in the format that `torch.load(weights_only=True)` alone refuses."""
    import pickle

    with pytest.raises(pickle.UnpicklingError):
        torch.load(timm_run[1], weights_only=True)


@pytest.mark.parametrize("ema", [False, True])
def test_eval_of_timm_checkpoint_matches_timm_validation(timm_run, tmp_path, ema):
    data, best = timm_run
    extra = ("--use-ema",) if ema else ()
    ref = _validate(tmp_path, data, best, *extra)
    # The model, the data (args.data_dir) and the 32 px eval transform all come from the checkpoint's args.
    ours = _eval(tmp_path, best, "ours", *extra)
    assert ours["images"] == ref["images"] == 21 and ours["img_size"] == 32 and ours["model"] == "l2vit_micro"
    assert ours["top1"] == pytest.approx(ref["top1"], abs=1e-3)
    assert ours["loss"] == pytest.approx(ref["loss"], rel=1e-4, abs=1e-5)


def test_ema_and_plain_weights_differ(timm_run, tmp_path):
    """The two loads above read different tensors (otherwise --use-ema would be untested)."""
    from subquad.engine.checkpoint import read_checkpoint

    sd, meta = read_checkpoint(timm_run[1])
    sd_ema, _ = read_checkpoint(timm_run[1], prefer_ema=True)
    assert meta["format"] == "timm" and meta["arch"] == "l2vit_micro" and meta["args"]["img_size"] == 32
    assert any(not torch.equal(sd[k], sd_ema[k]) for k in sd)


def test_ddp_and_compile_prefixes_are_stripped(timm_run, tmp_path):
    import pickle

    obj = torch.load(timm_run[1], weights_only=False)
    obj["state_dict"] = {("module._orig_mod." if i % 2 else "module.") + k: v
                         for i, (k, v) in enumerate(obj["state_dict"].items())}
    ddp = tmp_path / "ddp.pth.tar"
    torch.save(obj, ddp)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(ddp, weights_only=True)
    a = _eval(tmp_path, timm_run[1], "plain")
    b = _eval(tmp_path, ddp, "ddp")
    assert (a["top1"], a["loss"]) == (b["top1"], b["loss"])


def test_predict_reads_timm_checkpoint(timm_run, tmp_path, capsys):
    data, best = timm_run
    img = next((data / "val" / "c2").iterdir())
    assert main(["predict", "--checkpoint", str(best), str(img), "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith(f"{img}: ")


def test_timm_checkpoint_at_a_non_square_size_refused(timm_run, tmp_path, capsys):
    """timm's train.py checkpoints are evaluated at a square size here: HxW is refused in one line, unrun."""
    data, best = timm_run
    img = next((data / "val" / "c2").iterdir())
    assert main(["predict", "--checkpoint", str(best), str(img), "--img-size", "32x48", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "--img-size 32x48: a checkpoint of timm's train.py is evaluated at a square size here" in err
    assert "Traceback" not in err and not capsys.readouterr().out


def test_model_disagreeing_with_arch_refused(timm_run, capsys):
    assert main(["eval", "--checkpoint", str(timm_run[1]), "--model", "vit_attn_micro", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "'l2vit_micro'" in err and "arch" in err and "Traceback" not in err


def test_other_pickled_globals_still_refused(tmp_path, capsys):
    """Only argparse.Namespace is allowed: a checkpoint holding anything else is refused unrun."""
    obj = {"state_dict": {"w": torch.zeros(1)}, "args": Path("/x"), "epoch": 0}
    bad = tmp_path / "bad.pth.tar"
    torch.save(obj, bad)
    assert main(["eval", "--checkpoint", str(bad), "--model", "l2vit_micro", "--device", "cpu"]) == 2
    assert "refusing to load" in capsys.readouterr().err


ROOT = Path(__file__).resolve().parents[2]


def _run_cli(*args, cwd=None):
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "subquad", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=env)


def test_timm_command_runs_a_script_with_models_registered(tmp_path):
    """A fresh process: the script imports only timm, sees subquad's models, gets its argv and __main__, and its
    exit status is the command's."""
    script = tmp_path / "script.py"
    helper = tmp_path / "helper_mod.py"
    helper.write_text("VALUE = 'from the script folder'\n")
    script.write_text(textwrap.dedent('''
        import sys
        import timm
        import helper_mod

        print(__name__, sys.argv[1:], timm.is_model("l2vit_micro"), helper_mod.VALUE)
        sys.exit(int(sys.argv[-1]))
    '''))
    r = _run_cli("timm", str(script), "--model", "l2vit_micro", "--", "3", cwd=tmp_path.parent)
    assert r.returncode == 3, r.stderr
    assert r.stdout.strip() == "__main__ ['--model', 'l2vit_micro', '--', '3'] True from the script folder"


def test_timm_command_missing_script_one_line(tmp_path, capsys):
    assert main(["timm", str(tmp_path / "validate.py"), "--model", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "script not found" in err and "pytorch-image-models" in err


def test_eval_split_test_without_val_folder(timm_run, tmp_path):
    """Issue 24: `eval --split test` required a val/ folder."""
    import shutil

    data, best = timm_run
    folder = tmp_path / "data"
    shutil.copytree(data / "train", folder / "train")
    shutil.copytree(data / "val", folder / "test")
    res = tmp_path / "r.json"
    assert main(["eval", "--checkpoint", str(best), "--data", f"imagefolder:{folder}", "--split", "test",
                 "--device", "cpu", "--results-file", str(res)]) == 0
    row = json.loads(res.read_text())
    assert row["split"] == "test" and row["images"] == 21
    assert row["top1"] == _eval(tmp_path, best, "val")["top1"]  # the same images as val/ above
