"""The math column (issue 38): what each library call and kernel ran, from real logs, HLO and names.

Counts are taken from the source files with this module's own stdlib readers and compared with the adapters'
``math_ran``; the two checks (``math as asked``, ``math known``) pass on the real H200 fp32 run and fail
where its records are made to say otherwise.
"""

from __future__ import annotations

import collections
import gzip
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from kernelmap.reports.analyses import math as M
from kernelmap.reports.analyses.base import load_run
from kernelmap.reports.mathchecks import math_checks

from kernelmap import kernelmath, schema
from kernelmap.adapters import cublas_log, cublaslt_log, cudnn_log, mathtypes, onednn, xla_trace
from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data"
BF16 = DATA / "cpu_onednn_bf16"
EXCERPTS = DATA / "gpu_math_excerpts"
LINK = DATA / "gpu_link_run" / "all"


def _text(path: Path) -> str:
    raw = path.read_bytes()
    return (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()


# --- the CPU: oneDNN's verbose log, recorded here under bf16 autocast ------------------------------
def _onednn_by_hand(path: Path) -> collections.Counter:
    """(primitive, math) per exec line: the product's operands' type (conv/matmul: src and wei forward,
    dst and wei for the data gradient, src and dst for the weights'), a reorder its src's."""
    out: collections.Counter = collections.Counter()
    for line in _text(path).splitlines():
        f = line.split(",")
        if len(f) < 6 or f[3] != "exec":
            continue
        prim, prop, mds = f[5], f[7], f[8]
        types = dict(re.findall(r"\b(src|wei|dst):(\w+?):", mds))
        names = {"backward_data": ("dst", "wei"), "backward_weights": ("src", "dst")}.get(prop, ("src", "wei"))
        names = names if prim in ("convolution", "matmul") else ("src",)
        kinds = {types[n] for n in names}
        out[(prim, {"bf16": "bf16", "f32": "fp32"}[kinds.pop()] if len(kinds) == 1 else "mixed")] += 1
    return out


@pytest.mark.parametrize("name, expected", [
    ("onednn_bf16.log.gz", {("convolution", "bf16"): 10, ("matmul", "bf16"): 12, ("reorder", "bf16"): 30}),
    ("onednn_fp32.log.gz", {("convolution", "fp32"): 10, ("reorder", "fp32"): 30}),
])
def test_onednn_math_matches_an_independent_reading(name, expected):
    df = onednn.read(BF16 / name)
    got = collections.Counter(zip(df["op_name"], df["math_ran"], strict=True))
    assert got == _onednn_by_hand(BF16 / name) == expected
    assert set(df["math_source"]) == {"log"}
    conv = df[df["op_name"] == "convolution"]
    assert conv["math_dtypes"].str.contains("wei=" + ("bf16" if "bf16" in name else "fp32")).all()


def test_onednn_fpmath_and_mixed_operands():
    # oneDNN's own line shape (v3), its md and attr fields as its verbose documentation names them
    ok = ("onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx512_core,undef,src:f32::blocked:ab::f0 "
          "wei:f32::blocked:ab::f0 dst:f32::blocked:ab::f0,attr-fpmath:bf16,,16x128:128x10,0.1")
    assert onednn._math("matmul", "undef", ok.split(",")[8], ok.split(",")[9]) == ("bf16", "src=fp32 wei=fp32 "
                                                                                   "dst=fp32 fpmath=bf16")
    assert onednn._math("matmul", "undef", "src:bf16::blocked:ab::f0 wei:f32::blocked:ab::f0", "")[0] == "mixed"


# --- the GPU logs: cuDNN, cuBLAS, cuBLASLt ----------------------------------------------------------
@pytest.mark.parametrize("path, math, n", [
    (LINK / "pytorch" / "bs64" / "cudnn.log.gz", "fp32", 105),  # fp32 run: NVIDIA_TF32_OVERRIDE=0
    (DATA / "gpu_cudnn.log.gz", "tf32", 20),  # an earlier run with PyTorch's TF32 convolutions on
])
def test_cudnn_math_follows_each_calls_enable_tf32(path, math, n):
    text = _text(path)
    flags = collections.Counter(re.findall(r"enable_tf32: type=bool; val=(\w+);", text))
    df = cudnn_log.read(path)
    conv = df[df["canonical_op"] == "conv2d"]
    assert flags == {("true" if math == "tf32" else "false"): n}
    assert len(conv) == n and set(conv["math_ran"]) == {math}
    assert text.count("CUDNN_DATA_FLOAT") and "CUDNN_DATA_HALF" not in text
    assert conv["math_dtypes"].str.contains("compute=fp32").all()


def test_cudnn_half_precision_excerpts():
    df = cudnn_log.read(EXCERPTS / "cudnn_fp16_v8.log")
    assert list(df["library_call"]) == ["cudnnConvolutionForward", "cudnnConvolutionBackwardData"]
    assert list(df["math_ran"]) == ["fp16", "fp16"]
    assert list(df["math_mode"]) == ["fp16", "fp16"]  # read tf32 from the float compute type before issue 38
    assert list(df["math_dtypes"]) == ["x=fp16 w=fp16 compute=fp32", "w=fp16 dy=fp16"]


def test_cublas_tf32_mode_and_the_override():
    path = LINK / "mxnet" / "bs64" / "cublas.log.gz"
    text = _text(path)
    blocks = text.split("I! cuBLAS")
    sgemm_tf32 = sum(1 for b in blocks if "cublasSgemmEx(" in b and "MathMode=CUBLAS_TF32_TENSOR_OP_MATH" in b)
    df = cublas_log.read(path)
    assert sgemm_tf32 == 126 and len(df) == 126 and set(df["math_ran"]) == {"tf32"}
    assert kernelmath.apply_override(df, ["0"]) == 126  # the run's cuDNN log: NVIDIA_TF32_OVERRIDE=0
    assert set(df["math_ran"]) == {"fp32"} and df["math_dtypes"].str.endswith("NVIDIA_TF32_OVERRIDE=0").all()
    assert cudnn_log.read(LINK / "mxnet" / "bs64" / "cudnn.log.gz").attrs["tf32_override"] == ["0"]


def test_cublas_gemmex_without_its_mode_is_unknown_until_the_override():
    df = cublas_log.read(EXCERPTS / "cublas_gemmex_v11.log")
    assert df["math_ran"].isna().all() and df["math_dtypes"].iat[0] == "a=fp32 b=fp32 c=fp32 compute=fp32 tf32=unknown"
    assert kernelmath.apply_override(df, ["1"]) == 0 and kernelmath.apply_override(df, ["0"]) == 1
    assert df["math_ran"].iat[0] == "fp32"


def test_cublaslt_types_from_the_matrix_layouts(tmp_path):
    path = LINK / "pytorch" / "bs64" / "cublaslt.log.gz"
    text = _text(path)
    traced = re.findall(r"\[Trace\]\[cublasLtMatmul\] .*Adesc=\[type=(\w+).*Bdesc=\[type=(\w+).*computeType=(\w+)",
                        text)
    df = cublaslt_log.read(path)
    assert collections.Counter(traced) == {("R_32F", "R_32F", "COMPUTE_32F"): 63}
    assert (df["math_ran"] == "fp32").sum() == 63 and df["math_ran"].isna().sum() == len(df) - 63
    # one real line with its types as cuBLASLt's documentation names them (bf16 in, fp32 accumulate; TF32)
    line = next(ln for ln in text.splitlines() if "[Trace][cublasLtMatmul]" in ln)
    api = next(ln for ln in text.splitlines() if "[Api][cublasLtMatmul]" in ln)
    edited = {"bf16": line.replace("type=R_32F", "type=R_16BF", 2),
              "tf32": line.replace("computeType=COMPUTE_32F ", "computeType=COMPUTE_32F_FAST_TF32 "),
              "mixed": line.replace("type=R_32F", "type=R_16BF", 1)}
    for math, ln in edited.items():
        f = tmp_path / f"{math}.log"
        f.write_text(f"{api}\n{ln}\n")
        assert cublaslt_log.read(f)["math_ran"].tolist() == [math]


def test_documented_type_names():
    assert [mathtypes.type_name(t) for t in ("CUDNN_DATA_BFLOAT16 (9)", "CUDA_R_16BF(14)", "R_16F", "bf16")] == \
        ["bf16", "bf16", "fp16", "bf16"]
    assert mathtypes.compute_math("CUBLAS_COMPUTE_32F_FAST_16BF(75)") == "bf16"
    assert mathtypes.ran(["fp32", "fp32"], None) is None  # TF32 unknown: no math, never a guess
    assert mathtypes.ran(["fp32", "fp32"], True) == "tf32"
    assert mathtypes.ran(["bf16", "bf16"], None) == "bf16"
    assert mathtypes.ran(["bf16", "fp32"], False) == "mixed"


# --- XLA's HLO text; names -------------------------------------------------------------------------
def test_hlo_calls_math():
    df = xla_trace.read(DATA / "jax_gpu" / "trace.json.gz")
    calls = df[df["kind"] == "library_call"]
    text = _text(DATA / "jax_gpu" / "jit__train_step.hlo.txt.gz")
    default_math = len(re.findall(r'custom_call_target="__cudnn\$\w+".*"math_type":"DEFAULT_MATH"', text))
    cudnn = calls[calls["library_call"].str.startswith("__cudnn$")]
    gemm = calls[calls["library_call"] == "__cublas$lt$matmul"]
    assert default_math == 5 and cudnn["op_name"].nunique() == 5
    assert cudnn["math_ran"].isna().all() and cudnn["math_dtypes"].str.endswith("tf32=unknown").all()
    assert len(gemm) == 10 and set(gemm["math_ran"]) == {"fp32"} and set(gemm["math_source"]) == {"hlo"}
    assert kernelmath.apply_override(calls.copy(), ["0"]) == len(cudnn)


@pytest.mark.parametrize("name, math", [
    ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x64x32_stage5_warpsize2x2x1_g1", "tf32"),
    ("sm90_xmma_dgrad_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x64x32_warpgroupsize1x1x1_g1", "tf32"),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nt_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4", "fp32"),
    ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_64x64_32x10_nhwc_align8>", "bf16"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_f16_s161616gemm_f16_32x32_128x2_tn_align2>(T1::Params)", "fp16"),
    ("void implicit_convolve_sgemm<__nv_bfloat16, __nv_bfloat16, 128, 5, 5, 3, 3, 3, 1, 0, 0, 1>(int, int)", "bf16"),
    ("sgemm_largek_lds64", "fp32"),
    ("void cudnn::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, 0, 1, 0>", None),
    ("nvjet_sm90_tst_64x32_64x16_2x2_h_bz_splitK_bias_TNT", None),
    ("void fft2d_r2c_16x16<float>(float2 *, const T1 *, int, int)", None),
])
def test_kernel_names_that_spell_their_math(name, math):
    # real names: our H200 traces (tf32/fp32) and today's ncu probe of bf16/fp16 steps (.gpu-out/ncu-probe)
    assert kernelmath.name_math(name) == math


# --- a real run normalised: every kernel its call's math; the checks -------------------------------
@pytest.fixture(scope="module")
def link_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("math") / "all"
    shutil.copytree(LINK, run)
    summary = normalise_run_dir(run)
    return run, summary


def test_normalised_run_math_and_checks(link_run):
    run_dir, summary = link_run
    runs = summary["runs"]
    assert runs["mxnet/bs64"]["tf32_overridden_calls"] == 126  # MXNet's SgemmEx under TF32 mode, overridden
    rec = schema.read_parquet(run_dir / "records.parquet")
    calls = rec[rec["kind"] == "library_call"]
    assert set(calls["math_ran"].dropna()) == {"fp32"}  # the fp32 run: no call ran TF32
    kern = rec[(rec["kind"] == "kernel") & rec["call_event_id"].notna()]
    by_id = calls.drop_duplicates(["run", "event_id"]).set_index(["run", "event_id"])["math_ran"]
    own = by_id.reindex(pd.MultiIndex.from_arrays([kern["run"], kern["call_event_id"]])).to_numpy()
    with_math = pd.notna(own)
    assert (kern["math_ran"].to_numpy()[with_math] == own[with_math]).all()
    checks = pd.DataFrame(math_checks(load_run(run_dir)))
    status = collections.Counter(zip(checks["check"], checks["status"], strict=True))
    assert status == {("math as asked", "pass"): 9, ("math known", "pass"): 9}


# MXNet bs 1024: its nsys pass autotuned conv2's backward to FFT kernels the libs pass did not run (the normalise
# summary's unlinked lines): 20 calc_bias_diff, 80 fft2d_r2c, 40 fft2d_c2r, 20 flip_filter, 40 cgemm (named fp32)
OP_FILLED = {"calc_bias_diff_nchw_packed": 20, "fft2d_r2c_16x16": 80, "fft2d_c2r_16x16": 40, "flip_filter": 20}


def _op_filled(rec: pd.DataFrame) -> collections.Counter:
    k = rec[(rec["kind"] == "kernel") & (rec["math_source"] == "op")]
    return collections.Counter(re.match(r"(?:void )?(\w+)", n)[1] for n in k["kernel_name"])


def test_unlinked_library_kernels_take_the_one_math_of_their_ops_calls(link_run):
    run_dir, summary = link_run
    assert {r: v["kernels_math_from_op"] for r, v in summary["runs"].items() if v["kernels_math_from_op"]} == \
        {"mxnet/bs1024": sum(OP_FILLED.values())}
    rec = schema.read_parquet(run_dir / "records.parquet")
    assert _op_filled(rec) == OP_FILLED
    assert set(rec.loc[rec["math_source"] == "op", "math_ran"]) == {"fp32"}  # conv2's logged calls: all fp32
    # calls of two maths leave the kernels unknown: conv2's backward-data calls said tf32, the bias kernels (their
    # own direction, bwd_bias) keep fp32, the coarse 'bwd' kernels (data or filter) are left NA
    rec.loc[rec["math_source"] == "op", ["math_ran", "math_source"]] = pd.NA
    conv2 = (rec["kind"] == "library_call") & (rec["run"] == "mxnet/bs1024") & (rec["layer"] == "conv2")
    rec.loc[conv2 & (rec["direction"] == "bwd_data"), "math_ran"] = "tf32"
    assert kernelmath.from_op(rec) == 20 and _op_filled(rec) == {"calc_bias_diff_nchw_packed": 20}


def test_math_known_fails_naming_the_kernels_without_math(link_run):
    run = load_run(link_run[0])
    rec = run.records
    rec.loc[rec["math_source"] == "op", "math_ran"] = pd.NA  # as normalised before OP_RULE: 94.6% known (calc_bias_diff: no product)
    checks = pd.DataFrame(math_checks(run))
    fail = checks[(checks["check"] == "math known") & (checks["status"] == "FAIL")]
    assert list(zip(fail["framework"], fail["batch_size"], fail["measured"], strict=True)) == [("mxnet", 1024, "94.6%")]
    assert "fft2d_r2c_16x16" in fail["detail"].iat[0] and "calc_bias_diff" not in fail["detail"].iat[0]  # no product


def test_math_as_asked_fails_where_a_conv_ran_other_math(link_run):
    run = load_run(link_run[0])
    rec = run.records
    hit = (rec["framework"] == "pytorch") & (rec["batch_size"] == 64) & (rec["layer"] == "conv1") & \
        (rec["direction"] == "fwd") & (rec["kind"] == "kernel") & rec["math_ran"].notna()
    assert hit.sum() > 0
    rec.loc[hit, "math_ran"] = "tf32"
    checks = pd.DataFrame(math_checks(run))
    bad = checks[(checks["check"] == "math as asked") & (checks["status"] == "FAIL")]
    assert list(zip(bad["framework"], bad["batch_size"], strict=True)) == [("pytorch", 64)]
    assert "conv1 fwd cudnnBackendExecute ran tf32" in bad["detail"].iat[0] and bad["expected"].iat[0] == "fp32"


def test_math_known_not_checked_without_the_libs_pass_calls(link_run):
    """A case whose calls were never logged (no libs pass: the H200's --profile framework run at bs 64 read 40-49%
    from kernel names alone) is not checked and says why; with its calls kept but their kernels unknown it fails."""
    run = load_run(link_run[0])
    rec = run.records
    case = (rec["framework"] == "mxnet") & (rec["batch_size"] == 1024)
    rec.loc[rec["math_source"] == "op", "math_ran"] = pd.NA  # 94.6% known, as in the failing test above
    run.records = rec[~(case & (rec["kind"] == "library_call"))].reset_index(drop=True)
    checks = pd.DataFrame(math_checks(run))
    known = checks[(checks["check"] == "math known") & (checks["framework"] == "mxnet") & (checks["batch_size"] == 1024)]
    assert known["status"].tolist() == ["not checked"] and known["measured"].tolist() == ["94.6%"]
    assert "libs pass" in known["detail"].iat[0]
    assert set(checks.loc[checks["check"] == "math known", "status"]) == {"pass", "not checked"}


def test_math_known_not_checked_on_records_without_math(link_run):
    run = load_run(link_run[0])
    run.records["math_ran"] = pd.array([pd.NA] * len(run.records), dtype=schema.DTYPES["math_ran"])
    checks = pd.DataFrame(math_checks(run))
    known = checks[checks["check"] == "math known"]
    assert set(known["status"]) == {"not checked"} and known["detail"].str.contains("re-normalise").all()
    assert M.COVERAGE_GOAL == 0.99


def test_the_banner_names_a_math_failure_first():
    from kernelmap.reports import checks as C

    rows = [C.check_row("r", "mxnet", 64, c, "s", 1, 2, C.FAIL, "d") for c in
            (C.Check.CALLS, C.Check.TRACED_STEPS, C.Check.TIME_WITHIN_STEP)]
    rows.append(C.check_row("r", "pytorch", 64, C.Check.MATH_AS_ASKED, "conv/linear products", "bf16", "fp32", C.FAIL,
                            "asked bf16: conv1 fwd cudnnBackendExecute ran fp32 (0.010 ms/step)"))
    said = C.causes(pd.DataFrame(rows, columns=C.COLUMNS))
    assert len(said) == 3 and said[0].startswith("math as asked: PyTorch bs 64") and "ran fp32" in said[0]
    assert said[1].startswith("calls per step")


def test_a_tf32_calls_fma_kernels_ran_fp32():
    """The earlier H200 run with PyTorch's TF32 convolutions on (tests/data/gpu_kineto + its libs logs): every
    cuDNN call permitted TF32, yet only the xmma ..._tf32f32_... kernels ran it; cuDNN's FP32-FMA kernels
    (implicit_convolve_sgemm<float>, the sm80 ..._f32f32_f32f32_..._ffma gemm of its Winograd wgrad, the legacy
    wgrad_alg0_engine<float>) ran fp32."""
    from kernelmap.calllink import short_name
    from kernelmap.normalise import normalise

    files = ["gpu_kineto.json.gz", "gpu_cudnn.log.gz", "gpu_cublas.log.gz", "gpu_cublaslt.log.gz"]
    df, summary = normalise([DATA / f for f in files], run="gpu")
    k = df[(df["kind"] == "kernel") & (df["library"] == "cuDNN")]
    got = collections.Counter(zip(k["kernel_name"].map(short_name), k["math_ran"].fillna("NA"),
                                  k["math_source"].fillna("NA"), strict=True))
    def n(prefix: str, math: str, src: str) -> int:
        return sum(c for (name, m, s), c in got.items() if name.startswith(prefix) and (m, s) == (math, src))

    assert n("sm80_xmma_fprop_implicit_gemm_tf32f32", "tf32", "log") == 5
    assert n("sm90_xmma_dgrad_implicit_gemm_f32f32_tf32f32", "tf32", "log") == 5
    assert n("implicit_convolve_sgemm", "fp32", "name") == 5
    assert n("sm80_xmma_gemm_f32f32_f32f32", "fp32", "name") == 5  # the Winograd wgrad's gemm
    assert n("wgrad_alg0_engine", "fp32", "name") == 5  # the legacy SIMT weight gradient: <float, ...>
    # the rest keep their call's permission (layout and Winograd transforms): the names say no type
    assert {n for (name, m, src), n in got.items() if src == "log"} and not any(
        m == "fp32" for (_, m, src) in got if src == "log")
    assert summary["runs"]["gpu"]["kernels_math_from_name"] == 15 and len(k) == 65


def test_asked_tf32_allows_fp32_fma_not_bf16():
    rows = pd.DataFrame([
        {"case": "pytorch", "batch_size": 64, "math_asked": "tf32", "canonical_op": "conv2d", "layer": "conv1",
         "direction": "fwd", "library_call": "cudnnBackendExecute", "math_ran": m, "ms_per_step": 0.1}
        for m in ("tf32", "fp32", "bf16", "unknown")])
    assert list(M.math_mismatches(rows)["math_ran"]) == ["bf16"]
    assert list(M.math_mismatches(rows.assign(math_asked="fp32"))["math_ran"]) == ["tf32", "bf16"]


def test_cpu_run_asked_bf16_fails_where_onednn_ran_fp32(tmp_path):
    """The real CPU run (tests/data/cpu_run_all, fp32): its oneDNN convolutions and MKL gemms ran fp32 as asked;
    the same records under a bf16 case fail 'math as asked', naming the conv that ran fp32."""
    run_dir = tmp_path / "cpu_run_all"
    shutil.copytree(DATA / "cpu_run_all", run_dir)
    normalise_run_dir(run_dir)
    run = load_run(run_dir)
    ok = pd.DataFrame(math_checks(run))
    assert set(zip(ok["check"], ok["status"], strict=True)) == {("math as asked", "pass"), ("math known", "pass")}
    run.records["math"] = pd.array(["bf16"] * len(run.records), dtype=schema.DTYPES["math"])
    bad = pd.DataFrame(math_checks(run))
    bad = bad[(bad["check"] == "math as asked")]
    assert list(bad["status"]) == ["FAIL", "FAIL"] and list(bad["measured"]) == ["fp32", "fp32"]
    assert bad["detail"].str.contains("conv1 fwd convolution forward_training ran fp32").all()


def test_a_real_cpu_bf16_run(tmp_path):
    """kernelmap's own PyTorch --math bf16 run (tests/data/cpu_bf16_run): every oneDNN call ran bf16 (the stdlib
    count of its exec lines' types), 'math as asked' and 'math known' pass; under an fp32 label the products fail."""
    run_dir = tmp_path / "run"
    shutil.copytree(DATA / "cpu_bf16_run", run_dir)
    normalise_run_dir(run_dir)
    log = run_dir / "pytorch-bf16" / "bs16" / "onednn.log.gz"
    by_hand = _onednn_by_hand(log)
    assert by_hand == {("convolution", "bf16"): 20, ("matmul", "bf16"): 24, ("reorder", "bf16"): 60}
    run = load_run(run_dir)
    calls = run.records[run.records["kind"] == "library_call"]
    assert collections.Counter(zip(calls["op_name"], calls["math_ran"], strict=True)) == by_hand
    checks = pd.DataFrame(math_checks(run))
    assert list(zip(checks["check"], checks["status"], checks["measured"], strict=True)) == [
        ("math as asked", "pass", "bf16"), ("math known", "pass", "100.0%")]
    run.records["math"] = pd.array(["fp32"] * len(run.records), dtype=schema.DTYPES["math"])
    bad = pd.DataFrame(math_checks(run))
    assert bad["status"].iat[0] == "FAIL" and "ran bf16" in bad["detail"].iat[0]
