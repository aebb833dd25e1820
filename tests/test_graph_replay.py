"""Kernels replayed from a CUDA graph (adapters/graph_replay.py), attributed from the eager reference step.

Without a GPU here, the replay traces are made from a real eager PyTorch GPU trace
(tests/data/gpu_kineto.json.gz, 5 profiled steps): each replayed step keeps its own kernels and
memsets (names, times, streams) but they correlate with one ``cudaGraphLaunch`` in place of their ops
and launches, as in a graph replay; the reference file is one eager step of the same trace. What each
replayed kernel must get is what the eager trace itself says for it (the adapter's eager path).
``test_real_graph_replay_capture`` reads the real capture of benches/gpu_modes.sh once it is in
tests/data (GRAPH_FIXTURE)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from kernelmap.adapters import kineto
from kernelmap.errors import ParseError
from kernelmap.rundir import GRAPH_REFERENCE

DATA = Path(__file__).parent / "data"
EAGER = DATA / "gpu_kineto.json.gz"
# the follow-up drops the trimmed framework pass of PyTorch's cuda-graph mode here (benches/gpu_modes.sh
# writes it as $OUT/graph_fixture/{trace.json.gz,graph-reference.json.gz,expected.json})
GRAPH_FIXTURE = DATA / "gpu_cuda_graph"
HOST = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
DEVICE = ("kernel", "gpu_memset", "gpu_memcpy")
LABELS = ["canonical_op", "direction", "layer", "phase"]


def _steps(ev):
    return sorted((e for e in ev if str(e.get("name", "")).startswith("kernelmap:step#")), key=lambda e: e["ts"])


def _step_events(ev, step):
    """The host events inside ``step`` and the device events their launches correlate with."""
    lo, hi = step["ts"], step["ts"] + step["dur"]
    host = [e for e in ev if e.get("ph") == "X" and e.get("cat") in HOST and lo <= e["ts"] <= hi and e is not step]
    corr = {e["args"]["correlation"] for e in host if e.get("cat") in ("cuda_runtime", "cuda_driver")
            and "correlation" in e.get("args", {})}
    dev = [e for e in ev if e.get("cat") in DEVICE and e.get("args", {}).get("correlation") in corr]
    return host, dev


def _write(path, doc, events):
    with gzip.open(path, "wt") as fh:
        json.dump({**{k: v for k, v in doc.items() if k != "traceEvents"}, "traceEvents": events}, fh)


def make_replay(tmp_path, drop_kernel: bool = False, reference: bool = True):
    """(replay trace path, the eager records of its replayed kernels, the replayed steps' names)."""
    doc = json.loads(gzip.open(EAGER).read())
    ev = doc["traceEvents"]
    steps = _steps(ev)
    ref_host, ref_dev = _step_events(ev, steps[1])
    if reference:
        _write(tmp_path / GRAPH_REFERENCE, doc, ref_host + ref_dev)
    events, replayed = [], []
    for k, step in enumerate(steps[2:]):
        host, dev = _step_events(ev, step)
        launch_tid = next(e for e in host if e.get("cat") == "cuda_runtime")["tid"]
        corr = 10_000_000 + k
        events.append(step)
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": step["pid"],
                       "tid": launch_tid, "ts": step["ts"] + 1.0, "dur": 5.0,
                       "args": {"correlation": corr, "External id": corr}})
        if drop_kernel and k == 0:
            dev = [e for e in dev if e.get("cat") == "kernel"][1:] + [e for e in dev if e.get("cat") != "kernel"]
        for e in dev:
            events.append({**e, "args": {**e["args"], "correlation": corr, "External id": corr}})
        replayed += [(e["name"], e["ts"]) for e in dev]
    path = tmp_path / "trace.json.gz"
    _write(path, doc, events)
    eager = kineto.read(EAGER)
    eager = eager[eager["kind"].isin(["kernel", "memset", "memcpy"])]
    key = pd.MultiIndex.from_frame(eager[["kernel_name", "start_ns"]].astype({"start_ns": "int64"}))
    return path, eager.set_index(key), replayed


def test_replayed_kernels_take_the_eager_twins_labels(tmp_path):
    path, eager, replayed = make_replay(tmp_path)
    df = kineto.read(path)
    dev = df[df["kind"].isin(["kernel", "memset", "memcpy"])]
    assert len(dev) == len(replayed) == 3 * 52  # 3 replayed steps of 52 device events (49 kernels, 3 memsets)
    assert (dev["kind"] == "kernel").sum() == 3 * 49
    kern = dev[dev["kind"] == "kernel"]
    # 100% of the replayed kernel time attributed, every kernel to what the eager trace says for it
    assert kern["canonical_op"].notna().all() and not (kern["canonical_op"] == "other").any()
    got = dev.set_index(pd.MultiIndex.from_frame(dev[["kernel_name", "start_ns"]].astype({"start_ns": "int64"})))
    want = eager.loc[got.index]
    for col in [*LABELS, "library"]:
        pd.testing.assert_series_equal(got[col].astype(object), want[col].astype(object), check_names=False)
    # the iteration: the step whose cudaGraphLaunch they replay
    assert sorted(kern["iteration"].unique().tolist()) == [7, 8, 9]


def test_a_replay_that_is_not_the_reference_step_is_an_error(tmp_path):
    path, _, _ = make_replay(tmp_path, drop_kernel=True)
    with pytest.raises(ParseError, match="neither replayed nor run eagerly"):
        kineto.read(path)


def test_a_replay_without_its_reference_file_is_an_error(tmp_path):
    path, _, _ = make_replay(tmp_path, reference=False)
    with pytest.raises(ParseError, match=GRAPH_REFERENCE):
        kineto.read(path)


@pytest.mark.skipif(not (GRAPH_FIXTURE / "trace.json.gz").is_file(),
                    reason="the real cuda-graph capture of benches/gpu_modes.sh is not in tests/data yet")
def test_real_graph_replay_capture():
    """The trimmed framework pass of PyTorch's cuda-graph mode on the H100: every replayed kernel
    attributed, counts and totals as expected.json (written by an independent stdlib reader on the
    GPU machine: the device events correlating with cudaGraphLaunch, their count and summed duration)."""
    expected = json.loads((GRAPH_FIXTURE / "expected.json").read_text())
    df = kineto.read(GRAPH_FIXTURE / "trace.json.gz")
    rows, _ = __import__("kernelmap.adapters.graph_replay", fromlist=["x"]).replayed_rows(df)
    rep = df.iloc[rows]
    assert len(rep) == expected["replayed_device_events"]
    assert int(rep["dur_ns"].sum()) == expected["replayed_device_ns"]
    kern = rep[rep["kind"] == "kernel"]
    assert len(kern) == expected["replayed_kernels"]
    assert kern["canonical_op"].notna().all() and not (kern["canonical_op"] == "other").any()


def test_normalise_keys_the_mode_and_reads_the_reference_once(tmp_path):
    """A run directory's pytorch-cuda-graph/bs64 folder: its records are keyed pytorch-cuda-graph, the
    reference file is read with the trace (listed under not_records), never as records of its own."""
    from kernelmap.normalise import normalise_run_dir
    from kernelmap.schema import read_parquet

    case = tmp_path / "pytorch-cuda-graph" / "bs64"
    case.mkdir(parents=True)
    _, _, replayed = make_replay(case)
    summary = normalise_run_dir(tmp_path)
    assert [n["file"] for n in summary["not_records"]] == [f"pytorch-cuda-graph/bs64/{GRAPH_REFERENCE}"]
    rec = read_parquet(tmp_path / "records.parquet")
    assert set(rec["framework"]) == {"pytorch-cuda-graph"}
    assert rec["kind"].isin(["kernel", "memset", "memcpy"]).sum() == len(replayed)
