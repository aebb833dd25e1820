"""Each traced op's own CPU time (``kernelmap.cpusampler``): the CPU framework pass's process CPU time
within each op's span of its trace, per layer and direction per traced step.

``op_cpu`` puts each case's trace on its sampler's clock (``cpusampler.fit_offset``) and gives every timed
event of ``timed.timed_events`` its CPU ns (``cpusampler.shared_cpu``); ``layer_cpu`` sums them per traced
step for a layer and a set of directions. An XLA case whose capture wrote its pool tasks gives each op its threads'
own CPU time, its pool work included (``pool_threads``: ``kernelmap.poolcpu``). A case without a sampler file (a run made before kernelmap sampled,
a GPU case, several devices) has none, and says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kernelmap import cpusampler, poolcpu, schema, timing
from kernelmap.adapters import thunk_completion
from kernelmap.errors import KernelmapError
from kernelmap.rundir import pass_result_name, read_json
from kernelmap.worker import FRAMEWORK_PASS

from .base import Run, case_of, field_at
from .ops import LAYER_OPS
from .timed import Timed, records_of, timed_events

LONG_OP_GAPS = 4  # an op this many sampling gaps long (median gap) is read from samples within it, not interpolated
MAIN_IDLE = 0.1  # of a core: the main thread's CPU rate over an op below which it ran no part of the op
MAIN_OFF = 0.5  # the main thread idle through at least this share of the long ops: it runs none of them
MAIN_ON = 0.1  # idle through at most this share: it runs them (a descheduled thread may miss an op now and then)
MAIN_MIN_OPS = 10  # long ops needed to decide from the samples
MAIN_RULE = ("where no traced op runs on the worker's main thread (an asynchronous engine's or XLA's ops, on threads of "
             "their own), the main thread's CPU time is the framework's front end (Python, dispatch, the profiler's "
             "records) and is left out of every op: else an op on an engine thread would hold the front end's work of "
             "the moments it runs (measured, the asynchronous engine at bs 64 on a busy 2-core VM: its ops 20.6 ms CPU a "
             "step with it, above its clean pass's whole step, 17.9 ms); where ops run on the main thread, its time "
             "within an op is the op's. Decided by the trace's thread ids only where they are the OS's (the trace's "
             "process id is the worker's); profilers that name threads by ids of their own (hashes, the XLA runtime's) are "
             "decided from the samples: a thread that runs an op works through it, so where the main thread used under "
             f"{MAIN_IDLE:g} of a core through at least {MAIN_OFF:.0%} of the ops {LONG_OP_GAPS} sampling gaps long or "
             f"longer (at least {MAIN_MIN_OPS}) it runs none of them, where through at most {MAIN_ON:.0%} it runs them "
             "(measured on the busy 2-core VM: ops run on the main thread, idle through 3% of 146; an asynchronous "
             "engine's, through 76% of 116; XLA's, through all of 345); otherwise not decided, and the main thread's "
             "time is kept in the ops (dropping it wrongly would read a layer near 0: a synchronous engine, NaiveEngine, "
             "runs its ops on the main thread)")
OP_CPU_METHOD = (f"{cpusampler.SAMPLER_RULE}; {cpusampler.SHARE_RULE}; {cpusampler.PENDING_SHARE_RULE}; "
                 f"{cpusampler.POOL_RULE}; where the capture wrote XLA's pool tasks and the sampler each thread's "
                 f"readings: {poolcpu.POOL_THREAD_RULE}; {MAIN_RULE}; {cpusampler.FIT_RULE}")


@dataclass(frozen=True)
class OpCpu:
    """One case's traced ops on CPU time: ``events`` (the timed events with ``cpu_ns``) where measured, else
    ``why`` says why not."""

    framework: str
    batch_size: int | None
    why: str = ""
    # Timed.events plus cpu_ns (NaN: outside the samples, or not sampled apart: cpu_why), shared_cpu_ns, span_cpu_ns,
    # process_cpu_ns
    events: pd.DataFrame | None = None
    iterations: tuple[int, ...] = ()
    fit: cpusampler.Fit | None = None
    sampler: dict | None = None  # the framework pass's cpusampler.RESULT_KEY (its figures, the marks)
    step_cpu_ms: tuple[float, ...] = ()  # the worker's threads' sampled CPU time over each marked step
    ops_step_cpu_ms: tuple[float, ...] = ()  # the same, of the threads the ops are given (MAIN_RULE)
    main_in_ops: bool | None = True  # MAIN_RULE: whether the ops run on the main thread (None: not decided, kept)
    main_how: str = ""  # MAIN_RULE: how that was decided, in words
    sampler_step_cpu_ms: tuple[float, ...] = ()  # the sampler thread's own over each marked step
    worker_step_cpu_ms: tuple[float, ...] = ()  # the worker's own process CPU time of each step (timing.CPU_SAMPLES)
    pool: poolcpu.PoolCpu | None = None  # per-thread attribution (poolcpu.POOL_THREAD_RULE), where its files exist

    @property
    def measured(self) -> bool:
        return not self.why

    @property
    def ops_ms_per_step(self) -> float | None:
        """All traced ops' CPU time per traced step (their sum / the steps; ops outside the samples left out)."""
        if not self.measured or not self.iterations:
            return None
        return float(np.nansum(self.events[self.total_column].to_numpy(dtype=float))) / len(self.iterations) / 1e6

    @property
    def ops_ms_ci(self) -> tuple[float, float] | None:
        """95% bootstrap interval (ms) of ``ops_ms_per_step``: the mean over the traced steps of each step's traced
        ops' CPU time summed (``timing.mean_ci``; a step without ops counts 0); None under two steps."""
        if not self.measured or not self.iterations or "iteration" not in self.events:
            return None
        per = self.events.groupby("iteration")[self.total_column].sum() / 1e6
        return timing.mean_ci(per.reindex(list(self.iterations), fill_value=0.0).tolist())

    @property
    def total_column(self) -> str:
        """The column whose sum is the ops' CPU time together: their shares, withheld ones' included
        (``cpusampler.POOL_RULE``: the sum is the process's over the ops' spans however it is parted)."""
        return "shared_cpu_ns" if self.events is not None and "shared_cpu_ns" in self.events else "cpu_ns"

    @property
    def withheld(self) -> int:
        """Ops whose CPU time is not sampled apart (``cpusampler.POOL_RULE``)."""
        ev = self.events
        return int(ev["cpu_why"].notna().sum()) if ev is not None and "cpu_why" in ev else 0


def _entry(run: Run, t: Timed) -> dict | None:
    return next((r for r in run.results if case_of(r) == t.framework and field_at(r, "batch_size") == t.batch_size),
                None)


def _measure(run: Run, t: Timed) -> OpCpu:
    """``OpCpu`` of one timed case (see the module docstring)."""
    fw, bs = t.framework, t.batch_size
    r = _entry(run, t)
    if t.level != "op" or t.pass_name != FRAMEWORK_PASS or r is None or field_at(r, "device") != "cpu":
        return OpCpu(fw, bs, "not a CPU case timed from its framework pass's ops")
    if int(field_at(r, "devices", default=1) or 1) > 1:
        return OpCpu(fw, bs, "a case on several devices: its ranks' ops are not sampled apart")
    folder = field_at(r, "dir")
    path = run.path / str(folder) / pass_result_name(FRAMEWORK_PASS, None)
    result = read_json(path) if isinstance(folder, str) and path.is_file() else {}
    fig = result.get(cpusampler.RESULT_KEY)
    if not isinstance(fig, dict):
        return OpCpu(fw, bs, "its framework pass sampled no CPU time (a run made before kernelmap did)")
    samples_path = path.parent / str(fig.get("file", cpusampler.SAMPLES_FILE))
    if not samples_path.is_file():
        raise KernelmapError(f"{samples_path}: missing (the framework pass's result names it)")
    full = cpusampler.Samples.read(samples_path)
    marks = [list(map(int, m)) for m in fig.get(cpusampler.MARKS_KEY) or []]
    rec = records_of(run)
    steps = rec[(rec["case"] == fw) & (rec["batch_size"] == bs) & (rec["source"] == t.source)
                & (rec["kind"] == "step") & rec["iteration"].notna() & rec["start_ns"].notna()]
    starts = {int(i): int(s) for i, s in zip(steps["iteration"], steps["start_ns"], strict=True)}
    fit = cpusampler.fit_offset(starts, marks)
    ev = t.events
    starts_ns = np.asarray([m[1] for m in marks], dtype=np.int64)
    ends_ns = np.asarray([m[2] for m in marks], dtype=np.int64)
    on_main, main_how = main_thread(ev, result.get("pid"), full, fit, fig.get("median_gap_us"))
    samples = full if on_main is not False else full.without_main()  # MAIN_RULE: not decided, kept
    step_ns = full.between(starts_ns, ends_ns)
    base = dict(iterations=t.iterations, fit=fit, sampler=fig, main_in_ops=on_main, main_how=main_how,
                step_cpu_ms=tuple(float(x) / 1e6 for x in step_ns),
                ops_step_cpu_ms=tuple(float(x) / 1e6 for x in (
                    step_ns if samples is full else samples.between(starts_ns, ends_ns))),
                sampler_step_cpu_ms=tuple(float(x) / 1e6 for x in full.between(starts_ns, ends_ns, own=True)),
                worker_step_cpu_ms=tuple(float(x) * 1e3 for x in result.get(timing.CPU_SAMPLES) or ()))
    if fit is None or not fit.good:
        said = "no step of the trace among the worker's marks" if fit is None else (
            f"the trace's step starts lie {fit.spread_ns / 1e3:.4g} µs (median) from one offset of the marks' clock")
        return OpCpu(fw, bs, f"its trace is not put on the sampler's clock: {said}", **base)
    start = ev["start_ns"].to_numpy(dtype=np.int64) - fit.offset_ns
    end = start + ev["dur_ns"].to_numpy(dtype=np.int64)
    running = running_ends(rec, ev) - fit.offset_ns
    # shared_cpu_ns: the op's share (cpusampler.SHARE_RULE); cpu_ns: the same where it is the op's own, NaN where
    # its span shared XLA's pool with another's work (cpu_why: cpusampler.POOL_RULE); span_cpu_ns: unshared, the ops'
    # threads' (less the main thread where it runs none: MAIN_RULE); process_cpu_ns: every thread's, the main one's too
    shared = cpusampler.shared_cpu(samples, start, end, running)
    more = _untimed_ops(rec, ev, t)
    why = pool_why(ev, more, rec)
    pool = pool_threads(path.parent, fig, full, result.get("pid"), rec, ev, more, fit, marks)
    if pool is not None and pool.cpu_ns is not None:
        pool.agreement = poolcpu.agreement(pool.cpu_ns[:len(ev)], shared, why["cpu_why"].isna().to_numpy())
        if not pool.agreement[1]:  # nothing to hold the per-thread reading against: not drawn, said so
            pool.cpu_ns, pool.why = None, ("no traced op where the process-wide reading holds, to check its per-thread "
                                           f"CPU time against ({poolcpu.AGREE_RULE})")
        elif not poolcpu.AGREE_LOW <= pool.agreement[0] <= poolcpu.AGREE_HIGH:
            pool.cpu_ns, pool.why = None, (f"its per-thread CPU time is {pool.agreement[0]:.3g} x the process-wide "
                                           f"reading where that holds ({poolcpu.AGREE_RULE})")
    if pool is not None and pool.cpu_ns is not None:  # poolcpu.POOL_THREAD_RULE: each op's own, its pool work too
        shared = np.where(np.isnan(shared), np.nan, pool.cpu_ns[:len(ev)])
        unsure = pool.unsure[:len(ev)]
        why = why.assign(cpu_why=pd.Series(np.where(unsure, poolcpu.UNSURE_WHY, None), index=ev.index, dtype=object),
                         pool_with=pd.Series(None, index=ev.index, dtype=object))
    process_ns = full.between(start, end)  # where the main thread runs ops, the ops' threads are every thread
    return OpCpu(fw, bs, "", ev.assign(cpu_ns=np.where(why["cpu_why"].notna(), np.nan, shared), shared_cpu_ns=shared,
                                       **why, span_cpu_ns=process_ns if samples is full else samples.between(start, end),
                                       process_cpu_ns=process_ns), **base, pool=pool)


def pool_threads(folder, fig: dict, full: cpusampler.Samples, pid: Any, rec: pd.DataFrame, ev: pd.DataFrame,
                 more: pd.DataFrame, fit: cpusampler.Fit, marks: list) -> poolcpu.PoolCpu | None:
    """``poolcpu.attribute`` of a case whose capture wrote its pool tasks and whose sampler read each thread; None
    where either is missing (a framework whose trace has no pool tasks, a run made before)."""
    tasks_path, threads_name = folder / poolcpu.POOL_TASKS_FILE, fig.get(cpusampler.THREADS_KEY)
    if not tasks_path.is_file() or not isinstance(threads_name, str) or not isinstance(pid, int) or not marks:
        return None
    threads_path = folder / threads_name
    if not threads_path.is_file():
        raise KernelmapError(f"{threads_path}: missing (the framework pass's result names it)")
    every = pd.concat([ev[more.columns], more], ignore_index=True) if len(more) else ev
    ops = {"tid": every["tid"].to_numpy(dtype=np.int64), "start": every["start_ns"].to_numpy(dtype=np.int64),
           "running_end": running_ends(rec, every), "end": (every["start_ns"] + every["dur_ns"]).to_numpy(dtype=np.int64)}
    cont = rec[rec["run"].isin(ev["run"].unique()) & rec["op_name"].eq(thunk_completion.CONTINUATION)
               & rec["kind"].eq(schema.Kind.ANNOTATION) & rec["start_ns"].notna() & rec["tid"].notna()]
    executor = {"tid": cont["tid"].to_numpy(dtype=np.int64), "start": cont["start_ns"].to_numpy(dtype=np.int64),
                "end": (cont["start_ns"] + cont["dur_ns"].fillna(0)).to_numpy(dtype=np.int64)}
    names = {int(k): v for k, v in (fig.get(cpusampler.NAMES_KEY) or {}).items() if isinstance(v, str)}
    threads = cpusampler.ThreadSamples.read(threads_path, full)
    got = poolcpu.attribute(threads, names, pid, poolcpu.PoolTasks.read(tasks_path), ops, executor, fit.offset_ns,
                            (int(marks[0][1]), int(marks[-1][2])))
    if got.cpu_ns is not None:
        got.cpu_ns = nested_into_outermost(every, got.cpu_ns)
    got.sum_gap = threads.check(full, np.asarray([m[1] for m in marks]), np.asarray([m[2] for m in marks]))
    if not got.sum_gap <= poolcpu.SUM_SLACK:  # NaN too: nothing to hold the threads' file against
        got.cpu_ns, got.why = None, (f"the per-thread samples' sum departs {got.sum_gap:.2%} from the samples' over a "
                                     f"marked step (at most {poolcpu.SUM_SLACK:.1%}: they are the same reads)")
    return got


def nested_into_outermost(every: pd.DataFrame, cpu: np.ndarray) -> np.ndarray:
    """Each op's CPU ns with those of the ops nested in it (``op_event_id``: a control-flow thunk's nested executor, whose
    thunks the thread ran within its span and ``poolcpu.OWNER_RULE`` gave the innermost) added to it, ancestors too."""
    if "op_event_id" not in every:
        return cpu
    at = {(r, int(e)): i for i, (r, e) in enumerate(zip(every["run"], every["event_id"], strict=True)) if pd.notna(e)}
    parent = [at.get((r, int(o))) if pd.notna(o) else None
              for r, o in zip(every["run"], every["op_event_id"], strict=True)]
    out = cpu.copy()
    for i, p in enumerate(parent):
        seen = 0
        while p is not None and seen < len(parent):  # every ancestor holds its descendants' time
            out[p] += cpu[i]
            p, seen = parent[p], seen + 1
    return out


POOL_NAMES = 3  # the pending thunks a layer's reason names (the rest counted)


def _untimed_ops(rec: pd.DataFrame, ev: pd.DataFrame, t: Timed) -> pd.DataFrame:
    """The case's other op records of its trace (no canonical op, nested, outside the traced steps): a thunk pending
    among them shares the pool as a timed one does (``pool_why``)."""
    cols = ["run", "event_id", "op_name", "start_ns", "dur_ns", "tid", "op_event_id"]
    ops = rec[(rec["case"] == t.framework) & (rec["batch_size"] == t.batch_size) & (rec["source"] == t.source)
              & rec["kind"].eq(schema.Kind.OP) & rec["run"].isin(ev["run"].unique()) & rec["start_ns"].notna()
              & rec["dur_ns"].notna()]
    return ops.loc[~ops.set_index(["run", "event_id"]).index.isin(ev.set_index(["run", "event_id"]).index), cols]


def pool_why(ev: pd.DataFrame, more: pd.DataFrame, rec: pd.DataFrame) -> pd.DataFrame:
    """``cpusampler.POOL_RULE`` per op of ``ev``, among its case's other ops ``more``: ``cpu_why``, why its CPU time
    is not sampled (None where it is), and ``pool_with``, the pending thunks whose work its span shared (op names)."""
    every = pd.concat([ev[more.columns], more], ignore_index=True) if len(more) else ev
    start = every["start_ns"].to_numpy(dtype=np.int64)
    beside_others, beside_pending = cpusampler.pool_overlaps(
        start, running_ends(rec, every), start + every["dur_ns"].to_numpy(dtype=np.int64))
    names = every["op_name"].astype(object).tolist()
    why: list = [None] * len(ev)
    with_: list = [None] * len(ev)
    for i, (alone, pend) in enumerate(zip(beside_others[:len(ev)], beside_pending[:len(ev)], strict=True)):
        if alone:
            why[i] = cpusampler.POOL_WHY
        elif pend:
            why[i] = cpusampler.BESIDE_POOL_WHY
            with_[i] = tuple(sorted({str(names[p]) for p in pend}))
    return pd.DataFrame({"cpu_why": pd.Series(why, index=ev.index, dtype=object),
                         "pool_with": pd.Series(with_, index=ev.index, dtype=object)})


def _withheld_why(ev: pd.DataFrame) -> str:
    """A layer's ops not sampled apart (``pool_why``), in words: how many for each reason, the thunks named."""
    said = []
    for w, g in ev[ev["cpu_why"].notna()].groupby("cpu_why", sort=True):
        who = sorted({n for t in g["pool_with"].dropna() for n in t})
        more = f" and {len(who) - POOL_NAMES} more" if len(who) > POOL_NAMES else ""
        said.append(f"{len(g)} x {w}" + (f" ({', '.join(who[:POOL_NAMES])}{more})" if who else ""))
    return "; ".join(said)


def running_ends(rec: pd.DataFrame, ev: pd.DataFrame) -> np.ndarray:
    """Where each op of ``ev`` stops running on its own thread (``cpusampler.PENDING_SHARE_RULE``): an
    asynchronous XLA thunk where its dispatch returned, the start of the pending record it owns (an annotation
    whose ``op_event_id`` is the op, reaching to or past its end: ``thunk_completion.PENDING_RULE``); else its end."""
    end = (ev["start_ns"] + ev["dur_ns"]).to_numpy(dtype=np.int64)
    pend = rec[rec["kind"].eq(schema.Kind.ANNOTATION) & rec["op_event_id"].notna() & rec["run"].isin(ev["run"].unique())]
    if pend.empty:
        return end
    spans = {(r, int(o)): (int(s), int(s) + int(d)) for r, o, s, d in
             zip(pend["run"], pend["op_event_id"], pend["start_ns"], pend["dur_ns"].fillna(0), strict=True)}
    out = end.copy()
    for i, (r, e) in enumerate(zip(ev["run"], ev["event_id"], strict=True)):
        got = spans.get((r, int(e)))
        if got is not None and got[1] >= end[i] > got[0]:
            out[i] = got[0]
    return out


def main_thread(ev: pd.DataFrame, pid: Any, full: cpusampler.Samples, fit: cpusampler.Fit | None,
                gap_us: Any) -> tuple[bool | None, str]:
    """``MAIN_RULE``: (whether the traced ops ``ev`` run on the worker's main thread, None where not decided; how it
    was decided). ``pid``: the worker's OS pid; ``full``: its samples; ``fit``: the trace on their clock."""
    if pid is not None and ev["pid"].notna().any() and bool((ev["pid"] == pid).all()):  # the OS's ids
        on = bool((ev["tid"] == pid).any())
        return on, ("the trace's thread ids are the OS's: " + ("ops on the main thread" if on
                                                                else "no op on the main thread"))
    if fit is None or not fit.good or not isinstance(gap_us, int | float):
        return None, "not decided (the trace's thread ids are its own, and it is not on the samples' clock): kept"
    long = ev[ev["dur_ns"] >= LONG_OP_GAPS * gap_us * 1e3]
    start = long["start_ns"].to_numpy(dtype=np.int64) - fit.offset_ns
    end = start + long["dur_ns"].to_numpy(dtype=np.int64)
    mains = cpusampler.Samples(full.mono_ns, full.main_ns, full.own_ns, full.main_ns)
    rate = mains.between(start, end) / np.maximum(end - start, 1)
    rate = rate[~np.isnan(rate)]
    if rate.size < MAIN_MIN_OPS:
        return None, f"not decided ({rate.size} traced ops of {LONG_OP_GAPS} sampling gaps or longer): kept"
    idle = float((rate < MAIN_IDLE).mean())
    said = (f"the trace's thread ids are its own; from the samples, the main thread used under {MAIN_IDLE:g} of a core "
            f"through {idle:.0%} of {rate.size} traced ops of {LONG_OP_GAPS} sampling gaps or longer")
    if idle >= MAIN_OFF:
        return False, f"{said}: it runs none of them, left out"
    if idle <= MAIN_ON:
        return True, f"{said}: it runs them"
    return None, f"{said}: not decided, kept"


def op_cpu(run: Run) -> dict[tuple[str, Any], OpCpu]:
    """Per (case, batch size) timed from ops: its ``OpCpu`` (computed once per Run)."""
    if run._op_cpu is None:
        run._op_cpu = {(t.framework, t.batch_size): _measure(run, t) for t in timed_events(run)}
    return run._op_cpu


def op_cpu_of(runs: list[Run]) -> dict[tuple[str, str, Any], OpCpu]:
    """``op_cpu`` of every run, by (run, case, batch size)."""
    return {(run.name, fw, bs): oc for run in runs for (fw, bs), oc in op_cpu(run).items()}


@dataclass(frozen=True)
class LayerCpu:
    """A layer's CPU time in some directions per traced step of one case: ``steps_ms`` (one a traced step),
    their median ``ms`` and its 95% interval (``timing.capture_ci``: a step that spun or waited on a busy
    machine moves it less than a mean), the same ops' wall time per step (median), and ``why`` where it is not
    measured (an op outside the samples; ``withheld``: an op not sampled apart, ``cpusampler.POOL_RULE``)."""

    ms: float | None
    ci_ms: tuple[float, float] | None
    steps_ms: tuple[float, ...]
    wall_ms: float | None
    why: str = ""
    withheld: bool = False  # not sampled apart (cpusampler.POOL_RULE): no figure, not even the share estimate

    @property
    def utilisation(self) -> float | None:
        return self.ms / self.wall_ms if self.ms is not None and self.wall_ms else None


def layer_cpu(oc: OpCpu, layer: str, directions: set[str]) -> LayerCpu:
    """``LayerCpu`` of ``layer``'s conv/linear ops of ``directions`` in case ``oc``."""
    if not oc.measured:
        return LayerCpu(None, None, (), None, oc.why)
    ev = oc.events
    ev = ev[ev["canonical_op"].isin(LAYER_OPS) & (ev["layer"] == layer)
            & ev["direction"].fillna("none").isin(directions)]
    if ev.empty:
        return LayerCpu(None, None, (), None, "no traced op of this layer and direction")
    why = ev["cpu_why"] if "cpu_why" in ev else pd.Series(None, index=ev.index, dtype=object)
    lost = int((ev["cpu_ns"].isna() & why.isna()).sum())
    if lost:
        return LayerCpu(None, None, (), None, f"{lost} of its {len(ev)} traced ops lie outside the CPU samples")
    if why.notna().any():  # cpusampler.POOL_RULE: no figure that holds another op's work, nor a share estimate
        per_thread = f"; not read per thread: {oc.pool.why}" if oc.pool is not None and oc.pool.why else ""
        return LayerCpu(None, None, (), None, f"{int(why.notna().sum())} of its {len(ev)} traced ops not sampled "
                                              f"apart: {_withheld_why(ev)}{per_thread}", withheld=True)
    its = oc.iterations or tuple(sorted(int(i) for i in ev["iteration"].dropna().unique()))
    per, wall = ev.groupby("iteration")["cpu_ns"].sum(), ev.groupby("iteration")["dur_ns"].sum()
    steps = tuple(float(per.get(i, 0.0)) / 1e6 for i in its)
    return LayerCpu(float(np.median(steps)), timing.capture_ci(list(steps)), steps,
                    float(np.median([float(wall.get(i, 0.0)) / 1e6 for i in its])))
