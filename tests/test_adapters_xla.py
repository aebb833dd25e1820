"""The XLA (jax.profiler) trace adapter on real traces: tests/data/jax_cpu (recorded on this
project's CPU VM, jax 0.10.2) and tests/data/jax_gpu (an H200, jax 0.11.2 + CUDA 13, cuDNN 9.19),
each a trace.json.gz as jax.profiler wrote it and the HLO text of the module
(tests/data/record_jax_fixtures.py). Expected figures are computed here from the raw JSON."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_thunk_completion import completion_ns, stdlib_thunks

from kernelmap import adapters, schema
from kernelmap.adapters import xla_trace
from kernelmap.errors import ParseError

DATA = Path(__file__).parent / "data"
CPU, GPU = DATA / "jax_cpu" / "trace.json.gz", DATA / "jax_gpu" / "trace.json.gz"


def _raw(path: Path):
    ev = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    pname = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"}
    x = [e for e in ev if e.get("ph") == "X"]
    return x, pname


@pytest.fixture(scope="module")
def cpu():
    return adapters.read(CPU)


@pytest.fixture(scope="module")
def gpu():
    return adapters.read(GPU)


def test_detected_and_schema(cpu, gpu):
    assert adapters.detect(CPU) == adapters.detect(GPU) == "xla_trace"
    for df in (cpu, gpu):
        schema.validate(df)
        assert set(df["framework"]) == {"jax"} and set(df["source"]) == {"xla_trace"}
        assert df.attrs["hlo_text"] == ["jit__train_step"]
        assert df.attrs["hlo_ops_unresolved"] == 0  # every traced HLO op is in the companion HLO text
    assert set(cpu["device"]) == {"cpu"} and set(gpu["device"]) == {"gpu"}


def test_cpu_thunks_are_ops_with_the_trace_totals(cpu):
    x, _ = _raw(CPU)
    thunks = [e for e in x if "hlo_op" in e.get("args", {})]
    ops = cpu[cpu["kind"].eq("op")]
    assert len(ops) == len(thunks) > 0
    # each thunk from its start to its completion (tests/test_thunk_completion.py): its traced span where its
    # end: event falls inside it, else past it (18 of the 240 complete asynchronously)
    ev, pairs = stdlib_thunks(CPU)
    assert int(ops["dur_ns"].sum()) == sum(completion_ns(ev, r, m) - r["s"] for v in pairs.values() for r, m in v)
    assert sum(1 for v in pairs.values() for r, m in v if m["s"] > r["e"]) == 18
    assert int(ops["dur_ns"].sum()) > sum(round(e["dur"] * 1000) for e in thunks)
    assert len(cpu) == len(x)
    steps = sorted(int(e["name"].split("#")[1]) for e in x if e["name"].startswith("kernelmap:step#"))
    assert sorted(cpu.loc[cpu["kind"].eq("step"), "iteration"].tolist()) == steps
    per_step = ops.groupby("iteration").size()
    assert per_step.index.tolist() == steps and per_step.nunique() == 1  # the same program each step
    assert ops["canonical_op"].notna().all() and not ops["canonical_op"].eq("other").any()


def test_cpu_directions_and_layers(cpu):
    ops = cpu[cpu["kind"].eq("op")]
    got = set(zip(ops["canonical_op"], ops["direction"], ops["layer"].fillna("-"), strict=True))
    for want in [("conv2d", "fwd", "conv1"), ("conv2d", "fwd", "conv2"), ("conv2d", "bwd_data", "conv2"),
                 ("conv2d", "bwd_weight", "conv1"), ("conv2d", "bwd_weight", "conv2"),
                 ("linear", "fwd", "fc1"), ("linear", "fwd", "fc2"), ("linear", "bwd_weight", "fc1"),
                 ("max_pool2d", "fwd", "-"), ("max_pool2d", "bwd", "-"), ("sgd_update", "update", "-"),
                 ("log_softmax", "fwd", "loss"), ("nll_loss", "bwd", "loss")]:
        assert want in got, want
    # conv1's input needs no gradient: no bwd_data for it (as in PyTorch)
    assert ("conv2d", "bwd_data", "conv1") not in got
    assert set(ops["phase"].dropna()) == {"forward", "backward", "optimizer"}
    multi = ops[ops["op_name"].str.contains("[", regex=False)]
    assert len(multi) and all(c in name for name, c in zip(multi["op_name"], multi["canonical_op"], strict=True))


def test_gpu_kernels_totals_and_attribution(gpu):
    x, pname = _raw(GPU)
    dev = [e for e in x if pname[e["pid"]].startswith("/device:")]
    kern = [e for e in dev if "memcpy_details" not in e["args"] and "Memset_details" not in e["args"]]
    k = gpu[gpu["kind"].eq("kernel")]
    assert len(k) == len(kern) > 0
    assert int(k["dur_ns"].sum()) == sum(round(e["dur"] * 1000) for e in kern)
    assert gpu["kind"].eq("memcpy").sum() + gpu["kind"].eq("memset").sum() == len(dev) - len(kern)
    attributed = k["canonical_op"].notna() & ~k["canonical_op"].eq("other")
    share = k.loc[attributed, "dur_ns"].sum() / k["dur_ns"].sum()
    assert share >= 0.99
    # kernels replayed from CUDA graphs carry hlo_op command_buffer_N: resolved to their instruction
    graph = [e for e in kern if e["args"]["hlo_op"].startswith("command_buffer")]
    assert len(graph) > 0
    assert not k["op_name"].str.startswith("command_buffer").any()
    steps = sorted(int(e["name"].split("#")[1]) for e in x if e["name"].startswith("kernelmap:step#"))
    per_step = k.groupby("iteration").size()
    assert per_step.index.tolist() == steps and per_step.nunique() == 1


def test_gpu_libraries_and_conv_halves(gpu):
    k = gpu[gpu["kind"].eq("kernel")]
    by_op = k.groupby("op_name").agg(canon=("canonical_op", "first"), d=("direction", "first"),
                                     layer=("layer", "first"), lib=("library", "first"))
    assert tuple(by_op.loc["cudnn-conv-bw-input.1"]) == ("conv2d", "bwd_data", "conv2", "cuDNN")
    assert tuple(by_op.loc["cudnn-conv-bw-filter.2"]) == ("conv2d", "bwd_weight", "conv1", "cuDNN")
    assert tuple(by_op.loc["cudnn-conv-bw-filter.3"]) == ("conv2d", "bwd_weight", "conv2", "cuDNN")
    assert tuple(by_op.loc["cudnn-conv-bias-activation.6"]) == ("conv2d", "fwd", "conv1", "cuDNN")
    # the cuBLASLt gemm inside a CUDA graph has no fusion name: placed by the schedule
    gemm = k[k["kernel_name"].str.startswith("sm80_xmma_gemm")]
    assert len(gemm) and set(gemm["op_name"]) == {"custom-call.10"}
    assert set(zip(gemm["canonical_op"], gemm["direction"], gemm["layer"], gemm["library"], strict=True)) == {
        ("linear", "bwd_data", "fc1", "cuBLASLt")}
    cudnn = k[k["library"].eq("cuDNN")]
    assert cudnn["algo"].str.match(r"^eng\d+$").all()
    assert set(k["library"].dropna()) == {"cuDNN", "cuBLASLt", "native"}


def test_without_hlo_text_only_the_paths_in_the_trace(tmp_path):
    shutil.copy(GPU, tmp_path / "trace.json.gz")
    df = adapters.read(tmp_path / "trace.json.gz")
    assert df.attrs["hlo_text"] == []
    k = df[df["kind"].eq("kernel")]
    named = k[k["canonical_op"].notna()]
    assert 0 < len(named) < len(k)  # custom calls carry their path in args.name; fusions do not
    assert set(named["canonical_op"]) <= {"conv2d", "linear", "sgd_update", "reorder"}


def test_classify_path_rules():
    c = xla_trace.classify_path
    assert c("jit(f)/transpose(jvp(CNN))/conv2/reduce_sum") == xla_trace.Label("conv2d", "bwd_bias", "conv2")
    assert c("jit(f)/jvp(CNN)/jit(relu)/max") == xla_trace.Label("relu", "fwd", None)
    assert c("jit(f)/kernelmap:optimizer/mul") == xla_trace.Label("sgd_update", "update", None)
    assert c("jit(f)/jvp(jit(log_softmax))/exp").canonical == "log_softmax"
    assert c("images") is None and c("reduce_sum") is None
    assert c("params['fc1']['kernel']") == xla_trace.Label("reorder", "none", "fc1")


def test_bad_input_raises_parse_error(tmp_path):
    raw = gzip.decompress(GPU.read_bytes())
    cut = tmp_path / "trace.json"
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ParseError) as exc:
        xla_trace.read(cut)
    assert exc.value.path == str(cut)
    doc = json.loads(raw)
    doc["traceEvents"][7] = [1, 2]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ParseError) as exc:
        xla_trace.read(bad)
    assert exc.value.record == 7
    doc = json.loads(raw)
    first = next(i for i, e in enumerate(doc["traceEvents"]) if e.get("ph") == "X")
    doc["traceEvents"][first]["ts"] = "soon"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ParseError, match="ts/dur"):
        xla_trace.read(bad)
    shutil.copy(GPU, tmp_path / "t.json.gz")
    (tmp_path / "jit__train_step.hlo.txt.gz").write_bytes(b"\x1f\x8b not gzip")
    with pytest.raises(ParseError) as exc:
        xla_trace.read(tmp_path / "t.json.gz")
    assert exc.value.path.endswith("jit__train_step.hlo.txt.gz")


def test_iteration_is_the_last_step_started(gpu):
    k = gpu[gpu["kind"].eq("kernel")]
    steps = gpu[gpu["kind"].eq("step")].sort_values("start_ns")
    for _, s in steps.iterrows():
        mine = k[k["iteration"].eq(s["iteration"])]
        assert (mine["start_ns"] >= s["start_ns"]).all()
    assert np.isfinite(k["iteration"].astype(float)).all()


def _hlo_library_calls() -> dict[str, str]:
    """HLO instruction -> custom-call target of the library calls, read from the module text with one regex."""
    import re

    text = gzip.decompress((DATA / "jax_gpu" / "jit__train_step.hlo.txt.gz").read_bytes()).decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r'\s*(?:ROOT )?%([\w.\-]+) = .*custom_call_target="(__cu(?:dnn|blas)\$[^"]*)"', line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def test_gpu_library_kernels_linked_to_the_custom_call_that_launched_them(gpu):
    """Issue 25: XLA names each library call in the HLO (the custom call of the kernel's hlo_op); every
    kernel of such a call is linked to one library_call row per execution, in the trace itself."""
    targets = _hlo_library_calls()
    assert sorted(targets.values()) == ["__cublas$lt$matmul", "__cudnn$convBackwardFilter",
                                        "__cudnn$convBackwardFilter", "__cudnn$convBackwardInput",
                                        "__cudnn$convBiasActivationForward", "__cudnn$convBiasActivationForward"]
    x, pname = _raw(GPU)
    steps = sorted(int(e["name"].split("#")[1]) for e in x if e["name"].startswith("kernelmap:step#"))
    calls = gpu[gpu["kind"].eq("library_call")]
    # one call per library custom call per traced step: 6 x 10
    assert len(calls) == len(targets) * len(steps) == gpu.attrs["library_calls_in_trace"] == 60
    assert calls.groupby("iteration").size().to_dict() == dict.fromkeys(steps, len(targets))
    assert calls.groupby("op_name")["library_call"].first().to_dict() == targets
    # conv1 has no data gradient: the model's structure, per step
    per = calls.groupby(["layer", "direction"]).size().div(len(steps)).to_dict()
    assert per == {("conv1", "fwd"): 1, ("conv1", "bwd_weight"): 1, ("conv2", "fwd"): 1, ("conv2", "bwd_data"): 1,
                   ("conv2", "bwd_weight"): 1, ("fc1", "bwd_data"): 1}
    k = gpu[gpu["kind"].eq("kernel")]
    lib = k[k["library"].isin(["cuDNN", "cuBLASLt"])]
    assert len(lib) == 180 and lib["call_event_id"].notna().all()
    assert k.loc[~k["library"].isin(["cuDNN", "cuBLASLt"]), "call_event_id"].isna().all()
    # each kernel's call is the execution of its own instruction in its own step, and spans it
    by_id = calls.set_index("event_id")
    c = by_id.loc[lib["call_event_id"].astype("int64").to_numpy()]
    assert (c["op_name"].to_numpy() == lib["op_name"].to_numpy()).all()
    assert (c["iteration"].to_numpy() == lib["iteration"].to_numpy()).all()
    assert (lib["library_call"].to_numpy() == c["library_call"].to_numpy()).all()
    assert (c["start_ns"].to_numpy() <= lib["start_ns"].to_numpy()).all()
    assert ((c["start_ns"] + c["dur_ns"]).to_numpy() >= (lib["start_ns"] + lib["dur_ns"]).to_numpy()).all()
    # from the raw trace: the kernels whose hlo_op names a library call, and the one library kernel replayed in
    # a CUDA graph (the cuBLASLt gemm, hlo_op command_buffer_N)
    kern = [e for e in x if pname[e["pid"]].startswith("/device:") and "memcpy_details" not in e["args"]
            and "Memset_details" not in e["args"]]
    own = [e for e in kern if e["args"].get("hlo_op") in targets
           or (e["args"]["hlo_op"].startswith("command_buffer") and e["name"].startswith("sm80_xmma_gemm"))]
    assert len(lib) == len(own)
    assert int(lib["dur_ns"].sum()) == sum(round(e["dur"] * 1000) for e in own)


def test_gpu_in_trace_links_kept_by_the_signature_join_and_summarised(gpu):
    from kernelmap import attribution

    df = gpu.copy()
    before = df["call_event_id"].copy()
    attribution.link_library_calls(df)
    assert df["call_event_id"].equals(before)
    s = attribution.summarise(df)
    assert (s["library_kernels"], s["library_kernels_linked"], s["library_kernel_time_linked_share"]) == (180, 180, 1.0)
    links = s["library_links"]
    assert {lk["link"] for lk in links} == {attribution.LINK_IN_TRACE}
    assert sorted((lk["layer"], lk["direction"], lk["traced_calls_per_step"]) for lk in links) == [
        ("conv1", "bwd_weight", 1.0), ("conv1", "fwd", 1.0), ("conv2", "bwd_data", 1.0), ("conv2", "bwd_weight", 1.0),
        ("conv2", "fwd", 1.0), ("fc1", "bwd_data", 1.0)]
    assert sum(lk["kernels"] for lk in links) == 180


def test_gpu_trace_reads_the_same_under_copy_on_write(gpu):
    """pandas 3 (the GPU machine's) hands out read-only views of a column's values (copy-on-write);
    the adapter wrote into one and failed there ("assignment destination is read-only", an H200 run).
    pandas 2's copy-on-write mode gives the same views: the records read under it equal the default's."""
    with pd.option_context("mode.copy_on_write", True):
        cow = adapters.read(GPU)
    pd.testing.assert_frame_equal(cow, gpu)
