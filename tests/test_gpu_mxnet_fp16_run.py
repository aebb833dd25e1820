"""MXNet fp16 (AMP) on the 4x H200, every pass (tests/data/gpu_mxnet_fp16_run: run set r0 of 2026-11-27, commit
e953021, trimmed by its trim.py.txt): `kernelmap run --framework mxnet --device gpu --mode all --math fp32 fp16
--profile all --batch-size 1024 --steps 20 --trials 1`.

* Hybridized fp16: MXNet's pointwise fusion ran fc1's ReLU and AMP's cast of fc2's input as one ``_FusedOp``
  (kernel ``FusedKernel_Activation_amp_cast_``; its backward ``FusedKernel__backward_amp_cast__backward_Activation_``),
  so the job's report counted 2 ReLU calls a step where the model has 3 ("calls per step: relu fwd/bwd: expected 3,
  measured 2"). kernelmap/adapters/fused_ops.py attributes a fused op to the model op its kernel's name fuses.
* Both fp16 cases: cuDNN ran some convolutions asked fp16 as FFT or Winograd, whose GEMM multiplies the fp32
  transforms on the FMA units (``sm80_xmma_gemm_cf32cf32_f32f32_cf32_…_ffma``, ``…_f32f32_f32f32_f32_…_ffma``, conv1's
  weight gradient in cuBLAS's ``gemvx::kernel<int, int, float, …>``); the report said fp16 for them (the log's
  types). kernelmath now says fp32. Their tensors are fp16 (the AMP recipe worked; the library chose the algorithm), so
  "math as asked" passes and names them, with their time and share, for the report's first screen.
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from kernelmap.reports import checks as C
from kernelmap.reports import html as H
from kernelmap.reports import mathchecks
from kernelmap.reports.analyses import math as M
from kernelmap.reports.analyses.base import fw_label, load_run

from kernelmap import kernelmath, schema
from kernelmap.adapters import fused_ops, nsys

RUN = Path(__file__).parent / "data" / "gpu_mxnet_fp16_run"
HYB16 = "mxnet-hybridized-fp16/bs1024"
FWD_KERNEL = "FusedKernel_Activation_amp_cast_(unsigned long, op::Shape<(int)2>, op::Shape<(int)2>, op::Shape<(int)2>, __half *, __half *, __half *)"  # noqa: E501
BWD_KERNEL = "FusedKernel__backward_amp_cast__backward_Activation_(unsigned long, op::Shape<(int)2>)"
OPS = fused_ops.VOCABULARIES["mxnet"].ops


def test_a_fused_kernels_name_gives_the_ops_it_fuses():
    assert fused_ops.fused_names(FWD_KERNEL, "FusedKernel_", OPS) == ["Activation", "amp_cast"]
    assert fused_ops.fused_names(BWD_KERNEL, "FusedKernel_", OPS) == ["_backward_amp_cast", "_backward_Activation"]
    assert fused_ops.fused_names("FusedKernel_Activation_my_op_(int)", "FusedKernel_", OPS) is None  # not known
    assert fused_ops.fused_names("void mxnet::op::add_bias_kernel<float>", "FusedKernel_", OPS) is None
    assert fused_ops.model_op([("relu", "fwd"), ("copy", "none")]) == ("relu", "fwd")
    assert fused_ops.model_op([("relu", "fwd"), ("add", "fwd")]) is None  # two model ops: none picked
    assert fused_ops.model_op([("copy", "none")]) is None


_RAW = ["kind", "start_ns", "dur_ns", "correlation_id", "stream", "kernel_name", "op_name", "seq", "shapes", "bytes",
        "library", "library_call", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "device_index", "tid",
        "pid", "framework", "device"]


def _as_exported(rows: pd.DataFrame) -> pd.DataFrame:
    """The nsys adapter's frame before ``label_rows``: the export's own columns of these records (ops, kernels and
    their launches), event ids renumbered as one file's, every label column empty."""
    rows = rows.sort_values(["start_ns", "event_id"], kind="stable").reset_index(drop=True)
    out = pd.DataFrame({c: rows[c] for c in _RAW})
    out["event_id"] = np.arange(len(rows))
    for c in schema.COLUMNS:
        if c not in out:
            out[c] = pd.Series(pd.NA, index=out.index, dtype=schema.DTYPES[c])
    return out[list(schema.COLUMNS)]


@pytest.fixture(scope="module")
def hybridized_fp16_nsys() -> pd.DataFrame:
    rec = schema.read_parquet(RUN / "records.parquet")
    return rec[(rec["run"] == HYB16) & (rec["source"] == "nsys")]


def test_the_nsys_adapter_labels_a_fused_relu_a_relu(hybridized_fp16_nsys, monkeypatch):
    raw = hybridized_fp16_nsys
    names = collections.Counter(n.split("(")[0] for n in raw["kernel_name"].dropna() if n.startswith("FusedKernel_"))
    assert names == {"FusedKernel_Activation_amp_cast_": 20, "FusedKernel__backward_amp_cast__backward_Activation_": 20}
    df = _as_exported(raw)
    nsys.label_rows(df, None, "mxnet")
    ops = df[df["kind"] == "op"]
    relu = collections.Counter(zip(ops["op_name"], ops["canonical_op"], ops["direction"], strict=True))
    assert {k: v for k, v in relu.items() if k[1] == "relu"} == {
        ("Activation", "relu", "fwd"): 40, ("_FusedOp", "relu", "fwd"): 20,
        ("_backward_Activation", "relu", "bwd"): 40, ("_FusedOp", "relu", "bwd"): 20}
    k = df[df["kernel_name"].astype(str).str.startswith("FusedKernel_")]
    assert collections.Counter(zip(k["canonical_op"], k["direction"], k["library"], strict=True)) == {
        ("relu", "fwd", "native"): 20, ("relu", "bwd", "native"): 20}
    # without the attribution (the job's normaliser) the fused op is no relu
    monkeypatch.setattr(fused_ops, "attribute", lambda df, framework: 0)
    df = _as_exported(raw)
    nsys.label_rows(df, None, "mxnet")
    assert set(df.loc[df["op_name"] == "_FusedOp", "canonical_op"]) == {"other"}


def _calls(run) -> pd.DataFrame:
    c = pd.DataFrame(C.self_checks([run]))
    return c[c["check"] == C.Check.CALLS]


def test_calls_per_step_count_the_fused_relu(hybridized_fp16_nsys):
    # the records as the job normalised them (its report: "relu fwd/bwd: expected 3, measured 2"): the fused ops'
    # parts unread, the short counts are not judged now, and say why
    calls = _calls(load_run(RUN))
    short = calls[calls["status"] != C.PASS]
    assert list(zip(short["framework"], short["subject"], short["measured"], short["status"], strict=True)) == [
        ("mxnet-hybridized-fp16", "relu fwd", 2.0, C.NOT_CHECKED), ("mxnet-hybridized-fp16", "relu bwd", 2.0, C.NOT_CHECKED)]
    assert short["detail"].str.endswith("; 2 fused op(s) a step (_FusedOp) whose parts this trace does not name: "
                                        "an op they fuse is not counted").all()
    rows = hybridized_fp16_nsys.copy()
    assert fused_ops.attribute(rows, "mxnet") == 40

    def attributed(run):
        rec = run.records
        idx = rec.index[(rec["run"] == HYB16) & (rec["source"] == "nsys")]
        assert (rec.loc[idx, "event_id"].to_numpy() == rows["event_id"].to_numpy()).all()
        for col in ("canonical_op", "direction"):
            rec.loc[idx, col] = rows[col].to_numpy()
        return run

    calls = _calls(attributed(load_run(RUN)))  # a fresh run: one keeps its timed events once read
    assert len(calls) == 32 and set(calls["status"]) == {C.PASS}
    relu = calls[(calls["framework"] == "mxnet-hybridized-fp16") & calls["subject"].str.startswith("relu")]
    assert list(relu["measured"]) == [3.0, 3.0]
    # a relu really missing (every fused op read) still fails: the 20 first forward Activations planted as "other"
    run = attributed(load_run(RUN))
    rec = run.records
    act = rec.index[(rec["run"] == HYB16) & (rec["source"] == "nsys") & (rec["op_name"] == "Activation")][::2]
    rec.loc[act, "canonical_op"] = "other"
    calls = _calls(run)
    bad = calls[calls["status"] != C.PASS]
    assert list(zip(bad["subject"], bad["measured"], bad["status"], strict=True)) == [("relu fwd", 2.0, C.FAIL)]


def _filled(run) -> dict[str, dict]:
    """``kernelmath.fill`` on each of the run's cases' records (event ids are a case's own), as normalise does."""
    rec, said, parts = run.records, {}, []
    for name, g in rec.groupby("run", observed=True, sort=False):
        g = g.copy()
        said[str(name)] = kernelmath.fill(g)
        parts.append(g)
    run.records = pd.concat(parts).loc[rec.index]
    return said


@pytest.mark.parametrize("name, math", [
    ("sm80_xmma_gemm_cf32cf32_f32f32_cf32_tn_n_tilesize64x64x8_stage3_warpsize2x2x1_ffma_aligna8_alignc8_execute_kernel"
     "__5x_cublas", "fp32"),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x256x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_kernel"
     "__5x_cublas", "fp32"),
    ("std::enable_if<!T7, void>::type internal::gemvx::kernel<int, int, float, float, float, float, (bool)0, (bool)1, "
     "(bool)0, (bool)0, (int)9, (bool)0, cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<const float>, "
     "cublasGemvTensorStridedBatched<const float>, cublasGemvTensorStridedBatched<float>, float>>(T13)", "fp32"),
    ("void implicit_convolve_sgemm<__half, __half, (int)128, (int)5, (int)5, (int)3, (int)3, (int)3, (int)1, (bool)0, "
     "(bool)0, (bool)1>(int, int)", "fp16"),
    ("void cudnn::winograd_nonfused::winogradForwardData4x4<float, __half>(cudnn::winograd_nonfused::"
     "WinogradDataParams<T1, T2>)", None),
    ("void fft2d_r2c_16x16<__half>(float2 *, const T1 *, int, int, int, int, int, int, int, int)", None),
])
def test_names_of_the_fp16_cases_kernels(name, math):
    assert kernelmath.name_math(name) == math


def test_fp16_convolutions_that_multiplied_fp32_are_the_librarys_choice():
    before = pd.DataFrame(mathchecks.math_checks(load_run(RUN)))  # as the job normalised them: every product "fp16"
    assert set(before["status"]) == {C.PASS}
    run = load_run(RUN)
    said = _filled(run)
    # the kernels whose call said fp16 and whose name says fp32 operands: the FFT/Winograd GEMMs, conv1's gemv
    assert {k: v["kernels_math_from_name"] for k, v in said.items()} == {
        "mxnet/bs1024": 0, "mxnet-fp16/bs1024": 80, "mxnet-hybridized/bs1024": 0, "mxnet-hybridized-fp16/bs1024": 60}
    rec = run.records
    named = rec[(rec["kind"] == "kernel") & (rec["math_source"] == "name")]
    assert collections.Counter(zip(named["case"], named["layer"], named["direction"], named["math_ran"],
                                   named["math_unit"].fillna("NA"), strict=True)) == {
        ("mxnet-fp16", "conv1", "bwd_weight", "fp32", "NA"): 20,  # gemvx: no unit by name
        ("mxnet-fp16", "conv2", "bwd_data", "fp32", "fma"): 20, ("mxnet-fp16", "conv2", "bwd_weight", "fp32", "fma"): 20,
        ("mxnet-fp16", "conv2", "fwd", "fp32", "fma"): 20,
        ("mxnet-hybridized-fp16", "conv1", "bwd_weight", "fp32", "NA"): 20,
        ("mxnet-hybridized-fp16", "conv2", "bwd_weight", "fp32", "fma"): 20,
        ("mxnet-hybridized-fp16", "conv2", "fwd", "fp32", "fma"): 20}
    table = M.math_table([run])
    cf32 = table[(table["case"] == "mxnet-fp16") & (table["layer"] == "conv2") & (table["direction"] == "fwd")
                 & (table["math_unit"] == "fma")]
    assert list(cf32["math_ran"]) == ["fp32"] and list(cf32["math_source"]) == ["name"]
    checks = pd.DataFrame(mathchecks.math_checks(run))
    asked = checks[checks["check"] == C.Check.MATH_AS_ASKED].set_index("framework")
    assert dict(asked["status"]) == {"mxnet": C.PASS, "mxnet-fp16": C.PASS, "mxnet-hybridized": C.PASS,
                                     "mxnet-hybridized-fp16": C.PASS}
    assert dict(asked["measured"]) == {"mxnet": "fp32", "mxnet-fp16": "fp16/fp32", "mxnet-hybridized": "fp32",
                                       "mxnet-hybridized-fp16": "fp16/fp32"}
    # every call's tensors fp16 (x/w/y, dy/dx, x/dy/dw in the log): cuDNN's FFT, Winograd and implicit GEMM computed
    # fp32, named with their algorithm and time: not a failure of the recipe
    d = asked.loc["mxnet-fp16", "detail"]
    assert d.startswith("5 of 11 conv/linear products (layer x direction) ran kernels that compute in fp32 on fp16 "
                        "tensors, the algorithms cuDNN chose: conv1 bwd_weight cudnnConvolutionBackwardFilter "
                        "WINOGRAD_NONFUSED 0.227 ms/step; conv1 fwd cudnnConvolutionForward IMPLICIT_PRECOMP_GEMM "
                        "0.081 ms/step; conv2 bwd_data cudnnConvolutionBackwardData FFT 0.141 ms/step; conv2 bwd_weight "
                        "cudnnConvolutionBackwardFilter FFT 0.220 ms/step; conv2 fwd cudnnConvolutionForward FFT "
                        "0.166 ms/step (0.835 ms/step, 31.2% of library-kernel time); as ran: ")
    assert asked.loc["mxnet-hybridized-fp16", "detail"].startswith("4 of 11 conv/linear products")
    # conv1's forward ran fp16 operands on the FMA units (implicit_convolve_sgemm<__half>): named there too
    assert d.endswith("on FMA units, no tensor core (kernel names), 30.2% of the conv/linear kernels' time: "
                      "conv1 fwd cudnnConvolutionForward fp16 0.081 ms/step; conv2 bwd_data cudnnConvolutionBackwardData "
                      "fp32 0.062 ms/step; conv2 bwd_weight cudnnConvolutionBackwardFilter fp32 0.086 ms/step; conv2 fwd "
                      "cudnnConvolutionForward fp32 0.074 ms/step")
    # the first screen: no failure, a line a case for the library's fp32
    assert H.failure_lines(checks, C.FAIL, fw_label, C.Check.MATH_AS_ASKED) == []
    lines = mathchecks.first_screen_lines(checks, fw_label)
    assert [line.split(": ")[0] for line in lines] == ["MXNet fp16 bs 1024", "MXNet hybridized fp16 bs 1024"]
    assert lines[0] == f"MXNet fp16 bs 1024: {d.split(mathchecks.STATEMENT_END)[0]}"
