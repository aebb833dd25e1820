"""cuBLASLt log (``CUBLASLT_LOG_LEVEL=5``): lines ``[date time][cublasLt][TID][Level][function] ...``.

The third bracket is the logging thread's OS id (the main thread's equals the pid; the autograd
thread has its own), kept as ``tid``. Each ``[Api][cublasLtMatmul]`` line is one call (kind
``library_call``, library cuBLASLt); its shapes, compute type and algorithm come from the next
``[Trace][cublasLtMatmul]`` line of the same thread (Adesc/Bdesc ``rows``/``cols``/``batchCount``,
``computeType``, ``algo=[algoId=N ...]``). ``[Trace][cublasLtSSSMatmul]`` (and other typed
internal variants) are matmuls cuBLAS itself runs through cuBLASLt (e.g. for ``cublasSgemm_v2``):
not calls of the framework, counted in ``df.attrs["internal_matmuls"]``. Other API functions are
counted in ``df.attrs["calls"]``. Time has second resolution.
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
from ..schema import phase_of
from . import mathtypes as MT
from ._common import finish, read_text
from .canonical import linear_layer
from .cublas_log import gemm_direction

SOURCE = "cublaslt_log"
_LINE = re.compile(r"^\[([^\]]+)\]\[cublasLt\]\[(\d+)\]\[(\w+)\]\[(\w+)\]\s?(.*)$")
_DESC = re.compile(r"\b([ABCD])desc=\[([^\]]*)\]")
_KV = re.compile(r"(\w+)=([^\s\]]+)")
_ALGO = re.compile(r"\balgo=\[([^\]]*)\]")
_COMPUTE = re.compile(r"computeType=(\w+)")
_SCALE = re.compile(r"scaleType=(\w+)")
_MATH = {"COMPUTE_32F": "fp32", "COMPUTE_32F_PEDANTIC": "fp32", "COMPUTE_32F_FAST_TF32": "tf32",
         "COMPUTE_32F_FAST_16F": "fp16", "COMPUTE_32F_FAST_16BF": "bf16", "COMPUTE_16F": "fp16",
         "COMPUTE_64F": "fp64"}


def sniff(head: bytes) -> bool:
    return re.search(rb"^\[[^\]]+\]\[cublasLt\]\[\d+\]", head, re.M) is not None


def read(path: str | os.PathLike) -> pd.DataFrame:
    text = read_text(path)
    calls: Counter = Counter()
    internal = 0
    rows: list[dict] = []
    waiting: dict[int, int] = {}  # tid -> row awaiting its Trace line
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _LINE.match(line)
        if not m:
            raise ParseError(path, "not a cuBLASLt log line", line=lineno)
        stamp, tid, level, func, rest = m.group(1), int(m.group(2)), m.group(3), m.group(4), m.group(5)
        if level == "Api":
            calls[func] += 1
            if func == "cublasLtMatmul":
                try:
                    t = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
                except ValueError:
                    raise ParseError(path, f"bad timestamp {stamp!r}", line=lineno) from None
                waiting[tid] = len(rows)
                rows.append({"start_ns": int(t.timestamp()) * 10**9, "tid": tid, "shapes": None,
                             "algo": None, "math_mode": None, "layer": None, "direction": None, "flops": None,
                             "math_ran": None, "math_dtypes": None})
        elif level == "Trace":
            if func == "cublasLtMatmul" and tid in waiting:
                row = rows[waiting.pop(tid)]
                shapes = []
                descs = _DESC.findall(rest)
                for _, body in descs[:2]:
                    kv = dict(_KV.findall(body))
                    try:
                        shape = [int(kv["rows"]), int(kv["cols"])]
                        if "batchCount" in kv:
                            shape = [int(kv["batchCount"]), *shape]
                    except (KeyError, ValueError):
                        raise ParseError(path, f"matrix layout without integer rows/cols: {body[:80]!r}",
                                         line=lineno) from None
                    shapes.append(shape)
                row["shapes"] = json.dumps(shapes, separators=(",", ":")) if shapes else None
                a = _ALGO.search(rest)
                if a:
                    row["algo"] = dict(_KV.findall(a.group(1))).get("algoId")
                c = _COMPUTE.search(rest)
                row["math_mode"] = _MATH.get(c.group(1)) if c else None
                row["math_ran"], row["math_dtypes"] = _ran(descs, c.group(1) if c else None, _SCALE.search(rest))
                weights = [s for s in shapes if len(s) == 2]
                hits = {linear_layer(s) for s in weights if linear_layer(s)}
                row["layer"] = hits.pop() if len(hits) == 1 else None
                if len(shapes) == 2:
                    trans = dict(_KV.findall(rest.split("computeDesc=[", 1)[-1].split("]", 1)[0]))
                    (ar, ac), (br, bc) = shapes[0][-2:], shapes[1][-2:]
                    m, k = (ac, ar) if trans.get("transa") == "OP_T" else (ar, ac)
                    n = br if trans.get("transb") == "OP_T" else bc
                    row["flops"] = gemm_call_flops(m, n, k, shapes[0][0] if len(shapes[0]) == 3 else 1)
                    if row["layer"] and len(shapes[0]) == 2 and len(shapes[1]) == 2:
                        row["direction"] = gemm_direction(row["layer"], m, n, k)
            elif func.startswith("cublasLt") and func.endswith("Matmul") and func != "cublasLtMatmul":
                internal += 1
    df = pd.DataFrame(rows, columns=["start_ns", "tid", "shapes", "algo", "math_mode", "layer", "direction", "flops",
                                     "math_ran", "math_dtypes"])
    n = len(df)
    cols = {
        "kind": ["library_call"] * n, "library": ["cuBLASLt"] * n, "device": ["gpu"] * n,
        "library_call": ["cublasLtMatmul"] * n, "op_name": ["cublasLtMatmul"] * n,
        "shapes": df["shapes"].tolist(), "algo": df["algo"].tolist(), "math_mode": df["math_mode"].tolist(),
        "layer": df["layer"].tolist(), "direction": df["direction"].tolist(),
        "phase": [phase_of(d) for d in df["direction"]],
        "canonical_op": ["linear" if isinstance(v, str) else None for v in df["layer"]],
        "start_ns": pd.array(df["start_ns"].tolist(), dtype="Int64"),
        "tid": pd.array(df["tid"].tolist(), dtype="Int64"),
        "flops": pd.array(df["flops"].tolist(), dtype="Int64"),
        "math_ran": df["math_ran"].tolist(), "math_dtypes": df["math_dtypes"].tolist(),
        "math_source": ["log" if isinstance(m, str) or isinstance(t, str) else None
                        for m, t in zip(df["math_ran"], df["math_dtypes"], strict=True)],
    }
    out = finish(cols, path, SOURCE)
    out.attrs["calls"] = dict(calls)
    out.attrs["internal_matmuls"] = internal
    return out


def _ran(descs: list[tuple[str, str]], compute: str | None, scale) -> tuple[str | None, str | None]:
    """(math_ran, math_dtypes) of a matmul from its Trace line: A and B layouts' ``type=`` (the operands),
    C and D's, ``computeType`` (TF32, BF16, FP16 down-conversion of fp32 operands: ``COMPUTE_32F_FAST_*``)
    and ``scaleType``. cuBLASLt ignores the cuBLAS handle's math mode: a plain ``COMPUTE_32F`` on fp32
    operands never uses TF32."""
    types = {name.lower(): MT.type_name(dict(_KV.findall(body)).get("type")) for name, body in descs}
    math = MT.ran([types.get("a"), types.get("b")], False, MT.compute_math(compute))
    text = MT.dtypes_text(**types, compute=MT.compute_name(compute),
                          scale=MT.type_name(scale.group(1)) if scale else None)
    return math, text
