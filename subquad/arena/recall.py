"""Arena cells of the associative-recall tasks (`recall`, `recall_causal`): `RecallModel` trained on examples
generated from a seed (`subquad.data.recall`), scored by query accuracy in distance bins.

The arena runner calls, per task YAML (`kind: recall`):

    prepare_data(task, root, budget)      nothing to write (every split is generated from its seed); returns root
    refusal(train, mech)                  why a mechanism cannot run (None: it can): no 1-D form of the task's
                                          direction in its caps, or options the host refuses (a meta build)
    depends_on(train, label, seed)        the cell whose learning rate this one uses: (label, sweep seed) for every
                                          other seed, None for the sweep seed itself
    run_cell(train, mech, seed, out, progress, on_update)
                                          train one cell -> its metrics

`train` (the YAML's `train:` with the budget's overrides):

    task: recall | recall_causal          the generator (subquad.data.recall)
    vocab, seq_len, kv                    the training examples
    dim, depth, num_heads, conv_size, mlp_ratio   the host (subquad.sequence.recall.RecallModel)
    batch_size, steps, lrs, weight_decay, warmup, eval_every
                                          AdamW on a one-cycle schedule (linear warm-up over `warmup` of the
                                          steps, then linear decay); `lrs`: the learning rates swept on the sweep
                                          seed (the best on the validation split is used for every other seed)
    sweep_seed                            the seed whose cell sweeps `lrs` (0)
    val_examples, test_examples           sizes of the validation and test sets
    inside_max, beyond_min                distance bins of the verdicts, in tokens: a query is "inside" when its
                                          distance d <= inside_max, "beyond" when d >= beyond_min
    lengths: [2, 4]                       test lengths as multiples of seq_len (same kv): extrapolation
    capacity: 2                           a test at seq_len with capacity x kv pairs
    time_len: 4096                        the length of the timed training step (batch 1, one thread)

`mech` (a `mechanisms:` entry): `attention` (a registered mechanism), `attn_kw` (its options), and optionally `dim`
(the host width of this entry; the state-size axis).

Cell metrics (cell.json): `test_acc` query accuracy (%) at the training length on the test split,
`best_val_acc` the validation accuracy that selected the checkpoint, `acc_inside` / `acc_beyond` the test accuracy
of queries inside / beyond the window bins, `acc_len<k>x` at k x seq_len, `acc_kv<c>x` at c x kv, `acc_bins` the
accuracy per power-of-two distance bin, `lr` and `lr_sweep` ({lr: best val accuracy} of the sweep that chose `lr`,
run on seed `lr_sweep_seed`: a cell of another seed records the sweep it took its learning rate from),
`step_ms_train_len` / `step_ms_<time_len>` the median forward + backward time of one batch-1 training step at the
training length / at `time_len` tokens, `peak_mem_mb` the peak memory that step allocates at `time_len` tokens.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import UserError
from ..files import atomic_savefig, atomic_write

__all__ = ["prepare_data", "refusal", "run_cell", "depends_on", "write_plots", "RecallConfig", "train_recall",
           "MECH_KEYS", "distance_bins"]

MECH_KEYS = ("attention", "attn_kw", "dim")
# Leaderboard columns beyond the common ones: means over seeds of these cell.json keys, and the learning rate(s).
REPORT_COLUMNS = ("mean_acc_inside", "mean_acc_beyond", "mean_acc_len2x", "mean_acc_len4x", "mean_acc_kv2x",
                  "mean_step_ms_train_len", "mean_step_ms_4096", "lr")


@dataclass(frozen=True)
class RecallConfig:
    task: str = "recall"
    vocab: int = 1024
    seq_len: int = 128
    kv: int = 8
    dim: int = 64
    depth: int = 2
    num_heads: int = 1
    conv_size: int = 4
    mlp_ratio: float = 2.0
    batch_size: int = 64
    steps: int = 1000
    lrs: tuple[float, ...] = (1e-3, 3e-3, 1e-2)
    weight_decay: float = 0.1
    warmup: float = 0.1
    eval_every: int = 100
    sweep_seed: int = 0
    val_examples: int = 512
    test_examples: int = 1024
    inside_max: int = 8
    beyond_min: int = 48
    lengths: tuple[int, ...] = (2, 4)
    capacity: int = 2
    time_len: int = 4096
    time_repeats: int = 3
    attention: str = "softmax"
    attn_kw: dict[str, Any] = field(default_factory=dict)

    @property
    def causal(self) -> bool:
        return self.task == "recall_causal"


def cell_config(train: dict[str, Any], mech: dict[str, Any]) -> RecallConfig:
    """The RecallConfig of one cell: the recipe, the mechanism and its options (`dim` of the entry wins)."""
    unknown = sorted(set(mech) - set(MECH_KEYS))
    if unknown or "attention" not in mech:
        raise UserError(f"a recall mechanism entry takes {', '.join(MECH_KEYS)} (attention required); got "
                        f"{sorted(mech)}")
    names = {f.name for f in dataclasses.fields(RecallConfig)}
    bad = sorted(set(train) - names)
    if bad:
        raise UserError(f"unknown recall train setting(s) {bad}; allowed: {', '.join(sorted(names))}")
    values = dict(train)
    for key in ("lrs", "lengths"):
        if key in values:
            values[key] = tuple(values[key])
    values.update(attention=str(mech["attention"]), attn_kw=dict(mech.get("attn_kw") or {}))
    if "dim" in mech:
        values["dim"] = int(mech["dim"])
    cfg = RecallConfig(**values)
    from ..data.recall import check_sizes

    check_sizes(cfg.task, cfg.seq_len, cfg.kv, cfg.vocab)
    if not cfg.lrs or any(not (isinstance(x, (int, float)) and x > 0) for x in cfg.lrs):
        raise UserError(f"recall: lrs must be a non-empty list of positive numbers, got {list(cfg.lrs)}")
    return cfg


def build_model(cfg: RecallConfig, device: torch.device | str | None = None):
    from ..sequence.recall import RecallModel

    return RecallModel(cfg.vocab, cfg.dim, cfg.depth, cfg.num_heads, cfg.attention, cfg.attn_kw, causal=cfg.causal,
                       conv_size=cfg.conv_size, mlp_ratio=cfg.mlp_ratio, device=device)


def prepare_data(task: dict[str, Any], root: str | os.PathLike, budget: str = "default") -> Path:
    """Nothing to prepare: every split is generated from its seed when a cell needs it."""
    return Path(root)


def refusal(train: dict[str, Any], mech: dict[str, Any]) -> str | None:
    """Why `mech` cannot be the mixer of the task's host (None when it can); bad input raises UserError."""
    from ..attention import Request, check, get_attention_cls

    cfg = cell_config(train, mech)
    reasons = check(get_attention_cls(cfg.attention).caps, Request(causal=cfg.causal, sequence=True))
    if reasons:
        return f"{'; '.join(reasons)}; the {cfg.task} host needs a {'causal' if cfg.causal else 'bidirectional'} " \
               "1-D form"
    try:
        build_model(cfg, device="meta")
    except (UserError, ValueError) as e:
        return f"the host cannot take it: {str(e).splitlines()[0]}"
    return None


def depends_on(train: dict[str, Any], label: str, seed: int) -> tuple[str, int] | None:
    """The cell whose swept learning rate cell (label, seed) trains with (None: this cell sweeps)."""
    sweep = int(train.get("sweep_seed", RecallConfig.sweep_seed))
    return None if seed == sweep else (label, sweep)


# --------------------------------------------------------------------------------------------------- evaluation


def distance_bins(max_distance: int) -> list[tuple[int, int]]:
    """Power-of-two distance bins [lo, hi) covering 1 .. max_distance."""
    bins, lo = [], 1
    while lo <= max_distance:
        bins.append((lo, 2 * lo))
        lo *= 2
    return bins


@torch.no_grad()
def evaluate(model, cfg: RecallConfig, split: str, n: int, seq_len: int | None = None, kv: int | None = None,
             batch: int = 64) -> dict[str, Any]:
    """Query accuracy (%) on `n` examples of `split` (stream seed 0) at seq_len x kv, overall, inside / beyond the
    window bins and per power-of-two distance bin."""
    from ..data.recall import make_recall

    seq_len, kv = seq_len or cfg.seq_len, kv or cfg.kv
    model.eval()
    hits, dists = [], []
    for start in range(0, n, batch):
        b = make_recall(cfg.task, min(batch, n - start), seq_len, kv, cfg.vocab, 0, split, start)
        pred = model(b.tokens, b.query_pos).argmax(-1)
        hits.append((pred == b.target).flatten())
        dists.append(b.distance.flatten())
    model.train()
    hit, dist = torch.cat(hits).double(), torch.cat(dists)

    def acc(sel: torch.Tensor) -> float | None:
        return float(hit[sel].mean() * 100) if bool(sel.any()) else None

    out = {"acc": acc(torch.ones_like(dist, dtype=torch.bool)), "inside": acc(dist <= cfg.inside_max),
           "beyond": acc(dist >= cfg.beyond_min), "n_inside": int((dist <= cfg.inside_max).sum()),
           "n_beyond": int((dist >= cfg.beyond_min).sum())}
    out["bins"] = [{"lo": lo, "hi": hi, "n": int(((dist >= lo) & (dist < hi)).sum()),
                    "acc": acc((dist >= lo) & (dist < hi))} for lo, hi in distance_bins(int(dist.max()))]
    return out


def time_step(model, cfg: RecallConfig, seq_len: int) -> tuple[float, float]:
    """(median ms, peak allocated MiB) of one forward + backward step at batch 1 and `seq_len` tokens."""
    from ..bench.memory import peak_memory
    from ..data.recall import make_recall

    kv = max(1, min(cfg.kv, seq_len // 4))
    b = make_recall(cfg.task, 1, seq_len, kv, cfg.vocab, 0, "test")

    def step() -> None:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(b.tokens, b.query_pos).flatten(0, 1), b.target.flatten()).backward()

    step()
    times = []
    for _ in range(max(1, cfg.time_repeats)):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    peak = peak_memory(step) / 2**20
    model.zero_grad(set_to_none=True)
    return sorted(times)[len(times) // 2], peak


# ----------------------------------------------------------------------------------------------------- training


def train_recall(cfg: RecallConfig, seed: int, lr: float,
                 on_eval: Callable[[dict[str, Any]], None] | None = None,
                 on_update: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """Train one model at learning rate `lr` (model init and training stream from `seed`); returns the best
    validation accuracy, its step, the curve and the model with the selected weights (key "model")."""
    from ..data.recall import make_recall
    from ..engine.sequence import one_cycle

    torch.manual_seed(seed)
    model = build_model(cfg)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.98))
    sched = one_cycle(opt, lr, cfg.steps, cfg.warmup)
    best, best_step, best_state, curve = -1.0, 0, None, []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for step in range(1, cfg.steps + 1):
        b = make_recall(cfg.task, cfg.batch_size, cfg.seq_len, cfg.kv, cfg.vocab, seed, "train",
                        (step - 1) * cfg.batch_size)
        loss = F.cross_entropy(model(b.tokens, b.query_pos).flatten(0, 1), b.target.flatten())
        if not torch.isfinite(loss):
            raise FloatingPointError(f"recall: non-finite loss at step {step} (lr {lr})")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if on_update is not None:
            on_update(step)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            val = evaluate(model, cfg, "val", cfg.val_examples)["acc"]
            curve.append({"step": step, "val_acc": val, "loss": float(loss.detach())})
            if val > best:
                best, best_step = val, step
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            if on_eval is not None:
                on_eval({"step": step, "steps": cfg.steps, "val_acc": val, "lr": lr})
    model.load_state_dict(best_state)
    return {"lr": lr, "best_val_acc": best, "best_step": best_step, "curve": curve,
            "train_cpu_s": time.process_time() - cpu0,
            "train_wall_s": time.perf_counter() - wall0, "model": model}


def test_metrics(model, cfg: RecallConfig) -> dict[str, Any]:
    """Test-split accuracies of the selected model: training length (bins), k x length, c x kv."""
    main = evaluate(model, cfg, "test", cfg.test_examples)
    out: dict[str, Any] = {"test_acc": main["acc"], "acc_inside": main["inside"], "acc_beyond": main["beyond"],
                           "n_inside": main["n_inside"], "n_beyond": main["n_beyond"], "acc_bins": main["bins"]}
    for k in cfg.lengths:
        ev = evaluate(model, cfg, "test", cfg.test_examples, seq_len=k * cfg.seq_len)
        out[f"acc_len{k}x"] = ev["acc"]
        out[f"acc_len{k}x_beyond"] = ev["beyond"]
        out[f"acc_len{k}x_bins"] = ev["bins"]
    if cfg.capacity:
        from ..data.recall import check_sizes

        kv2 = cfg.capacity * cfg.kv
        try:
            check_sizes(cfg.task, cfg.seq_len, kv2, cfg.vocab)
            out[f"acc_kv{cfg.capacity}x"] = evaluate(model, cfg, "test", cfg.test_examples, kv=kv2)["acc"]
        except UserError:
            out[f"acc_kv{cfg.capacity}x"] = None
    return out


def _sweep_lr(out: Path, cfg: RecallConfig, seed: int, lr: float,
              progress: Callable[[dict[str, Any]], None] | None,
              on_update: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """One run of the sweep (or the one run of another seed), its record kept in `out/lr-<lr>.json` so a restarted
    cell skips finished runs; returns the record with the model when it trained now."""
    path = out / f"lr-{lr:g}.json"
    if path.is_file():
        return json.loads(path.read_text())
    res = train_recall(cfg, seed, lr, progress, on_update)
    res.update(test_metrics(res["model"], cfg))
    record = {k: v for k, v in res.items() if k != "model"}
    atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n"))
    return res


def run_cell(train: dict[str, Any], mech: dict[str, Any], seed: int, out: str | os.PathLike,
             progress: Callable[[dict[str, Any]], None] | None = None,
             on_update: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """Train one cell: on the sweep seed every learning rate of `lrs`, keeping the best on validation; on any other
    seed the learning rate the sweep seed's cell (`out/../seed<sweep>/cell.json`) chose. `on_update(step)` follows
    every optimizer update. A killed cell restarts with the learning rates whose runs have not finished."""
    from ..bench.flops import count_module_macs

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = cell_config(train, mech)
    why = refusal(train, mech)
    if why:
        raise UserError(f"attention {cfg.attention!r} {why}")
    t0 = time.perf_counter()
    torch.set_num_threads(1)
    if seed == cfg.sweep_seed:
        runs = [_sweep_lr(out, cfg, seed, float(lr), progress, on_update) for lr in cfg.lrs]
        chosen = max(runs, key=lambda r: (r["best_val_acc"], -r["lr"]))
        sweep = {f"{r['lr']:g}": r["best_val_acc"] for r in runs}
    else:
        src = out.parent / f"seed{cfg.sweep_seed}" / "cell.json"
        if not src.is_file():
            raise UserError(f"{out}: seed {seed} trains with the learning rate the sweep on seed {cfg.sweep_seed} "
                            f"chose, and {src} does not exist yet; run seed {cfg.sweep_seed} first")
        swept = json.loads(src.read_text())
        chosen, sweep = _sweep_lr(out, cfg, seed, float(swept["lr"]), progress, on_update), swept.get("lr_sweep", {})
    model = chosen.get("model") or build_model(cfg)  # timings need only the architecture
    ms_train, _ = time_step(model, cfg, cfg.seq_len)
    ms_long, peak_mb = time_step(model, cfg, cfg.time_len)
    tokens = torch.zeros(1, cfg.seq_len, dtype=torch.int64)
    gmacs = float(count_module_macs(model.eval(), tokens)["gmacs"])
    n_train = cfg.steps * cfg.batch_size
    res = {k: v for k, v in chosen.items() if k != "model"}
    res.update({"metric": "acc", "lr": chosen["lr"], "lr_sweep": sweep, "lr_sweep_seed": cfg.sweep_seed,
                "params": sum(p.numel() for p in model.parameters()), "gmacs": gmacs,
                "train_per_sec": n_train / res["train_cpu_s"] if res["train_cpu_s"] > 0 else math.nan,
                "train_per_wall_sec": n_train / res["train_wall_s"] if res["train_wall_s"] > 0 else math.nan,
                "eval_per_sec": math.nan,
                "step_ms_train_len": ms_train, f"step_ms_{cfg.time_len}": ms_long, "peak_mem_mb": peak_mb,
                "wall_s": time.perf_counter() - t0, "seq_len": cfg.seq_len, "kv": cfg.kv, "dim": cfg.dim})
    return res


def write_plots(out: Path, task: Any, board: list[dict[str, Any]], by_label: dict[str, list[dict[str, Any]]],
                styles: dict[str, tuple[str, str]]) -> list[Path]:
    """distance.png (test accuracy per power-of-two distance bin at the training length, mean over seeds, one line per
    mechanism) and frontier.png (mean test accuracy against the training step time at 4,096 tokens: the
    compute-aware view). Called by the leaderboard writer with matplotlib already imported."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in board:
        cells = by_label.get(r["attention"], [])
        per_bin: dict[int, list[float]] = {}
        for c in cells:
            for b in c.get("acc_bins") or []:
                if b["acc"] is not None:
                    per_bin.setdefault(b["lo"], []).append(b["acc"])
        if per_bin:
            xs = sorted(per_bin)
            colour, marker = styles[r["attention"]]
            ax.plot(xs, [sum(per_bin[x]) / len(per_bin[x]) for x in xs], color=colour, marker=marker, ms=4,
                    label=r["attention"])
    train = task.recipe("default")
    for x, name in ((train.get("inside_max"), "inside"), (train.get("beyond_min"), "beyond")):
        if x:
            ax.axvline(x, color="0.4", ls="--", lw=0.8)
            ax.text(x, 1.01, name, fontsize=7, ha="center", transform=ax.get_xaxis_transform())
    ax.set_xscale("log", base=2)
    ax.set_xlabel("distance from the query to its pair's value (tokens, power-of-two bins)")
    ax.set_ylabel("test query accuracy (%), mean over seeds")
    ax.set_title(f"arena {task.name}: accuracy against distance", fontsize=10, pad=14)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    atomic_savefig(fig, out / "distance.png", dpi=120, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in board:
        ms = r.get("mean_step_ms_4096")
        if ms in ("", None) or r["mean_acc"] in ("", None):
            continue
        colour, marker = styles[r["attention"]]
        ax.plot([ms], [r["mean_acc"]], marker=marker, color=colour, ls="none", ms=7, label=r["attention"])
    ax.set_xscale("log")
    ax.set_xlabel("training step at 4,096 tokens, forward + backward, batch 1, one thread (ms)")
    ax.set_ylabel("test query accuracy (%) at the training length")
    ax.set_title(f"arena {task.name}: accuracy against cost at 4,096 tokens", fontsize=10)
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    atomic_savefig(fig, out / "frontier.png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return [out / "distance.png", out / "frontier.png"]
