"""Self-checks of a report: figures tested against what the model and the run say they must be,
and against each other, so that a report cannot contradict itself unnoticed.

Every check returns rows of one table (``self_checks``): run, framework, batch size, check,
subject, expected, measured, status (``pass`` / ``FAIL`` / ``not checked``) and why. A figure
that could not be checked says so, with the reason (older runs lack fields: "not checked", never a
guess). ``kernelmap report --strict`` exits ``EXIT_CHECK_FAILED`` when any row is ``FAIL``.

Checks (``Check``):

* ``calls per step``: framework-op calls per step of each canonical op x direction (fwd, bwd)
  of the model's layers equal the counts the model spec implies (``expected_calls_per_step``). A count short of
  it where the trace holds fused ops whose parts it does not name (MXNet's ``_FusedOp`` in its own profiler's
  trace) is not checked, and says so (``_unread_fused``).
* ``library calls per step``: ``reports/callchecks.py``.
* ``traced steps``: the steps the report divides by (iterations of the trace holding timed model
  ops) equal the steps the capture pass timed (results.json).
* ``time within step``: summed op time (CPU) or kernel time (GPU) per step is at most the
  measured wall time per step of the pass that recorded it (the pass's own step times, mean).
* ``layer times within step``: per framework x batch size x pass, the per-layer times per step of
  the layer table (conv and linear, every direction) summed are at most that pass's mean step (N steps for a
  case on N devices: the layers are summed over them):
  framework-op or kernel time against the trace's pass, library-call time against the libs
  pass's timed steps.
* ``capture not faster``: no capture pass is faster than its clean pass beyond noise: the
  pass's 95% interval of its median lies wholly below the clean pass's, widened to one more
  process's 95% prediction interval where the clean pass ran quiet (``timing.PROCESS_RULE``) (runs that record no
  interval of the pass: the overhead verdict "below noise"). A pass that adds a profiler and
  synchronises every step cannot be faster: the clean pass was slowed. Not checked where the clean pass ran
  contended (the machine slowed it: the detail gives both passes' contention); FAIL where it was not measured busy.
* ``layer time vs batch size``: per run x framework x layer x direction x kind of time, a layer's
  time per step does not fall when the batch size grows, beyond noise; a host-clock pair is not checked
  where either pass ran slower or faster than its own clean pass beyond noise (not one time basis:
  ``_apart_from_clean``); only like with like (``_unlike``): the same library calls, algorithm and kernel at
  both sizes (else not checked, naming both), and no library-call time of a log that names no kernel or
  algorithm (oneMKL verbose). Noise: the 95% bootstrap
  interval (``timing``'s seed and resample count) of the mean of the layer's per-step times, taken
  per traced iteration (framework-op and kernel time) or per logged step of the libs pass
  (library-call time: ``ops.logged_step_sums_ms``); FAIL where the larger batch's interval lies
  wholly below the smaller one's by more than ``LAYER_FALL_FLOOR_MS`` per step. Every pair of batch
  sizes is compared. Host-clock figures of two passes of which one or both ran contended (contention measured for
  both) are not held (``checkrows.BOTH_CONTENDED_RULE``, ``relations.SAME_CONDITION_RULE``), nor a pass that ran
  apart from its clean pass; there a framework-op row is judged on its ops' own CPU time instead
  (``opcpu.layer_cpu`` of the framework pass, the CPU-time answer's figure), by its 95% intervals
  (``CPU_BY_INTERVALS``), in a row of its own ("CPU time of its ops"). The floor: a library picks its kernel per shape, and a microsecond-scale op can
  run a faster kernel at the larger batch (on an H200, JAX's fc2 forward 5.1 µs at bs 64 and 4.0 µs at
  1024; PyTorch's fc2 bias gradient 5.1 and 3.8 µs); the contradictions this check is for are
  milliseconds (PyTorch conv1 fwd 39.2 ms at bs 64 against 21.5 ms at 256 on a busy CPU).
* ``clean vs step benchmark``: for each key (framework, mode, device, batch size) the clean
  pass's median and the pytest-benchmark step median of the same job (history rows whose ``job``
  is the run's manifest ``job``) agree within their combined noise: the clean pass's 95% interval,
  widened to one more process's 95% prediction interval from its trials where it ran quiet
  (``timing.PROCESS_RULE``: the benchmark is another process), overlaps the benchmark's, taken as median ± 1.57 x IQR / sqrt(rounds) (the notch of a box plot,
  McGill, Tukey and Larsen 1978: a 95% interval of a median). Needs ``--storage``. Not held where both ran
  contended (``relations.contended_apart``), nor, where they disagree, where the contended one is the slower
  and the other quiet; a contended one faster than a quiet one beyond the 5% rule fails (``_bench_apart``).
* ``launch-bound figures`` (``analyses.launch``), per framework x mode x batch size of a GPU run: the
  GPU-busy time per step (union of kernel intervals) is at most the summed kernel time (a union
  cannot exceed its parts) and at most the clean step's 95% upper bound (else the idle share would
  be negative: the kernels of the capture pass outlast the step they are set against); and the
  busy-share table states the same clean step and summed kernel time as the launch-bound table (one
  basis: the clean pass, never the capture pass's synchronised step).
* ``every case ran``: each framework x mode x batch size the run set out to run (manifest ``config``:
  ``modes`` of the frameworks that could run, ``cli.batch_size``) has its results; a case a failed pass
  left out fails, with the run's note that says why (a report of the rest reads as if the mode was never
  asked for, while ``kernelmap run`` exited 3).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from kernelmap import adapters, frameworks, timing
from kernelmap.adapters import thunk_completion
from kernelmap.rundir import MANIFEST, asked_cases, pass_result_name, read_json
from kernelmap.timing import mean_ci  # the layer checks' noise (also reports.checks.mean_ci)
from kernelmap.worker import FRAMEWORK_PASS

from .analyses.base import (
    Busy,
    Run,
    case_of,
    expected_calls_per_step,
    field_at,
    fw_label,
    passes_of,
)
from .analyses.basis import BY_INTERVALS, Agreement, TimeKind, pass_state, pass_states
from .analyses.opcpu import layer_cpu, op_cpu
from .analyses.summary import clean_stats
from .callchecks import library_call_checks
from .checkrows import (  # the table's vocabulary, also reports.checks.<name>
    BOTH_CONTENDED_RULE,  # noqa: F401  (relations.contended_apart's wording, also reports.checks.<name>)
    COLUMNS,
    CONTENDED_RULE,
    FAIL,
    NOT_CHECKED,
    PASS,
    Check,
    check_row,
    entry_of,
    exceeds,
    ms_text,
    pass_contention,
    span_ms,
)
from .commchecks import comm_checks
from .counterchecks import counter_checks
from .cpuchecks import op_cpu_checks
from .mathchecks import math_checks
from .relations import (
    SAME_CONDITION_RULE,
    busy_share_basis,
    call_statement_checks,
    call_within_op,
    contended_apart,
    cpu_vs_wall,
    e2e_vs_step,
    quiet_figures,
    run_complete,
)

EXIT_CHECK_FAILED = 4
LAYER_FALL_FLOOR_MS = 0.005  # "layer time vs batch size": a fall under this (per step) is not judged


# A capture pass adds a profiler and synchronises every step: it cannot be faster than its clean pass, so the
# clean pass was slowed. Where the clean pass ran contended that is the machine's doing, not held (issue 42: two
# processes, each at its own time); where it was measured quiet (or not measured), by what else differs between the
# two passes' processes: FAIL.
BUSIER_CLEAN = ("the clean pass was slowed: a capture pass cannot be faster (the clean pass not measured busy: its "
                "process ran slower)")
NOTCH = 1.57  # median +- NOTCH * IQR / sqrt(n): a box plot's notch, a 95% interval of the median


def _pass_step_times(run, fw: str, bs: int | None, pass_name: str | None) -> tuple[list[float] | None, str]:
    """The pass's own per-step wall times (s): ``<fw>/bs<N>/<pass>.json`` as the worker wrote it,
    else results.json's per-pass figures (mean, else median, with a note)."""
    if not pass_name:
        return None, "no capture pass is known for this source"
    r = entry_of(run, fw, bs)
    folder = field_at(r, "dir")  # the case folder results.json records (kernelmap.rundir: readers take it)
    f = run.path / folder / pass_result_name(pass_name) if isinstance(folder, str) else None
    if f is not None and f.is_file():
        d = read_json(f)
        st = d.get("step_times_s") if isinstance(d, dict) else None
        if isinstance(st, list) and st:
            return [float(x) for x in st], f"{f.relative_to(run.path)}: step_times_s"
    if r is not None:
        p = passes_of(r).get(pass_name, {})
        st = field_at(p, "step_times_s")
        if isinstance(st, list) and st:
            return [float(x) for x in st], f"results.json: step_times_s of the {pass_name} pass"
        v, n = field_at(p, "mean_step_s"), field_at(p, "steps")
        if isinstance(v, int | float) and isinstance(n, int) and n:
            return [float(v)] * n, f"results.json: mean_step_s of the {pass_name} pass"
    return None, (f"the {pass_name} pass's step times (or their mean) are recorded nowhere ({pass_name}.json, "
                  "results.json); a median alone does not bound summed time")


# --- checks of the records -------------------------------------------------------------------
def _unread_fused(t, case) -> str:
    """Why a count short of the model's is not judged, or '': the timed source's fused ops whose parts it does not
    name (a framework's run-time fusion, ``Vocabulary.fused_ops``: MXNet's ``_FusedOp`` in its own profiler's trace,
    which names no kernel; in an nsys trace kernelmap/adapters/fused_ops.py gives each its model op)."""
    vocab = frameworks.get(case.framework).vocabulary if case is not None else None
    if vocab is None or not vocab.fused_ops or t.ops is None or t.ops.empty:
        return ""
    left = t.ops[t.ops["op_name"].isin(list(vocab.fused_ops)) & t.ops["canonical_op"].eq("other")]
    if left.empty:
        return ""
    return (f"{len(left) / t.n_steps:g} fused op(s) a step ({', '.join(sorted(set(left['op_name'])))}) whose parts "
            "this trace does not name: an op they fuse is not counted")


def _record_checks(run: Run, expected: dict[tuple[str, str], int]) -> list[dict[str, Any]]:
    """calls per step, traced steps, time within step: per timed source."""
    from . import analysis as A

    rows: list[dict[str, Any]] = []
    for t in A.timed_events(run):
        fw, bs = t.framework, t.batch_size
        source = adapters.FORMATS.get(t.source)
        # calls per step
        case = run.cases.get(fw)  # the typed case (load_run)
        mode = case.mode if case is not None else None
        uncounted = frameworks.get(case.framework).uncounted_call_modes.get(mode) if case is not None else None
        if uncounted:
            rows.append(check_row(run.name, fw, bs, Check.CALLS, "all model ops", None, None, NOT_CHECKED,
                             f"mode {mode}: {uncounted}"))
        elif not getattr(source, "OPS_ARE_FRAMEWORK_CALLS", True):
            rows.append(check_row(run.name, fw, bs, Check.CALLS, "all model ops", None, None, NOT_CHECKED,
                             f"a {t.source} op is a compiled (fused) kernel or thunk, not a framework-op call"))
        elif t.ops is None or t.ops.empty:
            rows.append(check_row(run.name, fw, bs, Check.CALLS, "all model ops", None, None, NOT_CHECKED,
                             f"the {t.source} trace records no framework ops in its steps"))
        else:
            calls = A.op_calls(t).set_index(["canonical_op", "direction"])
            fused = _unread_fused(t, case)
            for (op, d), one in expected.items():
                n = one * (case.devices if case is not None else 1)  # issue 39: each device runs the model's ops
                got = float(calls.loc[(op, d), "calls_per_step"]) if (op, d) in calls.index else 0.0
                basis = calls.loc[(op, d), "basis"] if (op, d) in calls.index else "no such op"
                status = PASS if got == n else NOT_CHECKED if got < n and fused else FAIL
                rows.append(check_row(run.name, fw, bs, Check.CALLS, f"{op} {d}", n, got, status,
                                 f"{t.source}, {t.n_steps} steps; {basis}"
                                 + (f"; {fused}" if status is NOT_CHECKED else "")))
        # traced steps vs the pass's timed steps
        r = entry_of(run, fw, bs)
        n_pass = None if r is None else field_at(passes_of(r).get(t.pass_name or "", {}), "steps")
        if not t.iterations:
            rows.append(check_row(run.name, fw, bs, Check.TRACED_STEPS, t.source, n_pass, t.n_steps, NOT_CHECKED,
                             f"the trace has no iterations; steps taken from {t.n_steps_basis}"))
        elif n_pass is None:
            rows.append(check_row(run.name, fw, bs, Check.TRACED_STEPS, t.source, None, t.n_steps, NOT_CHECKED,
                             f"results.json has no step count for the {t.pass_name} pass"))
        else:
            extra = (f"; {t.outside_events} timed event(s), {t.outside_ns / 1e6:.3f} ms, in other "
                     "iterations left out") if t.outside_events else ""
            rows.append(check_row(run.name, fw, bs, Check.TRACED_STEPS, t.source, int(n_pass), t.n_steps,
                             PASS if t.n_steps == n_pass else FAIL,
                             f"iterations {list(t.iterations)}{extra}"))
        # timed work within the step's wall time
        st, basis = _pass_step_times(run, fw, bs, t.pass_name)
        per = case.devices if case is not None else 1  # issue 39: the devices' ops side by side, each within the step
        busy_ms = float(t.events["dur_ns"].sum()) / t.n_steps / per / 1e6
        what = f"{t.level} time per step ({t.source})" + (f", per device of {per}" if per > 1 else "")
        if t.level == "op" and not getattr(source, "CPU_OP_TIME_IS_BUSY", True):
            found = thunk_completion.from_attribution(run.attribution, fw, bs)  # its trace's thunks, as normalised
            rows.append(check_row(run.name, fw, bs, Check.TIME_WITHIN_STEP, what, None, busy_ms, NOT_CHECKED,
                             f"{t.source} op spans on the CPU include waiting (asynchronous thunks)"
                             + (f"; {thunk_completion.describe(found)}" if found else "")))
        elif st is None:
            rows.append(check_row(run.name, fw, bs, Check.TIME_WITHIN_STEP, what, None, busy_ms, NOT_CHECKED, basis))
        elif len(st) != t.n_steps:
            rows.append(check_row(run.name, fw, bs, Check.TIME_WITHIN_STEP, what, None, busy_ms, NOT_CHECKED,
                             f"{basis} has {len(st)} steps, the trace {t.n_steps}: not the same steps"))
        else:
            step_ms = sum(st) / len(st) * 1e3
            rows.append(check_row(run.name, fw, bs, Check.TIME_WITHIN_STEP, what, step_ms, busy_ms,
                             PASS if busy_ms <= step_ms else FAIL,
                             f"at most the mean wall time of the {t.pass_name} pass's {len(st)} steps "
                             f"({basis})"))
    return rows


def _layer_series(layers: pd.DataFrame) -> pd.DataFrame:
    """The layer table's figures one per kind of time: run, framework, batch_size, layer,
    direction, level, kind, pass, ms (per step), steps_ms (its per-step values or None)."""
    rows = []
    for _, r in layers.iterrows():
        if r["level"] == "kernel":
            rows.append((r, TimeKind.KERNEL, r["pass"], r["ms_per_step"], r["steps_ms"]))
            continue
        rows.append((r, TimeKind.OP, r["op_pass"], r["op_ms_per_step"], r["op_steps_ms"]))
        if pd.notna(r["ms_per_step"]) and r["time_kind"] == TimeKind.LIBRARY:
            rows.append((r, TimeKind.LIBRARY, r["pass"], r["ms_per_step"], r["steps_ms"]))
    return pd.DataFrame([{"run": r["run"], "framework": r["framework"], "batch_size": r["batch_size"],
                          "layer": r["layer"], "direction": r["direction"], "level": r["level"],
                          "kind": str(k), "pass": p, "ms": float(ms),
                          "steps_ms": s if isinstance(s, list) else None, "ran": _ran(r)}
                         for r, k, p, ms, s in rows if ms is not None and pd.notna(ms)],
                        columns=["run", "framework", "batch_size", "layer", "direction", "level", "kind", "pass",
                                 "ms", "steps_ms", "ran"])


def _names(v: Any) -> tuple[str, ...]:
    return tuple(str(x) for x in v) if isinstance(v, list | tuple | np.ndarray) else ()


def _ran(r: pd.Series) -> tuple[tuple[str, ...], ...]:
    """What a layer-table row ran, as its library log or trace names it: (libraries, library calls, algorithms,
    kernels or implementations)."""
    return tuple(_names(r.get(c)) for c in ("libraries", "library_calls", "algos", "kernels"))


def _ran_text(ran: tuple[tuple[str, ...], ...]) -> str:
    parts = [", ".join(v[:3]) + (f" +{len(v) - 3} more" if len(v) > 3 else "") for v in ran[1:] if v]
    return "; ".join(parts) or "no call named"


def _unlike(kind: str, a: int, b: int, ra: pd.Series, rb: pd.Series) -> str:
    """Why a layer's figures at batch sizes ``a`` and ``b`` are not like with like ('' where they are): another
    library call, algorithm or kernel at one of them (a library chooses per shape, and the other choice may be the
    faster one), or library-call time of a library whose log names the call but no kernel or algorithm (oneMKL's
    verbose log: the call and its shape; it picks its code path and threads per problem size), so that a fall
    may be another code path, not the same work done faster."""
    if ra["ran"] != rb["ran"]:
        return (f"not like with like: bs {a} ran {_ran_text(ra['ran'])}, bs {b} ran {_ran_text(rb['ran'])} "
                "(another call, algorithm or kernel: the library chose per shape)")
    libs, calls, algos, kernels = ra["ran"]
    if kind == TimeKind.LIBRARY and calls and not algos and not kernels:
        return (f"like with like not known: the {', '.join(libs) or 'library'} log names the call "
                f"({', '.join(calls)}) but no kernel or algorithm (oneMKL picks its code path and threads per problem "
                "size), so a fall may be another code path")
    return ""


def _layers_within_step(run: Run, series: pd.DataFrame) -> list[dict[str, Any]]:
    rows = []
    for (fw, bs, kind, pass_), g in series.groupby(["framework", "batch_size", "kind", "pass"], sort=False):
        bs = int(bs)
        total = float(g["ms"].sum())
        what = f"{kind}, {g['layer'].nunique()} layers ({pass_} pass)"
        st, basis = _pass_step_times(run, fw, bs, pass_)
        if st is None:
            rows.append(check_row(run.name, fw, bs, Check.LAYERS_WITHIN_STEP, what, None, total, NOT_CHECKED, basis))
            continue
        step_ms = sum(st) / len(st) * 1e3
        # a case on N devices sums its layers over them (each rank's trace, or one process's N devices): each can
        # be busy the whole step, so the bound is N steps (4x H100, JAX x4 bs 1024: 2.027 ms of kernels in 1.666)
        devices = next((int(field_at(r, "devices") or 1) for r in run.results
                        if case_of(r) == fw and field_at(r, "batch_size") == bs), 1)
        per = "per step of the libs pass's log (see its time source)" if kind == TimeKind.LIBRARY else \
            "per traced step"
        on = f" and its {devices} devices" if devices > 1 else ""
        rows.append(check_row(run.name, fw, bs, Check.LAYERS_WITHIN_STEP, what, step_ms * devices, total,
                         PASS if total <= step_ms * devices else FAIL,
                         f"the layer table's {kind} {per}, summed over layers and directions{on}, at most "
                         f"{f'{devices} x ' if devices > 1 else ''}the mean wall "
                         f"time of the {pass_} pass's {len(st)} timed steps ({basis})"))
    return rows


def _apart_from_clean(run: Run, fw: str, kind: str, passes: Iterable[tuple[Any, str]]) -> str:
    """Why host-clock figures of these (batch size, pass) are not one time basis: each pass that ran slower or
    faster than its own clean pass beyond noise (``basis.Agreement``), in words; '' where none did (or the kind
    is GPU kernel time, which a host-side slowdown does not stretch)."""
    if not TimeKind(kind).host_clock:
        return ""
    states = pass_states([run])
    out = []
    for bs, p in passes:
        s = states.get((run.name, fw, bs, p))
        if s is not None and s.agreement in (Agreement.SLOWER, Agreement.FASTER):
            out.append(f"bs {bs}: {s.label} {s.agreement_text()}")
    return "; ".join(out)


def _layer_vs_batch(run: Run, series: pd.DataFrame) -> list[dict[str, Any]]:
    rows = []
    for fw, gf in series.groupby("framework", sort=False):
        sizes = sorted(int(b) for b in gf["batch_size"].dropna().unique())
        if len(sizes) < 2:
            rows.append(check_row(run.name, fw, sizes[0] if sizes else None, Check.LAYER_VS_BATCH, "all layers", None, None,
                             NOT_CHECKED, f"one batch size ({', '.join(map(str, sizes))}): nothing to compare"))
            continue
        for (layer, d, kind), g in gf.groupby(["layer", "direction", "kind"], sort=False):
            by_bs = {int(r["batch_size"]): r for _, r in g.iterrows()}
            for i, a in enumerate(sizes):
                for b in sizes[i + 1:]:
                    subject = f"{layer} {d}, {kind}: bs {a} -> {b}"
                    if a not in by_bs or b not in by_bs:
                        continue
                    ra, rb = by_bs[a], by_bs[b]
                    unlike = _unlike(kind, a, b, ra, rb)
                    if unlike:  # compare only the same call, algorithm and kernel at both batch sizes
                        rows.append(check_row(run.name, fw, b, Check.LAYER_VS_BATCH, subject, ra["ms"], rb["ms"],
                                              NOT_CHECKED, unlike))
                        continue
                    ca = mean_ci(ra["steps_ms"]) if ra["steps_ms"] else None
                    cb = mean_ci(rb["steps_ms"]) if rb["steps_ms"] else None
                    if ca is None or cb is None:
                        rows.append(check_row(run.name, fw, b, Check.LAYER_VS_BATCH, subject, ra["ms"], rb["ms"],
                                         NOT_CHECKED, "no per-step times (under two steps, or a library log whose "
                                                      "calls do not divide into its logged steps): no noise figure"))
                        continue
                    busy = [pass_contention(run, fw, a, ra["pass"]), pass_contention(run, fw, b, rb["pass"])]
                    # one time basis per comparison: a pass slowed (or sped) apart from its clean pass, or two
                    # processes' host-clock figures of which one or both ran contended, each at its own time
                    apart = (_apart_from_clean(run, fw, kind, ((a, ra["pass"]), (b, rb["pass"])))
                             or _contended_apart(kind, a, b, busy))
                    if apart:
                        cpu = _cpu_vs_batch(run, fw, layer, d, a, b) if kind == TimeKind.OP else None
                        rows.append(check_row(run.name, fw, b, Check.LAYER_VS_BATCH, subject, ra["ms"], rb["ms"],
                                              NOT_CHECKED, f"not held against each other: {apart}"
                                              + (f"; judged on its ops' CPU time instead: {cpu['subject']}"
                                                 if cpu else "")))
                        rows += [cpu] if cpu else []
                        continue
                    contended = any(x.contended for x in busy)
                    fell = exceeds(ra["ms"], rb["ms"], ca, cb, contended, LAYER_FALL_FLOOR_MS)
                    rows.append(check_row(
                        run.name, fw, b, Check.LAYER_VS_BATCH, subject, ra["ms"], rb["ms"], FAIL if fell else PASS,
                        f"ms per step, like with like ({_ran_text(ra['ran'])} at both); at bs {b} "
                        f"{'falls below' if fell else 'not below'} bs {a} beyond noise: 95% "
                        f"intervals of the mean per step [{cb[0]:.4g}–{cb[1]:.4g}] ms ({len(rb['steps_ms'])} steps) "
                        f"vs [{ca[0]:.4g}–{ca[1]:.4g}] ms ({len(ra['steps_ms'])} steps) ({ra['pass']} pass)"
                        + (f"; {CONTENDED_RULE}" if contended else "")
                        + (f"; bs {a}'s pass: {busy[0].marked}, bs {b}'s pass: {busy[1].marked}"
                           if fell or contended else "")))
    return rows


def _contended_apart(kind: str, a: int, b: int, busy: list[Busy]) -> str:
    """Why two batch sizes' host-clock figures are not held against each other where contention was measured for
    both and one or both ran contended ('' otherwise): each its own process at its own time
    (``relations.contended_apart``), or one busy and one quiet (``relations.SAME_CONDITION_RULE``)."""
    if not TimeKind(kind).host_clock or None in (busy[0].contended, busy[1].contended) or not any(
            x.contended for x in busy):
        return ""
    why = contended_apart(*busy) or f"one busy, one quiet ({SAME_CONDITION_RULE})"
    return f"{why}; bs {a}'s pass: {busy[0].marked}, bs {b}'s pass: {busy[1].marked}"


# The CPU-time answer sets its figures side by side on a busy machine too, by their 95% intervals (basis.PER_OP_CPU):
# the check holds them the same way (a pool's hand-offs move a small op's CPU time under load: timing.CPU_MOVED).
CPU_BY_INTERVALS = "judged by the intervals on a busy machine too, as the CPU-time answer sets them side by side"


def _cpu_vs_batch(run: Run, fw: str, layer: str, d: str, a: int, b: int) -> dict[str, Any] | None:
    """``layer time vs batch size`` on the ops' own CPU time (``opcpu.layer_cpu`` of the framework pass: the figure
    the CPU-time answer shows, ``basis.PER_OP_CPU``) where a host-clock pair is not held: its median per traced
    step at ``b`` below ``a``'s beyond noise fails. None where neither case's ops were sampled."""
    cases = op_cpu(run)
    oa, ob = cases.get((fw, a)), cases.get((fw, b))
    if oa is None or ob is None or not (oa.measured or ob.measured):
        return None
    subject = f"{layer} {d}, {TimeKind.CPU} of its ops: bs {a} -> {b}"
    la, lb = (layer_cpu(o, layer, {d}) if o.measured else None for o in (oa, ob))
    if la is None or lb is None or la.ms is None or lb.ms is None:
        why = "; ".join(f"bs {n}: {o.why if x is None else x.why}" for n, o, x in ((a, oa, la), (b, ob, lb))
                        if x is None or x.ms is None)
        return check_row(run.name, fw, b, Check.LAYER_VS_BATCH, subject, None if la is None else la.ms,
                         None if lb is None else lb.ms, NOT_CHECKED, f"no CPU time of its ops: {why}")
    busy = [pass_contention(run, fw, a, FRAMEWORK_PASS), pass_contention(run, fw, b, FRAMEWORK_PASS)]
    fell = exceeds(la.ms, lb.ms, la.ci_ms, lb.ci_ms, False, LAYER_FALL_FLOOR_MS)
    return check_row(run.name, fw, b, Check.LAYER_VS_BATCH, subject, la.ms, lb.ms, FAIL if fell else PASS,
                     f"the ops' own CPU time per step of the {FRAMEWORK_PASS} pass (median of the traced steps, as the "
                     f"CPU-time answer shows it); at bs {b} {'falls below' if fell else 'not below'} bs {a} beyond "
                     f"noise: 95% intervals of the median {span_ms(_s(lb.ci_ms))} ({len(lb.steps_ms)} steps) vs "
                     f"{span_ms(_s(la.ci_ms))} ({len(la.steps_ms)} steps), {CPU_BY_INTERVALS}; bs {a}'s pass: "
                     f"{busy[0].marked}, bs {b}'s pass: {busy[1].marked}")


def _s(ci_ms: tuple[float, float] | None) -> tuple[float, float] | None:
    """An interval in ms as ``span_ms`` takes it (seconds)."""
    return None if ci_ms is None else (ci_ms[0] / 1e3, ci_ms[1] / 1e3)


# --- checks of results.json ------------------------------------------------------------------
def _capture_not_faster(run: Run) -> list[dict[str, Any]]:
    rows = []
    for r in run.results:
        fw, bs = case_of(r), field_at(r, "batch_size")
        for name in passes_of(r):
            s = pass_state(run.name, r, name)
            if s is None:
                continue
            subject = f"{name} pass"
            if s.agreement in (Agreement.TOO_FEW_STEPS, Agreement.NO_INTERVAL, Agreement.NOT_MEASURED):
                rows.append(check_row(run.name, fw, bs, Check.CAPTURE_NOT_FASTER, subject, None,
                                 None if s.median_s is None else s.median_s * 1e3, NOT_CHECKED,
                                 f"{s.label} {s.agreement_text()}"))
                continue
            by_ci = s.basis == BY_INTERVALS
            bound = s.clean_ci[0] * 1e3 if s.clean_ci else None
            got = (s.ci[1] if by_ci and s.ci else s.median_s) * 1e3
            figures = (f"{name} pass {ms_text(s.median_s)} {span_ms(s.ci)} (x{s.ratio:.3g}), clean pass "
                       f"{ms_text(s.clean_median_s)} {span_ms(s.clean_ci)}; by the {s.basis}")
            if s.agreement is Agreement.FASTER and s.clean_busy.contended:  # the clean pass slowed by the machine
                rows.append(check_row(run.name, fw, bs, Check.CAPTURE_NOT_FASTER, subject, bound, got, NOT_CHECKED,
                                      f"not held against each other: the clean pass ran under contention, so a "
                                      f"capture pass faster than it is what that contention gives, not a profiler "
                                      f"that speeds a step: {figures}; clean pass: {s.clean_busy.marked}; {name} "
                                      f"pass: {s.busy.marked}"))
            elif s.agreement is Agreement.FASTER:
                rows.append(check_row(run.name, fw, bs, Check.CAPTURE_NOT_FASTER, subject, bound, got, FAIL,
                                 f"{BUSIER_CLEAN}: {figures}; clean pass: {s.clean_busy.marked}; {name} pass: "
                                 f"{s.busy.marked}"))
            else:
                rows.append(check_row(run.name, fw, bs, Check.CAPTURE_NOT_FASTER, subject, bound, got, PASS,
                                 f"not faster beyond noise: {figures}"))
    return rows


def _bench_busy(h: pd.Series) -> str:
    c = h.get("contended")
    text = h.get("contention_text")
    if c is None or (not isinstance(c, bool | np.bool_) and pd.isna(c)):
        return "not measured"
    return f"BUSY: {text or 'contended'}" if bool(c) else str(text or "quiet")


def _clean_vs_bench(run: Run, history: pd.DataFrame | None) -> list[dict[str, Any]]:
    job = field_at(run.manifest, "job")
    no = None
    if history is None:
        no = "no step benchmark history given (kernelmap report --storage DIR)"
    elif job is None:
        no = "manifest.json records no job id (a run made before jobs were recorded)"
    elif "job" not in history.columns or not (history["job"] == str(job)).any():
        no = f"the benchmark history holds no step benchmark of job {job!r}"
    if no:
        return [check_row(run.name, None, None, Check.CLEAN_VS_BENCH, "all keys", None, None, NOT_CHECKED, no)]
    h = history[history["job"] == str(job)]
    rows = []
    for r in run.results:
        # history keys the framework and its mode apart, as results.json's typed key does
        fw, bs, mode, dev = (field_at(r, k) for k in ("framework", "batch_size", "mode", "device"))
        subject = f"{fw} {mode} {dev} bs {bs}"
        if mode is None or dev is None:
            rows.append(check_row(run.name, fw, bs, Check.CLEAN_VS_BENCH, subject, None, None, NOT_CHECKED,
                             "results.json records no mode or device for this entry: no key to match"))
            continue
        m = h[(h["framework"] == fw) & (h["mode"] == mode) & (h["device"] == dev) & (h["batch_size"] == bs)]
        c = clean_stats(r)
        # the step benchmark is one more process: the clean interval widened between processes (timing.PROCESS_RULE)
        ci = timing.judging_interval(c, between_processes=Busy.of(r).contended is False)
        med, (lo, hi) = c.get("median_step_s"), ci or (None, None)
        if m.empty:
            rows.append(check_row(run.name, fw, bs, Check.CLEAN_VS_BENCH, subject, None,
                             None if med is None else med * 1e3, NOT_CHECKED,
                             f"job {job!r} saved no step benchmark of this key"))
            continue
        for _, b in m.iterrows():
            bmed, iqr, n = b.get("median"), b.get("iqr"), b.get("rounds")
            if med is None or lo is None or hi is None:
                rows.append(check_row(run.name, fw, bs, Check.CLEAN_VS_BENCH, subject, None, None, NOT_CHECKED,
                                 "the clean pass has no 95% interval"))
                continue
            if any(v is None or pd.isna(v) for v in (bmed, iqr, n)) or not n:
                rows.append(check_row(run.name, fw, bs, Check.CLEAN_VS_BENCH, subject, med * 1e3, None, NOT_CHECKED,
                                 "the saved benchmark lacks its median, IQR or rounds"))
                continue
            half = NOTCH * float(iqr) / math.sqrt(float(n))
            bci = (float(bmed) - half, float(bmed) + half)
            b_busy = b.get("contended")
            bench_busy = Busy(bool(b_busy) if isinstance(b_busy, bool | np.bool_) else None, _bench_busy(b))
            contended = bool(Busy.of(r).contended) or bool(bench_busy.contended)
            agree = not (exceeds(med, float(bmed), (lo, hi), bci, contended)
                         or exceeds(float(bmed), med, bci, (lo, hi), contended))
            apart = _bench_apart(Busy.of(r), bench_busy, med, float(bmed))
            n_tr = len(c.get("trial_medians_s") or ())
            quiet = Busy.of(r).contended
            widened = ("not widened between processes: " + ("it ran contended" if quiet else "its contention was not "
                       "measured" if quiet is None else f"{n_tr} trial, no spread between processes")
                       if quiet is not False or n_tr < 2 else f"widened between processes by its {n_tr} trials")
            figures = (f"clean pass {ms_text(med)} {span_ms((lo, hi))} ({widened}) vs step benchmark {ms_text(float(bmed))} "
                       f"{span_ms(bci)} (median ± {NOTCH}·IQR/√rounds, {int(n)} rounds; saved run {b.get('run')})")
            busy = (f"{CONTENDED_RULE}; " if contended else "") + (
                f"clean pass: {Busy.of(r).marked}; step benchmark: {_bench_busy(b)}")
            if apart and (not agree or contended_apart(Busy.of(r), bench_busy)):
                rows.append(check_row(run.name, fw, bs, Check.CLEAN_VS_BENCH, subject, med * 1e3, float(bmed) * 1e3,
                                      NOT_CHECKED, f"not held against each other: {apart}: {figures}; {busy}"))
                continue
            rows.append(check_row(run.name, fw, bs, Check.CLEAN_VS_BENCH, subject, med * 1e3, float(bmed) * 1e3,
                             PASS if agree else FAIL,
                             f"{'agree' if agree else 'disagree beyond their combined noise'}: {figures}; {busy}"))
    return rows


def _bench_apart(clean: Busy, bench: Busy, clean_s: float, bench_s: float) -> str:
    """Why a clean pass and a step benchmark are not held against each other ('' where they are): both ran
    contended, each its own process at its own time (``relations.contended_apart``: agreeing or not), or, where
    they disagree, the one that
    ran contended is the slower (what its contention gives a whole step). A contended one faster than a quiet one is
    still held: contention slows a whole step (``timing.CPU_MOVED``: wall 1.29-1.96x), it does not speed it."""
    both = contended_apart(clean, bench)
    if both:
        return both
    slower = ("clean pass", clean) if clean_s > bench_s else ("step benchmark", bench)
    if slower[1].contended and (bench if slower[1] is clean else clean).contended is False:
        return f"the {slower[0]} ran under contention and the other quiet, and it is the slower"
    return ""


def self_checks(runs: list, history: pd.DataFrame | None = None, layers: pd.DataFrame | None = None,
                answer: pd.DataFrame | None = None, comm=None) -> pd.DataFrame:
    """All checks of all runs, one row each (see the module docstring). ``history``:
    ``kernelmap.history.trend.load_history`` of the step benchmarks' storage, for ``clean vs step
    benchmark`` (without it that check is not checked). ``layers``: ``layer_table(runs)`` where the
    caller has it (computed here otherwise); ``answer``: ``answer.answer_table`` of the same layers (computed
    here otherwise); ``comm``: ``analyses.commfigures.of(runs)`` where the caller has it (per run here otherwise)."""
    from . import analysis as A
    from . import answer as ANS

    rows: list[dict[str, Any]] = []
    expected = expected_calls_per_step()
    for run in runs:
        rows += cases_ran(run)
        lt = A.layer_table([run]) if layers is None else layers[layers["run"] == run.name]
        ans = ANS.answer_table(lt, pass_states([run]))[0] if answer is None else answer
        rows += quiet_figures(run, ans)
        rows += run_complete(run, lt)
        rows += e2e_vs_step(run)
        rows += cpu_vs_wall(run)
        rows += op_cpu_checks(run)
        rows += _capture_not_faster(run)
        rows += _clean_vs_bench(run, history)
        if not A.timed_events(run):
            rows.append(check_row(run.name, None, None, "all record checks", "run", None, None, NOT_CHECKED,
                             "no records.parquet or no timed events: "
                             + ", ".join(c.value for c in (Check.CALLS, Check.TRACED_STEPS, Check.TIME_WITHIN_STEP,
                                                           Check.LAYERS_WITHIN_STEP, Check.LAYER_VS_BATCH))
                             + " not checked"))
            if any((field_at(r, "devices") or 1) > 1 for r in run.results):
                rows += comm_checks(run, comm)  # issue 39: scaling and each rank's captures need no records
            continue
        rows += math_checks(run)  # issue 38: first among the record checks, so the page's banner names it
        rows += counter_checks(run)  # issue 38: only for a run with a counters pass
        rows += comm_checks(run, comm)  # issue 39: only for a run with multi-device cases
        rows += _record_checks(run, expected)
        libcalls = A.library_calls([run])
        rows += library_call_checks(run, libcalls)
        rows += call_statement_checks(run, lt, libcalls)
        series = _layer_series(lt)
        rows += _layers_within_step(run, series)
        rows += _layer_vs_batch(run, series)
        busy = A.busy_share([run])
        rows += call_within_op(run, lt)
        rows += busy_share_basis(run, busy)
        rows += launch_bound_checks(A.launch_bound([run]), busy, A.summary_table([run]))
    out = pd.DataFrame(rows, columns=COLUMNS)
    out["batch_size"] = out["batch_size"].astype("Int64")  # rows of a whole run have none
    return out


def cases_ran(run: Run) -> list[dict[str, Any]]:
    """``every case ran`` (module docstring): one failed row per case asked for without results, else one
    passed row for the run; not checked where the manifest does not say what was asked (older runs)."""
    keys = asked_cases(run.manifest, run.path / MANIFEST)  # typed (kernelmap.rundir), an older run's translated
    if keys is None:
        return [check_row(run.name, None, None, Check.CASES_RAN, "run", None, None, NOT_CHECKED,
                     "the manifest does not list the modes and batch sizes asked for")]
    asked = [(k.name, k.batch_size) for k in keys]
    have = {(case_of(r), field_at(r, "batch_size")) for r in run.results}
    notes = [str(n) for n in run.manifest.get("notes") or []]
    rows = []
    for key, bs in asked:
        if (key, bs) in have:
            continue
        why = [n for n in notes if n.startswith(f"{key} bs {bs} ")]
        rows.append(check_row(run.name, key, bs, Check.CASES_RAN, "results", "results", "none", FAIL,
                         "; ".join(why) or "no results and no note of why"))
    if not rows:
        rows.append(check_row(run.name, None, None, Check.CASES_RAN, "run", len(asked), len(asked), PASS,
                         f"{len(asked)} case(s) asked (framework x mode x batch size), each has results"))
    return rows


SAME_FIGURE = 1e-9  # ms: two tables state one figure


def launch_bound_checks(lb: pd.DataFrame, busy: pd.DataFrame, summ: pd.DataFrame) -> list[dict[str, Any]]:
    """``launch-bound figures`` (module docstring) from ``launch_bound``, ``busy_share`` and
    ``summary_table`` of the same runs."""
    rows = []
    for _, r in lb.iterrows():
        run, fw, bs = r["run"], r["framework"], r["batch_size"]
        busy_ms, ksum, clean = r["gpu_busy_ms"], r["kernel_sum_ms"], r["clean_step_ms"]
        if pd.isna(busy_ms):
            rows.append(check_row(run, fw, bs, Check.LAUNCH_BOUND, "GPU busy <= kernel sum", None, None, NOT_CHECKED,
                             "no counted step holds kernels: no GPU-busy figure"))
            continue
        ok = busy_ms <= ksum + SAME_FIGURE
        rows.append(check_row(run, fw, bs, Check.LAUNCH_BOUND, "GPU busy <= kernel sum (ms/step)", ksum, busy_ms,
                         PASS if ok else FAIL, "the union of the kernel intervals of a step" + (
                             "" if ok else " exceeds their summed durations: intervals are miscounted")))
        s = summ[(summ["run"] == run) & (summ["framework"] == fw) & (summ["batch_size"] == bs)]
        hi = s["step_ms_ci95_high"].iloc[0] if len(s) else None
        bound = clean if hi is None or pd.isna(hi) else hi
        if bound is None or pd.isna(bound):
            rows.append(check_row(run, fw, bs, Check.LAUNCH_BOUND, "GPU busy <= clean step", None, busy_ms, NOT_CHECKED,
                             "no clean-pass step for this framework x mode x batch size"))
        else:
            # a case with collectives: its compute kernels alone, since a collective kernel's time holds its wait for
            # the other ranks, which the capture pass's own host timing sets (PyTorch x2 under the profiler: 5.1 ms
            # of kernels a step on its busiest GPU, NCCL's waits included, against a 2.72 ms clean step; 2x H200)
            compute = r.get("compute_busy_ms")
            comm = compute is not None and pd.notna(compute) and compute < busy_ms
            held = compute if comm else busy_ms
            ok = held <= bound
            why = "" if ok else "; the kernels of the capture pass outlast the clean step: the idle share would be negative"
            said = (f"; compute kernels {held:.4f} ms (communication kernels apart: GPU busy {busy_ms:.4f} ms holds "
                    "their wait for the other ranks, set by the capture pass's own timing)" if comm else "")
            rows.append(check_row(run, fw, bs, Check.LAUNCH_BOUND, "GPU busy <= clean step (ms, 95% upper bound)", bound,
                             held, PASS if ok else FAIL, f"clean step {clean:.4f} ms (median){said}{why}"))
        b = busy[(busy["run"] == run) & (busy["framework"] == fw) & (busy["batch_size"] == bs)
                 & (busy["level"] == "kernel")]
        if b.empty:
            rows.append(check_row(run, fw, bs, Check.LAUNCH_BOUND, "busy-share table, same figures", None, None, FAIL,
                             "the busy-share table has no kernel row for it"))
            continue
        step, kb = b["step_ms"].iloc[0], b["busy_ms_per_step"].iloc[0]
        same = (pd.notna(step) and clean is not None and pd.notna(clean) and abs(step - clean) <= SAME_FIGURE
                and abs(kb - ksum) <= SAME_FIGURE)
        rows.append(check_row(run, fw, bs, Check.LAUNCH_BOUND, "busy-share table, same figures (step ms, kernel ms)",
                         f"{clean} / {ksum}", f"{step} / {kb}", PASS if same else FAIL,
                         "the busy share is kernel time over the clean step" + (
                             "" if same else f"; the busy-share table divides by another step ({b['step_basis'].iloc[0]})")))
    have = set(lb["run"]) if len(lb) else set()
    for run in (summ["run"].unique() if len(summ) else ()):
        if run not in have:  # a CPU run: no kernels, so no launch-bound figure (said, not left out)
            rows.append(check_row(run, None, None, Check.LAUNCH_BOUND, "all frameworks", None, None, NOT_CHECKED,
                             "no GPU kernels in this run: no GPU-busy or idle-share figure"))
    return rows


def failed(checks: pd.DataFrame) -> pd.DataFrame:
    return checks[checks["status"] == FAIL]


def causes(checks: pd.DataFrame, most: int = 3) -> list[str]:
    """The failed checks in words for the page's banner, at most ``most`` lines: one per check (its first row, and
    how many rows failed), the last naming the rest with their counts where more checks failed: a case that did not
    run the math it asked for first (issue 38: the first screen says it), then the others in the table's order
    (a busy run's 18 rows of one check no longer hide the other checks that failed)."""
    out = []
    f = failed(checks)
    first = (f["check"] == Check.MATH_AS_ASKED).to_numpy()
    f = pd.concat([f[first], f[~first]])
    kinds = list(dict.fromkeys(f["check"]))
    shown = kinds if len(kinds) <= most else kinds[:most - 1]
    for kind in shown:
        g = f[f["check"] == kind]
        r = g.iloc[0]
        who = " ".join(x for x in (fw_label(r["framework"]) if isinstance(r["framework"], str) else "",
                                   f"bs {r['batch_size']}" if pd.notna(r["batch_size"]) else "") if x)
        n = f" ({len(g)} rows; the first)" if len(g) > 1 else ""
        out.append(f"{r['check']}{n}: {who + ': ' if who else ''}{r['subject']} ({r['detail']})")
    if len(kinds) > len(shown):
        out.append("also failed: " + ", ".join(f"{k} ({int((f['check'] == k).sum())})" for k in kinds[len(shown):]))
    return out

