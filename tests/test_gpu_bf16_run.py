"""Issue 38's math column on a real bf16 run: tests/data/gpu_bf16_run, a trimmed copy (make_fixture.py there) of
``kernelmap run --framework all --device gpu --math bf16 --mode all --profile all --batch-size 1024 --steps 20
--trials 1`` on an H200 (the 4x H200 hold of commit 80ea457, run set 0; torch 2.11+cu130, cuDNN 9.19, jax 0.11.2):
PyTorch eager (Kineto and nsys), PyTorch cuda-graph and JAX, normalised again here.

Every count and total below comes from the raw files through this module's own stdlib readers (the cuDNN,
cuBLAS and cuBLASLt logs' text, the HLO text, the Kineto/XLA Chrome traces, the nsys export), never kernelmap's:

* each library call by its operands' and compute types, against the records' ``math_ran`` / ``math_dtypes``;
* each library kernel linked to its call: the kernels a library entry op launched (PyTorch), replayed from the
  reference step (cuda-graph) or named as cuDNN/cuBLAS name theirs (XLA), with their time, against the
  attribution's linked counts; the nsys pass's too (cuDNN's CUTLASS wgrad kernel, mangled in Kineto, demangled
  by nsys: ``calllink.mangled_head``);
* the math column's share of library-kernel time (100% in every case) and 'math as asked' (bf16) passing;
* which products ran on tensor cores by their kernels' names: all but conv1's forward (C_in = 1), which cuDNN
  ran on FP32 FMA in both frameworks (``implicit_convolve_sgemm<__nv_bfloat16>``,
  ``convolve_common_engine_float_NHWC<__nv_bfloat16>``: bf16 data, no tensor-core math; the ncu probe of the
  same kernel at bs 64, .gpu-out/ncu-probe: 0 bf16 tensor ops, 25.7M FFMA). ``math_ran`` says bf16 for it (the
  operands' type), ``math_unit`` fma (the pipe), as this module's own name rules do."""

from __future__ import annotations

import collections
import gzip
import json
import re
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

DATA = Path(__file__).parent / "data"
FIXTURE = DATA / "gpu_bf16_run"
BS = 1024
STEPS = 20
pytestmark = pytest.mark.skipif(not (FIXTURE / "manifest.json").is_file(),
                                reason="tests/data/gpu_bf16_run (tests/data/gpu_bf16_run/make_fixture.py) not in place")

# --- expected, from the raw files (the readers below) ----------------------------------------------------------
BF = "BFLOAT16"
# cuDNN: cudnnBackendExecute with an execution plan, (operation, operand types in the log's order, compute type);
# the libs pass logged 21 steps (warm-up included): 5 convolutions a step
CUDNN = {("CONVOLUTION_FORWARD", f"x={BF} w={BF} y={BF}", "FLOAT"): 42,
         ("CONVOLUTION_BACKWARD_FILTER", f"x={BF} dw={BF} dy={BF}", "FLOAT"): 42,
         ("CONVOLUTION_BACKWARD_DATA", f"dx={BF} w={BF} dy={BF}", "FLOAT"): 21}
CUDNN_CASES = {"pytorch-bf16": CUDNN, "jax-bf16": CUDNN,
               "pytorch-cuda-graph-bf16": {k: v * 5 // 21 for k, v in CUDNN.items()}}  # 5 logged steps, captured
# cuBLAS cublasGemmEx (Atype, Btype, Ctype, computeType, MathMode) and cuBLASLt cublasLtMatmul (A, B, C, D types,
# computeType, scaleType, epilogue): PyTorch's linear layers; JAX's libs pass logged no matmul (XLA's cuBLASLt
# calls run in its command buffers; its GEMM's types come from the HLO)
GEMMEX = ("CUDA_R_16BF", "CUDA_R_16BF", "CUDA_R_16BF", "CUBLAS_COMPUTE_32F", "CUBLAS_DEFAULT_MATH")
LT = ("R_16BF", "R_16BF", "R_16BF", "R_16BF", "COMPUTE_32F", "R_32F")
CUBLAS = {"pytorch-bf16": {GEMMEX: 84}, "pytorch-cuda-graph-bf16": {GEMMEX: 20}, "jax-bf16": {}}
CUBLASLT = {"pytorch-bf16": {(*LT, "EPILOGUE_BIAS"): 42}, "pytorch-cuda-graph-bf16": {(*LT, "EPILOGUE_BIAS"): 10},
            "jax-bf16": {}}  # both layers' forward (addmm: the bias in the epilogue)
# XLA's library custom calls: (target, operand types, result type)
HLO_CALLS = {("__cudnn$convForward", ("bf16", "bf16"), "bf16"): 2, ("__cudnn$convBackwardFilter", ("bf16", "bf16"), "bf16"): 2,
             ("__cudnn$convBackwardInput", ("bf16", "bf16"), "bf16"): 1, ("__cublas$lt$matmul", ("bf16", "bf16"), "f32"): 1}
# (case, source) -> (library kernels, their ns): every one linked to its call
KERNELS = {("pytorch-bf16", "kineto"): (520, 15616410), ("pytorch-bf16", "nsys"): (520, 15599766),
           ("pytorch-cuda-graph-bf16", "kineto"): (580, 15782948), ("jax-bf16", "xla_trace"): (220, 6647087)}
# library kernel ns in the timed source by the pipe their names say (``pipe``): tensor-core products, FP32-FMA
# products (conv1's forward, 20 kernels), no product (cuDNN's NCHW<->NHWC transposes, split-K reductions, memsets)
PIPES = {"pytorch-bf16": {"tensor": 9439775, "fma": 1622649, "none": 4553986},
         "pytorch-cuda-graph-bf16": {"tensor": 9465057, "fma": 1613275, "none": 4704616},
         "jax-bf16": {"tensor": 3559652, "fma": 1933904, "none": 1153531}}
TIMED = {"pytorch-bf16": "kineto", "pytorch-cuda-graph-bf16": "kineto", "jax-bf16": "xla_trace"}

API = {"aten::cudnn_convolution": "cudnnBackendExecute", "aten::convolution_backward": "cudnnBackendExecute",
       "aten::addmm": "cublasLtMatmul", "aten::mm": "cublasGemmEx"}  # PyTorch's entry points into the libraries
DIRECTION = {"CONVOLUTION_FORWARD": "fwd", "CONVOLUTION_BACKWARD_FILTER": "bwd_weight",
             "CONVOLUTION_BACKWARD_DATA": "bwd_data"}
SHORT = {"BFLOAT16": "bf16", "FLOAT": "fp32", "HALF": "fp16", "CUDA_R_16BF": "bf16", "R_16BF": "bf16",
         "CUBLAS_COMPUTE_32F": "fp32", "COMPUTE_32F": "fp32", "R_32F": "fp32"}


# --- stdlib readers of the raw files ------------------------------------------------------------------------------
def _text(path: Path) -> str:
    raw = path.read_bytes()
    return (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()


def _events(path: Path) -> list[dict]:
    return json.loads(_text(path))["traceEvents"]


def cudnn_executes(path: Path) -> collections.Counter:
    """(operation, 'name=TYPE ...' of its tensors, compute type) of each cudnnBackendExecute call's block (the one
    that prints the execution plan; its second block is the returned status)."""
    out: collections.Counter = collections.Counter()
    for block in _text(path).split("\nI! CuDNN")[1:]:
        if "function cudnnBackendExecute() called:" not in block.split("\n", 1)[0] or "executionPlan:" not in block:
            continue
        op = re.search(r"operation: type=CUDNN_BACKEND_OPERATION_(\w+?)_DESCRIPTOR", block)[1]
        tensors = re.findall(r"\b(\w+)Desc: type=CUDNN_BACKEND_TENSOR_DESCRIPTOR:\n\S+\s+type: type=cudnnDataType_t; "
                             r"val=CUDNN_DATA_(\w+) ", block)
        compute = re.search(r"computeType: type=cudnnDataType_t; val=CUDNN_DATA_(\w+) ", block)[1]
        out[(op, " ".join(f"{n}={t}" for n, t in tensors), compute)] += 1
    return out


def cublas_gemms(path: Path) -> collections.Counter:
    out: collections.Counter = collections.Counter()
    for block in _text(path).split("\nI! cuBLAS")[1:]:
        if " cublasGemmEx(" not in block.split("\n", 1)[0]:
            continue
        t = dict(re.findall(r"i!\s+(Atype|Btype|Ctype|computeType): type=\w+; val=(\w+?)\(\d+\)", block))
        mode = re.search(r"MathMode=(\w+)", block)[1]
        out[(t["Atype"], t["Btype"], t["Ctype"], t["computeType"], mode)] += 1
    return out


def cublaslt_matmuls(path: Path) -> collections.Counter:
    out: collections.Counter = collections.Counter()
    for line in _text(path).splitlines():
        if "[Trace][cublasLtMatmul]" not in line:
            continue
        types = re.findall(r"\b[ABCD]desc=\[type=(\w+)", line)
        comp = re.search(r"computeType=(\w+) scaleType=(\w+)", line)
        epi = re.search(r"epilogue=(\w+)", line)
        out[(*types, comp[1], comp[2], epi[1] if epi else "EPILOGUE_DEFAULT")] += 1
    return out


def hlo_library_calls(path: Path) -> collections.Counter:
    """(target, operand element types, first result element type) of each __cudnn$/__cublas$ custom call."""
    text = _text(path)
    kind = dict(re.findall(r"^\s*(?:ROOT )?%([\w.\-]+) = \(?([a-z]+\d*)\[", text, re.M))
    out: collections.Counter = collections.Counter()
    for m in re.finditer(r"^\s*(?:ROOT )?%[\w.\-]+ = \(?([a-z]+\d*)\[.*? custom-call\(([^)]*)\).*"
                         r'custom_call_target="(__cu(?:dnn|blas)\$[\w$]+)"', text, re.M):
        operands = tuple(kind[o.strip().lstrip("%")] for o in m[2].split(","))
        out[(m[3], operands, m[1])] += 1
    return out


def _innermost(ops: dict, pid_tid, ts) -> str | None:
    around = [o for o in ops.get(pid_tid, []) if o[0] <= ts <= o[1]]
    return max(around)[2] if around else None


def kineto_library_kernels(path: Path, kinds=("kernel",)) -> list[tuple[str, str, int]]:
    """(entry op, kernel name, ns) of each device event a library entry op (``API``) launched: device event ->
    runtime call (correlation) -> the innermost cpu_op around the call on its thread; PyTorch's own kernels
    (``at::native``) left out."""
    ev = _events(path)
    ops: dict = {}
    for e in ev:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            ops.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e.get("dur", 0), e["name"]))
    launch = {e["args"]["correlation"]: e for e in ev if e.get("ph") == "X"
              and e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    out = []
    for e in ev:
        if e.get("ph") != "X" or e.get("cat") not in kinds or "at::native" in e["name"]:
            continue
        r = launch.get(e["args"].get("correlation"))
        op = _innermost(ops, (r["pid"], r["tid"]), r["ts"]) if r else None
        if op in API:
            out.append((op, e["name"], round(e["dur"] * 1000)))
    return out


def replayed_library_kernels(case: Path) -> list[tuple[str, int]]:
    """(name, ns) of the cuda-graph case's replayed library kernels: the kernels of the replayed trace named as the
    reference step's library kernels (``kineto_library_kernels`` of graph-reference.json.gz), and its memset
    nodes (the reference step's cuDNN memsets, which a graph replays as kernels ``memset32`` / ``memset8``)."""
    names = {n for _, n, _ in kineto_library_kernels(case / "graph-reference.json.gz")}
    return [(e["name"], round(e["dur"] * 1000)) for e in _events(case / "trace.json.gz")
            if e.get("ph") == "X" and e.get("cat") == "kernel" and (e["name"] in names or e["name"].startswith("memset"))]


def nsys_library_kernels(path: Path, tmp: Path) -> list[tuple[str, str, int]]:
    """(entry op, demangled name, ns) per kernel of an nsys export whose launch lies in an entry op's NVTX range
    (PyTorch's ``aten::mm, seq = ..., op_id = ...``) innermost on the launching thread."""
    db = tmp / "nsys.sqlite"
    db.write_bytes(gzip.decompress(path.read_bytes()))
    con = sqlite3.connect(db)
    strings = dict(con.execute("select id, value from StringIds"))
    ranges: dict = {}
    for s, e, text, tid, g in con.execute('select start, "end", text, textId, globalTid from NVTX_EVENTS '
                                          'where eventType = 59 and "end" is not null'):
        ranges.setdefault(g, []).append((s, e, (text if text is not None else strings.get(tid, "")).split(",")[0]))
    launch = {c: (t, g) for c, t, g in con.execute("select correlationId, start, globalTid from CUPTI_ACTIVITY_KIND_RUNTIME")}
    out = []
    for cid, name, s, e in con.execute('select correlationId, demangledName, start, "end" from CUPTI_ACTIVITY_KIND_KERNEL'):
        t, g = launch.get(cid, (None, None))
        op = _innermost(ranges, g, t) if t is not None else None
        if op in API and "at::native" not in strings[name]:
            out.append((op, strings[name], e - s))
    return out


def xla_library_kernels(path: Path) -> list[tuple[str, str, int]]:
    """(name, hlo_op, ns) of the device kernels of an XLA trace that cuDNN or cuBLAS launched, by their names
    (XLA's own kernels are named after their HLO fusion: loop_*, input_*, wrapped_*, gemm_fusion_*, triton_*)."""
    ev = _events(path)
    pname = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"}
    lib = re.compile(r"xmma|cudnn|cutlass|nvjet|convolve_|cask_|cublas")
    return [(e["name"], e["args"].get("hlo_op", ""), round(e["dur"] * 1000)) for e in ev
            if e.get("ph") == "X" and pname.get(e["pid"], "").startswith("/device:") and lib.search(e["name"])
            and "memcpy_details" not in e["args"] and "Memset_details" not in e["args"]]


# the pipe a product kernel's name says (NVIDIA's names: xmma ..._bf16bf16_bf16f32 and CUTLASS tensorop / MmaTensorOp
# kernels are tensor-core MMA, nvjet is cuBLAS's sm90 wgmma GEMM; implicit_convolve_sgemm and
# convolve_common_engine_float are cuDNN's SIMT kernels); the rest move or reduce data (no product): an xmma GEMM's
# ..._execute_split_k_kernel is its split-K sum (FADD only, no tensor op: the 4x H200 JAX bf16 ncu capture,
# tests/test_gpu_jax_counters_run.py)
TENSOR = re.compile(r"xmma_\w*_bf16bf16_bf16f32(?!\w*_execute_split_k_kernel)|_tensorop_(?:bf16_)?s16\d+|MmaTensorOp"
                    r"|^nvjet_sm90_")
FMA = re.compile(r"implicit_convolve_sgemm<__nv_bfloat16|convolve_common_engine_float_NHWC<__nv_bfloat16")
NO_PRODUCT = re.compile(r"To(?:Nhwc|Nchw)Kernel|ReduceSplitK|splitKreduce|^memset|init_device_workspace"
                        r"|_execute_split_k_kernel")


def pipe(name: str) -> str:
    hits = [p for p, rule in (("tensor", TENSOR), ("fma", FMA), ("none", NO_PRODUCT)) if rule.search(name)]
    assert len(hits) == 1, (name, hits)  # a kernel none of the rules (or two) knows fails here
    return hits[0]


# --- the run, normalised again -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    from kernelmap.normalise import normalise_run_dir

    d = tmp_path_factory.mktemp("bf16") / "run"
    shutil.copytree(FIXTURE, d, ignore=shutil.ignore_patterns("*.py", "README.md", "__pycache__"))
    normalise_run_dir(d)
    return d


@pytest.fixture(scope="module")
def records(run_dir) -> pd.DataFrame:
    from kernelmap import schema

    return schema.read_parquet(run_dir / "records.parquet")


def _case(case: str) -> Path:
    return FIXTURE / case / f"bs{BS}"


def _attr(run_dir: Path, case: str) -> dict:
    return json.loads((run_dir / "attribution.json").read_text())["runs"][f"{case}/bs{BS}"]


@pytest.mark.parametrize("case", sorted(CUDNN_CASES))
def test_library_calls_by_math(case, records):
    folder = _case(case)
    cudnn = cudnn_executes(folder / "cudnn.log.gz")
    assert cudnn == CUDNN_CASES[case]
    assert cublas_gemms(folder / "cublas.log.gz") == CUBLAS[case]
    assert cublaslt_matmuls(folder / "cublaslt.log.gz") == CUBLASLT[case]
    rec = records[(records["run"] == f"{case}/bs{BS}") & (records["kind"] == "library_call")]
    # every cuDNN call: its direction, its operands' type (bf16 where all are), its log's types
    got = collections.Counter(zip(rec.loc[rec["source"] == "cudnn_log", "direction"],
                                  rec.loc[rec["source"] == "cudnn_log", "math_ran"],
                                  rec.loc[rec["source"] == "cudnn_log", "math_dtypes"], strict=True))
    want: collections.Counter = collections.Counter()
    for (op, tensors, compute), n in cudnn.items():
        types = {t.split("=")[1] for t in tensors.split()}
        dtypes = " ".join(f"{t.split('=')[0]}={SHORT[t.split('=')[1]]}" for t in tensors.split())
        want[(DIRECTION[op], "bf16" if types == {BF} else "?", f"{dtypes} compute={SHORT[compute]}")] += n
    assert {(d, m, frozenset(t.split())): n for (d, m, t), n in got.items()} == \
        {(d, m, frozenset(t.split())): n for (d, m, t), n in want.items()}
    for source, raw in (("cublas_log", CUBLAS[case]), ("cublaslt_log", CUBLASLT[case])):
        r = rec[rec["source"] == source]
        assert len(r) == sum(raw.values())
        assert (r["math_ran"] == "bf16").all() == all(set(k[:3]) <= {"CUDA_R_16BF", "R_16BF"} for k in raw)
        assert r["math_dtypes"].str.contains("compute=fp32").all()
    if case == "jax-bf16":
        xla = rec[rec["source"] == "xla_trace"]
        hlo = hlo_library_calls(folder / "jit__train_step.hlo.txt.gz")
        assert hlo == HLO_CALLS
        per_step = {k: v / STEPS for k, v in collections.Counter(xla["library_call"]).items()}
        assert per_step == {t: sum(n for (tt, _, _), n in hlo.items() if tt == t) for t, _, _ in hlo}
        assert (xla["math_ran"] == "bf16").all() and set(xla["math_source"]) == {"hlo"}


def _library_kernels(records: pd.DataFrame, case: str, source: str) -> pd.DataFrame:
    from kernelmap import attribution

    k = records[(records["run"] == f"{case}/bs{BS}") & (records["kind"] == "kernel") & (records["source"] == source)]
    k = k.reset_index(drop=True)
    return k.loc[attribution.library_kernels(k).index]


def _raw_kernels(case: str, source: str, tmp: Path) -> list[tuple[str | None, str, int]]:
    """(library call by the launching entry op where the trace says it, kernel name, ns) from the raw files."""
    folder = _case(case)
    if source == "kineto" and case == "pytorch-bf16":
        return [(API[op], n, d) for op, n, d in kineto_library_kernels(folder / "trace.json.gz")]
    if source == "nsys":
        return [(API[op], n, d) for op, n, d in nsys_library_kernels(folder / "nsys.sqlite.gz", tmp)]
    if source == "kineto":
        return [(None, n, d) for n, d in replayed_library_kernels(folder)]
    return [(None, n, d) for n, _, d in xla_library_kernels(folder / "trace.json.gz")]


@pytest.mark.parametrize("case, source", sorted(KERNELS))
def test_library_kernels_linked_to_their_call(case, source, run_dir, records, tmp_path):
    raw = _raw_kernels(case, source, tmp_path)
    assert (len(raw), sum(d for _, _, d in raw)) == KERNELS[(case, source)]
    b = _attr(run_dir, case)["by_source"][source]
    assert (b["library_kernels"], b["library_kernel_time_ns"]) == KERNELS[(case, source)]
    assert (b["library_kernels_linked"], b["library_kernel_time_linked_ns"]) == KERNELS[(case, source)]
    k = _library_kernels(records, case, source)
    assert k["call_event_id"].notna().all() and len(k) == len(raw)
    assert collections.Counter(k["kernel_name"]) == collections.Counter(n for _, n, _ in raw)
    if raw[0][0] is not None:  # the entry op says the API: each kernel's linked call is one of that API
        calls = records[(records["run"] == f"{case}/bs{BS}") & (records["kind"] == "library_call")]
        api = calls.drop_duplicates("event_id").set_index("event_id")["library_call"]
        got = collections.Counter(zip(api.reindex(k["call_event_id"]).to_numpy(), k["kernel_name"], strict=True))
        assert got == collections.Counter((a, n) for a, n, _ in raw)


@pytest.mark.parametrize("case", ["pytorch-bf16", "pytorch-cuda-graph-bf16"])
def test_the_libs_pass_counts_its_library_kernels_as_the_timing_passes(case, run_dir):
    """One rule for a library kernel (``attribution.library_kernel_mask``): the libs pass's own trace counts as many
    as the stdlib reader finds there and as the Kineto pass has (eager: 520, every one owned by its call; cuda-graph:
    580 replayed outside any op, none owned there: its reference step owns them, ``link_replayed``)."""
    libs = FIXTURE / case / f"bs{BS}" / "libs"
    graph = "graph" in case
    raw = replayed_library_kernels(libs) if graph else kineto_library_kernels(libs / "trace.json.gz")
    run = _attr(run_dir, case)
    assert run["libs_trace_library_kernels"] == len(raw) == run["by_source"]["kineto"]["library_kernels"]
    assert run["libs_trace_kernels_owned"] == (0 if graph else len(raw))
    assert any("ran outside any op" in n for n in run["libs_pass_notes"]) == graph


def test_a_mangled_kineto_name_is_the_kernel_nsys_demangles():
    """cuDNN's CUTLASS wgrad kernel of conv1 (bwd_weight): Kineto records its name mangled, nsys demangled; the
    nsys pass's 100 conv1 bwd_weight kernels were left unlinked (420 of 520, 56.5% of the time, "each process of
    this case chose its own algorithms") until both named one function (``calllink.mangled_head``)."""
    from kernelmap.reports.analyses.roofline import kernel_key

    from kernelmap.calllink import mangled_head, short_name

    kin = {n for _, n, _ in kineto_library_kernels(_case("pytorch-bf16") / "trace.json.gz") if n.startswith("_Z")}
    with sqlite3.connect(":memory:") as con:
        con.deserialize(gzip.decompress((_case("pytorch-bf16") / "nsys.sqlite.gz").read_bytes()))
        nsys = {v for (v,) in con.execute("select s.value from CUPTI_ACTIVITY_KIND_KERNEL k join StringIds s "
                                          "on s.id = k.demangledName") if "ImplicitGemmConvolution" in v}
    (mangled,), (demangled,) = kin, nsys
    assert len(mangled) > 1600 and demangled.startswith("void cutlass__5x_cudnn::Kernel<cutlass__5x_cudnn::conv::")
    assert mangled_head(mangled) == ("cutlass__5x_cudnn::Kernel", "ImplicitGemmConvolution")
    assert short_name(mangled) == short_name(demangled) == "cutlass__5x_cudnn::Kernel"
    assert kernel_key(mangled) == kernel_key(demangled) == "Kernel<ImplicitGemmConvolution"
    assert mangled_head(demangled) is None and mangled_head("_Z") is None


@pytest.mark.parametrize("case", sorted(TIMED))
def test_math_known_for_all_library_kernel_time_and_as_asked(case, run_dir, records):
    from kernelmap.reports.analyses import math as M
    from kernelmap.reports.analyses.base import load_run
    from kernelmap.reports.mathchecks import math_checks

    from kernelmap import schema

    n, ns = KERNELS[(case, TIMED[case])]
    k = _library_kernels(records, case, TIMED[case])
    assert (k["math_ran"] == "bf16").sum() == n and int(k.loc[k["math_ran"].notna(), "dur_ns"].sum()) == ns
    run = load_run(run_dir)
    cov = M.math_coverage([run]).set_index("case").loc[case]
    assert (cov["kernels"], cov["kernels_with_math"], cov["share"]) == (n, n, 1.0)
    assert cov["with_math_ms_per_step"] == pytest.approx(ns / STEPS / 1e6, abs=1e-12)
    checks = pd.DataFrame(math_checks(run))
    mine = checks[checks["framework"] == case]
    assert list(zip(mine["check"], mine["status"], mine["measured"], strict=True)) == [
        ("math as asked", "pass", "bf16"), ("math known", "pass", "100.0%")]
    # the same records under an fp32 label: every product ran bf16, not fp32
    mine = run.records["run"] == f"{case}/bs{BS}"
    run.records["math"] = pd.array(run.records["math"].astype(object).where(~mine, "fp32"), dtype=schema.DTYPES["math"])
    bad = pd.DataFrame(math_checks(run))
    bad = bad[(bad["framework"] == case) & (bad["check"] == "math as asked")]
    assert list(bad["status"]) == ["FAIL"] and "ran bf16" in bad["detail"].iat[0]


@pytest.mark.parametrize("case", sorted(PIPES))
def test_products_by_pipe(case, records, tmp_path):
    """Tensor-core products, FP32-FMA products and data movement by the kernels' names, exact ns of the timed
    source; the FMA kernels are conv1's forward and nothing else, and the math column calls them bf16 (their
    operands' type)."""
    raw = _raw_kernels(case, TIMED[case], tmp_path)
    by: collections.Counter = collections.Counter()
    for _, name, ns in raw:
        by[pipe(name)] += ns
    assert dict(by) == PIPES[case]
    k = _library_kernels(records, case, TIMED[case])
    fma = k[[pipe(n) == "fma" for n in k["kernel_name"]]]
    assert len(fma) == STEPS and int(fma["dur_ns"].sum()) == PIPES[case]["fma"]
    assert set(zip(fma["layer"], fma["direction"], fma["math_ran"], strict=True)) == {("conv1", "fwd", "bf16")}
    # the records' math_unit (kernelmath's name rules) is this reader's pipe, kernel by kernel
    assert list(k["math_unit"].astype(str)) == [pipe(n) for n in k["kernel_name"]]
    products = PIPES[case]["tensor"] + PIPES[case]["fma"]
    share = {"pytorch-bf16": 0.8533, "pytorch-cuda-graph-bf16": 0.8544, "jax-bf16": 0.6480}[case]
    assert round(PIPES[case]["tensor"] / products, 4) == share


def hlo_linear_gradients(path: Path, batch: int) -> dict[str, tuple[str, str]]:
    """HLO instruction -> (layer, direction) of each backward dot of a linear layer (``transpose(jvp(CNN))/fcN/``),
    by its result's shape: [batch, in] is the input's gradient (bwd_data); one whose last two dimensions are
    the layer's kernel (in, out), split-K partials in front, is the weight's (bwd_weight)."""
    kernels = {"fc1": [3136, 128], "fc2": [128, 10]}
    entry = re.search(r"^ENTRY .*?^}", _text(path), re.M | re.S)[0]  # what runs: not the fusions' bodies
    out = {}
    for m in re.finditer(r"^\s*(?:ROOT )?%([\w.\-]+) = [a-z]+\d*\[([\d,]*)\]\S* (?:fusion|dot)\(.*"
                         r'op_name="[^"]*transpose\(jvp\(CNN\)\)/(fc\d)/', entry, re.M):
        dims = [int(d) for d in m[2].split(",")]
        if dims == [batch, kernels[m[3]][0]]:
            out[m[1]] = (m[3], "bwd_data")
        elif dims[-2:] == kernels[m[3]]:
            out[m[1]] = (m[3], "bwd_weight")
    return out


@pytest.mark.parametrize("folder, batch", [(_case("jax-bf16"), BS), (DATA / "jax_cpu", 64)])
def test_jax_linear_backward_directions(folder, batch):
    """Under the bf16 policy XLA's input-gradient dots read the kernel's bf16 cast (``wrapped_convert.1 =
    fusion(params__fc1____kernel__.1)``), on the CPU a layout copy of it: each was called bwd_weight, leaving
    bwd_data of fc1 and fc2 empty (``xla_trace._from_param``)."""
    from kernelmap import adapters

    want = hlo_linear_gradients(next(folder.glob("*.hlo.txt*")), batch)
    assert sorted(want.values()) == [("fc1", "bwd_data"), ("fc1", "bwd_weight"), ("fc2", "bwd_data"), ("fc2", "bwd_weight")]
    df = adapters.read(folder / "trace.json.gz")
    rows = df[df["kind"] == ("kernel" if "gpu" in str(folder) else "op")]
    name = rows["op_name"].astype(str).str.split(" ").str[0]
    got = {n: (lay, d) for n, lay, d in zip(name, rows["layer"], rows["direction"], strict=True) if n in want}
    assert got == want
