"""MXNet's profiler names each thread by a 64-bit unsigned hash; the adapter kept those of 2^63 or more as NA, so every
such thread became one, and an op of one thread could "enclose" an op of another in the outermost-op count. On the
2x H200 (``kernelmap run --framework all --device gpu --devices 1 2 --profile comm --batch-size 1024``) an engine
thread's ``DeleteVariable`` (164 µs) spanned a ``_backward_FullyConnected`` of the GPU worker thread in step 15, and
the report counted 1.95 linear backward calls a step ("calls per step: linear bwd: expected 2, measured 1.95"). That
run's trace did not come back (its records did: both ops' tid NA); these are real traces of the same profiler, read
with the standard library beside the adapter."""

from __future__ import annotations

import collections
import gzip
import json
from pathlib import Path

import pytest
from kernelmap.reports.analyses.timed import outermost_ops

from kernelmap.adapters import mxnet_profiler

DATA = Path(__file__).parent / "data"
GPU_TRACE = DATA / "gpu_mxnet_run" / "mxnet" / "bs64" / "trace.json.gz"  # real, H100, 20 steps
CPU_X2_TRACE = DATA / "cpu_comm_run" / "mxnet-x2" / "bs32" / "trace.json.gz"  # real, 2 CPU contexts


def _raw_threads(path: Path) -> collections.Counter:
    """Operator spans per (process, thread hash) of the raw trace's device processes ("cpu/0", "gpu/0": B events of
    category operator; MXNet's other processes are not records)."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
               and str(e["args"]["name"]).startswith(("cpu/", "gpu/"))}
    return collections.Counter((e["pid"], e["tid"]) for e in events
                               if e.get("ph") == "B" and e.get("cat") == "operator" and e["pid"] in devices)


def _as_int64(h: int) -> int:
    return h - 2**64 if h >= 2**63 else h


@pytest.mark.parametrize("path", [GPU_TRACE, CPU_X2_TRACE])
def test_every_thread_of_the_trace_stays_apart(path):
    raw = _raw_threads(path)
    assert any(h >= 2**63 for _, h in raw)  # the case that was lost
    ops = mxnet_profiler.read(path)
    ops = ops[ops["kind"].eq("op")]
    assert ops["tid"].notna().all()
    got = collections.Counter(zip(ops["pid"].astype(int), ops["tid"].astype(int), strict=True))
    assert got == collections.Counter({(p, _as_int64(h)): n for (p, h), n in raw.items()})


def test_the_gpu_traces_threads_are_the_workers_three():
    raw = _raw_threads(GPU_TRACE)
    assert sorted(raw.values()) == [41, 472, 729] and len(raw) == 3


def test_no_op_encloses_another_threads_op():
    """Each engine thread runs one op at a time: every op is outermost on its own thread. With the threads merged,
    the CPU 2-context run lost a ``multi_sgd_mom_update`` (inside another thread's op)."""
    ops = mxnet_profiler.read(CPU_X2_TRACE)
    ops = ops[ops["kind"].eq("op")]
    assert len(outermost_ops(ops)) == len(ops) == 664
    merged = ops.assign(tid=ops["tid"].where(ops["tid"] >= 0))  # what the adapter made of it before
    lost = ops.loc[~ops.index.isin(outermost_ops(merged).index), "op_name"].tolist()
    assert lost == ["multi_sgd_mom_update"]


def test_linear_backward_calls_per_step_on_the_gpu_trace():
    ops = mxnet_profiler.read(GPU_TRACE)
    outer = outermost_ops(ops[ops["kind"].eq("op")])
    per_step = outer[outer["canonical_op"].eq("linear")].groupby(["iteration", "direction"]).size()
    assert set(per_step.tolist()) == {2} and len(per_step) == 2 * 20  # fc1 and fc2, forward and backward, 20 steps
