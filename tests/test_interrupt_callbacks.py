"""A Ctrl-C that lands inside a weakref callback (the garbage collector runs them wherever an allocation triggers
it: matplotlib's WeakSets while ``kernelmap report`` draws) is not printed as "Exception ignored ... Traceback"
and is not lost: ``interrupt`` delivers it again, to raise in the main thread's own code. (It made
tests/test_interrupt.py::test_interrupted_report_leaves_nothing fail about one run in 25 here.)"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

SCRIPT = """
import os, signal, time, weakref
from kernelmap import interrupt

# a terminal's process: Python's own SIGINT handler (a test run in the background starts with SIGINT ignored,
# which install() rightly keeps ignored: tests/test_interrupt.py's fixture says the same)
signal.signal(signal.SIGINT, signal.default_int_handler)
handler = interrupt.install()

class Drawn:
    pass

def callback(_):  # the signal arrives here, and its handler runs here
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(100_000):
        pass

drawn = Drawn()
ref = weakref.ref(drawn, callback)
try:
    del drawn  # the callback runs
    deadline = time.monotonic() + 10  # the resend's thread may wait for a core on a busy machine
    while time.monotonic() < deadline:
        time.sleep(0.05)
    print("never raised")
except KeyboardInterrupt:
    print("raised in the main code", handler.signum == signal.SIGINT)
finally:
    interrupt.uninstall(handler)
"""


def test_a_signal_inside_a_weakref_callback_is_raised_in_the_main_code_unprinted():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "raised in the main code True", (r.stdout, r.stderr)
    assert "Exception ignored" not in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_hook_is_put_back_and_other_unraisables_pass_through():
    from kernelmap import interrupt

    before = sys.unraisablehook
    handler = interrupt.install()
    try:
        assert sys.unraisablehook.handler is handler and sys.unraisablehook.previous is before
        seen = []
        hook = handler.unraisable(seen.append)
        hook(SimpleNamespace(exc_value=ValueError("a real error in a callback")))
        hook(SimpleNamespace(exc_value=KeyboardInterrupt()))  # no signal caught: not the handler's, printed as before
        assert [type(u.exc_value) for u in seen] == [ValueError, KeyboardInterrupt]
    finally:
        interrupt.uninstall(handler)
    assert sys.unraisablehook is before
