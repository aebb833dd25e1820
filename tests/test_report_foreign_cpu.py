"""``kernelmap report`` on CPU traces that are not a kernelmap run (reports/foreign.py's CPU tables): a
torchvision resnet18 recorded here (tests/data/foreign_cpu/record.py) and a real outside CPU trace
(HolisticTraceAnalysis' tests/data/rank_non_gpu), against an independent reading of the raw trace
(stdlib json, Decimal microseconds)."""

from __future__ import annotations

import decimal
import gzip
import json
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest
from conftest import report
from kernelmap.reports import foreign

DATA = Path(__file__).parent / "data" / "foreign_cpu"
RESNET = "resnet18_cpu_kineto.json.gz"
HTA = "hta_rank_non_gpu.json.gz"
# PyTorch's ops that enter oneDNN and BLAS on the CPU, written out here rather than read from the registry
ENTRY = {"aten::mkldnn_convolution": "oneDNN", "aten::convolution_backward": "oneDNN",
         "aten::mkldnn_linear": "oneDNN", "aten::mkldnn_max_pool2d": "oneDNN", "aten::addmm": "BLAS",
         "aten::mm": "BLAS"}


def _ns(v) -> int:
    return int((decimal.Decimal(v) * 1000).to_integral_value(rounding=decimal.ROUND_HALF_EVEN))


def independent(name: str) -> dict:
    """Steps, and per op name / outermost op / library: calls and nanoseconds summed over the steps,
    from the raw JSON: an op is a step's where it starts inside the step's span; self time = its
    duration less its direct children's on its thread; its library that of the nearest enclosing
    entry op (itself included)."""
    doc = json.loads(gzip.decompress((DATA / name).read_bytes()), parse_float=decimal.Decimal)
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps = [(int(e["name"].split("#")[1]), _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]))
             for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    ops = [(e["pid"], e["tid"], _ns(e["ts"]), _ns(e["dur"]), e["name"]) for e in ev if e.get("cat") == "cpu_op"]
    inside, outside = [], 0
    for o in ops:
        it = [n for n, s, e in steps if s <= o[2] < e]
        if it:
            inside.append((*o, it[0]))
        else:
            outside += 1
    self_ns, lib, top = defaultdict(int), {}, {}
    by_thread = defaultdict(list)
    for i, o in enumerate(inside):
        by_thread[(o[0], o[1])].append(i)
    for idx in by_thread.values():
        stack = []
        for i in sorted(idx, key=lambda i: (inside[i][2], -inside[i][3])):
            s, d, name = inside[i][2], inside[i][3], inside[i][4]
            while stack and inside[stack[-1]][2] + inside[stack[-1]][3] <= s:
                stack.pop()
            self_ns[i] += d
            if stack:
                p = stack[-1]
                self_ns[p] -= min(s + d, inside[p][2] + inside[p][3]) - s
            lib[i] = ENTRY.get(name) or (lib[stack[-1]] if stack else "native")
            top[i] = not stack
            stack.append(i)
    out = {"steps": sorted(n for n, *_ in steps if any(o[5] == n for o in inside)), "outside": outside,
           "ops": len(inside), "by_op": defaultdict(lambda: [0, 0]), "top": defaultdict(lambda: [0, 0]),
           "library": defaultdict(lambda: [0, 0])}
    for i, o in enumerate(inside):
        for key, table, v in ((o[4], "by_op", self_ns[i]), (lib[i], "library", self_ns[i])):
            out[table][key][0] += 1
            out[table][key][1] += v
        if top[i]:
            out["top"][o[4]][0] += 1
            out["top"][o[4]][1] += o[3]
    return out


@pytest.fixture(scope="module", params=[RESNET, HTA])
def case(request):
    return request.param, foreign.analyse(foreign.read_all([DATA / request.param])), independent(request.param)


def test_the_fixtures_are_what_they_say(case):
    name, _, want = case
    assert {RESNET: (want["steps"], want["ops"], want["outside"]),
            HTA: (want["steps"], want["ops"], want["outside"])}[name] == {
        RESNET: ([2, 3, 4], 4020, 0), HTA: ([1009], 2416, 8)}[name]


def test_cpu_steps_and_overview_match_the_independent_count(case):
    name, t, want = case
    ov = t["overview"].iloc[0]
    assert (ov["steps"], ov["kernels"], ov["ops_without_step"]) == (len(want["steps"]), 0, want["outside"])
    st = t["cpu_steps"]
    assert list(st["iteration"]) == want["steps"]
    assert int(st["ops"].sum()) == want["ops"]
    n = len(want["steps"])
    # the ops' self times add up to the op time of the steps (nothing counted twice, nothing dropped)
    assert st["op_self_ms"].sum() / n == pytest.approx(sum(v for _, v in want["by_op"].values()) / n / 1e6, rel=1e-12)


@pytest.mark.parametrize("table,key,col", [("cpu_by_op", "op_name", "by_op"), ("cpu_top_ops", "op_name", "top"),
                                           ("cpu_library_mix", "library", "library")])
def test_per_op_time_and_library_mix_match_the_independent_count(case, table, key, col):
    name, t, want = case
    n = len(want["steps"])
    got = t[table].groupby(key)[["calls_per_step", "ms_per_step"]].sum()
    assert set(got.index) == set(want[col])
    for k, (calls, ns_) in want[col].items():
        assert got.loc[k, "calls_per_step"] == pytest.approx(calls / n, rel=1e-12), k
        assert got.loc[k, "ms_per_step"] == pytest.approx(ns_ / n / 1e6, rel=1e-12, abs=1e-12), k


def test_library_mix_names_what_each_trace_ran(case):
    name, t, _ = case
    mix = t["cpu_library_mix"].set_index("library")
    # resnet18's convolutions run oneDNN, its fc BLAS; the outside rank's linears BLAS (no convolution)
    assert set(mix.index) == {RESNET: {"oneDNN", "BLAS", "native"}, HTA: {"BLAS", "native"}}[name]
    assert mix["share"].sum() == pytest.approx(1.0)


@pytest.mark.parametrize("name", [RESNET, HTA])
def test_the_page_has_per_op_time_and_library_mix(name, tmp_path):
    out = tmp_path / "page"
    assert report(str(DATA / name), "-o", str(out)) == 0
    page = (out / "report.html").read_text()
    for title in ("Per step: CPU ops", "CPU time by op (self)", "CPU time by outermost op", "CPU library mix"):
        assert f"<h2>{title}</h2>" in page
    mix = pd.read_csv(out / "tables" / "cpu_library_mix.csv")
    assert "native" in set(mix["library"]) and "nothing per step" not in page


def test_a_trace_with_ops_outside_every_step_says_so(tmp_path):
    """The same ops without their ProfilerStep spans: no table to draw, and the page says why (not an empty page)."""
    doc = json.loads(gzip.decompress((DATA / HTA).read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    f = tmp_path / "nosteps.json"
    f.write_text(json.dumps(doc))
    out = tmp_path / "page"
    assert report(str(f), "-o", str(out)) == 0
    assert "nosteps.json: nothing per step: 0 kernels and 2424 ops, none of them inside a step" in (
        out / "report.html").read_text()
