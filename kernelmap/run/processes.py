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


# What a worker's stderr says when a GPU ran out of memory in a way no exception of the worker names (the 2x H200's
# x2 cases, GPU 1 held by a leftover process): NCCL's allocation (PyTorch DDP's rank 1 exited 1 with "Failed to CUDA
# calloc async 8 bytes"), cuBLAS's handle (MXNet died of SIGABRT, "CUBLAS_STATUS_SUCCESS (3 vs. 0) : Create cublas
# handle failed"), the CUDA driver's and runtime's out-of-memory errors.
GPU_MEMORY_SAID = re.compile(r"Failed to CUDA calloc|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|"
                             r"CUDA error: out of memory|CUBLAS_STATUS_SUCCESS \(3 vs\. 0\)")
# cuBLAS's status codes (cublasStatus_t), as a failed check prints them ("CUBLAS_STATUS_SUCCESS (3 vs. 0)")
CUBLAS_STATUS = {1: "CUBLAS_STATUS_NOT_INITIALIZED: the CUDA runtime could not start",
                 3: "CUBLAS_STATUS_ALLOC_FAILED: cuBLAS could not allocate GPU memory",
                 7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
                 13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR",
                 15: "CUBLAS_STATUS_NOT_SUPPORTED"}
CXX_TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']+)'\s*\n\s*what\(\):\s*(.+)")


def crash_cause(text: str) -> str:
    """What the C++ exception that aborted a worker said ("terminate called after throwing an instance of 'T'" and
    its "what(): ..." line in ``text``, its time stamp and file's directory left out), with what a cuBLAS status in it
    means; "" where ``text`` has none."""
    m = CXX_TERMINATE.search(text.replace("\r", "\n"))
    if m is None:
        return ""
    what = re.sub(r"^\[\d\d:\d\d:\d\d\]\s*", "", m.group(2).strip())
    what = re.sub(r"^\S*/([^/\s]+:\d+:)", r"\1", what)
    status = re.search(r"CUBLAS_STATUS_SUCCESS \((\d+) vs\. 0\)", what)
    meaning = CUBLAS_STATUS.get(int(status.group(1))) if status else None
    return f"{m.group(1)}: {what}" + (f" (cuBLAS status {status.group(1)} is {meaning})" if meaning else "")


def memory_said(text: str) -> str:
    """"; the GPU ran out of memory ..." where a worker's stderr ``text`` says so in one of ``GPU_MEMORY_SAID``'s
    ways (naming the rank whose line it is), else ""."""
    line = next((x for x in reversed(text.replace("\r", "\n").splitlines()) if GPU_MEMORY_SAID.search(x)), None)
    if line is None:
        return ""
    rank = re.match(r"\s*\[rank(\d+)\]", line)
    whose = f"rank {rank.group(1)}'s GPU" if rank else "the GPU"
    return (f"; {whose} ran out of memory: another process may hold it (nvidia-smi --query-compute-apps=pid,"
            "gpu_uuid,used_memory)")


def error_line(text: str) -> str:
    """The line of a worker's stderr tail that says what went wrong: the last exception or error line
    (torch.compile prints advice after its traceback: "Set TORCHDYNAMO_VERBOSE=1 ..."), else the last line."""
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    errors = [line for line in lines if ERROR_LINE.match(line)]
    return errors[-1] if errors else (lines[-1] if lines else "")


class XlaDeviceWait:
    """XLA's two lines for a multi-device step that will never end: one device could not allocate GPU memory (its
    allocator's retries, "[1] Failed to allocate device memory of 21.11MiB ...: out of memory", or the BFC
    allocator's "Allocator (GPU_1_bfc) ran out of memory trying to allocate ..."), then a rendezvous "may be stuck":
    the failed device's thread left the step, the others wait for it at the collective, and XLA warns after 10 s but
    never ends the wait (the 2x H200's jax-x2 case: GPU 1 held by a leftover process, stopped at the stall limit of
    150 s). ``found`` is set once both were seen, in that order; ``said()`` is what the runner says then."""

    OOM = re.compile(r"\] \[(\d+)\] (Failed to allocate device memory of \S+).*out of memory"
                     r"|Allocator \(GPU_(\d+)_bfc\) (ran out of memory trying to allocate \S+)")
    STUCK = re.compile(r"rendezvous\.cc:\d+\] (?:\[id=\d+\] )?(This thread has been waiting for .*may be stuck)")

    def __init__(self) -> None:
        self.found = threading.Event()
        self.device: str | None = None
        self.tries = 0
        self.last = ""
        self.stuck = ""
        self.found_at: float | None = None

    def see(self, line: str) -> None:
        if (m := self.OOM.search(line)) is not None:
            device, what = ((m.group(1), f"{m.group(2)}: out of memory") if m.group(1) is not None
                            else (m.group(3), m.group(4)))
            self.tries = self.tries + 1 if device == self.device else 1
            self.device, self.last = device, what
        elif self.device is not None and (m := self.STUCK.search(line)) is not None:
            self.stuck = m.group(1)
            self.found_at = time.monotonic()
            self.found.set()

    def found_after(self, started: float) -> float:
        """Seconds from ``started`` (time.monotonic) to the stuck line."""
        return (self.found_at or started) - started

    def said(self) -> str:
        stuck = self.stuck if len(self.stuck) <= 240 else self.stuck[:237] + "..."
        return (f"XLA's device {self.device} could not allocate GPU memory ({self.last}"
                f"{f', the last of {self.tries} tries' if self.tries > 1 else ''}) and another device waits for it at "
                f"a collective (\"{stuck}\"), a wait XLA never ends (another process may hold that GPU's memory: "
                "nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory)")


class _StderrTee(threading.Thread):
    """Copy a worker's stderr into its log file (and to ours where asked) as it arrives, keeping a tail."""

    def __init__(self, stream, forward: bool, log=None):
        super().__init__(daemon=True)
        self.stream = stream
        self.forward = forward
        self.log = log
        self.tail: collections.deque[bytes] = collections.deque(maxlen=64)
        self.xla = XlaDeviceWait()
        self._partial = b""

    def _scan(self, chunk: bytes) -> None:
        """Hand each whole line to ``self.xla`` (a line's start kept for the next chunk, at most 64 KiB of it)."""
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()[-65536:]
        for line in lines:
            self.xla.see(line.decode(errors="replace"))

    def run(self) -> None:
        out = sys.stderr.buffer if hasattr(sys.stderr, "buffer") else None
        for chunk in iter(lambda: self.stream.read1(65536), b""):
            self.tail.append(chunk)
            self._scan(chunk)
            if self.log is not None:
                self.log.write(chunk)
                self.log.flush()  # in order with what the stall guard appends (stall.native_stacks)
            if self.forward:
                if out is not None:
                    out.write(chunk)
                    out.flush()
                else:
                    sys.stderr.write(chunk.decode(errors="replace"))

    def text(self) -> str:
        return b"".join(self.tail).decode(errors="replace")

    def last_line(self) -> str:
        return error_line(self.text())


# the fatal signals Python's faulthandler dumps every thread's stack on (the worker enables it first: stall.py)
CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT)


def log_place(log_path: Path | None) -> str:
    """Where a worker's stderr went, as its messages name it."""
    return f"the run's {log_path.parent.name}/{log_path.name}" if log_path is not None else "our stderr"


def died_of(signum: int, log_path: Path | None, stderr: str = "") -> str:
    """What a worker's death by ``signum`` says: a crash (its stacks in its log; the C++ exception that aborted it,
    where its ``stderr`` tail says one: ``crash_cause``), or a kill from outside."""
    try:
        sig = signal.Signals(signum)
    except ValueError:
        return f"worker died of signal {signum}"
    if sig in CRASH_SIGNALS:
        cause = crash_cause(stderr)
        return (f"worker died of {sig.name} (a crash inside the framework or a library it loaded"
                f"{': ' + cause if cause else ''}); every thread's Python stack in {log_place(log_path)}")
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


POLL_S = 0.5  # how often a waiting runner looks at what the worker's stderr said (XlaDeviceWait)


def _wait(proc: subprocess.Popen, stall_s: float | None, log_path: Path | None,
          hung: threading.Event | None = None) -> int | str | None:
    """``proc``'s exit status; where it is still running after ``stall_s`` seconds, or once ``hung`` is set (its
    stderr said it waits for ever: ``XlaDeviceWait``), the workers of its process group are sent
    ``stall.STACKS_SIGNAL`` (they write every thread's Python stack to their stderr), given ``stall.DUMP_WAIT_S``,
    its native stacks added to ``log_path`` (``stall.native_stacks``) and killed: then the tool that took the
    native stacks ("" where none did)."""
    deadline = None if stall_s is None else time.monotonic() + stall_s
    while True:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            return proc.wait(timeout=POLL_S if left is None else min(POLL_S, left))
        except subprocess.TimeoutExpired:
            pass
        if (hung is not None and hung.is_set()) or (deadline is not None and time.monotonic() >= deadline):
            break
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
            started = time.monotonic()
            rc = _wait(proc, stall_s, log_path, tee.xla.found)
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
        stacks = (f"every thread's stack (Python: signal {stall.STACKS_SIGNAL.name}{', native: ' + rc if rc else ''}) "
                  f"in {log_place(log_path)}")
        if tee.xla.found.is_set():
            raise KernelmapError(f"{label}: stopped {tee.xla.found_after(started):.0f} s in, not left to its stall "
                                 f"limit: {tee.xla.said()}; its process group killed; {stacks}")
        raise KernelmapError(f"{label}: stalled: still running after its stall limit of {stall_s:.0f} s "
                             f"(kernelmap run --stall-limit), its process group killed; {stacks}")
    if rc == EXIT_OOM:
        raise KernelmapError(f"{label}: out of memory at batch size {batch_size}; "
                             f"try a smaller --batch-size ({tee.last_line()})")
    if isinstance(rc, int) and rc < 0:
        raise KernelmapError(f"{label}: {died_of(-rc, log_path, tee.text())}{memory_said(tee.text())}")
    if rc != 0:
        raise KernelmapError(f"{label}: worker exited {rc}: {tee.last_line() or '(no message)'}"
                             f"{memory_said(tee.text())}")


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


