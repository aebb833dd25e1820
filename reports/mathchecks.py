"""The two self-checks of each library call's math (issue 38; ``analyses/math.py`` makes the tables).

* ``math as asked``: per case x batch size, every convolution and linear product (not a bias gradient) whose
  math is known ran the math the case asked for (``--math``): FAIL names each one that did not (layer, direction, call, the
  math it ran, its time per step): asked fp32, a call ran TF32; asked bf16, a conv ran fp32; asked tf32,
  tf32 or fp32 pass (TF32 is a permission: ``math.ALLOWED``), the detail giving the time of each. Not checked
  where the case's math is not recorded or none of its products has a known math. A product of a tensor-core
  math (tf32, bf16, fp16) whose kernels ran on the FMA units (``math_unit``: ``math.fma_products``) is named in the
  detail with its time and share of the conv/linear kernels' time, not failed: it ran the precision asked, on other units
  (docs/MIXED_PRECISION.md "Tensor cores or FMA").
* ``math known``: per case x batch size, the share of library time whose math is known is at least
  ``math.COVERAGE_GOAL``; FAIL names the largest unknown kernels. Not checked where the records were
  written before the math columns (re-normalise the run), the case has no library time, or it has no library
  call with a math and falls short (no libs pass: its calls and their logged math were never recorded).
"""

from __future__ import annotations

from typing import Any

from .analyses import math as M
from .analyses.base import Run
from .checkrows import FAIL, NOT_CHECKED, PASS, Check, check_row

# a failed row's subject begins so: the banner's line then says it in words (issue 38: the first screen says where a
# framework did not run the math asked for)
NOT_AS_ASKED = "did not run the math asked for"


def math_checks(run: Run) -> list[dict[str, Any]]:
    table = M.math_table([run])
    cover = M.math_coverage([run])
    wrong = M.math_mismatches(table)
    rows: list[dict[str, Any]] = []
    for c in cover.itertuples(index=False):
        rows += _as_asked(run, c, table, wrong)
        rows.append(_known(run, c))
    return rows


def _as_asked(run: Run, c, table, wrong) -> list[dict[str, Any]]:
    mine = table[(table["case"] == c.case) & (table["batch_size"] == c.batch_size)]
    products = M.products(mine)
    bad = wrong[(wrong["case"] == c.case) & (wrong["batch_size"] == c.batch_size)]
    subject = "conv/linear products"
    if c.math_asked is None:
        return [check_row(run.name, c.case, c.batch_size, Check.MATH_AS_ASKED, subject, None, None, NOT_CHECKED,
                          "the records do not say which math the case asked for")]
    if not len(products):
        return [check_row(run.name, c.case, c.batch_size, Check.MATH_AS_ASKED, subject, c.math_asked, None,
                          NOT_CHECKED, "no convolution or linear product of this case has a known math")]
    if len(bad):
        ran = sorted(set(bad["math_ran"]))
        what = "; ".join(f"{r.layer} {r.direction} {r.library_call} ran {r.math_ran} ({r.ms_per_step:.3f} ms/step)"
                         for r in bad.itertuples(index=False))
        return [check_row(run.name, c.case, c.batch_size, Check.MATH_AS_ASKED, f"{NOT_AS_ASKED}: {subject}",
                          c.math_asked, "/".join(ran), FAIL, f"asked {c.math_asked}: {what}{_on_fma(products, bad.index)}")]
    ran = products.groupby("math_ran")["ms_per_step"].sum()
    said = ", ".join(f"{m} {ms:.3f} ms/step" for m, ms in ran.items())
    return [check_row(run.name, c.case, c.batch_size, Check.MATH_AS_ASKED, subject, c.math_asked,
                      "/".join(ran.index), PASS,
                      f"{len(products)} product row(s): {said} ({c.time_kind}){_on_fma(products)}")]


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
