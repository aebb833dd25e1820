"""MXNet fp16 under the counters pass on an H200 (tests/data/gpu_mxnet_fp16_counters_run/README.md): the log's math
against the counters' for cuDNN's legacy kernels that keep fp16 data and compute in fp32.

The counters and the cuDNN log are read here a second time by the stdlib (``csv``, ``gzip``, ``re``), not by
``kernelmap/adapters/ncu.py`` or ``cudnn_log.py``. The counters' math by docs/COUNTERS.md's rule: a tensor-core
precision where ``sm__ops_path_tensor_src_*`` counted ops; FP32 FLOPs 2*FFMA + FADD + FMUL, half 4*HFMA (less the
HFMA2.MMA moves, 32 a warp instruction) + 2*HADD + 2*HMUL; a kind above 10% of the FLOPs counts; FP32 and half where
the half instructions were all HADD: "fp32 + HADD"."""

from __future__ import annotations

import collections
import csv
import gzip
import html
import io
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
from kernelmap.reports import cli as report_cli
from kernelmap.reports import counterchecks, mathchecks
from kernelmap.reports import html as H
from kernelmap.reports.analyses import math as MA
from kernelmap.reports.analyses import roofline
from kernelmap.reports.analyses.base import fw_label, load_run
from kernelmap.reports.checkrows import FAIL, PASS, Check

from kernelmap import kernelmath

RUN = Path(__file__).parent / "data" / "gpu_mxnet_fp16_counters_run"
FP16, FP32 = "mxnet-hybridized-fp16", "mxnet-hybridized"
CASES = {FP32: 51, FP16: 81}
M = "sm__sass_thread_inst_executed_op_{}_pred_on.sum"
TENSOR = {"tf32": "sm__ops_path_tensor_src_tf32_dst_fp32.sum", "bf16": "sm__ops_path_tensor_src_bf16_dst_fp32.sum",
          "fp16": "sm__ops_path_tensor_src_fp16.sum"}
HFMA2 = "sm__inst_executed_pipe_tensor_op_hmma_type_hfma2.sum"


def _csv_path(root: Path, case: str) -> Path:
    return root / case / "bs64" / "counters" / "ncu.csv"


def _rows(root: Path, case: str) -> tuple[list[str], list[list[str]]]:
    text = gzip.decompress(_csv_path(root, case).read_bytes()).decode()
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith('"ID","Process ID"'))
    return lines[:head], list(csv.reader(io.StringIO("\n".join(lines[head:]))))


def counted(case: str, root: Path = RUN) -> list[dict]:
    """The case's counted kernels: name and the ``.sum`` counters as integers."""
    _, rows = _rows(root, case)
    out = []
    for row in rows[2:]:
        f = dict(zip(rows[0], row, strict=True))
        k = {c: int(float(v.replace(",", ""))) for c, v in f.items() if c.endswith(".sum") and "__" in c}
        out.append({**k, "name": f["Kernel Name"]})
    return out


def math_of(k: dict) -> str:
    """The module docstring's rule."""
    hfma = max(k[M.format("hfma")] - 32 * k[HFMA2], 0)
    kinds = {p: k[c] for p, c in TENSOR.items()}
    kinds["fp32"] = 2 * k[M.format("ffma")] + k[M.format("fadd")] + k[M.format("fmul")]
    kinds["half"] = 4 * hfma + 2 * k[M.format("hadd")] + 2 * k[M.format("hmul")]
    total = sum(kinds.values())
    big = sorted(p for p, v in kinds.items() if v > 0.10 * total and v > 0)
    if not big:
        return "none"
    if big == ["fp32", "half"] and hfma == 0 and k[M.format("hmul")] == 0:
        return "fp32 + HADD"
    if len(big) > 1:
        return "mixed"
    return "fp16/bf16 (CUDA cores)" if big == ["half"] else big[0]


def calls() -> list[tuple[str, str]]:
    """The trimmed cuDNN log's calls: (function, block text)."""
    text = gzip.decompress((RUN / FP16 / "bs64" / "cudnn.log.gz").read_bytes()).decode()
    return [(re.search(r"function (\w+)\(\)", b).group(1), b) for b in text.split("\n\n") if "function" in b]


def dims(block: str, desc: str) -> int:
    """Elements of a call's tensor descriptor (``srcDesc``, ``destDesc``, ``xDesc``...)."""
    m = re.search(rf"{desc}: type=\w+:\n(?:i!  {{8}}.*\n)*?i!  {{8}}dimA: type=int; val=\[([\d,]+)\]", block)
    n = 1
    for d in m.group(1).split(","):
        n *= int(d)
    return n


def one(case: str, mark: str) -> list[dict]:
    return [k for k in counted(case) if mark in k["name"]]


def test_the_cudnn_log_as_the_stdlib_reads_it():
    """One step of legacy calls: every tensor fp16; each convolution descriptor's compute type fp32 (cuDNN's
    pseudo-half: fp16 data, fp32 compute), conv1's weight gradient Winograd under TENSOR_OP_MATH, conv2's FFT and
    the forwards' implicit GEMM under DEFAULT_MATH; pooling, activation and the bias add give no compute type at all
    (their alpha and beta are FLOAT, the scaling factors' type for fp16 data): the kernel's name is where it is."""
    got = calls()
    assert collections.Counter(f for f, _ in got) == {
        "cudnnConvolutionForward": 2, "cudnnAddTensor": 2, "cudnnActivationForward": 2, "cudnnPoolingForward": 2,
        "cudnnPoolingBackward": 2, "cudnnActivationBackward": 2, "cudnnConvolutionBackwardBias": 2,
        "cudnnConvolutionBackwardFilter": 2, "cudnnConvolutionBackwardData": 1}
    for f, b in got:
        types = re.findall(r"^i! +dataType: type=cudnnDataType_t; val=(\w+)", b, re.M)
        conv = re.search(r"convDesc: type=cudnnConvolutionDescriptor_t:\n(?:i! {9}.*\n)*?i! {9}dataType: type="
                         r"cudnnDataType_t; val=(\w+)", b)
        if f in ("cudnnConvolutionForward", "cudnnConvolutionBackwardFilter", "cudnnConvolutionBackwardData"):
            assert conv.group(1) == "CUDNN_DATA_FLOAT" and types.count("CUDNN_DATA_FLOAT") == 1, f
            assert types.count("CUDNN_DATA_HALF") == 3, f
        else:
            assert conv is None and set(types) == {"CUDNN_DATA_HALF"}, f
            assert set(re.findall(r"(?:alpha|beta): type=(\w+)", b)) <= {"CUDNN_DATA_FLOAT"}, f
    algos = [(f, re.search(r"mathType: type=cudnnMathType_t; val=(\w+)", b).group(1),
              re.search(r"algo: type=\w+; val=(\w+)", b).group(1)) for f, b in got if "algo:" in b]
    assert algos == [
        ("cudnnConvolutionForward", "CUDNN_DEFAULT_MATH", "CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM"),
        ("cudnnConvolutionForward", "CUDNN_DEFAULT_MATH", "CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM"),
        ("cudnnConvolutionBackwardFilter", "CUDNN_DEFAULT_MATH", "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT"),
        ("cudnnConvolutionBackwardData", "CUDNN_DEFAULT_MATH", "CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING"),
        ("cudnnConvolutionBackwardFilter", "CUDNN_TENSOR_OP_MATH", "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED")]


def test_hadd_converts_fp16_to_fp32():
    """The counters of the kernels the log and the counters once disagreed on. The fp16 weight gradients' casts to
    the fp32 master gradients (MXNet's ``amp_cast`` backward, ``MapPlanKernel<saveto>``) execute one HADD per
    element and no other floating-point instruction: HADD2.F32 is the conversion. cuDNN's max pooling runs one HADD
    per input element and one FP32 FMUL (its alpha) per output element, its ReLU one HADD and one FFMA per element,
    the FFT's real-to-complex transforms one HADD per element of the tensor they read: FP32 arithmetic on fp16 data.
    No HMUL in any of them, and no HFMA that HFMA2.MMA moves (32 a warp instruction at most) do not explain."""
    assert {c: len(counted(c)) for c in CASES} == CASES
    casts = counted(FP16)[68:76]
    assert [k[M.format("hadd")] for k in casts] == [288, 32, 18_432, 64, 401_408, 128, 1_280, 10]
    assert [32 * 1 * 3 * 3, 32, 64 * 32 * 3 * 3, 64, 3136 * 128, 128, 128 * 10, 10] == [
        k[M.format("hadd")] for k in casts]  # conv1, conv2, fc1, fc2: weight and bias
    assert all(k[M.format(op)] == 0 for k in casts for op in ("ffma", "fadd", "fmul", "hfma", "hmul"))
    log: dict[str, list[str]] = {}
    for f, b in calls():
        log.setdefault(f, []).append(b)
    pools = one(FP16, "pooling_fw_4d_kernel<__half, float")
    assert [(k[M.format("hadd")], k[M.format("fmul")]) for k in pools] == [
        (dims(b, "srcDesc"), dims(b, "destDesc")) for b in log["cudnnPoolingForward"]] == [
        (1_605_632, 401_408), (802_816, 200_704)]
    relu = [k for k in one(FP16, "op_generic_tensor_kernel<1, __half, float") if k[M.format("hfma")] == 0]
    assert [(k[M.format("hadd")], k[M.format("ffma")]) for k in relu] == [
        (dims(b, "srcDesc"),) * 2 for b in log["cudnnActivationForward"]] == [(1_605_632,) * 2, (802_816,) * 2]
    wgrad = next(b for b in log["cudnnConvolutionBackwardFilter"] if "FFT" in b)
    r2c = one(FP16, "fft2d_r2c_16x16<__half>")
    assert sorted(k[M.format("hadd")] for k in r2c) == sorted([dims(wgrad, "xDesc"), dims(wgrad, "dyDesc")])
    fp16_data = [k for k in counted(FP16) if kernelmath.counted_math(k["name"], "fp16") == kernelmath.COUNTED_FP32_ON_FP16]
    assert len(fp16_data) == 21
    assert all(k[M.format("hmul")] == 0 and k[M.format("hfma")] <= 32 * k[HFMA2] for k in fp16_data)
    assert collections.Counter(math_of(k) for k in fp16_data) == {"fp32 + HADD": 14, "fp32": 7}


def test_log_math_and_counter_math_agree():
    """Every paired kernel with both maths agrees: the fp16 case 33 of 33 (the job's report: 12 of 31; now also
    cuDNN's two bias gradients, by their template's compute type), fp32 28 of 28; the counters' math is the stdlib
    rule's on every kernel."""
    kernels, status, _ = roofline.counter_kernels([load_run(RUN)])
    s = status.set_index("case")
    for case, n in CASES.items():
        assert (s.loc[case, "kernels"], s.loc[case, "matched"]) == (n, n)
        k = kernels[kernels["case"] == case]
        assert list(k["counter_math"]) == [math_of(x) for x in counted(case)], case
    got = {c: (s.loc[c, "math_compared"], s.loc[c, "math_agree"], s.loc[c, "math_disagree"]) for c in CASES}
    assert got == {FP16: (33, 33, []), FP32: (28, 28, [])}
    k = kernels[(kernels["case"] == FP16) & kernels["log_math"].notna()]
    pairs = collections.Counter(zip(k["log_math"], k["counter_math"], strict=True))
    assert pairs == {("fp32 on fp16 data", "fp32 + HADD"): 14, ("fp32 on fp16 data", "fp32"): 7, ("fp16", "fp16"): 6,
                     ("fp32", "fp32"): 6}
    assert set(k.loc[k["log_math"] == "fp32 on fp16 data", "math_ran"]) == {"fp16"}  # the operands stay fp16
    rows = {r["framework"]: r for r in counterchecks.counter_checks(load_run(RUN))
            if r["check"] == "log math vs counter math"}
    assert (rows[FP16]["status"], rows[FP16]["measured"]) == (PASS, "33 of 33")
    assert "the call's math differs from the name's in 2: implicit_convolve_sgemm: call fp16, name fp32 on the FMA " \
           "units; implicit_convolve_sgemm: call fp16, name fp32 on the FMA units" in rows[FP16]["detail"]
    assert (rows[FP32]["status"], rows[FP32]["measured"]) == (PASS, "28 of 28")


def _plant(tmp_path: Path, case: str, mark: str, values: dict) -> dict:
    """The run with the first counted kernel of ``case`` whose name holds ``mark`` given ``values``; its check row."""
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    pre, rows = _rows(run, case)
    i = next(n for n, r in enumerate(rows[2:], 2) if mark in r[rows[0].index("Kernel Name")])
    for metric, v in values.items():
        rows[i][rows[0].index(metric)] = str(v)
    buf = io.StringIO()
    buf.write("".join(line + "\n" for line in pre))
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    _csv_path(run, case).write_bytes(gzip.compress(buf.getvalue().encode()))
    return next(r for r in counterchecks.counter_checks(load_run(run))
                if r["framework"] == case and r["check"] == "log math vs counter math")


@pytest.mark.parametrize("mark, values, counters", [
    ("pooling_fw_4d_kernel", {M.format("hmul"): 1_605_632}, "fp16/bf16 (CUDA cores)"),
    ("winogradWgradDelta4x4", {M.format("hfma"): 1_000_000}, "mixed"),
])
def test_half_arithmetic_in_an_fp32_kernel_fails(tmp_path, mark, values, counters):
    """FP32 on fp16 data allows FP32 alone or FP32 and HADD, nothing else: the first max pooling given one HMUL per
    input element, the Winograd transform of the output gradient HFMA that no HFMA2.MMA explains (half-precision
    multiplies): named."""
    row = _plant(tmp_path, FP16, mark, values)
    assert (row["status"], row["measured"]) == (FAIL, "32 of 33")
    assert row["detail"].startswith(f"{roofline.display_name(one(FP16, mark)[0]['name'])}: log fp32 on fp16 data, "
                                    f"counters {counters} (")


def test_tensor_math_in_an_fp32_kernel_fails(tmp_path):
    """The bias add given fp16 tensor-core ops (with the instructions that issue them) reads fp16: named."""
    row = _plant(tmp_path, FP16, "op_generic_tensor_kernel<4", {TENSOR["fp16"]: 10**9,
                                                                 "sm__inst_executed_pipe_tensor_op_hmma.sum": 10**6})
    assert (row["status"], row["measured"]) == (FAIL, "32 of 33")
    assert row["detail"].startswith("op_generic_tensor_kernel: log fp32 on fp16 data, counters fp16 (")


def test_hadd_in_an_fp32_data_kernel_fails(tmp_path):
    """The fp32 case's bias add (float data, float compute) given a HADD per element: fp32 data needs no conversion,
    so FP32 and HADD there is not the log's fp32."""
    row = _plant(tmp_path, FP32, "op_generic_tensor_kernel<4", {M.format("hadd"): 3_211_264})
    assert (row["status"], row["measured"]) == (FAIL, "27 of 28")
    assert row["detail"].startswith("op_generic_tensor_kernel: log fp32, counters fp32 + HADD (")


# --- 'math as asked': cuDNN's fp32 algorithms on fp16 tensors are the library's choice, fp32 tensors the recipe's -----
DIRECTION = {"cudnnConvolutionForward": "fwd", "cudnnConvolutionBackwardFilter": "bwd_weight",
             "cudnnConvolutionBackwardData": "bwd_data"}
FILTER = {"wDesc": None, "dwDesc": None}
LAYER_OF_FILTER = {32 * 1 * 3 * 3: "conv1", 64 * 32 * 3 * 3: "conv2"}  # the model's two convolutions' weights
# the multiplying kernel each algorithm ran, as the counters pass counted it (implicit GEMM: cuDNN's legacy SIMT
# kernel; the FFTs: a complex fp32 GEMM between their transforms; the one-channel Winograd weight gradient: cuBLAS's gemv)
GEMM_OF = {"IMPLICIT_GEMM": "implicit_convolve_sgemm<__half", "FFT": "xmma_gemm_cf32cf32",
           "FFT_TILING": "xmma_gemm_cf32cf32", "WINOGRAD_NONFUSED": "internal::kernel<int, int, float,"}
STATEMENT_CALL = re.compile(r"(conv\d|fc\d) (\w+) (\w+) (\w+) ([\d.]+) ms/step")


def conv_calls() -> list[tuple[str, str, str, str]]:
    """The log's convolutions (layer by its filter's elements, direction, function, algorithm without cuDNN's
    prefix), each asserted to have every tensor fp16."""
    out = []
    for f, b in calls():
        if f not in DIRECTION:
            continue
        tensors = re.findall(r"^i!     (\w+Desc): type=cudnn(?:Tensor|Filter)Descriptor_t:\n"
                             r"i!         dataType: type=cudnnDataType_t; val=(\w+)", b, re.M)
        assert len(tensors) == 3 and {t for _, t in tensors} == {"CUDNN_DATA_HALF"}, f
        filt = next(d for d, _ in tensors if d in FILTER)
        algo = re.search(r"algo: type=\w+; val=CUDNN_CONVOLUTION_\w+?_ALGO_(\w+)", b).group(1)
        out.append((LAYER_OF_FILTER[dims(b, filt)], DIRECTION[f], f, algo))
    return sorted(out)


def _as_asked(run) -> dict:
    return next(r for r in mathchecks.math_checks(run) if r["framework"] == FP16 and r["check"] == "math as asked")


def _kernel_ms(run, layer: str, direction: str, call: str) -> float:
    rec = run.records
    k = rec[(rec["run"] == f"{FP16}/bs64") & (rec["kind"] == "kernel") & (rec["layer"] == layer)
            & (rec["direction"] == direction) & (rec["library_call"] == call)]
    return float(k["dur_ns"].sum()) / 20 / 1e6  # 20 traced steps


def test_math_as_asked_names_cudnns_fp32_algorithms_on_fp16_tensors():
    """Every convolution of the step has fp16 tensors (the AMP recipe worked), and each one's multiplying kernel
    computed FP32 by the counters, no tensor op: the 5 conv products (2 implicit GEMM forwards, conv2's FFT weight and
    FFT-tiling data gradients, conv1's Winograd weight gradient) ran fp32 by cuDNN's choice of algorithm; the 6 linear
    products stay fp16 on tensor cores. 'math as asked' passes the case (it failed before: 'ran fp32' for three) and
    its statement names exactly those 5 calls, with their kernels' time from the records and its share of library-kernel
    time; the first screen says it."""
    convs = conv_calls()
    assert convs == [("conv1", "bwd_weight", "cudnnConvolutionBackwardFilter", "WINOGRAD_NONFUSED"),
                     ("conv1", "fwd", "cudnnConvolutionForward", "IMPLICIT_GEMM"),
                     ("conv2", "bwd_data", "cudnnConvolutionBackwardData", "FFT_TILING"),
                     ("conv2", "bwd_weight", "cudnnConvolutionBackwardFilter", "FFT"),
                     ("conv2", "fwd", "cudnnConvolutionForward", "IMPLICIT_GEMM")]
    kernels = counted(FP16)
    gemms = [k for k in kernels if any(m in k["name"] for m in GEMM_OF.values())]
    assert len(gemms) == 5 and all(math_of(k) == "fp32" and k[TENSOR["fp16"]] == 0 for k in gemms)
    tensor = [k for k in kernels if k[TENSOR["fp16"]] > 0]
    assert len(tensor) == 6 and {math_of(k) for k in tensor} == {"fp16"}  # fc1, fc2: fwd, bwd_data, bwd_weight
    assert collections.Counter(GEMM_OF[a] for *_, a in convs) == collections.Counter(
        next(m for m in GEMM_OF.values() if m in k["name"]) for k in gemms)

    run = load_run(RUN)
    row = _as_asked(run)
    assert (row["status"], row["measured"]) == (PASS, "fp16/fp32")
    assert row["subject"] == f"{mathchecks.LIBRARY_FP32}: conv/linear products"
    statement = row["detail"].split(mathchecks.STATEMENT_END)[0]
    assert statement.startswith(f"{len(convs)} of {len(convs) + len(tensor)} conv/linear products (layer x direction) "
                                "ran kernels that compute in fp32 on fp16 tensors, the algorithms cuDNN chose: ")
    named = STATEMENT_CALL.findall(statement)
    assert [tuple(n[:4]) for n in named] == convs
    ms = [_kernel_ms(run, *c[:3]) for c in convs]
    assert [float(n[4]) for n in named] == [round(m, 3) for m in ms]
    library = MA.math_coverage([run]).set_index("case").loc[FP16, "library_ms_per_step"]
    assert statement.endswith(f"({sum(ms):.3f} ms/step, {sum(ms) / library:.1%} of library-kernel time)")
    assert (f"{sum(ms):.3f}", f"{sum(ms) / library:.1%}") == ("0.150", "56.5%")
    checks = pd.DataFrame(mathchecks.math_checks(run))
    assert mathchecks.first_screen_lines(checks, fw_label) == [f"MXNet hybridized fp16 bs 64: {statement}"]
    # a table whose batch sizes are floats (a row of none beside them): the same line
    floats = checks.astype({"batch_size": "float64"})
    assert mathchecks.first_screen_lines(floats, fw_label) == [f"MXNet hybridized fp16 bs 64: {statement}"]


def _plant_records(run, layer: str, direction: str, mark: str = "", **values) -> None:
    """The fp16 case's kernels of ``layer`` x ``direction`` (whose name holds ``mark``) given ``values`` (their records,
    as normalise writes them)."""
    rec = run.records
    sel = (rec["run"] == f"{FP16}/bs64") & (rec["kind"] == "kernel") & (rec["layer"] == layer) & (
        rec["direction"] == direction) & rec["kernel_name"].str.contains(mark, regex=False).fillna(False)
    assert sel.sum() > 0
    for col, v in values.items():
        rec[col] = rec[col].astype(object).where(~sel, v).astype(rec[col].dtype)


def test_a_conv_on_fp32_tensors_under_fp16_fails():
    """conv2's forward logged as an fp32 convolution (every tensor fp32: the recipe left the layer in fp32, as cuDNN's
    log gives it) under --math fp16: FAIL, named with its time, first on the banner; the other 4 still named as
    cuDNN's choice, not failed, and no first-screen line of the library's choice for a failed case."""
    run = load_run(RUN)
    _plant_records(run, "conv2", "fwd", math_ran="fp32", math_source="log", math_dtypes="x=fp32 w=fp32 y=fp32 compute=fp32")
    row = _as_asked(run)
    assert (row["status"], row["measured"], row["subject"]) == (
        FAIL, "fp32", f"{mathchecks.NOT_AS_ASKED}: conv/linear products")
    assert row["detail"].startswith("asked fp16: conv2 fwd cudnnAddTensor ran fp32 (0.005 ms/step); conv2 fwd "
                                    "cudnnConvolutionForward ran fp32 (0.051 ms/step); on FMA units")
    assert "; not failed, 4 of 11 conv/linear products (layer x direction) ran kernels that compute in fp32 on fp16 " \
           "tensors" in row["detail"]
    assert "conv2 fwd cudnnConvolutionForward IMPLICIT_GEMM" not in row["detail"]
    checks = pd.DataFrame(mathchecks.math_checks(run))
    lines = H.failure_lines(checks, FAIL, fw_label, Check.MATH_AS_ASKED)
    assert (lines[0]["check"], lines[0]["rows"], lines[0]["subjects"]) == (
        "math as asked", 1, "MXNet hybridized fp16 bs 64 (did not run the math asked for: conv/linear products)")
    assert mathchecks.first_screen_lines(checks, fw_label) == []


def test_a_conv_with_one_fp32_tensor_under_fp16_fails():
    """conv1's weight gradient written to an fp32 tensor (dw=fp32: fp16 data, fp32 weights' gradient) while its gemv
    multiplies fp32: not every tensor the type asked, so not the library's choice: FAIL."""
    run = load_run(RUN)
    _plant_records(run, "conv1", "bwd_weight", math_dtypes="x=fp16 dw=fp32 dy=fp16 compute=fp32")
    row = _as_asked(run)
    assert (row["status"], row["measured"]) == (FAIL, "fp32")
    assert row["detail"].startswith("asked fp16: conv1 bwd_weight cudnnConvolutionBackwardFilter ran fp32 (0.010 ms/step)")
    assert "; not failed, 4 of 11 " in row["detail"]


def test_an_fp32_gemm_on_fp16_tensors_is_the_librarys_choice():
    """fc1's forward GEMM kernel given fp32 math by name (as if cuBLAS had picked an FP32 gemm for the fp16 call, whose
    log keeps a=fp16 b=fp16 c=fp16): not a failure; the statement names it beside cuDNN's 5: 6 of 11."""
    run = load_run(RUN)
    _plant_records(run, "fc1", "fwd", "nvjet_", math_ran="fp32", math_source="name")
    row = _as_asked(run)
    assert (row["status"], row["measured"]) == (PASS, "fp16/fp32")
    assert row["detail"].startswith("6 of 11 conv/linear products (layer x direction) ran kernels that compute in fp32 "
                                    "on fp16 tensors, the algorithms cuBLAS and cuDNN chose: ")
    assert "; fc1 fwd cublasGemmEx 0.006 ms/step (" in row["detail"]


def test_the_first_screen_says_which_products_cudnn_ran_in_fp32(tmp_path):
    """The report of the capture: its header (the first screen) holds "Math the libraries chose" with the case's
    statement, and no banner line of 'math as asked' (it passed)."""
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    out, checks = report_cli.build([str(run)], tmp_path / "report")
    page = (out / "report.html").read_text()
    header = page[page.index("<header>"):page.index("</header>")]
    row = checks[(checks["framework"] == FP16) & (checks["check"] == "math as asked")].iloc[0]
    assert row["status"] == PASS
    said = html.escape(f"MXNet hybridized fp16 bs 64: {row['detail'].split(mathchecks.STATEMENT_END)[0]}")
    assert 'id="math-chosen"' in header and f"<li>{said}</li>" in header
    assert said.count("ms/step;") == 4  # five calls
    assert "did not run the math asked for" not in header
