"""MXNet profiler adapter on a trace from a real `kernelmap run --device cpu` (framework pass, bulking
off): mx.profiler.Event regions (B/E, category "event") -> step/annotation rows, iteration, phase.

tests/data/cpu_mxnet_run_trace.json.gz: `kernelmap run --framework all --device cpu --steps 10
--profile all --data synthetic`, mxnet/bs64/trace.json.gz as written (MXNet 1.9.1, 5 warm-up + 5
profiled steps; the Event regions of the warm-up steps are in the dump too)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kernelmap.adapters import mxnet_profiler

TRACE = Path(__file__).parent / "data" / "cpu_mxnet_run_trace.json.gz"


@pytest.fixture(scope="module")
def events():
    return json.loads(gzip.open(TRACE).read())["traceEvents"]


@pytest.fixture(scope="module")
def df():
    return mxnet_profiler.read(TRACE)


def test_event_regions_become_rows(events, df):
    begins = [e["name"] for e in events if e.get("ph") == "B" and e.get("cat") == "event"]
    steps = sorted(n for n in begins if n.startswith("kernelmap:step#"))
    regions = [n for n in begins if not n.startswith("kernelmap:step#")]
    assert len(steps) == 10 and len(regions) == 30
    assert sorted(df.loc[df["kind"].eq("step"), "op_name"]) == steps
    assert sorted(df.loc[df["kind"].eq("annotation"), "op_name"]) == sorted(regions)
    st = df[df["kind"].eq("step")]
    assert st["iteration"].tolist() == [int(n.split("#")[1]) for n in st["op_name"]]


def test_every_operator_has_its_step(events, df):
    n_ops = sum(1 for e in events if e.get("ph") == "B" and e.get("cat") == "operator")
    ops = df[df["kind"].eq("op")]
    assert len(ops) == n_ops
    assert ops["iteration"].notna().all()
    # the profiled steps (5..9) each run the whole model: 2 convolutions forward and backward
    conv = ops[ops["canonical_op"].eq("conv2d")]
    per_step = conv.groupby(["iteration", "direction"]).size().unstack()
    assert per_step.index.tolist() == [5, 6, 7, 8, 9]
    assert (per_step["fwd"] == 2).all() and (per_step["bwd"] == 2).all()


def test_backward_operators_visible_with_layer_and_phase(df):
    ops = df[df["kind"].eq("op")]
    assert not ops["op_name"].eq("ImperativeBulk").any()  # MXNET_EXEC_BULK_EXEC_TRAIN=0
    for name, canon in (("_backward_Convolution", "conv2d"), ("_backward_FullyConnected", "linear")):
        b = ops[ops["op_name"].eq(name)]
        assert len(b) == 10
        assert set(b["canonical_op"]) == {canon} and set(b["direction"]) == {"bwd"}
        assert set(b["phase"]) == {"backward"}
        assert b["layer"].notna().all()
    fwd = ops[ops["direction"].eq("fwd")]
    assert set(fwd["phase"]) == {"forward"}
    assert set(ops.loc[ops["canonical_op"].eq("sgd_update"), "phase"]) == {"optimizer"}
    # layers per step by position: forward conv1 then conv2, backward the reverse
    c = ops[ops["op_name"].eq("_backward_Convolution")].sort_values("start_ns")
    assert c["layer"].tolist() == ["conv2", "conv1"] * 5
