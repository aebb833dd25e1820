"""Kernels replayed from a CUDA graph (adapters/graph_replay.py), attributed from the eager reference step.

Without a GPU here, the replay traces are made from a real eager PyTorch GPU trace
(tests/data/gpu_kineto.json.gz, 5 profiled steps): each replayed step keeps its own kernels and
memsets (names, times, streams) but they correlate with one ``cudaGraphLaunch`` in place of their ops
and launches, as in a graph replay; the reference file is one eager step of the same trace. What each
replayed kernel must get is what the eager trace itself says for it (the adapter's eager path).
``test_real_graph_replay_capture`` and the tests after it read real captures (an H200, torch 2.11+cu130),
trimmed to 3 steps by tests/data/gpu_cuda_graph/trim.py, whose stdlib reader wrote their expected.json
(fp16/: fp16 with GradScaler inside the graph, its 4-byte copies replayed as kernels "memcpy32_post")."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from kernelmap.frameworks.case import CaseKey

from kernelmap.adapters import kineto
from kernelmap.errors import ParseError
from kernelmap.rundir import GRAPH_REFERENCE, RUN_VERSION, case_dir

DATA = Path(__file__).parent / "data"
EAGER = DATA / "gpu_kineto.json.gz"
# the trimmed framework passes of PyTorch's cuda-graph mode, bs 64 (here) and bs 1024 (bs1024/): trace.json.gz,
# graph-reference.json.gz, expected.json (trim.py beside them made them from the run directory)
GRAPH_FIXTURE = DATA / "gpu_cuda_graph"
HOST = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
DEVICE = ("kernel", "gpu_memset", "gpu_memcpy")
LABELS = ["canonical_op", "direction", "layer", "phase"]


def typed_run(run, *batch_sizes: int) -> None:
    """The run's manifest and results.json as the runner writes them (typed case keys, run_version 2) for
    pytorch-cuda-graph at ``batch_sizes``: what ``normalise_run_dir`` reads the cases from."""
    keys = [CaseKey("pytorch", "cuda-graph", "fp32", 1, bs) for bs in batch_sizes]
    (run / "manifest.json").write_text(json.dumps({"run_version": RUN_VERSION}))
    (run / "results.json").write_text(json.dumps([{**k.to_fields(), "dir": str(case_dir(k))} for k in keys]))


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


def _old_device_name(df, rows):
    """graph_replay._device_name before the memset-node fix: a device row by its kernel name, as Kineto writes it."""
    kn = df["kernel_name"].to_numpy(dtype=object)[rows]
    on = df["op_name"].to_numpy(dtype=object)[rows]
    return [str(k) if isinstance(k, str) else str(o) for k, o in zip(kn, on, strict=True)]


def _check_real_capture(fx: Path, unlabelled: int = 0) -> pd.DataFrame:
    """A real capture (tests/data/gpu_cuda_graph/trim.py: the first steps of a framework pass of PyTorch's
    cuda-graph mode on an H200, torch 2.11+cu130) against its expected.json, written by trim.py's own
    stdlib reader (the device events correlating with cudaGraphLaunch: their count and summed duration;
    the launches whose events, in start order, are the reference step's in start order). Each replayed
    event's twin is the reference step's event at its position in its launch (the stdlib reader found
    every launch in the reference's order): it must carry that twin's labels as the eager reference
    read by kineto.read gives them; ``unlabelled`` kernels a launch have no canonical op, as their twins.
    Returns the replayed rows."""
    from kernelmap.adapters import graph_replay
    from kernelmap.adapters._trace import DEVICE_KINDS

    expected = json.loads((fx / "expected.json").read_text())
    df = kineto.read(fx / "trace.json.gz")
    rows, launches = graph_replay.replayed_rows(df)
    rep = df.iloc[rows]
    assert len(np.unique(launches)) == expected["graph_launches"]
    assert len(rep) == expected["replayed_device_events"]
    assert int(rep["dur_ns"].sum()) == expected["replayed_device_ns"]
    kern = rep[rep["kind"] == "kernel"]
    assert len(kern) == expected["replayed_kernels"]
    assert kern["canonical_op"].isna().sum() == unlabelled * expected["graph_launches"]
    assert not (kern["canonical_op"] == "other").any()
    assert rep["canonical_op"].isna().sum() == rep["direction"].isna().sum() == unlabelled * expected["graph_launches"]
    # the twin of each replayed event: the reference step's event at its position
    ref = kineto.read(fx / GRAPH_REFERENCE)
    rdev = ref[ref["kind"].isin(list(DEVICE_KINDS))].sort_values("start_ns", kind="stable")
    assert len(rdev) == expected["reference_device_events"]
    assert expected["launches_in_reference_order"] == expected["graph_launches"]
    for corr in np.unique(launches):
        got = rep[launches == corr].sort_values("start_ns", kind="stable")
        assert len(got) == len(rdev)
        kern_rows = (got["kind"] == "kernel").to_numpy()
        memset_node = kern_rows & got["kernel_name"].str.fullmatch(r"memset(8|16|32|64)?").to_numpy()
        memcpy_node = kern_rows & got["kernel_name"].str.fullmatch(r"memcpy(8|16|32|64|128)(_post)?").to_numpy()
        node = memset_node | memcpy_node
        kinds = np.where(memset_node, "memset", np.where(memcpy_node, "memcpy", got["kind"].to_numpy(dtype=object)))
        assert kinds.tolist() == rdev["kind"].astype(object).tolist()
        assert got["kernel_name"][~node].tolist() == rdev["kernel_name"][~node].tolist()
        for col in ("canonical_op", "direction", "layer", "phase", "library"):
            assert got[col].astype(object).tolist() == rdev[col].astype(object).tolist(), (col, corr)
    # the iteration: the steps kept, whose cudaGraphLaunch they replay
    steps = sorted(int(s.rsplit("#", 1)[1]) for s in expected["source"]["steps_kept"])
    assert sorted(rep["iteration"].unique().tolist()) == steps
    return rep


@pytest.mark.skipif(not (GRAPH_FIXTURE / "trace.json.gz").is_file(),
                    reason="the real cuda-graph capture (the GPU job's run) is not in tests/data yet")
def test_real_graph_replay_capture():
    """bs 64: 3 replayed steps of 47 device events (44 kernels, 3 memsets), all attributed."""
    rep = _check_real_capture(GRAPH_FIXTURE)
    assert len(rep) == 3 * 47 and (rep["kind"] == "kernel").sum() == 3 * 44


@pytest.mark.skipif(not (GRAPH_FIXTURE / "bs1024" / "trace.json.gz").is_file(), reason="no bs 1024 capture")
def test_real_graph_replay_with_a_memset_node(monkeypatch):
    """bs 1024: one memset of each step (conv2's weight gradient) is replayed as a kernel "memset32" where the
    eager reference step has a gpu_memset "Memset (Device)" (53 device events a step: 45 kernels and 8
    memsets eagerly, 46 kernels and 7 memsets replayed). Every replayed event, the memset node included, takes
    its twin's labels; matching by the kernel name alone (before the fix) fails on it."""
    fx = GRAPH_FIXTURE / "bs1024"
    expected = json.loads((fx / "expected.json").read_text())
    assert expected["replayed_memset_nodes"] == expected["graph_launches"] == 3
    assert expected["reference_memsets"] == 8 and expected["reference_memset_kernels"] == 0
    rep = _check_real_capture(fx)
    node = rep[(rep["kind"] == "kernel") & (rep["kernel_name"] == "memset32")]
    assert len(node) == expected["replayed_memset_nodes"]
    assert set(zip(node["canonical_op"], node["direction"], node["layer"], strict=True)) == {("conv2d", "bwd", "conv2")}
    ref = kineto.read(fx / GRAPH_REFERENCE)
    assert not (ref["kernel_name"] == "memset32").any()
    assert (ref["kind"] == "memset").sum() == 8 and set(ref.loc[ref["kind"] == "memset", "kernel_name"]) == {"Memset (Device)"}
    # the name matching of before: the memset node is "not in the reference", a reference memset is missing
    from kernelmap.adapters import graph_replay

    monkeypatch.setattr(graph_replay, "_device_name", _old_device_name)
    with pytest.raises(ParseError, match=r"not in the reference \[\('memset32', 1\)\]"):
        kineto.read(fx / "trace.json.gz")


@pytest.mark.skipif(not (GRAPH_FIXTURE / "bs1024" / "trace.json.gz").is_file(), reason="no bs 1024 capture")
def test_real_capture_normalises(tmp_path):
    """Both real captures as a run directory's pytorch-cuda-graph/bs{64,1024}: normalised, each reference
    listed under not_records, the replayed device time in the records as the stdlib reader summed it."""
    import shutil

    from kernelmap.normalise import normalise_run_dir
    from kernelmap.schema import read_parquet

    total = 0
    for bs, fx in ((64, GRAPH_FIXTURE), (1024, GRAPH_FIXTURE / "bs1024")):
        case = tmp_path / "pytorch-cuda-graph" / f"bs{bs}"
        case.mkdir(parents=True)
        for f in ("trace.json.gz", GRAPH_REFERENCE):
            shutil.copyfile(fx / f, case / f)
        total += json.loads((fx / "expected.json").read_text())["replayed_device_ns"]
    typed_run(tmp_path, 64, 1024)
    summary = normalise_run_dir(tmp_path)
    assert sorted(n["file"] for n in summary["not_records"]) == [
        f"pytorch-cuda-graph/bs1024/{GRAPH_REFERENCE}", f"pytorch-cuda-graph/bs64/{GRAPH_REFERENCE}"]
    rec = read_parquet(tmp_path / "records.parquet")
    assert set(zip(rec["framework"], rec["mode"], rec["batch_size"], strict=True)) == {
        ("pytorch", "cuda-graph", 64), ("pytorch", "cuda-graph", 1024)}
    dev = rec[rec["kind"].isin(["kernel", "memset"])]  # the memcpys run eagerly, outside the graphs
    assert int(dev["dur_ns"].sum()) == total
    assert dev["canonical_op"].notna().all() and not (dev["canonical_op"] == "other").any()


def test_normalise_keys_the_mode_and_reads_the_reference_once(tmp_path):
    """A run directory's pytorch-cuda-graph/bs64 folder: its records are keyed pytorch-cuda-graph, the
    reference file is read with the trace (listed under not_records), never as records of its own."""
    from kernelmap.normalise import normalise_run_dir
    from kernelmap.schema import read_parquet

    case = tmp_path / "pytorch-cuda-graph" / "bs64"
    case.mkdir(parents=True)
    _, _, replayed = make_replay(case)
    typed_run(tmp_path, 64)
    summary = normalise_run_dir(tmp_path)
    assert [n["file"] for n in summary["not_records"]] == [f"pytorch-cuda-graph/bs64/{GRAPH_REFERENCE}"]
    rec = read_parquet(tmp_path / "records.parquet")
    assert set(zip(rec["framework"], rec["mode"], rec["math"], rec["devices"], strict=True)) == {
        ("pytorch", "cuda-graph", "fp32", 1)}
    assert rec["kind"].isin(["kernel", "memset", "memcpy"]).sum() == len(replayed)


# fp16 (GradScaler inside the graph), bs 64 and bs 1024: each step copies two 4-byte values (the reference's
# gpu_memcpy "Memcpy DtoD") that the graph replays as kernels "memcpy32_post", and copies its input batch
# eagerly (outside the graph: other sizes)
FP16 = [GRAPH_FIXTURE / "fp16" / f"bs{bs}" for bs in (64, 1024)]


@pytest.mark.parametrize("fx", FP16, ids=["bs64", "bs1024"])
def test_real_fp16_capture_with_memcpy_nodes(fx, monkeypatch):
    """Every replayed event of the fp16 captures takes its twin's labels (``_check_real_capture``); the
    memcpy nodes those of the reference step's two copies. Without memcpy nodes (before the fix) the
    real trace is an error: its two "memcpy32_post" a step are not in the reference."""
    from kernelmap.adapters import graph_replay

    expected = json.loads((fx / "expected.json").read_text())
    assert expected["replayed_memcpy_nodes"] == 2 * expected["graph_launches"] == 6
    assert expected["reference_memcpys"] == 2 and expected["reference_memcpy_bytes"] == [4, 4]
    assert 4 not in expected["eager_memcpy_bytes"] and expected["eager_memcpys"] == 6
    rep = _check_real_capture(fx)
    # GradScaler's two kernels a step: its ops' canonical op (the vocabulary's loss_scale), replayed as captured
    scale = rep.loc[rep["canonical_op"] == "loss_scale"]
    assert scale["kernel_name"].astype(str).str.contains("amp_update_scale_cuda_kernel").sum() == 3
    assert scale["kernel_name"].astype(str).str.contains("_amp_foreach_non_finite_check_and_unscale_").sum() == 3
    assert len(scale) == 6 and set(scale["direction"]) == {"update"} and set(scale["phase"]) == {"optimizer"}
    node = rep[(rep["kind"] == "kernel") & (rep["kernel_name"] == "memcpy32_post")]
    assert len(node) == expected["replayed_memcpy_nodes"]
    ref = kineto.read(fx / GRAPH_REFERENCE)
    twins = ref[ref["kind"] == "memcpy"]
    assert len(twins) == 2
    labels = ["canonical_op", "direction", "phase"]
    assert set(map(tuple, node[labels].astype(object).to_numpy())) == set(map(tuple, twins[labels].astype(object).to_numpy()))
    assert node["canonical_op"].notna().all()
    monkeypatch.setattr(graph_replay, "NODE_KINDS", graph_replay.NODE_KINDS[:1])  # memset nodes only
    with pytest.raises(ParseError, match=r"not in the reference \[\('memcpy32_post', 2\)\]"):
        kineto.read(fx / "trace.json.gz")


def _edited_fp16(tmp_path, edit) -> Path:
    """The bs 64 fp16 capture with ``edit(events of the first launch's memcpy nodes, all events)`` applied."""
    import shutil

    fx = FP16[0]
    doc = json.loads(gzip.open(fx / "trace.json.gz").read())
    ev = doc["traceEvents"]
    first = min(e["args"]["correlation"] for e in ev if e.get("name") == "cudaGraphLaunch")
    nodes = [e for e in ev if e.get("cat") == "kernel" and e["name"] == "memcpy32_post"
             and e["args"]["correlation"] == first]
    assert len(nodes) == 2
    ev = edit(nodes, ev)
    _write(tmp_path / "trace.json.gz", doc, ev)
    shutil.copyfile(fx / GRAPH_REFERENCE, tmp_path / GRAPH_REFERENCE)
    return tmp_path / "trace.json.gz"


def test_a_copy_missing_from_the_graph_is_an_error(tmp_path, monkeypatch):
    """A step whose graph lacks one of the reference step's 4-byte copies: an error, though the step copies
    its input batch eagerly (memcpys of 200704 and 512 bytes), which by name alone stood for it."""
    from kernelmap.adapters import graph_replay

    path = _edited_fp16(tmp_path, lambda nodes, ev: [e for e in ev if e is not nodes[0]])
    with pytest.raises(ParseError, match=r"step 5: .*neither replayed nor run eagerly \[\('memcpy of 4 bytes', 1\)\]"):
        kineto.read(path)
    monkeypatch.setattr(graph_replay, "_sized_names", graph_replay._device_name)  # by name alone: no error
    assert len(kineto.read(path))


def test_a_copy_replayed_as_two_kernels_is_an_error(tmp_path):
    """A copy replayed as a body and its tail (a larger copy: pytorch/pytorch#191284) counts as two: one copy
    more than the reference step has, an error naming it, never a guess at which pieces belong together."""
    def body(nodes, ev):
        extra = {**nodes[0], "name": "memcpy128", "ts": nodes[0]["ts"] - 0.5, "dur": 0.4}
        return [*ev, extra]

    with pytest.raises(ParseError, match=r"step 5: .* \(a graph's memset and memcpy nodes as such: 78 kernels, "
                                         r"2 memsets and 3 memcpys\).*not in the reference \[\('memcpy', 1\)\]"):
        kineto.read(_edited_fp16(tmp_path, body))


def test_real_fp16_captures_normalise(tmp_path):
    """Both fp16 captures as a run directory's pytorch-cuda-graph-fp16/bs{64,1024}: normalised, every replayed
    device row attributed, the replayed device time in the records as the stdlib reader summed it."""
    import shutil

    from kernelmap.normalise import normalise_run_dir
    from kernelmap.schema import read_parquet

    keys = [CaseKey("pytorch", "cuda-graph", "fp16", 1, bs) for bs in (64, 1024)]
    total = 0
    for key, fx in zip(keys, FP16, strict=True):
        case = tmp_path / case_dir(key)
        case.mkdir(parents=True)
        for f in ("trace.json.gz", GRAPH_REFERENCE):
            shutil.copyfile(fx / f, case / f)
        total += json.loads((fx / "expected.json").read_text())["replayed_device_ns"]
    (tmp_path / "manifest.json").write_text(json.dumps({"run_version": RUN_VERSION}))
    (tmp_path / "results.json").write_text(json.dumps([{**k.to_fields(), "dir": str(case_dir(k))} for k in keys]))
    normalise_run_dir(tmp_path)
    rec = read_parquet(tmp_path / "records.parquet")
    rep = rec[rec["kind"].isin(["kernel", "memset"])]  # the memcpys left run eagerly: the input batch's copies
    assert int(rep["dur_ns"].sum()) == total
    assert not (rep["canonical_op"] == "other").any()
    # every replayed event has its op: GradScaler's two kernels a step are loss_scale's
    assert rep["canonical_op"].notna().all() and (rep["canonical_op"] == "loss_scale").sum() == 2 * 6
    node = rep[rep["kernel_name"] == "memcpy32_post"]
    assert len(node) == 12 and set(node["phase"]) == {"optimizer"}
