"""The associative-recall tasks: generators (answers, distances, solvers), the host, the cell kind and the arena run."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from subquad.arena import load_task
from subquad.arena.recall import cell_config, depends_on, distance_bins, refusal
from subquad.data.recall import FILLER, SLOT, TASKS, make_recall
from subquad.errors import UserError

VOCAB = 1024


def _value_pos(tokens: torch.Tensor, target: int) -> list[int]:
    return [int(i) for i in (tokens == target).nonzero().flatten()]


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("seq_len,kv", [(64, 8), (131, 5), (512, 32)])
def test_layout_answers_and_distances(task, seq_len, kv):
    b = make_recall(task, 24, seq_len, kv, VOCAB, seed=3, split="val")
    assert b.tokens.shape == (24, seq_len) and b.query_pos.shape == b.target.shape == b.distance.shape == (24, kv)
    half = VOCAB // 2
    for i in range(24):
        tok, q, t, d = b.tokens[i], b.query_pos[i], b.target[i], b.distance[i]
        assert ((t >= half) & (t < VOCAB)).all() and len(set(t.tolist())) == kv  # values, unique
        qkey = q - 1 if task == "recall" else q  # the query's key: before its answer slot, or scored itself
        keys = tok[qkey]
        assert ((keys >= 1) & (keys < half)).all() and len(set(keys.tolist())) == kv  # queries are keys, unique
        for j in range(kv):
            occ = _value_pos(tok, int(t[j]))
            if task == "recall":
                # The answer is never in the input after its pair: the value occurs once, in its pair.
                assert len(occ) == 1 and occ[0] < int(q.min()), (i, j, occ)
                vpos = occ[0]
            else:
                # MQAR: the value occurs in its pair and right after its query (the next token to predict).
                assert len(occ) == 2 and occ[1] == int(q[j]) + 1
                vpos = occ[0]
            assert int(tok[vpos - 1]) == int(tok[qkey[j]])  # the pair's key precedes its value
            assert int(d[j]) == int(q[j]) - vpos >= 1  # the recorded distance
        if task == "recall":
            assert (tok[q] == SLOT).all()  # scored at the answer slots, which hold no answer
            assert set(tok[qkey.min():].tolist()) <= set(keys.tolist()) | {SLOT}  # only queries and slots
        other = torch.ones(seq_len, dtype=torch.bool)
        other[q] = other[qkey] = False
        if task == "recall_causal":
            other[q + 1] = False
        other[: 2 * kv if task == "recall_causal" else seq_len] = False
        assert (tok[other] == FILLER).all()


def test_splits_and_seeds_are_disjoint_and_deterministic():
    a = make_recall("recall", 8, 128, 8, VOCAB, seed=0, split="train")
    assert torch.equal(a.tokens, make_recall("recall", 8, 128, 8, VOCAB, seed=0, split="train").tokens)
    assert torch.equal(a.tokens[4:], make_recall("recall", 4, 128, 8, VOCAB, seed=0, split="train", start=4).tokens)
    for other in (make_recall("recall", 8, 128, 8, VOCAB, seed=1, split="train"),
                  make_recall("recall", 8, 128, 8, VOCAB, seed=0, split="val"),
                  make_recall("recall", 8, 128, 8, VOCAB, seed=0, split="test")):
        assert not any(torch.equal(x, y) for x in a.tokens for y in other.tokens)


def _solve(b, window: int | None, gen: torch.Generator) -> torch.Tensor:
    """Look the query's key up, in the whole sequence before the query or only in its last `window` tokens; a key
    not found gets a uniformly random value (chance). Returns hits (B, kv) bool."""
    half = VOCAB // 2
    hits = torch.zeros_like(b.target, dtype=torch.bool)
    for i in range(b.tokens.shape[0]):
        tok = b.tokens[i]
        for j, q in enumerate(b.query_pos[i].tolist()):
            key = tok[q - 1] if tok[q] == SLOT else tok[q]
            lo = 0 if window is None else max(0, q - window)
            seen = (tok[lo:q - 1] == key).nonzero().flatten()
            seen = seen[lo + seen + 1 < q]  # the key followed by a visible value
            guess = int(tok[lo + int(seen[0]) + 1]) if len(seen) else int(torch.randint(half, VOCAB, (1,),
                                                                                          generator=gen))
            hits[i, j] = guess == int(b.target[i, j])
    return hits


@pytest.mark.parametrize("task", TASKS)
def test_lookup_solver_scores_100_and_a_window_solver_scores_chance_beyond_its_window(task):
    gen = torch.Generator().manual_seed(0)
    b = make_recall(task, 64, 256, 8, VOCAB, seed=0, split="test")
    assert _solve(b, None, gen).all()
    w = 32
    hits = _solve(b, w, gen)
    near, far = b.distance < w, b.distance > w
    assert near.sum() > 20 and far.sum() > 100  # both bins are populated
    assert hits[near].all()
    assert hits[far].double().mean() < 0.02  # chance is 1 / 512


def test_distance_bins_cover_every_distance():
    bins = distance_bins(300)
    assert bins[0] == (1, 2) and bins[-1][0] <= 300 < bins[-1][1]
    assert all(hi == lo2 for (_, hi), (lo2, _) in zip(bins, bins[1:], strict=False))


@pytest.mark.parametrize("bad", [dict(seq_len=31, kv=8), dict(kv=0), dict(vocab=10), dict(seq_len=1.5)])
def test_impossible_sizes_are_refused(bad):
    args = dict(seq_len=128, kv=8, vocab=VOCAB) | bad
    with pytest.raises(UserError):
        make_recall("recall", 2, **args, seed=0)


def test_host_runs_at_other_lengths_and_refuses_a_2d_only_mechanism():
    task = load_task("recall")
    train = task.recipe("quick")
    from subquad.arena.recall import build_model

    model = build_model(cell_config(train, task.mechanism("softmax")))
    for seq_len in (128, 517):
        b = make_recall("recall", 2, seq_len, 8, VOCAB, seed=0)
        assert model(b.tokens, b.query_pos).shape == (2, 8, VOCAB)
    assert "2-D token grid" in refusal(train, {"attention": "cswin"})
    assert "causal only" in refusal(train, {"attention": "sliding_window"})
    assert refusal(load_task("recall_causal").recipe("quick"), {"attention": "sliding_window"}) is None
    with pytest.raises(UserError, match="unknown recall train setting"):
        cell_config({**train, "stepz": 3}, {"attention": "softmax"})


def test_short_conv_is_causal():
    from subquad.sequence.recall import ShortConv

    conv = ShortConv(8, 4)
    x = torch.randn(2, 21, 8)
    y = conv(x)
    x2 = x.clone()
    x2[:, 10:] += 1.0
    assert torch.equal(conv(x2)[:, :10], y[:, :10]) and not torch.equal(conv(x2)[:, 10:], y[:, 10:])


def test_seeds_other_than_the_sweep_seed_depend_on_it():
    train = load_task("recall").recipe("default")
    assert depends_on(train, "window", 0) is None
    assert depends_on(train, "window", 2) == ("window", 0)


def test_next_ready_waits_for_the_sweep_cell(tmp_path):
    from subquad.arena.runner import Cell, _next_ready

    task = load_task("recall")
    cells = [Cell(lb, s, tmp_path / "cells" / lb / f"seed{s}") for s in (0, 1) for lb in ("a", "b")]
    queue, running = list(cells), []
    first = _next_ready(task, queue, running, "default")
    second = _next_ready(task, queue, running := [first], "default")
    assert (first.label, first.seed, second.label, second.seed) == ("a", 0, "b", 0)
    running.append(second)
    assert _next_ready(task, queue, running, "default") is None  # both seed-1 cells wait for their sweeps
    (first.dir).mkdir(parents=True)
    (first.dir / "cell.json").write_text("{}")
    third = _next_ready(task, queue, running, "default")
    assert (third.label, third.seed) == ("a", 1)
    # A dependency that is not part of this run does not block (the cell refuses in one line when it runs).
    lone = [Cell("c", 2, tmp_path / "cells" / "c" / "seed2")]
    assert _next_ready(task, lone, [], "default").label == "c"


def test_cell_of_another_seed_takes_and_records_the_sweep(tmp_path):
    """Seed 1 refuses until seed 0's sweep exists, then trains at the rate it chose and records that sweep."""
    from subquad.arena.recall import run_cell

    task = load_task("recall")
    with pytest.raises(UserError, match="run seed 0 first"):
        run_cell(task.recipe("quick"), task.mechanism("softmax"), 1, tmp_path / "softmax" / "seed1")
    swept = {"0.001": 12.5, "0.003": 40.0, "0.01": 3.0}
    (tmp_path / "softmax" / "seed0").mkdir(parents=True)
    (tmp_path / "softmax" / "seed0" / "cell.json").write_text(json.dumps({"lr": 0.003, "lr_sweep": swept}))
    res = run_cell(task.recipe("quick"), task.mechanism("softmax"), 1, tmp_path / "softmax" / "seed1")
    assert (res["lr"], res["lr_sweep"], res["lr_sweep_seed"]) == (0.003, swept, 0)
    assert [p.name for p in (tmp_path / "softmax" / "seed1").glob("lr-*.json")] == ["lr-0.003.json"]


@pytest.mark.parametrize("name", ["recall", "recall_causal"])
def test_every_default_mechanism_builds_and_steps_in_its_host(name):
    """What the quick run no longer covers (it trains one mechanism of each kind): every default mechanism of the
    task is accepted by `refusal`, and its host takes a training step with finite gradients everywhere."""
    task = load_task(name)
    train = task.recipe("quick")
    from subquad.arena.recall import build_model

    b = make_recall(name, 2, 200, 8, VOCAB, seed=0)
    for label in task.default_mechanisms:
        cfg = cell_config(train, task.mechanism(label))
        assert refusal(train, task.mechanism(label)) is None, label
        torch.manual_seed(0)
        model = build_model(cfg)
        logits = model(b.tokens, b.query_pos)
        assert logits.shape == (2, 8, VOCAB), label
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), b.target.flatten()).backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g is not None and torch.isfinite(g).all() for g in grads), label


def test_quick_arena_run_and_claims(tmp_path):
    """`subquad arena run --task recall --budget quick`: the budget's cells (one mechanism of each kind), the
    leaderboard's recall columns, and `arena check` on claims with a `score`."""
    from subquad_cli.__main__ import main

    out = tmp_path / "rq"
    task = load_task("recall")
    # Trained in two parts, as a long run is: the second part's leaderboard holds the first part's rows too, in
    # the task's order.
    assert main(["arena", "run", "--task", "recall", "--budget", "quick", "--attention", "window,softmax",
                 "--out", str(out)]) == 0
    with open(out / "leaderboard.csv", newline="") as f:
        assert [r["attention"] for r in csv.DictReader(f)] == ["softmax", "window"]
    assert main(["arena", "run", "--task", "recall", "--budget", "quick", "--attention", "linear_relu,long_short",
                 "--out", str(out)]) == 0
    with open(out / "leaderboard.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["attention"] for r in rows] == task.budgets["quick"]["mechanisms"] == task.resolve("all", "quick")
    for r in rows:
        assert r["status"] == "ok" and r["seeds"] == "0", r
        for col in ("mean_acc_inside", "mean_acc_beyond", "mean_acc_len2x", "mean_acc_len4x", "mean_acc_kv2x",
                    "mean_step_ms_train_len", "lr"):
            assert r[col] != "", (r["attention"], col)
    for png in ("leaderboard.png", "curves.png", "distance.png", "frontier.png"):
        assert (out / png).is_file(), png
    # `report` prints the CSV and `check` reads the cells: report says when cells are missing from the CSV.
    from subquad.arena.report import stale_note

    assert stale_note(out) is None
    board = (out / "leaderboard.csv").read_text().splitlines(keepends=True)
    (out / "leaderboard.csv").write_text("".join(board[:3]))  # as an older runner left it: 2 of the 4 rows
    assert stale_note(out).startswith("note: 2 finished cell(s) are not in leaderboard.csv yet")
    (out / "leaderboard.csv").write_text("".join(board))
    # The Markdown table shows the recall columns; what a cell does not measure (eval/s) is '-', never 'nan'.
    from subquad.arena.report import leaderboard_markdown

    head, rule, *body = [ln for ln in leaderboard_markdown(out).splitlines() if ln.startswith("|")]
    assert "| inside | beyond | 2x len | 4x len | 2x kv | step ms | step ms 4096 | lr | status |" in head
    assert len(body) == 4 and "nan" not in "".join(body)
    assert all(ln.count("|") == head.count("|") == rule.count("|") for ln in body)
    cell = json.loads((out / "cells" / "window" / "seed0" / "cell.json").read_text())
    assert cell["lr_sweep"] == {"0.003": cell["best_val_acc"]} and cell["lr_sweep_seed"] == 0
    assert cell["commit"] is not None
    assert sum(b["n"] for b in cell["acc_bins"]) == 16 * task.train["kv"]  # every test query in one distance bin
    from subquad.arena import check_claims

    res = {r["id"]: r for r in check_claims(out, task)}
    assert res["ls-long-range"]["score"] == "acc_beyond" and res["ls-long-range"]["verdict"] == "inconclusive"


def test_the_1d_forms_the_claims_name_are_admitted_and_run_at_2x_and_4x():
    """focused_linear (both tasks), global_filter and structure_aware (bidirectional only: no causal form) build in
    the host and run at the extrapolation lengths the cell evaluates."""
    from subquad.arena.recall import build_model

    for name in ("recall", "recall_causal"):
        task = load_task(name)
        train = task.recipe("quick")
        assert refusal(train, task.mechanism("focused_linear")) is None
        assert refusal(train, task.mechanism("focused_linear_d128")) is None
        gf = refusal(train, {"attention": "global_filter"})
        assert (gf is None) == (name == "recall"), gf
        labels = ("focused_linear", "global_filter", "structure_aware") if name == "recall" else ("focused_linear",)
        for label in labels:
            model = build_model(cell_config(train, task.mechanism(label)))
            for f in (1, 2, 4):
                b = make_recall(name, 2, 128 * f, 8, VOCAB, seed=0)
                with torch.no_grad():
                    y = model(b.tokens, b.query_pos)
                assert y.shape == (2, 8, VOCAB) and torch.isfinite(y).all(), (name, label, f)
    for mechanism in ("global_filter", "structure_aware"):
        assert "no causal mode" in refusal(load_task("recall_causal").recipe("quick"), {"attention": mechanism})
