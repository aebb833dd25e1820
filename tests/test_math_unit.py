"""``math_unit`` (issue 38): the unit each kernel's products ran on, by its name (``kernelmath.name_unit``), checked
against hardware counters.

The counters: tests/data/ncu's two real H200 captures (``ncu --csv --page raw``, one PyTorch training step's
forward and optimizer at bs 64 under autocast bf16 / fp16: tests/data/ncu/README.md), read here by the stdlib's
``csv`` (not ``kernelmap/adapters/ncu.py``). The counters' unit of a kernel:

* ``tensor``: tensor-core math ran: ``sm__ops_path_tensor_src_*`` > 0, or matrix instructions on the tensor pipe
  (HGMMA: ``..._op_gmma``; HMMA: ``..._op_hmma`` less its HFMA2.MMA). ``..._op_hmma`` also counts HFMA2.MMA, an FMA
  of two halves the compiler issues to the tensor pipe as a register move; a warp's one counts 32 thread HFMA.
  In both captures every kernel has either no HFMA or exactly 32 HFMA per non-GMMA tensor-pipe instruction (an
  assertion below), so the split is exact: HFMA = 0 -> all HMMA; HFMA = 32 x -> all moves.
* ``fma``: no tensor-core math, and FFMA, or HFMA that are not those moves.
* ``none``: neither (a kernel of FADD/FMUL only: a reduction, a layout transpose's scale by alpha).

A raw tensor-pipe count > 0 would call cuDNN's ``implicit_convolve_sgemm`` (conv1's forward, C_in = 1: 21,952
tensor-pipe instructions, all HFMA2.MMA; 0 bf16 tensor ops; 25,690,112 FFMA) tensor: the test shows it.
"""

from __future__ import annotations

import collections
import csv
import io
import lzma
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from kernelmap import kernelmath, schema

DATA = Path(__file__).parent / "data"
NCU = DATA / "ncu"
HMMA = "smsp__inst_executed_pipe_tensor_op_hmma.sum"  # warp instructions: HMMA + HFMA2.MMA + HGMMA
GMMA = "sm__inst_executed_pipe_tensor_op_gmma.sum"
PIPE = "sm__inst_executed_pipe_tensor.sum"
FFMA = "sm__sass_thread_inst_executed_op_ffma_pred_on.sum"
HFMA = "sm__sass_thread_inst_executed_op_hfma_pred_on.sum"
OPS = "sm__ops_path_tensor_src_"


def ncu_kernels(path: Path) -> list[dict]:
    """One dict per profiled kernel: its name and the ``.sum`` counters as integers (the units row skipped)."""
    lines = lzma.decompress(path.read_bytes()).decode().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith('"ID","Process ID"'))
    rows = list(csv.reader(io.StringIO("\n".join(lines[head:]))))
    header, body = rows[0], rows[2:]
    out = []
    for row in body:
        assert len(row) == len(header)
        f = dict(zip(header, row, strict=True))
        k = {c: int(float(v.replace(",", ""))) for c, v in f.items() if c.endswith(".sum") and c.startswith("sm")}
        k["name"] = f["Kernel Name"]
        out.append(k)
    return out


def counter_unit(k: dict) -> str:
    """``tensor`` | ``fma`` | ``none`` from the counters (module docstring)."""
    non_gmma = k[HMMA] - k[GMMA]
    assert k[HFMA] in (0, 32 * non_gmma), k["name"]  # HFMA2.MMA moves, or no HFMA at all: the split is exact
    mma = k[GMMA] + (non_gmma if k[HFMA] == 0 else 0)
    tensor_ops = sum(v for c, v in k.items() if c.startswith(OPS))
    if mma or tensor_ops:
        return "tensor"
    real_hfma = k[HFMA] - 32 * non_gmma
    return "fma" if k[FFMA] or real_hfma else "none"


def name_unit(name: str) -> str:
    return kernelmath.name_unit(name) or "NA"


# (unit by name, unit by counters) -> kernels, per capture (31 and 37 kernels)
AGREEMENT = {
    "bf16": {("tensor", "tensor"): 3, ("fma", "fma"): 1, ("none", "none"): 4,
             ("NA", "fma"): 6, ("NA", "none"): 17},
    "fp16": {("tensor", "tensor"): 3, ("fma", "fma"): 1, ("none", "none"): 4,
             ("NA", "fma"): 6, ("NA", "none"): 23},
}
# the kernels the name rules give a unit, by their short name (the same in both captures but the types)
NAMED = {
    "bf16": {"implicit_convolve_sgemm<__nv_bfloat16": "fma", "cudnn::nchwToNhwcKernel<__nv_bfloat16": "none",
             "cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop": "tensor",
             "cudnn::nhwcToNchwKernel<__nv_bfloat16": "none", "nvjet_sm90_tst_": "tensor",
             "cublasLt::splitKreduce_kernel<": "none", "cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16": "tensor"},
    "fp16": {"implicit_convolve_sgemm<__half": "fma", "cudnn::nchwToNhwcKernel<__half": "none",
             "cutlass__5x_cudnn::Kernel<cutlass_tensorop_f16_s16816fprop": "tensor",
             "cudnn::nhwcToNchwKernel<__half": "none", "nvjet_sm90_hsh_": "tensor",
             "cublasLt::splitKreduce_kernel<": "none", "cutlass::Kernel2<cutlass_80_wmma_tensorop_f16": "tensor"},
}


@pytest.mark.parametrize("math", ["bf16", "fp16"])
def test_name_units_agree_with_the_counters(math):
    kernels = ncu_kernels(NCU / f"ncu-torch-{math}.csv.xz")
    assert len(kernels) == {"bf16": 31, "fp16": 37}[math]  # tests/data/ncu/README.md
    table = collections.Counter((name_unit(k["name"]), counter_unit(k)) for k in kernels)
    assert dict(table) == AGREEMENT[math]
    named = [(k["name"].removeprefix("void "), name_unit(k["name"])) for k in kernels if name_unit(k["name"]) != "NA"]
    by_prefix = {p: {u for n, u in named if n.startswith(p)} for p in NAMED[math]}
    assert by_prefix == {p: {u} for p, u in NAMED[math].items()}
    assert sum(1 for n, _ in named if any(n.startswith(p) for p in NAMED[math])) == len(named) == 8


def test_bf16_instruction_rule_agrees_with_the_tensor_ops():
    """Where the capture has the precision's tensor-op count (bf16; gh100 has no fp16 ``_dst_`` split), the
    instruction rule (HGMMA + HMMA less HFMA2.MMA) calls a kernel tensor exactly where bf16 tensor ops ran."""
    for k in ncu_kernels(NCU / "ncu-torch-bf16.csv.xz"):
        ops = k[OPS + "bf16_dst_fp32.sum"]
        assert (counter_unit({**k, OPS + "bf16_dst_fp32.sum": 0}) == "tensor") == (ops > 0), k["name"]


@pytest.mark.parametrize("math, fma_kernel, pipe, ffma", [
    ("bf16", "implicit_convolve_sgemm<__nv_bfloat16", 21952, 25690112),
    ("fp16", "implicit_convolve_sgemm<__half", 25088, 25690112),
])
def test_a_raw_tensor_pipe_count_would_call_the_fma_conv_tensor(math, fma_kernel, pipe, ffma):
    kernels = ncu_kernels(NCU / f"ncu-torch-{math}.csv.xz")
    (k,) = [k for k in kernels if fma_kernel in k["name"]]
    assert (k[PIPE], k[HMMA], k[HFMA], k[FFMA]) == (pipe, pipe, 32 * pipe, ffma)
    assert sum(v for c, v in k.items() if c.startswith(OPS)) == 0
    assert counter_unit(k) == name_unit(k["name"]) == "fma"
    # the raw rule (any tensor-pipe instruction: tensor) disagrees with the names on these kernels, all with a name
    # unit of fma or none, or none at all
    raw = collections.Counter(name_unit(x["name"]) for x in kernels if x[PIPE] and counter_unit(x) != "tensor")
    assert raw == {"fma": 1, "none": 1, "NA": {"bf16": 9, "fp16": 12}[math]}


def test_rules_on_real_names():
    """Names (shortened) of the 4x H200 bf16 run (tests/data/gpu_bf16_run) and the H200 fp32 runs (gpu_link_run)."""
    cases = {
        "void convolve_common_engine_float_NHWC<__nv_bfloat16, __nv_bfloat16, 128, 5, 5, 3, 3, 3, true>(int)": "fma",
        "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize256x64x32_warpgroupsize1x1x1": "tensor",
        "sm80_xmma_wgrad_implicit_gemm_indexed_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize64x64x64_stage4_warpsize2x2x1"
        "_g1_tensor16x8x16_execute_kernel": "tensor",
        "sm80_xmma_gemm_f32f32_f32f32_f32_nt_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4": "fma",
        "sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize64x64x16": "tensor",
        "void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_nn_align1>(T1::Params)": "fma",
        "void sgemm_largek_lds64<true, false, 5, 5, 4, 4, 4, 34>(float*)": "fma",
        "_ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11MmaTensorOpPolicyE": "tensor",
        "void cutlass__5x_cudnn::Kernel<cutlass__5x_cudnn::reduction::kernel::ReduceSplitK<x>>(T1::Params)": "none",
        "void cask_plugin__5x_cudnn::xmma__5x_cudnn::init_device_workspace_kernel<xmma__5x_cudnn::implicit_gemm::"
        "wgrad_indexed::Warp_specialized<bf16bf16_bf16f32>>()": "none",
        "void flip_filter<float, float>(float*)": "none", "memset32": "none",
        "void calc_bias_diff_nchw_packed<float, float, 4, 128>()": "none",
        # no rule: FFTs, Winograd transforms, cuDNN's legacy engines, framework kernels
        "void fft2d_r2c_16x16<float>(float2*)": "NA", "void wgrad_alg0_engine<float, 128, 5>(int)": "NA",
        "void cudnn::winograd_nonfused::winogradWgradData4x4<float, float>()": "NA",
        "void at::vectorized_elementwise_kernel<8, at::bfloat16_copy_kernel_cuda>()": "NA",
        "cutlass_x_tensorop_sgemm": "NA",  # made up: two rules claim it, so unknown, never guessed
    }
    assert {n: name_unit(n) for n in cases} == cases


def test_normalise_fills_math_unit_on_kernels_only():
    """The earlier H200 TF32 run (tests/data/gpu_kineto + its libs logs), normalised: every kernel's math_unit is its
    name's, every other row NA; its cuDNN kernels by unit."""
    from kernelmap.calllink import short_name
    from kernelmap.normalise import normalise

    files = ["gpu_kineto.json.gz", "gpu_cudnn.log.gz", "gpu_cublas.log.gz", "gpu_cublaslt.log.gz"]
    df, _ = normalise([DATA / f for f in files], run="gpu")
    kern = df["kind"] == "kernel"
    assert df.loc[~kern, "math_unit"].isna().all()
    want = [kernelmath.name_unit(n) for n in df.loc[kern, "kernel_name"]]
    assert [None if pd.isna(u) else u for u in df.loc[kern, "math_unit"]] == want
    k = df[kern & (df["library"] == "cuDNN")]
    got = collections.Counter(zip(k["kernel_name"].map(short_name).str[:40], k["math_unit"].fillna("NA"), strict=True))
    assert dict(got) == {
        ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf", "tensor"): 5, ("sm90_xmma_dgrad_implicit_gemm_f32f32_tf3", "tensor"): 5,
        ("implicit_convolve_sgemm", "fma"): 5, ("sm80_xmma_gemm_f32f32_f32f32_f32_nt_n_ti", "fma"): 5,
        ("cudnn::engines_precompiled::nchwToNhwcKe", "none"): 20, ("cudnn::engines_precompiled::nhwcToNchwKe", "none"): 5,
        ("cudnn::winograd_nonfused::winogradWgradD", "NA"): 10, ("cudnn::winograd_nonfused::winogradWgradO", "NA"): 5,
        ("wgrad_alg0_engine", "NA"): 5}


def test_a_v3_file_without_math_unit_reads_with_it_na(tmp_path):
    df = schema.conform(pd.DataFrame({"kind": ["kernel"], "kernel_name": ["memset32"], "math_unit": ["none"]}))
    path = tmp_path / "r.parquet"
    schema.write_parquet(df, path)
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["math_unit"]).replace_schema_metadata(table.schema.metadata), path)
    back = schema.read_parquet(path)
    assert list(back.columns) == list(schema.COLUMNS) and back["math_unit"].isna().all()
    bad = schema.conform(pd.DataFrame({"kind": ["kernel"], "math_unit": ["simd"]}))
    with pytest.raises(schema.SchemaError, match="math_unit"):
        schema.validate(bad)


# --- the report: 'math as asked' names the products that ran on FMA units ----------------------------------------
# tests/data/gpu_bf16_run (the 4x H200 bf16 run, bs 1024, 20 steps): conv1's forward kernels' ns (the FMA kernels,
# implicit_convolve_sgemm / convolve_common_engine_float_NHWC) and all library kernels' ns of the timed source, as
# tests/test_gpu_bf16_run.py's stdlib readers count them (PIPES["fma"], KERNELS)
FMA_NS = {"pytorch-bf16": (1622649, 15616410), "pytorch-cuda-graph-bf16": (1613275, 15782948),
          "jax-bf16": (1933904, 6647087)}
CONV1_FWD = {"pytorch-bf16": "cudnnBackendExecute", "pytorch-cuda-graph-bf16": "cudnnBackendExecute",
             "jax-bf16": "__cudnn$convForward"}


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    import shutil

    from kernelmap.normalise import normalise_run_dir

    fixture = DATA / "gpu_bf16_run"
    if not (fixture / "manifest.json").is_file():
        pytest.skip("tests/data/gpu_bf16_run not in place")
    run = tmp_path_factory.mktemp("unit") / "run"
    shutil.copytree(fixture, run, ignore=shutil.ignore_patterns("*.py", "README.md", "__pycache__"))
    normalise_run_dir(run)
    return run


def _as_asked(run) -> pd.DataFrame:
    from kernelmap.reports.mathchecks import math_checks

    checks = pd.DataFrame(math_checks(run))
    return checks[checks["check"] == "math as asked"].set_index("framework")


def test_math_as_asked_names_the_fma_conv_of_a_bf16_case(bf16_run):
    from kernelmap.reports.analyses import math as M
    from kernelmap.reports.analyses.base import load_run

    run = load_run(bf16_run)
    fma = M.fma_products(M.math_table([run]))
    assert sorted(zip(fma["case"], fma["layer"], fma["direction"], fma["math_ran"], strict=True)) == [
        (c, "conv1", "fwd", "bf16") for c in sorted(FMA_NS)]
    checks = _as_asked(run)
    assert set(checks["status"]) == {"pass"} and set(checks["measured"]) == {"bf16"}
    for case, (fma_ns, lib_ns) in FMA_NS.items():
        detail = checks.loc[case, "detail"]
        assert (f"on FMA units, no tensor core (kernel names), {fma_ns / lib_ns:.1%} of the conv/linear kernels' time: "
                f"conv1 fwd {CONV1_FWD[case]} bf16 {fma_ns / 20 / 1e6:.3f} ms/step") in detail
    # the note comes from math_unit: without it, none; under an fp32 label the products fail, with no FMA note
    run.records["math_unit"] = pd.array([pd.NA] * len(run.records), dtype=schema.DTYPES["math_unit"])
    assert not _as_asked(run)["detail"].str.contains("FMA units").any()
    run = load_run(bf16_run)
    run.records["math"] = pd.array(["fp32"] * len(run.records), dtype=schema.DTYPES["math"])
    checks = _as_asked(run)
    assert set(checks["status"]) == {"FAIL"} and not checks["detail"].str.contains("FMA units").any()
