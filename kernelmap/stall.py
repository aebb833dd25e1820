"""The guard against a worker that hangs: its threads' stacks on a signal, and the runner's limit on its wall time.

On the H200s two MXNet GPU workers hung before their first convolution (empty log, 15+ minutes) and the run
waited on them forever. Now every worker registers ``faulthandler`` on ``STACKS_SIGNAL`` (all threads, into its
stderr: the worker's log), and the runner gives each worker a stall limit (``limit_s``; ``kernelmap run
--stall-limit``): past it, it sends ``STACKS_SIGNAL`` to the processes of the worker's group that catch it (the
workers and their ranks: ``ask_for_stacks``; nsys or ncu would die of it), waits ``DUMP_WAIT_S``, kills
the group and fails the case with one line naming the limit and the log that holds the stacks; the run goes on.
Python's stacks show where Python waits; a hang inside a library (MXNet's engine threads, the CUDA driver) shows
in the native stacks, which the runner adds with gdb where it is on PATH (``native_stacks``), before the kill.

The default limit is ``BASE_S`` plus ``PER_STEP_S`` per step the worker runs (its warm-up and timed steps, and
the test set's batches where it evaluates), scaled up by the batch size above ``PER_STEP_SAMPLES``. Chosen from
the slowest workers on record: on the H200s (the 4x hold, 20-step passes at bs 1024) no worker took over 30 s,
import, cuDNN autotuning and torch.compile included; on the 2-core CPU VM the slowest, a busy machine's PyTorch
bs 64 clean trial, trained 25 steps in 66 s (2.6 s a step) and torch.compile's workers spend a minute or two
compiling. ``BASE_S`` (10 minutes, 20x the slowest GPU worker) covers start-up, compilation, nsys/ncu start and
the result; the per-step allowances are ~6x the CPU's slowest step and ~1000x a GPU step (ncu's counters pass
replays one step's kernels: its budget is 60 s). A GPU pass of 20 steps gets 12 minutes (the hold's hung MXNet
clean trial at bs 1024, with its evaluation: 13), the default 100-step clean trial at bs 64 on the CPU 36 minutes
(75 with its evaluation, counted as training steps): far above their normal time, short of waiting forever.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import fnmatch
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

STACKS_SIGNAL = signal.SIGUSR1
NATIVE_TIMEOUT_S = 60.0  # gdb's time per process (attach, every thread's backtrace, detach)
NATIVE_MAX_PROCESSES = 8  # of the worker's group: the worker, nsys or ncu, DDP ranks, compile workers
DUMP_WAIT_S = 5.0  # after the signal, before the group is killed: faulthandler writes at once, from the handler
BASE_S = 600.0
PER_STEP_S = {"cpu": 15.0, "gpu": 5.0}
PER_STEP_SAMPLES = {"cpu": 64, "gpu": 1024}
# test hook: a worker whose "framework/pass/bsN" matches this glob ("pytorch/clean/bs32", "*") hangs before its
# workload loads, the way the MXNet workers hung on the GPU (tests/test_stall.py)
HANG_ENV = "KERNELMAP_TEST_HANG"


def dump_stacks_on_signal() -> None:
    """Every thread's Python stack into stderr (the worker's log) when ``STACKS_SIGNAL`` arrives, and on a fatal
    signal (SIGSEGV, SIGABRT...), after which the worker dies of it (the worker, before any framework loads).

    The fatal handler also keeps MXNet's own out: libmxnet installs its SIGSEGV handler only where none is set,
    and that handler prints, walks the stack and calls exit(), which waits on the engine's threads. On the
    H200s the workers that crashed at their first GPU operator (a wrong cuDNN bound) hung there, inside the
    handler, until the stall limit; with faulthandler first they die at once and the runner names the signal."""
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True, chain=False)


def hang_for_test(framework: str, pass_name: str, batch_size: int) -> None:
    """Block forever where ``HANG_ENV`` matches this worker: the test of the guard. No-op without it."""
    pattern = os.environ.get(HANG_ENV)
    if pattern and fnmatch.fnmatchcase(f"{framework}/{pass_name}/bs{batch_size}", pattern):
        print(f"kernelmap-worker: {HANG_ENV}={pattern}: hanging", file=sys.stderr, flush=True)
        threading.Event().wait()


def worker_steps(batch_size: int, warmup: int, steps: int | None, epochs: int | None, n_train: int) -> int:
    """The training steps a worker runs, warm-up included: ``warmup + steps``, or with ``epochs`` (``steps`` None
    then) every epoch's full batches (``spec.steps_per_epoch``: the partial batch dropped). The worker's plan and its
    stall limit count them both so."""
    from .frameworks import spec

    return epochs * spec.steps_per_epoch(n_train, batch_size) if epochs is not None else warmup + steps


def limit_s(device: str, batch_size: int, steps: int, test_images: int = 0) -> float:
    """The default stall limit of a worker that runs ``steps`` training steps (warm-up included) of
    ``batch_size`` on ``device`` ("cpu" or "gpu") and then evaluates ``test_images`` (each batch of them counted
    as a training step: a ceiling)."""
    steps += math.ceil(test_images / batch_size)
    return BASE_S + steps * PER_STEP_S[device] * max(1.0, batch_size / PER_STEP_SAMPLES[device])


def seconds(text: str) -> float:
    """``--stall-limit``'s value: seconds, 0 for no limit; a negative or non-number refused by argparse."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a number of seconds") from None
    if value < 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r}: the stall limit is seconds >= 0 (0: no limit)")
    return value


def group_pids(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (its leader first), read from /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return sorted(pids, key=lambda p: (p != pgid, p))


def catches(pid: int) -> bool:
    """Whether process ``pid`` has a handler for ``STACKS_SIGNAL`` (/proc's SigCgt): a worker that registered
    ``dump_stacks_on_signal``; the others of its group (nsys, ncu, sleep) would die of it."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (STACKS_SIGNAL - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def ask_for_stacks(pgid: int) -> None:
    """``STACKS_SIGNAL`` to each process of group ``pgid`` that catches it."""
    for pid in group_pids(pgid):
        if catches(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, STACKS_SIGNAL)


def native_stacks(pgid: int, out: Path) -> str | None:
    """Every thread's native stack of each process of group ``pgid`` (gdb's ``thread apply all bt``, up to
    ``NATIVE_MAX_PROCESSES``) appended to ``out``; the tool's name, or None without gdb (said in ``out``)."""
    gdb = shutil.which("gdb")
    with open(out, "ab") as fh:
        if gdb is None:
            fh.write(b"kernelmap run: no native stacks: gdb is not on PATH\n")
            return None
        for pid in group_pids(pgid)[:NATIVE_MAX_PROCESSES]:
            fh.write(f"kernelmap run: native stacks of pid {pid} (gdb: thread apply all bt)\n".encode())
            fh.flush()
            try:
                subprocess.run([gdb, "-p", str(pid), "-batch", "-nx", "-iex", "set auto-load python-scripts off",
                                "-ex", "thread apply all bt"], stdin=subprocess.DEVNULL,
                               stdout=fh, stderr=subprocess.STDOUT, timeout=NATIVE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                fh.write(f"kernelmap run: gdb on pid {pid} gave up after {NATIVE_TIMEOUT_S:.0f} s\n".encode())
    return "gdb"
