"""Nsight Compute (``ncu``) raw-page CSV: one row per profiled kernel, its hardware counters.

Read from ``ncu --csv --page raw`` output (printed while profiling, or ``ncu --import REPORT --csv --page raw
--print-units base``): a header row (``"ID","Process ID",...,"Kernel Name",...,<metric>.sum,...``), a row of
units, then one row per kernel in the order ncu profiled them (launch order: ncu serialises kernels). Lines
before the header that are not CSV rows (``==PROF==``, ``==ERROR==``, ``==WARNING==`` lines, the program's own
output) are skipped and counted; ncu's ``==ERROR==``/``==WARNING==`` lines are kept in
``df.attrs["profiler_messages"]`` (``ERR_NVGPUCTRPERM``: no permission to read the counters).

These are not schema records (docs/SCHEMA.md): the counters pass (``kernelmap run --profile counters``) keeps
them in ``RUN_DIR/<case>/bs<N>/counters/``, out of ``records.parquet``, and ``reports/analyses/roofline.py``
joins them to the kernel records of the timing passes (``match_kernels``). ``read`` returns ``COLUMNS``, one row
per kernel; a metric of ``METRICS`` that the file lacks (ncu leaves out a name the chip does not have) is NA
and named in ``df.attrs["missing_metrics"]``; a value that is not a number (``n/a``) is NA and named per
kernel in ``unmeasured``. Never silently dropped: a row of another width, a unit we cannot scale, or a file
without a header is a ``ParseError`` naming the line.

FLOPs per instruction kind (docs/COUNTERS.md, with sources): tensor-core math from ``sm__ops_path_tensor_src_*``
(math ops, an FMA counted as 2: conv2 forward at bs 64 counts 462,422,016 = 2*64*64*14*14*32*9 exactly in the
committed capture); FP32 ``2*FFMA + FADD + FMUL`` and half precision ``4*HFMA + 2*HADD + 2*HMUL`` per thread
instruction: Nsight Compute's own roofline sections count them so (``derived__..._ffma_pred_on_x2``,
``..._hfma_pred_on_x4``, ``..._hadd_pred_on_x2``: an HFMA2 is a packed pair of FMAs), as NERSC's roofline method
does for FP32.
"""

from __future__ import annotations

import csv
import io
import os
import re

import pandas as pd

from ..errors import ParseError
from ._common import read_bytes

SOURCE = "ncu"
# metric -> column: the counters pass's metric set (gh100 names, all in `ncu --query-metrics --chip gh100`;
# tests/data/ncu/README.md). ``.sum`` over the whole GPU.
METRICS = {
    "gpu__time_duration.sum": "duration_ns",
    "dram__bytes_read.sum": "dram_read_bytes",
    "dram__bytes_write.sum": "dram_write_bytes",
    "sm__ops_path_tensor_src_tf32_dst_fp32.sum": "tensor_ops_tf32",
    "sm__ops_path_tensor_src_bf16_dst_fp32.sum": "tensor_ops_bf16",
    "sm__ops_path_tensor_src_fp16.sum": "tensor_ops_fp16",
    "sm__sass_thread_inst_executed_op_ffma_pred_on.sum": "ffma",
    "sm__sass_thread_inst_executed_op_fadd_pred_on.sum": "fadd",
    "sm__sass_thread_inst_executed_op_fmul_pred_on.sum": "fmul",
    "sm__sass_thread_inst_executed_op_hfma_pred_on.sum": "hfma",
    "sm__sass_thread_inst_executed_op_hadd_pred_on.sum": "hadd",
    "sm__sass_thread_inst_executed_op_hmul_pred_on.sum": "hmul",
    "sm__inst_executed_pipe_tensor_op_hmma.sum": "tensor_pipe_hmma_inst",  # HMMA + HFMA2.MMA + HGMMA (warp inst)
    "sm__inst_executed_pipe_tensor_op_hmma_type_hfma2.sum": "tensor_pipe_hfma2_inst",  # HFMA2.MMA alone
    "sm__inst_executed_pipe_tensor_op_gmma.sum": "tensor_pipe_gmma_inst",
    "sm__cycles_elapsed.avg.per_second": "sm_clock_hz",
}
PASS_METRICS = tuple(METRICS)
# other spellings of the same counter (the probe capture's smsp__ name of the HMMA count)
ALIASES = {"smsp__inst_executed_pipe_tensor_op_hmma.sum": "tensor_pipe_hmma_inst"}
TENSOR_OPS = {"tf32": "tensor_ops_tf32", "bf16": "tensor_ops_bf16", "fp16": "tensor_ops_fp16"}
COLUMNS = ["id", "pid", "thread", "nvtx", "kernel_name", "stream", "grid", "block", "passes",
           *METRICS.values(), "unmeasured"]
# unit -> factor to the base unit (``--print-units base`` writes the base units; ncu's auto units scale)
UNITS = {"": 1, "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "ns": 1, "nsecond": 1, "usecond": 1e3,
         "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9, "inst": 1, "Kinst": 1e3, "Minst": 1e6,
         "Ginst": 1e9, "hz": 1, "Khz": 1e3, "Mhz": 1e6, "Ghz": 1e9, "Hz": 1, "KHz": 1e3, "MHz": 1e6, "GHz": 1e9,
         "cycle/second": 1, "cycle/msecond": 1e3, "cycle/usecond": 1e6, "cycle/nsecond": 1e9, "pass": 1}
_MESSAGE = re.compile(r"^==(ERROR|WARNING|PROF)==\s*(.*)$")
# the per-thread NVTX push/pop column and the start/end range column ("thread Domain:Push/Pop_Range:..." / "Id:...")
_NVTX_PUSHPOP = "thread Domain:Push/Pop_Range"


def sniff(head: bytes) -> bool:
    return b'"ID","Process ID","Process Name"' in head and b'"Kernel Name"' in head


def _header_at(lines: list[str], path) -> int:
    for i, line in enumerate(lines):
        if line.startswith('"ID","Process ID"'):
            return i
    raise ParseError(path, "no ncu CSV header (\"ID\",\"Process ID\",...): not `ncu --csv --page raw` output, "
                           "or ncu profiled no kernel (see its ==ERROR== lines)")


def messages(text: str) -> list[str]:
    """ncu's ``==ERROR==`` and ``==WARNING==`` lines of a log or CSV (``ERR_NVGPUCTRPERM``, replay failures)."""
    return [line.strip() for line in text.splitlines() if _MESSAGE.match(line) and not line.startswith("==PROF==")]


def _number(text: str, factor: float) -> float | None:
    t = text.strip().replace(",", "")
    try:
        return float(t) * factor
    except ValueError:
        return None


def _columns(header: list[str], units: list[str], path, line: int) -> dict[str, tuple[int, float]]:
    """column -> (index in the row, unit factor) for the metrics present."""
    found = {}
    for i, name in enumerate(header):
        col = METRICS.get(name) or ALIASES.get(name)
        if col is None or col in found:
            continue
        unit = units[i].strip() if i < len(units) else ""
        if unit not in UNITS:
            raise ParseError(path, f"metric {name}: unit {unit!r} is not one kernelmap scales (run ncu with "
                                   "--print-units base)", line)
        found[col] = (i, UNITS[unit])
    return found


def _pushpop(value: str) -> tuple[int | None, str | None]:
    """(thread, innermost push/pop range) of ncu's NVTX column: ``1224  "<default domain>:step2:none:..."``."""
    m = re.match(r"\s*(\d+)\s+\"(.*)\"\s*$", value or "")
    if not m:
        return None, None
    ranges = [r.split(":")[1] for r in m.group(2).split('" "') if r.count(":") >= 1]
    return int(m.group(1)), (ranges[-1] if ranges else None)


def read(path: str | os.PathLike) -> pd.DataFrame:
    """One row per profiled kernel (``COLUMNS``), in profiling order; see the module docstring."""
    text = read_bytes(path).decode("utf-8", errors="replace")
    lines = text.splitlines()
    h = _header_at(lines, path)
    rows = list(csv.reader(io.StringIO("\n".join(lines[h:]))))
    header, units, body = rows[0], rows[1] if len(rows) > 1 else [], rows[2:]
    if len(units) != len(header):
        raise ParseError(path, f"the units row has {len(units)} fields, the header {len(header)}", h + 2)
    cols = _columns(header, units, path, h + 2)
    idx = {name: header.index(name) for name in ("ID", "Process ID", "Kernel Name", "Stream", "Grid Size",
                                                  "Block Size") if name in header}
    missing_basic = [n for n in ("ID", "Kernel Name") if n not in idx]
    if missing_basic:
        raise ParseError(path, f"no {', '.join(missing_basic)} column in the ncu CSV header", h + 1)
    nvtx_i = next((i for i, c in enumerate(header) if c.startswith(_NVTX_PUSHPOP)), None)
    passes_i = header.index("profiler__replayer_passes") if "profiler__replayer_passes" in header else None
    out: dict[str, list] = {c: [] for c in COLUMNS}
    for n, row in enumerate(body):
        line = h + 3 + n
        if len(row) != len(header):
            raise ParseError(path, f"a kernel row of {len(row)} fields, the header has {len(header)}", line)
        try:
            out["id"].append(int(row[idx["ID"]]))
        except ValueError:
            raise ParseError(path, f"kernel ID {row[idx['ID']]!r} is not an integer", line) from None
        out["pid"].append(_int(row[idx["Process ID"]]) if "Process ID" in idx else None)
        thread, rng = _pushpop(row[nvtx_i]) if nvtx_i is not None else (None, None)
        out["thread"].append(thread)
        out["nvtx"].append(rng)
        out["kernel_name"].append(row[idx["Kernel Name"]])
        out["stream"].append(_int(row[idx["Stream"]]) if "Stream" in idx else None)
        out["grid"].append(row[idx["Grid Size"]] if "Grid Size" in idx else None)
        out["block"].append(row[idx["Block Size"]] if "Block Size" in idx else None)
        out["passes"].append(_int(row[passes_i]) if passes_i is not None else None)
        unmeasured = []
        for col in METRICS.values():
            if col not in cols:
                out[col].append(None)
                continue
            i, factor = cols[col]
            v = _number(row[i], factor)
            if v is None:
                unmeasured.append(f"{header[i]}={row[i].strip() or '(empty)'}")
            out[col].append(v)
        out["unmeasured"].append("; ".join(unmeasured) or None)
    df = pd.DataFrame(out, columns=COLUMNS)
    for c in ("id", "pid", "thread", "stream", "passes"):
        df[c] = pd.array(df[c], dtype="Int64")
    for c in METRICS.values():
        df[c] = pd.array(df[c], dtype="Float64")
    for c in ("nvtx", "kernel_name", "grid", "block", "unmeasured"):
        df[c] = df[c].astype("string")
    df.attrs.update(source=SOURCE, lines_skipped=h, profiler_messages=messages(text),
                    missing_metrics=[m for m, c in METRICS.items() if c not in cols])
    return df


def _int(text: str) -> int | None:
    v = _number(text, 1)
    return int(v) if v is not None and v == int(v) else None


# --- what the counters say each kernel computed -------------------------------------------------------
MATH_NONE = "none"  # no floating-point math counted (copies, layout kernels)
MATH_FP32 = "fp32"  # FP32 FMA/ADD/MUL on the CUDA cores, no tensor-core math
MATH_HALF = "fp16/bf16 (CUDA cores)"  # half-precision HFMA/HADD/HMUL only (the counters do not split fp16 from bf16)
MATH_MIXED = "mixed"
# FP32 arithmetic beside half-precision instructions that are HADD alone (no HFMA but HFMA2.MMA moves, no HMUL): on
# sm_80+ the compiler converts fp16 to fp32 with HADD2.F32, counted as a half add, so this is FP32 math on fp16 data
# or FP32 math and half adds, which the counters do not tell apart (docs/COUNTERS.md "HADD: an add or a conversion")
MATH_FP32_HADD = "fp32 + HADD"
MATH_UNKNOWN = "unknown"  # a metric the kind depends on was not measured
MIXED_SHARE = 0.10  # a second kind of math above this share of the kernel's FLOPs makes it "mixed"


def flops(df: pd.DataFrame) -> pd.DataFrame:
    """Per kernel: FLOPs by kind (``flops_tensor_<p>``, ``flops_fp32``, ``flops_half``; NA where its metric was
    not measured), ``flops`` (the measured kinds' sum) with ``flops_complete`` (False: a kind that may have run
    was not measured, so ``flops`` is a lower bound), DRAM ``bytes`` (read + write) and ``math``
    (``kernel_math``)."""
    out = pd.DataFrame(index=df.index)
    for p, col in TENSOR_OPS.items():
        out[f"flops_tensor_{p}"] = df[col]
    out["flops_fp32"] = 2 * df["ffma"] + df["fadd"] + df["fmul"]
    out["flops_half"] = 4 * df["hfma"] + 2 * df["hadd"] + 2 * df["hmul"]  # packed pairs: ncu's _x4 / _x2
    kinds = [*(f"flops_tensor_{p}" for p in TENSOR_OPS), "flops_fp32", "flops_half"]
    mma = tensor_math_inst(df)
    # a missing tensor metric matters only where a tensor instruction ran; a missing CUDA-core one always
    tensor_gap = out[kinds[:len(TENSOR_OPS)]].isna().any(axis=1) & ~mma.fillna(1).eq(0)
    core_gap = out[["flops_fp32", "flops_half"]].isna().any(axis=1)
    out["flops"] = out[kinds].sum(axis=1, skipna=True).where(out[kinds].notna().any(axis=1))
    out["flops_complete"] = ~(tensor_gap | core_gap)  # False: ``flops`` is a lower bound
    out["bytes"] = df["dram_read_bytes"] + df["dram_write_bytes"]
    # for the kind of math only: HFMA thread instructions that HFMA2.MMA (measured) can explain are not counted
    # (at most 32 a warp instruction); in the probe they were register moves of copy and add kernels
    moves = (32 * df["tensor_pipe_hfma2_inst"]).fillna(0)
    hfma = (df["hfma"] - moves).clip(lower=0)
    math_kinds = out[kinds].assign(flops_half=4 * hfma + 2 * df["hadd"] + 2 * df["hmul"])
    adds_only = (hfma.eq(0) & df["hmul"].eq(0)).fillna(False).to_numpy(dtype=bool)  # HADD the only half instruction
    out["math"] = [kernel_math(r, m, a) for r, m, a in zip(math_kinds.to_dict("records"), mma, adds_only, strict=True)]
    return out


def tensor_math_inst(df: pd.DataFrame) -> pd.Series:
    """Warp instructions of the tensor pipe that can be matrix math: HMMA/HGMMA (``..._op_hmma``, which also
    counts HFMA2.MMA, an FMA of two halves the compiler issues to the tensor pipe, often as a register move)
    less HFMA2.MMA where that was measured (else an upper bound), plus GMMA; NA where neither was measured."""
    hmma = df["tensor_pipe_hmma_inst"] - df["tensor_pipe_hfma2_inst"].fillna(0)
    return hmma.add(df["tensor_pipe_gmma_inst"].fillna(0))


def kernel_math(f: dict, mma_inst=None, half_adds_only: bool = False) -> str:
    """The math a kernel ran, from its FLOPs by kind (``flops``' columns): the tensor-core precision it counted
    (``tf32``, ``bf16``, ``fp16``: the log's ``math_mode`` values, so that a kernel's log math and counter math
    compare as strings), else ``fp32`` (FP32 FMA), else ``MATH_HALF``, else ``none``. A kind under
    ``MIXED_SHARE`` of the kernel's FLOPs is ignored (an FP32 epilogue of a tensor-core GEMM); two or more
    above it: ``mixed``, but ``MATH_FP32_HADD`` where the two are FP32 and half precision whose instructions were
    all HADD (``half_adds_only``: the HADD2.F32 that converts fp16 to fp32 is one). ``unknown`` where a metric the
    answer depends on was not measured: a tensor metric missing, unless ``mma_inst`` (``tensor_math_inst``) is 0,
    i.e. no tensor instruction could have run."""
    vals = {k: float(v) for k, v in f.items() if not pd.isna(v)}
    tensor_missing = any(k.startswith("flops_tensor_") and pd.isna(v) for k, v in f.items())
    no_mma = mma_inst is not None and not pd.isna(mma_inst) and float(mma_inst) == 0
    total = sum(v for v in vals.values() if v > 0)
    big = [k.removeprefix("flops_tensor_") if k.startswith("flops_tensor_") else
           ("fp32" if k == "flops_fp32" else MATH_HALF) for k, v in vals.items() if v > MIXED_SHARE * total and v > 0]
    tensor_seen = any(k.startswith("flops_tensor_") and v > 0 for k, v in vals.items())
    if (tensor_missing and not tensor_seen and not no_mma) or ("flops_fp32" not in vals and not total):
        return MATH_UNKNOWN
    if not big:
        return MATH_NONE
    if half_adds_only and sorted(big) == sorted([MATH_FP32, MATH_HALF]):
        return MATH_FP32_HADD
    return big[0] if len(big) == 1 else MATH_MIXED
