"""cuDNN API logs: v9 (``CUDNN_LOGLEVEL_DBG=3``) and v8 (``CUDNN_LOGINFO_DBG=1``); one format.

A call is a block: a header ``I! CuDNN (v91900 56) function cudnnBackendExecute() called:``, then
indented ``i!`` attribute lines (``name: type=T; val=V;``, nesting by indentation), then the
``Time: <ISO wall clock> (...)`` and ``Process=..; Thread=..; GPU=..; Handle=..; StreamId=..``
trailer. cuDNN 9 logs each call twice: an entry block with the arguments and a return block whose
only attribute is ``status``; a call is counted once, at its entry block.

Records (kind ``library_call``, library cuDNN) for the calls that do work on the GPU:
``cudnnBackendExecute`` (the operation, x/w/y dims and engine id from the execution plan; math
mode from the ``cudnnBackendExecuteInternal`` block that follows on the same thread) and the
legacy v7/v8 entry points (``cudnnConvolutionForward``, ``...BackwardData``, ``...BackwardFilter``,
``...BackwardBias``, ``cudnnActivationForward``, ``cudnnPoolingForward``, ``cudnnSoftmaxForward``,
their backward twins, ``cudnnAddTensor``, ...). Descriptor set-up, finalisation and heuristics
calls are not records; ``df.attrs["calls"]`` counts every API function in the log.
``start_ns`` is the logged wall clock (µs resolution) read as UTC.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from datetime import UTC, datetime

import pandas as pd

from ..errors import ParseError
from ..flops import conv2d_call_flops
from ..schema import phase_of
from . import canonical as C
from . import mathtypes as MT
from ._common import api_log_blocks, finish

SOURCE = "cudnn_log"
_HEAD = re.compile(r"^I! CuDNN \(v(\d+)(?: \d+)?\) function (\w+)\(\) called:\s*$")
_ATTR = re.compile(r"^i!(\s+)([^:]+?):\s*(.*)$")
_VAL = re.compile(r"val=([^;]*);?")
_TIME = re.compile(r"^i! Time: (\S+)")
_HEX = re.compile(r"0x([0-9a-fA-F]+)")
_PROC = re.compile(r"^i! Process=(\d+); Thread=(\d+); GPU=([^;]*); Handle=([^;]*); StreamId=(.*?)\.?\s*$")
_OVERRIDE = re.compile(r"NVIDIA_TF32_OVERRIDE=(\w+)")
# the operands a convolution multiplies, per direction (math: mathtypes.ran)
_OPERANDS = {"fwd": ("xDesc", "wDesc"), "bwd_data": ("dyDesc", "wDesc"), "bwd_weight": ("xDesc", "dyDesc")}
_TENSORS = ("xDesc", "wDesc", "yDesc", "dxDesc", "dwDesc", "dyDesc", "srcDesc", "destDesc", "biasDesc", "dbDesc",
            "aDesc", "cDesc")

LEGACY = {
    "cudnnConvolutionForward": ("conv2d", "fwd"),
    "cudnnConvolutionBiasActivationForward": ("conv2d", "fwd"),
    "cudnnConvolutionBackwardData": ("conv2d", "bwd_data"),
    "cudnnConvolutionBackwardFilter": ("conv2d", "bwd_weight"),
    "cudnnConvolutionBackwardBias": ("conv2d", "bwd_bias"),
    "cudnnActivationForward": ("relu", "fwd"),
    "cudnnActivationBackward": ("relu", "bwd"),
    "cudnnPoolingForward": ("max_pool2d", "fwd"),
    "cudnnPoolingBackward": ("max_pool2d", "bwd"),
    "cudnnSoftmaxForward": ("log_softmax", "fwd"),
    "cudnnSoftmaxBackward": ("log_softmax", "bwd"),
    "cudnnAddTensor": ("add", "none"),
    "cudnnOpTensor": ("other", "none"),
    "cudnnTransformTensor": ("copy", "none"),
}
_OPERATION = {
    "CONVOLUTION_FORWARD": ("conv2d", "fwd"), "CONV_FORWARD": ("conv2d", "fwd"),
    "CONVOLUTION_BACKWARD_DATA": ("conv2d", "bwd_data"), "CONV_BACKWARD_DATA": ("conv2d", "bwd_data"),
    "CONVOLUTION_BACKWARD_FILTER": ("conv2d", "bwd_weight"), "CONV_BACKWARD_FILTER": ("conv2d", "bwd_weight"),
}
EXECUTE = "cudnnBackendExecute"


def sniff(head: bytes) -> bool:
    return re.search(rb"^I! CuDNN \(v\d+", head, re.M) is not None


def _parse_attrs(lines: list[str]) -> dict[str, str]:
    """Flatten indented attribute lines to {'a.b.c': value-or-type}."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in lines:
        m = _ATTR.match(line)
        if not m:
            continue
        indent, key, rest = len(m.group(1)), m.group(2).strip(), m.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([s[1] for s in stack] + [key])
        v = _VAL.search(rest)
        out[path] = v.group(1).strip() if v else rest.strip().rstrip(":;").removeprefix("type=")
        stack.append((indent, key))
    return out


def _find(attrs: dict[str, str], suffix: str) -> str | None:
    for k, v in attrs.items():
        if k == suffix or k.endswith("." + suffix):
            return v
    return None


def _dims(attrs: dict[str, str], desc: str) -> list[int] | None:
    v = _find(attrs, f"{desc}.dimA")
    if not v:
        return None
    try:
        return json.loads(v)
    except ValueError:
        return None


def _enum(v: str | None) -> str | None:
    return v.split(" (")[0].strip() if v else None


def read(path: str | os.PathLike) -> pd.DataFrame:
    calls: Counter = Counter()
    rows = []
    pending_internal: dict[str, int] = {}  # thread -> row index awaiting ExecuteInternal
    for h, m, body in api_log_blocks(path, _HEAD, "CuDNN"):
        version, func = m.group(1), m.group(2)
        is_return = sum(1 for ln in body if _ATTR.match(ln) and not ln.startswith(("i! Time:", "i! Process="))) == 1 and \
            any(ln.strip().startswith("i!     status:") for ln in body)
        if func == "cudnnBackendExecuteInternal":
            attrs = _parse_attrs(body)
            thread = _thread(body)
            if thread in pending_internal:
                r = rows[pending_internal.pop(thread)]
                tf32 = _find(attrs, "enable_tf32")
                if r["library_call"] == EXECUTE:
                    r["math_mode"] = "tf32" if tf32 == "true" else r["math_mode"]
                if tf32 in ("true", "false"):
                    r["tf32"] = tf32 == "true"
            continue
        if is_return:
            continue
        calls[func] += 1
        if func != EXECUTE and func not in LEGACY:
            continue
        attrs = _parse_attrs(body)
        row = _trailer(path, body, h)
        row.update(library_call=func, cudnn_version=version)
        if func == EXECUTE:
            op = _find(attrs, "operation") or ""
            key = op.replace("CUDNN_BACKEND_OPERATION_", "").replace("_DESCRIPTOR", "")
            canon, direction = _OPERATION.get(key, ("other", "none"))
            eng = _find(attrs, "engine_id")
            row["algo"] = f"eng{eng}" if eng is not None else None
            row["op_name"] = key or None
            dtype = _enum(_find(attrs, "computeType"))
        else:
            canon, direction = LEGACY[func]
            if func == "cudnnActivationForward" or func == "cudnnActivationBackward":
                mode = _find(attrs, "activationDesc.mode") or ""
                canon = "relu" if "RELU" in mode else "other"
            if func.startswith("cudnnPooling"):
                canon = "max_pool2d" if "MAX" in (_find(attrs, "poolingDesc.mode") or "") else "other"
            if func.startswith("cudnnSoftmax"):
                canon = "log_softmax" if "LOG" in (_find(attrs, "algo") or "") else "other"
            row["algo"] = _enum(_find(attrs, "algo"))
            row["op_name"] = func
            # the data's type (x, else w or dy), not the convolution's compute type: an fp16 convolution computes
            # in float, and its math mode is fp16 (it read tf32 from the compute type before issue 38)
            dtype = _enum(_find(attrs, "xDesc.dataType") or _find(attrs, "wDesc.dataType")
                          or _find(attrs, "dyDesc.dataType") or _find(attrs, "convDesc.dataType"))
            math = _enum(_find(attrs, "convDesc.mathType"))
            if math and "TENSOR_OP" in math and dtype == "CUDNN_DATA_FLOAT":
                row["math_mode"] = "tf32"
        row.setdefault("math_mode", _dtype(dtype))
        x = _dims(attrs, "xDesc") or _dims(attrs, "dxDesc")
        w = _dims(attrs, "wDesc") or _dims(attrs, "dwDesc")
        y = _dims(attrs, "yDesc") or _dims(attrs, "dyDesc")
        shapes = [s for s in (x, w, y) if s is not None]
        row["shapes"] = json.dumps(shapes, separators=(",", ":")) if shapes else None
        row["flops"] = conv2d_call_flops(w, y) if canon == "conv2d" else None
        layer = C.layer_of_weight(w) if w else None
        if func == "cudnnConvolutionBackwardBias":  # no filter: the bias tensor names the layer
            layer = C.conv_layer_from_bias(_dims(attrs, "destDesc") or _dims(attrs, "dbDesc"))
        row.update(canonical_op=canon, direction=direction, layer=layer)
        row.update(_types(attrs, canon, direction, body))
        if row.get("tid") is not None:  # cuDNN 9 follows a convolution with its ExecuteInternal block
            pending_internal[str(row["tid"])] = len(rows)
        rows.append(row)
    df = pd.DataFrame(rows, columns=["library_call", "op_name", "algo", "math_mode", "shapes", "canonical_op",
                                     "direction", "layer", "flops", "start_ns", "pid", "tid", "stream", "gpu", "cudnn_version"])
    cols = {c: df[c].tolist() for c in ("library_call", "op_name", "algo", "math_mode", "shapes",
                                        "canonical_op", "direction", "layer")}
    cols.update(
        kind=["library_call"] * len(df), library=["cuDNN"] * len(df), device=["gpu"] * len(df),
        start_ns=pd.array(df["start_ns"].tolist(), dtype="Int64"),
        pid=pd.array(df["pid"].tolist(), dtype="Int64"), tid=pd.array(df["tid"].tolist(), dtype="Int64"),
        stream=pd.array(df["stream"].tolist(), dtype="Int64"),
        flops=pd.array(df["flops"].tolist(), dtype="Int64"),
        phase=[phase_of(d) for d in df["direction"]],
    )
    tf32 = [r.get("tf32", r["tf32_default"]) for r in rows]
    cols["math_ran"] = [MT.ran(r["operands"], t) for r, t in zip(rows, tf32, strict=True)]
    cols["math_dtypes"] = [f"{r['dtypes']} {MT.TF32_UNKNOWN}" if MT.tf32_unknown(r["operands"], t) else r["dtypes"]
                           for r, t in zip(rows, tf32, strict=True)]
    cols["math_source"] = ["log" if m or t else None for m, t in zip(cols["math_ran"], cols["math_dtypes"], strict=True)]
    out = finish(cols, path, SOURCE)
    out.attrs["calls"] = dict(calls)
    overrides = sorted({r["tf32_override"] for r in rows if r["tf32_override"] is not None})
    out.attrs["tf32_override"] = overrides  # NVIDIA_TF32_OVERRIDE as the log's trailers give it
    return out


def _types(attrs: dict[str, str], canon: str, direction: str, body: list[str]) -> dict:
    """The call's data types (``dtypes``), the operands its math is of (``operands``) and whether TF32 is
    permitted where no ExecuteInternal block says (``tf32_default``: False under ``NVIDIA_TF32_OVERRIDE=0``
    or ``CUDNN_FMA_MATH``, else unknown); ``tf32_override``: the variable as the trailer gives it."""
    types = {d: MT.type_name(_find(attrs, f"{d}.type") or _find(attrs, f"{d}.dataType")) for d in _TENSORS}
    types = {d.removesuffix("Desc"): t for d, t in types.items() if t}
    compute = MT.type_name(_enum(_find(attrs, "convDesc.computeType") or _find(attrs, "convDesc.dataType")))
    if canon == "conv2d" and direction in _OPERANDS:
        operands = [types.get(d.removesuffix("Desc")) for d in _OPERANDS[direction]]
    else:  # a call that multiplies nothing: its data's type (mixed where its tensors differ)
        operands = list(dict.fromkeys(types.values()))
    override = next((m.group(1) for ln in reversed(body) if (m := _OVERRIDE.search(ln))), None)
    math_type = _enum(_find(attrs, "convDesc.mathType")) or ""
    tf32_default = False if override == "0" or math_type == "CUDNN_FMA_MATH" or canon != "conv2d" else None
    return {"dtypes": MT.dtypes_text(**types, compute=compute), "operands": operands,
            "tf32_default": tf32_default, "tf32_override": override}


def _dtype(dtype: str | None) -> str | None:
    return {"CUDNN_DATA_FLOAT": "fp32", "CUDNN_DATA_HALF": "fp16", "CUDNN_DATA_BFLOAT16": "bf16",
            "CUDNN_DATA_DOUBLE": "fp64"}.get(dtype or "")


def _thread(body: list[str]) -> str | None:
    for ln in reversed(body):
        m = _PROC.match(ln)
        if m:
            return m.group(2)
    return None


def _trailer(path, body: list[str], h: int) -> dict:
    row: dict = {"start_ns": None, "pid": None, "tid": None, "stream": None, "gpu": None}
    for ln in body:
        m = _TIME.match(ln)
        if m:
            try:
                t = datetime.fromisoformat(m.group(1)).replace(tzinfo=UTC)
            except ValueError:
                raise ParseError(path, f"bad Time {m.group(1)!r}", line=h + 1) from None
            row["start_ns"] = int(t.timestamp()) * 10**9 + t.microsecond * 1000
            continue
        m = _PROC.match(ln)
        if m:
            row["pid"], row["tid"] = int(m.group(1)), int(m.group(2))
            row["gpu"] = m.group(3)
            # "0x7f..", "(nil)", "0x0 (defaultStream)"; MXNet's calls of the legacy API: "0xd917110;"
            s = m.group(5).strip()
            hexa = _HEX.match(s)
            row["stream"] = 0 if s.startswith("(nil)") else (int(hexa.group(1), 16) if hexa else None)
    return row
