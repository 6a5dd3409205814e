"""The shared training loop (subquad.engine.loop) on a toy task: accumulation, clipping, precision, the
resumable state inside an epoch, SIGTERM; and the structure rules of subquad/engine (no import circle, short
functions)."""

from __future__ import annotations

import ast
import signal
from pathlib import Path

import pytest
import torch
from torch import nn

from subquad.engine.checkpoint import load_state
from subquad.engine.distributed import GlobalBatchSampler
from subquad.engine.loop import Loop, Position, Precision, Preempted, TrainTask
from subquad.engine.rng import seed_everything

ROOT = Path(__file__).resolve().parents[1]
X, Y = torch.randn(24, 4, generator=torch.Generator().manual_seed(0)), torch.randn(24, 1)


class _Toy(TrainTask):
    """A dropout regressor over a seeded sampler: 3 epochs of 6 batches of 4."""

    epochs = 3

    def __init__(self, model: nn.Module, stop_at: int = 0) -> None:
        self.model, self.stop_at = model, stop_at
        self.sampler = GlobalBatchSampler(24, 4, seed=1)
        self.loss_sum = 0.0

    def start_epoch(self, epoch: int, fresh: bool) -> None:
        seed_everything(100 + epoch)

    def batches(self, epoch: int, skip: int):
        self.sampler.set_epoch(epoch, skip)
        idx = list(self.sampler)
        return [(X[idx[i:i + 4]], Y[idx[i:i + 4]]) for i in range(0, len(idx), 4)]

    def epoch_len(self, epoch: int) -> int:
        return 6

    def loss(self, batch) -> torch.Tensor:
        x, y = batch
        return ((self.model(x) - y) ** 2).mean()

    def after_batch(self, pos, loss, batch, seconds, cpu) -> None:
        self.loss_sum += loss.item()

    def after_update(self, pos: Position) -> bool:
        if pos.step == self.stop_at:
            signal.raise_signal(signal.SIGTERM)
        return False

    def state_dict(self) -> dict:
        return {"loss_sum": self.loss_sum}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.3), nn.Linear(8, 1))


def _loop(model: nn.Module, path: Path, **kw) -> Loop:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return Loop(model=model, optimizer=opt, precision=Precision(torch.device("cpu"), False), state_path=path, **kw)


def test_accumulation_and_clipping_match_a_hand_written_loop(tmp_path):
    model = _model()
    loop = _loop(model, tmp_path / "s.pth", accum_steps=4,
                 clip=lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1))
    task = _Toy(model)
    assert loop.fit(task) == Position(3, 0, 3 * 2)  # 6 batches, 4 per update and the tail of 2: 2 updates/epoch
    ref = _model()
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for epoch in range(3):
        seed_everything(100 + epoch)
        for i, (x, y) in enumerate(task.batches(epoch, 0)):
            (((ref(x) - y) ** 2).mean() / 4).backward()
            if (i + 1) % 4 == 0 or i + 1 == 6:
                torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.1)
                opt.step()
                opt.zero_grad(set_to_none=True)
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.equal(a, b)


def test_sigterm_inside_an_epoch_resumes_to_the_uninterrupted_weights(tmp_path, caplog):
    full = _model()
    _loop(full, tmp_path / "full.pth").fit(_Toy(full))

    part = _model()
    handler = signal.getsignal(signal.SIGTERM)
    with caplog.at_level("WARNING", logger="subquad.engine.loop"), pytest.raises(Preempted) as e:
        _loop(part, tmp_path / "part.pth").fit(_Toy(part, stop_at=8))  # epoch 2, batch 2
    assert e.value.code == 143 and e.value.position == Position(1, 2, 8)
    assert signal.getsignal(signal.SIGTERM) is handler  # the loop's handler is gone again
    err = [r.getMessage() for r in caplog.records if r.name == "subquad.engine.loop"]
    assert len(err) == 1 and "SIGTERM" in err[0] and str(tmp_path / "part.pth") in err[0]
    state = load_state(tmp_path / "part.pth")
    assert state["position"] == {"epoch": 1, "batch": 2, "step": 8} and "model" in state

    resumed = _model()  # fresh weights: the state holds the trained ones
    loop = _loop(resumed, tmp_path / "part.pth")
    task = _Toy(resumed)
    loop.load_state_dict(state, Position(**state["position"]))
    loop.fit(task)
    for a, b in zip(full.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_checkpoint_every_writes_the_state_at_its_updates(tmp_path):
    model = _model()
    seen = []

    class _Watch(_Toy):
        def after_update(self, pos):
            p = tmp_path / "s.pth"
            seen.append(load_state(p)["position"]["step"] if p.exists() else None)
            return False

    _loop(model, tmp_path / "s.pth", checkpoint_every=5).fit(_Watch(model))
    # Before update s the file holds the state of the last multiple of 5 below s.
    assert seen == [None] * 5 + [5] * 5 + [10] * 5 + [15] * 3


def test_precision_scaler_only_for_float16_on_cuda():
    cpu = torch.device("cpu")
    assert Precision(cpu, True, "float16").scaler is None
    assert Precision(cpu, True, "bfloat16").enabled and Precision(cpu, True, "bfloat16").scaler is None
    assert not Precision(cpu, True, "float16", cpu=False).enabled
    with Precision(cpu, True, "bfloat16").autocast():
        assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == torch.bfloat16


def _engine_modules() -> dict[str, Path]:
    return {p.stem: p for p in (ROOT / "subquad" / "engine").glob("*.py")}


def test_no_module_level_import_circle_in_engine():
    mods = _engine_modules()
    graph = {}
    for name, path in mods.items():
        deps = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
        graph[name] = deps & set(mods)

    def reach(start, node, seen):
        for nxt in graph[node]:
            if nxt == start:
                return True
            if nxt not in seen:
                seen.add(nxt)
                if reach(start, nxt, seen):
                    return True
        return False

    assert [m for m in graph if reach(m, m, set())] == []


def test_engine_functions_are_at_most_80_lines():
    files = list(_engine_modules().values()) + [ROOT / "subquad" / "dense" / "engine.py"]
    long = [f"{p.name}:{n.name} ({n.end_lineno - n.lineno + 1})" for p in files
            for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > 80]
    assert long == []


def test_sigterm_during_the_epoch_end_stops_after_it(tmp_path):
    class _SlowEval(_Toy):
        def end_epoch(self, pos):
            if pos.epoch == 0:
                signal.raise_signal(signal.SIGTERM)  # arrives during the (long) evaluation of epoch 1
            return False

    full = _model()
    _loop(full, tmp_path / "full.pth").fit(_Toy(full))
    part = _model()
    with pytest.raises(Preempted) as e:
        _loop(part, tmp_path / "part.pth").fit(_SlowEval(part))
    assert e.value.position == Position(1, 0, 6)
    state = load_state(tmp_path / "part.pth")
    resumed = _model()
    loop = _loop(resumed, tmp_path / "part.pth")
    resumed.load_state_dict(part.state_dict())  # an epoch-end state: the task's own files hold the weights
    loop.load_state_dict(state, Position(**state["position"]))
    loop.fit(_Toy(resumed))
    for a, b in zip(full.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_a_second_signal_of_the_other_kind_does_not_cut_the_stop_short():
    """A terminal's Ctrl-C reaches a trainer and the process that started it (the arena runner), which then stops it
    with SIGTERM: the trainer keeps the SIGINT it recorded and still writes its state. SIGINT twice acts as usual."""
    from subquad.engine.loop import StopSignals

    class Escalated(Exception):
        pass

    def escalate(signum, frame):
        raise Escalated(signum)

    old = {s: signal.signal(s, escalate) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with StopSignals() as stop:
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGTERM)
            assert stop.signum == signal.SIGINT
            with pytest.raises(Escalated) as e:
                signal.raise_signal(signal.SIGINT)
            assert e.value.args == (signal.SIGINT,)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
