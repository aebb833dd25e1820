"""Each XLA CPU thunk's own CPU time from its threads' clocks (``POOL_THREAD_RULE``): the work a thunk hands XLA's
thread pool included, each pool task given to the thunk that scheduled it.

The process-wide samples (``cpusampler.Samples``) sum the threads, so where a thunk's pool work runs beside another
thunk they cannot part it (``cpusampler.POOL_RULE``: both withheld). The sampler also writes each thread's own CPU
time (``cpusampler.THREADS_FILE``), and the JAX capture writes which thunk scheduled each pool task
(``POOL_TASKS_FILE``: the XSpace's context ids pair a task's ``ThreadpoolListener::StartRegion`` with the
``ThreadpoolListener::Record`` that scheduled it). Then, thread by thread, the CPU time of each stretch goes to the
innermost thing that thread ran then (``OWNER_RULE``). What remains to be decided is which OS thread each trace
thread is: XLA's trace names its threads (``tf_XLAEigen/<hash>``) by ids of its own, so they are paired with the OS
threads of the same name by where their CPU time fell (``MATCH_RULE``); where that is not clear-cut the case keeps
``cpusampler.POOL_RULE``. Nothing here imports a framework.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import KernelmapError

POOL_TASKS_FILE = "pool_tasks.json"  # written by the JAX capture (frameworks/jax/capture.py) beside the trace
MATCH_MIN = 0.8  # of an OS thread's CPU time over the traced steps: the least within its trace thread's spans
MATCH_MARGIN = 0.1  # of a name group's CPU time: the least the best pairing holds within spans above the next best
MAX_PAIRINGS = 5000  # pairings of one name's threads: above this they are not tried
COMM_LEN = 15  # Linux's thread names: a longer one is refused (pthread_setname_np: ERANGE), the creator's kept
SUM_SLACK = 0.001  # the per-thread file's sum against the samples' over a marked step (the same reads: 0 measured)
UNKNOWN = -4  # the owner of a pool task whose scheduling record the trace does not hold (PoolTasks.unpaired)
NO_OP = -1  # an owner: a stretch of a thread in no op (the executor's own work, a task no op scheduled, idle spinning)
OWNER_RULE = ("a thread's CPU time at each moment goes to the innermost thing the trace shows it running: a thunk's "
              "span (its dispatch where it completes asynchronously), else the pool task it ran (ThreadpoolListener "
              "StartRegion to StopRegion), which goes to the thunk that scheduled it: the one whose span on the "
              "scheduling thread holds the task's ThreadpoolListener::Record (a task scheduled from within another "
              "task goes to that task's thunk); a task no thunk scheduled (the executor's start from the main "
              "thread) and a thread's time outside all of them (the executor between thunks, a pool thread spinning "
              "before it sleeps) are in no op")
MATCH_RULE = ("XLA's trace names its threads by ids of its own; each is paired with an OS thread of the same name "
              f"(/proc's comm; a name over {COMM_LEN} characters is refused by Linux and the thread keeps its creator's: "
              "then among the threads named as the main thread, the main thread not among them) by where the OS "
              "threads' CPU time fell: the pairing of each name that puts "
              "the most CPU time within the trace threads' spans (thunks, pool tasks, the executor's runs), taken only "
              f"where every paired OS thread spent at least {MATCH_MIN:.0%} of its CPU time over the traced steps "
              "within its trace thread's spans and the pairing holds at least "
              f"{MATCH_MARGIN:.0%} of the name's CPU time more within spans than the next best; otherwise the case's "
              "thunks keep the process-wide reading (cpusampler.POOL_RULE)")
POOL_THREAD_RULE = (f"per-thread CPU time (cpusampler.THREAD_ROWS_RULE) over each thread's stretches: {OWNER_RULE}; "
                    f"{MATCH_RULE}")


@dataclass(frozen=True)
class PoolTasks:
    """A ``POOL_TASKS_FILE``: ``regions`` rows of [thread, start ns, stop ns, scheduling thread, record ns] (the
    trace's thread ids and clock), ``threads`` the trace's thread names, ``unpaired`` tasks whose record the trace
    does not hold, ``unstopped`` tasks open at its end."""

    regions: np.ndarray
    threads: dict[int, str]
    unpaired: int
    unstopped: int

    @classmethod
    def read(cls, path: Path) -> PoolTasks:
        try:
            doc = json.loads(Path(path).read_text())
            regions = np.asarray(doc["regions"], dtype=np.int64).reshape(-1, 5)
            threads = {int(k): str(v) for k, v in doc["threads"].items()}
            unpaired, unstopped = int(doc["unpaired"]), int(doc["unstopped"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise KernelmapError(f"{path}: not a pool task file ({type(exc).__name__}: {exc})") from exc
        if (regions[:, 2] < regions[:, 1]).any():
            raise KernelmapError(f"{path}: a pool task that stops before it starts")
        return cls(regions, threads, unpaired, unstopped)


@dataclass(frozen=True)
class Span:
    """A trace thread's stretches that the trace shows it running (trace ns): ops (``owner`` its index) and the
    executor's runs (``NO_OP``)."""

    start: np.ndarray
    end: np.ndarray
    owner: np.ndarray


def comm_of(trace_name: str, main: str) -> str:
    """The OS thread name (/proc comm) of a trace thread named ``tf_XLAEigen/<hash>``: its name before the '/', or
    where that is over ``COMM_LEN`` characters (Linux refused it) ``main``, the name it inherited."""
    name = trace_name.split("/", 1)[0]
    return name if len(name) <= COMM_LEN else main


@dataclass
class Match:
    """``MATCH_RULE``'s outcome: ``pairs`` trace thread -> OS thread, ``within`` each paired OS thread's share of its
    CPU time within its trace thread's spans, ``margins`` per name, ``why`` where not decided."""

    pairs: dict[int, int] = field(default_factory=dict)
    within: dict[int, float] = field(default_factory=dict)
    margins: dict[str, float] = field(default_factory=dict)
    why: str = ""


def _busy_cpu(threads, os_tid: int, starts: np.ndarray, ends: np.ndarray) -> float:
    """OS thread ``os_tid``'s CPU ns within the union of [starts, ends] (mono ns)."""
    if not starts.size:
        return 0.0
    order = np.argsort(starts)
    a, b = starts[order], ends[order]
    merged_a, merged_b = [a[0]], [b[0]]
    for s, e in zip(a[1:], b[1:], strict=True):
        if s <= merged_b[-1]:
            merged_b[-1] = max(merged_b[-1], e)
        else:
            merged_a.append(s)
            merged_b.append(e)
    return float(np.sum(threads.between(os_tid, np.asarray(merged_a), np.asarray(merged_b))))


def match_threads(busy: dict[int, tuple[np.ndarray, np.ndarray]], names: dict[int, str], os_names: dict[int, str],
                  threads, window: tuple[int, int], main_tid: int) -> Match:
    """``MATCH_RULE``: pair each trace thread of ``busy`` (its spans on the samples' clock) with an OS thread of
    ``threads`` (``cpusampler.ThreadSamples``) named alike (``os_names``; the main thread ``main_tid`` is none of
    them), over the traced steps' ``window``."""
    out = Match()
    groups: dict[str, list[int]] = {}
    main = os_names.get(main_tid, "")
    for t in busy:
        groups.setdefault(comm_of(names.get(t, ""), main), []).append(t)
    lo, hi = np.asarray([window[0]]), np.asarray([window[1]])
    for comm, trace_tids in sorted(groups.items()):
        cands = sorted(o for o, n in os_names.items() if n == comm and o in threads.series and o != main_tid)
        pairings = np.prod(np.arange(len(cands) - len(trace_tids) + 1, len(cands) + 1, dtype=float))
        if len(cands) < len(trace_tids) or pairings > MAX_PAIRINGS:
            out.why = (f"{len(trace_tids)} trace threads named {comm!r} against {len(cands)} OS threads of that name: "
                       "not paired")
            return out
        total = {o: float(threads.between(o, lo, hi)[0]) for o in cands}
        within = {(t, o): _busy_cpu(threads, o, *busy[t]) for t in trace_tids for o in cands}
        scored = sorted(((sum(within[t, o] for t, o in zip(trace_tids, perm, strict=True)), perm)
                         for perm in itertools.permutations(cands, len(trace_tids))), reverse=True)
        group_cpu = sum(total.values())
        margin = (scored[0][0] - scored[1][0]) / group_cpu if len(scored) > 1 and group_cpu > 0 else 1.0
        out.margins[comm] = margin
        for t, o in zip(trace_tids, scored[0][1], strict=True):
            out.pairs[t] = o
            out.within[o] = within[t, o] / total[o] if total[o] > 0 else 1.0
        low = {o: w for o, w in out.within.items() if o in scored[0][1] and w < MATCH_MIN}
        if low or margin < MATCH_MARGIN:
            out.why = (f"threads named {comm!r} not told apart: " + (
                f"the best pairing puts {min(low.values()):.0%} of an OS thread's CPU time within its trace thread's "
                f"spans (at least {MATCH_MIN:.0%} needed)" if low else
                f"the best pairing holds {margin:.1%} of their CPU time more within spans than the next "
                f"(at least {MATCH_MARGIN:.0%} needed)"))
            return out
    return out


def _owners(spans: dict[int, Span], regions: np.ndarray) -> np.ndarray:
    """``OWNER_RULE``: the op (index) that scheduled each pool task of ``regions``, ``NO_OP`` where none did."""
    by_thread = {t: np.flatnonzero(regions[:, 0] == t) for t in np.unique(regions[:, 0])}
    owner = np.full(len(regions), -2, dtype=np.int64)  # -2: not yet resolved

    def op_at(tid: int, ns: int) -> int | None:
        s = spans.get(tid)
        if s is None:
            return None
        inside = np.flatnonzero((s.start <= ns) & (ns <= s.end) & (s.owner != NO_OP))
        return int(s.owner[inside[np.argmax(s.start[inside])]]) if inside.size else None

    def resolve(i: int, depth: int = 0) -> int:
        if owner[i] != -2:
            return int(owner[i])
        tid, ns = int(regions[i, 3]), int(regions[i, 4])
        got = op_at(tid, ns)
        if got is None and depth < 32:
            rows = by_thread.get(tid, np.zeros(0, dtype=np.int64))
            inside = rows[(regions[rows, 1] <= ns) & (ns <= regions[rows, 2])]
            got = resolve(int(inside[0]), depth + 1) if inside.size else NO_OP
        owner[i] = NO_OP if got is None else got
        return int(owner[i])

    for i in range(len(regions)):
        resolve(i) if regions[i, 3] >= 0 else owner.__setitem__(i, UNKNOWN)
    return owner


def thread_cpu(threads, os_tid: int, span: Span, tasks: np.ndarray, task_owner: np.ndarray, offset_ns: int,
               n_ops: int, window: tuple[int, int]) -> tuple[np.ndarray, float]:
    """``OWNER_RULE`` on one thread: each op's CPU ns on OS thread ``os_tid`` (its trace thread's ``span`` and pool
    ``tasks`` rows, on the trace's clock less ``offset_ns``), and that thread's CPU ns in no op within ``window``
    (mono ns: the traced steps)."""
    starts = np.concatenate([span.start, tasks[:, 1]])
    ends = np.concatenate([span.end, tasks[:, 2]])
    owner = np.concatenate([span.owner, task_owner])
    rank = np.concatenate([np.ones(span.start.size, dtype=np.int64), np.zeros(len(tasks), dtype=np.int64)])
    points = np.unique(np.concatenate([starts, ends]))
    out = np.zeros(n_ops)
    whole = float(threads.between(os_tid, np.asarray([window[0]]), np.asarray([window[1]]))[0])
    if points.size < 2:
        return out, whole
    cpu = np.diff(threads.cpu_at(os_tid, points - offset_ns))
    order = np.lexsort((starts, rank))  # ascending: the last open one is the innermost (ops over tasks, later start)
    best = np.full(points.size - 1, -3, dtype=np.int64)
    ia, ib = np.searchsorted(points, starts[order]), np.searchsorted(points, ends[order])
    for k, a, b in zip(order, ia, ib, strict=True):
        best[a:b] = owner[k]  # later in the order overwrites: innermost
    mine = best >= 0
    np.add.at(out, best[mine], cpu[mine])
    mid = (points[:-1] + points[1:]) / 2 - offset_ns
    inside = (mid >= window[0]) & (mid <= window[1])
    return out, whole - float(cpu[mine & inside].sum())


UNSURE_WHY = "a pool task whose scheduling record the trace does not hold ran beside it"  # (attribute)


@dataclass
class PoolCpu:
    """``attribute``'s outcome: ``cpu_ns`` per op (None where the case keeps ``cpusampler.POOL_RULE``: ``why``), the
    thread pairing ``match``, and the paired threads' CPU ns in no op over the traced steps (``no_op_ns``)."""

    cpu_ns: np.ndarray | None
    why: str
    match: Match
    unsure: np.ndarray | None = None  # per op: a task of unknown scheduler (UNKNOWN) ran within its span: UNSURE_WHY
    no_op_ns: float = 0.0
    unpaired: int = 0
    sum_gap: float = float("nan")  # cpusampler.ThreadSamples.check over the marked steps
    agreement: tuple[float, int] | None = None  # AGREE_RULE: per-thread / process-wide, over how many ops

    def describe(self) -> str:
        """The pairing and what stayed in no op, in words."""
        m = self.match
        said = ", ".join(f"{o}: {w:.0%}" for o, w in sorted(m.within.items()))
        margins = ", ".join(f"{c!r} {v:.0%}" for c, v in sorted(m.margins.items()))
        return (f"trace threads paired with OS threads by their CPU time (MATCH_RULE): each paired thread's CPU time "
                f"within its spans {said}; the best pairing's lead over the next {margins}"
                + (f"; {self.unpaired} pool tasks whose scheduling record the trace does not hold" if self.unpaired
                   else ""))


def attribute(threads, os_names: dict[int, str], main_tid: int, tasks: PoolTasks, ops: dict[str, np.ndarray],
              executor: dict[str, np.ndarray], offset_ns: int, window: tuple[int, int]) -> PoolCpu:
    """``POOL_THREAD_RULE`` for one case: ``ops`` (arrays ``tid``, ``start``, ``running_end``, ``end``: trace ns) and the
    executor's runs (``tid``, ``start``, ``end``) on trace thread ids; ``offset_ns`` puts the trace on the samples'
    clock (``cpusampler.Fit``); ``window``: the traced steps (mono ns)."""
    n = ops["start"].size
    spans: dict[int, Span] = {}
    for t in np.unique(np.concatenate([ops["tid"], executor["tid"]])):
        o, e = ops["tid"] == t, executor["tid"] == t
        spans[int(t)] = Span(np.concatenate([ops["start"][o], executor["start"][e]]),
                             np.concatenate([ops["running_end"][o], executor["end"][e]]),
                             np.concatenate([np.flatnonzero(o), np.full(int(e.sum()), NO_OP)]))
    regions = tasks.regions
    busy = {}
    for t in set(spans) | set(np.unique(regions[:, 0]).tolist()):
        s = spans.get(t, Span(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)))
        r = regions[regions[:, 0] == t]
        busy[t] = (np.concatenate([s.start, r[:, 1]]) - offset_ns, np.concatenate([s.end, r[:, 2]]) - offset_ns)
    busy = {t: b for t, b in busy.items() if b[0].size and tasks.threads.get(t, "").split("/", 1)[0] != "python"}
    match = match_threads(busy, tasks.threads, os_names, threads, window, main_tid)
    if match.why:
        return PoolCpu(None, match.why, match)
    owner = _owners(spans, regions)
    cpu = np.zeros(n)
    no_op = 0.0
    empty = Span(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    for t, o in match.pairs.items():
        mine = regions[:, 0] == t
        got, rest = thread_cpu(threads, o, spans.get(t, empty), regions[mine], owner[mine], offset_ns, n, window)
        cpu += got
        no_op += rest
    # a task no record names may be any op's that was open then: those ops are not given a figure
    lost = regions[regions[:, 3] < 0]
    ends = np.maximum(ops["running_end"], ops["end"])
    unsure = np.zeros(n, dtype=bool)
    for a, b in lost[:, 1:3]:
        unsure |= (ops["start"] < b) & (ends > a)
    return PoolCpu(cpu, "", match, unsure=unsure, no_op_ns=no_op, unpaired=tasks.unpaired)


AGREE_LOW, AGREE_HIGH = 0.8, 1.02  # per-thread over process-wide CPU time, summed over the ops both readings hold for
AGREE_RULE = ("where the process-wide reading holds (an op no pending thunk's pool work ran beside: cpusampler.POOL_RULE), "
              "the ops' per-thread CPU time summed is that reading's sum less what other threads did meanwhile (the "
              f"front end's helpers, a pool thread spinning): between {AGREE_LOW:g} and {AGREE_HIGH:g} of it (measured "
              "0.95 at bs 64 and 0.99 at bs 256 on the busy 2-core VM); below, pool work went to no op or to ops "
              "elsewhere (a task's scheduler misread, a thread mis-paired); above, CPU time counted twice")


def agreement(per_thread: np.ndarray, process_wide: np.ndarray, holds: np.ndarray) -> tuple[float, int]:
    """``AGREE_RULE``'s ratio and the ops it is over (``holds``: the process-wide reading is the op's own)."""
    ok = holds & ~np.isnan(process_wide) & ~np.isnan(per_thread)
    whole = float(process_wide[ok].sum())
    return (float(per_thread[ok].sum()) / whole if whole > 0 else float("nan")), int(ok.sum())
