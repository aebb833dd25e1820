"""Self-checks of a report: figures tested against what the model and the run say they must be.

Every check returns rows of one table (``self_checks``): run, framework, batch size, check,
subject, expected, measured, status (``pass`` / ``FAIL`` / ``not checked``) and why. A figure
that could not be checked says so, with the reason. ``kernelmap report --strict`` exits
``EXIT_CHECK_FAILED`` when any row is ``FAIL``.

Checks:

* ``calls per step``: framework-op calls per step of each canonical op x direction (fwd, bwd)
  of the model's layers equal the counts the model spec implies (``expected_calls_per_step``).
* ``traced steps``: the steps the report divides by (iterations of the trace holding timed model
  ops) equal the steps the capture pass timed (results.json).
* ``time within step``: summed op time (CPU) or kernel time (GPU) per step is at most the
  measured wall time per step of the pass that recorded it (the pass's own step times, mean).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd
from kernelmap.frameworks.spec import LAYERS

from kernelmap import adapters  # noqa: E402
from kernelmap.rundir import RunDir, read_json  # noqa: E402

EXIT_CHECK_FAILED = 4
PASS, FAIL, NOT_CHECKED = "pass", "FAIL", "not checked"
COLUMNS = ["run", "framework", "batch_size", "check", "subject", "expected", "measured", "status", "detail"]


def expected_calls_per_step(layers: Iterable = LAYERS) -> dict[tuple[str, str], int]:
    """(canonical op, direction group) -> calls per training step, from the spec's layers.

    The spec (frameworks/spec.py) lists the conv and linear layers; its model is each conv
    followed by a relu and a 2x2 max-pool, each linear layer but the last (the classifier)
    followed by a relu. Every forward call has one backward call."""
    layers = list(layers)
    convs = sum(1 for x in layers if x.kind == "conv2d")
    linears = sum(1 for x in layers if x.kind == "linear")
    fwd = {"conv2d": convs, "relu": convs + max(linears - 1, 0), "max_pool2d": convs, "linear": linears}
    return {(op, d): n for op, n in fwd.items() if n for d in ("fwd", "bwd")}


def _row(run: str, fw: str, bs: Any, check: str, subject: str, expected: Any, measured: Any, status: str,
         detail: str = "") -> dict[str, Any]:
    return {"run": run, "framework": fw, "batch_size": bs, "check": check, "subject": subject,
            "expected": expected, "measured": measured, "status": status, "detail": detail}


def _pass_step_times(run, fw: str, bs: int | None, pass_name: str | None) -> tuple[list[float] | None, str]:
    """The pass's own per-step wall times (s): ``<fw>/bs<N>/<pass>.json`` as the worker wrote it,
    else results.json's per-pass figures (mean, else median, with a note)."""
    from .analysis import _get, _passes

    if not pass_name:
        return None, "no capture pass is known for this source"
    f = RunDir(run.path).pass_result(fw, bs, pass_name)
    if f.is_file():
        d = read_json(f)
        st = d.get("step_times_s") if isinstance(d, dict) else None
        if isinstance(st, list) and st:
            return [float(x) for x in st], f"{f.relative_to(run.path)}: step_times_s"
    for r in run.results:
        if _get(r, "framework") == fw and _get(r, "batch_size") == bs:
            p = _passes(r).get(pass_name, {})
            st = _get(p, "step_times_s")
            if isinstance(st, list) and st:
                return [float(x) for x in st], f"results.json: step_times_s of the {pass_name} pass"
            v, n = _get(p, "mean_step_s"), _get(p, "steps")
            if isinstance(v, int | float) and isinstance(n, int) and n:
                return [float(v)] * n, f"results.json: mean_step_s of the {pass_name} pass"
    return None, (f"the {pass_name} pass's step times (or their mean) are recorded nowhere ({pass_name}.json, "
                  "results.json); a median alone does not bound summed time")


def self_checks(runs: list) -> pd.DataFrame:
    """All checks of all runs, one row each (see the module docstring)."""
    from . import analysis as A

    rows: list[dict[str, Any]] = []
    expected = expected_calls_per_step()
    for run in runs:
        timed = A.timed_events(run)
        if not timed:
            rows.append(_row(run.name, None, None, "all", "run", None, None, NOT_CHECKED,
                             "no records.parquet or no timed events: nothing to check"))
            continue
        for t in timed:
            fw, bs = t.framework, t.batch_size
            source = adapters.FORMATS.get(t.source)
            # calls per step
            if not getattr(source, "OPS_ARE_FRAMEWORK_CALLS", True):
                rows.append(_row(run.name, fw, bs, "calls per step", "all model ops", None, None, NOT_CHECKED,
                                 f"a {t.source} op is a compiled (fused) kernel or thunk, not a framework-op call"))
            elif t.ops is None or t.ops.empty:
                rows.append(_row(run.name, fw, bs, "calls per step", "all model ops", None, None, NOT_CHECKED,
                                 f"the {t.source} trace records no framework ops in its steps"))
            else:
                calls = A.op_calls(t).set_index(["canonical_op", "direction"])
                for (op, d), n in expected.items():
                    got = float(calls.loc[(op, d), "calls_per_step"]) if (op, d) in calls.index else 0.0
                    basis = calls.loc[(op, d), "basis"] if (op, d) in calls.index else "no such op"
                    rows.append(_row(run.name, fw, bs, "calls per step", f"{op} {d}", n, got,
                                     PASS if got == n else FAIL,
                                     f"{t.source}, {t.n_steps} steps; {basis}"))
            # traced steps vs the pass's timed steps
            n_pass = None
            for r in run.results:
                if A._get(r, "framework") == fw and A._get(r, "batch_size") == bs:
                    n_pass = A._get(A._passes(r).get(t.pass_name or "", {}), "steps")
            if not t.iterations:
                rows.append(_row(run.name, fw, bs, "traced steps", t.source, n_pass, t.n_steps, NOT_CHECKED,
                                 f"the trace has no iterations; steps taken from {t.n_steps_basis}"))
            elif n_pass is None:
                rows.append(_row(run.name, fw, bs, "traced steps", t.source, None, t.n_steps, NOT_CHECKED,
                                 f"results.json has no step count for the {t.pass_name} pass"))
            else:
                extra = (f"; {t.outside_events} timed event(s), {t.outside_ns / 1e6:.3f} ms, in other "
                         "iterations left out") if t.outside_events else ""
                rows.append(_row(run.name, fw, bs, "traced steps", t.source, int(n_pass), t.n_steps,
                                 PASS if t.n_steps == n_pass else FAIL,
                                 f"iterations {list(t.iterations)}{extra}"))
            # timed work within the step's wall time
            st, basis = _pass_step_times(run, fw, bs, t.pass_name)
            busy_ms = float(t.events["dur_ns"].sum()) / t.n_steps / 1e6
            what = f"{t.level} time per step ({t.source})"
            if t.level == "op" and not getattr(source, "CPU_OP_TIME_IS_BUSY", True):
                rows.append(_row(run.name, fw, bs, "time within step", what, None, busy_ms, NOT_CHECKED,
                                 f"{t.source} op spans on the CPU include waiting (asynchronous thunks)"))
            elif st is None:
                rows.append(_row(run.name, fw, bs, "time within step", what, None, busy_ms, NOT_CHECKED, basis))
            elif len(st) != t.n_steps:
                rows.append(_row(run.name, fw, bs, "time within step", what, None, busy_ms, NOT_CHECKED,
                                 f"{basis} has {len(st)} steps, the trace {t.n_steps}: not the same steps"))
            else:
                step_ms = sum(st) / len(st) * 1e3
                rows.append(_row(run.name, fw, bs, "time within step", what, step_ms, busy_ms,
                                 PASS if busy_ms <= step_ms else FAIL,
                                 f"at most the mean wall time of the {t.pass_name} pass's {len(st)} steps "
                                 f"({basis})"))
    return pd.DataFrame(rows, columns=COLUMNS)


def failed(checks: pd.DataFrame) -> pd.DataFrame:
    return checks[checks["status"] == FAIL]
