"""The self-checks of the counters pass (issue 38; ``analyses/roofline.py`` makes the tables; docs/COUNTERS.md).

Rows only for the cases of a run that asked for the pass (``--profile counters``); none otherwise.

* ``counters cover the step``: the timing step's kernel time in kernels that have counters (``paired_time_share``)
  is at least ``COVERAGE_GOAL``; FAIL says why the rest is unpaired (counts or names differ). The detail says where
  the kernels were paired by name and launch configuration because the two steps launched them in another order
  (``roofline.match_kernels``). Not checked where the pass recorded nothing (its reason: the CPU, no ncu, ncu failed).
* ``log math vs counter math``: every paired kernel whose log math (the arithmetic its call's ``math_ran`` and its
  name imply: ``kernelmath.counted_math``) and counter math are both known agrees; FAIL names each that does not.
  Not checked where none has both. The detail says how many were compared by the kernel's name alone
  (``kernelmath.counted_by_name``: an FMA-unit kernel computes FP32 whatever its call's math, a no-product kernel in its
  template's type; FP32 on fp16 data agrees with counters of FP32 alone or FP32 and HADD, the conversions:
  ``kernelmath.agrees``), and names each FMA-unit kernel whose call's ``math_ran`` is another math (a bf16 call that
  ran an sgemm): the counters cannot disagree with those, so that is where such a finding is said.
* ``counters pass within budget``: ncu's wall time for the case is at most ``COUNTERS_BUDGET_S`` (the issue's
  60 s per framework and case).

Counter FLOPs against the shapes' model is a measurement, not a self-check (padding of small GEMM tiles is
real work: fc2's 10 outputs run as 16); against the FLOPs the kernels execute by shape, tile and launch
(kernelmap/gemmwork.py) ``counter_layers`` gives the ±10% verdict, or why a kernel's work is not derivable.
"""

from __future__ import annotations

from typing import Any

from .analyses import roofline as R
from .analyses.base import Run
from .checkrows import FAIL, NOT_CHECKED, PASS, Check, check_row

COVERAGE_GOAL = 0.99  # issue 38: counters for >= 99% of kernel time


def counter_checks(run: Run) -> list[dict[str, Any]]:
    _, status, _ = R.counter_kernels([run])
    rows: list[dict[str, Any]] = []
    for s in status.to_dict("records"):
        rows += [_covered(run, s), _math(run, s), _budget(run, s)]
    return rows


def _skipped(s: dict) -> bool:
    return s.get("kernels") is None or s.get("kernels") != s.get("kernels")  # None or NaN: nothing counted


def _covered(run: Run, s: dict) -> dict[str, Any]:
    goal = f">= {COVERAGE_GOAL:.0%}"
    args = (run.name, s["case"], s["batch_size"], Check.COUNTERS_COVER, "the timing step's kernel time", goal)
    if _skipped(s):
        return check_row(*args, None, NOT_CHECKED, f"the counters pass recorded nothing: {s['reason']}")
    share = s["paired_time_share"]
    if share is None or share != share:
        return check_row(*args, None, NOT_CHECKED, f"no timing step to pair with: {s['reason']}")
    by = f", by {s['pairing']}" if str(s.get("pairing")).startswith(R.BY_IDENTITY) else ""
    n_copies = s.get("copy_nodes") or 0
    copies = (f" ({int(n_copies)} graph memcpy/memset node(s), {s['copy_nodes_ms']:.4f} ms, left out of the step: "
              "copies, which ncu does not profile)") if n_copies == n_copies and n_copies else ""
    detail = (f"{int(s['matched'])} of {int(s['kernels'])} counted kernels paired with the {s['source']} step's "
              f"{int(s['timed_kernels'])}{copies}{by}")
    if share >= COVERAGE_GOAL:
        return check_row(*args, f"{share:.1%}", PASS, detail)
    return check_row(*args, f"{share:.1%}", FAIL, f"{detail}: {s['reason']}")


def _math(run: Run, s: dict) -> dict[str, Any]:
    args = (run.name, s["case"], s["batch_size"], Check.COUNTER_MATH, "paired kernels", "the same math")
    if _skipped(s) or not s.get("math_compared"):
        return check_row(*args, None, NOT_CHECKED, "no paired kernel has both a log math and a counter math"
                         + (f" ({s['reason']})" if s.get("reason") else ""))
    n, agree = int(s["math_compared"]), int(s["math_agree"])
    rest = int(s["matched"]) - n
    said = by_name(s)
    if agree == n:
        return check_row(*args, f"{agree} of {n}", PASS, f"{n} kernel(s): the counters say the math the log says "
                         f"({said}); {rest} other paired kernel(s) not compared (no log math: the framework's own, "
                         "a scale by beta; or the counters' unknown)")
    return check_row(*args, f"{agree} of {n}", FAIL, "; ".join(s["math_disagree"]) + f" ({said})")


def by_name(s: dict) -> str:
    """How many of the compared kernels' log math came from the name alone, not the call's ``math_ran``
    (``roofline.math_agreement``), and the FMA-unit ones whose call ran another math (a bf16 call on FP32 FMA)."""
    n, products = int(s.get("math_by_name") or 0), int(s.get("math_products_by_name") or 0)
    text = (f"{n} of them by the kernel's name alone, not the call's math: {products} FMA-unit kernel(s), "
            f"{n - products} that multiply no operands (layout, FFT and Winograd transforms, split-K reductions, "
            "elementwise, pooling: their template's compute type)")
    apart = s.get("math_call_vs_name")
    if isinstance(apart, list) and apart:
        text += f"; the call's math differs from the name's in {len(apart)}: {'; '.join(apart)}"
    return text


def _budget(run: Run, s: dict) -> dict[str, Any]:
    args = (run.name, s["case"], s["batch_size"], Check.COUNTERS_BUDGET, "ncu wall time",
            f"<= {R.COUNTERS_BUDGET_S:.0f} s")
    wall = s.get("ncu_wall_s")
    if wall is None or wall != wall:
        return check_row(*args, None, NOT_CHECKED, "the pass did not run under ncu here"
                         + (f" ({s['reason']})" if _skipped(s) else ""))
    return check_row(*args, f"{wall:.1f} s", PASS if wall <= R.COUNTERS_BUDGET_S else FAIL,
                     "the worker under ncu: warm-up, one profiled step, the peaks")
