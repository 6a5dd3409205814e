"""The shared signal-handler base (`subquad.engine.signals.SignalHandlers`) of the training loop's stop signals
and the arena runner's interrupts."""

from __future__ import annotations

import os
import signal
import threading

from subquad.arena.runner import _Interrupts
from subquad.engine.loop import StopSignals
from subquad.engine.signals import SignalHandlers


class _Record(SignalHandlers):
    SIGNALS = (signal.SIGUSR1,)

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def _handle(self, signum, frame) -> None:
        self.seen.append(signum)


def test_installs_while_active_and_restores_the_previous_handler():
    before = signal.getsignal(signal.SIGUSR1)
    with _Record() as rec:
        assert signal.getsignal(signal.SIGUSR1) == rec._handle
        assert rec.previous(signal.SIGUSR1) == before
        os.kill(os.getpid(), signal.SIGUSR1)
    assert rec.seen == [signal.SIGUSR1]
    assert signal.getsignal(signal.SIGUSR1) == before


def test_outside_the_main_thread_it_installs_nothing():
    before, inside = signal.getsignal(signal.SIGUSR1), []

    def run() -> None:
        with _Record() as rec:
            inside.append((signal.getsignal(signal.SIGUSR1), dict(rec._old)))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert inside == [(before, {})]


def test_stop_signals_and_arena_interrupts_share_the_base():
    for cls in (StopSignals, _Interrupts):
        assert issubclass(cls, SignalHandlers)
        assert not {"__enter__", "__exit__"} & set(vars(cls)), cls  # the install/restore code is the base's only
