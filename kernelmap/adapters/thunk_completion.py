"""When an XLA CPU thunk's work ends: its traced span is only the call that started it.

XLA's CPU runtime (``xla/backends/cpu/runtime/thunk_executor.cc``, ``TracedExecute``) records each thunk as a
producer span named by its ``hlo_op`` around ``thunk.Execute()``, and a consumer event ``end: <op_name>`` from
a callback on the thunk's completion event. A thunk that finishes inside ``Execute()`` (most of them) has its
``end:`` event inside its span. One that completes asynchronously returns at once and finishes on XLA's
intra-op pool (Eigen's threads): a plain ``dot`` (``DotThunk``, Eigen's contraction: the weight gradient of
a linear layer that YNNPACK does not take, on the 2-core machine 15-80 us of dispatch against 0.3 ms at batch
64 and 1.3-2.6 ms at batch 256 of contraction), a loop fusion split over the pool
(``outer_dimension_partitions``), a large copy. Its span then holds the dispatch only, and the work ran in
untraced pool tasks (``ThreadpoolListener`` regions) until its ``end:`` event.

The ``end:`` event is late: the completion event runs its callbacks last-registered first, so the thunk
executor's continuation (a ``ThunkExecutor::Execute`` span that runs the thunks the completion made ready,
on the thread that completed it) runs before it. The completion is therefore the start of that continuation
where one ran: the span of that name on the ``end:`` event's thread that ends at or before it with no other
event of that thread starting in between (a pool task's region marker there means the thread had moved on to
another task); else the ``end:`` event itself.

``complete`` gives each asynchronous thunk (its ``end:`` event after its span) the time from its start to its
completion, pairs each ``end:`` event with its thunk (``op_event_id``, ``PAIR_RULE``), and gives each thunk whose traced span lies inside another thunk's (a control-flow
thunk's nested executor) that thunk as its ``op_event_id``: an extended span may reach past thunks that ran
on its thread meanwhile, so nesting is read from the traced spans, before any is extended.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict

import numpy as np

from .. import schema
from . import canonical as C

END_PREFIX = "end: "  # XLA's consumer event on a thunk's completion (TracedExecute)
CONTINUATION = "ThunkExecutor::Execute"  # XLA's span of the executor running ready thunks
COMPLETION_RULE = (
    "an XLA CPU thunk that completes asynchronously (its 'end: <op>' event after its span: a dot on Eigen's "
    "pool, a loop fusion split over the pool, a large copy) is timed from its start to its completion: the start "
    "of the executor's continuation (ThunkExecutor::Execute) that ran just before its 'end:' event on that "
    "thread, else the 'end:' event; its traced span alone is the dispatch")
PAIR_RULE = (
    "an 'end: <op>' event is paired with the execution of <op> on its thread whose span holds it (completed "
    "inside its dispatch), else with the one execution of <op> whose dispatch had returned and is not yet paired; "
    "where several had (one program on several devices, pending together), the trace does not say which ended: "
    "they keep their traced spans (counted: ops_ambiguous)")
PENDING_RULE = (
    "an asynchronous thunk's 'end: <op>' record (op_event_id: the thunk) spans from the return of its dispatch "
    "(its traced span's end) to XLA's end event: the thunk ran on the pool, or waited for it, from its start to "
    "there; its dispatch alone ran on its own thread (cpusampler.shared_cpu)")


SUMMARY_KEY = "thunk_completions"  # the adapter's df.attrs key: normalise keeps it per file in attribution.json


def describe(found: dict) -> str:
    """``complete``'s counts in words: what was timed to completion, and what was left as traced and why."""
    g = {k: int(found.get(k) or 0) for k in ("markers", "asynchronous", "from_continuation", "markers_ambiguous",
                                                "ops_ambiguous", "markers_unpaired", "ops_without_marker")}
    said = (f"XLA thunks: {g['asynchronous']} of {g['markers']} 'end:' events after their thunk's dispatch, those "
            f"thunks timed to their completion ({g['from_continuation']} at the executor's continuation, the rest at "
            f"the event; +{float(found.get('added_ms') or 0):.4g} ms over the trace)")
    if g["ops_ambiguous"]:
        said += (f"; {g['ops_ambiguous']} executions of one op pending together on several devices "
                 f"({g['markers_ambiguous']} 'end:' events): the trace does not say which ended when, so they keep "
                 "their traced spans, which may be the dispatch only (PAIR_RULE)")
    if g["markers_unpaired"]:
        said += f"; {g['markers_unpaired']} 'end:' events of thunks started before the trace"
    if g["ops_without_marker"]:
        said += f"; {g['ops_without_marker']} thunks with no 'end:' event (the trace ended first): their spans kept"
    return said


def from_attribution(attribution: dict | None, case: str, batch_size: int | None) -> dict | None:
    """The ``SUMMARY_KEY`` counts of one case's files (its ranks' traces summed) from a run's attribution.json;
    None where none of its files has them."""
    runs = (attribution or {}).get("runs") if isinstance(attribution, dict) else None
    got: dict = {}
    for r in (runs or {}).values():
        if not isinstance(r, dict) or r.get("case") != case or r.get("batch_size") != batch_size:
            continue
        for f in r.get("files") or []:
            for k, v in ((f or {}).get(SUMMARY_KEY) or {}).items():
                got[k] = got.get(k, 0) + v
    return got or None


def _threads(pid: list, tid: list) -> np.ndarray:
    keys: dict = {}
    return np.array([keys.setdefault((p, t), len(keys)) for p, t in zip(pid, tid, strict=True)], dtype="int64")


def _completion(m: int, p: int, by_end: dict, starts: dict, names: list, start: np.ndarray,
                end: np.ndarray, thread: np.ndarray) -> tuple[int, bool]:
    """The completion time of thunk ``p`` whose ``end:`` event is ``m``, and whether a continuation gave it."""
    t, at = int(thread[m]), int(start[m])
    ends, order = by_end[t]
    k = bisect_right(ends, at) - 1
    while k >= 0 and order[k] == m:
        k -= 1
    if k >= 0:
        e = order[k]
        s_list = starts[t]
        between = bisect_left(s_list, at) - bisect_right(s_list, int(end[e]))
        if names[e] == CONTINUATION and start[e] >= start[p] and between == 0:
            return int(start[e]), True
    return at, False


def complete(kind, names: list, hlo_op: list, start: np.ndarray, dur: np.ndarray, pid: list,
             tid: list, host: np.ndarray) -> tuple[np.ndarray, np.ndarray, list, dict]:
    """``start`` and ``dur`` with each asynchronous host thunk timed to its completion and its ``end:`` event
    spanning its pending time (from its dispatch's return to the event: ``PENDING_RULE``), ``op_event_id``
    per row (row indices: an ``end:`` event's thunk, a nested thunk's enclosing thunk; None elsewhere) and
    what was found (``thunk_completions``: the module docstring)."""
    n = len(names)
    thread = _threads(pid, tid)
    end = start + dur
    owner: list = [None] * n
    ops = np.array([j for j in range(n) if host[j] and kind[j] == schema.Kind.OP and hlo_op[j] is not None], dtype="int64")
    if ops.size:
        parent = C.nest(thread[ops], start[ops], end[ops])
        for k in np.nonzero(parent >= 0)[0]:
            owner[int(ops[k])] = int(ops[parent[k]])
    markers = [j for j in range(n) if host[j] and kind[j] == schema.Kind.ANNOTATION and names[j].startswith(END_PREFIX)]
    if not markers:
        return start, dur, owner, {}
    by_end: dict = {}
    starts: dict = defaultdict(list)
    per_thread: dict = defaultdict(list)
    for j in range(n):
        if host[j]:
            per_thread[int(thread[j])].append(j)
    for t, js in per_thread.items():
        srt = sorted(js, key=lambda j: (int(end[j]), -int(start[j])))
        by_end[t] = ([int(end[j]) for j in srt], srt)
        starts[t] = sorted(int(start[j]) for j in js)
    new, new_start = dur.copy(), start.copy()
    pairs, found = _pair(ops.tolist(), markers, hlo_op, names, start, end, thread)
    found.update(asynchronous=0, from_continuation=0, added_ms=0.0)
    for m, p in pairs:
        owner[m] = p
        if start[m] <= end[p]:
            continue  # completed inside its own span
        done, by_continuation = _completion(m, p, by_end, starts, names, start, end, thread)
        if done > end[p]:
            new[p] = done - start[p]
            found["added_ms"] += (done - end[p]) / 1e6
        # the end: event's record spans the thunk's pending time: from its dispatch's return to the event
        new_start[m], new[m] = end[p], start[m] + dur[m] - end[p]
        found["asynchronous"] += 1
        found["from_continuation"] += by_continuation
    found["added_ms"] = round(found["added_ms"], 3)
    return new_start, new, owner, found


def _pair(ops: list, markers: list, hlo_op: list, names: list, start: np.ndarray, end: np.ndarray,
          thread: np.ndarray) -> tuple[list, dict]:
    """(``end:`` event, its thunk) pairs and the counts (``PAIR_RULE``)."""
    is_marker = set(markers)
    open_: dict = defaultdict(list)  # per op name, its executions not yet paired, in start order
    owed: dict = defaultdict(int)  # per op name, end: events still to come of executions left unpaired
    pairs = []
    found = {"markers": len(markers), "markers_unpaired": 0, "markers_ambiguous": 0, "ops_ambiguous": 0}
    for j in sorted([*ops, *markers], key=lambda j: (int(start[j]), j in is_marker)):
        if j not in is_marker:
            open_[hlo_op[j]].append(j)
            continue
        op = names[j][len(END_PREFIX):]
        waiting = open_.get(op, [])
        inside = [p for p in waiting if thread[p] == thread[j] and start[p] <= start[j] <= end[p]]
        done = inside or [p for p in waiting if end[p] <= start[j]]
        if len(done) == 1:
            pairs.append((j, done[0]))
            waiting.remove(done[0])
        elif done:  # executions of one op on several devices, pending together: which ended is not said
            for p in done:
                waiting.remove(p)
            owed[op] += len(done) - 1
            found["markers_ambiguous"] += 1
            found["ops_ambiguous"] += len(done)
        elif owed[op]:
            owed[op] -= 1
            found["markers_ambiguous"] += 1
        else:
            found["markers_unpaired"] += 1  # its thunk started before the trace did
    found["ops_without_marker"] = sum(len(q) for q in open_.values())  # the trace ended before they did
    return pairs, found
