"""Every command stops alike on Ctrl-C (SIGINT), SIGTERM or SIGHUP: the signal is raised as an exception (a
``KeyboardInterrupt``), so that atomic writes remove their temporary files and finished work is recorded before
the command says so in one line and exits with 128 + the signal's number (130, 143, 129), as a shell reports it.
"""

from __future__ import annotations

import contextlib
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A signal that asks the command to stop, raised where the command is."""

    def __init__(self, number: int):
        super().__init__(signal.Signals(number).name)
        self.signal = number


def signal_of(interruption: KeyboardInterrupt) -> int:
    """The signal behind an interruption (a plain ``KeyboardInterrupt`` is Ctrl-C's SIGINT)."""
    return getattr(interruption, "signal", signal.SIGINT)


def name(interruption: KeyboardInterrupt) -> str:
    return signal.Signals(signal_of(interruption)).name


def exit_status(interruption: KeyboardInterrupt) -> int:
    return 128 + signal_of(interruption)


def _raise(number, frame):
    raise Interrupted(number)


@contextlib.contextmanager
def raised():
    """While the block runs, SIGINT, SIGTERM and SIGHUP raise ``Interrupted``; a signal the caller ignores (e.g.
    SIGHUP under nohup) stays ignored. Only the main thread receives signals: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.getsignal(number) for number in SIGNALS}
    for number, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(number, _raise)
    try:
        yield
    finally:
        for number, handler in previous.items():
            if handler is not None:
                signal.signal(number, handler)
