"""Data-parallel training on N devices, framework-free (issue 39): what every framework's
``<name>/parallel.py`` shares, and what the worker and the runner ask without importing a framework.

The rule every framework follows: **the same global batch and data order at every N**. A step trains on
``--batch-size`` images (the global batch, ``spec.training_batches``' row for that step); device ``r`` of
``N`` gets its contiguous slice ``[r * B/N, (r + 1) * B/N)`` of it (``rank_slice``), computes the mean loss
of its slice, and the frameworks average the gradients over the devices (equal slices: the mean over the
global batch). So the N-device run computes the 1-device run's step, up to the order of floating-point sums
(``kernelmap/devparity.py`` checks it). ``B`` must be a multiple of ``N`` (refused before any worker).

How each framework spreads its step (``DataParallel`` in its descriptor):

- one process per device (PyTorch DDP): the worker starts ``N`` copies of itself (``launch``), each told
  its rank by ``RANK_ENV``/``WORLD_ENV`` and the rendezvous address; rank 0 writes the pass's result where a
  1-device worker writes it, rank ``r > 0`` into ``rank<r>/`` of the case folder (``rank_dir``);
- one process driving N devices (MXNet's contexts, JAX's devices): the worker's process alone, with the
  environment its descriptor names for N devices (``DataParallel.env``: XLA's host device count on the CPU),
  set before the framework is imported.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kernelmap.errors import KernelmapError

if TYPE_CHECKING:
    import numpy as np

RANK_ENV = "KERNELMAP_RANK"  # this process's rank among a case's processes (one per device)
WORLD_ENV = "KERNELMAP_WORLD_SIZE"  # how many processes (= devices) the case runs
ADDR_ENV, PORT_ENV = "MASTER_ADDR", "MASTER_PORT"  # the rendezvous (torch.distributed's env:// names)
LAUNCHER_ENV = "KERNELMAP_LAUNCHER_PID"  # the process that launched this rank (``launch``): the rank ends with it
# what the launcher passes on to its ranks before it ends (``launch``): a job's or a profiler's SIGTERM, Ctrl-C, a hangup
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
RANK_GRACE_S = 10.0  # a rank sent the launcher's signal: this long to end before it is killed
FAILED_RANK_GRACE_S = 5.0  # one rank failed: the others, sent SIGTERM, this long to end before they are killed
POLL_S = 0.05  # how often the launcher looks at its ranks
RANK_DIR = "rank{}"  # the folder of rank r > 0 in a case folder (its pass results and captures)
# The pass that times the same step with the gradients' reduction removed (issue 39's independent measure of
# exposed communication): timed as the clean pass is, on the same N devices and data; each framework's
# ``parallel.drop_reduction`` removes the collective (DDP's all-reduce, the KVStore's push and pull, XLA's
# all-reduce) and nothing else it can keep. The weights then differ across devices: a timing pass only.
NO_REDUCTION = "noreduce"


@dataclass(frozen=True)
class DataParallel:
    """How a framework trains on N devices (its descriptor's ``data_parallel``)."""

    processes: bool  # one process per device (the worker launches N ranks), else one process for all
    cpu: str  # the communication on the CPU, for people: "gloo all-reduce", "KVStore local"
    gpu: tuple[str, ...]  # the communication backends on the GPU, the default first
    modes: tuple[str, ...]  # its modes that run on N > 1 devices; others refused there, saying why
    why_not: Mapping[str, str] = field(default_factory=dict)  # {mode: why it does not run on N > 1}
    # extra environment of its workers on N devices on ``device`` (cpu | gpu), set before it is imported
    env: Callable[[int, str], Mapping[str, str]] = lambda n, device: {}


def refusal(descriptor, mode: str, devices: int) -> str | None:
    """Why ``descriptor``'s framework cannot run ``mode`` on ``devices`` devices, or None where it can."""
    if devices == 1:
        return None
    dp = descriptor.data_parallel
    if dp is None:
        return f"{descriptor.label} has no data-parallel path: it runs on one device"
    if mode not in dp.modes:
        why = dp.why_not.get(mode, f"its modes on several devices are {', '.join(dp.modes)}")
        return f"{descriptor.label} {mode} on {devices} devices: {why}"
    return None


# On the GPU, every framework's NCCL with NVLink multicast (NVLS) off: the multi-GPU machines this was written
# for are to be used so (issue 39); a value the user set is kept
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0"}


def device_env(env: Mapping[str, str], devices: int, device: str) -> dict[str, str]:
    """What a worker of ``devices`` devices on ``device`` adds to ``env``: ``NCCL_ENV`` on the GPU (where not
    already set), nothing on one device or the CPU."""
    if devices < 2 or device != "gpu":
        return {}
    return {k: v for k, v in NCCL_ENV.items() if k not in env}


def rank() -> int:
    """This process's rank (``RANK_ENV``); 0 in a process that is not one of several."""
    return int(os.environ.get(RANK_ENV, "0"))


def world() -> int:
    """How many processes train together (``WORLD_ENV``); 1 where this one trains alone."""
    return int(os.environ.get(WORLD_ENV, "1"))


def is_rank() -> bool:
    """Whether this process is one rank of a launched group (``launch`` set the variables)."""
    return WORLD_ENV in os.environ


def check_divides(batch_size: int, devices: int) -> None:
    if devices < 1 or batch_size % devices:
        raise KernelmapError(f"batch size {batch_size} on {devices} devices: each device takes an equal slice "
                             f"of the global batch, so the batch size must be a multiple of {devices}")


def local_batch(batch_size: int, devices: int) -> int:
    """Images per device in a step of ``batch_size`` global images."""
    check_divides(batch_size, devices)
    return batch_size // devices


def rank_slice(order: np.ndarray, batch_size: int, r: int, devices: int) -> tuple[np.ndarray, int]:
    """The samples device ``r`` of ``devices`` trains on, in order, and its batch size: its contiguous
    slice of each global batch of ``order`` (whole batches of ``batch_size``)."""
    b = local_batch(batch_size, devices)
    import numpy as np  # noqa: F811  here: the descriptors import this module; `kernelmap --help` imports no numpy

    order = np.asarray(order)
    if order.size % batch_size:
        raise KernelmapError(f"{order.size} samples are not whole batches of {batch_size}")
    return order.reshape(-1, batch_size)[:, r * b:(r + 1) * b].ravel(), b


def rank_dir(out_dir: Path, r: int) -> Path:
    """Where rank ``r`` writes: the case folder for rank 0, ``rank<r>/`` in it for the others."""
    return Path(out_dir) if r == 0 else Path(out_dir) / RANK_DIR.format(r)


def rank_paths(env: Mapping[str, str], case_dir: Path, r: int) -> dict[str, str]:
    """Rank ``r``'s own values of the variables of ``env`` that name a file in the case folder (the library
    logs of the libs pass: cuDNN's, cuBLAS's, MKL's): the same file in its ``rank_dir``, so that two ranks never
    write into one log. Rank 0 keeps them."""
    if r == 0:
        return {}
    base = Path(case_dir).resolve()
    out = {}
    for k, v in env.items():
        p = Path(v) if v and os.sep in v else None
        if p is not None and p.is_absolute() and base in p.resolve().parents:
            out[k] = str(rank_dir(base, r) / p.resolve().relative_to(base))
    return out


def rank_dirs(case_dir: Path) -> list[Path]:
    """The folders of ranks r > 0 in a case folder (``rank_dir``), in rank order."""
    found = [(p, p.name[len(RANK_DIR.format("")):]) for p in Path(case_dir).glob(RANK_DIR.format("*"))]
    return [p for p, r in sorted(found, key=lambda x: int(x[1]) if x[1].isdigit() else -1) if r.isdigit() and p.is_dir()]


def rank_folders(case_dir: Path) -> list[tuple[int, Path]]:
    """(rank, folder) of every rank of a case: 0 the case folder, then ``rank_dirs``."""
    cut = len(RANK_DIR.format(""))
    return [(0, Path(case_dir)), *((int(p.name[cut:]), p) for p in rank_dirs(case_dir))]


def case_env(base: Mapping[str, str], dp, devices: int, device: str) -> dict[str, str]:
    """``base`` with what a case on ``devices`` devices needs: its framework's own (``dp.env``: XLA's host device
    count, ...) and ``device_env``'s, merged (``merged_env``)."""
    return merged_env(base, {**dp.env(devices, device), **device_env(base, devices, device)})


def merged_env(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """``base`` with ``extra`` added; flag lists (``XLA_FLAGS``) already set are extended, not replaced."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = f"{out[k]} {v}" if k.endswith("_FLAGS") and out.get(k) else v
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(r: int, devices: int, port: int) -> dict[str, str]:
    """The variables that make a process rank ``r`` of ``devices`` with its rendezvous on this host."""
    return {RANK_ENV: str(r), WORLD_ENV: str(devices), ADDR_ENV: "127.0.0.1", PORT_ENV: str(port)}


def launch(commands: list[list[str]], env: Mapping[str, str] | None = None, quiet_ranks: bool = True,
           timeout: float | None = None, rank_envs: list[Mapping[str, str]] | None = None) -> int:
    """Run ``commands[r]`` as rank ``r`` of ``len(commands)`` (``env``, else this environment, plus the rank
    variables and a free rendezvous port on this host); wait for all. Rank 0's stdout is this process's (the
    CPU libs pass reads oneDNN's verbose lines there); the others' is discarded where ``quiet_ranks``. The
    first rank to fail stops the rest (SIGTERM, then SIGKILL after ``FAILED_RANK_GRACE_S``: a rank stuck in a collective
    may not end of SIGTERM); its exit status is returned (0 when all succeed; 124 past ``timeout`` seconds; 128 + N
    for a rank that died of signal N, as a shell says it).

    No rank outlives this process. A signal of ``FORWARDED_SIGNALS`` that reaches it (a job's or a profiler's
    SIGTERM: PyTorch's x2 nsys pass at bs 1024 on the 4x H200 ended with its launcher, nsys's target, gone by
    SIGTERM while its ranks ran, re-parented: nsys waited for them, then exited 143) is sent on to
    every rank still running, each is waited for (``RANK_GRACE_S``, then killed), and only then does this
    process return 128 + the signal, saying so on stderr (or the handler it had for that signal runs: the CLI's
    Ctrl-C); a signal that arrives once the ranks have ended returns it too (not the ranks' status: the launcher
    was signalled). Each rank also gets the launcher's death as SIGTERM
    (``die_with_launcher``: a launcher killed by SIGKILL)."""
    port, n = free_port(), len(commands)
    base = dict(os.environ if env is None else env)
    procs: list[subprocess.Popen] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    received: list[int] = []
    previous = _catch(FORWARDED_SIGNALS, received)
    try:
        for r, cmd in enumerate(commands):
            out = subprocess.DEVNULL if r and quiet_ranks else None
            own = rank_envs[r] if rank_envs else {}
            procs.append(subprocess.Popen(cmd, env={**base, **own, **rank_env(r, n, port), LAUNCHER_ENV: str(os.getpid())},
                                          stdout=out))
        rc = _wait_ranks(procs, deadline, received)
    finally:
        if received:
            _stop_ranks(procs, received[0])
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if received and callable(previous.get(received[0])):  # this process's own handler (the CLI's Ctrl-C) too
            previous[received[0]](received[0], None)
    return 128 + received[0] if received else rc  # one caught after the ranks ended too


def _catch(signals: tuple[signal.Signals, ...], received: list[int]) -> dict:
    """Record each of ``signals`` into ``received`` instead of dying of it (only the main thread may set
    handlers; elsewhere nothing is caught); the handlers it replaced. A signal this process ignores (``nohup``'s
    SIGHUP, a background job's SIGINT) stays ignored, for it and the ranks it starts."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, lambda signum, frame: received.append(signum)) for sig in signals
            if signal.getsignal(sig) is not signal.SIG_IGN}


def _exit_status(code: int) -> int:
    """A rank's exit status as a shell gives it: 128 + N for a death by signal N (Popen's -N)."""
    return 128 - code if code < 0 else code


def _wait_ranks(procs: list[subprocess.Popen], deadline: float | None, received: list[int]) -> int:
    """Wait for every rank of ``procs`` (see ``launch``); 128 + the signal as soon as one is ``received``."""
    rc, pending, kill_at = 0, list(procs), None
    while pending:
        if received:
            return 128 + received[0]
        if deadline is not None and time.monotonic() > deadline:
            return 124
        if kill_at is not None and time.monotonic() > kill_at:
            print(f"kernelmap-worker: rank(s) {', '.join(str(procs.index(q)) for q in pending)} of {len(procs)} still "
                  f"running {FAILED_RANK_GRACE_S} s after SIGTERM (another rank failed): killed", file=sys.stderr, flush=True)
            for q in pending:
                q.kill()
            kill_at = None
        for p in list(pending):
            code = p.poll()
            if code is None:
                continue
            pending.remove(p)
            if code != 0 and rc == 0:
                rc = _exit_status(code)
                if code < 0:
                    print(f"kernelmap-worker: rank {procs.index(p)} of {len(procs)} died of "
                          f"{signal.Signals(-code).name}", file=sys.stderr, flush=True)
                for q in pending:  # one rank failed: the others would wait for it at the next collective
                    q.send_signal(signal.SIGTERM)
                kill_at = time.monotonic() + FAILED_RANK_GRACE_S
        time.sleep(POLL_S)
    return rc


def _stop_ranks(procs: list[subprocess.Popen], signum: int) -> None:
    """Send ``signum`` (the launcher's) to every rank still running, wait for each (``RANK_GRACE_S``, then SIGKILL),
    and say so on stderr."""
    running = [r for r, p in enumerate(procs) if p.poll() is None]
    for r in running:
        procs[r].send_signal(signum)
    end = time.monotonic() + RANK_GRACE_S
    killed = []
    for r in running:
        try:
            procs[r].wait(timeout=max(end - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            procs[r].kill()
            procs[r].wait()
            killed.append(r)
    name = signal.Signals(signum).name
    print(f"kernelmap-worker: the launcher of {len(procs)} ranks got {name} (from another process); sent it to the "
          f"ranks still running ({', '.join(map(str, running)) or 'none'}) and waited for them"
          f"{'; killed after ' + str(RANK_GRACE_S) + ' s: ' + ', '.join(map(str, killed)) if killed else ''}: "
          "no rank outlives it", file=sys.stderr, flush=True)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_launcher() -> None:
    """In a rank ``launch`` started (``LAUNCHER_ENV`` set): be sent SIGTERM by the kernel when the launcher dies
    (prctl PR_SET_PDEATHSIG), so that no rank outlives a launcher killed outright (SIGKILL: nothing is forwarded);
    ended now where the launcher is already gone. Nothing elsewhere, or where prctl is not there (not Linux)."""
    launcher = os.environ.get(LAUNCHER_ENV)
    if launcher is None or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        return
    if os.getppid() != int(launcher):  # it died before the prctl: re-parented already
        os.kill(os.getpid(), signal.SIGTERM)
