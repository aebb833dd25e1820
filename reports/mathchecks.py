"""The two self-checks of each library call's math (issue 38; ``analyses/math.py`` makes the tables).

* ``math as asked``: per case x batch size, every convolution and linear product (not a bias gradient) whose
  math is known ran the math the case asked for (``--math``): FAIL names each one that did not (layer, direction, call, the
  math it ran, its time per step): asked fp32, a call ran TF32; asked bf16, a conv's tensors were fp32; asked tf32,
  tf32 or fp32 pass (TF32 is a permission: ``math.ALLOWED``), the detail giving the time of each. Not checked
  where the case's math is not recorded or none of its products has a known math. Two things pass, named, that are
  the library's choice of algorithm, not the framework's recipe: a product of a bf16/fp16 case (``LOW_MATHS``)
  whose call's tensors are all of that type (its log's data types, ``math_dtypes``: ``tensor_types``) but whose
  kernels compute in fp32 (``library_fp32``: a kernel whose name says it multiplies fp32 operands, cuDNN's FFT and
  Winograd GEMMs, ``math_ran`` fp32 by ``kernelmath.FP32_ENGINES``; or an FMA-unit kernel whose name says single
  precision, ``kernelmath.counted_math`` fp32: cuDNN's ``implicit_convolve_sgemm<__half, ...>``): the row's subject
  begins with ``LIBRARY_FP32``, its detail with the statement (how many products, which calls and algorithms, their
  time and share of library-kernel time) that ``first_screen_lines`` puts on the report's first screen; and a
  product of a tensor-core math (tf32, bf16, fp16) whose kernels ran on the FMA units (``math_unit``:
  ``math.fma_products``), named in the detail with its time and share of the conv/linear kernels' time: it ran the
  precision asked, on other units (docs/MIXED_PRECISION.md "Tensor cores or FMA").
* ``math known``: per case x batch size, the share of library time whose math is known is at least
  ``math.COVERAGE_GOAL``; FAIL names the largest unknown kernels. Not checked where the records were
  written before the math columns (re-normalise the run), the case has no library time, or it has no library
  call with a math and falls short (no libs pass: its calls and their logged math were never recorded).
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from kernelmap import kernelmath, schema
from kernelmap.adapters.mathtypes import tensor_types
from kernelmap.schema import MathRan, MathUnit

from .analyses import math as M
from .analyses.base import Run
from .checkrows import FAIL, NOT_CHECKED, PASS, Check, check_row

# a failed row's subject begins so: the banner's line then says it in words (issue 38: the first screen says where a
# framework did not run the math asked for)
NOT_AS_ASKED = "did not run the math asked for"
# a passing row's subject begins so where the library's algorithm computed fp32 on tensors of the type asked; its
# detail begins with the statement, up to STATEMENT_END, that the first screen shows (``first_screen_lines``)
LIBRARY_FP32 = "the library's algorithm computes in fp32"
STATEMENT_END = "; as ran: "
SUBJECT = "conv/linear products"
# the asked maths whose recipe stores a product's tensors in that type (docs/MIXED_PRECISION.md): there a kernel that
# computes in fp32 on them is the library's algorithm, not the recipe's fp32
LOW_MATHS = (MathRan.BF16.value, MathRan.FP16.value)
_ALGO_PREFIX = re.compile(r"^CUDNN_CONVOLUTION_\w+?_ALGO_")  # cuDNN's legacy algorithm enums: the algorithm's name
_CALL = ["layer", "direction", "library_call"]


def on_asked_tensors(dtypes: str | None, asked: str | None) -> bool:
    """Whether every tensor of the call is of the asked low-precision type (``LOW_MATHS``): the recipe worked."""
    return isinstance(asked, str) and asked in LOW_MATHS and tensor_types(dtypes) == {asked}


def library_fp32(rows: pd.DataFrame) -> pd.Series:
    """Which product rows of ``math_table`` (or library kernels) ran fp32 multiplies on tensors of the asked
    low-precision type: ``math_ran`` fp32 where the call's tensors are all of that type (the kernel's name says it
    multiplies fp32 operands: ``kernelmath.FP32_ENGINES``)."""
    asked = rows["math_asked"] if "math_asked" in rows else rows["math"]
    ok = [isinstance(ran, str) and ran == MathRan.FP32.value and on_asked_tensors(d, a)
          for ran, d, a in zip(rows["math_ran"].astype(object), rows["math_dtypes"].astype(object),
                               asked.astype(object), strict=True)]
    return pd.Series(ok, index=rows.index, dtype=bool)


def fp32_kernels(ev: pd.DataFrame) -> pd.Series:
    """Which library kernels of a case are product kernels that compute in fp32 on tensors of the asked low-precision
    type: ``library_fp32``, or an FMA-unit kernel whose name says single precision (``kernelmath.counted_math`` fp32:
    it converts its operands and multiplies in FP32, as the counters pass finds)."""
    if not len(ev):
        return pd.Series([], index=ev.index, dtype=bool)
    named = library_fp32(ev)
    fma = [isinstance(u, str) and u == MathUnit.FMA.value and on_asked_tensors(d, a)
           and kernelmath.counted_math(n, r) == kernelmath.COUNTED_FP32
           for u, d, a, n, r in zip(ev["math_unit"].astype(object), ev["math_dtypes"].astype(object),
                                    ev["math"].astype(object), ev["kernel_name"].astype(object),
                                    ev["math_ran"].astype(object), strict=True)]
    return named | pd.Series(fma, index=ev.index, dtype=bool)


def library_statement(ev: pd.DataFrame, n_steps: float, library_ms: float | None) -> str:
    """The products of a bf16/fp16 case whose kernels computed in fp32 on tensors of that type (``fp32_kernels``), in
    words: how many of the case's conv/linear products (layer x direction), each call with its algorithm and the
    time of all its kernels, their sum and its share of the library-kernel time (``library_ms``); '' where none."""
    if not len(ev) or not n_steps:
        return ""
    prod = ev[ev["canonical_op"].isin(M.MULTIPLY_OPS) & ~ev["direction"].isin(M.NOT_PRODUCTS)]
    hit = prod[fp32_kernels(prod)]
    if not len(hit):
        return ""
    keys = prod[_CALL].astype(object).where(prod[_CALL].notna(), schema.UNKNOWN)
    places = len(keys[["layer", "direction"]].drop_duplicates())
    calls = keys.loc[hit.index].drop_duplicates().sort_values(_CALL)
    said, total = [], 0.0
    for layer, direction, call in calls.itertuples(index=False):
        mine = prod[(keys["layer"] == layer) & (keys["direction"] == direction) & (keys["library_call"] == call)]
        ms = float(mine["dur_ns"].fillna(0).sum()) / n_steps / 1e6
        total += ms
        algos = sorted({_ALGO_PREFIX.sub("", str(a)) for a in mine["algo"].dropna()})
        said.append(" ".join([layer, direction, call, *(["/".join(algos)] if algos else []), f"{ms:.3f} ms/step"]))
    libs = " and ".join(sorted(set(hit["library"].dropna().astype(str)))) or "the library"
    asked = "/".join(sorted(set(hit["math"].dropna().astype(str))))
    share = f", {total / library_ms:.1%} of library-kernel time" if library_ms else ""
    return (f"{len(calls.groupby(['layer', 'direction']))} of {places} conv/linear products (layer x direction) ran "
            f"kernels that compute in fp32 on {asked} tensors, the algorithm{'s' if len(said) > 1 else ''} {libs} chose: "
            f"{'; '.join(said)} "
            f"({total:.3f} ms/step{share})")


def first_screen_lines(checks: pd.DataFrame, label) -> list[str]:
    """The first screen's lines of the cases whose library computed fp32 on the tensors asked (passing ``math as
    asked`` rows whose subject begins with ``LIBRARY_FP32``): the case, its batch size and the statement."""
    if checks is None or checks.empty:
        return []
    rows = checks[(checks["check"] == Check.MATH_AS_ASKED) & (checks["status"] == PASS)
                  & checks["subject"].astype(str).str.startswith(LIBRARY_FP32)]
    return [" ".join(x for x in (label(r.framework) if isinstance(r.framework, str) else "",
                                 f"bs {int(r.batch_size)}" if pd.notna(r.batch_size) else "") if x)
            + f": {str(r.detail).split(STATEMENT_END)[0]}" for r in rows.itertuples(index=False)]


def math_checks(run: Run) -> list[dict[str, Any]]:
    table = M.math_table([run])
    cover = M.math_coverage([run])
    wrong = M.math_mismatches(table)
    wrong = wrong[~library_fp32(wrong)] if len(wrong) else wrong
    events = {(fw, bs): (ev, n) for fw, bs, ev, n, _ in M.library_events(run)}
    rows: list[dict[str, Any]] = []
    for c in cover.itertuples(index=False):
        ev, n = events.get((c.case, c.batch_size), (pd.DataFrame(), 0))
        rows += _as_asked(run, c, table, wrong, library_statement(ev, n, c.library_ms_per_step))
        rows.append(_known(run, c))
    return rows


def _as_asked(run: Run, c, table, wrong, statement: str) -> list[dict[str, Any]]:
    mine = table[(table["case"] == c.case) & (table["batch_size"] == c.batch_size)]
    products = M.products(mine)
    bad = wrong[(wrong["case"] == c.case) & (wrong["batch_size"] == c.batch_size)]
    if c.math_asked is None:
        return [check_row(run.name, c.case, c.batch_size, Check.MATH_AS_ASKED, SUBJECT, None, None, NOT_CHECKED,
                          "the records do not say which math the case asked for")]
    if not len(products):
        return [check_row(run.name, c.case, c.batch_size, Check.MATH_AS_ASKED, SUBJECT, c.math_asked, None,
                          NOT_CHECKED, "no convolution or linear product of this case has a known math")]
    if len(bad):
        ran = sorted(set(bad["math_ran"]))
        what = "; ".join(f"{r.layer} {r.direction} {r.library_call} ran {r.math_ran} ({r.ms_per_step:.3f} ms/step)"
                         for r in bad.itertuples(index=False))
        also = f"; not failed, {statement}" if statement else ""
        return [check_row(run.name, c.case, c.batch_size, Check.MATH_AS_ASKED, f"{NOT_AS_ASKED}: {SUBJECT}",
                          c.math_asked, "/".join(ran), FAIL,
                          f"asked {c.math_asked}: {what}{_on_fma(products, bad.index)}{also}")]
    ran = products.groupby("math_ran")["ms_per_step"].sum()
    said = ", ".join(f"{m} {ms:.3f} ms/step" for m, ms in ran.items())
    detail = f"{len(products)} product row(s): {said} ({c.time_kind}){_on_fma(products)}"
    return [check_row(run.name, c.case, c.batch_size, Check.MATH_AS_ASKED,
                      f"{LIBRARY_FP32}: {SUBJECT}" if statement else SUBJECT, c.math_asked, "/".join(ran.index),
                      PASS, f"{statement}{STATEMENT_END}{detail}" if statement else detail)]


def _on_fma(products, failed=()) -> str:
    """The products of a tensor-core math that ran on the FMA units, with their time and share, or ''; those
    already named as another math (``failed``: their rows' index) left out."""
    fma = M.fma_products(products)
    fma = fma[~fma.index.isin(failed)]
    if not len(fma):
        return ""
    total = float(products["ms_per_step"].sum())
    what = "; ".join(f"{r.layer} {r.direction} {r.library_call} {r.math_ran} {r.ms_per_step:.3f} ms/step"
                     for r in fma.itertuples(index=False))
    share = f", {float(fma['ms_per_step'].sum()) / total:.1%} of the conv/linear kernels' time" if total else ""
    return f"; on FMA units, no tensor core (kernel names){share}: {what}"


def _known(run: Run, c) -> dict[str, Any]:
    goal = f">= {M.COVERAGE_GOAL:.0%}"
    if not c.records_have_math:
        return check_row(run.name, c.case, c.batch_size, Check.MATH_KNOWN, "library time", goal, None, NOT_CHECKED,
                         "records written before the math columns: re-normalise the run where its captures are kept "
                         "(kernelmap normalise RUN_DIR)")
    if c.share is None:
        return check_row(run.name, c.case, c.batch_size, Check.MATH_KNOWN, "library time", goal, None, NOT_CHECKED,
                         "no library time in this case")
    if not c.calls_with_math and c.share < M.COVERAGE_GOAL:
        return check_row(run.name, c.case, c.batch_size, Check.MATH_KNOWN, "library time", goal, f"{c.share:.1%}",
                         NOT_CHECKED, "no library call of this case has a math: the calls' math comes from the "
                         "library logs of the libs pass (--profile libs or all), this case ran none; "
                         f"{c.with_math_ms_per_step:.3f} of {c.library_ms_per_step:.3f} ms/step known from kernel names")
    status = PASS if c.share >= M.COVERAGE_GOAL else FAIL
    detail = (f"{c.with_math_ms_per_step:.3f} of {c.library_ms_per_step:.3f} ms/step ({c.time_kind}) has a known math"
              + (f"; unknown: {c.unknown_top}" if status is FAIL else ""))
    return check_row(run.name, c.case, c.batch_size, Check.MATH_KNOWN, "library time", goal, f"{c.share:.1%}",
                     status, detail)
