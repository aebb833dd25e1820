"""Kineto adapter on the runner's H200 trace (tests/data/gpu_kineto.json.gz: PyTorch bs64, framework
pass, 5 profiled steps after 5 warm-up; see tests/data/gpu_fixtures.json)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kernelmap.adapters import kineto

TRACE = Path(__file__).parent / "data" / "gpu_kineto.json.gz"


@pytest.fixture(scope="module")
def events():
    return json.loads(gzip.open(TRACE).read())["traceEvents"]


@pytest.fixture(scope="module")
def df():
    return kineto.read(TRACE)


def test_kernel_count_and_time_match_the_json(events, df):
    ev = [e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]
    k = df[df["kind"].eq("kernel")]
    assert len(k) == len(ev) == 245
    assert int(k["dur_ns"].sum()) == sum(round(e["dur"] * 1000) for e in ev)
    assert set(k["kernel_name"]) == {e["name"] for e in ev}
    assert set(k["correlation_id"]) == {e["args"]["correlation"] for e in ev}


def test_every_kernel_attributed(df):
    k = df[df["kind"].eq("kernel")]
    assert k["canonical_op"].notna().all() and not k["canonical_op"].eq("other").any()
    assert k["op_event_id"].notna().all()
    assert set(k["iteration"]) == {5, 6, 7, 8, 9}
    # 49 kernels per step, the same in every step
    assert k.groupby("iteration").size().eq(49).all()


def test_conv_backward_split(df):
    k = df[df["kind"].eq("kernel") & df["canonical_op"].eq("conv2d") & df["phase"].eq("backward")
           & ~df["kernel_name"].str.contains("at::native", regex=False, na=False)]
    per_step = k.groupby(["layer", "direction"]).size().div(5).to_dict()
    # conv1: wgrad_alg0_engine only (its input needs no gradient); conv2: two NCHW->NHWC transforms,
    # the sm90 dgrad and the NHWC->NCHW transform back; Winograd wgrad: data, delta, gemm, output
    assert per_step == {("conv1", "bwd_weight"): 1, ("conv2", "bwd_data"): 4, ("conv2", "bwd_weight"): 4}
    wgrad_gemm = k[k["kernel_name"].str.endswith("_cublas")]
    assert set(wgrad_gemm["direction"]) == {"bwd_weight"} and len(wgrad_gemm) == 5
