"""MXNet built for sm_90 (kernelmap build-mxnet) on the H100: the MXNet case of a real
`kernelmap run --framework all --device gpu --profile all --steps 50 --batch-size 64` (nsys capture
trimmed by tests/data/record_gpu_fixtures.trim_nsys; cuDNN/cuBLAS/cuBLASLt logs and the MXNet profiler
trace as written). nsys recorded the whole worker (registry.NsysWindow.NVTX_RANGE); only what starts
inside the worker's ``kernelmap:capture`` range is read. Totals are checked against the SQLite itself."""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from kernelmap import schema
from kernelmap.normalise import normalise_run_dir

RUN = Path(__file__).parent / "data" / "gpu_mxnet_run"
CASE = "mxnet/bs64"


@pytest.fixture(scope="module")
def normalised(tmp_path_factory):
    run = tmp_path_factory.mktemp("run") / "run"
    shutil.copytree(RUN, run)
    summary = normalise_run_dir(run)
    return schema.read_parquet(run / "records.parquet"), summary["runs"][CASE]


def _sqlite_window_kernels(tmp_path) -> tuple[int, int, int]:
    db = tmp_path / "nsys.sqlite"
    with gzip.open(RUN / CASE / "nsys.sqlite.gz") as src, open(db, "wb") as dst:
        shutil.copyfileobj(src, dst)
    con = sqlite3.connect(db)
    (lo, hi), = con.execute("SELECT n.start, n.\"end\" FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
                            "WHERE coalesce(n.text, s.value) = 'kernelmap:capture'").fetchall()
    n, t = con.execute("SELECT count(*), sum(\"end\" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE start BETWEEN ? AND ?",
                       (lo, hi)).fetchone()
    (total,), = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
    con.close()
    return n, t, total


def test_only_the_capture_window_is_read_and_every_kernel_is_attributed(normalised, tmp_path):
    df, run = normalised
    n, t, total = _sqlite_window_kernels(tmp_path)
    assert (n, t) == (1020, 7_049_477) and total == 1388  # warm-up and autotuning kernels lie outside
    k = df[df["kind"].eq("kernel") & df["source"].eq("nsys")]
    assert (len(k), int(k["dur_ns"].sum())) == (n, t)
    assert run["by_source"]["nsys"]["attributed_kernel_time_share"] == 1.0
    assert sorted(k["iteration"].unique()) == list(range(5, 25))  # the 20 timed steps


def test_operators_per_step_match_the_model(normalised):
    """Patch 0007: one NVTX range per operator, each ended (1.9.1 left a second one open to the end)."""
    df, _ = normalised
    ops = df[df["kind"].eq("op") & df["source"].eq("nsys")]
    per_step = ops.groupby(["canonical_op", "direction"]).size() / 20
    for (op, d), want in {("conv2d", "fwd"): 2, ("relu", "fwd"): 3, ("max_pool2d", "fwd"): 2, ("linear", "fwd"): 2,
                          ("relu", "bwd"): 3, ("max_pool2d", "bwd"): 2}.items():
        assert per_step[(op, d)] == want, (op, d)
    assert (ops["dur_ns"] < 10**8).all()  # no range runs to the end of the capture


def test_cudnn_and_cublas_calls_link_to_mxnet_kernels(normalised):
    """The libs pass's first step autotunes (each algorithm tried once): only the timed steps' calls
    must agree. Linear backward (one op, both GEMMs) links to the union of its bwd_data/bwd_weight
    calls; the weightless ops' cuDNN calls (activation, pooling: no layer in their arguments) link by
    (op, any layer, direction); MXNet's own kernels (mxnet::op::) are native, not cuBLAS's."""
    df, run = normalised
    assert run["library_kernels"] == 580 and run["library_kernels_linked"] == 580
    assert run["library_kernel_time_linked_share"] == 1.0 and run["library_unlinked_top"] == []
    # conv1 has no data gradient in the timed steps: its bwd_data calls are autotuning's alone
    assert run["ambiguous_signatures"] == [{"canonical_op": "conv2d", "layer": "conv1", "direction": "bwd_data"}]
    k = df[df["kind"].eq("kernel") & df["call_event_id"].notna()]
    calls = k.groupby(["canonical_op", "layer", "direction"], dropna=False)["library_call"].agg(lambda c: sorted(set(c)))
    calls = {(o, None if pd.isna(lay) else lay, d): v for (o, lay, d), v in calls.items()}
    assert calls[("conv2d", "conv1", "fwd")] == ["cudnnConvolutionForward"]
    assert calls[("conv2d", "conv2", "bwd_data")] == ["cudnnConvolutionBackwardData"]
    assert calls[("conv2d", "conv1", "bwd_weight")] == ["cudnnConvolutionBackwardFilter"]
    assert calls[("linear", "fc1", "bwd")] == ["cublasSgemmEx"]
    assert calls[("relu", None, "bwd")] == ["cudnnActivationBackward"]
    assert calls[("max_pool2d", None, "fwd")] == ["cudnnPoolingForward"]
    native = df[df["kind"].eq("kernel") & df["kernel_name"].str.contains("mxnet::op::", regex=False).fillna(False)]
    assert len(native) and native["library"].eq("native").all() and native["call_event_id"].isna().all()


def test_bias_gradient_is_its_own_call(normalised):
    """cuDNN's calc_bias_diff kernel is cudnnConvolutionBackwardBias's (the log names the layer by
    its [1, C, 1, 1] bias tensor), not the neighbouring wgrad kernel's BackwardFilter."""
    df, run = normalised
    b = df[df["kind"].eq("kernel") & df["kernel_name"].str.contains("calc_bias_diff", regex=False).fillna(False)]
    got = b.groupby(["layer", "direction", "library_call"]).agg(n=("dur_ns", "size"), t=("dur_ns", "sum"))
    assert got.to_dict("index") == {
        ("conv1", "bwd_bias", "cudnnConvolutionBackwardBias"): {"n": 20, "t": 648_237},
        ("conv2", "bwd_bias", "cudnnConvolutionBackwardBias"): {"n": 20, "t": 374_851}}
    per_step = {(x["library_call"], x["canonical_op"], x["layer"], x["direction"]): x["launching_ops_per_step"]
                for x in run["library_links"] if x["source"] == "nsys"}
    # calls per step against the model: 3 relu, 2 max pools, one bias gradient per conv
    assert per_step[("cudnnActivationForward", "relu", None, "fwd")] == 3.0
    assert per_step[("cudnnPoolingBackward", "max_pool2d", None, "bwd")] == 2.0
    assert per_step[("cudnnConvolutionBackwardBias", "conv2d", "conv1", "bwd_bias")] == 1.0


def test_library_links_are_per_step(normalised):
    _, run = normalised
    conv = [x for x in run["library_links"] if x["library_call"] == "cudnnConvolutionForward"]
    assert {x["layer"] for x in conv} == {"conv1", "conv2"}
    assert all(x["launching_ops_per_step"] == 1.0 and x["traced_steps"] == 20 for x in conv)
    assert all(x["log_calls_per_step"] == 1.0 for x in conv)  # 21 logged steps, one call each


def test_layer_table_algorithm_is_the_linked_calls_not_autotunings(normalised, tmp_path):
    """MXNet's cuDNN autotune tries each backward-filter algorithm once per process, so conv1's log
    holds five algorithms; the timed steps' kernels (wgrad_alg0_engine) link to ALGO_0 calls only, and
    the per-layer table (the report's answer) names that one."""
    from kernelmap.reports import analysis as A

    df, _ = normalised
    logged = df[df["kind"].eq("library_call") & df["layer"].eq("conv1") & df["direction"].eq("bwd_weight")]
    assert logged["algo"].nunique() == 5
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    normalise_run_dir(run)
    lt = A.layer_table([A.load_run(run)]).set_index(["layer", "direction"])
    assert lt.loc[("conv1", "bwd_weight"), "algos"] == ["CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0"]
    assert lt.loc[("conv1", "bwd_weight"), "kernels"] == ["wgrad_alg0_engine"]
    assert lt.loc[("conv1", "bwd_bias"), "library_calls"] == ["cudnnConvolutionBackwardBias"]
