"""oneDNN verbose output (``ONEDNN_VERBOSE=1`` / ``DNNL_VERBOSE=1`` / ``MKLDNN_VERBOSE=1``).

Accepted line shapes (prefix ``onednn_verbose``, ``dnnl_verbose`` or ``mkldnn_verbose``)::

    onednn_verbose,v1,primitive,exec,cpu,convolution,jit:avx2,forward_training,MDS,ATTRS,AUX,PROBLEM,TIME   (v3.4+)
    onednn_verbose,TIMESTAMP,primitive,exec,cpu,...                     (v3.x with ONEDNN_VERBOSE_TIMESTAMP=1)
    onednn_verbose,primitive,exec,cpu,...   onednn_verbose,exec,cpu,... (v3.0 - v3.3)
    dnnl_verbose,exec,cpu,convolution,...   mkldnn_verbose,exec,cpu,... (v1.x / v2.x, MXNet 1.9.1)

Each ``exec`` line is one primitive execution: a ``library_call`` row, library oneDNN,
``library_call`` = "<primitive> <prop_kind>", ``dur_ns`` from the time (ms), ``shapes`` from the
problem descriptor. ``info``/``create``/``graph`` lines are not executions: they are counted in
``df.attrs["non_exec_lines"]``. Lines without a verbose prefix (the program's own stdout,
interleaved) are skipped and counted in ``df.attrs["skipped_lines"]``. A prefixed line that does
not have the fields above raises ParseError with its line number.
"""

from __future__ import annotations

import json
import os
import re

import pandas as pd

from ..errors import ParseError
from ..flops import conv2d_call_flops, gemm_call_flops
from ..schema import phase_of
from . import canonical as C
from . import mathtypes as MT
from ._common import finish, read_text

SOURCE = "onednn_verbose"
PREFIXES = ("onednn_verbose,", "dnnl_verbose,", "mkldnn_verbose,")
_NON_EXEC = re.compile(r"^(info|create(:\w+)*|graph|common|error|warn|profile_\w+)$")
_TS = re.compile(r"^\d+(\.\d+)?$")
# a memory descriptor's argument and data type: v3 "src:bf16:a:blocked:...", v1/v2 "src_f32::blocked:..."
_MD = re.compile(r"^(?:diff_)?([a-z]+?)[:_](f32|f64|bf16|f16|s8|u8|s32|f8_e5m2|f8_e4m3|undef)(?=[:_\s]|$)")
_FPMATH = re.compile(r"attr-fpmath:(\w+)")
_FPMATH_MATH = {"bf16": MT.MathRan.BF16, "f16": MT.MathRan.FP16, "tf32": MT.MathRan.TF32}
# the arguments a primitive multiplies, by propagation kind (backward_data: diff_dst and the weights)
_OPERANDS = {"backward_data": ("dst", "wei"), "backward_weights": ("src", "dst"), "backward": ("src", "dst")}

_PRIM = {
    "convolution": "conv2d", "deconvolution": "conv2d", "inner_product": "linear", "matmul": "linear",
    "reorder": "reorder", "sum": "sum", "concat": "copy",
}
_DIR = {"forward_training": "fwd", "forward_inference": "fwd", "forward": "fwd",
        "backward_data": "bwd_data", "backward_weights": "bwd_weight", "backward": "bwd",
        "backward_bias": "bwd_bias", "undef": "none"}


def sniff(head: bytes) -> bool:
    text = head.decode("utf-8", "replace")
    return any(line.startswith(PREFIXES) for line in text.splitlines()[:200])


def _problem_shapes(prim: str, problem: str) -> list | None:
    """Input shapes from the problem descriptor: conv/ip 'mbN_icCocO_ihH...' or 'AxBxC'."""
    if re.fullmatch(r"\d+(x\d+)*", problem):
        return [[int(v) for v in problem.split("x")]]
    g = dict(re.findall(r"([a-z]+)(\d+)", problem))
    try:
        mb, ic = int(g["mb"]), int(g["ic"])
        if prim in ("convolution", "deconvolution") and "oc" in g and "kh" in g:
            return [[mb, ic, int(g["ih"]), int(g["iw"])], [int(g["oc"]), ic, int(g["kh"]), int(g["kw"])]]
        if prim == "inner_product" and "oc" in g:
            return [[mb, ic], [int(g["oc"]), ic]]
        if prim.startswith("pooling") and "ih" in g:
            return [[mb, ic, int(g["ih"]), int(g["iw"])]]
    except KeyError:  # a descriptor without one of the sizes: no shapes
        return None
    return None


def _problem_flops(prim: str, problem: str) -> int | None:
    """FLOPs of one 2-d convolution or inner product from its problem descriptor (the same for
    forward and both gradients); None for other primitives and descriptors without the sizes."""
    g = {k: int(v) for k, v in re.findall(r"([a-z]+)(\d+)", problem)}
    try:
        if prim == "convolution" and "od" not in g and g.get("ic", 0) % g.get("g", 1) == 0:
            w = [g["oc"], g["ic"] // g.get("g", 1), g["kh"], g["kw"]]
            return conv2d_call_flops(w, [g["mb"], g["oc"], g["oh"], g["ow"]])
        if prim == "inner_product":
            return gemm_call_flops(g["mb"], g["oc"], g["ic"] * g.get("id", 1) * g.get("ih", 1) * g.get("iw", 1))
    except KeyError:
        return None
    return None


def read(path: str | os.PathLike) -> pd.DataFrame:
    text = read_text(path)
    rows = []
    skipped = non_exec = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.startswith(PREFIXES):
            skipped += 1
            continue
        f = line.rstrip("\r").split(",")
        k = 1
        ts = None
        if len(f) > k and (f[k] == "v1" or _TS.match(f[k])):
            ts = float(f[k]) if _TS.match(f[k]) else None
            k += 1
        if len(f) > k and f[k] == "primitive":
            k += 1
        if len(f) <= k:
            raise ParseError(path, "verbose line with no operation field", line=lineno)
        op = f[k]
        if op != "exec":
            if _NON_EXEC.match(op) or f[k - 1] in ("graph",):
                non_exec += 1
                continue
            raise ParseError(path, f"unknown oneDNN verbose operation {op!r}", line=lineno)
        rest = f[k + 1:]
        if len(rest) < 9:
            raise ParseError(path, f"exec line has {len(rest)} fields after 'exec', expected 9", line=lineno)
        engine, prim, impl, prop = rest[0], rest[1], rest[2], rest[3]
        aux, problem, time_ms = rest[-3], rest[-2], rest[-1]
        try:
            dur_ns = round(float(time_ms) * 1e6)
        except ValueError:
            raise ParseError(path, f"exec time {time_ms!r} is not a number", line=lineno) from None
        shapes = _problem_shapes(prim, problem)
        math, dtypes = _math(prim, prop, rest[4], rest[5])
        rows.append((prim, prop, engine, impl, aux, problem, dur_ns, shapes,
                     None if ts is None else round(ts * 1e6), math, dtypes))
    df = pd.DataFrame(rows, columns=["prim", "prop", "engine", "impl", "aux", "problem", "dur_ns", "shapes", "ts",
                                     "math_ran", "math_dtypes"])
    canon = [_canonical(p, a) for p, a in zip(df["prim"], df["aux"], strict=True)]
    mm = [matmul_layer(q) if p == "matmul" and _DIR.get(r, "none") == "none" else (None, None)
          for p, r, q in zip(df["prim"], df["prop"], df["problem"], strict=True)]
    direction = [d or _DIR.get(p, "none") for (_, d), p in zip(mm, df["prop"], strict=True)]
    layers = [ly or _layer(c, s) for (ly, _), c, s in zip(mm, canon, df["shapes"], strict=True)]
    cols = {
        "kind": "library_call",
        "library": "oneDNN",
        "library_call": (df["prim"] + " " + df["prop"]).tolist(),
        "op_name": df["prim"].tolist(),
        "kernel_name": df["impl"].tolist(),
        "algo": df["aux"].where(df["aux"] != "").tolist(),
        "canonical_op": canon,
        "direction": direction,
        "layer": layers,
        "phase": [phase_of(d, c) for d, c in zip(direction, canon, strict=True)],
        "dur_ns": pd.array(df["dur_ns"].tolist(), dtype="Int64"),
        "start_ns": pd.array(df["ts"].tolist(), dtype="Int64"),
        "shapes": [json.dumps(s, separators=(",", ":")) if s else None for s in df["shapes"]],
        "flops": pd.array([_problem_flops(p, q) for p, q in zip(df["prim"], df["problem"], strict=True)],
                          dtype="Int64"),
        "device": [("cpu" if e == "cpu" else "gpu") for e in df["engine"]],
        "math_ran": df["math_ran"].tolist(), "math_dtypes": df["math_dtypes"].tolist(),
        "math_source": ["log" if isinstance(m, str) or isinstance(t, str) else None
                        for m, t in zip(df["math_ran"], df["math_dtypes"], strict=True)],
    }
    if df.empty:
        cols = {k: pd.Series([], dtype=object) for k in cols}
    out = finish(cols, path, SOURCE)
    out.attrs["skipped_lines"] = skipped
    out.attrs["non_exec_lines"] = non_exec
    return out


def _math(prim: str, prop: str, mds: str, attrs: str) -> tuple[str | None, str | None]:
    """(math_ran, math_dtypes) of one primitive from its memory descriptors' data types and its
    ``attr-fpmath`` (fp32 data computed in bf16/f16/tf32). A convolution, inner product or matmul
    multiplies src and wei forward, diff_dst and wei for the data gradient, src and diff_dst for the
    weights'; other primitives compute in their source's type. No TF32 on oneDNN's CPU engine but by fpmath."""
    types: dict[str, str | None] = {}
    for tok in mds.split():
        m = _MD.match(tok)
        if m and m.group(2) != "undef":
            types.setdefault(m.group(1), MT.type_name(m.group(2)))
    if prim in ("convolution", "deconvolution", "inner_product", "matmul"):
        names = _OPERANDS.get(prop, ("src", "wei"))
    else:  # v1/v2 name an eltwise or softmax primitive's source "data"
        names = ("src",) if "src" in types else ("data",)
    fp = _FPMATH.search(attrs)
    math = MT.ran([types.get(n) for n in names], False, _FPMATH_MATH.get(fp.group(1)) if fp else None)
    return math, MT.dtypes_text(**types, fpmath=fp.group(1) if fp else None)


def _canonical(prim: str, aux: str) -> str:
    if prim in _PRIM:
        return _PRIM[prim]
    if prim == "eltwise":
        return "relu" if "eltwise_relu" in aux else "other"
    if prim.startswith("pooling"):
        return "max_pool2d" if "pooling_max" in aux else "other"
    if prim.startswith(("softmax", "logsoftmax")):
        return "log_softmax" if "logsoftmax" in aux or prim.startswith("logsoftmax") else "other"
    if prim == "binary":
        return "add" if "binary_add" in aux else "mul" if "binary_mul" in aux else "other"
    return "other"


def matmul_layer(problem: str) -> tuple[str | None, str | None]:
    """(layer, direction) of a 2-d matmul (problem ``MxK:KxN``, prop ``undef``: oneDNN's matmul says no direction;
    PyTorch runs its bf16 linears and their gradients so on the CPU) from the model's linear layers: the one whose
    out and in features are two of M, K, N, the third the batch; the contraction K says the direction (K = in:
    fwd, K = out: bwd_data, K = batch: bwd_weight; ``cublas_log.gemm_direction``). (None, None) where the dims
    fit no layer or are ambiguous (a batch equal to a feature count)."""
    from .cublas_log import gemm_direction

    g = re.fullmatch(r"(\d+)x(\d+):(\d+)x(\d+)(?::\d+x\d+)?", problem)
    if g is None or g[2] != g[3]:
        return None, None
    m, k, n = int(g[1]), int(g[2]), int(g[4])
    layer = C.linear_layer([m, k, n])  # its out and in features two of the dims, the batch the third
    direction = gemm_direction(layer, m, n, k) if layer is not None else None
    return (layer, direction) if direction is not None else (None, None)


def _layer(canon: str, shapes) -> str | None:
    if canon == "log_softmax":
        return "loss"
    if canon in ("conv2d", "linear") and shapes and len(shapes) == 2:
        return C.layer_from_inputs("aten::linear", shapes)  # weight is input 1
    return None

