"""Temporary signal handlers: the install/restore part that the training loop's stop signals
(`engine.loop.StopSignals`) and the arena runner's interrupts share. No torch here: the arena runner imports it."""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["SignalHandlers"]


class SignalHandlers:
    """A context manager that, while active, sends the signals in `SIGNALS` to `_handle(signum, frame)` and on exit
    restores the handlers they had. Python runs signal handlers in the main thread only, so in another thread it
    installs nothing (and restores nothing). Subclasses set `SIGNALS` and define `_handle`."""

    SIGNALS: tuple[signal.Signals, ...] = ()

    def __init__(self) -> None:
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        raise NotImplementedError

    def previous(self, signum: int) -> Any:
        """The handler `signum` had before this one was installed (the default one if none was recorded)."""
        return self._old.get(signum, signal.SIG_DFL)

    def __enter__(self) -> SignalHandlers:
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old = {}
