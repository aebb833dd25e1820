"""A conv/linear op's layer by its position, counted per step AND device (``canonical.layers_by_position``): one
process driving two GPUs (MXNet's contexts) runs each layer's op once per GPU a step, 4 conv and 4 linear ops where
the model has 2 and 2. Counted over the step alone, no Convolution or FullyConnected op of MXNet x2 had its layer
(2x H200, session 13: the libs pass's cuBLAS calls then ambiguous between fc1 and fc2, conv1's and conv2's
``_backward_Convolution`` one kernel sequence, 'math known' FAIL at 95.6%).

Checked on real data against independent (stdlib) readings:

* the MXNet profiler trace of ``tests/data/gpu_devices_all_run`` (mxnet-x2 bs 1024, steps 22-24): an op's device is
  its process (``process_name`` gpu/0, gpu/1);
* the nsys records of the same run's nsys pass (``tests/data/gpu_devices_nsys_records``: the nsys adapter's own
  columns, steps 22-24; README there): an op's device is the GPU its launches' kernels ran on.

Planted: an op of one device removed (that device's other op of the kind: no layer in that step), both devices' ops
counted as one device (no layer anywhere: the behaviour before the fix).
"""

from __future__ import annotations

import csv
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest

from kernelmap import adapters, schema
from kernelmap.adapters import nsys

DATA = Path(__file__).parent / "data"
TRACE = DATA / "gpu_devices_all_run" / "mxnet-x2" / "bs1024" / "trace.json.gz"
NSYS = DATA / "gpu_devices_nsys_records" / "mxnet-x2-bs1024.csv.gz"
STEP = re.compile(r"^kernelmap:step#(\d+)$")
# each op name's layers in time order within a step on one device (the model's order; backward reversed)
ORDER = {"Convolution": ["conv1", "conv2"], "_backward_Convolution": ["conv2", "conv1"],
         "FullyConnected": ["fc1", "fc2"], "_backward_FullyConnected": ["fc2", "fc1"]}


def _step_of(ts: int, steps: list[tuple[int, int]]) -> int | None:
    """The step (number) whose start is the last at or before ``ts`` (MXNet runs ops after the host left the step:
    a step reaches to the next one's start)."""
    best = None
    for start, no in steps:
        if start <= ts:
            best = no
    return best


def _expected(ops: list[tuple[int, str, int]], steps: list[tuple[int, int]]) -> dict[tuple[int, str, int], str | None]:
    """{(device, name, start): layer} from ops (device, name, start): per step and device, the ops of a name in time
    order take ``ORDER``'s layers where their count is the model's, else None."""
    groups = defaultdict(list)
    for dev, name, ts in ops:
        groups[(_step_of(ts, steps), dev, name)].append(ts)
    out = {}
    for (_, dev, name), starts in groups.items():
        starts.sort()
        ok = len(starts) == len(ORDER[name])
        for i, ts in enumerate(starts):
            out[(dev, name, ts)] = ORDER[name][i] if ok else None
    return out


# --- the MXNet profiler trace ----------------------------------------------------------------------------------
def _profiler_events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _profiler_expected(events: list[dict]) -> dict:
    devices = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
               and e["args"]["name"].startswith(("gpu/", "cpu/"))}
    steps = sorted((e["ts"], int(STEP.match(e["name"]).group(1))) for e in events
                   if e.get("ph") == "B" and e.get("cat") == "event" and STEP.match(e.get("name", "")))
    ops = [(devices[e["pid"]], e["name"], e["ts"]) for e in events
           if e.get("ph") == "B" and e.get("cat") == "operator" and e.get("pid") in devices and e["name"] in ORDER]
    return _expected(ops, steps)


def _profiler_layers(path: Path) -> dict:
    df = adapters.read(path)
    ops = df[df["kind"].eq("op") & df["op_name"].isin(list(ORDER))]
    # the records' pid is the trace's; the expected side keys by the process name
    names = {e["pid"]: e["args"]["name"] for e in _profiler_events(path) if e.get("ph") == "M" and e.get("name") == "process_name"}
    return {(names[int(p)], n, int(s) // 1000): (None if pd.isna(la) else la)
            for p, n, s, la in zip(ops["pid"], ops["op_name"], ops["start_ns"], ops["layer"].astype(object), strict=True)}


def _write_trace(events: list[dict], path: Path) -> Path:
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return path


def test_profiler_every_op_has_its_layer_per_step_and_device():
    expected = _profiler_expected(_profiler_events(TRACE))
    # the reader's own count: 3 steps x 2 GPUs x 8 ops (4 names, 2 layers each), every one with a layer
    assert len(expected) == 48 and None not in expected.values()
    assert {d for d, _, _ in expected} == {"gpu/0", "gpu/1"}
    assert _profiler_layers(TRACE) == expected


def test_profiler_op_of_one_device_removed(tmp_path):
    """GPU 1's second Convolution of step 23 removed (its B and E): GPU 1's other Convolution of that step has no
    layer; every other op keeps its own."""
    events = _profiler_events(TRACE)
    gpu1 = next(e["pid"] for e in events if e.get("ph") == "M" and e.get("args", {}).get("name") == "gpu/1")
    step23 = next(e["ts"] for e in events if e.get("ph") == "B" and e.get("name") == "kernelmap:step#23")
    convs = sorted(e["ts"] for e in events if e.get("ph") == "B" and e.get("cat") == "operator"
                   and e["pid"] == gpu1 and e["name"] == "Convolution" and e["ts"] >= step23)[:2]
    drop_b = next(i for i, e in enumerate(events) if e.get("ph") == "B" and e.get("cat") == "operator"
                  and e["pid"] == gpu1 and e["name"] == "Convolution" and e["ts"] == convs[1])
    tid = events[drop_b]["tid"]
    drop_e = next(i for i, e in enumerate(events) if i > drop_b and e.get("ph") == "E" and e.get("cat") == "operator"
                  and e["pid"] == gpu1 and e["tid"] == tid and e["name"] == "Convolution")
    planted = [e for i, e in enumerate(events) if i not in (drop_b, drop_e)]
    got = _profiler_layers(_write_trace(planted, tmp_path / "trace.json.gz"))
    expected = _profiler_expected(planted)
    assert got == expected
    assert got[("gpu/1", "Convolution", convs[0])] is None
    assert [k for k, v in got.items() if v is None] == [("gpu/1", "Convolution", convs[0])]


def test_profiler_two_devices_counted_as_one(tmp_path):
    """GPU 1's ops written under GPU 0's process: 4 conv and 4 linear ops a step on one device, no op has a layer
    (what every MXNet x2 op got before the count was per device)."""
    events = _profiler_events(TRACE)
    pids = {e["args"]["name"]: e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    planted = [{**e, "pid": pids["gpu/0"]} if e.get("cat") == "operator" and e.get("pid") == pids["gpu/1"] else e
               for e in events]
    got = _profiler_layers(_write_trace(planted, tmp_path / "trace.json.gz"))
    assert len(got) == 48 and set(got.values()) == {None}


# --- the nsys records ------------------------------------------------------------------------------------------
def _nsys_rows() -> list[dict]:
    with gzip.open(NSYS, "rt", newline="") as f:
        return list(csv.DictReader(f))


def _nsys_expected(rows: list[dict]) -> dict:
    """Each op's device: the one GPU its thread's launches' kernels ran on (the correlation id)."""
    kdev = {r["correlation_id"]: r["device_index"] for r in rows if r["kind"] == "kernel" and r["correlation_id"]}
    tdev = defaultdict(set)
    for r in rows:
        if r["kind"] == "runtime" and r["correlation_id"] in kdev:
            tdev[r["tid"]].add(kdev[r["correlation_id"]])
    assert all(len(d) == 1 for d in tdev.values()) and len(set.union(*tdev.values())) == 2
    steps = sorted((int(r["start_ns"]), int(STEP.match(r["op_name"]).group(1))) for r in rows if r["kind"] == "step")
    ops = [(next(iter(tdev[r["tid"]])), r["op_name"], int(r["start_ns"])) for r in rows
           if r["kind"] == "op" and r["op_name"] in ORDER]
    return _expected(ops, steps)


def _nsys_labelled(rows: list[dict]) -> pd.DataFrame:
    df = pd.DataFrame(rows).replace("", None)
    for c in df.columns:
        df[c] = df[c].astype(schema.DTYPES[c])
    df["event_id"] = range(len(df))
    nsys.label_rows(df, None, "mxnet")
    return df


def _nsys_layers(df: pd.DataFrame, rows: list[dict]) -> dict:
    tdev = _thread_devices(rows)
    ops = df[df["kind"].eq("op") & df["op_name"].isin(list(ORDER))]
    return {(tdev[str(t)], n, int(s)): (None if pd.isna(la) else la)
            for t, n, s, la in zip(ops["tid"], ops["op_name"], ops["start_ns"], ops["layer"].astype(object), strict=True)}


def _thread_devices(rows: list[dict]) -> dict:
    kdev = {r["correlation_id"]: r["device_index"] for r in rows if r["kind"] == "kernel" and r["correlation_id"]}
    return {r["tid"]: kdev[r["correlation_id"]] for r in rows if r["kind"] == "runtime" and r["correlation_id"] in kdev}


def test_nsys_every_op_has_its_layer_per_step_and_device():
    rows = _nsys_rows()
    expected = _nsys_expected(rows)
    assert len(expected) == 48 and None not in expected.values()
    df = _nsys_labelled(rows)
    assert _nsys_layers(df, rows) == expected
    # the kernels launched inside those ops carry their op's layer: the libs pass's link and the math column
    # read them (before the fix: none of these kernels had a layer)
    k = df[df["kind"].eq("kernel") & df["canonical_op"].isin(["conv2d", "linear"])]
    assert len(k) > 0 and k["layer"].notna().all()
    assert set(k["layer"]) == {"conv1", "conv2", "fc1", "fc2"}


@pytest.mark.parametrize("plant", ["one_device", "op_removed"])
def test_nsys_planted(plant):
    """``one_device``: every kernel said to run on GPU 0 (both devices' ops counted as one: no layer, as before the
    fix); ``op_removed``: GPU 1's first Convolution of the last step dropped (its other one: no layer)."""
    rows = _nsys_rows()
    if plant == "one_device":
        planted = [{**r, "device_index": "0"} if r["kind"] == "kernel" else r for r in rows]
        got = _nsys_layers(_nsys_labelled(planted), rows)
        assert len(got) == 48 and set(got.values()) == {None}
        return
    tdev = _thread_devices(rows)
    last = max(int(r["start_ns"]) for r in rows if r["kind"] == "step")
    convs = sorted((int(r["start_ns"]), i) for i, r in enumerate(rows) if r["kind"] == "op"
                   and r["op_name"] == "Convolution" and tdev[r["tid"]] == "1" and int(r["start_ns"]) >= last)
    assert len(convs) == 2
    planted = [r for i, r in enumerate(rows) if i != convs[0][1]]
    got = _nsys_layers(_nsys_labelled(planted), rows)
    assert got == _nsys_expected(planted)
    assert [k for k, v in got.items() if v is None] == [("1", "Convolution", convs[1][0])]
