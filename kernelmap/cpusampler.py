"""The worker process's own CPU time, sampled from beside it while a capture pass traces its ops
(``SAMPLER_RULE``): per traced op the CPU time all the worker's threads spent within the op's span.

``python -m kernelmap.cpusampler PID OUT PERIOD_US`` runs in a process of its own (no share of the
worker's interpreter lock): it reads the worker's process CPU-time clock (Linux: the clock id of
another process, ``MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)`` = ``(~pid << 3) | 2``; ns resolution, about
0.5 µs a read on the project's VM) beside ``CLOCK_MONOTONIC`` every ``PERIOD_US`` until its stdin closes
(the worker closes it, or dies), then writes ``OUT`` (``.npy``: int64 rows of monotonic ns, process CPU ns)
atomically and prints one JSON line: its own CPU time, samples, the gaps between them.

The worker marks each traced step's start and end on ``CLOCK_MONOTONIC`` (``time.monotonic_ns``); each
framework's trace marks the same steps on its own clock (``kernelmap:step#N``), and the report fits the one
clock to the other from them (``fit_offset``). Nothing here imports a framework.
"""

from __future__ import annotations

import array
import json
import os
import select
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import KernelmapError

SAMPLES_FILE = "cpu_samples.npy"  # in the case folder, beside the framework pass's trace
PERIOD_US = 250  # asked period; the sampler sleeps between reads (select on its stdin)
RESULT_KEY = "cpu_sampler"  # the framework pass's result: the sampler's figures and the step marks
MARKS_KEY = "step_marks_ns"  # [[step, start, end], ...] on CLOCK_MONOTONIC: the trace's step regions
CLOCK = "CLOCK_MONOTONIC"
SAMPLER_RULE = ("a process of its own reads the worker process's CPU-time clock (every thread's CPU time: the "
                f"framework's intra-op, engine and pool threads included) with {CLOCK} about every {PERIOD_US} µs "
                "during the traced steps; an op's CPU time is that clock's advance over the op's span of the trace, "
                "read between the samples linearly; the trace's clock is put on the sampler's by the median offset "
                "between the trace's step marks and the worker's (fit_offset). CPU time counts the work the "
                "process's threads did, not the time they waited for a core, so a neighbour barely moves it; it is "
                "not each op's alone where the process works on something else within the op's span (another "
                "thread's Python, an asynchronous engine's next op)")


def process_clock(pid: int) -> int:
    """Linux's clock id of process ``pid``'s CPU time (all its threads, ``CPUCLOCK_SCHED``)."""
    return ((~pid) << 3) | 2


def sample(pid: int, out: Path, period_us: int, stop=sys.stdin, ready=lambda: None) -> dict:
    """Read ``pid``'s process CPU clock and ``CLOCK_MONOTONIC`` every ``period_us`` until ``stop`` is
    readable (closed) or the process is gone; write the pairs to ``out``; return the sampler's figures.
    ``ready`` is called once the first sample is taken."""
    from .atomic import atomic_file

    clock, mono, read = process_clock(pid), time.monotonic_ns, time.clock_gettime_ns
    buf = array.array("q")
    wait = period_us / 1e6
    c0 = time.process_time()
    try:
        read(clock)
    except OSError as exc:
        raise KernelmapError(f"cannot read the CPU clock of process {pid}: {exc}") from exc
    ended = "stdin closed"
    while True:
        t = mono()
        try:
            c = read(clock)
        except OSError:
            ended = "the process ended"
            break
        buf.append(t)
        buf.append(c)
        if len(buf) == 2:
            ready()
        if select.select([stop], [], [], wait)[0]:
            break
    own = time.process_time() - c0
    rows = np.frombuffer(buf, dtype=np.int64).reshape(-1, 2)
    with atomic_file(out, "wb") as fh:
        np.save(fh, rows)
    gaps = np.diff(rows[:, 0]) if len(rows) > 1 else np.zeros(0, dtype=np.int64)
    span = float(rows[-1, 0] - rows[0, 0]) / 1e9 if len(rows) > 1 else 0.0
    return {"file": out.name, "clock": CLOCK, "period_us": period_us, "samples": int(len(rows)),
            "span_s": span, "own_cpu_s": own, "own_cpu_share": own / span if span else None,
            "median_gap_us": float(np.median(gaps)) / 1e3 if len(gaps) else None,
            "max_gap_us": float(gaps.max()) / 1e3 if len(gaps) else None, "ended": ended}


class Sampler:
    """The sampler process beside this one: ``start`` before the traced steps, ``stop`` after them (it is
    waited for, so its CPU time is this process's children's); ``mark`` notes a step's start and end on its
    clock; ``figures`` holds what it said and the marks once stopped."""

    def __init__(self, out_dir: Path, period_us: int = PERIOD_US):
        self.out = Path(out_dir) / SAMPLES_FILE
        self.period_us = period_us
        self.marks: list[list[int]] = []
        self.figures: dict = {}
        self._proc = None

    def start(self) -> None:
        import subprocess

        self._proc = subprocess.Popen([sys.executable, "-m", __spec__.name, str(os.getpid()), str(self.out),
                                       str(self.period_us)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        line = self._proc.stdout.readline()  # "ready": its first sample is taken
        if line.strip() != b"ready":
            self._proc.kill()
            self._proc.wait()
            raise KernelmapError(f"the CPU sampler did not start (it said {line!r}; see the worker's log)")

    def stop(self) -> None:
        """Close its stdin (it writes its file and exits) and wait; a second call does nothing."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.stdin.close()
        out = proc.stdout.read()
        proc.stdout.close()
        proc.wait()
        if proc.returncode != 0:
            raise KernelmapError(f"the CPU sampler exited {proc.returncode} (see the worker's log)")
        self.figures = {**json.loads(out), MARKS_KEY: self.marks}

    def mark(self, step: int, start_ns: int, end_ns: int) -> None:
        self.marks.append([step, start_ns, end_ns])


@dataclass(frozen=True)
class Samples:
    """A sampler file: monotonic ns and the process's CPU ns at each sample."""

    mono_ns: np.ndarray
    cpu_ns: np.ndarray

    @classmethod
    def read(cls, path: Path) -> Samples:
        try:
            rows = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise KernelmapError(f"{path}: not a CPU sampler file ({exc})") from exc
        if rows.ndim != 2 or rows.shape[1] != 2 or rows.dtype != np.int64:
            raise KernelmapError(f"{path}: not a CPU sampler file (rows {rows.shape} of {rows.dtype}, "
                                 "want int64 pairs)")
        if len(rows) < 2 or (np.diff(rows[:, 0]) <= 0).any() or (np.diff(rows[:, 1]) < 0).any():
            raise KernelmapError(f"{path}: under two samples, or a clock that goes back")
        return cls(rows[:, 0], rows[:, 1])

    def cpu_at(self, mono_ns: np.ndarray) -> np.ndarray:
        """The process's CPU ns at each monotonic instant, linear between samples; NaN outside them."""
        t = np.asarray(mono_ns, dtype=np.float64)
        out = np.interp(t, self.mono_ns.astype(np.float64), self.cpu_ns.astype(np.float64))
        out[(t < self.mono_ns[0]) | (t > self.mono_ns[-1])] = np.nan
        return out

    def between(self, start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
        """CPU ns of the process within each [start, end] (monotonic ns)."""
        return self.cpu_at(end_ns) - self.cpu_at(start_ns)


FIT_TOLERANCE_NS = 50_000  # a fit whose marks lie further apart than this (median) does not put one clock on the other
FIT_RULE = ("the trace's clock on the sampler's: offset = the median over the traced steps of the trace's step start "
            "less the worker's mark just before it (no drift between the two within a pass: run 11:24 UTC, residuals "
            "within 8 µs at start and end of 0.4-1.1 s passes); a step whose trace start lies later than its mark "
            "(the worker descheduled between the two: up to 350 µs on a busy machine) is one-sided noise the median "
            f"ignores; the fit holds where the marks' median distance from it is within {FIT_TOLERANCE_NS // 1000} µs")


@dataclass(frozen=True)
class Fit:
    """A trace's clock on the sampler's (``FIT_RULE``): ``mono = trace - offset_ns``, from ``n`` step marks,
    their median distance from the offset ``spread_ns``, ``late`` of them beyond ``FIT_TOLERANCE_NS``."""

    offset_ns: int
    n: int
    spread_ns: int
    late: int

    @property
    def good(self) -> bool:
        return self.n >= 3 and self.spread_ns <= FIT_TOLERANCE_NS


def fit_offset(trace_starts: dict[int, int], marks: list[list[int]]) -> Fit | None:
    """``FIT_RULE``'s offset of a trace's clock (step starts ``{step: ns}``) from the worker's marks
    (``[[step, start, end], ...]`` on ``CLOCK_MONOTONIC``); None where no step is in both."""
    d = np.asarray([trace_starts[s] - start for s, start, _ in marks if s in trace_starts], dtype=np.int64)
    if not d.size:
        return None
    off = int(np.median(d))
    res = np.abs(d - off)
    return Fit(off, int(d.size), int(np.median(res)), int((res > FIT_TOLERANCE_NS).sum()))


SHARE_RULE = ("ops that run at once (an asynchronous engine's or XLA's ops on several threads) share the process's "
              "CPU time of the moments they overlap equally, so that no CPU time is counted twice: the ops' CPU time "
              "sums to at most the process's over the traced steps")


def shared_cpu(samples: Samples, start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """Each op's CPU ns (``SHARE_RULE``): over every stretch between two op boundaries, the process's CPU time
    (``Samples.cpu_at``) divided among the ops open in it; NaN for an op outside the samples."""
    a, b = np.asarray(start_ns, dtype=np.int64), np.asarray(end_ns, dtype=np.int64)
    if not a.size:
        return np.zeros(0)
    points = np.unique(np.concatenate([a, b]))
    cpu = samples.cpu_at(points)
    opened = np.zeros(points.size, dtype=np.int64)
    np.add.at(opened, np.searchsorted(points, a), 1)
    np.add.at(opened, np.searchsorted(points, b), -1)
    active = np.cumsum(opened)[:-1]  # ops open over [points[k], points[k + 1])
    seg = np.diff(cpu)
    share = np.where(active > 0, seg / np.maximum(active, 1), 0.0)
    cum = np.concatenate([[0.0], np.cumsum(np.nan_to_num(share))])
    out = cum[np.searchsorted(points, b)] - cum[np.searchsorted(points, a)]
    out[np.isnan(samples.cpu_at(a)) | np.isnan(samples.cpu_at(b))] = np.nan
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m kernelmap.cpusampler PID OUT PERIOD_US", file=sys.stderr)
        return 2
    pid, out, period = int(args[0]), Path(args[1]), int(args[2])
    try:
        time.clock_gettime_ns(process_clock(pid))
    except OSError as exc:
        print(f"kernelmap-cpusampler: cannot read process {pid}'s CPU clock: {exc}", file=sys.stderr)
        return 2
    def ready() -> None:
        sys.stdout.write("ready\n")
        sys.stdout.flush()

    figures = sample(pid, out, period, ready=ready)
    sys.stdout.write(json.dumps(figures) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
