"""Communication of multi-device cases (issue 39), per case, step and rank: DataFrames only.

Per traced step of each rank (``per_step``):

- ``step_ms``: the step on that rank: its step region (``kernelmap:step#N``), widened to the first start and
  the last end of the step's compute and communication (JAX's region closes once the host has dispatched the
  step, before its devices run it);
- ``communication_ms``: the union of the communication intervals of the step (``commlink.is_communication``:
  collective ops, their work spans, the KVStore's sums and copies, collective kernels); on the GPU (the device
  basis) only the device's rows (kernels, copies, sets): the host's issuing ops and API calls are another clock;
- ``compute_ms``: the union of the rest: on the GPU the kernels (the device's clock), on the CPU the framework
  ops (the host's clock; nested ops counted once);
- ``exposed_ms``: communication time during which no compute ran (communication minus its overlap with
  compute); ``overlap_share`` = 1 − exposed / communication (NA without communication);
- ``comm_bytes``, ``collectives``: bytes the step's collective ops moved (their sizes in the trace; NA where it
  gives none) and how many they are: the outermost collective ops (``outermost``: DDP's ``c10d::allreduce_`` and the
  ``record_param_comms`` inside it are one), on the device basis those that launched device rows, plus each
  instruction a device row names without a launching op (XLA's GPU trace);
- ``step_start_ns``, ``step_end_ns``: the step's interval on the trace's clock (the merged timeline of the ranks
  draws it: ``analyses/ranks.py``);
- ``linked_share``: the share of the communication rows' summed time that is an op of the framework's own
  or linked to the op that issued it (``op_event_id``; ``kernelmap/commlink.py``), or a device row that names the
  instruction it runs (XLA's GPU kernels: the trace has no op rows).

The rank is the trace's (Kineto's ``distributedInfo``; XLA's host device of each thunk); where a trace names
none (MXNet's one process drives its N contexts through one KVStore, whose sums and copies serve them all),
the rows of a step form one group, rank NA. What the basis is: ``basis`` (device kernels or host ops).

``arrivals``: which rank arrived last at each collective. ``independent``: the traces' exposed communication
against an independent measure, the clean step less the same step without the gradients' reduction.
``reports/commchecks.py`` turns the figures into the report's self-checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from kernelmap.frameworks.dataparallel import NO_REDUCTION, rank_folders

from kernelmap.adapters.canonical import COLLECTIVE
from kernelmap.commlink import NCCL_LOG, NCCL_LOG_COLUMNS, is_communication, read_nccl_log
from kernelmap.schema import Kind

from ..foreign import length_ns, overlap_ns, union_ns

BASIS_DEVICE = "device kernels (GPU clock)"
BASIS_HOST = "host framework ops (CPU clock)"
COLUMNS = ["run", "framework", "mode", "devices", "batch_size", "source", "rank", "iteration", "basis", "step_ms",
           "compute_ms", "communication_ms", "exposed_ms", "overlap_share", "comm_bytes", "collectives",
           "linked_share", "step_start_ns", "step_end_ns"]
_NS_MS = 1e6
DEVICE_KINDS = (Kind.KERNEL.value, Kind.MEMCPY.value, Kind.MEMSET.value)  # rows on a device's clock


def _intervals(rows: pd.DataFrame) -> list[tuple[int, int]]:
    rows = rows[rows["start_ns"].notna() & rows["dur_ns"].notna()]
    s = rows["start_ns"].to_numpy(dtype=np.int64)
    return union_ns(s, s + rows["dur_ns"].to_numpy(dtype=np.int64))


def _linked_ns(comm: pd.DataFrame, ops: set) -> tuple[int, int]:
    """(summed time of ``comm``'s rows that are ops or linked to one of ``ops``, summed time of all). A device row
    with no launching op that carries a collective instruction (XLA's GPU trace: a kernel names the ``all-reduce``
    it runs, canonical op ``collective`` from the HLO text; the trace has no op rows) is attributed to that op; one
    whose instruction is not a collective, or not in the HLO text, is not (every XLA kernel carries a name)."""
    dur = comm["dur_ns"].fillna(0).astype("int64")
    kind = comm["kind"]
    own = (kind == Kind.OP.value).fillna(False)
    named = _named_collective(comm)
    linked = own | comm["op_event_id"].isin(ops).fillna(False) | named
    return int(dur[linked].sum()), int(dur.sum())


def _named_collective(rows: pd.DataFrame) -> pd.Series:
    """Device rows with no launching op whose own instruction is a collective (``_linked_ns``)."""
    return (rows["kind"].isin(DEVICE_KINDS).fillna(False) & rows["op_event_id"].isna()
            & rows["canonical_op"].eq(COLLECTIVE).fillna(False))


def roots(ops: pd.DataFrame, ids) -> list[int]:
    """For each op event id of ``ids``: the outermost collective op of ``ops`` (one case's collective ops: event ids
    are a case's own) above it or itself, else the id itself."""
    up = {int(e): p for e, p in zip(ops["event_id"], ops["op_event_id"], strict=True)}
    out = []
    for i in ids:
        i = int(i)
        while pd.notna(up.get(i, pd.NA)) and int(up[i]) in up:
            i = int(up[i])
        out.append(i)
    return out


# what an event id is unique within (normalise: a run, i.e. a case, of one capture pass), with the rank's trace
EVENT_SCOPE = ("run", "source", "rank")


def _scoped(ops: pd.DataFrame, column: str) -> list[tuple]:
    """Each row's ``column`` (an event id) keyed by its case, pass and rank (``EVENT_SCOPE``; NA as None)."""
    cols = [ops[c].astype(object).where(ops[c].notna(), None) for c in (*EVENT_SCOPE, column)]
    return list(zip(*cols, strict=True))


def outermost(ops: pd.DataFrame) -> pd.DataFrame:
    """The collective ops of ``ops`` (communication ops of one case or of several) not inside another of them: DDP's
    ``c10d::allreduce_`` holds the ``record_param_comms`` that launches its NCCL kernel, one collective counted once
    (its bytes too). An op is inside another of its own case, pass and rank (``EVENT_SCOPE``): two cases' equal event
    ids are two ops."""
    ids = {k for k in _scoped(ops, "event_id") if k[-1] is not None}
    inside = [k[-1] is not None and k in ids for k in _scoped(ops, "op_event_id")]
    return ops[~np.array(inside, dtype=bool)]


def _steps(df: pd.DataFrame) -> pd.Series:
    """Iteration -> its step region's (start, end) in ``df`` (the widest where a trace holds several); only steps
    whose work the trace recorded: a step region without any row of its iteration but regions is one the profiler
    did not record (MXNet's warm-up steps: its ``Event`` spans are written while its operator profiling is off;
    counted, their zeros pulled a GPU run's medians of 20 traced steps over 25)."""
    regions = df["kind"].isin([Kind.STEP.value, Kind.ANNOTATION.value]).fillna(True)
    worked = df.loc[~regions & df["iteration"].notna(), "iteration"].unique()
    steps = df[(df["kind"] == Kind.STEP.value).fillna(False) & df["iteration"].isin(worked) & df["start_ns"].notna()]
    ends = steps["start_ns"] + steps["dur_ns"].fillna(0)
    g = pd.DataFrame({"iteration": steps["iteration"], "start": steps["start_ns"], "end": ends}).groupby("iteration")
    return pd.Series({it: (int(x["start"].min()), int(x["end"].max())) for it, x in g})


@dataclass(frozen=True)
class CaseFrame:
    """One case's records of one capture source as the figures (``per_step``) and the merged timeline
    (``analyses/ranks.py``) read them (``case_frame``)."""

    rows: pd.DataFrame  # the rows of the traces that hold its communication, each device its rank (``device_ranks``)
    comm: np.ndarray  # which of ``rows`` are communication (``commlink.is_communication``)
    on_device: bool  # the case's trace has kernels: its compute is them (the device's clock), else its framework ops

    @property
    def basis(self) -> str:
        return BASIS_DEVICE if self.on_device else BASIS_HOST

    @property
    def work(self) -> np.ndarray:
        """Which of ``rows`` are of compute's kind (kernels on the device, else framework ops), communication too."""
        return (self.rows["kind"] == ("kernel" if self.on_device else "op")).fillna(False).to_numpy()


def case_frame(df: pd.DataFrame) -> CaseFrame:
    """``CaseFrame`` of one case's records of one capture source."""
    df = device_ranks(df)
    on_device = bool((df["kind"] == "kernel").any())
    comm = is_communication(df)
    keep = df["source_file"].isin(df.loc[comm, "source_file"].unique()).to_numpy()
    return CaseFrame(df[keep], comm[keep], on_device)


def _case_rows(case: CaseFrame) -> list[dict]:
    """The figures of one case's records (one run, one source)."""
    df, comm_mask, work_all = case.rows, case.comm, case.work
    if df.empty:  # no communication traced
        return []
    ops = set(df.loc[(df["kind"] == "op").fillna(False), "event_id"].dropna().tolist())
    key = df.iloc[0]
    out = []
    ranks = sorted(df.loc[comm_mask, "rank"].dropna().unique().tolist()) or [None]
    for r in ranks:
        # the rank's rows and the rows that name no rank (a process's step regions), in the traces of its
        # communication (a rank's own trace; the one trace of a process that drives every device)
        sel = np.ones(len(df), dtype=bool) if r is None else ((df["rank"] == r).fillna(False) | df["rank"].isna()).to_numpy()
        sel = sel & df["source_file"].isin(df.loc[sel & comm_mask, "source_file"].unique()).to_numpy()
        mine, comm_all, work = df[sel], comm_mask[sel], work_all[sel]
        steps = _steps(mine)
        for it, (s0, s1) in steps.items():
            at = (mine["iteration"] == it).fillna(False).to_numpy()
            in_rank = np.ones(len(mine), dtype=bool) if r is None else (mine["rank"] == r).fillna(False).to_numpy()
            comm = mine[at & comm_all & in_rank]
            compute = mine[at & ~comm_all & in_rank & work]
            # on the device basis its communication is the device's rows (kernels, copies), not the host's
            # issuing ops and API calls: the device's clock, as its compute
            timed = comm[comm["kind"].isin(DEVICE_KINDS).fillna(False).to_numpy()] if case.on_device else comm
            c_iv, w_iv = _intervals(timed), _intervals(compute)
            c_ns = length_ns(c_iv)
            # the step on this rank: its region, widened to its work (an asynchronous framework's region
            # closes when the host has issued the step, before its devices ran it: JAX's)
            ends = [s0, s1] + [x for iv in (_intervals(comm), w_iv) if iv for x in (iv[0][0], iv[-1][1])]
            step_ns = max(ends) - min(ends)
            exposed = c_ns - overlap_ns(c_iv, w_iv)
            linked, total = _linked_ns(timed, ops)
            every = comm[(comm["kind"] == "op").fillna(False).to_numpy()]
            issuing, instructions = outermost(every), 0
            if case.on_device:  # the collectives that ran on the device: ops that launched its rows (DDP's
                # record_param_comms of a work's wait launches none), and each instruction a row names (XLA's)
                launched = timed[timed["op_event_id"].notna().to_numpy()]
                issuing = issuing[issuing["event_id"].isin(roots(every, launched["op_event_id"])).to_numpy()]
                instructions = timed.loc[_named_collective(timed).to_numpy(), "op_name"].dropna().nunique()
            out.append({"run": key["run"], "framework": key["framework"], "mode": key["mode"],
                        "devices": key["devices"], "batch_size": key["batch_size"], "source": key["source"],
                        "rank": r, "iteration": it,
                        "basis": case.basis, "step_ms": step_ns / _NS_MS, "compute_ms": length_ns(w_iv) / _NS_MS,
                        "communication_ms": c_ns / _NS_MS, "exposed_ms": exposed / _NS_MS,
                        "overlap_share": (1 - exposed / c_ns) if c_ns else None,
                        "comm_bytes": int(issuing["bytes"].sum()) if issuing["bytes"].notna().any() else None,
                        "collectives": len(issuing) + instructions, "linked_share": linked / total if total else None,
                        "step_start_ns": min(ends), "step_end_ns": max(ends)})
    return out


def device_ranks(df: pd.DataFrame) -> pd.DataFrame:
    """One process's trace of several GPUs (XLA's: a process per device in one trace, no rank): each kernel's rank
    its device's (``device_index``), so that each device gets its own figures; any other trace as it is."""
    if "device_index" not in df or df["rank"].notna().any():
        return df
    kern = (df["kind"] == "kernel").fillna(False) & df["device_index"].notna()
    if df.loc[kern, "device_index"].nunique() < 2:
        return df
    df = df.copy()
    df.loc[kern, "rank"] = df.loc[kern, "device_index"]
    return df


def per_step(records: pd.DataFrame) -> pd.DataFrame:
    """``COLUMNS``: one row per multi-device case, traced step and rank (see the module docstring)."""
    if records.empty or "devices" not in records:
        return pd.DataFrame(columns=COLUMNS)
    multi = records[(records["devices"].fillna(1) > 1)]
    rows: list[dict] = []
    for _, df in multi.groupby(["run", "source"], sort=True):  # each capture pass on its own (its clock, its steps)
        rows += _case_rows(case_frame(df))
    out = pd.DataFrame(rows, columns=COLUMNS)
    for c in ("rank", "iteration", "comm_bytes", "devices", "batch_size", "step_start_ns", "step_end_ns"):
        out[c] = out[c].astype("Int64")
    return out


def per_case(steps: pd.DataFrame) -> pd.DataFrame:
    """Per case and rank: the medians over its traced steps of ``per_step``'s times, the overlap share of the
    summed times, the steps counted."""
    if steps.empty:
        return pd.DataFrame(columns=[*COLUMNS[:8], "steps"])
    g = steps.groupby(["run", "framework", "mode", "devices", "batch_size", "source", "rank", "basis"], dropna=False)
    out = g.agg(steps=("iteration", "size"), step_ms=("step_ms", "median"), compute_ms=("compute_ms", "median"),
                communication_ms=("communication_ms", "median"), exposed_ms=("exposed_ms", "median"),
                comm_total_ms=("communication_ms", "sum"), exposed_total_ms=("exposed_ms", "sum"),
                linked_share=("linked_share", "min")).reset_index()
    out["overlap_share"] = np.where(out["comm_total_ms"] > 0,
                                    1 - out["exposed_total_ms"] / out["comm_total_ms"].where(out["comm_total_ms"] > 0),
                                    np.nan)
    return out.drop(columns=["comm_total_ms", "exposed_total_ms"])


ARRIVAL_COLUMNS = ["run", "framework", "devices", "source", "iteration", "collective", "op_name", "ranks", "first_rank",
                   "last_rank", "spread_ms"]


def arrivals(records: pd.DataFrame) -> pd.DataFrame:
    """``ARRIVAL_COLUMNS``: which rank arrived last at each collective: per multi-device case, traced step and
    collective (the k-th issuing op of the step on every rank, in start order), the rank whose op started last
    and how long after the first (``spread_ms``; the ranks' traces share the host's clock on one machine). Only
    where every rank issued the same op as its k-th; a case without ranks (MXNet's one process) has no rows."""
    if records.empty or "devices" not in records:
        return pd.DataFrame(columns=ARRIVAL_COLUMNS)
    multi = records[(records["devices"].fillna(1) > 1)]
    ops = outermost(multi[is_communication(multi) & (multi["kind"] == "op").fillna(False).to_numpy()])
    ops = ops[ops["rank"].notna().to_numpy() & ops["iteration"].notna().to_numpy()]
    rows = []
    for (run, src, it), g in ops.groupby(["run", "source", "iteration"], sort=True):
        g = g.sort_values("start_ns", kind="stable")
        g = g.assign(k=g.groupby("rank").cumcount())
        ranks = g["rank"].nunique()
        for k, c in g.groupby("k", sort=True):
            if len(c) != ranks or c["op_name"].nunique() != 1:
                continue
            first, last = c.iloc[0], c.iloc[-1]
            rows.append({"run": run, "framework": first["framework"], "devices": first["devices"], "source": src,
                         "iteration": it,
                         "collective": int(k), "op_name": first["op_name"], "ranks": int(ranks),
                         "first_rank": first["rank"], "last_rank": last["rank"],
                         "spread_ms": (last["start_ns"] - first["start_ns"]) / _NS_MS})
    out = pd.DataFrame(rows, columns=ARRIVAL_COLUMNS)
    for col in ("devices", "iteration", "first_rank", "last_rank"):
        out[col] = out[col].astype("Int64")
    return out


COLLECTIVE_COLUMNS = ["run", "framework", "devices", "batch_size", "source", "rank", "iteration", "collective", "op_name",
                      "bytes", "work_rows", "work_ms", "streams", "algorithm", "kernels"]


def collectives(records: pd.DataFrame) -> pd.DataFrame:
    """``COLLECTIVE_COLUMNS``: every collective of the traced steps of the multi-device cases, per rank in start
    order (``collective``: its index in the step): its issuing op (the outermost collective op: ``outermost``), bytes,
    the rows of work linked to it or to a collective op inside it (gloo's spans, NCCL's kernels: ``op_event_id``;
    in a case traced on its devices only device rows, and only the ops that launched some) with their summed time
    (the op's own where none is linked: XLA's thunk on the CPU, MXNet's KVStore ops), the CUDA streams of its kernels, NCCL's algorithm and protocol where the
    kernels' names say them (``commlink.nccl_algorithm``; NA for a generic NCCL kernel) and the kernels' names."""
    if records.empty or "devices" not in records:
        return pd.DataFrame(columns=COLLECTIVE_COLUMNS)
    multi = records[(records["devices"].fillna(1) > 1)]
    comm = multi[is_communication(multi)]
    every = comm[(comm["kind"] == "op").fillna(False)]
    ops = outermost(every)
    ops = ops[ops["iteration"].notna().to_numpy()]
    # an op's work: the device rows and work spans linked to it or to a collective op inside it (DDP's NCCL kernel
    # is launched by the record_param_comms inside c10d::allreduce_); host API calls are not its work
    # a case traced on its devices: their rows (the device basis, as per_step); else the host's work spans (gloo's)
    on_device = set(map(tuple, multi.loc[(multi["kind"] == Kind.KERNEL.value).fillna(False).to_numpy(),
                                         ["run", "source"]].drop_duplicates().to_numpy().tolist()))
    dev = np.array([(c, s) in on_device for c, s in zip(comm["run"], comm["source"], strict=True)], dtype=bool)
    kinds = np.where(dev, comm["kind"].isin(DEVICE_KINDS).fillna(False).to_numpy(),
                     (comm["kind"] == Kind.ANNOTATION.value).fillna(False).to_numpy())
    work = comm[kinds & comm["op_event_id"].notna().to_numpy()]
    work = pd.concat([g.assign(op_event_id=roots(every[every["run"] == c], g["op_event_id"]))
                      for c, g in work.groupby("run", sort=False)]) if len(work) else work
    by_op = {k: g for k, g in work.groupby(["run", "source", "source_file", "op_event_id"], sort=False)}
    rows = []
    for (case, src, rank, it), g in ops.groupby(["run", "source", "rank", "iteration"], sort=True, dropna=False):
        g = g.sort_values("start_ns", kind="stable")
        if (case, src) in on_device:  # the collectives that ran on the device (per_step counts these)
            g = g[[(case, src, f, e) in by_op for f, e in zip(g["source_file"], g["event_id"], strict=True)]]
        for k, (_, op) in enumerate(g.iterrows()):
            w = by_op.get((case, src, op["source_file"], op["event_id"]))
            kern = w[(w["kind"] == "kernel").fillna(False)] if w is not None else work.iloc[0:0]
            algos = sorted(kern["algo"].dropna().astype(str).unique()) if len(kern) else []
            rows.append({"run": case, "framework": op["framework"], "devices": op["devices"],
                         "batch_size": op["batch_size"], "source": src, "rank": rank, "iteration": it,
                         "collective": k, "op_name": op["op_name"], "bytes": op["bytes"],
                         "work_rows": 0 if w is None else len(w),
                         "work_ms": (w["dur_ns"].sum() if w is not None else op["dur_ns"]) / _NS_MS,
                         "streams": ";".join(str(int(x)) for x in sorted(kern["stream"].dropna().unique())) or None,
                         "algorithm": ";".join(algos) or None,
                         "kernels": ";".join(sorted(kern["kernel_name"].dropna().astype(str).unique())) or None})
    out = pd.DataFrame(rows, columns=COLLECTIVE_COLUMNS)
    for c in ("devices", "batch_size", "rank", "iteration", "bytes"):
        out[c] = out[c].astype("Int64")
    return out


def nccl(run) -> pd.DataFrame:
    """NCCL's own log of every multi-device case of ``run`` (``commlink.read_nccl_log``; written by the libs pass on
    several GPUs, each rank's in its folder): one row per logged collective with its case and rank (a process that
    drives several GPUs: the rank is the CUDA device the line names)."""
    frames = []
    for r in run.results:
        if (r.get("devices") or 1) < 2 or not r.get("dir"):
            continue
        folders = rank_folders(Path(run.path) / r["dir"])
        for rank, folder in folders:
            log = folder / NCCL_LOG
            if log.is_file():
                t = read_nccl_log(log)
                frames.append(t.assign(case=r["dir"], framework=r.get("framework"),
                                       rank=rank if len(folders) > 1 else t["cuda_device"]))
    if not frames:
        return pd.DataFrame(columns=["case", "framework", "rank", *NCCL_LOG_COLUMNS])
    out = pd.concat(frames, ignore_index=True)
    return out[["case", "framework", "rank", *NCCL_LOG_COLUMNS]]


def with_logged_algorithms(each: pd.DataFrame, logged: pd.DataFrame) -> pd.DataFrame:
    """``collectives``' rows whose kernels name no algorithm, given the one NCCL's log names for a collective of the
    same case and bytes (NCCL chooses by size, the same on every rank), marked ``(NCCL log)``; others as they are."""
    known = logged.dropna(subset=["algorithm", "bytes"])
    if each.empty or known.empty:
        return each
    pairs = known.groupby(["case", "bytes"])["algorithm"].agg(lambda a: ";".join(sorted(set(a))))
    out = each.copy()
    for i, row in out[out["algorithm"].isna() & out["bytes"].notna()].iterrows():
        algo = pairs.get((row["case"], int(row["bytes"])))
        if algo is not None:
            out.loc[i, "algorithm"] = f"{algo} (NCCL log)"
    return out


AGREEMENT = 0.05  # issue 39: the traces' exposed communication within 5% of the step's change without reduction
INDEPENDENT_COLUMNS = ["run", "case", "framework", "devices", "batch_size", "source", "rank", "traced_steps",
                       "exposed_ms", "clean_ms", "no_reduction_ms", "clean_rank", "no_reduction_rank", "difference_ms", "rel_error", "within",
                       "difference_low_ms", "difference_high_ms", "verdict"]
# ``verdict`` of a row: within AGREEMENT; else inside the difference's 95% interval (each side's interval of its
# median, the widest difference they allow: the measure's own noise is wider than 5%); else beyond both
AGREE, NOISE, DISAGREE = "within 5%", "within the measure's noise", "beyond 5% and the noise"
CRITICAL_RANK = "the device with the most compute in each step"  # one process driving every device
# one process per device: per step, the rank whose exposed communication was least, the one that arrived last at the
# step's collectives (every rank's collective ends together; the others' extra is waiting for it: under the profiler
# who waits for whom is the profiler's doing, session 12's 2x H100 rank 0 waited 1.84 ms a step for rank 1)
LAST_RANK = "the rank that arrived last at each step (least exposed)"


def _exposed(steps: pd.DataFrame, per_rank: bool) -> tuple[float, int]:
    """(median over traced steps of the exposed communication that costs the step, steps) of one case's ``per_step``
    rows of one source: per step, that of ``LAST_RANK`` (one process per device: ``per_rank``) or of
    ``CRITICAL_RANK`` (one process: the device the others wait for)."""
    if per_rank:
        crit = steps.sort_values("exposed_ms", kind="stable").groupby("iteration").head(1)
    else:
        crit = steps.sort_values("compute_ms", kind="stable").groupby("iteration").tail(1)
    return float(crit["exposed_ms"].median()), len(crit)


def _slowest(ranks: list[dict], side: str) -> dict:
    """The rank of ``ranks`` (results.json's ``noreduce`` per-rank entries) with the longest median step of ``side``
    ("clean_" or "": the step without reduction)."""
    return max(ranks, key=lambda x: x[f"{side}median_step_s"])


def _difference_interval(clean: dict, without: dict) -> tuple[float | None, float | None]:
    """(low, high) ms of clean − without reduction that the two medians' 95% intervals allow (results.json's per-rank
    ``ci95_*``: ``clean``'s clean side, ``without``'s own); (None, None) where either has none (too few samples)."""
    b = [clean.get("clean_ci95_low_s"), clean.get("clean_ci95_high_s"), without.get("ci95_low_s"),
         without.get("ci95_high_s")]
    if any(x is None for x in b):
        return None, None
    return (b[0] - b[3]) * 1e3, (b[1] - b[2]) * 1e3


def independent(records: pd.DataFrame, results: list[dict], steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """``INDEPENDENT_COLUMNS``: per multi-device case with a step without reduction (results.json's
    ``dataparallel.NO_REDUCTION`` entry) and trace source, the traces' exposed communication that costs the step
    (``_exposed``: ``LAST_RANK``'s or ``CRITICAL_RANK``'s, median over the traced steps) against what removing the
    reduction saves: the clean pass's median step less the step without the gradients' reduction, timed as the clean
    pass is (``difference_ms``). One process per device: each side its slowest rank's median (the ranks of the clean
    step keep pace with each other; without the reduction each goes its own pace, and the slowest one's is the step
    the reduction waits on); one process: its one figure. ``rel_error`` = (exposed − difference) / difference,
    ``verdict`` (AGREE: |rel_error| <= ``AGREEMENT``, else NOISE or DISAGREE against the difference's interval:
    ``_difference_interval``); ``within``: the verdict is AGREE (the CSV's yes or no of it, never decided apart).
    ``records``: one run's; its ``run`` column is the case; ``steps``: its ``per_step`` where the caller has it
    (computed here otherwise)."""
    steps = per_step(records) if steps is None else steps
    rows = []
    for r in results:
        nr = r.get(NO_REDUCTION) or {}
        if not nr.get("ranks"):
            continue
        mine = steps[steps["run"] == r.get("dir")]
        per_rank = len(nr["ranks"]) > 1  # one process per device: each rank its own clean and step without
        t_clean, t_without = _slowest(nr["ranks"], "clean_"), _slowest(nr["ranks"], "")
        clean, without = t_clean["clean_median_step_s"] * 1e3, t_without["median_step_s"] * 1e3
        diff = clean - without
        lo, hi = _difference_interval(t_clean, t_without)
        for src, g in mine.groupby("source", sort=True):
            exposed, n = _exposed(g, per_rank)
            rel = (exposed - diff) / diff if diff > 0 else None
            verdict = (AGREE if rel is not None and abs(rel) <= AGREEMENT else
                       NOISE if lo is not None and lo <= exposed <= hi else DISAGREE)
            rows.append({"case": r.get("dir"), "framework": r.get("framework"), "devices": r.get("devices"),
                         "batch_size": r.get("batch_size"), "source": src,
                         "rank": LAST_RANK if per_rank else CRITICAL_RANK, "traced_steps": n,
                         "exposed_ms": exposed, "clean_ms": clean, "no_reduction_ms": without,
                         "clean_rank": t_clean["rank"], "no_reduction_rank": t_without["rank"],
                         "difference_ms": diff, "rel_error": rel,
                         "within": verdict == AGREE, "difference_low_ms": lo, "difference_high_ms": hi,
                         "verdict": verdict})
    out = pd.DataFrame(rows, columns=INDEPENDENT_COLUMNS[1:])
    out["rel_error"] = pd.to_numeric(out["rel_error"], errors="coerce")  # NA where the difference is not > 0
    return out
