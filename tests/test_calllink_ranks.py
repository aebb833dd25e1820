"""Issue 39: op -> library call -> kernel on every rank of a case on two GPUs (kernelmap/calllink.py's ``carry``;
the nsys adapter's labels of a capture of several processes: ``_trace.label``'s ``process``, ``_trace.held_by``).

Fixture: tests/data/gpu_x2_link (README.md there): PyTorch DDP on 2 H100s, bs 64, steps 22-24 of each rank's Kineto
trace, the last 3 steps of rank 0's libs-pass trace, rank 0's cuDNN/cuBLAS/cuBLASLt logs, and the nsys capture's
rows (one capture of both processes, pids 14917 on GPU 0 and 14918 on GPU 1) relabelled by the nsys adapter's own
labeller. The libs pass owns 18 library kernels a step (its own trace: 9 by thread and time, 9 by order), so each
rank's pass holds 18 x 3 = 54, every one carried to the call its op ran in the libs pass.

Before the fix (session 14's run: nsys 470/721 linked, 69.5% of the time, the rest "each process of this case chose
its own algorithms" where the names were the call's own): the capture's two processes count their correlation ids
from the same first id, and a kernel joined the first launch of its id, another process's op for 188 of rank 0's
1,100 kernels and 247 of rank 1's; a host row took the step of whichever process's marker held its start (the ranks'
steps overlap); and the ops of every rank of a source were counted as one step's (rank 1's conv1 forward the second
conv1 forward of the step, no template of that op kind; Kineto's rank 0 then linked by signature alone).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kernelmap import adapters, attribution, calllink, schema
from kernelmap.adapters import _common, nsys
from kernelmap.adapters.canonical import WEIGHT_ARG_OPS

CASE = Path(__file__).parent / "data" / "gpu_x2_link" / "pytorch-x2" / "bs64"
NSYS_ROWS = CASE / "nsys-rows.csv.gz"
LIBS_TRACE = CASE / "libs" / "trace.json.gz"
PIDS = (14917, 14918)  # the nsys capture's processes: rank 0 (GPU 0), rank 1 (GPU 1)
STEPS = (22, 23, 24)
HOST_ROWS = ((369, 369, 508), (369, 369, 507))  # ops and runtime calls a step of each process, read from the CSV
PER_STEP = 18  # library kernels a step: the libs pass's own trace owns 18 a step (test_libs_pass_owns_its_kernels)


def nsys_records(rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """The capture's rows labelled by the nsys adapter's labeller, as the adapter labels an export (dims: the
    weight ops' sizes, which the adapter parses from the same NVTX text as ``shapes``)."""
    rows = pd.read_csv(NSYS_ROWS) if rows is None else rows
    cols = {c: pd.Series(rows[c].to_numpy(dtype=object)).where(rows[c].notna().to_numpy(), None).astype(
        schema.DTYPES[c]).array for c in rows.columns}
    cols.update(framework="pytorch", device="gpu")
    out = _common.frame(cols, "nsys.sqlite", nsys.SOURCE)
    dims = [json.loads(z) if k == "op" and n in WEIGHT_ARG_OPS and isinstance(z, str) else None
            for k, n, z in zip(rows["kind"], rows["op_name"], rows["shapes"], strict=True)]
    nsys.label_rows(out, dims, "pytorch")
    return _common.finish(out, "nsys.sqlite", nsys.SOURCE)


def linked(nsys_rows: pd.DataFrame | None = None) -> tuple[pd.DataFrame, dict, pd.DataFrame]:
    """(records, the libs-pass summary, library kernels with their reasons) of the case's files, linked as
    ``normalise`` links one case: rank 0's logs, each rank's Kineto trace, the nsys rows, the libs trace."""
    frames = [adapters.read(CASE / f"{n}.log.gz") for n in ("cudnn", "cublas", "cublaslt")]
    frames += [adapters.read(CASE / "trace.json.gz"), adapters.read(CASE / "rank1" / "trace.json.gz"),
               nsys_records(nsys_rows)]
    base = 0
    for df in frames:
        for col in ("event_id", "op_event_id", "call_event_id"):
            df[col] = df[col] + base
        base += len(df)
    rdf = schema.conform(schema.concat(frames))
    trace = adapters.read(LIBS_TRACE)
    pre = calllink.link_in_libs_pass(rdf, trace, calllink.base_ns(LIBS_TRACE, trace), False)
    reasons = pre.pop("reasons")
    carried = rdf["call_event_id"].notna()  # linked through the libs pass's templates, before the signature join
    attribution.link_library_calls(rdf, None, exclude=reasons)
    lk = attribution.library_kernels(rdf, None, reasons)
    lk["rank"], lk["pid"], lk["carried"] = rdf.loc[lk.index, "rank"], rdf.loc[lk.index, "pid"], carried[lk.index]
    return rdf, pre, lk


@pytest.fixture(scope="module")
def case():
    return linked()


def per_process(lk: pd.DataFrame) -> dict:
    """(source, rank or nsys process) -> (carried to their op's call, linked, library kernels)."""
    out = {}
    sel = [(("kineto", r), lk["source"].eq("kineto") & lk["rank"].eq(r)) for r in (0, 1)]
    sel += [(("nsys", p), lk["source"].eq("nsys") & lk["pid"].eq(p)) for p in PIDS]
    for who, mine in sel:
        g = lk[mine.fillna(False).to_numpy()]
        out[who] = (int(g["carried"].sum()), int(g["call_event_id"].notna().sum()), len(g))
    return out


def test_libs_pass_owns_its_kernels(case):
    _, pre, _ = case
    assert pre["libs_trace_library_kernels"] == pre["libs_trace_kernels_owned"] == PER_STEP * 3
    assert (pre["libs_trace_kernels_owned_by_time"], pre["libs_trace_kernels_owned_by_order"]) == (27, 27)


def test_nsys_kernels_join_their_own_process_launch(case):
    """Every kernel of the capture is launched by an op of its own process (before: 31 of the fixture's 324 kernels
    launched inside an op, all rank 0's, took an op of rank 1's; 188 of rank 0's 1,100 in the run)."""
    rdf, _, _ = case
    n = rdf[rdf["source"].eq("nsys").to_numpy()]
    ops = n[n["kind"].eq("op").to_numpy()].set_index("event_id")["pid"]
    k = n[n["kind"].eq("kernel").to_numpy() & n["op_event_id"].notna().to_numpy()]
    assert (ops.reindex(k["op_event_id"].astype("int64")).to_numpy() == k["pid"].to_numpy()).all()
    assert sorted(k["pid"].unique().tolist()) == list(PIDS)


def own_steps(rows: pd.DataFrame) -> pd.Series:
    """Per host row (op, runtime) of the CSV, the step of its own process whose marker [start, end) holds its start
    (-1: none): a reading of the rows apart from the labeller."""
    out = pd.Series(-1, index=rows.index)
    for _, mine in rows.groupby("pid"):
        marks = mine[mine["kind"].eq("step")]
        host = mine[mine["kind"].isin(["op", "runtime"])]
        for name, st, dur in zip(marks["op_name"], marks["start_ns"], marks["dur_ns"], strict=True):
            inside = (host["start_ns"] >= st) & (host["start_ns"] < st + dur)
            out[host.index[inside.to_numpy()]] = int(name.rsplit("#", 1)[1])
    return out


def test_nsys_host_rows_take_their_own_process_step(case):
    """Each process's ops and runtime calls take the step of their own process's marker: the two ranks' steps
    overlap (one runs into its next step while the other ends its own), and before the fix 102 of the fixture's
    2,544 host rows (97 of rank 0's) took the other process's step number."""
    rdf, _, _ = case
    rows = pd.read_csv(NSYS_ROWS)
    want = own_steps(rows)
    n = rdf[rdf["source"].eq("nsys").to_numpy()].sort_values("event_id")
    host = rows["kind"].isin(["op", "runtime"]).to_numpy()
    got = n["iteration"].to_numpy(dtype="float64", na_value=-1.0)[host].astype("int64")
    assert (got == want.to_numpy()[host]).all()
    counts = pd.Series(want.to_numpy()[host]).groupby(rows.loc[host, "pid"].to_numpy()).value_counts()
    assert {k: int(v) for k, v in counts.items() if k[1] >= 0} == {
        (p, s): c for p, c4 in zip(PIDS, HOST_ROWS, strict=True) for s, c in zip(STEPS, c4, strict=True)}


def test_every_rank_links_every_library_kernel_to_its_call(case):
    """Per source and rank (nsys: per process), 54 library kernels (18 a step, 3 steps), all linked, each carried to
    the call its op's kernel ran in the libs pass (not linked by signature alone)."""
    _, pre, lk = case
    want = PER_STEP * len(STEPS)
    assert per_process(lk) == {("kineto", 0): (want,) * 3, ("kineto", 1): (want,) * 3,
                               ("nsys", PIDS[0]): (want,) * 3, ("nsys", PIDS[1]): (want,) * 3}
    assert pre["carried_kernels_linked"] == 4 * want
    assert pre["algorithm_differs"] == []


def test_one_process_planted_mislinks():
    """The capture's two processes written as one (rank 1's rows given rank 0's pid: the join by correlation id
    alone, as before the fix): kernels take another process's op, and the nsys figures are those the code before the
    fix gave on this fixture (43/54 + 51/54 linked, 0 + 50 carried: 94 of 108, 50 carried)."""
    rows = pd.read_csv(NSYS_ROWS)
    planted = rows.assign(pid=rows["pid"].where(rows["pid"].isna(), PIDS[0]))
    _, pre, lk = linked(planted)
    g = lk[lk["source"].eq("nsys").to_numpy()]
    assert (int(g["carried"].sum()), int(g["call_event_id"].notna().sum()), len(g)) == (50, 94, 108)
    assert pre["carried_kernels_linked"] == 2 * PER_STEP * len(STEPS) + 50  # both Kineto ranks' 108, nsys' 50


def test_reason_names_algorithms_only_where_the_kernels_differ(case):
    """An op whose kernels are the libs pass's own in another order is said so; only other kernels are said to be
    another algorithm the process chose."""
    _, _, lk = case
    trace = adapters.read(LIBS_TRACE)
    rdf = schema.conform(schema.concat([adapters.read(CASE / f"{n}.log.gz") for n in ("cudnn", "cublas", "cublaslt")]))
    ln = calllink.launches(trace, calllink.base_ns(LIBS_TRACE, trace), rdf)
    tpl = calllink.templates(ln, calllink.own(rdf, ln).owner)
    key = next(k for k, t in tpl.items() if len(t.names) > 2)  # conv2's backward: 6 kernels of 2 calls
    tp = tpl[key]
    swapped = (tp.names[1], tp.names[0], *tp.names[2:])
    said = calllink.differs_reason(key, tp, swapped, "X", False)
    assert said.endswith("the same kernels, in another order") and "chose its own" not in said
    other = ("another_kernel", *tp.names[1:])
    assert calllink.differs_reason(key, tp, other, "X", False).endswith("(each process of this case chose its own "
                                                                          "algorithms)")
    assert calllink.differs_reason(key, tp, other, "X", True).endswith("this pass ran another_kernel, "
                                                                         + ", ".join(dict.fromkeys(tp.names[1:])))
    assert np.all(lk["reason"].isna())  # nothing unlinked on the real fixture
