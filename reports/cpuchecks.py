"""The self-checks of the ops' own sampled CPU time (``analyses/opcpu.py``, ``kernelmap.cpusampler``), per CPU case
whose framework pass sampled it:

* ``sampled CPU time as the worker's``: the sampler's CPU time over each traced step (from the worker's step marks:
  every thread's, its own included) against the worker's own ``time.process_time`` of the same step
  (``timing.CPU_SAMPLES``): two reads of the same threads' time, their medians within ``SAMPLER_SLACK``. FAIL: a
  thread not read (one missed, another process's clocks), or marks that are not the steps.
* ``ops' CPU time within their steps'``: the traced ops' CPU time per step (summed, ``cpusampler.SHARE_RULE``) is at
  most the process's over the marked steps (their means), within ``SAMPLER_SLACK``: ops put elsewhere on the clock
  (a wrong offset) take CPU time from outside their steps.
* ``ops' CPU time vs wall time`` (``OP_WALL_RULE``): per layer x direction, the process's CPU time over the ops'
  spans is never above their wall time x the machine's cores, and on a quiet framework pass not below
  ``OP_QUIET_FLOOR`` of it; on a busy pass not checked (NOT_CHECKED, saying why) unless the upper bound fails, which
  the threads' own clocks cannot exceed but through the sampler's interpolation.
* ``sampled CPU time as the worker's``, subject ``the sampler's reads``: FAIL where the sampler missed a thread or
  dropped samples (``threads_missed``); its largest gap between two reads named where over ``LARGE_GAP`` x the
  median, and its own CPU share.

* ``ops' pool work from their threads' clocks`` (``_thread_rows``, ``kernelmap.poolcpu``): where an XLA case has its
  pool tasks and per-thread samples, their sum against the samples' (FAIL beyond ``poolcpu.SUM_SLACK``: no per-thread
  figure drawn) and whether its trace threads were paired with OS threads (not checked where not).

Not checked where the case has no samples (``OpCpu.why``); a run none of whose cases sampled says each check once,
not checked (``NO_SAMPLES``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kernelmap import poolcpu
from kernelmap.worker import FRAMEWORK_PASS

from .analyses import opcpu as OC
from .analyses.base import Run, field_at
from .analyses.ops import LAYER_OPS
from .checkrows import FAIL, NOT_CHECKED, PASS, Check, check_row, pass_contention

SAMPLER_SLACK = 0.02  # two reads of one clock (measured: 0.01-0.3% apart per case, quiet and busy, run 11:24-11:30 UTC)
OP_QUIET_FLOOR = 0.8
FLOOR_GAPS = OC.LONG_OP_GAPS  # the lower bound only for ops this long (median): shorter ones are interpolated
OP_WALL_RULE = ("the process's CPU time (every thread's, its main thread's too) over a layer's op spans is not above "
                "their wall time x the machine's cores (its threads cannot work more), and on a quiet machine not "
                f"below {OP_QUIET_FLOOR:.0%} of it: a thread of the process runs through each op's span (its batches "
                "fetched; the rest is the sampler's interpolation between reads and its own wake-ups), for ops at least "
                f"{FLOOR_GAPS} sampling gaps long (median): a shorter op's CPU time is its neighbourhood's rate; on a busy "
                "machine the process waits for a core within its ops, so only the upper bound holds. Where an engine "
                "runs the ops and the main thread runs none, the ops' own threads can get less than that while the main "
                "thread holds a core of a machine with few (the step's first forward op, on 2 cores, while the main thread "
                "pushes the rest of the step): said, not failed")


def op_cpu_checks(run: Run) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cores = field_at(field_at(run.manifest, "host", default={}) or {}, "cpu_count")
    for (fw, bs), oc in OC.op_cpu(run).items():
        if not oc.measured:
            if oc.sampler is not None:  # sampled, but not put on the trace's clock
                rows.append(check_row(run.name, fw, bs, Check.OP_CPU_WITHIN, "traced ops", None, None, FAIL, oc.why))
            continue
        rows += _sampler_rows(run, oc)
        rows += _reads_rows(run, oc)
        rows += _thread_rows(run, oc)
        rows += _wall_rows(run, oc, cores if isinstance(cores, int) else None)
    said = {r["check"] for r in rows}
    return rows + [check_row(run.name, None, None, c, "run", None, None, NOT_CHECKED,
                             NO_THREAD_FILES if c == Check.OP_CPU_THREADS else NO_SAMPLES)
                   for c in SAMPLER_CHECKS if c not in said]


SAMPLER_CHECKS = (Check.OP_CPU_SAMPLED, Check.OP_CPU_WITHIN, Check.OP_CPU_THREADS, Check.OP_CPU_WALL)
NO_SAMPLES = ("no case of this run sampled its ops' CPU time (the CPU framework pass's sampler: a GPU run, a run "
              "without --profile framework on the CPU, or one recorded before the sampler)")
NO_THREAD_FILES = ("no case of this run gave its XLA pool work per thread (kernelmap.poolcpu: an XLA case's CPU "
                   "framework pass writes its per-thread samples and pool tasks; not other frameworks, a GPU run, or "
                   "one recorded before them)")


LARGE_GAP = 10  # a gap between two reads this many times the median is named: ops within it read its average rate


def _reads_rows(run: Run, oc: OC.OpCpu) -> list[dict[str, Any]]:
    """The sampler's own figures (``cpusampler.Sampler.figures``): FAIL where it missed a thread or dropped samples
    (over the native sampler's thread table, or a failed allocation: ``threads_missed``); its largest gap between two
    reads named where over ``LARGE_GAP`` x the median, and its own CPU share."""
    fig = oc.sampler or {}
    med, big, share = fig.get("median_gap_us"), fig.get("max_gap_us"), fig.get("own_cpu_share")
    said = (f"{fig.get('samples')} samples of {fig.get('threads')} threads ({fig.get('sampler')}), median gap "
            f"{med:.4g} µs, largest {big:.4g} µs" if isinstance(med, int | float) and isinstance(big, int | float)
            else f"{fig.get('samples')} samples of {fig.get('threads')} threads, gaps not recorded")
    if isinstance(med, int | float) and isinstance(big, int | float) and med > 0 and big > LARGE_GAP * med:
        said += (f" ({big / med:.3g}x the median: the sampler waited for a core; an op within that gap reads its "
                 "average rate)")
    if isinstance(share, int | float):
        said += f"; the sampler's own CPU {share:.1%} of a core (the worker's, in no op)"
    missed = fig.get("threads_missed")
    status = FAIL if missed else PASS if missed is False else NOT_CHECKED
    why = {FAIL: "the sampler missed a thread or dropped samples (its thread table full, or a failed allocation): "
                 "the sampled CPU time lacks some of the worker's work; ",
           NOT_CHECKED: "the sampler recorded no threads_missed; "}.get(status, "")
    return [check_row(run.name, oc.framework, oc.batch_size, Check.OP_CPU_SAMPLED, "the sampler's reads", False, missed,
                      status, why + said)]


def _thread_rows(run: Run, oc: OC.OpCpu) -> list[dict[str, Any]]:
    """``poolcpu.POOL_THREAD_RULE`` where the case has its files: the per-thread samples' sum against the samples'
    (FAIL beyond ``poolcpu.SUM_SLACK``: the figures are then not drawn), and whether its trace threads were paired
    with OS threads (not checked where not: the case keeps ``cpusampler.POOL_RULE``)."""
    p = oc.pool
    if p is None:
        return []
    fw, bs = oc.framework, oc.batch_size
    gap_ok = p.sum_gap <= poolcpu.SUM_SLACK
    rows = [check_row(run.name, fw, bs, Check.OP_CPU_THREADS, "threads' sum", poolcpu.SUM_SLACK, p.sum_gap,
                      PASS if gap_ok else FAIL,
                      f"the per-thread samples summed over each marked step against the samples' sum: largest "
                      f"departure {p.sum_gap:.3%} (at most {poolcpu.SUM_SLACK:.1%}: the same reads)"
                      + ("" if gap_ok else "; the ops' per-thread figures are not drawn"))]
    if p.match.why:
        return rows + [check_row(run.name, fw, bs, Check.OP_CPU_THREADS, "trace threads paired", True, False,
                                 NOT_CHECKED, f"{p.match.why}: its thunks keep the process-wide reading "
                                              f"(cpusampler.POOL_RULE) ({poolcpu.MATCH_RULE})")]
    n = len(oc.iterations) or 1
    held = int(p.unsure[:len(oc.events)].sum()) if p.unsure is not None else 0
    ratio, ops = p.agreement or (float("nan"), 0)
    agree = poolcpu.AGREE_LOW <= ratio <= poolcpu.AGREE_HIGH
    rows.append(check_row(run.name, fw, bs, Check.OP_CPU_THREADS, "against the process-wide reading",
                          f"{poolcpu.AGREE_LOW:g}-{poolcpu.AGREE_HIGH:g}", ratio,
                          PASS if agree else FAIL if ops else NOT_CHECKED,
                          f"over the {ops} of {len(oc.events)} traced ops the process-wide reading holds for, their "
                          f"per-thread CPU time is {ratio:.3g} x that reading's ({poolcpu.AGREE_RULE})"))
    return rows + [check_row(
        run.name, fw, bs, Check.OP_CPU_THREADS, "trace threads paired", True, True, PASS,
        f"{p.describe()}; the paired threads' CPU time in no op {p.no_op_ns / n / 1e6:.4g} ms a step (the executor, "
        f"pool threads spinning)" + (f"; {held} ops beside a task of unknown scheduler: not given a figure"
                                     if held else ""))]


def _sampler_rows(run: Run, oc: OC.OpCpu) -> list[dict[str, Any]]:
    fw, bs = oc.framework, oc.batch_size
    s, w = np.asarray(oc.step_cpu_ms), np.asarray(oc.worker_step_cpu_ms)
    own = np.asarray(oc.sampler_step_cpu_ms) if len(oc.sampler_step_cpu_ms) == s.size else np.zeros(s.size)
    out = []
    if not s.size or s.size != w.size:
        out.append(check_row(run.name, fw, bs, Check.OP_CPU_SAMPLED, "CPU time per traced step", None, None, NOT_CHECKED,
                             f"{s.size} marked steps against {w.size} worker step figures"))
    elif np.isnan(s).any():
        out.append(check_row(run.name, fw, bs, Check.OP_CPU_SAMPLED, "CPU time per traced step", None, None, FAIL,
                             f"{int(np.isnan(s).sum())} of {s.size} marked steps lie outside the CPU samples: the "
                             "sampler did not run through the traced steps"))
    else:
        ms, mw, mo = float(np.median(s + own)), float(np.median(w)), float(np.median(own))
        ok = abs(ms - mw) <= SAMPLER_SLACK * mw
        out.append(check_row(run.name, fw, bs, Check.OP_CPU_SAMPLED, "CPU time per traced step", mw, ms,
                             PASS if ok else FAIL,
                             f"sampled {ms:.4g} ms (the worker's threads' and the sampler's own {mo:.3g} ms) against "
                             f"the worker's process_time {mw:.4g} ms a step (medians of {s.size} steps), "
                             f"{'within' if ok else 'beyond'} {SAMPLER_SLACK:.0%}"))
    ev = oc.events
    n = len(oc.iterations) or 1
    # the ops' shares together, those not sampled apart included (cpusampler.POOL_RULE: the process's over their spans)
    ops_ms = float(np.nansum(ev[oc.total_column].to_numpy(dtype=float))) / n / 1e6
    held = (f"; {oc.withheld} of them not sampled apart, their shares in this sum (cpusampler.POOL_RULE)"
            if oc.withheld else "")
    o = np.asarray(oc.ops_step_cpu_ms)
    steps_ms = float(o.mean()) if o.size and not np.isnan(o).any() else None
    if steps_ms is None:
        out.append(check_row(run.name, fw, bs, Check.OP_CPU_WITHIN, "traced ops", None, ops_ms, NOT_CHECKED,
                             "no marked step, or one outside the CPU samples"))
    else:
        ok = ops_ms <= steps_ms * (1 + SAMPLER_SLACK)
        out.append(check_row(run.name, fw, bs, Check.OP_CPU_WITHIN, "traced ops", steps_ms, ops_ms, PASS if ok else FAIL,
                             f"{len(ev)} traced ops {ops_ms:.4g} ms CPU a step against the marked steps' {steps_ms:.4g} "
                             f"ms{held} (main thread, opcpu.MAIN_RULE: {oc.main_how}"
                             f"; means over {n} steps; clock offset fitted from {oc.fit.n} marks, "
                             f"{oc.fit.spread_ns / 1e3:.3g} µs median distance)"))
    return out


def _wall_rows(run: Run, oc: OC.OpCpu, cores: int | None) -> list[dict[str, Any]]:
    """``OP_WALL_RULE``: one row per case, naming every layer x direction that breaks it, else the range."""
    fw, bs = oc.framework, oc.batch_size
    busy = pass_contention(run, fw, bs, FRAMEWORK_PASS)
    ev = oc.events[oc.events["canonical_op"].isin(LAYER_OPS) & oc.events["layer"].notna()]
    by = ev.groupby(["layer", ev["direction"].fillna("none")], sort=True)
    g = by[["span_cpu_ns", "process_cpu_ns", "dur_ns"]].sum(min_count=1)
    g = g[g["dur_ns"] > 0]
    gap_ns = float((oc.sampler or {}).get("median_gap_us") or 0) * 1e3
    long_enough = by["dur_ns"].median().reindex(g.index) >= FLOOR_GAPS * gap_ns
    if g.empty or g["process_cpu_ns"].isna().any():
        return [check_row(run.name, fw, bs, Check.OP_CPU_WALL, "layers x directions", None, None, NOT_CHECKED,
                          "no layer op traced" if g.empty else "a layer's op lies outside the CPU samples")]
    u = g["process_cpu_ns"] / g["dur_ns"]
    own = g["span_cpu_ns"] / g["dur_ns"]  # the ops' own threads (the process's less a main thread that runs none)
    quiet = busy.contended is False
    high = u[u > cores] if cores is not None else u.iloc[:0]
    low = u[(u < OP_QUIET_FLOOR) & long_enough] if quiet else u.iloc[:0]
    held = own[(own < OP_QUIET_FLOOR) & (u >= OP_QUIET_FLOOR) & long_enough] if quiet else own.iloc[:0]
    bad = ", ".join(f"{layer} {d} {x:.2f} x" for (layer, d), x in pd.concat([high, low]).items())
    lo, hi = u.idxmin(), u.idxmax()
    said = (f"{len(u)} layer x direction rows, CPU over wall {u[lo]:.2f} x ({' '.join(lo)}) to {u[hi]:.2f} x "
            f"({' '.join(hi)}), {cores if cores is not None else 'unrecorded'} cores; framework pass "
            + (f"quiet (lower bound on the {int(long_enough.sum())} with ops >= {FLOOR_GAPS} sampling gaps)"
               if quiet else f"busy or unmeasured ({busy.text}): lower bound not checked"))
    if not held.empty:
        said += "; " + "; ".join(
            f"{layer} {d}: its ops' own threads {x:.2f} x, the main thread {u[(layer, d)] - x:.2f} x within its "
            f"spans (an engine runs the ops: they shared the {cores if cores is not None else 'unrecorded'} cores "
            "with the main thread)" for (layer, d), x in held.items())
    # on a busy pass only the upper bound is left, which the threads' own clocks cannot exceed but through the
    # sampler's interpolation: not called a pass
    status = FAIL if bad else PASS if quiet else NOT_CHECKED
    if status == NOT_CHECKED:
        said = ("not checked: on a busy pass the process waits for a core within its ops, so only the upper bound "
                "(CPU <= wall x cores) holds, and per-thread clocks cannot exceed it: " + said)
    return [check_row(run.name, fw, bs, Check.OP_CPU_WALL, "layers x directions", None, float(u.min()), status,
                      f"{bad}: {said} ({OP_WALL_RULE})" if bad else said)]
