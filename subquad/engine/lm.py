"""Character-level language modelling (bits per character): `train_lm`, `evaluate_bpc`, `load_lm`.

Random contiguous windows of the train memmap, AdamW with a linear warm-up to a fixed lr (the official fairseq
`fixed` schedule) in one or more phases, an optional wall-clock budget; BPC (= mean NLL / ln 2) on valid/test with
the paper's sliding-window protocol (`evaluate_bpc`: every scored token has at least `ctx - score` tokens of
context). The run directory is the image trainer's; `resume=True` (`--resume DIR`) continues from `last_state.pth`
exactly.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from subquad_cli.runconfig import LMConfig

from ..bench.memory import peak_memory_mb, rss_mb
from ..errors import UserError
from .checkpoint import read_json, write_json
from .distributed import DistInfo, all_reduce_sum, barrier, cleanup, init_distributed
from .loop import Loop, Position, Precision
from .steps import _device, _start_or_resume, _StepTask, _write_args

__all__ = ["LMConfig", "LM_TIMING_FIELDS", "train_lm", "evaluate_bpc", "build_lm", "load_lm", "lm_phases",
           "lm_model_args"]

_logger = logging.getLogger(__name__)


_PHASE_KEYS = ("seq_len", "batch_size", "steps", "lr", "warmup", "reset_optimizer")


def lm_phases(cfg: LMConfig) -> list[dict[str, Any]]:
    """The phases of `cfg` with every key filled and checked: [{seq_len, batch_size, steps, lr, warmup, first,
    last}], `first` / `last` the global steps (1-based, inclusive) of each phase, cut at `max_steps` when > 0."""
    if not cfg.phases:
        raw = [{"seq_len": cfg.seq_len, "batch_size": cfg.batch_size, "steps": cfg.max_steps, "lr": cfg.lr,
                "warmup": cfg.warmup}]
    else:
        raw = []
        for i, ph in enumerate(cfg.phases):
            if not isinstance(ph, dict):
                raise UserError(f"LM phases[{i}] must be a mapping of {', '.join(_PHASE_KEYS)}, got {ph!r}")
            unknown = sorted(set(ph) - set(_PHASE_KEYS))
            missing = [k for k in ("seq_len", "batch_size", "steps") if k not in ph]
            if unknown or missing:
                raise UserError(f"LM phases[{i}]: unknown key(s) {unknown} / missing {missing}; allowed: "
                                f"{', '.join(_PHASE_KEYS)} (seq_len, batch_size and steps required)")
            raw.append({"lr": cfg.lr, "warmup": cfg.warmup, **ph})
    out, first = [], 1
    cap = cfg.max_steps if cfg.phases else 0
    for i, ph in enumerate(raw):
        seq_len, bs, steps, lr, warm = (int(ph["seq_len"]), int(ph["batch_size"]), int(ph["steps"]),
                                        float(ph["lr"]), int(ph["warmup"]))
        if seq_len < 2 or bs < 1 or steps < 1 or lr <= 0 or warm < 0:
            raise UserError(f"LM phase {i}: need seq_len >= 2, batch_size >= 1, steps >= 1, lr > 0, warmup >= 0; "
                            f"got {seq_len}, {bs}, {steps}, {lr}, {warm}")
        last = first + steps - 1
        if cap and first > cap:
            break
        if cap:
            last = min(last, cap)
        out.append({"seq_len": seq_len, "batch_size": bs, "steps": steps, "lr": lr, "warmup": warm,
                    "reset_optimizer": bool(ph.get("reset_optimizer", False)), "first": first, "last": last})
        first = last + 1
    return out


def _phase_lr(phases: list[dict[str, Any]], step: int) -> tuple[int, float]:
    """(phase index, lr) of global step `step` (1-based): the phase's lr * min(1, j / warmup), j its local step."""
    for i, ph in enumerate(phases):
        if step <= ph["last"]:
            j = step - ph["first"] + 1
            return i, ph["lr"] * min(1.0, j / ph["warmup"]) if ph["warmup"] else ph["lr"]
    raise AssertionError(f"step {step} after the last phase")


def _lm_batch(train: np.ndarray, rng: np.random.Generator, seq_len: int, batch_size: int) -> np.ndarray:
    """(batch_size, seq_len + 1) training windows at random starts drawn from `rng` (whose state the resume file
    keeps, as a JSON string)."""
    starts = rng.integers(0, len(train) - seq_len - 1, size=batch_size)
    return np.stack([train[s:s + seq_len + 1] for s in starts]).astype(np.int64)


def lm_model_args(vocab_size: int, cfg: LMConfig) -> dict[str, Any]:
    """The keyword arguments of the `CharLM` that `build_lm` makes (also stored in checkpoint sidecars)."""
    return {"vocab_size": vocab_size, "dim": cfg.dim, "depth": cfg.depth, "num_heads": cfg.num_heads,
            "attention": cfg.attention, "ffn_dim": cfg.ffn_dim, "dropout": cfg.dropout,
            "emb_dropout": cfg.emb_dropout, "residual": cfg.residual,
            "attn_kw": dict(cfg.attn_kw.get(cfg.attention, {}))}


def build_lm(vocab_size: int, cfg: LMConfig, device: torch.device | None = None) -> nn.Module:
    """The character LM of `cfg`: `subquad.sequence.CharLM` with its width, depth, heads, FFN width (`ffn_dim`,
    0 = 4 d), dropout, residual form and the mechanism `attention` with `attn_kw[attention]`. Bad values are a
    UserError naming them."""
    from ..sequence.char_lm import CharLM

    if cfg.residual not in ("standard", "official"):
        raise UserError(f"LM residual must be 'standard' or 'official', got {cfg.residual!r}")
    for name in ("dropout", "emb_dropout"):
        if not 0.0 <= getattr(cfg, name) < 1.0:
            raise UserError(f"LM {name} must be in [0, 1), got {getattr(cfg, name)}")
    if cfg.ffn_dim < 0:
        raise UserError(f"LM ffn_dim must be >= 0 (0 = 4 * dim), got {cfg.ffn_dim}")
    a = lm_model_args(vocab_size, cfg)
    try:
        return CharLM(vocab_size, a["dim"], a["depth"], a["num_heads"], attention=a["attention"],
                      ffn_dim=a["ffn_dim"] or None, dropout=a["dropout"], emb_dropout=a["emb_dropout"],
                      residual=a["residual"], device=device, **a["attn_kw"])
    except ValueError as e:
        raise UserError(str(e).splitlines()[0]) from None


def _lm_logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return out[0] if isinstance(out, tuple) else out


@torch.no_grad()
def evaluate_bpc(model: nn.Module, data: np.ndarray, ctx: int, score: int, batch_size: int = 8,
                 max_tokens: int = 0, device: torch.device | None = None,
                 amp: Callable[[], contextlib.AbstractContextManager] | None = None) -> dict[str, float]:
    """Bits per character with sliding windows: context `ctx`, each window scores only its last `score` targets.

    The first window scores all of its targets; every later window advances by `score` tokens, so every target
    (data[1:]) is scored exactly once and, except in the first window, with at least ctx - score tokens of context
    (the paper's protocol: next 512 given the previous ones).

    `amp`: the autocast context of the forward (the log-softmax is taken in float32).

    Shapes: data (N,) uint8 ids.
    Returns: {"bpc", "nll" (nats per char), "tokens"}.
    """
    if ctx < 1 or not 1 <= score <= ctx:
        raise UserError(f"need ctx >= 1 and 1 <= score <= ctx, got ctx={ctx} and score={score}")
    if max_tokens < 0:  # would score no token and read as a perfect 0 bpc
        raise UserError(f"the number of tokens to score must be >= 0 (0 = the whole split), got {max_tokens}")
    device = device or next(model.parameters()).device
    model.eval()
    n = len(data)
    if n < 2:
        raise UserError(f"evaluation split has {n} tokens; need at least 2")
    last = n - 1
    if max_tokens:
        last = min(last, max_tokens)
    # Window k has inputs data[e - L : e] and targets data[e - L + 1 : e + 1]; it scores targets (prev_e, e].
    L = min(ctx, last)
    ends, scored, prev = [], [], 0
    e = L
    while prev < last:
        e = min(e, last)
        ends.append(e)
        scored.append(e - prev)
        prev = e
        e += score
    nll_sum, count = 0.0, 0
    for i in range(0, len(ends), batch_size):
        es, ss = ends[i:i + batch_size], scored[i:i + batch_size]
        x = torch.from_numpy(np.stack([data[e - L:e] for e in es]).astype(np.int64)).to(device)
        y = torch.from_numpy(np.stack([data[e - L + 1:e + 1] for e in es]).astype(np.int64)).to(device)
        with amp() if amp else contextlib.nullcontext():
            logits = _lm_logits(model, x)
        logp = F.log_softmax(logits.float(), dim=-1)
        nll = -logp.gather(-1, y[..., None])[..., 0]  # (b, L)
        keep = torch.arange(L, device=device)[None] >= (L - torch.tensor(ss, device=device))[:, None]
        nll_sum += nll[keep].sum().item()
        count += int(keep.sum().item())
    nats = nll_sum / max(count, 1)
    return {"bpc": nats / math.log(2), "nll": nats, "tokens": count}


def _load_split(root: Path, split: str) -> np.ndarray:
    from ..data.char import load_split

    return load_split(root, split)


# results.json / summary.csv fields of the LM run that measure time or memory (they differ between an uninterrupted
# and a resumed run; everything else is identical).
LM_TIMING_FIELDS = ("elapsed", "train_seconds", "train_cpu_seconds", "eval_seconds", "eval_cpu_seconds",
                    "wall_seconds", "peak_mem_mb")


def train_lm(cfg: LMConfig, log: Callable[[str], None] | None = None,
             model_fn: Callable[[int, LMConfig], nn.Module] | None = None,
             on_eval: Callable[[dict[str, Any]], None] | None = None,
             on_update: Callable[[Position], None] | None = None) -> dict[str, Any]:
    """Train the character LM on `cfg.data`: a prepared corpus (`subquad lm prepare`) or `enwik8:PATH` /
    `text8:PATH` (`subquad.data.char.read_standard`); returns metrics and paths.

    The phases of `cfg` (`lm_phases`) run in order, each with its sequence length, batch and warmed-up fixed lr.
    Every `eval_every` steps (and at the last step) the valid split (its first `eval_tokens` targets) is scored,
    `best.safetensors` keeps the weights of the lowest valid bpc and `last_state.pth` (model, optimizer, step, best
    so far, totals, RNG) is written, each atomically, the state last; `checkpoint_every` > 0 also writes the state
    every N steps, and SIGTERM / SIGINT write it and stop (`loop.Preempted`). Step s trains on windows drawn from
    the sampler RNG the state keeps and the torch RNG is re-seeded from (seed, s) after the evaluation at step s, so
    `cfg.resume=True` (same `output`) continues from the last state and ends with the same weights, summary.csv and
    results.json as an uninterrupted run (except `LM_TIMING_FIELDS`). At the end the best checkpoint is scored once
    on valid and test (`final_eval_tokens`, 0 = whole splits). `on_eval(row)` follows each periodic evaluation, its
    files written, with the summary.csv row plus `steps`; an exception there stops the run with those files intact.
    `on_update(position)` follows every step (tests).

    `cfg.amp`: autocast (`amp_dtype` bfloat16 or float16; a grad scaler for float16 on CUDA) in training and
    evaluation. Under torchrun (`torchrun --nproc_per_node N -m subquad lm train ...`; gloo on CPU, nccl on CUDA)
    each step draws one global batch of N * batch_size windows from the sampler RNG, exactly the draw of one process
    with batch N * batch_size, and rank r trains on slice r of it in a DistributedDataParallel model; the train loss
    is averaged over ranks, every rank scores the same evaluation windows (so the results equal one process's) and
    rank 0 alone writes files.
    """
    info = init_distributed(cfg.device)
    if not info.enabled:  # one process: the device as named (results.json records it)
        info = DistInfo(device=_device(cfg.device))
    if not info.is_main:
        log = lambda line: None  # noqa: E731
    try:
        return _train_lm(cfg, info, log, model_fn, on_eval, on_update)
    finally:
        cleanup(info)


def _train_lm(cfg: LMConfig, info: DistInfo, log: Callable[[str], None] | None,
              model_fn: Callable[[int, LMConfig], nn.Module] | None, on_eval: Callable[[dict[str, Any]], None] | None,
              on_update: Callable[[Position], None] | None) -> dict[str, Any]:
    from ..data.char import open_corpus

    log = log or _logger.info
    torch.manual_seed(cfg.seed)
    device = info.device
    if cfg.amp_dtype not in ("bfloat16", "float16"):
        raise UserError(f"--amp-dtype must be bfloat16 or float16, got {cfg.amp_dtype!r}")
    if cfg.amp and cfg.amp_dtype == "float16" and device.type == "cpu":
        _logger.warning("--amp-dtype float16 on CPU is slow and has no grad scaler; bfloat16 is the usual choice")
    if cfg.eval_every < 1:
        raise UserError(f"--eval-every must be >= 1, got {cfg.eval_every}")
    if cfg.clip_grad < 0:
        raise UserError(f"--clip-grad must be >= 0 (0 = off), got {cfg.clip_grad:g}")
    if cfg.eval_tokens < 0 or cfg.final_eval_tokens < 0:
        raise UserError(f"--eval-tokens and --final-eval-tokens must be >= 0 (0 = the whole split), got "
                        f"{cfg.eval_tokens} and {cfg.final_eval_tokens}")
    if not cfg.phases and (cfg.max_steps < 1 or cfg.batch_size < 1 or cfg.seq_len < 2):
        raise UserError(f"need --max-steps >= 1, --batch-size >= 1, --seq-len >= 2; got {cfg.max_steps}, "
                        f"{cfg.batch_size}, {cfg.seq_len}")
    phases = lm_phases(cfg)
    total = phases[-1]["last"]
    meta, data = open_corpus(cfg.data)
    if len(data["train"]) <= max(ph["seq_len"] for ph in phases) + 1:
        raise UserError(f"training split has {len(data['train'])} tokens; need more than the sequence length + 1 = "
                        f"{max(ph['seq_len'] for ph in phases) + 1}")
    out = Path(cfg.output or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-lm-{cfg.attention}")
    state, done = _start_or_resume(out, cfg, total, log)
    barrier(info)  # every rank has checked `out` before rank 0 writes into it
    if done is not None:
        return done
    model = (model_fn or build_lm)(int(meta["vocab_size"]), cfg).to(device)
    fwd: nn.Module = model
    if info.enabled:
        fwd = nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=phases[0]["lr"], weight_decay=cfg.weight_decay)
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
    clip = (lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)) if cfg.clip_grad > 0 else None
    loop = Loop(model=model, optimizer=optimizer, precision=Precision(device, cfg.amp, cfg.amp_dtype),
                state_path=out / "last_state.pth", info=info, clip=clip, checkpoint_every=cfg.checkpoint_every,
                sync_cuda=True)
    task = _LMTask(cfg, loop, phases, meta, data, out, log, on_eval, on_update)
    task.fwd = fwd
    if state is not None:
        task.load(loop.for_rank(state))
        loop.load_state_dict(state, Position(**state["position"]) if "position" in state else
                             Position(0, int(state["step"]), int(state["step"])))
        log(f"resuming {out} after step {loop.pos.step} of {total}")
    elif info.is_main:
        _write_args(out, cfg)
    note = " (not comparable to enwik8/text8)" if meta.get("name") not in ("enwik8", "text8") else ""
    log(f"lm: attention={cfg.attention} params={task.n_params} vocab={meta['vocab_size']} "
        f"train_tokens={len(data['train'])} "
        f"phases={[(p['seq_len'], p['batch_size'], p['last'] - p['first'] + 1) for p in phases]} device={device} "
        + (f"ranks={info.world_size} " if info.enabled else "") + (f"amp={cfg.amp_dtype} " if cfg.amp else "")
        + f"(corpus {meta.get('name', '?')}{note})")
    task.wall0 = time.perf_counter() - task.tot["wall_seconds"]
    loop.fit(task)
    return _lm_results(cfg, task, loop.pos.step, device)


class _LMTask(_StepTask):
    """The character LM: one endless stream of random windows, the phase schedule before each step, the valid split
    scored (bits per character)."""

    ARCH, COUNTER = "char_lm", "eval_tokens"

    def __init__(self, cfg: LMConfig, loop: Loop, phases: list[dict[str, Any]], meta: dict[str, Any],
                 data: dict[str, np.ndarray], out: Path, log: Callable[[str], None],
                 on_eval: Callable | None, on_update: Callable | None) -> None:
        super().__init__(cfg, loop, phases[-1]["last"], out, log, on_eval, on_update)
        self.phases, self.meta, self.data = phases, meta, data
        model_args = lm_model_args(int(meta["vocab_size"]), cfg)
        self.side = {"arch": "char_lm", "model_args": model_args, "corpus": meta.get("name", ""),
                     "variant": meta.get("variant", ""), "vocab": meta.get("vocab"), "args": asdict(cfg)}
        self.rss0 = rss_mb()
        self.best_bpc, self.best_step = float("inf"), 0
        self.rng = np.random.default_rng(cfg.seed)
        self.fwd: nn.Module = self.model  # the training forward (DistributedDataParallel under torchrun)

    def zero_sums(self) -> dict[str, Any]:
        return {"loss_sum": 0.0, "k": 0}

    def load(self, state: dict[str, Any]) -> None:
        super().load(state)
        self.rng.bit_generator.state = json.loads(state["sampler"])
        self.best_bpc, self.best_step = float(state["best_bpc"]), int(state["best_step"])

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "best_bpc": self.best_bpc, "best_step": self.best_step,
                "sampler": json.dumps(self.rng.bit_generator.state)}

    def batches(self, epoch: int, skip: int) -> Iterator[torch.Tensor]:
        for step in itertools.count(skip + 1):
            ph = self.phases[_phase_lr(self.phases, step)[0]]
            b, info = ph["batch_size"], self.loop.info
            # One global batch (the draw of one process with batch world * b); rank r takes slice r.
            xy = _lm_batch(self.data["train"], self.rng, ph["seq_len"], b * info.world_size)
            if info.enabled:
                xy = xy[info.rank * b:(info.rank + 1) * b]
            yield torch.from_numpy(xy).to(self.device)

    def before_update(self, pos: Position) -> None:
        step = pos.step + 1
        self.pi, self.lr = _phase_lr(self.phases, step)
        ph = self.phases[self.pi]
        if step == ph["first"] and len(self.phases) > 1:
            self.log(f"phase {self.pi + 1}/{len(self.phases)}: seq_len {ph['seq_len']}, batch {ph['batch_size']}, "
                     f"steps {ph['first']}-{ph['last']}, lr {ph['lr']:g} after {ph['warmup']} warm-up steps"
                     + (", fresh optimizer" if ph["reset_optimizer"] else ""))
        if step == ph["first"] and ph["reset_optimizer"]:
            self.loop.optimizer = torch.optim.AdamW(self.model.parameters(), lr=ph["lr"],
                                                    weight_decay=self.cfg.weight_decay)
        for g in self.loop.optimizer.param_groups:
            g["lr"] = self.lr

    def loss(self, xy: torch.Tensor) -> torch.Tensor:
        logits = _lm_logits(self.fwd, xy[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), xy[:, 1:].reshape(-1))

    def after_batch(self, pos: Position, loss: torch.Tensor, batch: Any, seconds: float, cpu: float) -> None:
        self.tot["train_seconds"] += seconds
        self.tot["train_cpu_seconds"] += cpu
        self.sums["loss_sum"] += loss.item()
        self.sums["k"] += 1

    def after_update(self, pos: Position) -> bool:
        cfg = self.cfg
        self.out_of_time = cfg.max_minutes > 0 and time.perf_counter() - self.t_start > cfg.max_minutes * 60.0
        if cfg.max_minutes > 0 and self.loop.info.enabled:  # DDP: every rank stops at the same step
            self.out_of_time = all_reduce_sum([float(self.out_of_time)], self.loop.info)[0] > 0
        return super().after_update(pos)

    def should_stop(self, pos: Position) -> bool:
        if self.out_of_time:
            self.log(f"time budget of {self.cfg.max_minutes} min reached at step {pos.step}")
        return self.out_of_time

    def evaluate(self) -> dict[str, Any]:
        cfg = self.cfg
        # Every rank scores the same windows with the same weights: the result of one process.
        ev = evaluate_bpc(self.model, self.data["valid"], cfg.eval_ctx, cfg.eval_score, cfg.eval_batch,
                          cfg.eval_tokens, self.device, self.loop.precision.autocast)
        return {**ev, "n": ev["tokens"]}

    def record(self, step: int, ev: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], bool]:
        loss_sum, k = self.sums["loss_sum"], self.sums["k"]
        info = self.loop.info
        if info.enabled:  # each rank's loss is the mean over its equal slice: average the ranks
            loss_sum = all_reduce_sum([loss_sum], info)[0] / info.world_size
        ph = self.phases[self.pi]
        row = {"step": step, "phase": self.pi + 1, "seq_len": ph["seq_len"], "train_loss": loss_sum / k,
               "train_bpc": loss_sum / k / math.log(2), "valid_bpc": ev["bpc"], "valid_tokens": ev["tokens"],
               "lr": self.lr, "elapsed": time.perf_counter() - self.wall0}
        self.log(f"step {step}  train_bpc {row['train_bpc']:.3f}  valid_bpc {ev['bpc']:.3f}  ({row['elapsed']:.0f}s)")
        sidecar = {**self.side, "step": step, "metrics": {"valid_bpc": ev["bpc"]}}
        better = ev["bpc"] < self.best_bpc
        if better:
            self.best_bpc, self.best_step = ev["bpc"], step
        return row, sidecar, better


def _lm_results(cfg: LMConfig, task: _LMTask, step: int, device: torch.device) -> dict[str, Any]:
    """Score the best checkpoint once on valid (and test unless `final_test` is off); results.json."""
    from safetensors.torch import load_file

    model, meta, phases, tot = task.model, task.meta, task.phases, task.tot
    info, amp = task.loop.info, task.loop.precision.autocast
    peak = peak_memory_mb(device, task.rss0)
    barrier(info)  # rank 0 has written best.safetensors
    model.load_state_dict(load_file(task.out / "best.safetensors"))
    ft = cfg.final_eval_tokens
    v = evaluate_bpc(model, task.data["valid"], cfg.eval_ctx, cfg.eval_score, cfg.eval_batch, ft, device, amp)
    t = (evaluate_bpc(model, task.data["test"], cfg.eval_ctx, cfg.eval_score, cfg.eval_batch, ft, device, amp)
         if cfg.final_test else {"bpc": None, "tokens": 0})
    metric = "bpc" if meta.get("variant") == "chars" else "bpb"
    train_tokens = sum((min(step, p["last"]) - p["first"] + 1) * p["batch_size"] * info.world_size * p["seq_len"]
                       for p in phases if step >= p["first"])
    tot["wall_seconds"] = time.perf_counter() - task.wall0
    results = {"corpus": meta.get("name", ""), "variant": meta.get("variant", ""), "metric": metric,
               "attention": cfg.attention, "params": task.n_params, "steps": step, "valid_bpc": v["bpc"],
               "test_bpc": t["bpc"], "valid_tokens": v["tokens"], "test_tokens": t["tokens"],
               "eval_ctx": cfg.eval_ctx, "eval_score": cfg.eval_score, "best_step": task.best_step,
               "best_periodic_valid_bpc": task.best_bpc, "selected_on": "valid", "train_tokens": train_tokens, **tot,
               "peak_mem_mb": peak,
               "peak_mem_kind": "cuda_max_allocated" if device.type == "cuda" else "cpu_peak_rss_growth",
               "device": str(device), "output": os.fspath(task.out),
               "checkpoint": os.fspath(task.out / "best.safetensors")}
    if info.is_main:
        write_json(results, task.out / "results.json")
    return results


def load_lm(checkpoint: str | os.PathLike, device: torch.device | None = None,
            model_fn: Callable[[int, LMConfig], nn.Module] | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild a character LM from `<name>.safetensors` + its JSON sidecar; returns (model in eval mode, sidecar)."""
    from safetensors.torch import load_file

    path = Path(checkpoint)
    if path.is_dir():
        path = path / "best.safetensors"
    side_path = path.with_suffix(".json")
    if not path.is_file() or not side_path.is_file():
        raise UserError(f"checkpoint {path} (with its sidecar {side_path.name}) not found; pass a run directory or "
                        "a .safetensors file written by `subquad lm train`")
    side = read_json(side_path)
    if side.get("arch") != "char_lm":
        raise UserError(f"{path} is not a character-LM checkpoint (arch {side.get('arch')!r})")
    ma = side["model_args"]
    # Sidecars written before ffn_dim / dropout / residual were recorded: CharLM's defaults then (4 d, 0, official).
    cfg = LMConfig(dim=ma["dim"], depth=ma["depth"], num_heads=ma["num_heads"], attention=ma["attention"],
                   attn_kw={ma["attention"]: ma.get("attn_kw", {})}, ffn_dim=int(ma.get("ffn_dim", 0)),
                   dropout=float(ma.get("dropout", 0.0)), emb_dropout=float(ma.get("emb_dropout", 0.0)),
                   residual=ma.get("residual", "official"))
    model = (model_fn or build_lm)(int(ma["vocab_size"]), cfg)
    from .legacy import remap_legacy

    model.load_state_dict(remap_legacy(load_file(path), model))
    model.to(device or torch.device("cpu")).eval()
    return model, side
