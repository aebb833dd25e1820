"""The custom-op variant in the records and the report, on two real CPU runs (tests/data/cpu_custom_op:
the cmake route, whose op the dispatcher records, and the jit route, whose pybind11 call is wrapped in a
record_function): both land in fc1's linear row, library custom, with record counts equal to a plain
json read of the raw Kineto trace."""

from __future__ import annotations

import collections
import gzip
import json
import shutil
from pathlib import Path

import pytest
from conftest import report
from kernelmap.frameworks.pytorch import custom_op
from kernelmap.reports import analysis as A

from kernelmap import schema
from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data" / "cpu_custom_op"
ROUTES = ("cmake", "jit")


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for route in ROUTES:
        d = tmp_path_factory.mktemp("custom") / route
        shutil.copytree(DATA / route, d)
        normalise_run_dir(d)
        out[route] = d
    return out


def _raw(route: str) -> collections.Counter:
    doc = json.loads(gzip.decompress((DATA / route / "pytorch" / "bs64" / "trace.json.gz").read_bytes()))
    return collections.Counter((e.get("cat"), e.get("name")) for e in doc["traceEvents"] if e.get("ph") == "X")


@pytest.mark.parametrize("route", ROUTES)
def test_manifest_and_results_name_the_route(route):
    m = json.loads((DATA / route / "manifest.json").read_text())
    assert m["config"]["train"]["options"] == {"pytorch": {custom_op.OPTION: route}}
    r = json.loads((DATA / route / "results.json").read_text())
    assert r[0]["passes"]["clean"] and r[0]["framework"] == "pytorch"
    fw = json.loads((DATA / route / "pytorch" / "bs64" / "framework.json").read_text())
    assert fw["versions"]["custom_op"]["route"] == route


@pytest.mark.parametrize("route", ROUTES)
def test_records_count_the_custom_op_as_the_raw_trace(run_dirs, route):
    raw = _raw(route)
    cat, kind = ("cpu_op", "op") if route == "cmake" else ("user_annotation", "annotation")
    df = schema.read_parquet(run_dirs[route] / "records.parquet")
    k = df[df["source"] == "kineto"]
    steps = json.loads((DATA / route / "pytorch" / "bs64" / "framework.json").read_text())["steps"]
    for op, direction in (("bias_add", "fwd"), ("bias_grad", "bwd")):
        name = custom_op.OP_NAMES[op]
        assert raw[(cat, name)] == steps == 6
        rows = k[k["op_name"] == name]
        assert len(rows) == raw[(cat, name)]
        assert set(rows["kind"]) == {kind} and set(rows["library"]) == {"custom"}
        assert set(rows["canonical_op"]) == {"linear"} and set(rows["layer"]) == {"fc1"}
        assert set(rows["direction"]) == {direction}
    assert (k["library"] == "custom").sum() == 2 * steps
    fn = k[k["op_name"] == custom_op.FUNCTION]
    assert len(fn) == raw[("cpu_op", custom_op.FUNCTION)] == steps and set(fn["layer"]) == {"fc1"}


def test_both_routes_land_in_fc1s_row(run_dirs):
    """The layer table: fc1 forward and backward of each route name the custom op and its library
    beside BLAS (the mm), the same rows as the built-in model's fc1."""
    runs = [A.load_run(run_dirs[r]) for r in ROUTES]
    lt = A.layer_table(runs)
    fc1 = lt[lt["layer"] == "fc1"]
    assert len(fc1) == 4  # 2 runs x fwd, bwd
    for _, row in fc1.iterrows():
        assert row["canonical_op"] == "linear" and "custom" in row["libraries"] and "BLAS" in row["libraries"]
        want = custom_op.OP_NAMES["bias_add" if row["direction"] == "fwd" else "bias_grad"]
        assert row["kernels"] == [want]
    others = lt[lt["layer"] != "fc1"]
    assert not any("custom" in libs for libs in others["libraries"])


def test_report_page_shows_the_custom_op(run_dirs, tmp_path):
    out = tmp_path / "rep"
    assert report(str(run_dirs["cmake"]), str(run_dirs["jit"]), "-o", str(out)) == 0
    html = (out / "report.html").read_text()
    assert custom_op.OP_NAMES["bias_add"] in html and custom_op.OP_NAMES["bias_grad"] in html


def test_built_in_run_has_no_custom_op(tmp_path):
    """The built-in model's real CPU run (tests/data/cpu_run_all): no custom library anywhere."""
    d = tmp_path / "cpu_run_all"
    shutil.copytree(Path(__file__).parent / "data" / "cpu_run_all", d)
    normalise_run_dir(d)
    lt = A.layer_table([A.load_run(d)])
    assert not any("custom" in libs for libs in lt["libraries"])
    assert not any(custom_op.NAMESPACE in k for ks in lt["kernels"] for k in ks)


def test_compare_bench_times_fc1_ops_as_the_raw_trace(run_dirs):
    """benches/custom_op_compare.py on the cmake run: the custom ops' time per step is the raw trace's
    sum of their durations / the traced steps (6), read with json alone."""
    from conftest import bench_module

    cmp = bench_module("custom_op_compare")
    t = cmp.fc1_table(run_dirs["cmake"])
    k = t[t["source"] == "kineto"]
    assert set(k["route"]) == {"cmake"} and set(k["level"]) == {"op"}
    doc = json.loads(gzip.decompress((DATA / "cmake" / "pytorch" / "bs64" / "trace.json.gz").read_bytes()))
    for op in ("bias_add", "bias_grad"):
        name = custom_op.OP_NAMES[op]
        raw_us = sum(e["dur"] for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("name") == name)
        row = k[k["name"] == name]
        assert len(row) == 1 and row["library"].iloc[0] == "custom" and row["per_step"].iloc[0] == 1
        assert row["us_per_step"].iloc[0] == pytest.approx(raw_us / 6, rel=1e-6)
    assert "aten::addmm" not in set(k["name"])  # fc1 runs mm + our bias add
    assert "cmake (cmake), kineto, 6 steps:" in cmp.format_table(t)
