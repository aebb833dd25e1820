"""``kernelmap diff`` (reports/analyses/diff.py, reports/diffcli.py) on real runs, with planted changes.

GPU: the real H200 run of tests/data/gpu_replay_modes_run (PyTorch cuda-graph and compile-graphs at bs 64, 20
traced steps of replayed CUDA graphs each); its records are changed here, one planted change at a time, and each
must be caught and named. CPU: tests/data/cpu_run_all, normalised on a copy. Foreign: the real H200 Kineto
trace tests/data/gpu_kineto.json.gz, read by normalise, changed in its JSON. Totals are taken independently:
pyarrow's own rows for the records, the trace's JSON (stdlib, decimal microseconds) for the trace."""

from __future__ import annotations

import csv
import gzip
import json
import shutil
from collections import defaultdict
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from kernelmap.reports.analyses import diff as D
from kernelmap.reports.analyses.base import load_run

from kernelmap import cli, utest
from kernelmap.errors import KernelmapError
from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data"
RUN = DATA / "gpu_replay_modes_run"
GRAPH, COMPILE = "pytorch-cuda-graph", "pytorch-compile-graphs"
FC1_DGRAD = ("fc1", "bwd_data", "cublasSgemm_v2")
FC1_FWD = ("fc1", "fwd", "cublasLtMatmul")


# --- the U test --------------------------------------------------------------------------------
@pytest.mark.parametrize(("x", "y", "p"), [
    # reference p-values: scipy 1.17.1, mannwhitneyu(x, y, alternative="two-sided", method=...)
    ([1, 2, 3], [4, 5, 6], 0.1),  # exact
    ([1.5, 2.5, 3.1, 4.2, 5.0], [2.0, 6.1, 7.3, 8.8, 9.9], 0.09523809523809523),  # exact
    ([1, 2, 2, 3, 3, 3, 4], [3, 4, 4, 5, 5, 6], 0.012999854364387305),  # ties: asymptotic
    (list(range(30)), [x + 10.5 for x in range(30)], 0.00012477053789099933),  # over EXACT_MAX: asymptotic
])
def test_u_test_matches_scipy(x, y, p):
    assert utest.p_value(x, y) == pytest.approx(p, rel=1e-12)
    assert utest.p_value(y, x) == pytest.approx(p, rel=1e-12)


def test_u_test_edges():
    assert utest.p_value([1, 1], [1, 1]) == 1.0  # all equal
    assert utest.p_value([], [1]) == 1.0
    assert utest.min_p(2, 2) == pytest.approx(1 / 3)  # 2 / C(4, 2): never below 0.05
    assert D.verdict([1.0, 2.0], [5.0, 6.0])[0] == D.Verdict.FEW
    assert D.verdict([1.0] * 5, [2.0] * 5)[0] == D.Verdict.SLOWER


# --- the real GPU run, planted changes -------------------------------------------------------------
def pyarrow_total(case: str) -> tuple[int, int]:
    """(kernel ns, kernels) of a case's Kineto trace, from pyarrow's rows (the run's records, schema 2)."""
    rows = pq.read_table(RUN / "records.parquet", columns=["framework", "source", "kind", "dur_ns"]).to_pylist()
    mine = [r["dur_ns"] for r in rows if r["framework"] == case and r["source"] == "kineto" and r["kind"] == "kernel"]
    return sum(mine), len(mine)


@pytest.fixture(scope="module")
def gpu_run():
    return load_run(RUN)


def case_records(run, case: str) -> tuple[pd.DataFrame, dict]:
    entry = next(r for r in run.results if r["case"] == case)
    return run.records[run.records["case"] == case].copy(), entry


def kernels_of(rec: pd.DataFrame, layer: str, direction: str, call: str) -> pd.Series:
    k = rec["kind"].eq("kernel") & rec["source"].eq("kineto") & rec["layer"].eq(layer).fillna(False)
    k &= rec["direction"].eq(direction).fillna(False) & rec["library_call"].eq(call).fillna(False)
    return k.fillna(False).astype(bool)


def planted(run, change) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Diff the cuda-graph case against a copy of itself with ``change(records)`` applied; the rows of
    ``change``'s return (the planted key)."""
    rec, entry = case_records(run, GRAPH)
    a = D.make_side("A", rec, entry)
    b_rec = change(rec.copy())
    df = D.diff(a, D.make_side("B", b_rec, entry))
    return df, b_rec


def row(df: pd.DataFrame, where: str, direction: str, call: str, kernel: str | None = None) -> pd.DataFrame:
    m = (df["where"] == where) & (df["direction"] == direction) & (df["library_call"] == call)
    return df[m & (df["kernel"] == kernel)] if kernel is not None else df[m]


def test_a_run_against_itself_shows_no_change(gpu_run):
    rec, entry = case_records(gpu_run, GRAPH)
    df = D.diff(D.make_side("A", rec, entry), D.make_side("B", rec, entry))
    total, n = pyarrow_total(GRAPH)
    assert (total, n) == (6624347, 880)
    assert int(df["a_ns"].sum()) == int(df["b_ns"].sum()) == total
    assert int(df["a_calls"].sum()) == n
    assert set(df["status"]) == {"same"} and set(df["verdict"]) == {"within noise"}
    assert (df["change_ms"] == 0).all()
    s = df.attrs["summary"]
    assert s["a"]["steps"] == s["b"]["steps"] == 20 and s["traced_verdict"] == "within noise"
    assert s["clean_verdict"] == "within noise"  # the same trials
    assert df["a_share"].sum() == pytest.approx(1.0)


def test_graph_replays_are_rows_of_their_layers(gpu_run):
    """cuda-graph's timed steps are replays: each kernel still has its layer and library call."""
    rec, entry = case_records(gpu_run, GRAPH)
    df = D.diff(D.make_side("A", rec, entry), D.make_side("B", rec, entry))
    assert {"conv1", "conv2", "fc1", "fc2"} <= set(df["where"])
    assert len(row(df, *FC1_FWD)) >= 1 and row(df, *FC1_FWD)["a_calls_step"].sum() >= 1


def test_kernel_moved_to_another_layer(gpu_run):
    def move(rec):
        rec.loc[kernels_of(rec, *FC1_DGRAD), "layer"] = "fc2"
        return rec
    rec, _ = case_records(gpu_run, GRAPH)
    k = rec.loc[kernels_of(rec, *FC1_DGRAD), "kernel_name"].unique()
    assert len(k) == 1
    df, _ = planted(gpu_run, move)
    left, came = row(df, *FC1_DGRAD, k[0]), row(df, "fc2", "bwd_data", "cublasSgemm_v2", k[0])
    assert left["status"].tolist() == ["moved"] and left["note"].tolist() == ["to fc2"]
    assert came["status"].tolist() == ["moved"] and came["note"].tolist() == ["from fc1"]
    assert left["verdict"].tolist() == ["faster"] and came["verdict"].tolist() == ["slower"]
    assert int(left["a_ns"].iloc[0]) == int(came["b_ns"].iloc[0]) > 0
    assert (df.loc[~df.index.isin([*left.index, *came.index]), "status"] == "same").all()


def test_the_same_kernel_under_another_call_in_its_place_is_not_moved(gpu_run):
    """fc1's data-gradient gemm under another library call, in fc1 still (as JAX's XLA calls cuDNN where PyTorch calls
    cudnnBackendExecute, the same kernels): library call changed on both sides, never 'moved to fc1' from fc1."""
    def recall(rec):
        m = kernels_of(rec, *FC1_DGRAD)
        rec["library_call"] = rec["library_call"].astype(object)
        rec.loc[m, "library_call"] = "cublasGemmEx"
        rec["library_call"] = rec["library_call"].astype("string")
        return rec
    df, _ = planted(gpu_run, recall)
    r = df[(df["where"] == "fc1") & (df["direction"] == "bwd_data")]
    assert sorted(r["library_call"]) == ["cublasGemmEx", "cublasSgemm_v2"] and len(set(r["kernel"])) == 1
    assert r["status"].tolist() == ["library call changed"] * 2
    assert (df.loc[~df.index.isin(r.index), "status"] == "same").all()


def renamed(rec: pd.DataFrame, new: str) -> pd.DataFrame:
    """conv2's data-gradient kernel (cuDNN) renamed ``new`` in every step: another algorithm, the same times."""
    m = kernels_of(rec, "conv2", "bwd_data", "cudnnBackendExecute")
    rec["kernel_name"] = rec["kernel_name"].astype(object)
    rec.loc[m, "kernel_name"] = new
    rec["kernel_name"] = rec["kernel_name"].astype("string")
    return rec


def test_algorithm_changed(gpu_run):
    new = "sm90_xmma_dgrad_implicit_gemm_planted_kernel"

    def swap(rec):
        assert kernels_of(rec, "conv2", "bwd_data", "cudnnBackendExecute").sum() == 20  # one per step
        return renamed(rec, new)
    df, _ = planted(gpu_run, swap)
    r = row(df, "conv2", "bwd_data", "cudnnBackendExecute")
    assert sorted(r["status"]) == ["algorithm changed", "algorithm changed"]
    assert r.loc[r["kernel"] == new, "b_calls_step"].tolist() == [1.0]
    assert (df.loc[~df.index.isin(r.index), "status"] == "same").all()


def test_kernel_added(gpu_run):
    """One new kernel per step in fc2's forward: appeared, slower, and B's total grows by exactly its time."""
    added = []

    def add(rec):
        base = rec[kernels_of(rec, "fc2", "fwd", "cublasLtMatmul")].drop_duplicates("iteration")
        new = base.copy()
        new["kernel_name"] = pd.array(["planted_added_kernel"] * len(new), dtype="string")
        new["dur_ns"] = pd.array([1000 + i for i in range(len(new))], dtype="Int64")
        new["event_id"] = new["event_id"] + 10_000_000
        added.extend(int(x) for x in new["dur_ns"])
        return pd.concat([rec, new], ignore_index=True)
    df, _ = planted(gpu_run, add)
    total, _ = pyarrow_total(GRAPH)
    assert len(added) == 20
    r = row(df, "fc2", "fwd", "cublasLtMatmul", "planted_added_kernel")
    assert r["status"].tolist() == ["appeared"] and r["verdict"].tolist() == ["slower"]
    assert int(r["b_ns"].iloc[0]) == sum(added)
    assert int(df["b_ns"].sum()) == total + sum(added) and int(df["a_ns"].sum()) == total
    assert df.attrs["summary"]["traced_verdict"] in ("slower", "within noise")


def test_call_split_in_two(gpu_run):
    """Each fc1 forward gemm split into two launches of the same kernel, the same time: calls per step 1 -> 2,
    time unchanged, within noise."""
    def split(rec):
        m = kernels_of(rec, *FC1_FWD) & rec["kernel_name"].str.startswith("sm80_xmma_gemm").fillna(False)
        one = rec[m].copy()
        half = one["dur_ns"] // 2
        rec.loc[m, "dur_ns"] = half
        one["dur_ns"] = one["dur_ns"] - half
        one["event_id"] = one["event_id"] + 10_000_000
        return pd.concat([rec, one], ignore_index=True)
    df, _ = planted(gpu_run, split)
    r = row(df, *FC1_FWD)
    r = r[r["kernel"].str.startswith("sm80_xmma_gemm")]
    assert r["status"].tolist() == ["calls per step changed"] and r["note"].tolist() == ["calls per step 1 -> 2"]
    assert r["verdict"].tolist() == ["within noise"] and int(r["a_ns"].iloc[0]) == int(r["b_ns"].iloc[0])
    assert int(df["b_ns"].sum()) == int(df["a_ns"].sum()) == pyarrow_total(GRAPH)[0]


def _shift(gpu_run, by) -> pd.DataFrame:
    """The conv2 data-gradient kernel's times rotated by one step (the same spread) and shifted by
    ``by(per-step times)`` ns each."""
    def shift(rec):
        m = kernels_of(rec, "conv2", "bwd_data", "cudnnBackendExecute")
        d = rec.loc[m].sort_values("iteration")["dur_ns"]
        rolled = list(d.iloc[1:]) + [d.iloc[0]]
        rec.loc[d.index, "dur_ns"] = [int(x) + by(d) for x in rolled]
        return rec
    df, _ = planted(gpu_run, shift)
    return row(df, "conv2", "bwd_data", "cudnnBackendExecute")


def test_time_shifted_within_the_noise(gpu_run):
    r = _shift(gpu_run, lambda d: int(d.std() * 0.1))
    assert r["verdict"].tolist() == ["within noise"] and r["status"].tolist() == ["same"]
    assert (r["change_ms"] > 0).all() and r["p_value"].iloc[0] > D.ALPHA


def test_time_shifted_beyond_the_noise(gpu_run):
    r = _shift(gpu_run, lambda d: max(int(d.max() - d.min()) + 1, int(d.median() * 0.06)))
    assert r["verdict"].tolist() == ["slower"] and r["p_value"].iloc[0] < 1e-6


def test_a_steady_change_under_the_noise_threshold_is_within_noise(gpu_run):
    """Every step 2% slower: the U test finds it (p < alpha), the verdict does not call it (timing.NOISE_THRESHOLD)."""
    def slower(rec):
        m = kernels_of(rec, "conv2", "bwd_data", "cudnnBackendExecute")
        rec.loc[m, "dur_ns"] = (rec.loc[m, "dur_ns"] * 1.02).round().astype("Int64")
        return rec
    df, _ = planted(gpu_run, slower)
    r = row(df, "conv2", "bwd_data", "cudnnBackendExecute")
    assert r["verdict"].tolist() == ["within noise"] and r["p_value"].iloc[0] < D.ALPHA
    assert r["change_pct"].iloc[0] == pytest.approx(2.0, abs=0.05)


def test_a_row_lost_is_an_error(gpu_run):
    rec, entry = case_records(gpu_run, GRAPH)
    a, b = D.make_side("A", rec, entry), D.make_side("B", rec, entry)
    df = D.diff(a, b)
    with pytest.raises(KernelmapError, match="side A .* not conserved"):
        D.conserve(df.iloc[1:], a, b)
    b.total_ns += 1  # the source's kernels hold more than the rows
    with pytest.raises(KernelmapError, match="side B .* not conserved"):
        D.conserve(df, a, b)


# --- the command line ------------------------------------------------------------------------------
def test_cli_two_cases_of_one_run(tmp_path, capsys):
    out = tmp_path / "d.csv"
    rc = cli.main(["diff", str(RUN), str(RUN), "--case-a", "mode=cuda-graph", "--case-b", "mode=compile-graphs",
                   "--csv", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "A: gpu_replay_modes_run:pytorch-cuda-graph bs64" in text and "clean step, B vs A" in text
    with out.open() as fh:
        rows = list(csv.DictReader(fh))
    assert sum(int(r["a_ns"]) for r in rows) == pyarrow_total(GRAPH)[0] == 6624347
    assert sum(int(r["b_ns"]) for r in rows) == pyarrow_total(COMPILE)[0] == 4053744
    # compile fused the bias and relu kernels: what it no longer runs is named
    assert {"disappeared", "appeared", "algorithm changed", "same"} <= {r["status"] for r in rows}


@pytest.mark.parametrize(("argv", "msg"), [
    (["--case", "framework=pytorch"], "2 cases match"),
    (["--case", "mode=nope"], "no case matches"),
    (["--case", "colour=red"], "is not FIELD=VALUE"),
])
def test_cli_refuses_a_case_it_cannot_pick(argv, msg, capsys):
    assert cli.main(["diff", str(RUN), str(RUN), *argv]) == 2
    assert msg in capsys.readouterr().err


# --- other people's traces: the real H200 Kineto trace ------------------------------------------------
def trace_kernel_ns(path: Path) -> int:
    """Every kernel's time in the trace, from its JSON (stdlib; decimal microseconds, as the adapter reads them)."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    return sum(int(Decimal(str(e["dur"])) * 1000) for e in doc["traceEvents"]
               if e.get("cat") == "kernel" and e.get("ph") == "X")


def test_cli_foreign_trace_against_itself_and_a_planted_kernel(tmp_path, capsys):
    src = DATA / "gpu_kineto.json.gz"
    total = trace_kernel_ns(src)
    doc = json.loads(gzip.decompress(src.read_bytes()))
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]
    renamed = [e for e in kernels if "reduce_kernel<512, 1" in e["name"]]
    assert len(renamed) == 10, "conv1's and conv2's bias gradients, 5 steps"
    for e in renamed:
        e["name"] = "planted_bias_reduce_kernel"
    (tmp_path / "b").mkdir()
    b = tmp_path / "b" / "trace.json.gz"
    b.write_bytes(gzip.compress(json.dumps(doc).encode()))
    for other, changed in ((src, False), (b, True)):
        out = tmp_path / f"{changed}.csv"
        assert cli.main(["diff", str(src), str(other), "--csv", str(out)]) == 0
        with out.open() as fh:
            rows = list(csv.DictReader(fh))
        assert sum(int(r["a_ns"]) for r in rows) == sum(int(r["b_ns"]) for r in rows) == total == 1549133
        statuses = {r["status"] for r in rows}
        if not changed:
            assert statuses == {"same"} and {r["verdict"] for r in rows} == {"within noise"}
        else:
            swapped = [r for r in rows if r["status"] == "algorithm changed"]
            assert {r["kernel"] for r in swapped} >= {"planted_bias_reduce_kernel"}
            # conv1's and conv2's bias gradients ran that kernel; renamed, the adapter no longer calls it a bias
            # gradient (bwd_bias is told by the name), so it is each layer's other kernel of its backward
            assert {(r["where"], r["direction"]) for r in swapped} == {
                (w, d) for w in ("conv1", "conv2") for d in ("bwd", "bwd_bias")}
            assert statuses == {"same", "algorithm changed"}
    assert "no trials recorded" in capsys.readouterr().out


# --- the real CPU run: ops, two frameworks ------------------------------------------------------------
def normalised_copy(tmp_path_factory, name: str) -> Path:
    d = tmp_path_factory.mktemp("diff") / name
    shutil.copytree(DATA / name, d)
    normalise_run_dir(d)
    return d


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory) -> Path:
    return normalised_copy(tmp_path_factory, "cpu_run_all")


def outermost_cpu_op_ns(path: Path) -> int:
    """Kineto's cpu_op events not inside another of their thread, summed (stdlib JSON, decimal microseconds)."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    by_thread = defaultdict(list)
    for e in doc["traceEvents"]:
        if e.get("cat") == "cpu_op" and e.get("ph") == "X":
            s, d = int(Decimal(str(e["ts"])) * 1000), int(Decimal(str(e["dur"])) * 1000)
            by_thread[(e["pid"], e["tid"])].append((s, -d))
    total = 0
    for evs in by_thread.values():
        end = -1
        for s, negd in sorted(evs):
            if s >= end:
                total, end = total + -negd, s - negd
    return total


def test_cpu_frameworks_side_by_side_conserve_their_op_time(cpu_run, tmp_path, capsys):
    out = tmp_path / "cpu.csv"
    assert cli.main(["diff", str(cpu_run), str(cpu_run), "--case-a", "framework=pytorch",
                     "--case-b", "framework=mxnet", "--csv", str(out)]) == 0
    with out.open() as fh:
        rows = list(csv.DictReader(fh))
    expected = outermost_cpu_op_ns(cpu_run / "pytorch" / "bs64" / "trace.json.gz")
    assert sum(int(r["a_ns"]) for r in rows) == expected
    text = capsys.readouterr().out
    assert "op time from kineto, 5 steps" in text and "op time from mxnet_profiler, 5 steps" in text
    # the layers meet on one key; their ops differ by name: each named as the other side's op in that place
    conv1 = [r for r in rows if r["where"] == "conv1" and r["direction"] == "fwd"]
    assert {r["kernel"] for r in conv1} == {"aten::conv2d", "Convolution"}
    assert {r["status"] for r in conv1} == {"op changed"}
    # MXNet's ops of a step its profiler did not count (the report's timed events say 2 ops, 13,000 ns)
    outside = [r for r in rows if r["where"] == D.OUTSIDE]
    assert [(r["a_ns"], r["b_ns"], r["b_calls"], r["status"]) for r in outside] == [
        ("0", "13000", "2", "not in a counted step")]


def test_cpu_run_against_itself(cpu_run, capsys):
    assert cli.main(["diff", str(cpu_run), str(cpu_run), "--case", "framework=mxnet"]) == 0
    text = capsys.readouterr().out
    assert "rows: " in text and "appeared" not in text and "disappeared" not in text
    assert "traced op time per step, B vs A: within noise" in text


def test_places_hold_the_same_time_and_meet_where_kernels_do_not(gpu_run):
    """by_place: the kernels of a layer and direction together; an algorithm changed at the same times is two
    kernel rows (algorithm changed) and one place row within noise."""
    new = "planted_dgrad_kernel"

    rec, entry = case_records(gpu_run, GRAPH)
    a, b = D.make_side("A", rec, entry), D.make_side("B", renamed(rec.copy(), new), entry)
    places = D.by_place(a, b)
    total = pyarrow_total(GRAPH)[0]
    assert int(places["a_ns"].sum()) == int(places["b_ns"].sum()) == total
    assert list(places.columns[:2]) == ["where", "direction"] and "status" not in places.columns
    r = places[(places["where"] == "conv2") & (places["direction"] == "bwd_data")]
    assert r["verdict"].tolist() == ["within noise"] and (r["change_ms"] == 0).all()
    assert (places["verdict"] == "within noise").all()


@pytest.fixture(scope="module")
def busy_run(tmp_path_factory) -> Path:
    return normalised_copy(tmp_path_factory, "cpu_busy_run")


def test_a_busy_side_is_marked(busy_run, cpu_run, tmp_path, capsys):
    """The busy run's framework pass ran contended (results.json): every row says A's figure is busy, and the
    header says which pass and that the clean trials were busy; the quiet run's clean trials have no interval
    recorded (a run written before intervals: its clean verdict cannot be given)."""
    out = tmp_path / "busy.csv"
    assert cli.main(["diff", str(busy_run), str(cpu_run), "--case", "framework=pytorch", "--csv", str(out)]) == 0
    text = capsys.readouterr().out
    with out.open() as fh:
        rows = list(csv.DictReader(fh))
    assert {r["busy"] for r in rows} == {"A"}
    assert "that pass on a BUSY machine" in text and "(BUSY)" in text
    assert "clean step, B vs A (trials' 95% intervals): no trials recorded" in text
    assert sum(int(r["a_ns"]) for r in rows) == outermost_cpu_op_ns(busy_run / "pytorch" / "bs64" / "trace.json.gz")


def test_cli_another_teams_graph_replay_trace_conserves_its_kernel_time(tmp_path):
    """HTA's A100 DDP trace with CUDA graph replays (tests/data/foreign), against HTA's V100 one: every kernel of
    each, replays included, in exactly one row."""
    a, b = DATA / "foreign" / "hta_v100_ddp_cudagraph_step1010.json.gz", DATA / "foreign" / "hta_a100_ddp_cudagraph_step551.json.gz"
    out = tmp_path / "ddp.csv"
    assert cli.main(["diff", str(a), str(b), "--csv", str(out)]) == 0
    with out.open() as fh:
        rows = list(csv.DictReader(fh))
    assert sum(int(r["a_ns"]) for r in rows) == trace_kernel_ns(a)
    assert sum(int(r["b_ns"]) for r in rows) == trace_kernel_ns(b)
    assert {r["verdict"] for r in rows} <= {"too few steps", "no steps"}  # one traced step a side


def test_cli_bad_input_is_an_error_naming_it(tmp_path, cpu_run, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [')
    cases = [
        ([str(tmp_path / "nope"), str(RUN)], "no such file or directory"),
        ([str(DATA / "cpu_run_all"), str(RUN), "--case-a", "framework=pytorch"], "no records.parquet"),
        ([str(bad), str(RUN)], "bad.json"),
        ([str(RUN), str(cpu_run), "--case-a", "mode=cuda-graph", "--case-b", "framework=pytorch"],
         "not one unit of time"),
        ([str(RUN), str(RUN), "--case", "mode=cuda-graph", "--alpha", "2"], "--alpha 2"),
    ]
    for argv, msg in cases:
        out = tmp_path / "never.csv"
        assert cli.main(["diff", *argv, "--csv", str(out)]) == 2, argv
        assert msg in capsys.readouterr().err, argv
        assert not out.exists()


def test_a_trace_without_step_marks_is_one_step(tmp_path, capsys):
    """TraceLens' B200 vLLM inference trace has no step marks: its kernels are one step, not all 'outside'."""
    t = DATA / "foreign" / "tracelens_b200_vllm_nvjet.json.gz"
    out = tmp_path / "vllm.csv"
    assert cli.main(["diff", str(t), str(t), "--csv", str(out)]) == 0
    assert "1 steps (no step marks in the trace: the whole trace counted as one step)" in capsys.readouterr().out
    with out.open() as fh:
        rows = list(csv.DictReader(fh))
    assert D.OUTSIDE not in {r["where"] for r in rows} and {r["status"] for r in rows} == {"same"}
    assert sum(int(r["a_ns"]) for r in rows) == trace_kernel_ns(t) == 10862916


# the --html page: tests/test_diff_html.py


def test_cli_names_each_sides_machine_and_says_when_they_differ(tmp_path, capsys):
    """Each side's line names the machine its case ran on (the run's manifest: the GPU for a GPU case); two runs of
    different machines get a line saying so, since every change then holds the machines' difference too. The real
    H200 run against itself: one machine, no such line; against a copy whose manifest names an H100: the line."""
    from kernelmap import cli

    gpu = json.loads((RUN / "manifest.json").read_text())["gpu"]["name"]
    assert gpu == "NVIDIA H200"
    assert cli.main(["diff", str(RUN), str(RUN), "--case-a", "mode=cuda-graph", "--case-b", "mode=compile-graphs"]) == 0
    out = capsys.readouterr().out.splitlines()
    sides = [ln for ln in out if ln.startswith(("A: ", "B: "))]
    assert len(sides) == 2 and all(ln.endswith(", NVIDIA H200") for ln in sides)
    assert not any("different machines" in ln for ln in out)

    other = tmp_path / "h100_run"
    shutil.copytree(RUN, other)
    m = json.loads((other / "manifest.json").read_text())
    m["gpu"]["name"] = "NVIDIA H100 80GB HBM3"
    (other / "manifest.json").write_text(json.dumps(m))
    assert cli.main(["diff", str(RUN), str(other), "--case", "mode=cuda-graph"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln for ln in out if "different machines" in ln] == [
        "A and B ran on different machines (NVIDIA H200; NVIDIA H100 80GB HBM3): each change holds the machines' "
        "difference too"]
