"""Communication of multi-device cases (issue 39) on a real CPU run: `kernelmap run --device cpu --devices 2
--profile framework --steps 3 --warmup 1 --batch-size 32 --data synthetic` (2-core machine, busy), trimmed to
its captures (tests/data/cpu_devices_run): PyTorch DDP over gloo (two ranks, rank1/ holds the second's trace),
MXNet's KVStore local over two CPU contexts, JAX's step over two XLA host devices. Counts are checked against
the raw traces read with the standard library; the figures' self-checks pass, and fail where the issuing ops
are removed or a figure is out of its bounds."""

from __future__ import annotations

import gzip
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from kernelmap.frameworks import spec
from kernelmap.reports import commchecks
from kernelmap.reports.analyses import comm, commfigures
from kernelmap.reports.checkrows import FAIL, NOT_CHECKED, PASS, Check

from kernelmap import commlink, schema
from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data" / "cpu_devices_run"


def _events(rel: str) -> list[dict]:
    with gzip.open(DATA / rel, "rt") as fh:
        doc = json.load(fh)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> pd.DataFrame:
    run = tmp_path_factory.mktemp("devices") / "run"
    shutil.copytree(DATA, run)
    normalise_run_dir(run)
    return schema.read_parquet(run / "records.parquet")


def test_every_rank_and_collective_is_recorded_as_the_traces_have_them(records):
    comm_rows = records[commlink.is_communication(records)]
    for rank, rel in ((0, "pytorch-x2/bs32/trace.json.gz"), (1, "pytorch-x2/bs32/rank1/trace.json.gz")):
        raw = Counter(e["name"] for e in _events(rel) if e.get("ph") == "X"
                      and e.get("name") in ("c10d::allreduce_", "gloo:all_reduce"))
        mine = comm_rows[(comm_rows["run"] == "pytorch-x2/bs32") & (comm_rows["rank"] == rank)]
        assert raw == Counter({"c10d::allreduce_": 6, "gloo:all_reduce": 6})
        assert Counter(mine["op_name"].tolist())["gloo:all_reduce"] == 6
        assert Counter(mine["op_name"].tolist())["c10d::allreduce_"] == 6
    # JAX: one all-reduce thunk per step on each host device, the device its rank
    raw = Counter(e["args"]["device_ordinal"] for e in _events("jax-x2/bs32/trace.json.gz")
                  if str(e.get("name", "")).startswith("all-reduce") and "device_ordinal" in e.get("args", {}))
    jax = comm_rows[comm_rows["run"] == "jax-x2/bs32"]
    assert raw == Counter({"0": 3, "1": 3})
    assert Counter(jax["rank"].tolist()) == Counter({0: 3, 1: 3}) and set(jax["kind"]) == {"op"}
    # MXNet: every KVStoreReduce operator span (its B events) is communication
    raw = sum(1 for e in _events("mxnet-x2/bs32/trace.json.gz") if e.get("name") == "KVStoreReduce" and e.get("ph") == "B")
    mx = comm_rows[comm_rows["run"] == "mxnet-x2/bs32"]
    assert raw == 24 and (mx["op_name"] == "KVStoreReduce").sum() == 24
    assert set(mx.loc[mx["op_name"] != "KVStoreReduce", "phase"]) == {"optimizer"}  # the KVStore's copies


def test_each_gloo_work_span_is_linked_to_its_allreduce_op_with_its_bytes(records):
    pt = records[records["run"] == "pytorch-x2/bs32"]
    work = pt[pt["op_name"] == "gloo:all_reduce"]
    by_id = pt.set_index("event_id")
    issuers = by_id.loc[work["op_event_id"].astype("int64")]
    assert (issuers["op_name"] == "c10d::allreduce_").all()
    assert (work["start_ns"].to_numpy() >= issuers["start_ns"].to_numpy()).all()
    assert (work["bytes"].to_numpy() == issuers["bytes"].to_numpy()).all()
    # DDP's two buckets a step together hold every parameter once: the model's parameters x 4 bytes
    ops = pt[(pt["op_name"] == "c10d::allreduce_") & (pt["rank"] == 0)]
    per_step = ops.groupby("iteration")["bytes"].sum()
    assert per_step.tolist() == [spec.PARAM_COUNT * commlink.GRADIENT_BYTES] * 3


def test_figures_per_step_and_rank_and_their_checks_pass(records):
    steps = comm.per_step(records)
    assert set(steps["run"]) == {"pytorch-x2/bs32", "mxnet-x2/bs32", "jax-x2/bs32"}
    pt = steps[steps["run"] == "pytorch-x2/bs32"]
    assert sorted(pt["rank"].tolist()) == [0, 0, 0, 1, 1, 1] and set(pt["iteration"]) == {1, 2, 3}
    assert (steps["exposed_ms"] <= steps["communication_ms"] + 1e-9).all()
    assert (steps["communication_ms"] <= steps["step_ms"] + 1e-9).all()
    assert (steps["linked_share"].dropna() == 1.0).all()
    # JAX's all-reduce thunk runs alone on its device's thread: nothing overlaps it
    assert (steps.loc[steps["run"] == "jax-x2/bs32", "overlap_share"] == 0).all()
    got = commchecks.step_checks("run", steps)
    assert len(got) == 6 and {r["status"] for r in got} == {PASS}
    assert {r["check"] for r in got} == {Check.COMM_LINKED, Check.COMM_BOUNDS}


def test_removing_the_issuing_ops_fails_the_attribution_check(records):
    pt = records[records["run"] == "pytorch-x2/bs32"].copy()
    pt = pt[pt["op_name"] != "c10d::allreduce_"].reset_index(drop=True)
    pt.loc[pt["op_name"] == "gloo:all_reduce", "op_event_id"] = pd.NA
    relinked = commlink.link(pt)  # no issuing op left: the work stays unlinked
    got = commchecks.step_checks("run", comm.per_step(relinked))
    row = next(r for r in got if r["check"] == Check.COMM_LINKED)
    assert row["status"] == FAIL and row["measured"] == 0.0 and "0.0%" in row["detail"]


def test_a_figure_out_of_bounds_fails_its_check(records):
    steps = comm.per_step(records)
    bad = steps.copy()
    i = bad.index[bad["run"] == "mxnet-x2/bs32"][1]
    bad.loc[i, "exposed_ms"] = bad.loc[i, "communication_ms"] + 0.5
    got = commchecks.step_checks("run", bad)
    row = next(r for r in got if r["subject"] == "mxnet-x2/bs32" and r["check"] == Check.COMM_BOUNDS)
    assert row["status"] == FAIL and row["measured"] == "1 outside" and "exposed" in row["detail"]


def _synthetic(comm_iv, compute_iv, step=(0, 100)) -> pd.DataFrame:
    rows = [{"kind": "step", "op_name": "kernelmap:step#1", "start_ns": step[0], "dur_ns": step[1] - step[0],
             "canonical_op": None}]
    rows += [{"kind": "op", "op_name": "c10d::allreduce_", "start_ns": s, "dur_ns": e - s, "canonical_op": "collective"}
             for s, e in comm_iv]
    rows += [{"kind": "op", "op_name": "aten::mm", "start_ns": s, "dur_ns": e - s, "canonical_op": "linear"}
             for s, e in compute_iv]
    df = pd.DataFrame({c: [r.get(c) for r in rows] for c in schema.COLUMNS})
    df = df.assign(run="x", framework="pytorch", mode="eager", devices=2, batch_size=8, rank=0, iteration=1, source="kineto",
                   source_file="t.json", event_id=np.arange(len(rows)), bytes=None, kernel_name=None)
    return df


def test_exposed_and_overlap_by_hand():
    # communication [10, 30) and [50, 60); compute [0, 20) and [25, 55): overlap 10 + 5 + 5 = 20 of 30
    steps = comm.per_step(_synthetic([(10, 30), (50, 60)], [(0, 20), (25, 55)]))
    r = steps.iloc[0]
    assert r["communication_ms"] * 1e6 == pytest.approx(30) and r["exposed_ms"] * 1e6 == pytest.approx(10)
    assert r["compute_ms"] * 1e6 == pytest.approx(50) and r["overlap_share"] == pytest.approx(20 / 30)
    assert r["step_ms"] * 1e6 == pytest.approx(100)


def test_outermost_keys_event_ids_by_case_and_rank():
    """Event ids are unique within a case's pass only: case A's c10d::allreduce_ (id 1) holds its
    record_param_comms (id 2, op_event_id 1); case B's allreduce (id 7) and rank 1's of case A (id 9) sit in an op
    of id 1 that is no collective of theirs (a DDP hook). Only A's rank-0 record_param_comms is inside another; the
    comparison without the case and rank dropped B's and rank 1's collectives too (arrivals and collectives read
    every case at once)."""
    ops = pd.DataFrame({"run": ["a/bs32", "a/bs32", "b/bs32", "a/bs32"], "source": ["kineto"] * 4,
                        "rank": pd.array([0, 0, 0, 1], dtype="Int64"),
                        "event_id": pd.array([1, 2, 7, 9], dtype="Int64"),
                        "op_event_id": pd.array([pd.NA, 1, 1, 1], dtype="Int64"),
                        "op_name": ["c10d::allreduce_", "record_param_comms", "c10d::allreduce_", "c10d::allreduce_"]})
    assert comm.outermost(ops)["event_id"].tolist() == [1, 7, 9]
    # a trace without ranks (MXNet's one process): NA ranks are one scope
    one = ops.iloc[:2].assign(rank=pd.array([pd.NA, pd.NA], dtype="Int64"))
    assert comm.outermost(one)["event_id"].tolist() == [1]
    assert comm.outermost(ops.iloc[:0]).empty


def test_the_report_counts_each_devices_calls_and_checks_communication(tmp_path):
    """The report's checks on the normalised run: calls per step of every device (two ranks' traces, two
    contexts' ops; each rank's backward paired with its own forward by its autograd numbers), and the two
    communication checks, pass for every case."""
    from kernelmap.reports import checks as C
    from kernelmap.reports.checkrows import Check
    from kernelmap.reports.cli import load_runs

    run = tmp_path / "run"
    shutil.copytree(DATA, run)
    normalise_run_dir(run)
    got = C.self_checks(load_runs([str(run)]))
    calls = got[(got["check"] == Check.CALLS) & (got["status"] != NOT_CHECKED)]  # XLA's thunks are not calls
    assert len(calls) == 16 and set(calls["status"]) == {PASS}
    one = C.expected_calls_per_step()  # a device's calls of each op x direction
    assert all(r.expected == 2 * one[tuple(r.subject.split())] for r in calls.itertuples())  # 2 devices
    ours = got[got["check"].isin([Check.COMM_LINKED, Check.COMM_BOUNDS])]
    assert len(ours) == 6 and set(ours["status"]) == {PASS}


def test_which_rank_arrived_last_at_each_allreduce(records):
    """Against the raw traces (both ranks' Kineto files share one base time on this host): the n-th
    c10d::allreduce_ of each rank, the later start is the rank that arrived last."""
    starts = {}
    for rank, rel in ((0, "pytorch-x2/bs32/trace.json.gz"), (1, "pytorch-x2/bs32/rank1/trace.json.gz")):
        with gzip.open(DATA / rel, "rt") as fh:
            doc = json.load(fh)
        assert doc["distributedInfo"]["rank"] == rank
        starts[rank] = (doc["baseTimeNanoseconds"],
                        sorted(e["ts"] for e in doc["traceEvents"] if e.get("name") == "c10d::allreduce_"))
    assert starts[0][0] == starts[1][0]
    want = [(int(b > a), round(abs(b - a) / 1e3, 3)) for a, b in zip(starts[0][1], starts[1][1], strict=True)]
    got = comm.arrivals(records)
    pt = got[(got["run"] == "pytorch-x2/bs32") & (got["op_name"] == "c10d::allreduce_")]
    pt = pt.sort_values(["iteration", "collective"])
    assert [(int(r.last_rank), round(r.spread_ms, 3)) for r in pt.itertuples()] == want
    assert set(got.loc[got["run"] == "mxnet-x2/bs32", "run"]) == set()  # one process, no ranks: no rows
    jax = got[got["run"] == "jax-x2/bs32"]
    assert len(jax) == 3 and set(jax["ranks"]) == {2}


def test_jax_all_reduce_bytes_come_from_its_hlo(records):
    """XLA's trace has no sizes: each all-reduce's bytes are its HLO result's, the 8 gradient tensors (every
    parameter once) and the loss, a float32 scalar, reduced in one tuple all-reduce."""
    with gzip.open(DATA / "jax-x2/bs32/jit__train_step.hlo.txt.gz", "rt") as fh:
        line = next(x for x in fh if " all-reduce(" in x)
    assert line.split(" all-reduce(")[0].count("f32[") == 9  # 8 parameters' gradients and the loss
    jax = records[(records["run"] == "jax-x2/bs32") & commlink.is_communication(records)]
    assert len(jax) == 6 and (jax["bytes"] == (spec.PARAM_COUNT + 1) * 4).all()
    steps = comm.per_step(records)
    assert (steps.loc[steps["run"] == "jax-x2/bs32", "comm_bytes"] == (spec.PARAM_COUNT + 1) * 4).all()


def test_every_collective_of_each_rank_with_its_work(records):
    """Per rank and traced step, DDP's two bucket all-reduces hold every parameter once (1,611,304 + 75,264 bytes),
    each with its one gloo work span (its time the span's, from the raw trace); the first step also broadcasts
    DDP's module state; XLA's one all-reduce a step is its own work. On the CPU no stream, no NCCL algorithm."""
    t = comm.collectives(records)
    pt = t[(t["run"] == "pytorch-x2/bs32") & (t["iteration"] > 1)]
    assert len(pt) == 8 and (pt["op_name"] == "c10d::allreduce_").all() and (pt["work_rows"] == 1).all()
    assert (pt.groupby(["rank", "iteration"])["bytes"].sum() == spec.PARAM_COUNT * commlink.GRADIENT_BYTES).all()
    raw = sorted(e["dur"] for e in _events("pytorch-x2/bs32/trace.json.gz") if e.get("name") == "gloo:all_reduce")
    mine = t[(t["run"] == "pytorch-x2/bs32") & (t["rank"] == 0) & (t["op_name"] == "c10d::allreduce_")]
    assert sorted(mine["work_ms"] * 1e3) == pytest.approx(raw, abs=1e-3)
    first = t[(t["run"] == "pytorch-x2/bs32") & (t["iteration"] == 1) & (t["rank"] == 0)]
    assert first["op_name"].tolist() == ["c10d::broadcast_", "c10d::broadcast_", "c10d::allreduce_", "c10d::allreduce_"]
    jax = t[t["run"] == "jax-x2/bs32"]
    assert len(jax) == 6 and (jax["work_rows"] == 0).all() and (jax["collective"] == 0).all()
    assert t["streams"].isna().all() and t["algorithm"].isna().all()


def test_nccl_kernels_name_their_algorithm_and_protocol():
    """NCCL kernel names as GPU traces of others record them (2.19+: ``ncclDevKernel_<coll>_<op>_<type>_<algo>_<proto>``;
    earlier ``ncclKernel_<coll>_<algo>_<proto>_<op>_<type>``); a generic kernel names none."""
    f = commlink.nccl_algorithm
    assert f("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)") == "RING LL"
    assert f("ncclDevKernel_AllReduce_Sum_f16_TREE_LL(ncclDevKernelArgs4K const)") == "TREE LL"
    assert f("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)") == "RING LL"
    assert f("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)") is None
    assert f("ncclDevKernel_SendRecv") is None and f("void at::native::vectorized_elementwise_kernel<4>") is None
    # linked to its op, a kernel's algorithm and stream reach the op's row
    df = _synthetic([(10, 30)], [(0, 20)])
    kern = df.iloc[[1]].assign(kind="kernel", kernel_name="ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", stream=7,
                               op_event_id=df.iloc[1]["event_id"], event_id=99, algo=None, op_name=None)
    got = comm.collectives(commlink.link(pd.concat([df, kern], ignore_index=True)))
    assert got[["algorithm", "streams", "work_rows"]].values.tolist() == [["RING LL", "7", 1]]


# NCCL's log lines as NCCL's own format strings print them (enqueue.cc's COLL line on every rank, rank 0's TUNING line
# in its 2.19+ and earlier forms): no multi-GPU run has written a real one here yet (docs/DEVICES.md)
NCCL_RANK0 = """\
gpu1:100:100 [0] NCCL INFO Init COMPLETE
gpu1:100:100 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f0a00 recvbuff 0x7f0a00 count 402826 datatype 7 op 0 root 0 comm 0x55aa [nranks=2] stream 0x55bb
gpu1:100:100 [0] NCCL INFO AllReduce: 1611304 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..1}
gpu1:100:100 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0x7f0b00 recvbuff 0x7f0b00 count 18816 datatype 7 op 0 root 0 comm 0x55aa [nranks=2] stream 0x55bb
gpu1:100:100 [0] NCCL INFO 75264 Bytes -> Algo 1 proto 0 time 12.500000
"""
NCCL_RANK1 = """\
gpu1:101:101 [1] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f1a00 recvbuff 0x7f1a00 count 402826 datatype 7 op 0 root 0 comm 0x66aa [nranks=2] stream 0x66bb
gpu1:101:101 [1] NCCL INFO AllReduce: opCount 1 sendbuff 0x7f1b00 recvbuff 0x7f1b00 count 18816 datatype 7 op 0 root 0 comm 0x66aa [nranks=2] stream 0x66bb
"""


def test_nccl_log_each_collective_with_rank_zeros_algorithm(tmp_path):
    from kernelmap.errors import ParseError

    f = tmp_path / commlink.NCCL_LOG
    f.write_text(NCCL_RANK0)
    t = commlink.read_nccl_log(f)
    assert t[["func", "op_count", "bytes", "stream", "algorithm"]].values.tolist() == [
        ["AllReduce", 0, 1611304, "0x55bb", "RING SIMPLE"], ["AllReduce", 1, 75264, "0x55bb", "RING LL"]]
    f.write_text(NCCL_RANK1)
    assert commlink.read_nccl_log(f)["algorithm"].isna().all()  # only rank 0 logs the choice
    f.write_text(NCCL_RANK0 + "gpu1:100:100 [0] NCCL INFO AllReduce: opCount 2 sendbuff 0x1 count ?\n")
    with pytest.raises(ParseError, match="line 6"):
        commlink.read_nccl_log(f)


def test_the_libs_pass_logs_nccl_in_each_ranks_folder_on_several_gpus(tmp_path):
    from kernelmap.frameworks import dataparallel

    from kernelmap.run.devices import libs_env

    assert "NCCL_DEBUG" not in libs_env("gpu", tmp_path, devices=1) and "NCCL_DEBUG" not in libs_env("cpu", tmp_path)
    env = libs_env("gpu", tmp_path, devices=2)
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "COLL,TUNING"
    assert env["NCCL_DEBUG_FILE"] == str(tmp_path / commlink.NCCL_LOG)
    assert dataparallel.rank_paths(env, tmp_path, 1)["NCCL_DEBUG_FILE"] == str(tmp_path.resolve() / "rank1" / "nccl.log")


def test_the_report_reads_each_ranks_nccl_log_and_names_the_algorithm_of_its_collectives(tmp_path):
    from kernelmap.reports.cli import load_runs

    run = tmp_path / "run"
    shutil.copytree(DATA, run)
    (run / "pytorch-x2/bs32" / commlink.NCCL_LOG).write_text(NCCL_RANK0)
    (run / "pytorch-x2/bs32/rank1" / commlink.NCCL_LOG).write_text(NCCL_RANK1)
    normalise_run_dir(run)
    loaded = load_runs([str(run)])[0]
    logged = comm.nccl(loaded)
    assert logged["rank"].tolist() == [0, 0, 1, 1] and set(logged["case"]) == {"pytorch-x2/bs32"}
    got = commfigures.tables([loaded], commfigures.of([loaded]))["comm_collectives"]
    pt = got[(got["case"] == "pytorch-x2/bs32") & (got["op_name"] == "c10d::allreduce_")]
    assert set(pt.loc[pt["bytes"] == 1611304, "algorithm"]) == {"RING SIMPLE (NCCL log)"}
    assert set(pt.loc[pt["bytes"] == 75264, "algorithm"]) == {"RING LL (NCCL log)"}
    assert "nccl.log" not in " ".join(map(str, loaded.records["source_file"].unique()))  # a companion, not records


def test_one_process_on_several_gpus_gets_figures_per_device():
    """XLA's GPU trace names no rank, a process per device: each device's kernels are that device's rank."""
    df = _synthetic([(10, 30)], [(0, 20)]).assign(rank=pd.NA)
    kern = pd.concat([df.iloc[1:]] * 2, ignore_index=True).assign(kind="kernel", device_index=[0, 0, 1, 1],
                                                                   event_id=[10, 11, 12, 13])
    kern.loc[[2, 3], ["start_ns"]] = [[40], [30]]  # device 1: communication [40, 60), compute [30, 50)
    steps = comm.per_step(pd.concat([df.iloc[:1], kern], ignore_index=True).assign(devices=2))
    assert steps["rank"].tolist() == [0, 1]
    assert (steps["exposed_ms"] * 1e6).round().tolist() == [10, 10] and steps["basis"].eq(comm.BASIS_DEVICE).all()
