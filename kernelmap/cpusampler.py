"""The worker process's own CPU time, sampled while a capture pass traces its ops (``SAMPLER_RULE``): per traced
op the CPU time all the worker's threads spent within the op's span.

A native thread of the worker (``kernelmap._cpuclock``, built from ``_cpuclock.c`` by setup.py; its Python twin
``PyThreadSampler`` where it is not built) reads every other thread's CPU-time clock (Linux's per-thread clock,
``MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)``: brought up to date as it is read, ns resolution) beside
``CLOCK_MONOTONIC`` about every ``PERIOD_US`` and keeps their sum; the worker writes the samples to
``SAMPLES_FILE`` (``.npy``: int64 rows of monotonic ns, the other threads' CPU ns, the sampler thread's own, the
main thread's: one of the others) and each thread's own readings to ``THREADS_FILE`` (``THREAD_ROWS_RULE``: what
``kernelmap.poolcpu`` parts XLA's pool work by). Not from another process: there Linux gives
only the process-wide clock, which sums the threads' times as of their last tick or switch, so a running
thread's time arrives a scheduler tick at a time (measured on the project's VM: 4 ms steps, rates of up to 13.8
cores on 2 between reads 320 µs apart), too coarse for an op of 10 µs to 2 ms; a thread's own clock is readable
only from its own process. The native thread takes no interpreter lock; its own CPU time (3.7% of a core at
250 µs, measured) is the worker's but not in the samples' sum.

The worker marks each traced step's start and end on ``CLOCK_MONOTONIC`` (``time.monotonic_ns``); each
framework's trace marks the same steps on its own clock (``kernelmap:step#N``), and the report fits the one
clock to the other from them (``fit_offset``). Nothing here imports a framework.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import KernelmapError

try:
    from . import _cpuclock as native
except ImportError:  # pragma: no cover - depends on the build
    native = None

SAMPLES_FILE = "cpu_samples.npy"  # in the case folder, beside the framework pass's trace
THREADS_FILE = "cpu_threads.npy"  # the same reads per thread (THREAD_ROWS_RULE), beside it
PERIOD_US = 250  # asked period between two reads of every thread's clock
RESULT_KEY = "cpu_sampler"  # the framework pass's result: the sampler's figures and the step marks
MARKS_KEY = "step_marks_ns"  # [[step, start, end], ...] on CLOCK_MONOTONIC: the trace's step regions
CLOCK = "CLOCK_MONOTONIC"
SAMPLER_RULE = ("a thread of the worker reads every other thread's CPU-time clock (the framework's intra-op, engine "
                f"and pool threads included) with {CLOCK} about every {PERIOD_US} µs during the traced steps; an op's "
                "CPU time is their sum's advance over the op's span of the trace, read between the samples linearly; "
                "the trace's clock is put on the sampler's by the median offset between the trace's step marks and "
                "the worker's (FIT_RULE). CPU time counts the work the process's threads did, not the time they "
                "waited for a core, so a neighbour moves it less than wall time; it is not each op's alone where "
                "the process works on something else within the op's span (the main thread's Python while an "
                "engine runs the op)")
COLUMNS = 4  # a sample: monotonic ns, the worker's threads' CPU ns, the sampler's own, the main thread's
THREAD_COLUMNS = 3  # a per-thread row: monotonic ns (its sample's), the thread's OS id, its CPU ns
THREAD_ROWS_RULE = ("the same reads per thread (THREADS_FILE: rows of the sample's monotonic ns, the thread's OS id, its "
                    "CPU ns): a thread's row where its reading moved since the sample before, with that sample's reading "
                    "where it was not written already, its first reading and its last; between two of its rows a "
                    "thread's CPU time is read linearly, so each thread's series holds its reading at every sample, "
                    "and their sum (with the ended threads' last readings) is the samples' (ThreadSamples.check)")
DISCOVER_EVERY = 16  # samples between two listings of the process's threads (the native thread's too)


def thread_clock(tid: int) -> int:
    """Linux's clock id of thread ``tid``'s CPU time (``CPUCLOCK_SCHED``, per thread); readable in its process."""
    return ((~tid) << 3) | 6


class PyThreadSampler:
    """The native sampler's Python twin: the same reads from a Python thread (it takes the interpreter lock
    for each sample: only where ``kernelmap._cpuclock`` is not built)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rows: list[int] = []
        self._own = 0
        self._seen: dict[int, int] = {}  # tid -> clock id, the live threads
        self._last: dict[int, int] = {}
        self._retired = 0
        self._trows: list[int] = []
        self._emitted: dict[int, int] = {}  # tid -> the last sample whose reading is in _trows, +1
        self._prev = 0  # the previous sample's stamp
        self._k = 0  # samples taken

    def start(self, period_us: int) -> None:
        self._thread = threading.Thread(target=self._run, args=(period_us / 1e6,), daemon=True,
                                        name="kernelmap-cpusampler")
        self._thread.start()

    def _discover(self, own: int) -> None:
        for name in os.listdir("/proc/self/task"):
            tid = int(name)
            if tid != own and tid not in self._seen and tid not in self._last:
                self._seen[tid] = thread_clock(tid)

    def _sum(self) -> tuple[int, dict[int, int]]:
        total = self._retired
        now: dict[int, int] = {}
        for tid, clock in list(self._seen.items()):
            try:
                now[tid] = v = time.clock_gettime_ns(clock)
            except OSError:  # the thread ended: its last reading stays in the sum
                del self._seen[tid]
                self._retired += self._last.get(tid, 0)
                total += self._last.get(tid, 0)
                continue
            total += v
        return total, now

    def _thread_rows(self, stamp: int, now: dict[int, int], final: bool) -> None:
        """``THREAD_ROWS_RULE``, as the native thread writes them."""
        k = self._k + 1
        for tid, v in now.items():
            done = self._emitted.get(tid, 0)
            moved = bool(done) and v != self._last[tid]
            if moved and done < k - 1:
                self._trows += (self._prev, tid, self._last[tid])
            if not done or moved or (final and done < k):
                self._trows += (stamp, tid, v)
                self._emitted[tid] = k
            self._last[tid] = v

    def _sample(self, final: bool = False) -> None:
        t0 = time.monotonic_ns()
        c, now = self._sum()
        stamp = t0 + (time.monotonic_ns() - t0) // 2  # stamped mid-read
        self._thread_rows(stamp, now, final)
        self._rows += (stamp, c, time.thread_time_ns(), self._last.get(os.getpid(), 0))
        self._prev = stamp
        self._k += 1

    def _run(self, wait: float) -> None:
        own = threading.get_native_id()
        self._discover(own)
        k = 0
        while not self._stop.is_set():
            if k and k % DISCOVER_EVERY == 0:
                self._discover(own)
            self._sample()
            k += 1
            self._stop.wait(wait)
        self._sample(final=True)
        self._own = time.thread_time_ns()

    def stop(self) -> tuple[bytes, int, int, bool, bytes]:
        self._stop.set()
        self._thread.join()
        return (np.asarray(self._rows, dtype=np.int64).tobytes(), self._own,
                len(self._seen) + len(set(self._last) - set(self._seen)), False,
                np.asarray(self._trows, dtype=np.int64).tobytes())


class Sampler:
    """The CPU sampler of one capture pass: ``start`` before the traced steps, ``stop`` after them (writes
    ``SAMPLES_FILE`` in ``out_dir``); ``mark`` notes a step's start and end on its clock; ``figures`` holds the
    sampler's figures and the marks once stopped."""

    def __init__(self, out_dir: Path, period_us: int = PERIOD_US, twin: bool = False):
        self.out = Path(out_dir) / SAMPLES_FILE
        self.threads_out = Path(out_dir) / THREADS_FILE
        self.period_us = period_us
        self.marks: list[list[int]] = []
        self.figures: dict = {}
        self._impl = PyThreadSampler() if twin or native is None else native
        self._running = False

    def start(self) -> None:
        self._impl.start(self.period_us)
        self._running = True

    def stop(self) -> None:
        """Stop the thread and write its samples; a second call does nothing."""
        from .atomic import atomic_file

        if not self._running:
            return
        self._running = False
        data, own_ns, threads, missed, *per_thread = self._impl.stop()  # a native module built before: no per thread
        rows = np.frombuffer(data, dtype=np.int64).reshape(-1, COLUMNS)
        with atomic_file(self.out, "wb") as fh:
            np.save(fh, rows)
        names = {}
        if per_thread:
            trows = np.frombuffer(per_thread[0], dtype=np.int64).reshape(-1, THREAD_COLUMNS)
            with atomic_file(self.threads_out, "wb") as fh:
                np.save(fh, trows)
            names = thread_names(np.unique(trows[:, 1]).tolist())
        gaps = np.diff(rows[:, 0]) if len(rows) > 1 else np.zeros(0, dtype=np.int64)
        span = float(rows[-1, 0] - rows[0, 0]) / 1e9 if len(rows) > 1 else 0.0
        self.figures = {"file": self.out.name, "clock": CLOCK, "period_us": self.period_us,
                        "sampler": "native thread" if self._impl is native else "Python thread (twin)",
                        "samples": int(len(rows)), "span_s": span, "threads": int(threads),
                        "threads_missed": bool(missed), "own_cpu_s": own_ns / 1e9,
                        "own_cpu_share": own_ns / 1e9 / span if span else None,
                        "median_gap_us": float(np.median(gaps)) / 1e3 if len(gaps) else None,
                        "max_gap_us": float(gaps.max()) / 1e3 if len(gaps) else None, MARKS_KEY: self.marks}
        if per_thread:
            self.figures.update({THREADS_KEY: self.threads_out.name, NAMES_KEY: names})

    def mark(self, step: int, start_ns: int, end_ns: int) -> None:
        self.marks.append([step, start_ns, end_ns])


THREADS_KEY = "threads_file"  # the sampler's figures: its THREADS_FILE (absent: a run made before, or an old build)
NAMES_KEY = "thread_names"  # {OS thread id: its name (/proc's comm) when the sampler stopped, None where it had ended}


def thread_names(tids: list[int]) -> dict[str, str | None]:
    """Each thread's name from ``/proc/self/task/<tid>/comm`` (None where it has ended), keyed by its id as text."""
    out: dict[str, str | None] = {}
    for tid in tids:
        try:
            out[str(int(tid))] = Path(f"/proc/self/task/{int(tid)}/comm").read_text().strip()
        except OSError:
            out[str(int(tid))] = None
    return out


def _rows(path: Path, columns: int, what: str) -> np.ndarray:
    """The int64 rows of ``columns`` in the .npy at ``path``, else an error naming it as not ``what``."""
    try:
        rows = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise KernelmapError(f"{path}: not {what} ({exc})") from exc
    if rows.ndim != 2 or rows.shape[1] != columns or rows.dtype != np.int64:
        raise KernelmapError(f"{path}: not {what} (rows {rows.shape} of {rows.dtype}, want rows of {columns} int64)")
    return rows


@dataclass(frozen=True)
class Samples:
    """A sampler file: at each sample the monotonic ns, the CPU ns of the worker's threads (all but the
    sampler's), the sampler thread's own CPU ns and the main thread's (one of the worker's)."""

    mono_ns: np.ndarray
    cpu_ns: np.ndarray
    own_ns: np.ndarray
    main_ns: np.ndarray

    @classmethod
    def read(cls, path: Path) -> Samples:
        rows = _rows(path, COLUMNS, "a CPU sampler file")
        if len(rows) < 2 or (np.diff(rows, axis=0)[:, 1:] < 0).any() or (np.diff(rows[:, 0]) <= 0).any():
            raise KernelmapError(f"{path}: under two samples, or a clock that goes back")
        return cls(rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3])

    def without_main(self) -> Samples:
        """The same samples with the main thread's CPU time taken out of the worker's."""
        return Samples(self.mono_ns, self.cpu_ns - self.main_ns, self.own_ns, np.zeros_like(self.main_ns))

    def cpu_at(self, mono_ns: np.ndarray, own: bool = False) -> np.ndarray:
        """The worker's threads' CPU ns (``own``: the sampler's thread's) at each monotonic instant, linear
        between samples; NaN outside them."""
        t = np.asarray(mono_ns, dtype=np.float64)
        out = np.interp(t, self.mono_ns.astype(np.float64), (self.own_ns if own else self.cpu_ns).astype(np.float64))
        out[(t < self.mono_ns[0]) | (t > self.mono_ns[-1])] = np.nan
        return out

    def between(self, start_ns: np.ndarray, end_ns: np.ndarray, own: bool = False) -> np.ndarray:
        """CPU ns of the worker's threads (``own``: the sampler's) within each [start, end] (monotonic ns)."""
        return self.cpu_at(end_ns, own) - self.cpu_at(start_ns, own)


@dataclass(frozen=True)
class ThreadSamples:
    """A sampler's per-thread file (``THREAD_ROWS_RULE``): each thread's (monotonic ns, CPU ns) series."""

    series: dict[int, tuple[np.ndarray, np.ndarray]]

    @classmethod
    def read(cls, path: Path, samples: Samples) -> ThreadSamples:
        """The per-thread file at ``path`` beside its ``samples``: a thread first read after the first sample (found
        later) is 0 at the sample before, as in the samples' sum, where its time arrives at the sample that found it."""
        rows = _rows(path, THREAD_COLUMNS, "a per-thread CPU sampler file")
        series = {}
        for tid in np.unique(rows[:, 1]):
            own = rows[rows[:, 1] == tid]
            if (np.diff(own[:, 0]) <= 0).any() or (np.diff(own[:, 2]) < 0).any():
                raise KernelmapError(f"{path}: thread {int(tid)}'s rows go back in time or in CPU time")
            t, c = own[:, 0], own[:, 2]
            k = int(np.searchsorted(samples.mono_ns, t[0]))
            if k > 0:  # found after the first sample
                t, c = np.concatenate([samples.mono_ns[k - 1:k], t]), np.concatenate([[0], c])
            series[int(tid)] = (t, c)
        return cls(series)

    def cpu_at(self, tid: int, mono_ns: np.ndarray) -> np.ndarray:
        """Thread ``tid``'s CPU ns at each monotonic instant: linear between its rows, its first reading before
        them and its last after them."""
        t, c = self.series[tid]
        return np.interp(np.asarray(mono_ns, dtype=np.float64), t.astype(np.float64), c.astype(np.float64))

    def between(self, tid: int, start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
        """Thread ``tid``'s CPU ns within each [start, end] (monotonic ns)."""
        return self.cpu_at(tid, end_ns) - self.cpu_at(tid, start_ns)

    def total_at(self, mono_ns: np.ndarray) -> np.ndarray:
        """The threads' summed CPU ns at each instant."""
        return sum((self.cpu_at(tid, mono_ns) for tid in self.series), np.zeros(np.asarray(mono_ns).shape))

    def check(self, samples: Samples, start_ns: np.ndarray, end_ns: np.ndarray) -> float:
        """The largest share by which the threads' summed CPU time over a [start, end] departs from the samples'
        (``THREAD_ROWS_RULE``: 0 but for a thread that ended within one); NaN where no interval has CPU time."""
        per = self.total_at(end_ns) - self.total_at(start_ns)
        whole = samples.between(start_ns, end_ns)
        ok = whole > 0
        return float(np.max(np.abs(per[ok] - whole[ok]) / whole[ok])) if ok.any() else float("nan")


OWN_RULE = ("the sampler is a thread of the worker: time.process_time counts its CPU time (3.7-6% of a core, measured) "
            "with the workload's, so a figure of the pass's process CPU time takes out the sampler's own, read per "
            "marked step from its samples; the pass's wall time still holds it (a thread that takes a core from the "
            "workload's on a machine of few cores)")


def own_step_cpu_s(folder: Path, result: dict) -> np.ndarray | None:
    """``OWN_RULE``: the sampler thread's own CPU seconds over each marked step of a pass's ``result`` (its samples in
    ``folder``); None where the pass ran no sampler."""
    fig = result.get(RESULT_KEY)
    if not isinstance(fig, dict):
        return None
    path = Path(folder) / str(fig.get("file", SAMPLES_FILE))
    if not path.is_file():
        raise KernelmapError(f"{path}: missing (the pass's result names it)")
    marks = np.asarray([m[1:3] for m in fig.get(MARKS_KEY) or []], dtype=np.int64).reshape(-1, 2)
    return Samples.read(path).between(marks[:, 0], marks[:, 1], own=True) / 1e9


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


PENDING_SHARE_RULE = ("an asynchronous XLA thunk runs on its own thread for its dispatch only; from there to its "
                      "completion it ran on the pool or waited for it, and takes a share of the CPU time only of the "
                      "stretches where no op runs (else a thunk waiting behind a convolution would take half of its "
                      "CPU time); where its pending stretch meets another op, neither is given a figure (POOL_RULE)")
POOL_WHY = "its work ran on XLA's pool beside other ops"  # a pending thunk's (POOL_RULE)
BESIDE_POOL_WHY = "its span shared XLA's pool with a pending thunk's work"  # an op that ran beside one (POOL_RULE)
POOL_RULE = ("a pending XLA thunk's work runs on XLA's pool in threads no traced op names, and the samples are a sum "
             "over the threads: where its pending stretch (its dispatch's return to its completion) overlaps another "
             f"op, the process's CPU time there is both's and is not parted, so the thunk has no sampled CPU time "
             f"('{POOL_WHY}'), nor has an op whose own running span overlaps a pending thunk's stretch "
             f"('{BESIDE_POOL_WHY}'): measured on the real run of tests/test_thunk_completion.py, the fc1 weight-gradient dot read its "
             "dispatch's 0.157 ms a step at bs 64 and 1.22 ms at bs 256 (7.8x for 4x the work) and copy.26 0.21 ms, "
             "their pool work credited to conv1's forward and the ops beside them. Their shares still count in the "
             "ops' sum (OpCpu.ops_ms_per_step): it is the process's over the ops' spans however it is parted")


def pool_overlaps(start_ns: np.ndarray, running_end_ns: np.ndarray, end_ns: np.ndarray) -> tuple[np.ndarray, list]:
    """``POOL_RULE`` per op (running from its start to ``running_end_ns``, pending from there to ``end_ns``): whether
    its pending stretch overlaps another op, and the indices of the pending ops whose stretch overlaps its own
    running span."""
    a, b = np.asarray(start_ns, dtype=np.int64), np.asarray(end_ns, dtype=np.int64)
    r = np.clip(np.asarray(running_end_ns, dtype=np.int64), a, b)
    beside_others = np.zeros(a.size, dtype=bool)
    beside_pending: list = [[] for _ in range(a.size)]
    for p in np.nonzero(r < b)[0]:
        others = (a < b[p]) & (b > r[p])
        others[p] = False
        beside_others[p] = bool(others.any())
        ran = (a < b[p]) & (r > r[p]) & (r > a)
        ran[p] = False
        for i in np.nonzero(ran)[0]:
            beside_pending[i].append(int(p))
    return beside_others, beside_pending


def shared_cpu(samples: Samples, start_ns: np.ndarray, end_ns: np.ndarray,
               running_end_ns: np.ndarray | None = None) -> np.ndarray:
    """Each op's CPU ns (``SHARE_RULE``): over every stretch between two op boundaries, the process's CPU time
    (``Samples.cpu_at``) divided among the ops running in it, or where none runs among those pending
    (``running_end_ns``: where each op stops running and, up to its end, is pending: ``PENDING_SHARE_RULE``;
    None: ops run to their end); NaN for an op outside the samples."""
    a, b = np.asarray(start_ns, dtype=np.int64), np.asarray(end_ns, dtype=np.int64)
    if not a.size:
        return np.zeros(0)
    r = b if running_end_ns is None else np.clip(np.asarray(running_end_ns, dtype=np.int64), a, b)
    points = np.unique(np.concatenate([a, r, b]))
    cpu = samples.cpu_at(points)
    seg = np.nan_to_num(np.diff(cpu))

    def open_over(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:  # ops open over [points[k], points[k + 1])
        opened = np.zeros(points.size, dtype=np.int64)
        np.add.at(opened, np.searchsorted(points, lo), 1)
        np.add.at(opened, np.searchsorted(points, hi), -1)
        return np.cumsum(opened)[:-1]

    running, pending = open_over(a, r), open_over(r, b)
    run_share = np.where(running > 0, seg / np.maximum(running, 1), 0.0)
    pend_share = np.where((running == 0) & (pending > 0), seg / np.maximum(pending, 1), 0.0)
    cum_run = np.concatenate([[0.0], np.cumsum(run_share)])
    cum_pend = np.concatenate([[0.0], np.cumsum(pend_share)])
    ia, ir, ib = (np.searchsorted(points, x) for x in (a, r, b))
    out = cum_run[ir] - cum_run[ia] + cum_pend[ib] - cum_pend[ir]
    out[np.isnan(samples.cpu_at(a)) | np.isnan(samples.cpu_at(b))] = np.nan
    return out
