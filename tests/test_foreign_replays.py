"""Other people's traces whose steps replay CUDA or HIP graphs (tests/data/foreign/, README.md there), read
without kernelmap's graph-reference file: every replayed kernel, memset and memcpy counted exactly, each
linked to the span that encloses its graph launch, the trace marked as replaying graphs (``graph_replays``);
checked against an independent reading of the raw JSON (stdlib json, numbers as Decimal).

* hta_v100_ddp_cudagraph_step1010: facebookresearch/HolisticTraceAnalysis tests/data/trace_diff/test/test.json.gz
  @ f4d0062c382f42bd8a74838bcdad1916c7d5d2da, ProfilerStep#1010 (torch.compile with CUDA graphs, DDP, V100;
  the whole trace: 12 cudaGraphLaunch, 4464 kernels, 576 memsets and 6 memcpys replayed, was refused whole).
* hta_a100_ddp_cudagraph_step551: same repository, tests/data/negative_queue_length_values_check/rank0.json.gz,
  ProfilerStep#551 (14 small graphs a step, A100).
* tracelens_rocm_vllm_piecewise_hipgraph: AMD-AGI/TraceLens
  tests/traces/inference/vllm_prefilldecode_piecewise/graph_execution.json.gz @ 171dd74721ca1ec45709e5805b68ae1f65e27811
  (vLLM's piecewise graphs on ROCm: 25 hipGraphLaunch, eager kernels between them).
"""

from __future__ import annotations

import decimal
import gzip
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from kernelmap import adapters
from kernelmap.errors import ParseError

DATA = Path(__file__).parent / "data" / "foreign"
LAUNCHES = {"cudaGraphLaunch", "hipGraphLaunch"}
DEVICE = {"kernel": "kernels", "gpu_memset": "memsets", "gpu_memcpy": "memcpys"}
CONTEXT = {"cpu_op", "user_annotation"}  # the host spans that may hold a launch: ops and user annotations
FIXTURES = {  # fixture: (graph launches, replayed kernels, memsets, memcpys) as the stdlib reader counts them
    "hta_v100_ddp_cudagraph_step1010.json.gz": (2, 744, 96, 1),
    "hta_a100_ddp_cudagraph_step551.json.gz": (14, 27, 42, 0),
    "tracelens_rocm_vllm_piecewise_hipgraph.json.gz": (25, 361, 0, 0),
}


def raw(name: str) -> list:
    doc = json.loads(gzip.decompress((DATA / name).read_bytes()), parse_float=decimal.Decimal)
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def ns(v) -> int:
    return int((decimal.Decimal(v) * 1000).to_integral_value(rounding=decimal.ROUND_HALF_EVEN))


def replays(ev: list) -> tuple[list, list]:
    """(the graph launches, the device events that correlate with one), as the raw trace has them."""
    launches = [e for e in ev if e["name"] in LAUNCHES]
    corr = {e["args"]["correlation"] for e in launches}
    return launches, [e for e in ev if e.get("cat") in DEVICE and e["args"].get("correlation") in corr]


def enclosing(ev: list, launch: dict) -> str | None:
    """The name of the innermost op or user annotation (not a ProfilerStep) on the launch's thread that
    holds its start: the latest-starting one, the shorter of two starting together."""
    t = ns(launch["ts"])
    spans = [e for e in ev if e.get("cat") in CONTEXT and not e["name"].startswith("ProfilerStep#")
             and e["pid"] == launch["pid"] and e["tid"] == launch["tid"] and ns(e["ts"]) <= t < ns(e["ts"]) + ns(e["dur"])]
    if not spans:
        return None
    return max(spans, key=lambda e: (ns(e["ts"]), -ns(e["dur"])))["name"]


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_replayed_events_counted_and_linked_to_the_launch_span(name):
    """Every replayed device event is read (count and time per kind exactly the raw trace's), marked in
    ``graph_replays``, and linked (``op_event_id``) to the span enclosing its graph launch."""
    ev = raw(name)
    launches, dev = replays(ev)
    want = FIXTURES[name]
    by_kind = Counter(e["cat"] for e in dev)
    assert (len(launches), by_kind["kernel"], by_kind["gpu_memset"], by_kind["gpu_memcpy"]) == want
    df = adapters.read(DATA / name)
    g = df.attrs["graph_replays"]
    assert (g["launches"], g["kernels"], g["memsets"], g["memcpys"]) == want
    assert g["attributed_by"] == "span enclosing each graph launch"
    span_of = {e["args"]["correlation"]: enclosing(ev, e) for e in launches}
    assert None not in span_of.values()
    rep = df[df["correlation_id"].isin(list(span_of)) & df["kind"].isin(["kernel", "memset", "memcpy"])]
    for kind, cat in (("kernel", "kernel"), ("memset", "gpu_memset"), ("memcpy", "gpu_memcpy")):
        got = rep[rep["kind"] == kind]
        assert len(got) == by_kind[cat]
        assert int(got["dur_ns"].sum()) == sum(ns(e["dur"]) for e in dev if e["cat"] == cat)
    names = df.set_index("event_id")["op_name"]
    linked = [names[i] for i in rep["op_event_id"]]
    assert Counter(linked) == Counter(span_of[e["args"]["correlation"]] for e in dev)
    assert g["linked_to_a_span"] == len(dev)


def test_whole_v100_trace_message_names_kernels_memsets_memcpys(tmp_path):
    """normalise reads a replaying trace (before: exit 2, "5046 kernels were replayed from CUDA graphs ... no
    graph-reference.json.gz"), and says what was replayed with kernels, memsets and memcpys apart, as the
    raw trace counts them; no statement of its output contradicts another (a kernel whose launching op is
    known is never "not launched inside a framework op")."""
    name = "hta_v100_ddp_cudagraph_step1010.json.gz"
    launches, dev = replays(raw(name))
    c = Counter(e["cat"] for e in dev)
    out = tmp_path / "r.parquet"
    r = subprocess.run([sys.executable, "-m", "kernelmap.cli", "normalise", str(DATA / name), "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (f"{c['kernel']} kernels, {c['gpu_memset']} memsets and {c['gpu_memcpy']} memcpy replayed from "
            f"{len(launches)} graph launch(es), attributed by the span enclosing each graph launch") in r.stdout
    assert "not launched inside a framework op" not in r.stdout


def test_hip_graph_launches_are_graph_replays():
    """hipGraphLaunch is a graph launch as cudaGraphLaunch is (before: its replays read as kernels of an
    ordinary launch, not marked); the trace's eager kernels are not counted as replayed."""
    name = "tracelens_rocm_vllm_piecewise_hipgraph.json.gz"
    ev = raw(name)
    launches, dev = replays(ev)
    assert {e["name"] for e in launches} == {"hipGraphLaunch"}
    eager = [e for e in ev if e.get("cat") == "kernel"]
    assert len(eager) > len(dev)
    df = adapters.read(DATA / name)
    assert df.attrs["graph_replays"]["kernels"] == len(dev)
    assert (df["kind"] == "kernel").sum() == len(eager)


def test_own_run_without_reference_is_still_refused(tmp_path):
    """kernelmap's own runs keep their behaviour: a trace with the worker's ``kernelmap:step#N`` steps that
    replays graphs needs its graph-reference.json.gz; the refusal names kernels, memsets and memcpys apart."""
    name = "hta_a100_ddp_cudagraph_step551.json.gz"
    doc = json.loads(gzip.decompress((DATA / name).read_bytes()))
    for e in doc["traceEvents"]:
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            e["name"] = "kernelmap:step#" + e["name"].split("#")[1]
    f = tmp_path / "trace.json.gz"
    f.write_bytes(gzip.compress(json.dumps(doc).encode()))
    with pytest.raises(ParseError, match=r"27 kernels, 42 memsets and 0 memcpys were replayed .*graph-reference"):
        adapters.read(f)


def test_replay_rows_found_on_records():
    """The replays of a records table: graph_replay.replayed_rows finds the same rows the attribute counts."""
    from kernelmap.adapters import graph_replay

    df = adapters.read(DATA / "hta_v100_ddp_cudagraph_step1010.json.gz")
    rows, launches = graph_replay.replayed_rows(df)
    assert len(rows) == sum(FIXTURES["hta_v100_ddp_cudagraph_step1010.json.gz"][1:])
    assert len(pd.unique(launches)) == 2


def test_report_marks_replayed_kernels_under_their_launch_span():
    """``kernelmap report`` on the V100 trace: the kernels replayed from its graphs are listed under the span
    around each launch (CompiledFunction, CompiledFunctionBackward) marked as a graph replay, per step as
    many kernels as the raw trace replays under each (before: under "(no launching op)", unmarked)."""
    from kernelmap.reports import foreign

    name = "hta_v100_ddp_cudagraph_step1010.json.gz"
    ev = raw(name)
    launches, dev = replays(ev)
    span_of = {e["args"]["correlation"]: enclosing(ev, e) for e in launches}
    want = Counter(span_of[e["args"]["correlation"]] + foreign.REPLAY_MARK for e in dev if e["cat"] == "kernel")
    by_op = foreign.analyse(foreign.read_all([DATA / name]))["by_op"]
    marked = by_op[by_op["launcher"].str.endswith(foreign.REPLAY_MARK)]
    assert dict(marked.groupby("launcher")["kernels_per_step"].sum()) == {k: float(v) for k, v in want.items()}
