"""The self-checks of multi-device cases' communication (issue 39; figures: ``analyses/comm.py``), one row per
case and check:

- ``communication attributed to its op``: every bit of communication time is an op of the framework's own
  (``c10d::allreduce_``, XLA's ``all-reduce``, MXNet's ``KVStoreReduce`` and its KVStore's copies) or linked to
  the op that issued it (gloo's work spans, NCCL's kernels): the lowest share over the case's steps and ranks
  must be 100%. Not checked where no traced step recorded any communication (a clean-only run).
- ``communication within its step``: for every traced step and rank, 0 <= exposed <= communication <= step.
"""

from __future__ import annotations

from typing import Any

from .analyses.base import Run
from .analyses.comm import per_step
from .checkrows import FAIL, NOT_CHECKED, PASS, Check, check_row

TOLERANCE_MS = 1e-9  # the figures are sums of whole nanoseconds: equal within rounding


def step_checks(run_name: str, steps) -> list[dict[str, Any]]:
    """The two checks per case of ``steps`` (``comm.per_step`` of one run's records)."""
    rows: list[dict[str, Any]] = []
    for (case, fw, bs, src), g in steps.groupby(["run", "framework", "batch_size", "source"], sort=True):
        share = g["linked_share"].dropna()
        if share.empty:
            rows.append(check_row(run_name, fw, bs, Check.COMM_LINKED, case, 1.0, None, NOT_CHECKED,
                                  "no traced step recorded communication"))
        else:
            worst = float(share.min())
            rows.append(check_row(run_name, fw, bs, Check.COMM_LINKED, case, 1.0, worst, PASS if worst >= 1.0 else FAIL,
                                  f"{src}: lowest share over {len(share)} steps x ranks: {worst:.1%} of the communication "
                                  "time is an op of its own or linked to the op that issued it"))
        bad = g[(g["exposed_ms"] < -TOLERANCE_MS) | (g["exposed_ms"] > g["communication_ms"] + TOLERANCE_MS)
                | (g["communication_ms"] > g["step_ms"] + TOLERANCE_MS)]
        detail = (f"{src}: {len(g)} steps x ranks within" if bad.empty else
                  "; ".join(f"step {r.iteration} rank {r.rank}: exposed {r.exposed_ms:.3f}, communication "
                            f"{r.communication_ms:.3f}, step {r.step_ms:.3f} ms" for r in bad.head(3).itertuples()))
        rows.append(check_row(run_name, fw, bs, Check.COMM_BOUNDS, case, "0 <= exposed <= communication <= step",
                              f"{len(bad)} outside", PASS if bad.empty else FAIL, detail))
    return rows


def comm_checks(run: Run) -> list[dict[str, Any]]:
    """The checks of every multi-device case of ``run``; a run without one: each check once, not checked."""
    rows = step_checks(run.name, per_step(run.records)) if run.records is not None else []
    if rows:
        return rows
    why = "no case of this run trained on more than one device (--devices)"
    return [check_row(run.name, None, None, c, "run", None, None, NOT_CHECKED, why)
            for c in (Check.COMM_LINKED, Check.COMM_BOUNDS)]
