from __future__ import annotations

import json
import pickle

import pytest

from subquad.data.small import save_digits_image
from subquad_cli.__main__ import main


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("evalrun") / "run"
    assert main(["train", "--model", "vit_attn_micro", "--data", "digits", "--img-size", "16", "--train-limit", "128",
                 "--eval-limit", "64", "-b", "32", "--epochs", "1", "--log-interval", "0", "--device", "cpu",
                 "--output", str(out)]) == 0
    return out


def _err_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("subquad")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_eval_prints_and_writes_json(run_dir, tmp_path, capsys):
    res = tmp_path / "res.json"
    assert main(["eval", "--model", "vit_attn_micro", "--checkpoint", str(run_dir / "best.safetensors"),
                 "--data", "digits", "--limit", "100", "--results-file", str(res), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "top-1" in out and "top-5" in out and "loss" in out
    row = json.loads(res.read_text())
    assert row["images"] == 100 and 0 <= row["top1"] <= row["top5"] <= 100 and row["img_size"] == 16
    assert row["model"] == "vit_attn_micro" and row["loss"] > 0


def test_eval_matches_training_metrics(run_dir, capsys):
    side = json.loads((run_dir / "best.json").read_text())
    res = run_dir / "check.json"
    # Training selected on the val split; its metrics are reproduced there.
    assert main(["eval", "--model", "vit_attn_micro", "--checkpoint", str(run_dir / "best.safetensors"),
                 "--limit", "64", "--split", "val", "--results-file", str(res), "--device", "cpu"]) == 0
    assert json.loads(res.read_text())["top1"] == pytest.approx(side["metrics"]["eval_top1"], abs=1e-3)
    # The test split, read once at the end of training, gives the run's results.json.
    res_test = run_dir / "check_test.json"
    assert main(["eval", "--model", "vit_attn_micro", "--checkpoint", str(run_dir / "best.safetensors"),
                 "--results-file", str(res_test), "--device", "cpu"]) == 0
    final = json.loads((run_dir / "results.json").read_text())
    assert final["split"] == "test"
    assert json.loads(res_test.read_text())["top1"] == pytest.approx(final["top1"], abs=1e-3)


def test_predict_top5_with_class_names(run_dir, tmp_path, capsys):
    img = tmp_path / "d.png"
    save_digits_image(img, 3)
    assert main(["predict", "--model", "vit_attn_micro", "--checkpoint", str(run_dir / "best.safetensors"), str(img),
                 str(img), "--device", "cpu", "--json", str(tmp_path / "p.json")]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(str(img))]
    assert len(lines) == 2 and lines[0].count("%)") == 5
    top = json.loads((tmp_path / "p.json").read_text())[0]["top"]
    assert len(top) == 5 and all(t["class"] in [str(i) for i in range(10)] for t in top)
    assert abs(sum(t["prob"] for t in top) - 1) < 1 and top[0]["prob"] >= top[-1]["prob"]


def test_eval_and_predict_at_a_non_square_size(run_dir, tmp_path, capsys):
    """`--img-size HxW`: the model (trained at 16 x 16) runs on 16 x 24 inputs, the eval transform makes them, the
    results say 16x24, and a square HxW is the side S."""
    from PIL import Image

    from subquad.engine.checkpoint import load_checkpointed_model
    from subquad.engine.classify import eval_transform

    ckpt = str(run_dir / "best.safetensors")
    _, model, _, dcfg, _ = load_checkpointed_model(ckpt, None, (16, 24))
    assert tuple(dcfg["img_size"]) == (16, 24)
    x = eval_transform(dcfg)(Image.new("L" if dcfg["in_chans"] == 1 else "RGB", (40, 30)))
    assert tuple(x.shape[-2:]) == (16, 24)
    assert model(x[None]).shape == (1, 10)
    assert load_checkpointed_model(ckpt, None, (16, 16))[3]["img_size"] == 16
    res = tmp_path / "r.json"
    assert main(["eval", "--checkpoint", ckpt, "--img-size", "16x24", "--limit", "32", "--results-file", str(res),
                 "--device", "cpu"]) == 0
    assert json.loads(res.read_text())["img_size"] == "16x24"
    img = tmp_path / "d.png"
    save_digits_image(img, 3)
    assert main(["predict", "--checkpoint", ckpt, str(img), "--img-size", "16x24", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.count(f"{img}: ") == 1


def test_checkpoint_of_another_model_refused(run_dir, tmp_path, capsys):
    assert main(["eval", "--model", "vit_attn_tiny", "--checkpoint", str(run_dir / "best.safetensors"),
                 "--device", "cpu"]) == 2
    line = _err_line(capsys)
    assert "--model vit_attn_tiny disagrees" in line and "holds model 'vit_attn_micro'" in line
    # Without the sidecar the weights themselves are checked.
    bare = tmp_path / "bare.safetensors"
    bare.write_bytes((run_dir / "best.safetensors").read_bytes())
    assert main(["eval", "--model", "flatten_deit_micro", "--checkpoint", str(bare), "--data", "digits",
                 "--device", "cpu"]) == 2
    assert "does not fit model" in _err_line(capsys)


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, ("touch EVIL_MARKER",))


@pytest.mark.parametrize("cmd", ["eval", "predict"])
def test_malicious_pickle_refused_nothing_run(tmp_path, monkeypatch, capsys, cmd):
    monkeypatch.chdir(tmp_path)
    evil = tmp_path / "evil.pth"
    with open(evil, "wb") as f:
        pickle.dump({"state_dict": _Evil()}, f)
    img = tmp_path / "d.png"
    save_digits_image(img, 0)
    extra = ["--data", "digits"] if cmd == "eval" else [str(img)]
    assert main([cmd, "--model", "vit_attn_micro", "--checkpoint", str(evil), *extra, "--device", "cpu"]) == 2
    line = _err_line(capsys)
    assert "refusing to load" in line and "cannot be loaded safely" in line
    # How to convert a trusted file, and not torch's advice to switch the safety off.
    assert "safetensors.torch.save_file" in line and "weights_only" not in line
    assert not (tmp_path / "EVIL_MARKER").exists()


def test_pickle_refusal_names_what_it_asked_for(tmp_path):
    from subquad.engine.checkpoint import load_state, read_weights
    from subquad.errors import UserError

    evil = tmp_path / "evil.pth"
    with open(evil, "wb") as f:
        pickle.dump({"state_dict": _Evil()}, f, protocol=2)
    for load in (read_weights, load_state):
        with pytest.raises(UserError, match=r"cannot be loaded safely \(it refers to posix\.system") as e:
            load(evil)
        assert "weights_only" not in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "EVIL_MARKER").exists()


def test_predict_bad_images(run_dir, tmp_path, capsys):
    ck = str(run_dir / "best.safetensors")
    assert main(["predict", "--model", "vit_attn_micro", "--checkpoint", ck, str(tmp_path / "none.png")]) == 2
    assert "image not found" in _err_line(capsys)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"nope")
    assert main(["predict", "--model", "vit_attn_micro", "--checkpoint", ck, str(bad), "--device", "cpu"]) == 2
    assert f"skipped 1 of 1 image(s) that cannot be read: {bad} (" in _err_line(capsys)


# Issue 13 item 1: eval, predict and analyze take the model, classes and eval transform from the sidecar, accept a
# run directory, and check an explicit --model against the sidecar.

def test_run_directory_without_model(run_dir, tmp_path, capsys):
    res = tmp_path / "r.json"
    assert main(["eval", "--checkpoint", str(run_dir), "--limit", "32", "--results-file", str(res),
                 "--device", "cpu"]) == 0
    row = json.loads(res.read_text())
    assert row["model"] == "vit_attn_micro" and row["checkpoint"] == str(run_dir / "best.safetensors")
    img = tmp_path / "d.png"
    save_digits_image(img, 7)
    assert main(["predict", "--checkpoint", str(run_dir), str(img), "--device", "cpu", "--topk", "3"]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(str(img))][0]
    assert line.count("%)") == 3


def test_analyze_loads_what_train_writes(run_dir, tmp_path, capsys):
    """The reported failure: a 10-class checkpoint analysed with --model (head 10 vs the 1000 of a fresh model)."""
    img = tmp_path / "d.png"
    save_digits_image(img, 3)
    for extra in (["--model", "vit_attn_micro"], []):
        out = tmp_path / f"a{len(extra)}"
        assert main(["analyze", *extra, "--checkpoint", str(run_dir / "best.safetensors") if extra else str(run_dir),
                     "--image", str(img), "--out", str(out), "--layers", "0"]) == 0
        s = json.loads((out / "summary.json").read_text())
        side = json.loads((run_dir / "best.json").read_text())
        # The training size and the sidecar's class names, not the model's defaults.
        assert s["model"] == "vit_attn_micro" and s["img_size"] == side["data_config"]["img_size"] == 16
        assert s["predicted_label"] in side["classes"] and 0 <= s["predicted_class"] < 10
        assert f"predicted class {s['predicted_class']} '{s['predicted_label']}'" in capsys.readouterr().out
    assert main(["analyze", "--model", "l2vit_micro", "--checkpoint", str(run_dir), "--out",
                 str(tmp_path / "x")]) == 2
    line = _err_line(capsys)
    assert "--model l2vit_micro" in line and "'vit_attn_micro'" in line


def test_checkpoint_without_sidecar_needs_model(run_dir, tmp_path, capsys):
    bare = tmp_path / "bare.safetensors"
    bare.write_bytes((run_dir / "best.safetensors").read_bytes())
    assert main(["eval", "--checkpoint", str(bare), "--data", "digits", "--device", "cpu"]) == 2
    assert "no sidecar naming its model" in _err_line(capsys)
    # With --model the class count comes from the classifier's weights.
    assert main(["eval", "--checkpoint", str(bare), "--model", "vit_attn_micro", "--data", "digits", "--img-size",
                 "16", "--limit", "16", "--results-file", str(tmp_path / "b.json"), "--device", "cpu"]) == 0
    assert main(["eval", "--checkpoint", str(tmp_path), "--device", "cpu"]) == 2
    assert "folder without best.safetensors" in _err_line(capsys)


def test_model_kwargs_of_the_run_rebuild_the_model(tmp_path, capsys):
    # An arena-style host (--model-kwargs) is rebuilt from the sidecar: eval on the run directory needs no flags.
    out = tmp_path / "run"
    kw = '{"attn": "linear_relu", "patch_size": 2, "class_token": false, "global_pool": "avg", "stem": "conv"}'
    assert main(["train", "--model", "vit_attn_micro", "--model-kwargs", kw, "--data", "digits", "--img-size", "16",
                 "--train-limit", "64", "--eval-limit", "32", "-b", "32", "--epochs", "1", "--log-interval", "0",
                 "--device", "cpu", "--output", str(out)]) == 0
    res = tmp_path / "e.json"
    assert main(["eval", "--checkpoint", str(out), "--results-file", str(res), "--device", "cpu"]) == 0
    final = json.loads((out / "results.json").read_text())
    assert json.loads(res.read_text())["top1"] == pytest.approx(final["top1"], abs=1e-3)


def test_eval_and_predict_results_replaced_only_with_overwrite(run_dir, tmp_path, capsys):
    ck = str(run_dir / "best.safetensors")
    res, pred = tmp_path / "res.json", tmp_path / "pred.json"
    img = tmp_path / "d.png"
    save_digits_image(img, 3)
    ev = ["eval", "--checkpoint", ck, "--limit", "32", "--results-file", str(res), "--device", "cpu"]
    pr = ["predict", "--checkpoint", ck, str(img), "--json", str(pred), "--device", "cpu"]
    def _result(path):  # the JSON without its timing
        data = json.loads(path.read_text())
        return {k: v for k, v in data.items() if k != "images_per_sec"} if isinstance(data, dict) else data

    for cmd, out in ((ev, res), (pr, pred)):
        assert main(cmd) == 0
        first = _result(out)
        out.write_text("edited by hand")
        assert main(cmd) == 2
        assert "--overwrite" in _err_line(capsys) and out.read_text() == "edited by hand"
        assert main([*cmd, "--overwrite"]) == 0
        assert _result(out) == first


# Issue 24 defect 9: exported programs given as --checkpoint, and folders given to predict.

# The first bytes of an ONNX ModelProto as torch.onnx writes it: ir_version (field 1, varint), producer_name
# (field 2, "pytorch"), then the graph; protobuf has no magic number, and no torch file starts with 0x08.
_ONNX_HEAD = b"\x08\x0a\x12\x07pytorch\x1a\x052.9.0"


@pytest.mark.parametrize("name", ["model.onnx", "renamed.pth"])
def test_onnx_file_as_checkpoint_explained(tmp_path, capsys, name):
    f = tmp_path / name
    f.write_bytes(_ONNX_HEAD + bytes(64))
    img = tmp_path / "d.png"
    save_digits_image(img, 0)
    assert main(["predict", "--model", "vit_attn_micro", "--checkpoint", str(f), str(img), "--device", "cpu"]) == 2
    line = _err_line(capsys)
    assert "is an ONNX model" in line and "onnxruntime.InferenceSession" in line and "opcode" not in line


def test_pt2_file_as_checkpoint_explained(tmp_path, capsys):
    import torch

    prog = torch.export.export(torch.nn.Linear(3, 2), (torch.zeros(1, 3),))
    for name in ("model.pt2", "renamed.pth"):
        torch.export.save(prog, tmp_path / name)
        assert main(["eval", "--model", "vit_attn_micro", "--checkpoint", str(tmp_path / name), "--data", "digits",
                     "--device", "cpu"]) == 2
        line = _err_line(capsys)
        assert "is a torch.export program" in line and "torch.export.load" in line


def test_predict_folder_predicts_every_image_sorted(run_dir, tmp_path, capsys):
    folder = tmp_path / "imgs"
    for i, name in enumerate(["b.png", "a.png", "c.PNG"]):
        save_digits_image(folder / name, i)
    (folder / "notes.txt").write_text("not an image")
    (folder / "sub").mkdir()
    save_digits_image(folder / "sub" / "deeper.png", 4)
    one = tmp_path / "one.png"
    save_digits_image(one, 5)
    pred = tmp_path / "p.json"
    assert main(["predict", "--checkpoint", str(run_dir), str(folder), str(one), "--device", "cpu", "-b", "2",
                 "--json", str(pred)]) == 0
    lines = capsys.readouterr().out.splitlines()
    want = [str(folder / n) for n in ("a.png", "b.png", "c.PNG")] + [str(one)]
    assert [ln.split(": ")[0] for ln in lines[:-1]] == want and lines[-1].startswith("4 image(s)")
    assert [r["image"] for r in json.loads(pred.read_text())] == want
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["predict", "--checkpoint", str(run_dir), str(empty), "--device", "cpu"]) == 2
    assert "holds no images" in _err_line(capsys)


# A new user's --checkpoint mistakes: the trainer's resumable state, a sidecar, an image or a text file.

def test_training_state_as_checkpoint_explained(run_dir, capsys):
    assert main(["eval", "--checkpoint", str(run_dir / "last_state.pth"), "--device", "cpu"]) == 2
    line = _err_line(capsys)
    assert f"{run_dir / 'last_state.pth'} is the resumable training state of a run" in line, line
    assert f"pass the run directory {run_dir} or its best.safetensors" in line
    assert f"`subquad train --resume {run_dir}` continues" in line and "holds no state dict" not in line


@pytest.mark.parametrize("case", ["sidecar", "json", "png", "jpeg", "yaml", "text"])
def test_file_that_is_no_checkpoint_explained(run_dir, tmp_path, capsys, case):
    from PIL import Image

    img = tmp_path / "d.png"
    save_digits_image(img, 3)
    files = {"sidecar": run_dir / "best.json", "json": tmp_path / "x.json", "png": img, "jpeg": tmp_path / "d.jpg",
             "yaml": run_dir / "args.yaml", "text": run_dir / "summary.csv"}
    (tmp_path / "x.json").write_text('{"top1": 1.0}\n')
    Image.open(img).convert("RGB").save(tmp_path / "d.jpg")
    f = files[case]
    assert main(["predict", "--checkpoint", str(f), str(img), "--device", "cpu"]) == 2
    line = _err_line(capsys)
    assert "truncated or corrupt" not in line, line
    if case == "sidecar":
        assert f"{f} is a JSON file (the sidecar of best.safetensors), not a checkpoint; pass " \
               f"{run_dir / 'best.safetensors'} or the run directory {run_dir}" in line, line
        return
    kind = {"json": "a JSON file", "png": "a PNG image", "jpeg": "a JPEG image", "yaml": "a YAML file",
            "text": "a text file"}[case]
    assert f"{f} is {kind}, not a checkpoint; --checkpoint takes .safetensors, a run directory" in line, line


def test_eval_at_another_size_than_trained_notes_it(tmp_path, caplog, capsys):
    import logging

    out = tmp_path / "run"
    assert main(["train", "--model", "cvt_ls_micro", "--data", "digits", "--img-size", "16", "--train-limit", "32",
                 "--eval-limit", "32", "-b", "32", "--epochs", "1", "--log-interval", "0", "--device", "cpu",
                 "--output", str(out)]) == 0
    img = tmp_path / "d.png"
    save_digits_image(img, 3)
    note = "note: evaluating at 32 x 32 (--img-size 32); the checkpoint was trained at 16 x 16"
    ev = ["eval", "--checkpoint", str(out), "--limit", "16", "--device", "cpu", "--overwrite"]
    for argv, noted in (([*ev, "--img-size", "32"], True), ([*ev, "--img-size", "16"], False), (ev, False),
                        (["predict", "--checkpoint", str(out), str(img), "--img-size", "32", "--device", "cpu"], True)):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="subquad"):
            assert main(argv) == 0
        notes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("note:")]
        assert notes == ([note] if noted else []), (argv, notes)
