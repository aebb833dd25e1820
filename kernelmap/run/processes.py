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
from collections.abc import Callable
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


XLA_GRACE_S = 60.0  # silence after a stuck rendezvous (that followed a device's failed allocation) that stops a worker


class _DueEvent(threading.Event):
    """An event that sets itself once ``due()`` says so, checked whenever it is asked (``is_set``): the waiting
    runner polls it (``_wait``), so a deadline needs no thread of its own."""

    def __init__(self, due: Callable[[], bool]) -> None:
        super().__init__()
        self._due = due

    def is_set(self) -> bool:
        if not super().is_set() and self._due():
            self.set()
        return super().is_set()


class XlaDeviceWait:
    """XLA's lines for a multi-device step that will never end: one device could not allocate GPU memory, then a
    rendezvous "may be stuck" (the failed device's thread left the step, the others wait for it at the collective;
    XLA warns after 10 s but never ends the wait), then nothing (the 2x H200's jax-x2 case: GPU 1 held by a leftover
    process; device 1's allocator tried 82 sizes down to 21.11 MiB, device 0 waited at the clique's rendezvous until
    the stall limit of 150 s).

    Each line alone is harmless, and so is their pair: XLA's allocator ("[1] Failed to allocate device memory of
    ...: out of memory") steps its size down by 0.9 until one fits, and a try that succeeds prints nothing (the
    counters pass's JAX worker on the busy GPU 1 stepped down from 104.85 to 36.56 GiB and then ran); the BFC
    allocator's "ran out of memory ... The caller indicates that this is not a failure" is an autotuning try (left
    out here); and XLA says "may be stuck" of any rendezvous slower than 10 s (a slow first NCCL clique) and "This
    thread is unstuck" when it ends. So the worker is stopped only where a device's last allocation line is a failure
    (a step-down with no success seen: the log cannot tell, hence the wait; or the BFC allocator's own failure), a
    rendezvous is stuck after it, and the worker then says nothing more for ``grace_s`` (``XLA_GRACE_S``): any line
    restarts the wait, "unstuck" ends it. nvidia-smi cannot tell the two apart either: a step-down that succeeds
    leaves the GPU as full as one that fails (XLA took what was free). ``found`` is set (when asked) once the wait is
    over; ``said()`` is what the runner says then."""

    OOM = re.compile(r"\] \[(\d+)\] (Failed to allocate device memory of \S+).*out of memory"
                     r"|Allocator \(GPU_(\d+)_bfc\) (ran out of memory trying to allocate \S+)")
    NOT_A_FAILURE = "not a failure"  # tsl's BFC allocator: "The caller indicates that this is not a failure, ..."
    STUCK = re.compile(r"rendezvous\.cc:\d+\] (?:\[id=\d+\] )?(This thread has been waiting for .*may be stuck)")
    UNSTUCK = re.compile(r"rendezvous\.cc:\d+\] .*(?:This thread is unstuck|Thread is unstuck)")

    def __init__(self, grace_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.grace_s = XLA_GRACE_S if grace_s is None else grace_s
        self.clock = clock
        self.found = _DueEvent(self._due)
        self.device: str | None = None
        self.tries = 0
        self.last = ""
        self.stuck = ""
        self.stuck_at: float | None = None
        self.heard_at = 0.0  # the worker's last line other than a stuck rendezvous
        self.found_at: float | None = None

    def see(self, line: str) -> None:
        if self.found.is_set():
            return  # what it says once stopped (its stacks) changes nothing
        if not (m := self.STUCK.search(line)):
            self.heard_at = self.clock()
        if self.UNSTUCK.search(line):
            self.stuck_at = None
        elif (o := self.OOM.search(line)) is not None and self.NOT_A_FAILURE not in line:
            device, what = ((o.group(1), f"{o.group(2)}: out of memory") if o.group(1) is not None
                            else (o.group(3), o.group(4)))
            self.tries = self.tries + 1 if device == self.device else 1
            self.device, self.last = device, what
        elif m and self.device is not None and self.stuck_at is None:
            self.stuck, self.stuck_at = m.group(1), self.clock()

    def _due(self) -> bool:
        if self.stuck_at is None or self.clock() - max(self.heard_at, self.stuck_at) < self.grace_s:
            return False
        self.found_at = self.clock()
        return True

    def found_after(self, started: float) -> float:
        """Seconds from ``started`` (the clock's) to the moment the wait was over."""
        return (self.found_at or started) - started

    def said(self) -> str:
        stuck = self.stuck if len(self.stuck) <= 240 else self.stuck[:237] + "..."
        return (f"XLA's device {self.device} could not allocate GPU memory ({self.last}"
                f"{f', the last of {self.tries} tries' if self.tries > 1 else ''}) and another device waits for it at "
                f"a collective (\"{stuck}\", then no line for {self.grace_s:.0f} s), a wait XLA never ends (another "
                "process may hold that GPU's memory: nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory)")


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


def _group_members(pgid: int, proc_root: str = "/proc") -> list[tuple[int, str]]:
    """(pid, name) of the live processes of process group ``pgid`` but its leader, from /proc (none where it
    cannot be read)."""
    members = []
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return members
    for entry in entries:
        if not entry.isdigit() or int(entry) == pgid:
            continue
        try:
            with open(f"{proc_root}/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if len(rest) > 2 and rest[0] != "Z" and int(rest[2]) == pgid:
            members.append((int(entry), name))
    return members


def stop_leftovers(proc: subprocess.Popen, log_fh=None) -> bool:
    """Once ``proc`` has exited (not yet reaped, so its group's id is still its own): SIGKILL the processes left
    in its process group and say which in its log; True where there were any. A worker's own children outlive it
    when it dies first: on the H200s ``ncu`` crashed (SIGSEGV) under JAX, its target process stayed, holding 75%
    of the GPU's memory (XLA's preallocation), and every later case on that GPU ran out of memory."""
    left = _group_members(proc.pid)
    if not left:
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if log_fh is not None:
        names = ", ".join(f"pid {pid} {name}" for pid, name in left)
        log_fh.write(f"\nkernelmap: processes of this worker's process group were still running after it exited "
                     f"(a child it started, e.g. ncu's target after ncu itself died): {names}; killed\n".encode())
        log_fh.flush()
    return True


POLL_S = 0.5  # how often a waiting runner looks at what the worker's stderr said (XlaDeviceWait)


def _exited(proc: subprocess.Popen, timeout: float) -> bool:
    """Whether ``proc`` has exited within ``timeout`` seconds, left unreaped (``WNOWAIT``): while it is a zombie
    no new process can take its pid as a process group's id, so ``stop_leftovers`` kills only its own group."""
    deadline, pause = time.monotonic() + timeout, 0.0005
    while True:
        if proc.returncode is not None or os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.05)


def _wait(proc: subprocess.Popen, stall_s: float | None, log_path: Path | None,
          hung: threading.Event | None = None, on_exit: Callable[[], object] | None = None) -> int | str | None:
    """``proc``'s exit status; where it is still running after ``stall_s`` seconds, or once ``hung`` is set (its
    stderr said it waits for ever: ``XlaDeviceWait``), the workers of its process group are sent
    ``stall.STACKS_SIGNAL`` (they write every thread's Python stack to their stderr), given ``stall.DUMP_WAIT_S``,
    its native stacks added to ``log_path`` (``stall.native_stacks``) and killed: then the tool that took the
    native stacks ("" where none did). ``on_exit``: called once the worker has exited, before it is reaped."""
    deadline = None if stall_s is None else time.monotonic() + stall_s
    while True:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        if _exited(proc, POLL_S if left is None else min(POLL_S, left)):
            if on_exit is not None:
                on_exit()  # the leader is a zombie: its process group's id cannot be reused yet
            return proc.wait()
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
            # leftovers killed before the tee's join (a leftover holds the stderr pipe open) and before the reap
            rc = _wait(proc, stall_s, log_path, tee.xla.found, on_exit=lambda: stop_leftovers(proc, log_fh))
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
        said = signal_said(rc)
        raise KernelmapError(f"{label}: worker exited {rc}{f' ({said})' if said else ''}: "
                             f"{tee.last_line() or '(no message)'}{memory_said(tee.text())}")


def signal_said(rc: int) -> str | None:
    """What an exit status of 128 + N says (N a signal): a process that passes on how its child ended (nsys: its
    target; a shell: its command) saw it end by signal N; None for any other status."""
    try:
        sig = signal.Signals(rc - 128) if 128 < rc < 128 + signal.NSIG else None
    except ValueError:
        return None
    if sig is None:
        return None
    return (f"128 + {sig.name}: the process it ran (under nsys: nsys's target) ended by {sig.name}, "
            "from another process or itself")


# nsys's options for a worker that launches one process per device (PyTorch DDP: the worker starts its ranks and
# waits for them): nsys never signals its target (``--kill``'s default is SIGTERM to the target's process group),
# and waits for every process its target started (``--wait all``). On the 4x H200 (session 11) PyTorch's x2 nsys
# pass at bs 1024 ended 143: nsys's target, the launcher, was gone by SIGTERM while its ranks ran on; bs 64 ended 0.
MULTIPROCESS_NSYS_FLAGS = ("--kill", "none", "--wait", "all")


def nsys_commands(nsys: str, out_dir: Path, worker_cmd: list[str],
                  window: NsysWindow, processes: int = 1) -> tuple[list[str], list[str]]:
    """``nsys profile`` of ``worker_cmd`` into ``out_dir`` and the export of its report to SQLite; ``processes``:
    how many processes the worker runs (its ranks: ``MULTIPROCESS_NSYS_FLAGS`` where more than one)."""
    # Only the timed steps: the worker brackets them with cudaProfilerStart/Stop (nsys records only
    # those) or a kernelmap:capture NVTX range (the adapter cuts the capture to it), so warm-up kernels
    # (which no op range covers) never enter the records.
    ranks = list(MULTIPROCESS_NSYS_FLAGS) if processes > 1 else []
    profile = [nsys, "profile", "--trace=cuda,nvtx", *window.nsys_flags(), *ranks,
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


