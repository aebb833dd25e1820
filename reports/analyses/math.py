"""The math each library call and kernel really ran (issue 38), per case x layer x direction.

``math_ran`` (records, ``kernelmap/adapters/mathtypes.py`` and ``kernelmap/kernelmath.py``): what a call's
multiplications took as inputs, from its log (or HLO text), and each kernel its call's (else its name's).
Tables, DataFrames only:

* ``math_table``: per run x case x batch size x layer x direction x library call x math: kernels (GPU) or
  calls (CPU) per step and their time per step. GPU: the kernels of the source the case is timed from
  (``timed_events``), GPU kernel time; CPU: the library's own logged time of its calls (oneDNN, MKL) over
  the libs pass's logged steps.
* ``math_coverage``: per case x batch size, the share of library-kernel time (GPU: the kernels
  ``attribution.library_kernels`` counts, in the timed source) or library-call time (CPU) whose math is
  known, a kernel that multiplies nothing (``math_unit`` ``none``: cuDNN's ``nchwToNhwcKernel``, its workspace
  init) counted as known to have none; the issue asks >= ``COVERAGE_GOAL`` in every case.
* ``math_mismatches``: the convolution and linear calls (and kernels) of a case whose math is not the one
  the case asked for (``math`` column: ``--math``): under fp32 anything but fp32 (a TF32 call), under tf32
  anything but tf32 or fp32 (``ALLOWED``: TF32 is a permission), under bf16/fp16 anything but that type (a conv
  left in fp32, a mixed call).
* ``fma_products``: the rows of ``math_table`` of a convolution or linear product that ran on the FMA units
  (``math_unit`` ``fma``, by the kernel's name: ``kernelmath.name_unit``) in a case that asked a tensor-core math
  (``TENSOR_MATHS``); ``math as asked`` names them without failing (docs/MIXED_PRECISION.md says why).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kernelmap import attribution, schema

from .base import Run
from .linked import framework_rows, log_steps
from .ops import LAYER_OPS
from .timed import records_of, timed_events

COVERAGE_GOAL = 0.99
MULTIPLY_OPS = LAYER_OPS  # the layer table's rows: every one a product
# a conv's or linear's bias gradient is a reduction, no product; every other direction is checked, a call the
# adapter could not place too (oneDNN's matmul under CPU autocast: no layer, direction none)
NOT_PRODUCTS = ("bwd_bias",)
CPU_SOURCES = ("onednn_verbose", "mkl_verbose")
TABLE = ["run", "case", "batch_size", "math_asked", "canonical_op", "layer", "direction", "library", "library_call", "math_ran",
         "math_source", "math_unit", "math_dtypes", "per_step", "ms_per_step", "time_kind"]
COVERAGE = ["run", "case", "batch_size", "math_asked", "time_kind", "library_ms_per_step", "with_math_ms_per_step",
            "share",
            "kernels", "kernels_with_math", "unknown_top", "records_have_math", "calls_with_math"]
# what each asked math allows a product to run: TF32 permits, never forces (a library may pick an FP32-FMA engine)
ALLOWED = {"tf32": ("tf32", "fp32")}
_KEYS = ["canonical_op", "layer", "direction", "library", "library_call", "math_ran", "math_source", "math_unit"]
# the maths whose products NVIDIA's libraries run on tensor cores where they can (TF32 only there)
TENSOR_MATHS = ("tf32", "bf16", "fp16")


def _asked(rows: pd.DataFrame) -> str | None:
    vals = sorted(set(rows["math"].dropna())) if "math" in rows else []
    return "/".join(map(str, vals)) or None


def _grouped(ev: pd.DataFrame, n_steps: float, base: dict) -> list[dict]:
    out = []
    if not len(ev) or not n_steps:
        return out
    keyed = ev.assign(**{c: ev[c].astype(object).where(ev[c].notna(), schema.UNKNOWN) for c in _KEYS})
    for key, g in keyed.groupby(_KEYS, sort=True):
        dt = sorted(set(g["math_dtypes"].dropna()))
        out.append({**base, **dict(zip(_KEYS, key, strict=True)), "math_dtypes": "; ".join(dt) or None,
                    "per_step": len(g) / n_steps, "ms_per_step": float(g["dur_ns"].fillna(0).sum()) / n_steps / 1e6})
    return out


def _gpu_library(t, rec: pd.DataFrame) -> pd.DataFrame:
    """The library kernels of one timed GPU source (attribution's definition), with their math."""
    case = framework_rows(rec, t.framework, t.batch_size)
    lk = attribution.library_kernels(case.reset_index(drop=True))
    rows = case.reset_index(drop=True).loc[lk.index]
    return rows[rows["source"] == t.source]


def _cpu_calls(rec: pd.DataFrame, fw: str, bs: int | None) -> pd.DataFrame:
    case = framework_rows(rec, fw, bs)
    return case[(case["kind"] == "library_call") & case["source"].isin(CPU_SOURCES)]


def library_events(run: Run):
    """(case, batch size, GPU library kernels or CPU library calls, steps, kind of time) per case: the events
    ``math_table`` groups (``reports/mathchecks.py`` reads their kernels' names)."""
    rec = records_of(run)
    gpu = set()
    for t in timed_events(run):
        if t.level == "kernel":
            gpu.add((t.framework, t.batch_size))
            yield t.framework, t.batch_size, _gpu_library(t, rec), t.n_steps, f"GPU kernel time, {t.source} trace"
    # the CPU: the libraries' own calls, whatever trace the case has (a libs-pass-only run has none)
    keys = rec[(rec["kind"] == "library_call") & rec["source"].isin(CPU_SOURCES)][["case", "batch_size"]]
    for fw, bs in keys.drop_duplicates().itertuples(index=False):
        bs_v = None if pd.isna(bs) else int(bs)
        calls = _cpu_calls(rec, str(fw), bs_v)
        n, _ = log_steps(run, str(fw), bs_v)
        if (str(fw), bs_v) not in gpu and len(calls) and n:
            yield str(fw), bs_v, calls, n, "library's own logged time (oneDNN/MKL verbose), libs pass"


def math_table(runs: list[Run]) -> pd.DataFrame:
    rows: list[dict] = []
    for run in runs:
        for fw, bs, ev, n, kind in library_events(run):
            base = {"run": run.name, "case": fw, "batch_size": bs, "math_asked": _asked(ev), "time_kind": kind}
            rows += _grouped(ev, n, base)
    return pd.DataFrame(rows, columns=TABLE)


def math_coverage(runs: list[Run]) -> pd.DataFrame:
    rows = []
    for run in runs:
        for fw, bs, ev, n, kind in library_events(run):
            dur = ev["dur_ns"].fillna(0).astype("float64")
            # a kernel that multiplies nothing (math_unit none: a layout conversion, a workspace init) has no
            # math to know: known as such, not unknown
            none = (ev["math_unit"] == schema.MathUnit.NONE.value).fillna(False).to_numpy(dtype=bool) \
                if "math_unit" in ev else np.zeros(len(ev), dtype=bool)
            known = ev["math_ran"].notna().to_numpy(dtype=bool) | none
            total = float(dur.sum())
            unknown = ev[~known]
            top = (unknown.assign(_d=dur[~known]).groupby(unknown["kernel_name"].fillna(unknown["library_call"])
                                                         .fillna(schema.UNKNOWN).astype(str))["_d"]
                   .sum().sort_values(ascending=False).head(3))
            rows.append({"run": run.name, "case": fw, "batch_size": bs, "math_asked": _asked(ev), "time_kind": kind,
                         "library_ms_per_step": total / n / 1e6,
                         "with_math_ms_per_step": float(dur[known].sum()) / n / 1e6,
                         "share": float(dur[known].sum()) / total if total else None,
                         "kernels": len(ev), "kernels_with_math": int(known.sum()),
                         "unknown_top": "; ".join(f"{k[:60]} {v / n / 1e6:.3f} ms/step" for k, v in top.items())
                         or None,
                         "records_have_math": bool(records_of(run)["math_ran"].notna().any()),
                         "calls_with_math": _calls_with_math(records_of(run), fw, bs)})
    return pd.DataFrame(rows, columns=COVERAGE)


def _calls_with_math(rec: pd.DataFrame, case: str, bs) -> int:
    """The library calls of a case with a known math: the libs pass's logged calls (cuDNN, cuBLAS, cuBLASLt,
    oneDNN, MKL) or XLA's in-trace calls (their HLO); none where the case ran no libs pass on the GPU."""
    sel = (rec["kind"] == "library_call") & (rec["case"] == case) & rec["math_ran"].notna()
    if bs is not None:
        sel &= rec["batch_size"] == bs
    return int(sel.sum())


def math_mismatches(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``math_table`` of a convolution or linear product whose known math is not the case's."""
    if not len(table):
        return table
    t = products(table)
    t = t[t["math_asked"].notna()]
    allowed = t["math_asked"].map(lambda m: ALLOWED.get(m, (m,)))
    return t[np.array([ran not in ok for ran, ok in zip(t["math_ran"], allowed, strict=True)], dtype=bool)]


def products(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``math_table`` of a convolution or linear product (not a bias gradient) whose math is known."""
    return table[table["canonical_op"].isin(MULTIPLY_OPS) & ~table["direction"].isin(NOT_PRODUCTS)
                 & (table["math_ran"] != schema.UNKNOWN)]


def fma_products(table: pd.DataFrame) -> pd.DataFrame:
    """The product rows of a case asked a tensor-core math (``TENSOR_MATHS``) whose kernels ran on the FMA units."""
    if not len(table):
        return table
    p = products(table)
    return p[p["math_asked"].isin(TENSOR_MATHS) & (p["math_unit"] == schema.MathUnit.FMA.value)]
