"""The counters pass as it first ran through ``kernelmap run`` on a GPU (tests/data/gpu_counters_run/README.md: the
2x H200 job of 2026-11-27, run-1, PyTorch fp32 and bf16, MXNet fp32, bs 64): the join of each counted kernel to the
traced step and the log's math against the counters', as ``kernelmap report --strict`` checks them.

The counters are read here a second time by the stdlib (``csv``, ``gzip``), not by ``kernelmap/adapters/ncu.py``:
per kernel its name, stream, launch configuration and instruction counts, and its math by the rule the counters
pass states (docs/COUNTERS.md): a tensor-core precision where ``sm__ops_path_tensor_src_*`` counted ops; else FP32
where FFMA, FADD or FMUL ran; else half precision where HFMA that HFMA2.MMA (32 a warp instruction) does not explain,
HADD or HMUL ran; else none."""

from __future__ import annotations

import collections
import csv
import gzip
import io
import shutil
from pathlib import Path

import pytest
from kernelmap.reports import counterchecks
from kernelmap.reports.analyses import roofline
from kernelmap.reports.analyses.base import load_run
from kernelmap.reports.checkrows import FAIL, PASS

from kernelmap import kernelmath, schema

RUN = Path(__file__).parent / "data" / "gpu_counters_run"
CASES = {"pytorch": 44, "pytorch-bf16": 71, "mxnet": 51}  # kernels in each case's counted step
M = "sm__sass_thread_inst_executed_op_{}_pred_on.sum"
TENSOR = {"tf32": "sm__ops_path_tensor_src_tf32_dst_fp32.sum", "bf16": "sm__ops_path_tensor_src_bf16_dst_fp32.sum",
          "fp16": "sm__ops_path_tensor_src_fp16.sum"}
HFMA2 = "sm__inst_executed_pipe_tensor_op_hmma_type_hfma2.sum"


def counted(case: str) -> list[dict]:
    """The case's counted kernels: name, stream, grid, block and the ``.sum`` counters as integers."""
    text = gzip.decompress((RUN / case / "bs64" / "counters" / "ncu.csv").read_bytes()).decode()
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith('"ID","Process ID"'))
    rows = list(csv.reader(io.StringIO("\n".join(lines[head:]))))
    out = []
    for row in rows[2:]:
        f = dict(zip(rows[0], row, strict=True))
        k = {c: int(float(v.replace(",", ""))) for c, v in f.items() if c.endswith(".sum") and "__" in c}
        k.update(name=f["Kernel Name"], stream=int(f["Stream"]), grid=f["Grid Size"], block=f["Block Size"])
        out.append(k)
    return out


def math_of(k: dict) -> str:
    """The module docstring's rule."""
    tensor = [p for p, c in TENSOR.items() if k[c] > 0]
    if tensor:
        return tensor[0] if len(tensor) == 1 else "mixed"
    if k[M.format("ffma")] or k[M.format("fadd")] or k[M.format("fmul")]:
        return "fp32"
    if k[M.format("hfma")] > 32 * k[HFMA2] or k[M.format("hadd")] or k[M.format("hmul")]:
        return "fp16/bf16 (CUDA cores)"
    return "none"


def one(case: str, mark: str) -> list[dict]:
    return [k for k in counted(case) if mark in k["name"]]


def test_the_capture_as_the_stdlib_reads_it():
    """Counts and the instruction mix of the kernels whose math the log and the counters once disagreed on."""
    assert {c: len(counted(c)) for c in CASES} == CASES
    maths = {c: dict(collections.Counter(math_of(k) for k in counted(c))) for c in CASES}
    assert maths == {"pytorch": {"fp32": 31, "none": 13}, "pytorch-bf16": {"none": 31, "fp32": 30, "bf16": 10},
                     "mxnet": {"fp32": 46, "none": 5}}
    # cuDNN's FMA conv of bf16 data: FP32 FFMA, every HFMA a HFMA2.MMA move, no tensor op
    (conv1,) = one("pytorch-bf16", "implicit_convolve_sgemm<__nv_bfloat16")
    assert (conv1[M.format("ffma")], conv1[M.format("hfma")], conv1[HFMA2]) == (25_690_112, 702_464, 21_952)
    assert 32 * 21_952 == 702_464 and all(conv1[c] == 0 for c in TENSOR.values())
    # cuDNN's layout transforms: one FP32 FMUL an element (the scale by alpha), nothing else
    layout = one("pytorch-bf16", "nchwToNhwcKernel") + one("pytorch-bf16", "nhwcToNchwKernel")
    assert len(layout) == 12
    assert {k[M.format("fmul")] for k in layout} == {288, 18_432, 50_176, 401_408, 802_816, 1_605_632}
    assert all(k[M.format(op)] == 0 for k in layout for op in ("ffma", "fadd", "hfma", "hadd", "hmul"))
    assert 401_408 == 64 * 32 * 14 * 14 and 18_432 == 64 * 32 * 3 * 3  # conv2's input and weight, one FMUL each
    # the split-K reductions sum in FP32 (FADD); cuBLAS's scal_kernel (beta 0) and cuDNN's scalePackedTensor ran no
    # floating-point instruction at all
    (lt,) = one("pytorch-bf16", "splitKreduce_kernel")
    (cut,) = one("pytorch-bf16", "ReduceSplitK")
    assert (lt[M.format("fadd")], cut[M.format("fadd")]) == (24_576, 52_992)
    for case, mark in (("pytorch", "scal_kernel"), ("mxnet", "scalePackedTensor_kernel")):
        (k,) = one(case, mark)
        assert all(k[M.format(op)] == 0 for op in ("ffma", "fadd", "fmul", "hfma", "hadd", "hmul")), mark
    # MXNet's engine launches onto two streams
    assert collections.Counter(k["stream"] for k in counted("mxnet")) == {51: 37, 50: 14}


def test_every_kernel_paired_and_its_math_agrees():
    """Each case: every counted kernel paired; the log's math (``kernelmath.counted_math``) agrees with the counters'
    on every kernel where both are known, and the counters' math is the stdlib rule's."""
    kernels, status, _ = roofline.counter_kernels([load_run(RUN)])
    s = status.set_index("case")
    for case, n in CASES.items():
        assert (s.loc[case, "kernels"], s.loc[case, "matched"], s.loc[case, "paired_time_share"]) == (n, n, 1.0)
        k = kernels[kernels["case"] == case]
        assert list(k["counter_math"]) == [math_of(x) for x in counted(case)], case
    assert s.loc["pytorch", "pairing"] == s.loc["pytorch-bf16", "pairing"] == roofline.BY_ORDER
    assert s.loc["mxnet", "pairing"] == f"{roofline.BY_IDENTITY}: 2 of 51 launched at another point"
    compared = {c: (s.loc[c, "math_compared"], s.loc[c, "math_agree"], s.loc[c, "math_disagree"]) for c in CASES}
    # MXNet: cuDNN's two bias gradients (``calc_bias_diff_nchw_packed<float, float, ...>``) compared by their template
    assert compared == {"pytorch": (16, 16, []), "pytorch-bf16": (25, 25, []), "mxnet": (28, 28, [])}
    bf16 = kernels[kernels["case"] == "pytorch-bf16"].set_index("position")
    # the log says bf16 operands; the FMA conv, the layout transforms and the split-K reductions compute in FP32
    for pos, ran, unit, log in ((3, "bf16", "fma", "fp32"), (9, "bf16", "none", "fp32"), (11, "bf16", "tensor", "bf16"),
                                (19, "bf16", "none", "fp32"), (63, "bf16", "none", "fp32")):
        assert tuple(bf16.loc[pos, ["math_ran", "math_unit", "log_math", "counter_math"]]) == (ran, unit, log, log)
    fp32 = kernels[kernels["case"] == "pytorch"].set_index("position")
    assert tuple(fp32.loc[10, ["math_unit", "log_math", "counter_math", "math_agrees"]]) == ("none", None, "none", None)
    assert fp32.loc[10, "kernel_name"].startswith("void scal_kernel<float")


def test_bool_template_argument_spelled_two_ways():
    """ncu wrote cuBLAS's ``sgemm_largek_lds64<1, 0, ...>``, Kineto ``<true, false, ...>``: one kernel, paired."""
    kernels, _, _ = roofline.counter_kernels([load_run(RUN)])
    rec = schema.read_parquet(RUN / "records.parquet")
    kineto = {n for n in rec.loc[rec["run"] == "pytorch/bs64", "kernel_name"] if "sgemm_largek" in n}
    assert [n[:37] for n in kineto] == ["void sgemm_largek_lds64<true, false, "]
    k = kernels[(kernels["case"] == "pytorch") & kernels["kernel_name"].str.contains("sgemm_largek")].iloc[0]
    assert k["kernel_name"].startswith("void sgemm_largek_lds64<1, 0, ") and k["matched"]
    assert roofline.kernel_key(k["kernel_name"]) == roofline.kernel_key(next(iter(kineto))) == "sgemm_largek_lds64<1"
    assert roofline.kernel_key("void k<true_type, 2>()") == "k<true_type"  # only a whole bool argument


def _planted(tmp_path: Path, change) -> dict:
    """The run with its MXNet timing step changed by ``change(records, rows of that step)``; the check rows."""
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    rec = schema.read_parquet(run / "records.parquet")
    step = rec.index[(rec["run"] == "mxnet/bs64") & (rec["iteration"] == rec.loc[rec["run"] == "mxnet/bs64",
                                                                                  "iteration"].max())]
    rec = change(rec, step)
    schema.write_parquet(rec.reset_index(drop=True), run / "records.parquet")
    rows = counterchecks.counter_checks(load_run(run))
    return {r["check"]: r for r in rows if r["framework"] == "mxnet"}


def _key(rec, step, mark):
    return next(i for i in step if mark in rec.loc[i, "kernel_name"])


@pytest.mark.parametrize("plant, measured, said", [
    ("missing", "0.0%", "0 of 51 counted kernels paired with the nsys step's 50: the counters step ran 51 kernels, the "
                        "nsys step 50"),
    ("renamed", "30.2%", "23 of 51 counted kernels paired with the nsys step's 51: name differs at position 1: "
                         "counters MapPlanKernel<saveto, nsys op_generic_tensor_kernel<9"),
    ("relaunched", "30.2%", "23 of 51 counted kernels paired with the nsys step's 51: name differs at position 1: "
                            "counters MapPlanKernel<saveto, nsys op_generic_tensor_kernel<4"),
])
def test_a_kernel_the_steps_do_not_share_fails_the_check(tmp_path, plant, measured, said):
    """A kernel missing from the timing step, one of another name, or one of another launch configuration: the two
    steps no longer ran the same kernels, so neither order nor identity pairs them all, and the check fails (by
    order, the 23 kernels before MXNet's engine launched ``saveto`` elsewhere are paired; the real run: all 51)."""
    def change(rec, step):
        i = _key(rec, step, "op_generic_tensor_kernel<(int)4")  # nsys writes (int)4
        if plant == "missing":
            return rec.drop(index=i)
        if plant == "renamed":
            rec.loc[i, "kernel_name"] = rec.loc[i, "kernel_name"].replace("kernel<(int)4,", "kernel<(int)9,")
        else:
            rec.loc[i, "grid_x"] = 1569
        return rec

    rows = _planted(tmp_path, change)
    cover = rows["counters cover the step"]
    assert (cover["status"], cover["measured"]) == (FAIL, measured) and cover["detail"].startswith(said)
    real = {r["check"]: r for r in counterchecks.counter_checks(load_run(RUN)) if r["framework"] == "mxnet"}
    assert real["counters cover the step"]["status"] == PASS
    assert real["log math vs counter math"]["detail"].startswith(
        "28 kernel(s): the counters say the math the log says (25 of them by the kernel's name alone, not the call's "
        "math: 8 FMA-unit kernel(s), 17 that multiply no operands (layout, FFT and Winograd transforms, split-K "
        "reductions, elementwise, pooling: their template's compute type)); 23 other paired kernel(s) not compared")


def test_a_log_math_the_counters_contradict_fails_the_check(tmp_path):
    """A tensor-core conv whose call the records say ran fp16 where the counters counted bf16 tensor ops: named."""
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    rec = schema.read_parquet(run / "records.parquet")
    fprop = rec["kernel_name"].str.contains("bf16_s16816fprop") & (rec["run"] == "pytorch-bf16/bs64")
    rec.loc[fprop, "math_ran"] = "fp16"
    schema.write_parquet(rec, run / "records.parquet")
    rows = {r["check"]: r for r in counterchecks.counter_checks(load_run(run)) if r["framework"] == "pytorch-bf16"}
    row = rows["log math vs counter math"]
    assert (row["status"], row["measured"]) == (FAIL, "24 of 25")
    assert row["detail"] == ("cutlass__5x_cudnn::Kernel: log fp16, counters bf16 (15 of them by the kernel's name "
                             "alone, not the call's math: 1 FMA-unit kernel(s), 14 that multiply no operands (layout, "
                             "FFT and Winograd transforms, split-K reductions, elementwise, pooling: their template's "
                             "compute type); the call's math differs from the name's in 1: "
                             "implicit_convolve_sgemm: call bf16, name fp32 on the FMA units)")


def test_the_math_check_says_what_it_read_from_names(tmp_path):
    """For an FMA-unit kernel the log side of the comparison is the name's (``sgemm``: FP32 whatever the call), so the
    counters cannot contradict the call there: the detail counts the kernels compared by name and names each FMA-unit
    kernel whose call ran another math. The real bf16 run: conv1's forward, a bf16 call on cuDNN's FP32 FMA conv
    (its FFMA count: test_the_capture_as_the_stdlib_reads_it). Planted: MXNet's FMA kernels' calls said bf16 still
    PASS against the counters, and the detail names each of them."""
    _, status, _ = roofline.counter_kernels([load_run(RUN)])
    s = status.set_index("case")
    got = {c: (s.loc[c, "math_by_name"], s.loc[c, "math_products_by_name"], s.loc[c, "math_call_vs_name"])
           for c in CASES}
    assert got == {"pytorch": (14, 10, []), "mxnet": (25, 8, []),
                   "pytorch-bf16": (15, 1, ["implicit_convolve_sgemm: call bf16, name fp32 on the FMA units"])}

    def change(rec, step):
        rows = [i for i in step if kernelmath.name_unit(rec.loc[i, "kernel_name"]) == "fma"]
        rec.loc[rows, "math_ran"] = "bf16"
        return rec

    row = _planted(tmp_path, change)["log math vs counter math"]
    assert (row["status"], row["measured"]) == (PASS, "28 of 28")
    named = row["detail"].split("the call's math differs from the name's in ")[1]
    assert named.startswith("8: ") and named.count("call bf16, name fp32 on the FMA units") == 8


def test_counted_math_rules():
    """``kernelmath.counted_math`` on names of these captures and of the 4x H200 bf16 run."""
    f = kernelmath.counted_math
    assert f("void implicit_convolve_sgemm<__nv_bfloat16, __nv_bfloat16, 128, 5>(int)", "bf16") == "fp32"
    assert f("void convolve_common_engine_float_NHWC<__nv_bfloat16, __nv_bfloat16, 128>(int)", "bf16") == "fp32"
    assert f("sm80_xmma_gemm_f32f32_f32f32_f32_nt_n_tilesize32x32x8_stage3_warpsize1x2x1_ffma_aligna4", "tf32") == "fp32"
    # fp32 compute on fp16 data: the counters may count the HADD2.F32 that converts each element
    assert f("void cudnn::nchwToNhwcKernel<__half, __half, float, 0, 1, 0>(int)", "fp16") == "fp32 on fp16 data"
    assert f("void cudnn::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, 0, 1, 0>(int)", "bf16") == "fp32"
    assert f("void cudnn::nchwToNhwcKernel<__half, __half, __half, 0, 1, 0>(int)", "fp16") == "fp16/bf16 (CUDA cores)"
    assert f("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float>(int)", "bf16") == "fp32"
    assert f("nvjet_sm90_tst_64x32_64x16_2x2_h_bz_splitK_bias_TNT", "bf16") == "bf16"
    assert f("void scal_kernel<float, float, 1, 1, 6, 5, 5, 3>(int)", "fp32") is None  # beta not in the name
    assert f("void cudnn::winogradWgradData4x4<float, float>(int)", "bf16") == "fp32"  # its template's compute type
    assert f("void fft2d_r2c_16x16<__half>(float2 *, const T1 *, int)", "fp16") == "fp32 on fp16 data"
    assert f("void fft2d_r2c_16x16<__half>(int)", "fp16") is None  # no complex buffer named: not said
    assert f("void cudnn::pooling_fw_4d_kernel<__half, __half, x>(int)", "fp16") == "fp16/bf16 (CUDA cores)"
    assert kernelmath.agrees("fp32 on fp16 data", "fp32 + HADD") and kernelmath.agrees("fp32 on fp16 data", "fp32")
    assert not kernelmath.agrees("fp32", "fp32 + HADD") and not kernelmath.agrees("fp32 on fp16 data", "mixed")
    assert f("void at::vectorized_elementwise_kernel<4, x>(int)", None) is None
    assert kernelmath.template_args("k<a::b<c, d>, float, 3>(x)", 1) == ["b<c, d>", "float", "3"]
