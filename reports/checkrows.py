"""The self-check table's vocabulary and rows (``checks``, ``relations``): statuses, the checks by the name
the report prints, one row, and the figures in words."""

from __future__ import annotations

import enum
from typing import Any

from kernelmap.timing import NOISE_THRESHOLD

from .analyses.base import Busy, Run, case_of, field_at, passes_of


class Status(enum.StrEnum):
    PASS = "pass"
    FAIL = "FAIL"
    NOT_CHECKED = "not checked"


PASS, FAIL, NOT_CHECKED = Status.PASS, Status.FAIL, Status.NOT_CHECKED


class Check(enum.StrEnum):
    """The self-checks, by the name the report prints (reports/checks.py's docstring says what each tests)."""

    CALLS = "calls per step"
    LIBRARY_CALLS = "library calls per step"
    TRACED_STEPS = "traced steps"
    TIME_WITHIN_STEP = "time within step"
    LAYERS_WITHIN_STEP = "layer times within step"
    CAPTURE_NOT_FASTER = "capture not faster"
    LAYER_VS_BATCH = "layer time vs batch size"
    CLEAN_VS_BENCH = "clean vs step benchmark"
    LAUNCH_BOUND = "launch-bound figures"
    CASES_RAN = "every case ran"
    QUIET = "first-screen figures quiet"
    RUN_COMPLETE = "run files present"
    E2E_VS_STEP = "end to end vs step"
    CALL_WITHIN_OP = "library call within its op"
    BUSY_SHARE = "busy share of one pass"
    CALL_STATEMENT = "one statement of library calls"
    CPU_WALL = "CPU time vs wall time"
    OP_CPU_SAMPLED = "sampled CPU time as the worker's"  # reports/cpuchecks.py (issue 42)
    OP_CPU_WITHIN = "ops' CPU time within their steps'"
    OP_CPU_WALL = "ops' CPU time vs wall time"
    OP_CPU_THREADS = "ops' pool work from their threads' clocks"  # reports/cpuchecks.py (kernelmap/poolcpu.py)
    MATH_AS_ASKED = "math as asked"  # reports/mathchecks.py
    MATH_KNOWN = "math known"
    COMM_LINKED = "communication attributed to its op"  # reports/commchecks.py (issue 39)
    COMM_BOUNDS = "communication within its step"
    COMM_INDEPENDENT = "exposed communication against the step without reduction"
    SCALING = "scaling efficiency against one device"
    RANK_TIMELINE = "merged timeline's steps as the communication figures'"  # reports/commchecks.py
    RANKS_TRACED = "every rank traced"  # reports/commchecks.py
    COUNTERS_COVER = "counters cover the step"  # reports/counterchecks.py
    COUNTER_MATH = "log math vs counter math"
    COUNTERS_BUDGET = "counters pass within budget"
    DIFF_CONSERVED = "diff conserves each side's time"  # reports/diffsection.py (issue 40)


COLUMNS = ["run", "framework", "batch_size", "check", "subject", "expected", "measured", "status", "detail"]


def check_row(run: str, fw: str | None, bs: Any, check: str, subject: str, expected: Any, measured: Any,
              status: str, detail: str = "") -> dict[str, Any]:
    return {"run": run, "framework": fw, "batch_size": bs, "check": check, "subject": subject,
            "expected": expected, "measured": measured, "status": status, "detail": detail}


def entry_of(run: Run, fw: str, bs: Any) -> dict | None:
    """The results.json entry of ``fw`` x ``bs`` (None: no such case)."""
    for r in run.results:
        if case_of(r) == fw and field_at(r, "batch_size") == bs:
            return r
    return None


def ms_text(x: float | None) -> str:
    return "–" if x is None else f"{x * 1e3:.4g} ms"


def span_ms(ci: tuple[float, float] | None) -> str:
    return "no interval" if ci is None else f"[{ci[0] * 1e3:.4g}–{ci[1] * 1e3:.4g}] ms"


def pass_contention(run: Run, fw: str, bs: Any, pass_name: str | None) -> Busy:
    """The measured contention of one pass (the clean pass: its used trials'), ``Busy`` "not measured" where
    results.json records none."""
    r = entry_of(run, fw, bs) if getattr(run, "results", None) is not None else None
    if r is None:
        return Busy(None, "not measured")
    if pass_name == "clean":
        return Busy.of(r)
    p = passes_of(r).get(pass_name or "")
    return Busy.of(p) if p is not None else Busy(None, "not measured")


# Two figures of which either was measured under contention: their intervals are not their noise (what else ran
# slowed them, not chance), so a relation between them holds only within this share of the smaller.
CONTENDED_RULE = (f"measured under contention: intervals are not noise there, so the figures must hold the relation "
                  f"within {NOISE_THRESHOLD:.0%} of the smaller")


# Two figures of two processes (two passes, a pass and a step benchmark), each measured under contention at its own
# time (issue 42): how far apart they lie says how differently the machine was shared then, not how the figures relate.
BOTH_CONTENDED_RULE = ("both measured under contention, each in its own process at its own time: how far apart they "
                       "lie says how differently the machine was shared then, not how the two figures relate")


def both_contended(*busy: Busy) -> bool:
    """Every one of ``busy`` measured contended (``BOTH_CONTENDED_RULE``)."""
    return bool(busy) and all(b.contended is True for b in busy)


def exceeds(a: float, b: float, a_ci: tuple[float, float] | None, b_ci: tuple[float, float] | None,
            contended: bool, floor: float = 0.0) -> bool:
    """``a`` above ``b`` beyond noise: where neither was contended, ``a``'s 95% interval wholly above ``b``'s;
    where either was (``CONTENDED_RULE``) or either has no interval, ``a`` above ``b`` by more than
    ``timing.NOISE_THRESHOLD`` of the smaller. Either way by more than ``floor``."""
    if contended or a_ci is None or b_ci is None:
        return a - b > max(NOISE_THRESHOLD * min(a, b), floor)
    return a_ci[0] > b_ci[1] and a_ci[0] - b_ci[1] > floor
