"""Library mix, kernel counts, busy share and capture overhead."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kernelmap import rundir, schema, timing
from kernelmap.strings import STRING

from .base import Busy, Run, case_of, field_at, passes_of, step_times_of
from .basis import CLEAN, pass_state
from .linked import linked_libraries, op_signature
from .summary import clean_stats, summary_table
from .timed import Timed, timed_events


# --- library mix, kernel counts, busy share -----------------------------------------------------
def event_library(run: Run, t: Timed) -> pd.Series:
    """The library of each timed event. Kernels (GPU): their own, from the linked library call.
    Framework ops (CPU): the libraries of the library-log calls linked to ops of the same
    signature (canonical op, layer, direction group), e.g. oneDNN for a convolution backward,
    BLAS for PyTorch's linear; ``a/b`` where both ran; "native" (framework code) where nothing
    was linked."""
    lib = t.events["library"]
    if t.level == "op":
        by_sig = linked_libraries(run, t.framework, t.batch_size)
        vals = ["/".join(by_sig[k]["libraries"]) if k in by_sig else pd.NA for k in op_signature(t.events)]
        lib = pd.Series(vals, index=t.events.index, dtype=STRING)
    return lib.fillna("native")


def library_mix(runs: list[Run]) -> pd.DataFrame:
    """Per run x framework x batch size x library: time per step (ms) and share of timed time."""
    rows = []
    for run in runs:
        for t in timed_events(run):
            lib = event_library(run, t)
            total = float(t.events["dur_ns"].sum())
            for name, g in t.events.groupby(lib):
                ns = float(g["dur_ns"].sum())
                rows.append({"run": run.name, "framework": t.framework, "batch_size": t.batch_size,
                             "library": name, "level": t.level, "ms_per_step": ns / t.n_steps / 1e6,
                             "share": ns / total if total else None})
    return pd.DataFrame(rows, columns=["run", "framework", "batch_size", "library", "level",
                                       "ms_per_step", "share"])


def kernel_counts(runs: list[Run]) -> pd.DataFrame:
    """Per run x framework x batch size x canonical op: distinct kernels and launches per step."""
    rows = []
    for run in runs:
        for t in timed_events(run):
            if t.level != "kernel":
                continue
            ev = t.events.assign(canonical_op=t.events["canonical_op"].fillna(schema.UNATTRIBUTED))
            for op, g in ev.groupby("canonical_op"):
                rows.append({"run": run.name, "framework": t.framework, "batch_size": t.batch_size,
                             "canonical_op": op, "distinct_kernels": int(g["kernel_name"].nunique()),
                             "launches_per_step": len(g) / t.n_steps})
    return pd.DataFrame(rows, columns=["run", "framework", "batch_size", "canonical_op",
                                       "distinct_kernels", "launches_per_step"])


CLEAN_STEP_BASIS = "clean-pass median step"
OWN_STEP_BASIS = "the same pass's mean step"
OWN_MEDIAN_BASIS = "the same pass's median step (its step times not kept)"


def _own_step_ms(run: Run, t: Timed) -> tuple[float | None, str | None]:
    """(step ms, basis) of the pass that recorded ``t``: the mean of its step times (results.json, else the
    pass's own result file ``<case>/bs<N>/<pass>.json``), else its recorded median step (runs that kept
    neither); (None, None) without any."""
    for r in run.results:
        if case_of(r) == t.framework and field_at(r, "batch_size") == t.batch_size:
            p = passes_of(r).get(t.pass_name or "", {})
            st = step_times_of(p)
            own = run.path / str(field_at(r, "dir", default="")) / rundir.pass_result_name(t.pass_name or "")
            if st is None and t.pass_name and field_at(r, "dir") and own.is_file():
                st = step_times_of(rundir.read_json(own))
            if st is not None:
                return float(st.mean()) * 1e3, OWN_STEP_BASIS
            med = field_at(p, "median_step_s")
            return (float(med) * 1e3, OWN_MEDIAN_BASIS) if isinstance(med, int | float) else (None, None)
    return None, None


def busy_share(runs: list[Run]) -> pd.DataFrame:
    """Sum of timed event time per step of a capture pass's trace over a step: on the GPU the clean pass's
    median step (kernel time is the device's clock; a capture pass's own step is slowed by its per-step
    synchronisation), on the CPU the same pass's mean step (op time is the host's clock, slowed with its
    pass: a contended capture pass over a quiet clean step read 360%). ``pass`` and ``step_pass``: the
    passes of the two; ``capture_step_ms``: the capture pass's step, for reference. Without a step, no share."""
    summ = summary_table(runs)
    rows = []
    for run in runs:
        for t in timed_events(run):
            busy_ms = float(t.events["dur_ns"].sum()) / t.n_steps / 1e6
            step_ms, basis, step_pass = None, None, None
            if t.level == "op":
                step_ms, basis = _own_step_ms(run, t)
                step_pass = t.pass_name if step_ms else None
            else:
                m = summ[(summ["run"] == run.name) & (summ["framework"] == t.framework)
                         & (summ["batch_size"] == t.batch_size)]
                if len(m) and pd.notna(m["step_ms_median"].iloc[0]):
                    step_ms, basis, step_pass = float(m["step_ms_median"].iloc[0]), CLEAN_STEP_BASIS, CLEAN
            rows.append({"run": run.name, "framework": t.framework, "batch_size": t.batch_size,
                         "level": t.level, "source": t.source, "pass": t.pass_name, "busy_ms_per_step": busy_ms,
                         "step_ms": step_ms, "step_basis": basis, "step_pass": step_pass,
                         "busy_share": busy_ms / step_ms if step_ms else None,
                         "capture_step_ms": t.step_ns / 1e6 if t.step_ns else None,
                         "capture_step_basis": t.step_basis})
    return pd.DataFrame(rows, columns=["run", "framework", "batch_size", "level", "source", "pass",
                                       "busy_ms_per_step", "step_ms", "step_basis", "step_pass", "busy_share",
                                       "capture_step_ms", "capture_step_basis"])


def profiler_overhead(runs: list[Run]) -> pd.DataFrame:
    """Per capture pass (results.json ``passes``): median step time, its change vs the clean pass and
    the verdict against the clean pass's 95% interval (``timing.overhead_verdict``): an overhead is
    a figure only where the verdict is "above noise". ``against_clean``: the pass against its clean
    pass by ``basis.PassState`` (95% intervals where the run records the pass's own, else that
    verdict); ``contention``: what else used the machine during the pass (``BUSY`` where flagged
    contended, "not measured" for older runs), ``contended`` the flag."""
    rows = []
    for run in runs:
        for r in run.results:
            clean = clean_stats(r)
            for name, p in passes_of(r).items():
                state = pass_state(run.name, r, name)
                busy = Busy.of(r) if name == CLEAN else Busy.of(p)
                if name == "clean":
                    med, over, verdict, steps = clean.get("median_step_s"), None, None, field_at(r, "steps")
                else:
                    st = step_times_of(p)
                    med = float(np.median(st)) if st is not None else field_at(p, "median_step_s")
                    steps = field_at(p, "steps")
                    over = med / clean["median_step_s"] - 1 if med is not None and clean.get("median_step_s") else None
                    verdict = None if med is None else str(timing.overhead_verdict(med, steps or 0, clean))
                skipped = field_at(p, "skipped")
                rows.append({"run": run.name, "framework": case_of(r),
                             "batch_size": field_at(r, "batch_size"), "pass": name, "steps": steps,
                             "step_ms_median": None if med is None else med * 1e3,
                             "overhead": over, "verdict": verdict,
                             "against_clean": None if state is None else str(state.agreement),
                             "contended": None if skipped is not None else busy.contended,
                             "contention": None if skipped is not None else busy.marked,
                             "skipped": None if skipped is None else str(skipped)})
    return pd.DataFrame(rows, columns=["run", "framework", "batch_size", "pass", "steps", "step_ms_median",
                                       "overhead", "verdict", "against_clean", "contended", "contention",
                                       "skipped"])
