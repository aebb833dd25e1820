"""The report's numbers on a real CPU run of both frameworks with every capture pass
(tests/data/cpu_run_all, normalised here): calls per step match the model, backward convolutions
say oneDNN for both frameworks, PyTorch's linear says BLAS, reorders are counted, every table is
also CSV, and ``--strict`` passes here and fails on a doctored copy."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from conftest import report
from kernelmap.reports import analysis as A
from kernelmap.reports import checks as C
from kernelmap.reports import cli as report_cli

from kernelmap import schema
from kernelmap.adapters import mkl_verbose
from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data" / "cpu_run_all"
FWS = ("pytorch", "mxnet")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cpu") / "cpu_run_all"
    shutil.copytree(DATA, d)
    normalise_run_dir(d)
    return d


@pytest.fixture(scope="module")
def run(run_dir) -> A.Run:
    return A.load_run(run_dir)


@pytest.fixture(scope="module")
def out(run_dir, tmp_path_factory) -> Path:
    o = tmp_path_factory.mktemp("rep") / "report"
    assert report(str(run_dir), "-o", str(o), "--strict") == 0
    return o


def _log_lines(fw: str, name: str) -> list[str]:
    return gzip.decompress((DATA / fw / "bs64" / name).read_bytes()).decode().splitlines()


def _logged_steps(fw: str) -> int:
    libs = json.loads((DATA / fw / "bs64" / "libs.json").read_text())
    return libs["warmup_steps"] + libs["steps"]


def test_steps_are_the_profiled_ones(run):
    """MXNet's trace marks its 5 warm-up steps too (no ops in them): the report divides by the
    5 profiled steps, as the framework pass timed them, not by the 10 marks."""
    rec = schema.read_parquet(run.path / "records.parquet")
    mx = rec[(rec["framework"] == "mxnet") & (rec["source"] == "mxnet_profiler")]
    assert mx.loc[mx["kind"] == "step", "iteration"].nunique() == 10
    for t in A.timed_events(run):
        passes = {r["framework"]: r["passes"] for r in run.results}[t.framework]
        assert t.n_steps == passes["framework"]["steps"] == 5
        assert len(t.iterations) == 5


def test_op_table_calls_per_step_match_the_model(run):
    table, fws = A.op_table(run, 64)
    assert set(fws) == set(FWS)
    t = table.set_index(["canonical_op", "direction"])
    for (op, d), n in {("conv2d", "fwd"): 2, ("relu", "fwd"): 3, ("max_pool2d", "fwd"): 2, ("linear", "fwd"): 2,
                       ("conv2d", "bwd"): 2, ("relu", "bwd"): 3, ("max_pool2d", "bwd"): 2,
                       ("linear", "bwd"): 2}.items():
        for fw in FWS:
            assert t.loc[(op, d), f"{fw}.calls_per_step"] == n, (fw, op, d)
    assert C.expected_calls_per_step() == {(op, d): n for (op, d), n in {
        ("conv2d", "fwd"): 2, ("relu", "fwd"): 3, ("max_pool2d", "fwd"): 2, ("linear", "fwd"): 2,
        ("conv2d", "bwd"): 2, ("relu", "bwd"): 3, ("max_pool2d", "bwd"): 2, ("linear", "bwd"): 2}.items()}


def test_layer_table_one_call_per_layer_and_libraries(run):
    lt = A.layer_table([run]).set_index(["layer", "direction", "framework"])
    assert len(lt) == 4 * 2 * 2  # layers x (fwd, op-level bwd) x frameworks
    for fw in FWS:
        for layer in ("conv1", "conv2"):
            assert lt.loc[(layer, "fwd", fw), "libraries"] == ["oneDNN"]
            assert lt.loc[(layer, "bwd", fw), "libraries"] == ["oneDNN"]
            assert lt.loc[(layer, "fwd", fw), "calls_per_step"] == 1
        # conv1's input needs no gradient in either framework: weight gradient only
        assert lt.loc[("conv1", "bwd", fw), "library_calls"] == ["convolution backward_weights"]
        assert sorted(lt.loc[("conv2", "bwd", fw), "library_calls"]) == [
            "convolution backward_data", "convolution backward_weights"]
    for layer in ("fc1", "fc2"):
        assert lt.loc[(layer, "fwd", "pytorch"), "libraries"] == ["BLAS"]
        assert lt.loc[(layer, "fwd", "pytorch"), "library_calls"] == ["SGEMM"]
        assert lt.loc[(layer, "bwd", "pytorch"), "calls_per_step"] == 2  # data and weight gradient
        assert lt.loc[(layer, "fwd", "mxnet"), "library_calls"] == ["inner_product forward_training"]
    # the CPU layer time is the library log's own, per timed step of the libs pass (its warm-up
    # step, the log's first, left out as the pass's own step times leave it out), and says so
    blas = mkl_verbose.read(DATA / "pytorch" / "bs64" / "blas.log.gz")
    fc1 = blas[(blas["layer"] == "fc1") & (blas["direction"] == "fwd")]
    libs = json.loads((DATA / "pytorch" / "bs64" / "libs.json").read_text())
    assert len(fc1) == _logged_steps("pytorch")  # one call per logged step, in log order
    timed = fc1["dur_ns"].to_numpy()[libs["warmup_steps"]:]
    assert lt.loc[("fc1", "fwd", "pytorch"), "ms_per_step"] == pytest.approx(timed.mean() / 1e6, rel=1e-12)
    assert lt.loc[("fc1", "fwd", "pytorch"), "steps_ms"] == pytest.approx(list(timed / 1e6), rel=1e-12)
    assert lt.loc[("fc1", "fwd", "pytorch"), "time_source"] == (
        "BLAS log, libs pass: its 3 timed steps (1 warm-up step(s) left out; each log's calls cut into its 4 "
        "logged steps in log order)")
    assert (lt.loc[("fc1", "fwd", "pytorch"), "time_kind"], lt.loc[("fc1", "fwd", "pytorch"), "pass"],
            lt.loc[("fc1", "fwd", "pytorch"), "op_pass"]) == ("library-call time", "libs", "framework")


def test_op_table_libraries_are_what_was_linked(run):
    table, _ = A.op_table(run, 64)
    t = table.set_index(["canonical_op", "direction"])
    for fw in FWS:
        assert t.loc[("conv2d", "bwd"), f"{fw}.libraries"] == ["oneDNN"]
        assert "convolution backward_weights" in t.loc[("conv2d", "bwd"), f"{fw}.library_calls"]
    assert t.loc[("linear", "fwd"), "pytorch.libraries"] == ["BLAS"]
    assert t.loc[("linear", "bwd"), "pytorch.libraries"] == ["BLAS"]
    assert t.loc[("linear", "bwd"), "mxnet.libraries"] == ["oneDNN"]
    assert t.loc[("relu", "fwd"), "pytorch.libraries"] == ["native"]  # torch's CPU relu is ATen's
    mix = A.library_mix([run])
    assert set(mix[mix["framework"] == "pytorch"]["library"]) == {"oneDNN", "BLAS", "native"}


def test_reorders_are_counted(run, out):
    calls = A.library_calls([run])
    for fw in FWS:
        lines = _log_lines(fw, "onednn.log.gz")
        n = sum(1 for x in lines if re.search(r"_verbose,(?:[^,]*,)*exec,cpu,reorder,", x))
        ro = calls[(calls["framework"] == fw) & (calls["library_call"] == "reorder undef")]
        assert n > 0 and ro["logged_calls"].sum() == n
        assert ro["calls_per_step"].sum() == pytest.approx(n / _logged_steps(fw), rel=1e-12)
        assert ro["linked_to_op"].all()  # each under the op of the primitive it feeds
    lt = A.layer_table([run])
    pt = calls[(calls["framework"] == "pytorch") & (calls["library_call"] == "reorder undef")]
    assert lt[lt["framework"] == "pytorch"]["reorders_per_step"].sum() == pytest.approx(
        pt[pt["canonical_op"].isin(["conv2d", "linear"])]["calls_per_step"].sum(), rel=1e-12)
    page = (out / "report.html").read_text()
    assert page.count("reorder undef") >= len(calls[calls["library_call"] == "reorder undef"])


def test_mkl_verbose_adapter_on_the_real_log():
    lines = _log_lines("pytorch", "blas.log.gz")
    calls = [x for x in lines if x.startswith("MKL_VERBOSE SGEMM(")]
    df = mkl_verbose.read(DATA / "pytorch" / "bs64" / "blas.log.gz")
    assert len(df) == len(calls) == 6 * _logged_steps("pytorch")  # 2 layers x (fwd, data grad, weight grad)
    assert df.attrs["info_lines"] == 1 and df.attrs["mkl_version"].startswith("2024.0")
    unit = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}
    want = sum(round(float(v) * unit[u]) for v, u in (re.search(r"\) ([\d.]+)(ns|us|ms|s) ", x).groups()
                                                       for x in calls))
    assert int(df["dur_ns"].sum()) == want
    assert (df["library"] == "BLAS").all() and (df["library_call"] == "SGEMM").all()
    per = df.groupby(["layer", "direction"]).size()
    assert per.to_dict() == {(la, d): _logged_steps("pytorch") for la in ("fc1", "fc2")
                             for d in ("bwd_data", "bwd_weight", "fwd")}
    assert set(df["flops"]) == {2 * 128 * 64 * 3136, 2 * 10 * 64 * 128}


def test_every_table_is_csv(out, run):
    names = {p.stem for p in (out / "tables").glob("*.csv")}
    assert {"summary", "op_table", "layer_table", "library_calls", "self_checks", "coverage"} <= names
    assert names <= set(report_cli.TABLES)
    page = (out / "report.html").read_text()
    for n in names:
        assert f'href="tables/{n}.csv"' in page
    ops = pd.read_csv(out / "tables" / "op_table.csv")
    conv = ops[(ops["canonical_op"] == "conv2d") & (ops["direction"] == "fwd")]
    assert sorted(conv["framework"]) == sorted(FWS) and (conv["calls_per_step"] == 2).all()
    checks = pd.read_csv(out / "tables" / "self_checks.csv")
    # every check but the counters pass's, which exist only for a run with one (--profile counters)
    counters = {C.Check.COUNTERS_COVER, C.Check.COUNTER_MATH, C.Check.COUNTERS_BUDGET}
    assert not (checks["status"] == C.FAIL).any() and set(checks["check"]) == {str(c) for c in set(C.Check) - counters}
    calls = checks[checks["check"] == C.Check.CALLS]
    assert len(calls) == 2 * 8 and (calls["status"] == C.PASS).all()


def test_strict_fails_on_a_doctored_copy(run_dir, tmp_path, capsys):
    """Drop PyTorch's conv2d forward ops of one traced step: calls per step no longer match."""
    bad = tmp_path / "doctored"
    shutil.copytree(run_dir, bad)
    rec = schema.read_parquet(bad / "records.parquet")
    hit = (rec["framework"].eq("pytorch") & rec["source"].eq("kineto") & rec["kind"].eq("op")
           & rec["canonical_op"].eq("conv2d") & rec["direction"].eq("fwd") & rec["iteration"].eq(7))
    dropped = int(rec.loc[hit, "op_name"].eq("aten::conv2d").sum())  # the outermost conv calls of step 7
    assert dropped == 2
    schema.write_parquet(rec[~hit].reset_index(drop=True), bad / "records.parquet")
    rc = report(str(bad), "-o", str(tmp_path / "rep"), "--strict")
    assert rc == C.EXIT_CHECK_FAILED == 4
    err = capsys.readouterr().err
    assert "FAIL doctored PyTorch bs 64: calls per step: conv2d fwd" in err
    checks = C.self_checks([A.load_run(bad)])
    failed = checks[checks["status"] == C.FAIL]
    assert list(failed["subject"]) == ["conv2d fwd"] and failed["measured"].iloc[0] == (2 * 5 - dropped) / 5
    # without --strict the same report is written and the command succeeds
    assert report(str(bad), "-o", str(tmp_path / "rep2")) == 0
