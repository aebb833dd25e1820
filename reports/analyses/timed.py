"""Which events each framework x batch size is timed from (one source, finest level) and its calls per step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kernelmap import adapters, frameworks, schema
from kernelmap.errors import KernelmapError

from .base import TRACE_SOURCES, Run, case_of, expected_calls_per_step, field_at, passes_of, with_case_column


# --- records: which events to time from ------------------------------------------------------
def records_of(run: Run) -> pd.DataFrame:
    """The run's records, each with its case's name (``case``: what the analyses group by)."""
    rec = run.records if run.records is not None else schema.empty()
    return rec if "case" in rec.columns else with_case_column(rec)


def outermost_ops(ops: pd.DataFrame, chain: pd.DataFrame | None = None) -> pd.DataFrame:
    """Keep op rows not contained in another op row of the same (pid, tid). A source whose op spans may
    reach past other ops of their thread (its adapter's ``OP_SPANS_MAY_OVERLAP``: XLA's asynchronous CPU
    thunks, timed to their completion) says nesting itself: its rows that no other op row owns (``op_event_id``),
    directly or through owners left out of ``ops`` (a control-flow thunk that names no canonical op), whose own
    owners ``chain`` (the source's records; default ``ops``) gives."""
    if ops.empty:
        return ops
    by_owner = ops["source"].map(lambda s: bool(getattr(adapters.FORMATS.get(s), "OP_SPANS_MAY_OVERLAP", False)))
    owned = by_owner & _owner_among(ops, ops if chain is None else chain)
    keep = list(ops.index[by_owner & ~owned])
    spans = ops[~by_owner]
    for _, g in spans.sort_values(["start_ns", "dur_ns"], ascending=[True, False]).groupby(
            [spans["pid"].fillna(-1), spans["tid"].fillna(-1)], sort=False):
        end = -1
        for idx, s, d in zip(g.index, g["start_ns"], g["dur_ns"], strict=True):
            if pd.isna(s) or pd.isna(d):
                continue
            if s >= end:
                keep.append(idx)
                end = s + d
            # else: nested inside the current outermost op
    return ops.loc[sorted(keep)]


def _owner_among(ops: pd.DataFrame, chain: pd.DataFrame) -> pd.Series:
    """Whether some owner up each row's chain (``op_event_id``, then that owner's own, as ``chain`` and ``ops``
    give them) is itself a row of ``ops``, of the same run (event ids are a run's): a row whose owners were none
    of them passed in (a thunk in a control-flow thunk that names no canonical op, itself in no op) is
    outermost; one whose grandparent was passed in is that grandparent's (else both would count)."""
    def run_of(df: pd.DataFrame) -> pd.Series:
        return df["run"].astype(object).where(df["run"].notna(), None) if "run" in df else pd.Series(None, df.index)

    runs = run_of(ops)
    ids = {(r, int(e)) for r, e in zip(runs, ops["event_id"], strict=True) if pd.notna(e)}
    up: dict[tuple, int] = {}  # (run, event id) -> its owner's event id
    for df in (chain, ops):
        for r, e, o in zip(run_of(df), df["event_id"], df["op_event_id"].astype("Int64"), strict=True):
            if pd.notna(e) and pd.notna(o):
                up[(r, int(e))] = int(o)

    def owned(r, o) -> bool:
        seen = set()
        while pd.notna(o) and (r, int(o)) not in seen:
            if (r, int(o)) in ids:
                return True
            seen.add((r, int(o)))
            o = up.get((r, int(o)))
        return False

    return pd.Series([owned(r, o) for r, o in zip(runs, ops["op_event_id"].astype("Int64"), strict=True)],
                     index=ops.index)


@dataclass
class Timed:
    """The events one framework x batch size is timed from."""

    framework: str
    batch_size: int | None
    source: str
    level: str  # kernel | op
    events: pd.DataFrame  # the timed rows, canonical_op/direction/library/... filled from links
    n_steps: int
    step_ns: float | None  # median step duration in this source (kind=step rows), if any
    n_steps_basis: str = ""
    step_basis: str | None = None  # where step_ns comes from
    iterations: tuple[int, ...] = ()  # the traced iterations counted as steps (those with model ops)
    outside_events: int = 0  # timed events of iterations not counted (e.g. a warm-up step's tail)
    outside_ns: int = 0
    pass_name: str | None = None  # the capture pass the source belongs to (framework, nsys)
    ops: pd.DataFrame | None = field(default=None, repr=False)  # the source's op rows of the counted steps


def fill_from_links(ev: pd.DataFrame, rec: pd.DataFrame) -> pd.DataFrame:
    """Fill canonical_op, direction, phase, layer, op_name from the linked op, and library,
    library_call, math_mode, algo from the linked library call, where the row itself has none.
    Links are event ids, unique within a records ``run`` (one framework x batch size folder)."""
    ev = ev.copy()
    ref = rec.dropna(subset=["event_id"]).drop_duplicates(["run", "event_id"])
    for link, cols in (("op_event_id", ("canonical_op", "direction", "phase", "layer", "op_name")),
                       ("call_event_id", ("library", "library_call", "math_mode", "algo", "canonical_op",
                                          "direction"))):
        if ev[link].isna().all():
            continue
        r = ref[["run", "event_id", *cols]].rename(columns={"event_id": link, **{c: f"_{c}" for c in cols}})
        merged = ev[["run", link]].merge(r, on=["run", link], how="left")
        merged.index = ev.index
        for c in cols:
            ev[c] = ev[c].fillna(merged[f"_{c}"].astype(ev[c].dtype))
    return ev


_SOURCE_PASS = {**{d.trace_source: "framework" for d in frameworks.REGISTRY.values()}, "nsys": "nsys"}


def model_ops() -> frozenset[str]:
    """Canonical ops of the model's layers (frameworks/spec.py, via ``expected_calls_per_step``)."""
    return frozenset(op for op, _ in expected_calls_per_step())


def _counted_iterations(rows: pd.DataFrame) -> list[int]:
    """The traced iterations that hold timed work of the model: an iteration counts as a step when
    one of its timed events has a canonical op of the model's layers. A trace may hold step marks
    of steps it did not profile (MXNet's profiler keeps the warm-up steps' regions) and stray ops
    of such a step (a variable deleted as the profiler starts); neither makes a step."""
    it = rows.loc[rows["canonical_op"].isin(model_ops()), "iteration"].dropna()
    return sorted(int(i) for i in it.unique())


def _n_steps(rows: pd.DataFrame, run: Run, fw: str, bs: int | None, source: str) -> tuple[int, str]:
    """Traced steps: iterations holding timed model work, else the capture pass's timed step
    count from results.json. Returns (n, how it was found). Step events alone never count: a
    trace may mark steps it did not time (MXNet's profiler keeps the warm-up steps' marks)."""
    its = _counted_iterations(rows)
    if its:
        return len(its), "iterations of the trace that hold timed model ops"
    for r in run.results:
        if case_of(r) == fw and field_at(r, "batch_size") == bs:
            n = field_at(passes_of(r).get(_SOURCE_PASS.get(source, ""), {}), "steps")
            if n:
                return int(n), f"results.json: steps of the {_SOURCE_PASS[source]} pass"
    raise KernelmapError(f"{run.path}: {fw} bs {bs}: cannot tell how many steps the {source} trace holds "
                         "(no iterations with timed model ops, no pass step count)")


def timed_events(run: Run) -> list[Timed]:
    """The events each framework x batch size is timed from (computed once per Run)."""
    if run._timed is None:
        run._timed = _timed_events(run)
    return run._timed


def _timed_events(run: Run) -> list[Timed]:
    out = []
    rec = records_of(run)
    if rec.empty:
        return out
    for (fw, bs), g in rec.groupby(["case", rec["batch_size"].fillna(-1)], sort=True):
        bs_v = None if bs == -1 else int(bs)
        chosen = None
        for level, kinds in (("kernel", ("kernel",)), ("op", ("op",))):
            for src in TRACE_SOURCES:
                rows = g[(g["source"] == src) & g["kind"].isin(kinds) & g["dur_ns"].notna()]
                if len(rows):
                    chosen = (src, level, rows)
                    break
            if chosen:
                break
        if not chosen:
            continue
        src, level, rows = chosen
        srows = g[g["source"] == src]
        rows = fill_from_links(rows, srows)
        if level == "op":
            rows = outermost_ops(rows[rows["canonical_op"].notna()], srows)
        steps = srows[srows["kind"] == "step"]["dur_ns"].dropna()
        n, basis = _n_steps(rows, run, str(fw), bs_v, src)
        its = _counted_iterations(rows)
        outside = rows["iteration"].notna() & ~rows["iteration"].isin(its) if its else \
            pd.Series(False, index=rows.index)
        out_ev, out_ns = int(outside.sum()), int(rows.loc[outside, "dur_ns"].sum())
        rows = rows[~outside]
        ops = srows[(srows["kind"] == "op") & srows["canonical_op"].notna()]
        if its:
            ops = ops[ops["iteration"].isin(its)]
        # The step's wall time is the median the worker measured (device synchronised) in the very
        # pass that recorded this trace. Traced step spans are host-side only: MXNet's engine runs
        # ops after its region has closed, and CUDA kernels outlive their launches.
        step_ns, step_basis = None, None
        pass_name = _SOURCE_PASS.get(src, "")
        for r in run.results:
            if case_of(r) == fw and field_at(r, "batch_size") == bs_v:
                med = field_at(passes_of(r).get(pass_name, {}), "median_step_s")
                if med:
                    step_ns, step_basis = med * 1e9, f"median synchronised step of the {pass_name} pass"
        if step_ns is None and len(steps):
            step_ns, step_basis = float(steps.median()), "traced step events (host side)"
        out.append(Timed(str(fw), bs_v, src, level, rows, n, step_ns, basis, step_basis, tuple(its),
                         out_ev, out_ns, pass_name or None, ops))
    return out


_BWD = ("bwd", "bwd_data", "bwd_weight", "bwd_bias")


def direction_group(d: Any) -> str:
    """fwd, bwd (any gradient), or the direction itself (update, none)."""
    if d is None or (not isinstance(d, str) and pd.isna(d)):
        return "none"
    return "bwd" if d in _BWD else str(d)


def op_calls(t: Timed) -> pd.DataFrame:
    """Framework-op calls per step of each canonical op x direction group (fwd, bwd, ...) in the
    counted steps of the timed source: outermost ops with a canonical op. A backward call is
    counted once per forward call it differentiates: where the trace has autograd sequence numbers
    (PyTorch), backward ops whose ``seq`` falls in the same outermost forward op are one call
    (linear's ``AddmmBackward0`` and ``TBackward0`` are linear's one backward); without them
    (MXNet: one ``_backward_*`` op per forward op) each outermost backward op is a call.

    Columns: canonical_op, direction (group), calls, calls_per_step, basis."""
    cols = ["canonical_op", "direction", "calls", "calls_per_step", "basis"]
    ops = t.ops
    if ops is None or ops.empty:
        return pd.DataFrame(columns=cols)
    outer = outermost_ops(ops)
    dgroup = outer["direction"].map(direction_group)
    key = outer["event_id"].astype("Int64").astype(object)
    basis = pd.Series("outermost op", index=outer.index, dtype=object)
    if ops["seq"].notna().any():
        fwd_outer = outer[dgroup.eq("fwd")]
        seq_to_fwd: dict[tuple, int] = {}  # (process, seq): each process (a rank: issue 39) numbers its own
        if len(fwd_outer):
            fw_ops = ops[ops["seq"].notna() & ops["direction"].eq("fwd")]
            for (pid, tid), g in fw_ops.groupby([fw_ops["pid"].fillna(-1), fw_ops["tid"].fillna(-1)]):
                fo = fwd_outer[(fwd_outer["pid"].fillna(-1) == pid) & (fwd_outer["tid"].fillna(-1) == tid)]
                if fo.empty:
                    continue
                fo = fo.sort_values("start_ns")
                starts = fo["start_ns"].to_numpy(dtype="int64")
                ends = starts + fo["dur_ns"].to_numpy(dtype="int64")
                pos = np.searchsorted(starts, g["start_ns"].to_numpy(dtype="int64"), side="right") - 1
                for p, s_, sq in zip(pos, g["start_ns"].to_numpy(dtype="int64"), g["seq"], strict=True):
                    if p >= 0 and s_ < ends[p]:
                        seq_to_fwd.setdefault((pid, int(sq)), int(fo["event_id"].iloc[p]))
        bwd = dgroup.eq("bwd") & outer["seq"].notna()
        mapped = pd.Series([seq_to_fwd.get((p, int(q))) for p, q in zip(outer.loc[bwd, "pid"].fillna(-1),
                                                                        outer.loc[bwd, "seq"], strict=True)],
                           index=outer.index[bwd.to_numpy()], dtype=object)
        hit = mapped.notna()
        key.loc[mapped.index[hit]] = [("fwd", int(v)) for v in mapped[hit]]
        basis.loc[mapped.index[hit]] = "backward ops per forward call (autograd seq)"
    df = pd.DataFrame({"canonical_op": outer["canonical_op"], "direction": dgroup, "key": key, "basis": basis})
    rows = []
    for (op, d), g in df.groupby(["canonical_op", "direction"], sort=False):
        n = int(g["key"].nunique())
        rows.append({"canonical_op": op, "direction": d, "calls": n, "calls_per_step": n / t.n_steps,
                     "basis": "; ".join(sorted(set(g["basis"])))})
    return pd.DataFrame(rows, columns=cols)


