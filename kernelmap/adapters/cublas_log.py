"""cuBLAS API log (``CUBLAS_LOGINFO_DBG=1``, ``CUBLAS_LOGDEST_DBG=FILE``).

A call is a block: ``I! cuBLAS (v13.1.0) function cublasStatus_t cublasSgemm_v2(...) called:``,
``i!  name: type=T; val=V`` argument lines, ``i! Time: <date>T<hh:mm:ss> elapsed from start ...``
(second resolution) and ``i!Process=..; Thread=..; GPU=..; Handle=..; StreamId=..; MathMode=..``.
``Thread`` is the pthread handle, kept as ``tid``.

Records (kind ``library_call``, library cuBLAS) for the BLAS compute calls (gemm/gemv/ger/axpy/
scal/dot/geam/dgmm/trsm/syrk families, batched and Ex variants); handle/stream/workspace/math-mode
set-up calls are counted in ``df.attrs["calls"]`` only. For a gemm, ``shapes`` is
``[[m, k], [k, n]]`` (op(A), op(B)) and the layer is the spec ``linear`` layer whose weight
dimensions are two of (m, n, k); math mode from ``MathMode`` and the type prefix.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from datetime import UTC, datetime

import pandas as pd

from ..errors import ParseError
from ..flops import gemm_call_flops
from ..frameworks.spec import LAYERS
from ..schema import phase_of
from . import mathtypes as MT
from ._common import api_log_blocks, finish
from .canonical import linear_layer

SOURCE = "cublas_log"
_HEAD = re.compile(r"^I! cuBLAS \(v([\d.]+)\) function (?:[\w\s\*]+?\s)?(\w+)\((.*)\) called:\s*$")
_ARG = re.compile(r"^i!\s+(\w+): type=([^;]*); val=(.*)$")
_TIME = re.compile(r"^i! Time: (\S+)")
_PROC = re.compile(r"^i!\s*Process=(\d+); Thread=(\d+); GPU=([^;]*);(.*)$")
_MATH = re.compile(r"MathMode=(\w+)")
COMPUTE = re.compile(r"^cublas\w*?(gemm|gemv|ger|axpy|scal|dot|nrm2|geam|dgmm|trsm|syrk|herk|symm|asum|copy)\w*$",
                     re.I)


def sniff(head: bytes) -> bool:
    return re.search(rb"^I! cuBLAS \(v", head, re.M) is not None


def gemm_direction(layer: str | None, m: int, n: int, k: int) -> str | None:
    """fwd / bwd_data / bwd_weight of a linear layer's gemm (column-major m x n x k, cuBLAS view
    of row-major PyTorch/MXNet tensors), or None where the dims do not say it unambiguously."""
    w = next((x.weight_shape for x in LAYERS if x.name == layer), None)
    if w is None:
        return None
    out_f, in_f = w
    rest = [m, n, k]
    for d in (out_f, in_f):
        rest.remove(d)
    batch = rest[0]
    if len({out_f, in_f, batch}) < 3:
        return None
    if k == in_f:
        return "fwd"
    if k == out_f:
        return "bwd_data"
    return "bwd_weight" if k == batch else None


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def read(path: str | os.PathLike) -> pd.DataFrame:
    calls: Counter = Counter()
    rows = []
    for h, m, body in api_log_blocks(path, _HEAD, "cuBLAS"):
        func = m.group(2)
        calls[func] += 1
        if not COMPUTE.match(func):
            continue
        args: dict[str, str] = {}
        row: dict = {"library_call": func, "start_ns": None, "pid": None, "tid": None, "math": None}
        for ln in body:
            a = _ARG.match(ln)
            if a:
                args[a.group(1)] = a.group(3).strip()
                continue
            t = _TIME.match(ln)
            if t:
                try:
                    ts = datetime.fromisoformat(t.group(1)).replace(tzinfo=UTC)
                except ValueError:
                    raise ParseError(path, f"bad Time {t.group(1)!r}", line=h + 1) from None
                row["start_ns"] = int(ts.timestamp()) * 10**9
                continue
            p = _PROC.match(ln)
            if p:
                row["pid"], row["tid"] = int(p.group(1)), int(p.group(2))
                mm = _MATH.search(p.group(4))
                row["math"] = mm.group(1) if mm else None
        mm_, nn, kk = _int(args.get("m")), _int(args.get("n")), _int(args.get("k"))
        if "gemm" in func.lower() and None not in (mm_, nn, kk):
            row["shapes"] = json.dumps([[mm_, kk], [kk, nn]], separators=(",", ":"))
            row["layer"] = linear_layer([mm_, nn, kk])
            row["direction"] = gemm_direction(row["layer"], mm_, nn, kk)
            row["flops"] = gemm_call_flops(mm_, nn, kk, _int(args.get("batchCount")) if "batchCount" in args else 1)
        row["math_mode"] = _math(row["math"], func)
        row["math_ran"], row["math_dtypes"] = _ran(func, args, row["math"])
        rows.append(row)
    df = pd.DataFrame(rows, columns=["library_call", "start_ns", "pid", "tid", "math", "shapes", "layer", "direction",
                                     "math_mode", "flops", "math_ran", "math_dtypes"])
    layer = df["layer"].tolist()
    cols = {
        "kind": ["library_call"] * len(df), "library": ["cuBLAS"] * len(df), "device": ["gpu"] * len(df),
        "library_call": df["library_call"].tolist(), "op_name": df["library_call"].tolist(),
        "shapes": df["shapes"].tolist(), "layer": layer,
        "canonical_op": ["linear" if isinstance(v, str) else None for v in layer],
        "direction": df["direction"].tolist(),
        "phase": [phase_of(d) for d in df["direction"]],
        "math_mode": df["math_mode"].tolist(),
        "start_ns": pd.array(df["start_ns"].tolist(), dtype="Int64"),
        "pid": pd.array(df["pid"].tolist(), dtype="Int64"), "tid": pd.array(df["tid"].tolist(), dtype="Int64"),
        "flops": pd.array(df["flops"].tolist(), dtype="Int64"),
        "math_ran": df["math_ran"].tolist(), "math_dtypes": df["math_dtypes"].tolist(),
        "math_source": ["log" if isinstance(m, str) or isinstance(t, str) else None
                        for m, t in zip(df["math_ran"], df["math_dtypes"], strict=True)],
    }
    out = finish(cols, path, SOURCE)
    out.attrs["calls"] = dict(calls)
    return out


_PREFIX_TYPE = {"S": "fp32", "D": "fp64", "H": "fp16", "C": "fp32", "Z": "fp64"}


def _ran(func: str, args: dict[str, str], mode: str | None) -> tuple[str | None, str | None]:
    """(math_ran, math_dtypes) of a compute call: operands from ``Atype``/``Btype`` (the Ex calls) or the
    function's type letter (``cublasSgemm_v2``: fp32); TF32 from the compute type
    (``CUBLAS_COMPUTE_32F_FAST_TF32``) or, for fp32 operands under a plain compute type, the handle's
    ``MathMode`` (``CUBLAS_TF32_TENSOR_OP_MATH``); the deprecated ``CUBLAS_TENSOR_OP_MATH`` lets single-precision
    gemms compute in fp16 (``CUBLAS_COMPUTE_32F_FAST_16F``, cuBLAS' documentation). ``NVIDIA_TF32_OVERRIDE=0``
    is not in this log: ``kernelmap.kernelmath.apply_override`` applies it where the run's cuDNN log says it."""
    letter = func.removeprefix("cublas")[:1].upper()
    a, b, c = (MT.type_name(args.get(k)) for k in ("Atype", "Btype", "Ctype"))
    if "Atype" not in args:
        a = b = c = _PREFIX_TYPE.get(letter)
    compute_raw = args.get("computeType")
    compute = MT.compute_name(compute_raw) or (a if func.startswith(("cublasSgemmEx", "cublasCgemmEx")) else None)
    imposed = MT.compute_math(compute_raw)
    if imposed is None and compute == "fp32" and mode == "CUBLAS_TENSOR_OP_MATH" and a == "fp32":
        imposed = MT.MathRan.FP16
    pedantic = bool(compute_raw and "PEDANTIC" in compute_raw)
    # a block without its trailer has no MathMode: TF32 unknown for fp32 operands (no math, never a guess)
    tf32 = False if pedantic else ("TF32" in mode if mode else None)
    math = MT.ran([a, b] if "Atype" in args or letter in _PREFIX_TYPE else [], tf32, imposed)
    return math, MT.dtypes_text(a=a, b=b, c=c, compute=compute, mode=(mode or "").removeprefix("CUBLAS_") or None,
                                tf32=MT.tf32_unknown([a, b], tf32, imposed))


def _math(mode: str | None, func: str) -> str | None:
    if mode and "TF32" in mode:
        return "tf32"
    base = func.removeprefix("cublas")[:1].upper()
    by_type = {"S": "fp32", "D": "fp64", "H": "fp16", "C": "fp32", "Z": "fp64"}.get(base)
    if mode and mode == "CUBLAS_TENSOR_OP_MATH" and base == "S":
        return "fp16"  # the deprecated mode lets cuBLAS down-convert fp32 inputs to fp16
    return by_type
