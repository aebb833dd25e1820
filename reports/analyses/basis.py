"""One time basis per comparison: which pass a time figure comes from, on which clock, whether
its pass ran like the clean pass and on a quiet machine, and so whether it may be compared.

Kinds of time (``TimeKind``), each from one capture pass:

* **GPU kernel time**: kernel durations on the device's clock (Kineto or nsys; framework or nsys pass).
* **framework-op time**: outermost framework ops on the host clock (framework profiler pass).
* **library-call time**: CPU library calls (oneDNN verbose, oneMKL verbose) on the host clock (libs pass).

**The rule** (``comparable``). A figure may enter a ratio (the answer table's "time / PyTorch")
or a "time differs" statement (the op table) only where

* host clock (framework-op time, library-call time): its pass agrees with its own clean pass
  within noise, i.e. the pass's 95% interval of its median (results.json ``passes[p]``
  ``ci95_low_s``/``ci95_high_s``) overlaps the clean pass's, widened to what one more process may
  give where the clean pass ran quiet (``timing.judging_interval``: each pass is its own process); runs that record no interval of the
  pass are judged by the overhead verdict (the pass's median against the clean pass's interval,
  ``timing.overhead_verdict``; "within noise" only; under ``timing.MIN_CAPTURE_STEPS`` timed steps
  it cannot be judged), AND neither the pass nor its clean pass is flagged contended
  (``contention.contended``): a profiler's host-side overhead or other processes stretch host
  clocks, so a slowed pass says nothing about the framework;
* device clock (GPU kernel time): host-side profiler overhead does not stretch a kernel, so the
  pass need only not be flagged contended (other processes on the GPU, throttled clocks);
* both figures of a ratio are of the same kind. Contention that was not measured (runs made
  before kernelmap recorded it) is not taken for quiet: such a figure is not compared either.

Since every compared figure must be quiet, no ratio is ever drawn across a contended and a
quiet pass. A figure that may not be compared says why (``PassState.reasons``).

Two capture passes' figures held against each other (a libs-pass call inside its framework-pass op:
``relations.call_within_op``) need the two passes to have run alike (``PAIR_RULE``, ``pair_basis``):
a pass that ran slower or faster than the other beyond their own 95% intervals (oneDNN's verbose log slowing the
calls it times, a process at another speed) is withheld from relations against the other, the row and the layer
table's cell saying by how much.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kernelmap import cpusampler, timing
from kernelmap.rundir import pass_result_name, read_json

from .base import NOT_MEASURED, Busy, Run, case_of, field_at, fw_label, passes_of
from .summary import clean_stats

CLEAN = "clean"
LIBS_PASS = "libs"


class TimeKind(enum.StrEnum):
    """What a time figure sums, and so which clock measured it."""

    KERNEL = "GPU kernel time"
    OP = "framework-op time"
    LIBRARY = "library-call time"
    CPU = "CPU time"  # the worker's own process CPU time (timing.CPU_RULE): CpuState, not PassState

    @property
    def host_clock(self) -> bool:
        return self is not TimeKind.KERNEL


class Agreement(enum.StrEnum):
    """How a capture pass's median stands against its own clean pass's."""

    AGREES = "within noise of its clean pass"
    SLOWER = "slower than its clean pass beyond noise"
    FASTER = "faster than its clean pass beyond noise"
    TOO_FEW_STEPS = "too few steps to judge"
    NO_INTERVAL = "no interval to judge against"
    NOT_MEASURED = "no step time recorded"


_FROM_VERDICT = {timing.OverheadVerdict.ABOVE: Agreement.SLOWER, timing.OverheadVerdict.BELOW: Agreement.FASTER,
                 timing.OverheadVerdict.WITHIN: Agreement.AGREES,
                 timing.OverheadVerdict.TOO_FEW_STEPS: Agreement.TOO_FEW_STEPS,
                 timing.OverheadVerdict.NO_INTERVAL: Agreement.NO_INTERVAL}
_BY_PLACEMENT = {timing.Placement.WITHIN: Agreement.AGREES, timing.Placement.ABOVE: Agreement.SLOWER,
                 timing.Placement.BELOW: Agreement.FASTER}
BY_INTERVALS = ("95% intervals of the pass's and the clean pass's medians, the clean pass's widened to one more "
                "process's 95% prediction interval from its trials where it ran quiet (timing.PROCESS_RULE)")
BY_VERDICT = ("overhead verdict: the pass's median against the clean pass's 95% interval (the run records "
              "no interval of the pass's own)")
@dataclass(frozen=True)
class PassState:
    """One capture pass of one framework x batch size against its clean pass."""

    run: str
    framework: str
    batch_size: int | None
    pass_name: str
    steps: int | None
    median_s: float | None
    ci: tuple[float, float] | None  # the pass's own 95% interval of its median (recorded)
    clean_median_s: float | None
    clean_ci: tuple[float, float] | None  # widened between processes (timing.judging_interval)
    agreement: Agreement
    basis: str
    busy: Busy
    clean_busy: Busy
    clean_trial_medians: tuple[float, ...] = ()  # the clean pass's used trials' medians (timing.PROCESS_RULE)

    @property
    def ratio(self) -> float | None:
        """The pass's median over the clean pass's."""
        if self.median_s is None or not self.clean_median_s:
            return None
        return self.median_s / self.clean_median_s

    @property
    def label(self) -> str:
        return f"{fw_label(self.framework)}'s {self.pass_name} pass"

    def agreement_text(self) -> str:
        """How the pass ran against its clean pass, where it does not agree ('' where it does)."""
        r = self.ratio
        ran = f"ran {r:.3g}x its clean pass" if r is not None else "ran against its clean pass"
        return {Agreement.AGREES: "",
                Agreement.SLOWER: ran,
                Agreement.FASTER: f"{ran}, faster beyond noise (the clean pass was slowed)",
                Agreement.TOO_FEW_STEPS: f"{ran} over {self.steps} steps, too few to judge "
                                         f"(< {timing.MIN_CAPTURE_STEPS})",
                Agreement.NO_INTERVAL: f"{ran}; the clean pass has no interval to judge it by",
                Agreement.NOT_MEASURED: "records no step time"}[self.agreement]

    def contention_texts(self, host_clock: bool) -> list[str]:
        """Why contention keeps the pass's figures from a comparison (none where quiet); with
        ``host_clock`` its clean pass's too."""
        out = []
        if self.busy.contended:
            out.append(f"ran on a busy machine ({self.busy.text})")
        if host_clock and self.clean_busy.contended:
            out.append(f"has a clean pass that ran on a busy machine ({self.clean_busy.text})")
        own, clean = self.busy.contended is None, host_clock and self.clean_busy.contended is None
        if own:
            out.append(f"was not measured for contention{' (nor its clean pass)' if clean else ''}")
        elif clean:
            out.append("has a clean pass not measured for contention")
        return out

    def reasons(self, kind: TimeKind) -> list[str]:
        """Why a figure of ``kind`` from this pass may not be compared; empty where it may (see the
        module docstring)."""
        out = []
        if kind.host_clock and self.agreement is not Agreement.AGREES:
            out.append(self.agreement_text())
        return out + self.contention_texts(kind.host_clock)

    def why_not(self, kind: TimeKind) -> str:
        """One clause: "PyTorch's framework pass ran 5.14x its clean pass, ..."; '' where it may be compared."""
        why = self.reasons(kind)
        return f"{self.label} {', '.join(why)}" if why else ""


def _ci(d: Any) -> tuple[float, float] | None:
    lo, hi = field_at(d, "ci95_low_s"), field_at(d, "ci95_high_s")
    return (float(lo), float(hi)) if isinstance(lo, int | float) and isinstance(hi, int | float) else None


def pass_state(run_name: str, r: dict, pass_name: str) -> PassState | None:
    """The state of capture pass ``pass_name`` of results.json entry ``r`` (None: no such pass, or
    it was skipped)."""
    p = passes_of(r).get(pass_name)
    if p is None or field_at(p, "skipped") is not None or pass_name == CLEAN:
        return None
    clean = clean_stats(r)
    st = field_at(p, "step_times_s")
    med = float(np.median(st)) if isinstance(st, list) and st else field_at(p, "median_step_s")
    steps = field_at(p, "steps")
    # Each capture pass is its own process: judged against what one more process may give (timing.PROCESS_RULE).
    ci, clean_ci = _ci(p), timing.judging_interval(clean, between_processes=Busy.of(r).contended is False)
    if med is None:
        agreement, basis = Agreement.NOT_MEASURED, ""
    elif ci is not None and clean_ci is not None:
        basis = BY_INTERVALS
        agreement = _BY_PLACEMENT[timing.placement(ci, clean_ci)]
    else:
        basis = BY_VERDICT
        recorded = field_at(p, "overhead_verdict")
        verdict = (timing.OverheadVerdict(recorded) if recorded in set(timing.OverheadVerdict) else
                   timing.overhead_verdict(float(med), int(steps or 0), clean,
                                            between_processes=Busy.of(r).contended is False))
        agreement = _FROM_VERDICT[verdict]
    return PassState(run_name, str(case_of(r)), field_at(r, "batch_size"), pass_name,
                     int(steps) if isinstance(steps, int | float) else None,
                     None if med is None else float(med), ci, clean.get("median_step_s"), clean_ci,
                     agreement, basis, Busy.of(p), Busy.of(r),
                     tuple(float(m) for m in clean.get("trial_medians_s") or () if isinstance(m, int | float)))


StateKey = tuple[str, str, Any, str]  # run, framework, batch size, pass


def pass_states(runs: list[Run]) -> dict[StateKey, PassState]:
    """Every capture pass of every run, by (run, framework, batch size, pass); computed once per Run."""
    out: dict[StateKey, PassState] = {}
    for run in runs:
        if run._pass_states is None:
            states = {}
            for r in run.results:
                for name in passes_of(r):
                    s = pass_state(run.name, r, name)
                    if s is not None:
                        states[(run.name, s.framework, s.batch_size, name)] = s
            run._pass_states = states
        out.update(run._pass_states)
    return out


def comparable(states: dict[StateKey, PassState], run: str, framework: str, batch_size: Any, pass_name: str | None,
               kind: TimeKind) -> tuple[bool, str]:
    """(may the figure be compared, why not: '' where it may); see the module docstring."""
    s = states.get((run, framework, batch_size, pass_name or ""))
    if s is None:
        return False, (f"{fw_label(framework)}'s {pass_name or 'capture'} pass has no step figures in results.json: "
                       f"{NOT_MEASURED}")
    why = s.why_not(kind)
    return not why, why


# --- two capture passes: one time basis or not ----------------------------------------------------
PAIR_RULE = ("two capture passes' host-clock figures (a library call of the libs pass inside its op of the framework "
             "pass) are on one time basis where the two processes ran at one speed: the 95% interval of the one pass's "
             "step median overlaps the other's. Not widened by the noise between processes (timing.PROCESS_RULE): "
             "that says another process may run as slow, not that these two ran alike, and the figures held against "
             "each other are these two processes' (one framework's clean trials on a 2-core VM: 10.3 to 22.1 ms a step, two "
             "speeds; a libs pass of the slow one, 1.71x its framework pass, read its call above its op). Where the one "
             "ran slower beyond that, its figures are withheld from 'not above the other's' relations: a profiler "
             "that slows the work it logs (oneDNN's verbose log), a neighbour, or a process that ran at another speed "
             "stretches the calls it times, so the two are not one clock. Where it ran faster (a framework pass "
             "slowed by its own profiler), such a relation is still judged: the speeds can hide a call above its op, "
             "never make one")


@dataclass(frozen=True)
class PairBasis:
    """Whether figures of pass ``a`` may be held against figures of pass ``b`` (``PAIR_RULE``): ``same`` True
    (one basis), False (``a`` ran apart from ``b`` beyond noise: withheld, ``why``), None (no intervals to
    judge by: not judged, ``why``)."""

    same: bool | None
    ratio: float | None  # a's step median over b's
    why: str

    @property
    def withheld(self) -> bool:
        """Whether a's figures are kept from 'not above b's' relations: a ran slower than b beyond noise."""
        return self.same is False and self.ratio is not None and self.ratio > 1


def pair_basis(states: dict[StateKey, PassState], run: str, framework: str, batch_size: Any, a: str,
               b: str) -> PairBasis:
    """``PAIR_RULE`` for the figures of pass ``a`` held against those of pass ``b`` (one framework x batch size)."""
    sa, sb = states.get((run, framework, batch_size, a)), states.get((run, framework, batch_size, b))
    if sa is None or sb is None or sa.median_s is None or sb.median_s is None:
        missing = " and ".join(p for p, s in ((a, sa), (b, sb)) if s is None or s.median_s is None)
        return PairBasis(None, None, f"{fw_label(framework)}'s {missing} pass records no step time")
    ratio = sa.median_s / sb.median_s if sb.median_s else None
    said = (f"{fw_label(framework)}'s {a} pass ran {ratio:.3g}x its {b} pass ({sa.median_s * 1e3:.4g} against "
            f"{sb.median_s * 1e3:.4g} ms/step)")
    if sa.ci is None or sb.ci is None:
        return PairBasis(None, ratio, f"{said}; no interval of {a if sa.ci is None else b} pass's median to judge by")
    own = f"{a} [{sa.ci[0] * 1e3:.4g}–{sa.ci[1] * 1e3:.4g}] ms against {b} [{sb.ci[0] * 1e3:.4g}–{sb.ci[1] * 1e3:.4g}] ms"
    where = timing.placement(sa.ci, sb.ci)
    if where is timing.Placement.WITHIN:
        return PairBasis(True, ratio, f"{said}: one speed ({own})")
    way = "slower" if where is timing.Placement.ABOVE else "faster"
    return PairBasis(False, ratio, f"{said}, {way} beyond noise ({own}): not one time basis")


# --- CPU time (timing.CPU_RULE): a kind of time a busy machine moves less than wall time ----------------
CPU_KEY = "cpu_time"  # results.json: a case's (its used clean trials') and each capture pass's timing.cpu_figure
CPU_BASIS = ("the pass's process CPU time per step against its clean pass's: their 95% intervals of the median, the "
             "clean pass's widened to one more process's 95% prediction interval from its trials (timing.PROCESS_RULE, "
             "on CPU time whether or not the machine was busy)")
PER_LAYER_CPU = ("a layer's CPU time per step = the framework pass's process CPU time per step (median; less the CPU "
                 "sampler's own where it ran, cpusampler.OWN_RULE) x the layer's "
                 "share of the op time its trace holds per step (outermost timed ops): the process's CPU time shared "
                 "out over its ops by their traced time. An estimate of a quiet pass, not each op's own CPU time, "
                 "which no profiler here records; time outside every op (Python, the framework's dispatch) is shared "
                 "out with it. A busy pass's layers are not compared (UNEVEN_STRETCH)")
PER_OP_CPU = ("a layer's CPU time per step = the CPU time of the worker process within each of the layer's traced ops "
              "(framework pass), summed per traced step, median over the steps with its 95% interval: kernelmap.cpusampler "
              "samples every worker thread's CPU clock beside the trace (opcpu.OP_CPU_METHOD). Measured, not shared out by wall "
              "time, so a busy pass's layers are compared too, held to OPS_WITHIN_CLEAN. It falls back to PER_LAYER_CPU "
              "in a run without the samples, in a case whose trace is not put on the samples' clock (its fit failed) "
              "and for a layer whose ops lie outside the samples; no ratio crosses the two (answer.cpu_table). It "
              "moves less than wall time, not nothing, and its interval is over one process's traced steps: the spread between processes is not in it. Measured on the 2-core VM, framework "
              "passes with other processes at 1.0-1.1 cores against 1.7-1.8 (two CPU hogs): the whole step's CPU time "
              "+9-23% (wall +100-450%), conv2's forward and backward 0.8-1.4x, conv1's forward 0.71 -> 1.59 ms in one "
              "framework and 3.33 -> 1.68 ms in another, a 45 µs linear forward 0.042 -> 0.140 ms (a descheduled "
              "thread resumes at a cost its op pays); between two whole jobs, one quiet and one busy, up to 3x (timing.CPU_MOVED: "
              "a thread burning CPU while its sibling waits for a core, page faults in some steps, small ops' "
              "hand-offs); read a ratio between such rows with both figures' intervals: likely within 30%, not certainly")
OPS_WITHIN_CLEAN = ("the ops' own CPU time of a pass is compared where all its traced ops together took no more CPU "
                    "time a step than its clean pass's whole step, each with its 95% interval (the ops' mean over the "
                    "traced steps; the clean step's widened to one more process, timing.PROCESS_RULE): above it beyond "
                    "both, its profiler's work (or another process's speed) lies within its ops' spans; a gap inside "
                    "them is noise (a quiet 2-core bench, job 20261127T221159Z: one framework's bs 256 ops 88.94 ms "
                    "[86.53-91.70] against a clean step judged up to 88.47 had withheld 16 ratios). Not the pass's "
                    "whole CPU time against its clean pass's: the profiler's own work between the ops, and the "
                    "sampler's thread, are in that and in no op")
UNEVEN_STRETCH = ("a layer's share of a busy pass's traced wall time is not its share of the work: a neighbour stretches "
                  "ops unevenly, one that needs both threads more than one on one (job 20261127T080924Z, framework "
                  "passes busy: one framework's conv1 backward 5% -> 19% of its traced op time, another's traced op "
                  "time 4.3x its quiet figure with its layer ops unstretched)")


def traced_op_ms(runs: list[Run]) -> dict[tuple[str, str, Any], float]:
    """Per (run, framework, batch size) timed from framework ops (CPU traces): their traced op time per step
    (the sum over ``timed.timed_events``' outermost ops / the traced steps), ``PER_LAYER_CPU``'s denominator."""
    from .timed import timed_events

    return {(run.name, t.framework, t.batch_size): float(t.events["dur_ns"].sum()) / t.n_steps / 1e6
            for run in runs for t in timed_events(run) if t.level == "op" and t.n_steps}


@dataclass(frozen=True)
class CpuState:
    """The CPU time (``CPU_KEY``) of one pass of one framework x batch size, against its clean pass's."""

    run: str
    framework: str
    batch_size: int | None
    pass_name: str
    figure: dict | None  # timing.cpu_figure of the pass (None: not recorded)
    wall_median_s: float | None  # the same pass's wall-time median
    clean: dict | None  # the clean pass's timing.cpu_figure
    agreement: Agreement
    busy: Busy  # the pass's contention: marked; a reason only for a capture pass's layers (UNEVEN_STRETCH)
    sampler_ms: float | None = None  # the CPU sampler's own CPU ms a step taken out of the figure (cpusampler.OWN_RULE)

    @property
    def cpu_median_s(self) -> float | None:
        v = (self.figure or {}).get("median_step_s")
        return float(v) if isinstance(v, int | float) else None

    @property
    def utilisation(self) -> float | None:
        """CPU time over wall time per step of the pass (medians): 1 = one thread working all the step."""
        c, w = self.cpu_median_s, self.wall_median_s
        return c / w if c is not None and w else None

    def why_not(self, per_op_ms: float | None = None, per_op_ci: tuple[float, float] | None = None) -> str:
        """Why this pass's CPU time may not be compared ('' where it may); ``per_op_ms``: the pass's traced ops'
        own sampled CPU time per step (``PER_OP_CPU``), held to ``OPS_WITHIN_CLEAN`` instead (a busy machine does
        not keep it from a comparison); ``per_op_ci``: that figure's 95% interval (ms), its bottom held to the
        clean step's top (None: the figure itself)."""
        who = f"{fw_label(self.framework)}'s {self.pass_name} pass"
        if self.figure is None or self.clean is None:
            return f"{who} records no CPU time (a run made before kernelmap measured it)"
        if per_op_ms is not None:
            judge = timing.judging_interval(self.clean, between_processes=True)
            if judge is None:  # as the share estimate's Agreement.NO_INTERVAL: not judged, so not compared
                return (f"{who}'s traced ops took {per_op_ms:.4g} ms of CPU time a step; its clean pass records no "
                        f"interval to judge its ops by ({OPS_WITHIN_CLEAN})")
            low = per_op_ms if per_op_ci is None else min(per_op_ms, per_op_ci[0])
            if low * 1e-3 <= judge[1]:
                return ""
            iv = "" if per_op_ci is None else f" [{per_op_ci[0]:.4g}–{per_op_ci[1]:.4g}]"
            return (f"{who}'s traced ops took {per_op_ms:.4g} ms{iv} of CPU time a step, above its clean pass's whole "
                    f"step {self.clean['median_step_s'] * 1e3:.4g} ms (judged up to {judge[1] * 1e3:.4g} ms) beyond "
                    f"both intervals: {OPS_WITHIN_CLEAN}")
        if self.pass_name != CLEAN and self.busy.contended:  # PER_LAYER_CPU: shares of wall time
            return f"{who} ran on a busy machine ({self.busy.text}): {UNEVEN_STRETCH}"
        if self.agreement is Agreement.AGREES:
            return ""
        ratio = self.cpu_median_s / self.clean["median_step_s"] if self.clean.get("median_step_s") else None
        ran = f"took {ratio:.3g}x its clean pass's CPU time" if ratio else "took other CPU time than its clean pass"
        if self.sampler_ms is not None:
            ran += f" (less the CPU sampler's own {self.sampler_ms:.3g} ms a step)"
        return {Agreement.SLOWER: f"{who} {ran} (its profiler's own work)",
                Agreement.FASTER: f"{who} {ran}, less beyond noise",
                Agreement.NO_INTERVAL: f"{who} {ran}; no interval to judge it by"}.get(
                    self.agreement, f"{who}: {self.agreement}")


CPU_ALL_TRIALS = ("the clean pass's CPU time is over every clean trial, those run while the machine was busy included "
                  "(the wall-time figure leaves them out): CPU time is the clock read on a busy machine, and a busy "
                  "trial did the same work; with only the quiet ones a case with one quiet trial has no noise between "
                  "processes, and a busy capture pass is held against a quiet process alone (job 20261127T080924Z, "
                  "the reference at bs 64: 1 quiet trial of 5, 27.1 ms CPU a step; the busy ones 31.4-38.8)")


def clean_cpu_figure(run: Run, r: dict) -> dict | None:
    """``CPU_ALL_TRIALS``: ``timing.cpu_figure`` of every clean trial of entry ``r`` (its trial files); results.json's
    figure (its used trials) where every trial was used, or where a trial's file is missing or records no CPU time."""
    used = field_at(r, CPU_KEY)
    used = used if isinstance(used, dict) else None
    trials = [t for t in field_at(r, "trials", default=[]) or [] if isinstance(t, dict) and "trial" in t]
    folder = field_at(r, "dir")
    if used is None or not isinstance(folder, str) or all(t.get("used") for t in trials):
        return used
    files = [run.path / folder / pass_result_name(CLEAN, int(t["trial"])) for t in trials]
    if not all(f.is_file() for f in files):
        return used
    return timing.cpu_figure([read_json(f) for f in files]) or used


def _trials_busy(r: dict) -> Busy:
    """The contention of every clean trial of entry ``r`` together (``CPU_ALL_TRIALS``' figure): busy where any was."""
    trials = [t for t in field_at(r, "trials", default=[]) or [] if isinstance(t, dict)]
    busy = [b for b in (Busy.of(t) for t in trials) if b.contended]
    if not busy:
        return Busy.of(r)
    return Busy(True, f"{len(busy)} of {len(trials)} trials: {busy[0].text}")


def less_sampler(run: Run, r: dict, pass_name: str) -> tuple[dict | None, float | None]:
    """``cpusampler.OWN_RULE``: (the CPU figure of capture pass ``pass_name`` of entry ``r`` from its result file, its
    every step's process CPU time less the sampler's own over it; the sampler's median ms a step); (None, None) where
    the pass ran no sampler, or its samples do not cover each step (the figure as recorded then)."""
    folder = field_at(r, "dir")
    path = run.path / str(folder) / pass_result_name(pass_name, None)
    if pass_name == CLEAN or not isinstance(folder, str) or not path.is_file():
        return None, None
    result = read_json(path)
    own = cpusampler.own_step_cpu_s(path.parent, result)
    steps = result.get(timing.CPU_SAMPLES) or []
    if own is None or len(own) != len(steps) or not len(own) or np.isnan(own).any():
        return None, None
    less = {**result, timing.CPU_SAMPLES: [float(x) - float(o) for x, o in zip(steps, own, strict=True)]}
    return timing.cpu_figure([less]), float(np.median(own)) * 1e3


def cpu_state(run_name: str, r: dict, pass_name: str, clean: dict | None = None, figure: dict | None = None,
              sampler_ms: float | None = None) -> CpuState:
    """The CPU-time state of pass ``pass_name`` (``clean`` included: it agrees with itself) of entry ``r``; ``clean``:
    the clean pass's CPU figure (``clean_cpu_figure``; default results.json's, of its used trials); ``figure``: a
    capture pass's own in place of results.json's (``less_sampler``, whose ``sampler_ms`` it took out)."""
    pooled = isinstance(clean, dict) and clean is not field_at(r, CPU_KEY)
    clean = clean if isinstance(clean, dict) else field_at(r, CPU_KEY)
    clean = clean if isinstance(clean, dict) else None
    p = passes_of(r).get(pass_name) or {}
    fig = clean if pass_name == CLEAN else figure if figure is not None else field_at(p, CPU_KEY)
    fig = fig if isinstance(fig, dict) else None
    wall = field_at(r, "median_step_s") if pass_name == CLEAN else field_at(p, "median_step_s")
    agreement = Agreement.NOT_MEASURED
    if fig is not None and clean is not None:
        ci, judge = _ci(fig), timing.judging_interval(clean, between_processes=True)
        agreement = (Agreement.AGREES if pass_name == CLEAN else Agreement.NO_INTERVAL if ci is None or judge is None
                     else _BY_PLACEMENT[timing.placement(ci, judge)])
    return CpuState(run_name, str(case_of(r)), field_at(r, "batch_size"), pass_name, fig,
                    float(wall) if isinstance(wall, int | float) else None, clean, agreement,
                    (_trials_busy(r) if pooled else Busy.of(r)) if pass_name == CLEAN else Busy.of(p),
                    sampler_ms if figure is not None else None)


def cpu_states(runs: list[Run]) -> dict[StateKey, CpuState]:
    """Every pass's CPU-time state (the clean pass's included) of the runs' CPU cases, by (run, framework,
    batch size, pass)."""
    out: dict[StateKey, CpuState] = {}
    for run in runs:
        for r in run.results:
            if field_at(r, "device") != "cpu":
                continue  # on the GPU the host's CPU time is not the step's work
            clean = clean_cpu_figure(run, r)
            for name in passes_of(r) or {CLEAN: {}}:
                if field_at(passes_of(r).get(name, {}), "skipped") is None:
                    s = cpu_state(run.name, r, name, clean, *less_sampler(run, r, name))
                    out[(run.name, s.framework, s.batch_size, name)] = s
    return out


CPU_WALL_RULE = ("on a quiet machine a CPU worker's process works through its whole step (the batches are already "
                 "fetched; a thread that waits is waiting for another of its threads), so its CPU time per step is "
                 "not below its wall time beyond noise (the two 95% intervals of the clean pass's medians overlap, or "
                 "CPU time is above), and never above the wall time times the machine's cores (the most its threads "
                 "can work at once); on a busy machine the wall time stretches far more than the CPU time (timing.CPU_MOVED), "
                 "so there it is not checked")


def cpu_wall_agreement(runs: list[Run]) -> pd.DataFrame:
    """``CPU_WALL_RULE`` per run x framework x batch size (clean pass): ``agrees`` True / False, or None
    (not checked, ``why`` says why); ``cpu_ms`` and ``wall_ms`` with their intervals, ``utilisation``
    (CPU / wall) and ``cores``. The self-check ``CPU time vs wall time`` of the CPU-time comparison (``relations.cpu_vs_wall``)."""
    rows = []
    for run in runs:
        cores = field_at(field_at(run.manifest, "host", default={}) or {}, "cpu_count")
        for r in run.results:
            st = cpu_state(run.name, r, CLEAN)
            clean = clean_stats(r)
            fig, wall = st.figure or {}, _ci(clean)
            cpu = _ci(fig)
            row = {"run": run.name, "framework": st.framework, "batch_size": st.batch_size,
                   "cpu_ms": None if st.cpu_median_s is None else st.cpu_median_s * 1e3,
                   "cpu_ci_ms": None if cpu is None else tuple(v * 1e3 for v in cpu),
                   "wall_ms": None if st.wall_median_s is None else st.wall_median_s * 1e3,
                   "wall_ci_ms": None if wall is None else tuple(v * 1e3 for v in wall),
                   "utilisation": st.utilisation, "cores": cores, "agrees": None, "why": ""}
            if str(field_at(r, "device")) != "cpu":
                row["why"] = "a GPU run: its host waits for the device while a step runs"
            elif st.figure is None:
                row["why"] = "the run records no CPU time (made before kernelmap measured it)"
            elif st.busy.contended is not False:
                row["why"] = f"its clean pass did not run on a quiet machine ({st.busy.text})"
            elif cpu is None or wall is None:
                row["why"] = "no interval of the CPU or the wall time (under two samples)"
            else:
                low = cpu[1] >= wall[0]
                high = not isinstance(cores, int) or st.cpu_median_s <= st.wall_median_s * cores
                row["agrees"] = bool(low and high)
                row["why"] = "" if low and high else (
                    "CPU time below the wall time beyond noise: the step waited on something not its own threads"
                    if not low else f"CPU time above the wall time x {cores} cores: not one process's CPU time")
            rows.append(row)
    return pd.DataFrame(rows, columns=["run", "framework", "batch_size", "cpu_ms", "cpu_ci_ms", "wall_ms",
                                       "wall_ci_ms", "utilisation", "cores", "agrees", "why"])


# --- noise between processes: the trials, and which step figures are within it ---------------------------
TRIAL_NOISE = ("each clean trial is its own process: on a shared VM one process's step differs from the next by more "
               "than any one process's own samples (the 2-core VM: 15-60% between trial medians on a quiet machine). "
               "The step figure's 95% interval is bootstrapped over trials, then samples, so it holds that spread; "
               "two figures whose intervals overlap are within noise of each other")


def trial_noise(runs: list[Run]) -> pd.DataFrame:
    """Per case (run x framework x batch size): its used clean trials' medians (lowest, highest, spread = highest
    over lowest less one, relative standard deviation: ``timing.trial_spread``), samples a trial, and whether they
    disagree (``summary.judged_trials``: True, False, or None where too few samples to test), with ``why``."""
    from .summary import judged_trials, trial_samples

    rows = []
    for run in runs:
        for r in run.results:
            samples = trial_samples(r)
            spread = timing.trial_spread(samples) if samples else None
            verdict, rule = judged_trials(r)
            n = spread["samples_per_trial"] if spread else []
            why = ({True: "the trials differ beyond their own samples' noise (U test): the processes ran at different "
                          "speeds, which the step figure's interval holds",
                    False: "no trial differs from the others beyond their samples' noise (U test)",
                    None: "not tested: too few samples a trial for the U test to reach its level "
                          f"({'/'.join(map(str, n)) or 'none'} a trial)" if spread else "under two trials"}[verdict])
            rows.append({"run": run.name, "framework": str(case_of(r)), "batch_size": field_at(r, "batch_size"),
                         "trials": spread["trials"] if spread else None,
                         "samples_per_trial": "/".join(map(str, n)) or None,
                         "trial_low_ms": spread["trial_low_s"] * 1e3 if spread else None,
                         "trial_high_ms": spread["trial_high_s"] * 1e3 if spread else None,
                         "spread_pct": spread["spread_rel"] * 100 if spread else None,
                         "cv_pct": spread["cv_rel"] * 100 if spread and spread["cv_rel"] is not None else None,
                         "trials_disagree": verdict, "judged_by": rule, "why": why})
    return pd.DataFrame(rows, columns=["run", "framework", "batch_size", "trials", "samples_per_trial", "trial_low_ms",
                                       "trial_high_ms", "spread_pct", "cv_pct", "trials_disagree", "judged_by", "why"])


def step_noise(runs: list[Run]) -> pd.DataFrame:
    """Per run x batch size x framework beside the reference (the registry's first framework of the run): its clean
    step over the reference's on wall time and (CPU runs) on CPU time, each with ``within_noise`` True where the two 95%
    intervals overlap (``TRIAL_NOISE``), False where they are apart, None where an interval is missing or either
    figure is of one trial (its interval holds no noise between processes); ``busy``
    where either clean pass ran contended (wall time then stretched by what else ran, not noise)."""
    rows = []
    for run in runs:
        by_bs: dict[Any, list[dict]] = {}
        for r in run.results:
            by_bs.setdefault(field_at(r, "batch_size"), []).append(r)
        for bs, entries in by_bs.items():
            ref = entries[0]
            for r in entries[1:]:
                for clock, fig in (("wall", clean_stats), ("CPU", lambda e, run=run: clean_cpu_figure(run, e) or {})):
                    if clock == "CPU" and "gpu" in (field_at(r, "device"), field_at(ref, "device")):
                        continue  # on the GPU the host's CPU time is not the step's work (cpu_states)
                    a, b = fig(r) or {}, fig(ref) or {}
                    ma, mb, ca, cb = a.get("median_step_s"), b.get("median_step_s"), _ci(a), _ci(b)
                    if ma is None or not mb:
                        continue
                    one = min(int(a.get("n_trials") or 1), int(b.get("n_trials") or 1)) < 2
                    rows.append({"run": run.name, "batch_size": bs, "framework": str(case_of(r)),
                                 "reference": str(case_of(ref)), "clock": clock, "ms": ma * 1e3, "ref_ms": mb * 1e3,
                                 "ratio": ma / mb, "ci_ms": None if ca is None else tuple(v * 1e3 for v in ca),
                                 "ref_ci_ms": None if cb is None else tuple(v * 1e3 for v in cb),
                                 # one trial's interval holds no noise between processes: not judged
                                 "within_noise": None if ca is None or cb is None or one
                                 else timing.intervals_overlap(ca, cb),
                                 "busy": bool(Busy.of(r).contended or Busy.of(ref).contended)})
    return pd.DataFrame(rows, columns=["run", "batch_size", "framework", "reference", "clock", "ms", "ref_ms", "ratio",
                                       "ci_ms", "ref_ci_ms", "within_noise", "busy"])


def noise_statements(noise: pd.DataFrame, steps: pd.DataFrame) -> list[str]:
    """The page's statement of noise between processes, per run (``trial_noise``, ``step_noise``): how far its
    cases' trials spread, whether they differ beyond their samples (each case that does, named), and which step
    comparisons lie within noise."""
    out = []
    for run, g in noise.groupby("run", sort=False):
        spread = g[g["spread_pct"].notna()]
        if len(spread):
            top = spread.loc[spread["spread_pct"].idxmax()]
            out.append(f"{run}: the clean trials (each its own process) of {len(spread)} case(s) spread "
                       f"{spread['spread_pct'].min():.0f}–{top['spread_pct']:.0f}% between their medians (widest: "
                       f"{fw_label(top['framework'])} bs {top['batch_size']}, {top['trial_low_ms']:.4g}–"
                       f"{top['trial_high_ms']:.4g} ms); each step figure's 95% interval is over its trials and holds "
                       "that spread")
        verdicts = g["trials_disagree"].map(lambda v: v if isinstance(v, bool) else None)
        for _, r in g[verdicts.eq(True).to_numpy(dtype=bool)].iterrows():
            span = (f" (trial medians {r['trial_low_ms']:.4g}–{r['trial_high_ms']:.4g} ms)"
                    if pd.notna(r["trial_low_ms"]) else "")
            out.append(f"{run}: {fw_label(r['framework'])} bs {r['batch_size']} clean pass: its trials disagree "
                       f"beyond noise{span}")
        untested = g[verdicts.isna().to_numpy(dtype=bool) & g["trials"].notna()]
        if len(untested):
            n = "/".join(sorted({str(s) for s in untested["samples_per_trial"].dropna()}))
            out.append(f"{run}: whether the trials differ beyond their own samples (U test) was not tested in "
                       f"{len(untested)} case(s): {n} sample(s) a trial are too few")
        s = steps[steps["run"] == run] if len(steps) else steps
        judged = s[s["within_noise"].notna()] if len(s) else s
        if len(s) and not len(judged):
            out.append(f"{run}: clean steps against {fw_label(s['reference'].iloc[0])}'s not judged for noise: "
                       "one trial (or no interval) a case, whose interval holds no noise between processes")
        if len(judged):
            within = judged[judged["within_noise"].astype(bool)]
            names = ", ".join(f"{fw_label(x['framework'])} bs {x['batch_size']} ({x['clock']})"
                              for _, x in within.iterrows()) or "none"
            busy = int(judged["busy"].sum())
            clocks = " and ".join(c for c in ("wall", "CPU") if c in set(judged["clock"]))
            out.append(f"{run}: clean step against {fw_label(judged['reference'].iloc[0])}'s ({clocks} time): "
                       f"{len(judged) - len(within)} of {len(judged)} beyond noise (95% intervals apart); within "
                       f"noise: {names}" + (f"; {busy} of the {len(judged)} with a clean pass run on a busy machine (its wall "
                                                  "time stretched by other processes, not noise: read its CPU time)"
                                                  if busy else ""))
    return out
