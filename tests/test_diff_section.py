"""The report's differences section (reports/diffsection.py, issue 40): pairs of a run's cases that differ in one
dimension, each ``kernelmap diff``'s table, its conservation a self-check.

GPU: the real H200 runs tests/data/gpu_modes_run (7 cases at bs 64: PyTorch's four modes, MXNet's two, JAX) and
tests/data/gpu_mxnet_fp16_run (MXNet imperative and hybridized, fp32 and fp16, bs 1024); each side's 100% is
taken independently from pyarrow's own rows of records.parquet. The report: tests/data/gpu_replay_modes_run (one
pair). CPU: tests/data/cpu_run_all normalised on a copy, its PyTorch side's op time from the trace's JSON (stdlib).
Planted: a row dropped from a real pair, a side's total altered, records whose durations are not whole ns (the
diff cannot conserve them): each fails the check, and the report still writes, naming it."""

from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from kernelmap.frameworks.case import Case
from kernelmap.reports import cli as report_cli
from kernelmap.reports import diffsection as DS
from kernelmap.reports.analyses.base import load_run
from kernelmap.reports.checkrows import Check
from test_diff import normalised_copy, outermost_cpu_op_ns, pyarrow_total

from kernelmap.cli import main

DATA = Path(__file__).parent / "data"
CHECK = str(Check.DIFF_CONSERVED)


def pyarrow_ns(run: Path, framework: str, mode: str, math: str, bs: int, source: str) -> tuple[int, int]:
    """(ns, kernels) of one case's kernels of one source, from pyarrow's own rows."""
    cols = ["framework", "mode", "math", "batch_size", "source", "kind", "dur_ns"]
    rows = pq.read_table(run / "records.parquet", columns=cols).to_pylist()
    mine = [r["dur_ns"] for r in rows if (r["framework"], r["mode"], r["math"], r["batch_size"], r["source"], r["kind"])
            == (framework, mode, math, bs, source, "kernel") and r["dur_ns"] is not None]
    return sum(mine), len(mine)


@pytest.fixture(scope="module")
def modes():
    found = DS.pairs([load_run(DATA / "gpu_modes_run")])
    return found, DS.table(found)


def test_pairs_of_every_mode_and_framework(modes):
    found, t = modes
    # PyTorch's 4 modes: 6 pairs; MXNet's 2: 1; the 3 frameworks at their default modes: 3; nothing else differs in one
    assert [(r["differs_in"], r["a"], r["b"]) for _, r in t.iterrows()] == [
        ("mode", "pytorch", "pytorch-cuda-graph"), ("mode", "pytorch", "pytorch-compile"),
        ("mode", "pytorch", "pytorch-compile-graphs"), ("framework", "pytorch", "mxnet"),
        ("framework", "pytorch", "jax"), ("mode", "pytorch-cuda-graph", "pytorch-compile"),
        ("mode", "pytorch-cuda-graph", "pytorch-compile-graphs"), ("mode", "pytorch-compile", "pytorch-compile-graphs"),
        ("mode", "mxnet", "mxnet-hybridized"), ("framework", "mxnet", "jax")]
    assert set(t["batch_size"]) == {64} and not t["problem"].any() and t["conserved"].all()


def test_each_side_holds_its_source_s_kernels_as_pyarrow_sums_them(modes):
    found, t = modes
    run = DATA / "gpu_modes_run"
    totals = {}
    for p in found:
        for side in (p.a, p.b):
            e = side.entry
            totals[e["case"]] = (side.source, pyarrow_ns(run, e["framework"], e["mode"], e["math"], 64, side.source))
    # each framework's own trace where it holds kernels (MXNet's profiler does not: nsys)
    assert {c: s for c, (s, _) in totals.items()} == {
        "pytorch": "kineto", "pytorch-cuda-graph": "kineto", "pytorch-compile": "kineto",
        "pytorch-compile-graphs": "kineto", "mxnet": "nsys", "mxnet-hybridized": "nsys", "jax": "xla_trace"}
    assert {c: n for c, (_, (_, n)) in totals.items()} == {
        "pytorch": 880, "pytorch-cuda-graph": 880, "pytorch-compile": 760, "pytorch-compile-graphs": 740,
        "mxnet": 1020, "mxnet-hybridized": 1020, "jax": 1180}
    for _, r in t.iterrows():
        a_ns, b_ns = totals[r["a"]][1][0], totals[r["b"]][1][0]
        assert (r["a_total_ns"], r["b_total_ns"]) == (r["a_rows_ns"], r["b_rows_ns"]) == (a_ns, b_ns)
        assert r["a_ms"] == pytest.approx(a_ns / 20 / 1e6) and r["b_ms"] == pytest.approx(b_ns / 20 / 1e6)
    # the docs' example: the cuda-graph replays run eager's kernels, 36 rows the same
    eager_graph = t.iloc[0]
    assert (eager_graph["rows"], eager_graph["same"], eager_graph["appeared"], eager_graph["disappeared"],
            eager_graph["algorithm_changed"], eager_graph["verdict"]) == (36, 36, 0, 0, 0, "within noise")
    checks = pd.DataFrame(DS.check_rows(found))
    assert len(checks) == 10 and set(checks["status"]) == {"pass"} and set(checks["check"]) == {CHECK}


def test_top_places_are_the_largest_changes_with_the_saving(modes):
    found, t = modes
    p = found[2]  # eager -> compile-graphs
    places = p.places[p.places["where"] != "(outside the counted steps)"]
    biggest = places.loc[places["change_ms"].abs().sort_values(ascending=False).index[:3]]
    top = DS.top_places(p.places)
    assert [x["place"] for x in top] == [f"{w} {d}" for w, d in zip(biggest["where"], biggest["direction"], strict=True)]
    assert [x["saving_ms"] for x in top] == [-c for c in biggest["change_ms"]]
    assert top[0]["place"] == "sgd_update update" and top[0]["saving_ms"] > 0.04  # one fused kernel where eager ran three


def test_math_pairs(tmp_path):
    t = DS.table(DS.pairs([load_run(DATA / "gpu_mxnet_fp16_run")]))
    assert [(r["differs_in"], r["a"], r["b"]) for _, r in t.iterrows()] == [
        ("math", "mxnet", "mxnet-fp16"), ("mode", "mxnet", "mxnet-hybridized"),
        ("mode", "mxnet-fp16", "mxnet-hybridized-fp16"), ("math", "mxnet-hybridized", "mxnet-hybridized-fp16")]
    run = DATA / "gpu_mxnet_fp16_run"
    assert t.iloc[0]["b_total_ns"] == pyarrow_ns(run, "mxnet", "imperative", "fp16", 1024, "nsys")[0]


@pytest.mark.parametrize(("x", "y", "axis"), [
    (Case("pytorch", "eager"), Case("pytorch", "eager", devices=2), DS.Axis.DEVICES),
    (Case("pytorch", "eager"), Case("pytorch", "eager", "bf16"), DS.Axis.MATH),
    (Case("pytorch", "eager"), Case("pytorch", "compile"), DS.Axis.MODE),
    (Case("pytorch", "eager"), Case("jax", "jit"), DS.Axis.FRAMEWORK),
    (Case("pytorch", "compile"), Case("jax", "jit"), None),  # another framework, not at its default mode
    (Case("pytorch", "eager"), Case("pytorch", "compile", "bf16"), None),  # two dimensions
    (Case("pytorch", "eager", devices=2), Case("mxnet", "imperative"), None),
])
def test_one_dimension(x, y, axis):
    assert DS.axis_of(x, y) == axis


def test_a_run_of_one_case_has_no_pair():
    assert DS.pairs([load_run(DATA / "gpu_jax_fp32_counters_run")]) == []
    assert DS.section_html(DS.table([])) == f"<p class='empty'>{DS.NO_PAIRS}.</p>"


def test_cpu_pair_holds_the_trace_s_outermost_ops(tmp_path_factory):
    run = normalised_copy(tmp_path_factory, "cpu_run_all")
    found = DS.pairs([load_run(run)])
    t = DS.table(found)
    assert [(r["differs_in"], r["a"], r["b"], r["batch_size"], r["level"]) for _, r in t.iterrows()] == [
        ("framework", "pytorch", "mxnet", 64, "op")]
    assert t.iloc[0]["a_rows_ns"] == t.iloc[0]["a_total_ns"] == outermost_cpu_op_ns(
        run / "pytorch" / "bs64" / "trace.json.gz")
    assert t.iloc[0]["algorithm_changed"] == int((found[0].rows["status"] == "op changed").sum()) > 0


# --- the self-check fails where the rows do not hold a side's time ------------------------------------
def test_a_row_dropped_or_a_total_altered_fails(modes):
    found, _ = modes
    p = found[0]
    status, measured, _ = DS.conservation(p.rows, p.a.total_ns, p.b.total_ns)
    assert status == "pass" and measured == "A 6559117 ns, B 6600511 ns"
    first = p.rows.iloc[0]
    status, measured, detail = DS.conservation(p.rows.iloc[1:], p.a.total_ns, p.b.total_ns)
    assert status == "FAIL"
    assert measured == f"A {6559117 - first['a_ns']} ns, B {6600511 - first['b_ns']} ns"
    kept = ((6559117 - first["a_ns"]) / 6559117, (6600511 - first["b_ns"]) / 6600511)
    assert detail == f"the 35 rows hold A {kept[0]:.4%}, B {kept[1]:.4%} of each side's time"
    assert detail == "the 35 rows hold A 95.1417%, B 95.1509% of each side's time"
    p.b.total_ns += 1  # the source's kernels hold 1 ns more than the rows
    try:
        rows = pd.DataFrame(DS.check_rows([p]))
        assert rows[["status", "expected", "measured"]].values.tolist() == [
            ["FAIL", "A 6559117 ns, B 6600512 ns", "A 6559117 ns, B 6600511 ns"]]
    finally:
        p.b.total_ns -= 1


def fractional(run):
    """Three of compile-graphs' kernels given half a ns more: whole ns no longer add up to the source's total."""
    rec = run.records.copy()
    rec["dur_ns"] = rec["dur_ns"].astype("float64")
    k = rec.index[(rec["case"] == "pytorch-compile-graphs") & (rec["kind"] == "kernel") & (rec["source"] == "kineto")]
    rec.loc[k[:3], "dur_ns"] += 0.5
    run.records = rec
    return run


def test_records_that_cannot_be_conserved_fail_and_the_report_says_so(tmp_path):
    run = fractional(load_run(DATA / "gpu_replay_modes_run"))
    a = report_cli.analyse([run])
    rows = a.checks[a.checks["check"] == CHECK]
    assert rows[["framework", "status", "measured"]].values.tolist() == [["pytorch-cuda-graph", "FAIL", "not conserved"]]
    assert rows.iloc[0]["expected"] == "A 6624347 ns, B 4053745 ns"  # 4,053,744 ns of whole kernels, +1.5 planted
    assert "side B (pytorch-compile-graphs bs64) is not conserved: the rows hold 4053744 ns" in rows.iloc[0]["detail"]
    assert "diff conserves each side's time" in " ".join(report_cli.C.causes(a.checks))
    html = DS.section_html(DS.table(a.diffs))
    assert html.count("<tr>") == 2 and "is not conserved" in html and "tables/diff/" not in html


def test_report_section_and_csvs(tmp_path):
    out, checks = report_cli.build([str(DATA / "gpu_replay_modes_run")], tmp_path / "report")
    page = (out / "report.html").read_text()
    section = re.search(r'<section id="diff">(.*?)</section>', page, re.S).group(1)
    assert section.count("<tr>") == 2  # the head and one pair
    assert "<td class='key'>100% / 100%</td>" in section
    assert "PyTorch cuda-graph → PyTorch compile-graphs" in section and "100% / 100%" in section
    stem = "tables/diff/gpu_replay_modes_run/bs64-pytorch-cuda-graph-vs-pytorch-compile-graphs"
    assert f"href='{stem}.csv'" in section and f"href='{stem}-places.csv'" in section
    assert 'href="tables/diff_pairs.csv"' in page
    # records written before the typed key: the framework column holds the case's name
    graph, compiled = pyarrow_total("pytorch-cuda-graph"), pyarrow_total("pytorch-compile-graphs")
    assert (graph, compiled) == ((6624347, 880), (4053744, 740))
    for name in (f"{stem}.csv", f"{stem}-places.csv"):
        with (out / name).open() as fh:
            rows = list(csv.DictReader(fh))
        assert sum(int(r["a_ns"]) for r in rows) == graph[0] and sum(int(r["b_ns"]) for r in rows) == compiled[0]
        assert sum(int(r["a_calls"]) for r in rows) == graph[1] and sum(int(r["b_calls"]) for r in rows) == compiled[1]
    pairs = pd.read_csv(out / "tables" / "diff_pairs.csv")
    assert pairs[["a", "b", "verdict", "a_rows_ns", "b_rows_ns"]].values.tolist() == [
        ["pytorch-cuda-graph", "pytorch-compile-graphs", "faster", 6624347, 4053744]]
    mine = checks[checks["check"] == CHECK]
    assert mine[["status", "measured"]].values.tolist() == [["pass", "A 6624347 ns, B 4053744 ns"]]
    assert sorted(p.relative_to(out).as_posix() for p in (out / "tables" / "diff").rglob("*")) == [
        "tables/diff/gpu_replay_modes_run", f"{stem}-places.csv", f"{stem}.csv"]


def test_a_pair_file_is_never_written_over(tmp_path, modes):
    found, _ = modes
    p = found[0]
    (tmp_path / p.file).parent.mkdir(parents=True)
    (tmp_path / p.file).write_text("mine")
    with pytest.raises(report_cli.KernelmapError, match="exists"):
        DS.write(tmp_path, [p])
    assert (tmp_path / p.file).read_text() == "mine"


# --- --diff-against: each case against the same case of another run --------------------------------
def test_diff_against_another_run(tmp_path):
    older = tmp_path / "older"
    shutil.copytree(DATA / "gpu_replay_modes_run", older)
    out = tmp_path / "report"
    assert main(["report", str(DATA / "gpu_replay_modes_run"), "-o", str(out), "--diff-against", str(older)]) == 0
    pairs = pd.read_csv(out / "tables" / "diff_pairs.csv", keep_default_na=False)
    assert pairs[["against", "differs_in", "a", "b", "verdict", "rows", "same"]].values.tolist() == [
        ["", "mode", "pytorch-cuda-graph", "pytorch-compile-graphs", "faster", 60, 12],
        ["older", "run", "pytorch-cuda-graph", "pytorch-cuda-graph", "within noise", 36, 36],
        ["older", "run", "pytorch-compile-graphs", "pytorch-compile-graphs", "within noise", 36, 36]]  # itself: no change
    graph, compiled = pyarrow_total("pytorch-cuda-graph"), pyarrow_total("pytorch-compile-graphs")
    assert pairs[["a_rows_ns", "b_rows_ns"]].values.tolist() == [
        [graph[0], compiled[0]], [graph[0], graph[0]], [compiled[0], compiled[0]]]
    folder = out / "tables" / "diff" / "gpu_replay_modes_run-vs-older"
    assert sorted(p.name for p in folder.iterdir()) == [
        "bs64-pytorch-compile-graphs-vs-pytorch-compile-graphs-places.csv",
        "bs64-pytorch-compile-graphs-vs-pytorch-compile-graphs.csv",
        "bs64-pytorch-cuda-graph-vs-pytorch-cuda-graph-places.csv", "bs64-pytorch-cuda-graph-vs-pytorch-cuda-graph.csv"]
    checks = pd.read_csv(out / "tables" / "self_checks.csv")
    mine = checks[checks["check"] == CHECK]
    assert mine[["subject", "status"]].values.tolist() == [
        ["pytorch-cuda-graph -> pytorch-compile-graphs (mode)", "pass"],
        ["older:pytorch-cuda-graph -> gpu_replay_modes_run:pytorch-cuda-graph", "pass"],
        ["older:pytorch-compile-graphs -> gpu_replay_modes_run:pytorch-compile-graphs", "pass"]]
