"""One iteration's events, for the timeline figure and export."""

from __future__ import annotations

import pandas as pd

from kernelmap import schema

from .base import Run
from .timed import fill_from_links, outermost_ops, records_of, timed_events

# --- one iteration, for the timeline figure and export ------------------------------------------
LANES = ("phase", "op", "library_call", "kernel")
# the columns timeline_events adds to the records' in every case: its lane, a library call derived from its kernels'
# spans, an op drawn in the op lane (the outermost with a canonical op)
EXTRA = ("lane", "derived", "outermost")


def timeline_events(run: Run, iteration: int | None = None, all_iterations: bool = False) -> pd.DataFrame:
    """Events of the timed source, per framework x batch size, in lanes phase/op/library_call/kernel,
    with times relative to the start of the shown window (ns).

    By default one iteration: ``iteration`` if given, else the median-numbered traced iteration.
    Library calls are the source's own library_call rows; where the source has none (Kineto does
    not record cuDNN/cuBLAS calls) they are derived as the span of the kernels linked to each call
    (``derived`` = True)."""
    rec = records_of(run)
    out = []
    for t in timed_events(run):
        src = rec[(rec["source"] == t.source) & (rec["case"] == t.framework)
                  & (rec["batch_size"].fillna(-1) == (-1 if t.batch_size is None else t.batch_size))]
        src = src[src["start_ns"].notna() & src["dur_ns"].notna()]
        src = fill_from_links(src, src)
        its = sorted(src["iteration"].dropna().unique())
        it = None
        if not all_iterations and its:
            it = iteration if iteration in its else its[len(its) // 2]
            src = src[src["iteration"] == it]
        parts = []
        ops = src[src["kind"] == "op"]
        ph = src[src["kind"].isin(["step", "annotation"])]
        # Kineto repeats each annotation on the GPU timeline (gpu_user_annotation, the device's
        # pid): the phase lane shows the host's, as the op lane does.
        # (MXNet's profiler gives its step marks a process id of their own: keep them where none
        # is on the ops' process)
        host = set(ops["pid"].dropna())
        ph = ph[ph["pid"].isna() | ph["pid"].isin(host)] if host and ph["pid"].isin(host).any() else ph
        parts.append(ph.assign(lane="phase", derived=False))
        outer = outermost_ops(ops[ops["canonical_op"].notna()], src).index
        parts.append(ops.assign(lane="op", derived=False, outermost=ops.index.isin(outer)))
        calls = src[src["kind"] == "library_call"].assign(lane="library_call", derived=False)
        kernels = src[src["kind"].isin(["kernel", "memcpy", "memset"])].assign(lane="kernel", derived=False)
        if calls.empty and kernels["call_event_id"].notna().any():
            k = kernels.dropna(subset=["call_event_id"]).assign(end_ns=lambda x: x["start_ns"] + x["dur_ns"])
            agg = k.groupby("call_event_id").agg(
                start_ns=("start_ns", "min"), end_ns=("end_ns", "max"), library_call=("library_call", "first"),
                library=("library", "first"), canonical_op=("canonical_op", "first"),
                direction=("direction", "first"), stream=("stream", "first")).reset_index()
            calls = agg.assign(dur_ns=agg["end_ns"] - agg["start_ns"], kind="library_call",
                               lane="library_call", derived=True, framework=t.framework,
                               batch_size=t.batch_size, iteration=it).drop(columns=["end_ns"])
        parts += [calls, kernels]
        ev = pd.concat([p for p in parts if len(p)], ignore_index=True) if any(len(p) for p in parts) \
            else pd.DataFrame(columns=[*schema.COLUMNS, *EXTRA])
        if ev.empty:
            continue
        if "outermost" not in ev:  # a source without op rows (XLA's trace: its ops are annotations)
            ev["outermost"] = False
        t0 = ev["start_ns"].min()
        if it is None:  # no step marks: start the window at the first attributed timed event
            timed = ev[ev["lane"].isin(["kernel", "op"]) & ev["canonical_op"].notna()]
            if len(timed):
                t0 = timed["start_ns"].min()
                ev = ev[ev["start_ns"] + ev["dur_ns"] >= t0]
        ev = ev.assign(rel_ns=(ev["start_ns"] - t0).astype("int64"), framework=t.framework,
                       batch_size=t.batch_size, shown_iteration=it, run=run.name)
        out.append(ev)
    if not out:
        return pd.DataFrame(columns=[*schema.COLUMNS, *EXTRA, "rel_ns", "shown_iteration"])
    return pd.concat(out, ignore_index=True)
