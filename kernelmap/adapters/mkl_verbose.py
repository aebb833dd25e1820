"""oneMKL verbose output (``MKL_VERBOSE=1``; ``kernelmap run`` sets ``MKL_VERBOSE_OUTPUT_FILE``
to ``blas.log`` in the CPU ``libs`` pass). PyTorch's CPU ``linear`` (``aten::addmm``/``aten::mm``)
calls MKL's sgemm; MXNet's FullyConnected runs as a oneDNN ``inner_product`` instead.

Accepted line shapes (oneMKL 2024.0, as torch 2.x from PyPI prints them)::

    MKL_VERBOSE oneMKL 2024.0 Update 2 Product build 20240605 for Intel(R) 64 architecture ...
    MKL_VERBOSE SGEMM(T,N,128,64,3136,0x7ffd...,0x5625...,3136,...,128) 4.64ms CNR:OFF Dyn:1 FastMM:1 TID:0  NThr:2

The first is the version banner (counted in ``df.attrs["info_lines"]``, version kept in
``df.attrs["mkl_version"]``). Each call line is one ``library_call`` row, library BLAS,
``library_call`` = ``op_name`` = the function as MKL names it (``SGEMM``), ``dur_ns`` from its
time (``ns``/``us``/``ms``/``s``), no start (MKL logs none). For the gemm family the arguments are
``(transa, transb, m, n, k, ...)`` in BLAS's column-major view: ``shapes`` is ``[[m, k], [k, n]]``
(op(A), op(B)), ``flops`` ``2·m·n·k``, and layer and direction come from the spec's linear
layers as for cuBLAS (``canonical.linear_layer``, ``cublas_log.gemm_direction``). Other functions are
recorded with their name and time only. ``NThr`` (MKL threads) is kept in ``attrs["threads"]``;
``TID`` is MKL's own thread index, not an OS id, and is not kept.

Lines without the ``MKL_VERBOSE`` prefix are skipped and counted in ``df.attrs["skipped_lines"]``;
a prefixed line of neither shape raises ParseError with its line number.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter

import pandas as pd

from ..errors import ParseError
from ..flops import gemm_call_flops
from ._common import finish, read_text
from .canonical import linear_layer
from .cublas_log import gemm_direction

SOURCE = "mkl_verbose"
PREFIX = "MKL_VERBOSE "
_BANNER = re.compile(r"^MKL_VERBOSE (?:oneMKL|Intel\(R\) MKL) (\d[\w.]*(?: Update \d+)?)")
_CALL = re.compile(r"^MKL_VERBOSE (\w+)\((.*)\) (\d+(?:\.\d+)?)(ns|us|ms|s)\b(.*)$")
_NTHR = re.compile(r"\bNThr:(\d+)")
_UNIT_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_GEMM = re.compile(r"^[SDCZ]GEMM$")


def sniff(head: bytes) -> bool:
    text = head.decode("utf-8", "replace")
    return any(line.startswith(PREFIX) for line in text.splitlines()[:200])


def read(path: str | os.PathLike) -> pd.DataFrame:
    text = read_text(path)
    rows = []
    skipped = info = 0
    version = None
    threads: Counter = Counter()
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.rstrip("\r")
        if not line.startswith(PREFIX):
            skipped += 1
            continue
        b = _BANNER.match(line)
        if b:
            info += 1
            version = version or b.group(1)
            continue
        m = _CALL.match(line)
        if not m:
            raise ParseError(path, "MKL_VERBOSE line that is neither the version banner nor "
                                   "'FUNC(args) TIME ...'", line=lineno)
        func, args, value, unit, tail = m.groups()
        dur_ns = round(float(value) * _UNIT_NS[unit])
        nthr = _NTHR.search(tail)
        if nthr:
            threads[int(nthr.group(1))] += 1
        row = {"func": func, "dur_ns": dur_ns, "shapes": None, "layer": None, "direction": None, "flops": None}
        if _GEMM.match(func):
            a = [x.strip() for x in args.split(",")]
            try:
                mm, nn, kk = int(a[2]), int(a[3]), int(a[4])
            except (IndexError, ValueError):
                raise ParseError(path, f"{func} arguments {args[:60]!r} do not start (transa, transb, m, n, k)",
                                 line=lineno) from None
            row["shapes"] = json.dumps([[mm, kk], [kk, nn]], separators=(",", ":"))
            row["layer"] = linear_layer([mm, nn, kk])
            row["direction"] = gemm_direction(row["layer"], mm, nn, kk)
            row["flops"] = gemm_call_flops(mm, nn, kk)
        rows.append(row)
    df = pd.DataFrame(rows, columns=["func", "dur_ns", "shapes", "layer", "direction", "flops"])
    n = len(df)
    layer = df["layer"].tolist()
    direction = df["direction"].tolist()
    cols = {
        "kind": ["library_call"] * n, "library": ["BLAS"] * n, "device": ["cpu"] * n,
        "library_call": df["func"].tolist(), "op_name": df["func"].tolist(),
        "shapes": df["shapes"].tolist(), "layer": layer,
        "canonical_op": ["linear" if isinstance(v, str) else None for v in layer],
        "direction": direction,
        "phase": ["forward" if d == "fwd" else "backward" if isinstance(d, str) else None for d in direction],
        "math_mode": [_math(f) for f in df["func"]],
        # MKL's s/d gemms multiply fp32/fp64 on the CPU's FMA units (no TF32 there): the letter is the math
        "math_ran": [_math(f) for f in df["func"]],
        "math_dtypes": [f"a={m} b={m} c={m}" if m else None for m in map(_math, df["func"])],
        "math_source": ["log" if _math(f) else None for f in df["func"]],
        "dur_ns": pd.array(df["dur_ns"].tolist(), dtype="Int64"),
        "flops": pd.array(df["flops"].tolist(), dtype="Int64"),
    }
    out = finish(cols, path, SOURCE)
    out.attrs["skipped_lines"] = skipped
    out.attrs["info_lines"] = info
    out.attrs["mkl_version"] = version
    out.attrs["threads"] = {str(k): v for k, v in sorted(threads.items())}
    return out


def _math(func: str) -> str | None:
    return {"S": "fp32", "D": "fp64", "C": "fp32", "Z": "fp64"}.get(func[:1]) if _GEMM.match(func) else None
