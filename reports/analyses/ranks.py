"""The merged timeline of every rank of a multi-device case (issue 39): DataFrames only; the figure is
``reports/rankfigure.py``.

Per case on more than one device and its first capture source in name order (the one ``scaling`` shows), the
last ``SHOWN_STEPS`` traced steps, one lane group per rank (``group``), each with the rows ``comm.per_step``
measures there:

- ``communication``: the rank's communication rows of the step (``commlink.is_communication``: collective ops,
  their work spans and annotations, collective kernels);
- ``compute``: the rank's other work: device kernels where the trace has kernels, else the framework's host ops;
- ``step``: the step regions (``kernelmap:step#N``) of the rank, or of the process where a region names no rank
  (one process driving every device: XLA's).

A trace whose communication names no rank (MXNet's one process: its KVStore serves every context) has one lane
group per trace process of its rows (the profiler's process per device context), ``rank`` NA.

Times are the records' own (``start_ns`` as recorded, nothing shifted): ``clock`` says which clock that is per
case. ``spans``: the figure's step per group and step, from the drawn rows (the first start to the last end);
``step_mismatches`` compares them with ``comm.per_step``'s steps (the report's self-check). ``marks``: the last
arrival at each collective (``comm.arrivals``), at the start of the last rank's issuing op.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .comm import arrivals, case_frame
from .diff import source_pass

SHOWN_STEPS = 2  # the last traced steps of each case


class Lane(enum.StrEnum):
    COMMUNICATION = "communication"
    COMPUTE = "compute"
    STEP = "step"


CLOCK_PER_RANK = ("each rank's own trace (one process per rank) as recorded, nothing shifted: the processes of "
                  "one host share its clock")
CLOCK_ONE = "one process's trace for every device: one clock"
DEVICE_TIMES = "; kernels as the profiler put them on that clock"
CASE_COLUMNS = ["run", "framework", "devices", "batch_size", "source", "capture_pass", "basis", "clock", "groups",
                "iterations", "origin_ns"]
EVENT_COLUMNS = ["run", "source", "group", "rank", "process", "lane", "iteration", "kind", "op_name", "canonical_op",
                 "start_ns", "dur_ns", "rel_ns"]
SPAN_COLUMNS = ["run", "source", "group", "rank", "process", "iteration", "start_ns", "end_ns"]
MARK_COLUMNS = ["run", "source", "iteration", "collective", "op_name", "first_rank", "last_rank", "spread_ms",
                "group", "at_ns", "rel_ns"]
MISMATCH_COLUMNS = ["run", "source", "rank", "iteration", "comm_start_ns", "comm_end_ns", "figure_start_ns",
                    "figure_end_ns", "why"]


@dataclass
class RankTimeline:
    """The merged timelines of a run's multi-device cases (``rank_timeline``)."""

    cases: pd.DataFrame  # CASE_COLUMNS, one row per case drawn
    events: pd.DataFrame  # EVENT_COLUMNS, every row drawn
    spans: pd.DataFrame  # SPAN_COLUMNS, the figure's step per group and step
    marks: pd.DataFrame  # MARK_COLUMNS, the last arrival at each collective


def capture_pass(source: str) -> str:
    """The pass that wrote a trace source: a framework's profiler trace the framework pass, else the source's own."""
    return source_pass(source) or str(source)


def _groups(df: pd.DataFrame, comm: np.ndarray, drawn: np.ndarray) -> list[tuple[str, object, object, np.ndarray]]:
    """(label, rank, process, the rows of the group) per lane group: a rank each where the communication names
    ranks, else a trace process each (the process id of the ``drawn`` rows: communication and compute)."""
    ranks = sorted(df.loc[comm, "rank"].dropna().unique().tolist())
    if ranks:
        return [(f"rank {int(r)}", int(r), None, (df["rank"] == r).fillna(False).to_numpy()) for r in ranks]
    pids = df["pid"].where(drawn)
    out = [(f"process {int(p)}", None, int(p), (pids == p).fillna(False).to_numpy())
           for p in sorted(pids.dropna().unique().tolist())]
    if (pids.isna().to_numpy() & drawn).any():
        out.append(("process ?", None, None, pids.isna().to_numpy() & drawn))
    return out


def _case(df: pd.DataFrame, steps: int) -> tuple[dict, list[pd.DataFrame]] | None:
    """One case and source: its row of ``cases`` and its drawn rows (``EVENT_COLUMNS`` less ``rel_ns``)."""
    frame = case_frame(df)  # the traces holding communication, as comm.per_step reads them
    timed = (frame.rows["start_ns"].notna() & frame.rows["dur_ns"].notna()).to_numpy()
    df, comm, work = frame.rows[timed], frame.comm[timed], frame.work[timed]
    if not comm.any():
        return None
    is_step = (df["kind"] == "step").fillna(False).to_numpy() & df["iteration"].notna().to_numpy()
    shown = sorted(df.loc[is_step, "iteration"].unique().tolist())[-steps:]
    at = df["iteration"].isin(shown).fillna(False).to_numpy()
    key = df.iloc[0]
    parts = []
    groups = _groups(df, comm, (comm | work) & at)
    for label, rank, proc, mine in groups:
        own_step = (df["rank"] == rank).fillna(False).to_numpy() if rank is not None else np.zeros(len(df), bool)
        lanes = ((Lane.COMMUNICATION, mine & comm), (Lane.COMPUTE, mine & work & ~comm),
                 (Lane.STEP, is_step & (own_step | df["rank"].isna().to_numpy())))
        for lane, sel in lanes:
            rows = df[sel & at]
            parts.append(pd.DataFrame({"run": rows["run"], "source": rows["source"], "group": label,
                                       "rank": pd.array([rank] * len(rows), dtype="Int64"),
                                       "process": pd.array([proc] * len(rows), dtype="Int64"), "lane": str(lane),
                                       **{c: rows[c] for c in EVENT_COLUMNS[6:-1]}}))
    ranked_steps = df.loc[is_step, "rank"].notna().any()
    case = {"run": key["run"], "framework": key["framework"], "devices": key["devices"],
            "batch_size": key["batch_size"], "source": key["source"], "capture_pass": capture_pass(key["source"]),
            "basis": frame.basis,
            "clock": (CLOCK_PER_RANK if ranked_steps else CLOCK_ONE) + (DEVICE_TIMES if frame.on_device else ""),
            "groups": len(groups), "iterations": ";".join(str(int(i)) for i in shown)}
    return case, parts


def step_spans(events: pd.DataFrame) -> pd.DataFrame:
    """The figure's step per group and step: the first start and the last end of its drawn rows."""
    if events.empty:
        return pd.DataFrame(columns=SPAN_COLUMNS)
    ev = events.assign(end_ns=events["start_ns"] + events["dur_ns"])
    g = ev.groupby(["run", "source", "group", "iteration"], sort=True, dropna=False)
    out = g.agg(rank=("rank", "first"), process=("process", "first"), start_ns=("start_ns", "min"),
                end_ns=("end_ns", "max")).reset_index()
    return out[SPAN_COLUMNS]


def _marks(arr: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    """``comm.arrivals``' rows (``arr``) of the shown steps, each at the start of its last rank's issuing op (the
    k-th communication op of that rank's step in start order, as ``arrivals`` counts them)."""
    ops = events[(events["lane"] == Lane.COMMUNICATION) & (events["kind"] == "op")]
    rows = []
    for a in arr.itertuples():
        mine = ops[(ops["run"] == a.run) & (ops["source"] == a.source) & (ops["iteration"] == a.iteration)
                   & (ops["rank"] == a.last_rank).fillna(False)].sort_values("start_ns", kind="stable")
        if len(mine) > a.collective:
            rows.append({"run": a.run, "source": a.source, "iteration": a.iteration, "collective": a.collective,
                         "op_name": a.op_name, "first_rank": a.first_rank, "last_rank": a.last_rank,
                         "spread_ms": a.spread_ms, "group": mine["group"].iloc[0],
                         "at_ns": int(mine["start_ns"].iloc[a.collective])})
    return pd.DataFrame(rows, columns=MARK_COLUMNS[:-1])


def rank_timeline(records: pd.DataFrame | None, steps: int = SHOWN_STEPS,
                  arrived: pd.DataFrame | None = None) -> RankTimeline:
    """The merged timeline of every multi-device case of one run's ``records`` (see the module docstring); times
    ``rel_ns`` from the case's first shown step (``origin_ns``: the earliest start over its groups). ``arrived``:
    ``comm.arrivals`` of the same records where the caller has it (computed here otherwise)."""
    empty = RankTimeline(pd.DataFrame(columns=CASE_COLUMNS), pd.DataFrame(columns=EVENT_COLUMNS),
                         pd.DataFrame(columns=SPAN_COLUMNS), pd.DataFrame(columns=MARK_COLUMNS))
    if records is None or records.empty or "devices" not in records:
        return empty
    multi = records[records["devices"].fillna(1) > 1]
    cases, parts = [], []
    for _, by_case in multi.groupby("run", sort=True):
        source = sorted(by_case["source"].dropna().unique())
        got = _case(by_case[by_case["source"] == source[0]], steps) if source else None
        if got is not None:
            cases.append(got[0])
            parts += got[1]
    if not cases:
        return empty
    events = pd.concat([p for p in parts if len(p)], ignore_index=True)
    spans = step_spans(events)
    origin = spans.groupby("run")["start_ns"].min()
    table = pd.DataFrame(cases, columns=CASE_COLUMNS[:-1]).assign(origin_ns=lambda t: t["run"].map(origin))
    events["rel_ns"] = (events["start_ns"] - events["run"].map(origin)).astype("int64")
    marks = _marks(arrivals(multi) if arrived is None else arrived, events)
    marks["rel_ns"] = (marks["at_ns"] - marks["run"].map(origin)).astype("int64")
    return RankTimeline(table, events[EVENT_COLUMNS], spans, marks[MARK_COLUMNS])


def step_mismatches(timeline: RankTimeline, steps: pd.DataFrame) -> pd.DataFrame:
    """``MISMATCH_COLUMNS``: every step of ``comm.per_step`` (``steps``) of the drawn cases, sources and steps whose
    interval the figure does not draw exactly (a rank's group; where the steps name no rank, the union of the
    case's groups), and every group and step the figure draws that ``per_step`` has not."""
    rows = []
    for case in timeline.cases.itertuples():
        shown = [int(i) for i in case.iterations.split(";") if i]
        mine = steps[(steps["run"] == case.run) & (steps["source"] == case.source) & steps["iteration"].isin(shown)]
        spans = timeline.spans[(timeline.spans["run"] == case.run) & (timeline.spans["source"] == case.source)]
        seen = set()
        for s in mine.itertuples():
            ranked = pd.notna(s.rank)
            sel = spans[(spans["iteration"] == s.iteration)
                        & ((spans["rank"] == s.rank).fillna(False) if ranked else spans["rank"].isna())]
            seen |= set(zip(sel["group"], sel["iteration"], strict=True))
            f0, f1 = (int(sel["start_ns"].min()), int(sel["end_ns"].max())) if len(sel) else (None, None)
            if (f0, f1) != (s.step_start_ns, s.step_end_ns):
                rows.append({"run": case.run, "source": case.source, "rank": s.rank, "iteration": s.iteration,
                             "comm_start_ns": s.step_start_ns, "comm_end_ns": s.step_end_ns, "figure_start_ns": f0,
                             "figure_end_ns": f1,
                             "why": "not drawn" if f0 is None else "drawn at another interval"})
        for x in spans.itertuples():
            if (x.group, x.iteration) not in seen:
                rows.append({"run": case.run, "source": case.source, "rank": x.rank, "iteration": x.iteration,
                             "comm_start_ns": None, "comm_end_ns": None, "figure_start_ns": x.start_ns,
                             "figure_end_ns": x.end_ns, "why": f"{x.group}: a step the communication figures lack"})
    return pd.DataFrame(rows, columns=MISMATCH_COLUMNS)


FIGURE_DATA_COLUMNS = ["group", "lane", "iteration", "events", "first_ms", "last_end_ms", "summed_ms"]


def figure_data(timeline: RankTimeline, case: str) -> pd.DataFrame:
    """The figure's data of one case, per lane group, lane and step: its rows drawn, the first start and last
    end (ms from the case's origin) and their summed duration (nested host ops counted each)."""
    ev = timeline.events[timeline.events["run"] == case]
    if ev.empty:
        return pd.DataFrame(columns=FIGURE_DATA_COLUMNS)
    ev = ev.assign(end=ev["rel_ns"] + ev["dur_ns"])
    g = ev.groupby(["group", "lane", "iteration"], sort=True)
    out = g.agg(events=("rel_ns", "size"), first_ms=("rel_ns", "min"), last_end_ms=("end", "max"),
                summed_ms=("dur_ns", "sum")).reset_index()
    for c in ("first_ms", "last_end_ms", "summed_ms"):
        out[c] = out[c].astype(float) / 1e6
    return out[FIGURE_DATA_COLUMNS]
