"""The worker processes of a run: start one, tee its stderr, stop its group, say what failed.

Each worker (``python -m kernelmap.worker``, or nsys wrapping it) runs in its own process group, so
that Ctrl-C reaches only this process, which then stops the group (``stop_group``). ``RunProgress``
prints one line per worker.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .. import interrupt, stall
from ..errors import KernelmapError
from ..frameworks.registry import NsysWindow

EXIT_OOM = 75  # kernelmap.worker.EXIT_OOM (not imported: the worker module imports numpy only, but stay lean)
# a line that states an error: a Python exception's (``torch._dynamo.exc.InternalTorchDynamoError: ...``) or ours
ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception)|kernelmap-worker: error)\b.*:")


def error_line(text: str) -> str:
    """The line of a worker's stderr tail that says what went wrong: the last exception or error line
    (torch.compile prints advice after its traceback: "Set TORCHDYNAMO_VERBOSE=1 ..."), else the last line."""
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    errors = [line for line in lines if ERROR_LINE.match(line)]
    return errors[-1] if errors else (lines[-1] if lines else "")


class _StderrTee(threading.Thread):
    """Copy a worker's stderr into its log file (and to ours where asked) as it arrives, keeping a tail."""

    def __init__(self, stream, forward: bool, log=None):
        super().__init__(daemon=True)
        self.stream = stream
        self.forward = forward
        self.log = log
        self.tail: collections.deque[bytes] = collections.deque(maxlen=64)

    def run(self) -> None:
        out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
        for chunk in iter(lambda: self.stream.read1(65536), b""):
            self.tail.append(chunk)
            if self.log is not None:
                self.log.write(chunk)
                self.log.flush()  # in order with what the stall guard appends (stall.native_stacks)
            if self.forward:
                if out is not None:
                    out.write(chunk)
                    out.flush()
                else:
                    sys.stderr.write(chunk.decode(errors="replace"))

    def last_line(self) -> str:
        return error_line(b"".join(self.tail).decode(errors="replace"))


# the fatal signals Python's faulthandler dumps every thread's stack on (the worker enables it first: stall.py)
CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT)


def log_place(log_path: Path | None) -> str:
    """Where a worker's stderr went, as its messages name it."""
    return f"the run's {log_path.parent.name}/{log_path.name}" if log_path is not None else "our stderr"


def died_of(signum: int, log_path: Path | None) -> str:
    """What a worker's death by ``signum`` says: a crash (its stacks in its log), or a kill from outside."""
    try:
        sig = signal.Signals(signum)
    except ValueError:
        return f"worker died of signal {signum}"
    if sig in CRASH_SIGNALS:
        return (f"worker died of {sig.name} (a crash inside the framework or a library it loaded); every thread's "
                f"Python stack in {log_place(log_path)}")
    if sig == signal.SIGKILL:
        return "worker killed (SIGKILL: the kernel's out-of-memory killer or another process)"
    return f"worker stopped by {sig.name} from another process"


def stop_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the process group led by ``proc``, then SIGKILL it if it is not gone in ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace_s)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # the leader is gone; stragglers of its group are not
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def stop_leftovers(proc: subprocess.Popen, log_fh=None) -> bool:
    """After ``proc`` exited: SIGKILL whatever is left of its process group and say so in its log; True where
    something was. A worker's own children outlive it when it dies first: on the H200s ``ncu`` crashed
    (SIGSEGV) under JAX, its target process stayed, holding 75% of the GPU's memory (XLA's preallocation),
    and every later case on that GPU ran out of memory."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    if log_fh is not None:
        log_fh.write(b"\nkernelmap: processes of this worker's process group were still running after it exited "
                     b"(a child it started, e.g. ncu's target after ncu itself died): killed\n")
        log_fh.flush()
    return True


def _wait(proc: subprocess.Popen, stall_s: float | None, log_path: Path | None) -> int | str | None:
    """``proc``'s exit status; where it is still running after ``stall_s`` seconds, the workers of its process
    group are sent ``stall.STACKS_SIGNAL`` (they write every thread's Python stack to their stderr), given
    ``stall.DUMP_WAIT_S``, its native stacks added to ``log_path`` (``stall.native_stacks``) and killed: then
    the tool that took the native stacks ("" where none did)."""
    try:
        return proc.wait(timeout=stall_s)
    except subprocess.TimeoutExpired:
        pass
    stall.ask_for_stacks(proc.pid)
    time.sleep(stall.DUMP_WAIT_S)  # faulthandler writes from its handler, at once
    native = stall.native_stacks(proc.pid, log_path) if log_path is not None else None
    stop_group(proc, grace_s=stall.DUMP_WAIT_S)
    return native or ""


def run_worker(cmd: list[str], *, label: str, batch_size: int, env: dict[str, str] | None = None,
               stdout_path: Path | None = None, forward_stderr: bool = True, log_path: Path | None = None,
               stall_s: float | None = None) -> None:
    """Run one worker command; raise ``KernelmapError`` (one line) when it fails, or when it is still running
    after ``stall_s`` seconds (None: no limit; ``kernelmap.stall``), once its stacks are out and its group killed.

    The worker's stdout goes to ``stdout_path`` (library verbose lines), else to ``log_path``, else
    to our stderr, so that our stdout stays clean for ``--json``. Its stderr (third-party warnings,
    library chatter) goes to ``log_path`` and, with ``forward_stderr``, to our stderr too.
    """
    log_fh = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_fh = open(log_path, "ab")  # noqa: SIM115
    stdout_fh = open(stdout_path, "wb") if stdout_path else None  # noqa: SIM115
    try:
        # Its own process group: a terminal's Ctrl-C reaches only this process, which then stops the
        # worker (and nsys with its target) as a group. A worker that got the SIGINT itself could be
        # mid-import and print Python's startup traceback.
        proc = None
        try:
            with interrupt.deferred():  # a signal here is raised once ``proc`` is known, below
                proc = subprocess.Popen(cmd, env=env, stdout=stdout_fh or log_fh or sys.stderr.fileno(),
                                        stderr=subprocess.PIPE, process_group=0)
                tee = _StderrTee(proc.stderr, forward_stderr, log_fh)
                tee.start()
            rc = _wait(proc, stall_s, log_path)
            stop_leftovers(proc, log_fh)  # before the tee's join: a leftover holds the stderr pipe open
        except BaseException:  # Ctrl-C: the worker must be gone before the run dir is removed
            if proc is not None:
                tee.forward = False
                stop_group(proc)
            raise
        tee.join(timeout=10)
    finally:
        if stdout_fh:
            stdout_fh.close()
        if log_fh:
            log_fh.close()
    if isinstance(rc, str):
        where = log_place(log_path)
        raise KernelmapError(f"{label}: stalled: still running after its stall limit of {stall_s:.0f} s "
                             f"(kernelmap run --stall-limit), its process group killed; every thread's stack "
                             f"(Python: signal {stall.STACKS_SIGNAL.name}{', native: ' + rc if rc else ''}) in {where}")
    if rc == EXIT_OOM:
        raise KernelmapError(f"{label}: out of memory at batch size {batch_size}; "
                             f"try a smaller --batch-size ({tee.last_line()})")
    if isinstance(rc, int) and rc < 0:
        raise KernelmapError(f"{label}: {died_of(-rc, log_path)}")
    if rc != 0:
        raise KernelmapError(f"{label}: worker exited {rc}: {tee.last_line() or '(no message)'}")


def nsys_commands(nsys: str, out_dir: Path, worker_cmd: list[str],
                  window: NsysWindow) -> tuple[list[str], list[str]]:
    # Only the timed steps: the worker brackets them with cudaProfilerStart/Stop (nsys records only
    # those) or a kernelmap:capture NVTX range (the adapter cuts the capture to it), so warm-up kernels
    # (which no op range covers) never enter the records.
    profile = [nsys, "profile", "--trace=cuda,nvtx", *window.nsys_flags(),
               "-o", str(out_dir / "nsys"), "--force-overwrite", "true", *worker_cmd]
    export = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(out_dir / "nsys.sqlite")]
    return profile, export


def nsys_report(out_dir: Path) -> Path:
    for name in ("nsys.nsys-rep", "nsys.qdrep"):
        if (out_dir / name).is_file():
            return out_dir / name
    raise KernelmapError(f"{out_dir}: nsys wrote no report (nsys.nsys-rep)")


class RunProgress:
    """The overall progress of a run: one plain line on stderr per worker process (pass n of N,
    elapsed, an ETA from the mean time of the workers done so far). Plain lines, so that a log
    without a terminal shows them too."""

    def __init__(self, total: int, enabled: bool = True, stream=None):
        self.total = total
        self.done = 0
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.t0 = time.monotonic()

    @staticmethod
    def _clock(seconds: float) -> str:
        m, s = divmod(int(round(seconds)), 60)
        return f"{m}m{s:02d}s" if m else f"{s}s"

    def line(self, label: str) -> str:
        elapsed = time.monotonic() - self.t0
        eta = (f", ETA ~{self._clock(elapsed / self.done * (self.total - self.done))}" if self.done
               else "")
        return f"kernelmap run: [{self.done + 1}/{self.total}] {label} (elapsed {self._clock(elapsed)}{eta})"

    def start(self, label: str) -> None:
        if self.enabled:
            print(self.line(label), file=self.stream, flush=True)

    def finish(self) -> None:
        self.done += 1


