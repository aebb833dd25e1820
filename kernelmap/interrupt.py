"""Ctrl-C (and SIGTERM) that survive C extensions.

Python's own SIGINT handler raises KeyboardInterrupt at the next bytecode. When that happens
inside a C extension's argument conversion (pybind11 in matplotlib's transforms, for one), the
extension may swallow it and raise something else, or nothing. ``install()`` puts in a handler
that also remembers the signal, so the CLI can still exit 128 + signal and the atomic writers can
refuse to publish an output that was interrupted.

SIGTERM (a job runner's timeout, ``kill``) gets the same handler, so that a terminated
``kernelmap run`` still stops its workers, which run in their own process groups, and removes
its temporary directory.

A signal may also arrive while the garbage collector runs a weakref callback or a ``__del__`` (it runs them
wherever an allocation triggers it: matplotlib's WeakSets while the report draws). Python cannot raise out of
those: it prints "Exception ignored in ... KeyboardInterrupt" and goes on. While the handler is installed, such
a KeyboardInterrupt of the handler's is not printed: a thread of its own sends the signal to the main thread again
``RESEND_S`` later, to raise in the main thread's own code once the callback has returned (sent from the hook, it
would be handled inside the hook, and lost again; landing in another callback, it is sent again).
"""

from __future__ import annotations

import _thread
import contextlib
import signal
import sys
import threading
import time

_PYTHON_DEFAULT = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
RESEND_S = 0.01  # a signal lost in a weakref callback: sent again this much later (a callback takes microseconds)


def _resend(thread: int, signum: int) -> None:
    time.sleep(RESEND_S)
    signal.pthread_kill(thread, signum)


class Interrupt:
    """A handler for SIGINT and SIGTERM that records the signal, then raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.deferring = 0  # > 0 inside ``deferred()``: record now, raise on leaving

    @property
    def seen(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or signal.SIGINT)

    def __call__(self, signum, frame):
        self.signum = signum
        if not self.deferring:
            raise KeyboardInterrupt

    def unraisable(self, previous):
        """A ``sys.unraisablehook`` that delivers the signal again where its KeyboardInterrupt was raised inside a
        weakref callback or ``__del__`` (see the module docstring); anything else goes to ``previous``."""

        def hook(unraisable) -> None:
            if isinstance(unraisable.exc_value, KeyboardInterrupt) and self.seen:
                # not threading.Thread: its start() waits for the thread, and the signal would land in that wait
                _thread.start_new_thread(_resend, (threading.main_thread().ident, self.signum))
                return
            previous(unraisable)

        hook.handler, hook.previous = self, previous
        return hook


def install() -> Interrupt:
    """Install the recording handler where Python's default one is in place (main thread only)."""
    handler = Interrupt()
    for sig, default in _PYTHON_DEFAULT.items():
        try:
            if signal.getsignal(sig) is default:
                signal.signal(sig, handler)
        except ValueError:  # not the main thread: keep Python's handlers
            return handler
    sys.unraisablehook = handler.unraisable(sys.unraisablehook)
    return handler


def uninstall(handler: Interrupt) -> None:
    for sig, default in _PYTHON_DEFAULT.items():
        try:
            if signal.getsignal(sig) is handler:
                signal.signal(sig, default)
        except ValueError:
            break
    hook = sys.unraisablehook
    if getattr(hook, "handler", None) is handler:
        sys.unraisablehook = hook.previous


def seen() -> bool:
    """True when the installed handler has caught a signal."""
    current = signal.getsignal(signal.SIGINT)
    return isinstance(current, Interrupt) and current.seen


def raise_if_seen() -> None:
    """Raise KeyboardInterrupt if a signal was caught and then lost inside a C extension."""
    if seen():
        raise KeyboardInterrupt


@contextlib.contextmanager
def deferred():
    """A block a signal must not cut in two (starting a worker: a KeyboardInterrupt raised inside
    ``subprocess.Popen`` after the child exists, but before its handle is returned, would leave that
    child running unseen). A signal arriving inside is recorded and raised as KeyboardInterrupt on
    leaving the block."""
    handler = signal.getsignal(signal.SIGINT)
    if not isinstance(handler, Interrupt):
        yield
        return
    handler.deferring += 1
    try:
        yield
    finally:
        handler.deferring -= 1
    if handler.seen and not handler.deferring:
        raise KeyboardInterrupt
