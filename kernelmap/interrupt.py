"""Ctrl-C that survives C extensions.

Python's own SIGINT handler raises KeyboardInterrupt at the next bytecode. When that happens
inside a C extension's argument conversion (pybind11 in matplotlib's transforms, for one), the
extension may swallow it and raise something else, or nothing. ``install()`` puts in a handler
that also remembers the signal, so the CLI can still exit 130 and the atomic writers can refuse
to publish an output that was interrupted.
"""

from __future__ import annotations

import signal


class Sigint:
    """A SIGINT handler that records that the signal came, then raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.seen = False

    def __call__(self, signum, frame):
        self.seen = True
        raise KeyboardInterrupt


def install() -> Sigint:
    """Install a recording handler where Python's default one is in place (main thread only)."""
    handler = Sigint()
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: keep Python's handler
        pass
    return handler


def uninstall(handler: Sigint) -> None:
    if signal.getsignal(signal.SIGINT) is handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def seen() -> bool:
    """True when the installed handler has caught a SIGINT."""
    current = signal.getsignal(signal.SIGINT)
    return isinstance(current, Sigint) and current.seen


def raise_if_seen() -> None:
    """Raise KeyboardInterrupt if a SIGINT was caught and then lost inside a C extension."""
    if seen():
        raise KeyboardInterrupt
