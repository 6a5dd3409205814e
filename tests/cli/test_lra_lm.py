"""`subquad lra` and `subquad lm`: tiny end-to-end runs through the CLI and bad input."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from subquad.data.lra.listops import write_listops
from subquad_cli.__main__ import main


@pytest.fixture(scope="module")
def listops_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("lo")
    write_listops(out, num_train=24, num_val=8, num_test=8, seed=1, min_len=10, max_len=60)
    return out


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    (root / "src").mkdir()
    (root / "src" / "doc.txt").write_text("the quick brown fox jumps over the lazy dog.\n" * 60)
    assert main(["lm", "prepare", "--corpus", str(root / "src"), "--out", str(root / "prep")]) == 0
    return root / "prep"


@pytest.mark.parametrize("attention", ["softmax"])
def test_lra_train_listops(listops_dir, tmp_path, attention, capsys):
    out = tmp_path / "run"
    ls_opts = ["--window-size", "4", "--rank", "3"] if attention == "long_short" else []
    rc = main(["lra", "train", "--task", "listops", "--data", str(listops_dir), "--attention", attention,
               "--max-steps", "4", "--eval-every", "2", "--batch-size", "4", "--max-len", "64", *ls_opts,
               "--output", str(out)])
    assert rc == 0
    for name in ("args.yaml", "summary.csv", "best.safetensors", "best.json", "last.safetensors", "results.json"):
        assert (out / name).is_file(), name
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert [int(r["step"]) for r in rows] == [2, 4]
    assert {"train_loss", "eval_acc", "lr", "sec_per_step"} <= set(rows[0])
    res = json.loads((out / "results.json").read_text())
    assert res["test_samples"] == 8 and 0 <= res["test_acc"] <= 100 and res["encoding"] == "lra_released"
    out = capsys.readouterr().out
    assert "test accuracy" in out and "--max-len" not in out  # no ListOps tree is longer than 64 tokens


def test_lra_max_len_that_cuts_examples_says_so(listops_dir, tmp_path, capsys):
    from subquad.data.lra.listops import ListOpsDataset

    rc = main(["lra", "train", "--task", "listops", "--data", str(listops_dir), "--attention", "softmax",
               "--max-steps", "2", "--eval-every", "2", "--batch-size", "4", "--max-len", "16", "--output",
               str(tmp_path / "run")])
    assert rc == 0
    lengths = {s: ListOpsDataset(listops_dir, s, max_len=16).lengths() for s in ("train", "val", "test")}
    cuts = ", ".join(f"{int((n > 16).sum())} of {len(n)} {s}" for s, n in lengths.items())
    longest = max(int(n.max()) for n in lengths.values())
    assert 0 < int((lengths["train"] > 16).sum()) < len(lengths["train"])
    notes = [ln for ln in capsys.readouterr().out.splitlines() if "--max-len" in ln]
    assert notes == [f"note: --max-len 16 cuts {cuts} examples (longest {longest} tokens)"]


def test_lra_generate_listops(tmp_path, capsys):
    rc = main(["lra", "generate", "listops", "--out", str(tmp_path), "--num-train", "5", "--num-val", "2",
               "--num-test", "2", "--min-len", "10", "--max-len", "40", "--seed", "2"])
    assert rc == 0 and (tmp_path / "test.tsv").read_text().startswith("Source\tTarget\n")
    assert json.loads((tmp_path / "meta.json").read_text())["params"]["seed"] == 2


def test_lra_bad_input(listops_dir, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["lra", "train", "--task", "cifar", "--data", str(listops_dir)])
    assert "invalid choice" in capsys.readouterr().err
    assert main(["lra", "train", "--task", "listops", "--data", str(listops_dir), "--attention", "nope"]) == 2
    assert "unknown attention 'nope'" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train.tsv").write_text("Source\tTarget\n( ( ( [SM 4 ) 9 ) ] )\t3\n( ( ( [SM 4 ) 9 ) ] )\n")
    assert main(["lra", "train", "--task", "listops", "--data", str(bad)]) == 2
    assert "train.tsv:3: malformed line" in capsys.readouterr().err
    assert main(["lra", "train", "--task", "text", "--data", str(tmp_path / "none")]) == 2
    assert "does not exist" in capsys.readouterr().err
    # A negative count would evaluate on no example (or cut the split from its end) and still report a result.
    for flag, value in (("--eval-steps", "-1"), ("--train-limit", "-5"), ("--eval-limit", "-1"), ("--workers", "-1")):
        out = tmp_path / f"run{flag}"
        assert main(["lra", "train", "--task", "listops", "--data", str(listops_dir), flag, value,
                     "--output", str(out)]) == 2
        err = capsys.readouterr().err
        assert "must be >= 0" in err and f"{flag} {value}" in err and "Traceback" not in err, err
        assert not out.exists()


def test_lm_train_and_generate(corpus_dir, tmp_path, capsys):
    out = tmp_path / "lm"
    rc = main(["lm", "train", "--data", str(corpus_dir), "--attention", "long_short", "--dim", "16", "--depth", "1",
               "--num-heads", "2", "--seq-len", "32", "--batch-size", "4", "--max-steps", "3", "--eval-every", "2",
               "--eval-ctx", "32", "--eval-score", "16", "--eval-tokens", "64", "--final-eval-tokens", "64",
               "--attn-opt", "window_size=8", "--attn-opt", "chunk_size=4", "--output", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["valid_tokens"] == 64 and res["test_bpc"] > 0 and res["metric"] == "bpb"
    assert [int(r["step"]) for r in csv.DictReader((out / "summary.csv").open())] == [2, 3]
    capsys.readouterr()
    assert main(["lm", "generate", "--checkpoint", str(out), "--prompt", "the ", "--max-new", "12"]) == 0
    text = capsys.readouterr().out.rstrip("\n")
    assert text.startswith("the ") and len(text.encode()) >= 4
    for flag in ("--temperature", "--top-k"):
        assert main(["lm", "generate", "--checkpoint", str(out), "--prompt", "the ", flag, "-1"]) == 2
        err = capsys.readouterr().err
        assert "--temperature >= 0" in err and "Traceback" not in err, err


def test_lm_bad_input(corpus_dir, tmp_path, capsys):
    (tmp_path / "blob.bin").write_bytes(b"\x00\xff" * 200)
    assert main(["lm", "prepare", "--corpus", str(tmp_path / "blob.bin"), "--out", str(tmp_path / "o")]) == 2
    assert "not text" in capsys.readouterr().err
    (tmp_path / "empty.txt").write_text("")
    assert main(["lm", "prepare", "--corpus", str(tmp_path / "empty.txt"), "--out", str(tmp_path / "o")]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["lm", "train", "--data", str(tmp_path)]) == 2
    assert "meta.json" in capsys.readouterr().err
    assert main(["lm", "generate", "--checkpoint", str(tmp_path), "--prompt", "x"]) == 2
    assert "not found" in capsys.readouterr().err
    # A negative token count scored nothing and reported a perfect 0.000 bpc.
    for flag in ("--eval-tokens", "--final-eval-tokens"):
        out = tmp_path / f"run{flag}"
        assert main(["lm", "train", "--data", str(corpus_dir), flag, "-1", "--output", str(out)]) == 2
        err = capsys.readouterr().err
        assert "must be >= 0 (0 = the whole split)" in err and "Traceback" not in err, err
        assert not out.exists()


def test_lm_train_without_causal_form_lists_those_with_one(corpus_dir, capsys):
    from subquad.attention import ATTENTION_REGISTRY

    assert main(["lm", "train", "--data", str(corpus_dir), "--attention", "enhanced_linear"]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "'enhanced_linear' has no causal form" in lines[0]
    causal = [n for n in ATTENTION_REGISTRY.names() if ATTENTION_REGISTRY.get(n).builder.caps.causal]
    assert causal and lines[0].endswith("mechanisms with one: " + ", ".join(causal))
    assert main(["lm", "train", "--data", str(corpus_dir), "--attention", "nope"]) == 2
    assert "unknown attention 'nope'" in capsys.readouterr().err


def test_lm_prepare_reports_skipped_files(tmp_path, capsys):
    import gzip

    src = tmp_path / "doc"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "copyright").write_text("Copyright text of the package.\n" * 10)
    (src / "pkg" / "changelog.Debian.gz").write_bytes(gzip.compress(b"changes\n" * 50))
    assert main(["lm", "prepare", "--corpus", str(src), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "1 file(s)" in out and "skipped 1 compressed file(s), e.g. pkg/changelog.Debian.gz" in out
    assert main(["lm", "prepare", "--corpus", str(src), "--glob", "copyright", "--out", str(tmp_path / "o2")]) == 0
    assert "skipped" not in capsys.readouterr().out


@pytest.mark.parametrize("task", ["listops", "text", "retrieval", "image", "pathfinder"])
def test_shipped_lra_recipes_load(task):
    import argparse

    from subquad_cli.lra import resolve_config

    ns = argparse.Namespace(task=task, data="d", attention="long_short", config=None, attn_opt=[], window_size=None,
                            rank=None, amp=False)
    cfg = resolve_config(ns)
    assert cfg.task == task and cfg.dim == 64 and cfg.depth == 2 and cfg.num_heads == 2 and cfg.mlp_dim == 128
    assert cfg.attn_kw["long_short"]["layout"] == "lra" and cfg.cls_attn_kw["long_short"] == {"num_prefix_tokens": 1}
    if task == "listops":
        assert (cfg.steps, cfg.warmup, cfg.batch_size, cfg.lr, cfg.max_len) == (5000, 1000, 32, 1e-4, 2048)


@pytest.mark.parametrize("name", ["small", "base"])
def test_shipped_lm_recipes_load(name):
    import argparse

    from subquad_cli.lm import CONFIG_DIR, resolve_config

    ns = argparse.Namespace(data="d", attention="long_short", config=str(CONFIG_DIR / f"{name}.yaml"), attn_opt=[])
    cfg = resolve_config(ns)
    assert cfg.attn_kw["long_short"]["chunk_size"] == 16


def test_lm_enwik8_phases_resume_and_eval(tmp_path, capsys):
    # A small file in enwik8's format, a phased recipe, --resume of the finished run,
    # then `lm eval --split test` with the run's protocol and with another window.
    raw = ("<page><title>Zürich</title><text>'''Zürich''' is a [[city]] &amp; more.</text></page>\n" * 40).encode()
    (tmp_path / "enwik8").write_bytes(raw)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("attention: long_short\ndim: 16\ndepth: 1\nnum_heads: 2\nresidual: official\n"
                      "max_steps: 0\neval_every: 2\neval_ctx: 32\neval_score: 16\neval_batch: 4\n"
                      "eval_tokens: 64\nfinal_eval_tokens: 64\nlr: 2.0e-3\nwarmup: 1\n"
                      "phases:\n  - {seq_len: 16, batch_size: 2, steps: 2}\n"
                      "  - {seq_len: 32, batch_size: 1, steps: 2}\n"
                      "attn_kw:\n  long_short: {window_size: 8, chunk_size: 4, rank: 1}\n")
    out = tmp_path / "run"
    base = ["lm", "train", "--data", f"enwik8:{tmp_path / 'enwik8'}", "-c", str(recipe), "--device", "cpu"]
    assert main(base + ["--seq-len", "8", "--output", str(out)]) == 2
    assert "trains in phases" in capsys.readouterr().err
    assert main(base + ["--output", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["corpus"] == "enwik8" and res["steps"] == 4 and res["train_tokens"] == 2 * 2 * 16 + 2 * 32
    capsys.readouterr()
    assert main(["lm", "train", "--resume", str(out), "--dim", "8"]) == 2
    assert "drop --dim" in capsys.readouterr().err
    assert main(["lm", "train", "--resume", str(out)]) == 0  # complete: returns its results
    assert main(["lm", "eval", "--checkpoint", str(out), "--split", "test"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    n_test = len(raw) - len(raw) * 95 // 100 - 1
    assert line.startswith("enwik8 test: ") and f"over {n_test} tokens (windows of 32, the last 16 scored" in line
    bpb = float(line.split()[2])
    from subquad.engine.sequence import evaluate_bpc, load_lm

    model, _ = load_lm(out)
    want = evaluate_bpc(model, np.frombuffer(raw[len(raw) * 95 // 100:], dtype=np.uint8), 32, 16, 4)
    assert abs(bpb - want["bpc"]) < 1e-4
    assert main(["lm", "eval", "--checkpoint", str(out), "--split", "valid", "--eval-ctx", "24",
                 "--eval-score", "8"]) == 0
    assert "windows of 24, the last 8 scored" in capsys.readouterr().out
    assert main(["lm", "eval", "--checkpoint", str(out), "--data", f"text8:{tmp_path / 'enwik8'}"]) == 2
    assert "is not text8" in capsys.readouterr().err


@pytest.mark.parametrize("name,depth,drop,wd,lrs,params", [
    ("enwik8_base", 12, 0.2, 0.01, (2.5e-4, 1.25e-4, 6.25e-5), 44.3e6),
    ("enwik8_large", 30, 0.4, 0.1, (2.5e-4, 1.25e-4, 6.25e-5), 110.6e6),
    ("text8_base", 12, 0.2, 0.01, (5e-4, 2.5e-4, 1.25e-4), 44.2e6),
    ("text8_large", 30, 0.4, 0.1, (5e-4, 2.5e-4, 1.25e-4), 110.5e6)])
def test_paper_lm_recipes(name, depth, drop, wd, lrs, params):
    # Transformer-LS App. D / Tab. 4 (44M small, 110M large) and the official launch scripts' per-phase lr.
    import argparse

    import torch

    from subquad.engine.sequence import build_lm, lm_phases
    from subquad_cli.lm import resolve_config

    cfg = resolve_config(argparse.Namespace(data="d", attention="long_short", config=name, attn_opt=[]))
    assert (cfg.depth, cfg.dim, cfg.num_heads, cfg.ffn_dim, cfg.residual) == (depth, 512, 8, 2048, "official")
    assert (cfg.dropout, cfg.emb_dropout, cfg.weight_decay, cfg.clip_grad) == (drop, drop, wd, 0.0)
    assert cfg.attn_kw["long_short"] == {"window_size": 512, "chunk_size": 16, "rank": 1}
    assert (cfg.eval_ctx, cfg.eval_score, cfg.final_eval_tokens) == (32768, 512, 0)
    ph = lm_phases(cfg)
    assert [(p["seq_len"], p["batch_size"], p["steps"], p["warmup"], p["lr"], p["reset_optimizer"]) for p in ph] == [
        (2048, 32, 430_000, 10_000, lrs[0], False), (4096, 32, 50_000, 5_000, lrs[1], True),
        (8192, 16, 50_000, 5_000, lrs[2], True)]
    assert ph[-1]["last"] == 530_000
    model = build_lm(256 if name.startswith("enwik8") else 27, cfg, device=torch.device("meta"))
    assert abs(sum(p.numel() for p in model.parameters()) - params) < 0.05e6
