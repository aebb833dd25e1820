"""How kernelmap times a training step, and what its figures mean (one rule per fact).

The clean pass fetches its batches onto the device in windows of ``WINDOW_STEPS`` (the loader is
timed on its own), then runs the steps of a window back to back and synchronises the device only
every ``BLOCK_STEPS`` steps. Python's garbage collector is off within a window and collects in full
between windows, outside every clock (``GC_RULE``), so whole epochs never run without it. A
*sample* is the wall time of one block divided by its steps, so no per-step synchronisation adds
launch gaps. ``kernelmap run`` repeats the clean pass in ``trials`` separate processes; the step
figure is the median of all samples of its trials (a trial run under contention, ``kernelmap.contention``,
left out where a quiet one exists; trials that disagree, ``trials_disagree``, repeated within a budget), with a 95% confidence interval from a two-level bootstrap
(trials, then samples within a trial), so that a trial-to-trial shift widens the interval as it
should. Every trial fetches its own batches (the end-to-end figure is over the step figure's trials); a
worker given ``--reuse-batches`` fetches at most ``WINDOW_STEPS`` batches once and cycles through them
(``REUSE_METHOD``): its step times are the same kind, it has no end-to-end figure.
Capture passes synchronise after every step (their traces need step boundaries), and their
overhead is called an overhead only where their median lies outside the clean pass's interval,
widened to what one more process may give (``PROCESS_RULE``): each capture pass runs in its own
process, and on a VM the step of one process differs from the next by more than any one
process's own noise (trials of one key on a quiet 2-core VM: 20-50% apart).

Nothing here imports a framework.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import utest

BLOCK_STEPS = 10  # clean pass: steps between device synchronisations (one sample)
WINDOW_STEPS = 50  # batches fetched onto the device before a run of steps
DEFAULT_TRIALS = 3
MIN_CAPTURE_STEPS = 20  # a capture pass needs this many timed steps for its overhead to be judged
NOISE_THRESHOLD = 0.05  # CI half-width over median above which a figure is flagged noisy
CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261122
# CPU thread settings the runner sets equally for every framework's worker (which records them).
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

GC_RULE = (f"Python's garbage collector off within each window of up to {WINDOW_STEPS} timed steps, "
           f"the fetching of its batches included, and run in full before each window, outside the timing")
STEP_METHOD = (f"training step only, batches already on the device; one sample = a block of up to "
               f"{BLOCK_STEPS} back-to-back steps between device synchronisations / its steps; {GC_RULE}")
E2E_METHOD = (f"end to end with the loader: wall time of the timed windows, each fetching its batches onto "
              f"the device ({WINDOW_STEPS} at a time) then running its steps, / steps; {GC_RULE}")
REUSE_METHOD = (f"not measured in this trial: it fetched at most {WINDOW_STEPS} batches once, before its timed steps, "
                f"and cycled through them (--reuse-batches: no end-to-end or loader figure of its own)")
CAPTURE_METHOD = ("capture pass: device synchronised after every step (its trace needs step boundaries); "
                  "all its batches fetched before the capture; garbage collector off during the timed "
                  "steps (collected before them)")

# The workers' own CPU time (CPU_RULE): a kind of time another process moves less than wall time, beside wall time.
CPU_CLOCK = "process CPU time"
CPU_METHOD = ("the worker process's own CPU time (time.process_time: user + system time of all its threads: "
              "the framework's intra-op and engine threads included) over the same blocks of steps as the wall "
              "time, / their steps; beside it the main thread's own (time.thread_time)")
# What a neighbour did to CPU time, measured (issue 42): the default bench twice on the 2-core VM, job
# 20261127T185139Z quiet and 20261127T190317Z beside the full test suite, the per-thread samples (cpu_threads.npy)
# and the framework pass's page faults per step read for the cells that moved most.
CPU_MOVED = ("kernelmap's own measurement, not this run's: two default benches on its developers' 2-core VM, one quiet "
             "and one beside the test suite (there other processes at up to 1.0-1.4 of 2 cores): the whole step's CPU time 0.95-1.28x (wall 1.29-1.96x); 44 of 54 "
             "CPU-time figures within 30%, the others 0.32-2.52x, for three reasons: a pool thread that burns CPU "
             "while its sibling waits for a core (one framework's bs 64 conv1 backward, a oneDNN backward-weights "
             "convolution: 0.86 -> 2.17 ms, one thread's 0.4 ms of work and the other's 1.5-1.9 ms within the op; OMP_WAIT_POLICY=PASSIVE did not "
             "stop it), page faults in some steps of a process and not in others (another's bs 64 conv1 forward in the "
             "quiet job: 2.7-3.1 ms in the 11 steps that faulted 3,137 pages each, 0.6-0.7 ms in those after, that "
             "faulted none; its median 2.67, its interval 0.71-2.83; 0.85 in the busy job), and the pool's hand-offs "
             "in ops under 0.3 ms (fc2, 0.56-0.74x busy: with a core free the second thread takes part). The pair of "
             "jobs before them (tests/data/cpu_bench_quiet, cpu_bench_busy: other processes at most 0.03 and at "
             "0.7-1.6 cores): 35 of 45 within 30%, the others 0.55-1.33x, 8 of them fc2's. So a CPU-time ratio on a "
             "busy machine is likely within 30%, not certainly: read a figure with its interval")
CPU_RULE = ("CPU time counts the work a process does, not the time it waits for a core, so a neighbour that takes "
            "cores stretches wall time more than CPU time; it is not latency: threads working at once add up "
            "(above the wall time on a quiet machine where the framework runs several), threads that spin while "
            "they wait count as working (OpenMP's: OMP_WAIT_POLICY=PASSIVE makes them sleep, WAIT_ENV; a library's "
            "own waits it does not reach), and so does the kernel's work for the process (page faults). "
            f"It is moved, less than wall time: {CPU_MOVED}")
# Measured on the project's 2-core VM at load 8-12 (PyTorch CNN, bs 64, 2 intra-op threads): with GNU
# OpenMP's default wait policy a step took 310-710 ms wall and 120-207 ms CPU (threads spinning while
# their sibling waited for a core); with OMP_WAIT_POLICY=PASSIVE 78-93 ms wall and 30-31 ms CPU, the
# CPU time of the same step on one thread (26-30 ms). The runner sets it for every framework's worker.
WAIT_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
# glibc malloc keeps what a worker frees for its next step (issue 42, docs/timing.md "Memory"): its mmap threshold
# fixed at glibc's own ceiling (32 MiB on 64-bit), the trim threshold and top pad so high that neither the main heap
# nor a thread's heaps go back to the kernel between steps. Otherwise the threshold moves with what was freed
# first, and in which thread: MXNet 1.9 on the CPU allocates every array with posix_memalign and frees it on its
# engine thread (no pool), so one process faulted 10,000-17,000 fresh pages a step at bs 256 (kernel time
# 14-26 ms a step, CPU 65-74 ms) and the next almost none (48-50 ms), and a process could change speed
# midway; measured on the 2-core VM, 6 processes each, interleaved. PyTorch's CPU allocator (posix_memalign, no
# cache) faulted 8,000-12,500 pages a step at bs 256 (CPU 103-105 ms, 84-86 ms with these). Set by the runner for
# every framework's worker and pass, read by glibc at the worker's start; the step benchmarks, in the pytest
# process, set the same with mallopt (run.devices.keep_freed_memory).
ALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
             "MALLOC_TOP_PAD_": str(256 << 20)}
# ...and the mmap threshold raised with mallopt at the worker's start (heap.set_mmap_threshold; the step benchmarks'
# process too) to a thread arena's whole heap (HEAP_MAX_SIZE, 64 MiB on 64-bit): at 32 MiB a block of 32-64 MiB
# that a thread's heap had no room for was mapped fresh at each allocation and unmapped at its free (MXNet bs 512,
# conv1's 49 MiB output and its gradients: 37,635 faults a step, CPU 154-155 ms; 64 MiB: 0-1,568 and 90-95 ms, 2
# processes each, 2-core VM, docs/timing.md "Memory"). Where glibc refuses it (an older glibc), the 32 MiB variable
# stays; the worker records which (``MMAP_THRESHOLD_SET``). Blocks above 64 MiB are mapped fresh in a thread arena
# whatever the threshold (no heap holds them).
MMAP_THRESHOLD_RAISED = 64 << 20
MMAP_THRESHOLD_ENV = "MALLOC_MMAP_THRESHOLD_"  # ALLOC_ENV's variable that the raise replaces
MMAP_THRESHOLD_SET = "mmap_threshold_set"  # a worker result's threads field: the threshold mallopt set, else None
CPU_SAMPLES = "cpu_step_times_s"  # a worker result's per-sample process CPU time (seconds per step)
FAULT_SAMPLES = "minor_faults_per_step"  # a worker result's per-sample minor page faults of its process, per step
MAIN_THREAD_SAMPLES = "main_thread_cpu_step_times_s"


def cpu_figure(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The CPU-time figure of worker results (the used clean trials, or one capture pass): ``step_stats``
    of their per-sample process CPU times, as wall time's (same trials, same intervals), with the main
    thread's median beside it; None where no result records CPU time (workers older than CPU_SAMPLES)."""
    trials = [list(r[CPU_SAMPLES]) for r in results if r.get(CPU_SAMPLES)]
    if not trials or len(trials) < len(results):
        return None
    main = [x for r in results for x in r.get(MAIN_THREAD_SAMPLES) or ()]
    return {**step_stats(trials).to_dict(), "clock": CPU_CLOCK, "method": CPU_METHOD,
            "main_thread_median_step_s": float(np.median(main)) if main else None,
            "wait_policy": (results[0].get("threads") or {}).get("env", {}).get("OMP_WAIT_POLICY")}


class OverheadVerdict(enum.StrEnum):
    """What a capture pass's median says against the clean pass's interval."""

    ABOVE = "above noise"  # median above the clean pass's CI: a real slowdown
    BELOW = "below noise"  # median below the CI: faster than clean, which a capture cannot be; suspect
    WITHIN = "within noise"
    TOO_FEW_STEPS = "too few steps"  # fewer than MIN_CAPTURE_STEPS timed
    NO_INTERVAL = "no interval"  # the clean pass has no CI (a single sample)


@dataclass(frozen=True)
class StepStats:
    """The step figure of one framework x batch size: pooled samples of every trial."""

    median_s: float
    q25_s: float
    q75_s: float
    mean_s: float
    ci95_low_s: float | None
    ci95_high_s: float | None
    n_trials: int
    n_samples: int
    trial_medians_s: tuple[float, ...]

    @property
    def half_width_rel(self) -> float | None:
        if self.ci95_low_s is None or self.ci95_high_s is None or self.median_s <= 0:
            return None
        return (self.ci95_high_s - self.ci95_low_s) / 2 / self.median_s

    @property
    def noisy(self) -> bool | None:
        hw = self.half_width_rel
        return None if hw is None else hw > NOISE_THRESHOLD

    def to_dict(self) -> dict[str, Any]:
        return {
            "median_step_s": self.median_s, "q25_step_s": self.q25_s, "q75_step_s": self.q75_s,
            "iqr_step_s": self.q75_s - self.q25_s, "mean_step_s": self.mean_s,
            "ci95_low_s": self.ci95_low_s, "ci95_high_s": self.ci95_high_s,
            "ci95_half_width_rel": self.half_width_rel, "noisy": self.noisy,
            "n_trials": self.n_trials, "n_samples": self.n_samples,
            "trial_medians_s": list(self.trial_medians_s),
        }


def median_ci(trials: list[list[float]], confidence: float = CONFIDENCE,
              resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> tuple[float, float] | None:
    """Bootstrap interval of the pooled median: resample trials, then samples within each trial.

    None where there is nothing to resample (one sample in all)."""
    arrays = [np.asarray(t, dtype=np.float64) for t in trials if len(t)]
    if sum(len(a) for a in arrays) < 2:
        return None
    rng = np.random.default_rng(seed)
    k = len(arrays)
    pooled = np.concatenate(arrays)
    starts = np.cumsum([0, *(len(a) for a in arrays[:-1])])
    # the draws in the order the resamples make them (the seed's stream, unchanged), then one median per resample
    # taken together for the resamples of one length (np.median over rows: the values one median each gives)
    if k == 1:  # one trial: the same draws as one call (the generator's stream does not depend on the call's size)
        return _interval(np.median(pooled[rng.integers(0, len(pooled), size=(resamples, len(pooled)))], axis=1),
                         confidence)
    drawn: list[np.ndarray] = []
    for _ in range(resamples):
        picked = rng.integers(0, k, size=k) if k > 1 else np.zeros(1, dtype=int)
        drawn.append(np.concatenate([starts[j] + rng.integers(0, len(arrays[j]), size=len(arrays[j]))
                                     for j in picked]))
    meds = np.empty(resamples)
    lengths = np.fromiter((len(d) for d in drawn), dtype=np.int64, count=resamples)
    for n in np.unique(lengths):
        rows = np.flatnonzero(lengths == n)
        meds[rows] = np.median(pooled[np.stack([drawn[i] for i in rows])], axis=1)
    return _interval(meds, confidence)


def _interval(estimates: np.ndarray, confidence: float) -> tuple[float, float]:
    """The central ``confidence`` interval of a bootstrap's estimates."""
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(estimates, [alpha, 1 - alpha])
    return float(lo), float(hi)


def mean_ci(values: list[float], confidence: float = CONFIDENCE, resamples: int = BOOTSTRAP_RESAMPLES,
            seed: int = BOOTSTRAP_SEED) -> tuple[float, float] | None:
    """Bootstrap interval of the mean of ``values``; None under two values."""
    a = np.asarray(values, dtype=np.float64)
    if a.size < 2:
        return None
    rng = np.random.default_rng(seed)
    return _interval(a[rng.integers(0, a.size, size=(resamples, a.size))].mean(axis=1), confidence)


def step_stats(trials: list[list[float]]) -> StepStats:
    """Median, quartiles and the median's 95% interval of the samples of ``trials``."""
    pooled = np.concatenate([np.asarray(t, dtype=np.float64) for t in trials]) if trials else np.empty(0)
    if pooled.size == 0:
        raise ValueError("no timed samples")
    q25, med, q75 = (float(x) for x in np.percentile(pooled, [25, 50, 75]))
    ci = median_ci(trials)
    return StepStats(median_s=med, q25_s=q25, q75_s=q75, mean_s=float(pooled.mean()),
                     ci95_low_s=None if ci is None else ci[0], ci95_high_s=None if ci is None else ci[1],
                     n_trials=len(trials), n_samples=int(pooled.size),
                     trial_medians_s=tuple(float(np.median(t)) for t in trials))


def intervals_overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two confidence intervals share a point: their medians' difference is then within noise."""
    return a[0] <= b[1] and b[0] <= a[1]


class Placement(enum.StrEnum):
    """Where one 95% interval lies against another: the one comparison every "beyond noise" verdict makes."""

    BELOW = "below"  # wholly below the other: faster (a time) beyond noise
    WITHIN = "within"  # they share a point: within noise
    ABOVE = "above"  # wholly above the other: slower beyond noise


def placement(a: tuple[float, float], b: tuple[float, float]) -> Placement:
    """Where interval ``a`` lies against interval ``b`` (``intervals_overlap``: within)."""
    if intervals_overlap(a, b):
        return Placement.WITHIN
    return Placement.ABOVE if a[0] > b[1] else Placement.BELOW


def capture_ci(samples: list[float]) -> tuple[float, float] | None:
    """95% bootstrap interval of one trial's (or one capture pass's) per-step median: ``median_ci`` of
    that trial alone (samples resampled within it); None for fewer than two samples."""
    return median_ci([list(samples)])


# Student's t, two-sided 95%, by degrees of freedom (1.96 beyond the table's last row).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000}
PROCESS_RULE = ("a figure of another process (a capture pass, a step benchmark) is judged against the clean pass's "
                "95% interval of its median widened to the 95% prediction interval of one more process's median: "
                "the clean median +- t(n-1) x s x sqrt(1 + 1/n), s the standard deviation of the n used trials' "
                "medians (each trial is its own process); not widened where the clean pass ran contended or has "
                "under two used trials")


def t975(dof: int) -> float:
    """Student's t quantile 0.975 for ``dof`` degrees of freedom (the table's next smaller row)."""
    if dof < 1:
        raise ValueError("t needs at least one degree of freedom")
    return T975[max(k for k in T975 if k <= dof)] if dof <= max(T975) else 1.96


def process_interval(trial_medians: list[float], center: float) -> tuple[float, float] | None:
    """``PROCESS_RULE``'s prediction interval for the median of one more process, around ``center``
    (the clean pass's median); None under two trials."""
    m = np.asarray([float(x) for x in trial_medians], dtype=np.float64)
    if m.size < 2:
        return None
    half = t975(m.size - 1) * float(m.std(ddof=1)) * math.sqrt(1 + 1 / m.size)
    return center - half, center + half


TWO_PROCESS_RULE = ("two figures of two other processes (a library call of the libs pass held against its op of the "
                    "framework pass) may lie apart by the noise between processes besides each one's own interval: "
                    "as far apart as the clean pass's used trials lay (each trial is its own process): the slowest "
                    "trial's median over the fastest's, less one; the lower figure's 95% interval is widened by that "
                    "share. Measured on the whole step (a small op may move more between processes); not measured "
                    "where the clean pass ran contended or has under two used trials")


def two_process_spread(trial_medians: list[float]) -> float | None:
    """``TWO_PROCESS_RULE``'s share: the highest of the trials' medians over the lowest, less one; None under two
    trials or a median that is not positive."""
    m = [float(x) for x in trial_medians]
    if len(m) < 2 or min(m) <= 0:
        return None
    return max(m) / min(m) - 1.0


def judging_interval(clean: dict[str, Any], between_processes: bool = True) -> tuple[float, float] | None:
    """The interval another process's median is judged against (``PROCESS_RULE``): the clean pass's
    95% interval of its median (``StepStats.to_dict()``), widened by ``process_interval`` of its
    ``trial_medians_s`` where ``between_processes``; None where the clean pass has no interval."""
    lo, hi = clean.get("ci95_low_s"), clean.get("ci95_high_s")
    if lo is None or hi is None:
        return None
    meds, center = clean.get("trial_medians_s"), clean.get("median_step_s")
    pi = process_interval(list(meds), float(center)) if between_processes and meds and center is not None else None
    return (float(lo), float(hi)) if pi is None else (min(float(lo), pi[0]), max(float(hi), pi[1]))


TRIAL_ALPHA = 0.05  # the trials' test's level, shared out over its tests (Bonferroni)
TRIALS_DISAGREE_RULE = (
    "each trial's samples (its own process) against the other used trials' samples pooled: Mann-Whitney U, "
    f"two-sided (kernelmap/utest.py, as google/benchmark's compare.py judges repetitions), at {TRIAL_ALPHA} shared "
    "over the tests (one test for two trials, one a trial for more); the trials disagree where a test falls below "
    "its share: the processes differ beyond their own samples' noise, and the step figure's interval (over trials) "
    "holds that spread. Not judged (None) where no test can reach its share with the samples the trials have (the "
    "smallest two-sided p of an exact U test: 2 / C(n1 + n2, n1)): 2 samples a trial never can; one trial does not "
    "disagree; no fixed percentage")


def _trial_tests(trials: list[list[float]]) -> list[tuple[list[float], list[float]]]:
    """``TRIALS_DISAGREE_RULE``'s tests: (a trial's samples, the other trials' samples pooled)."""
    arrays = [[float(x) for x in t] for t in trials if len(t)]
    if len(arrays) < 2:
        return []
    if len(arrays) == 2:
        return [(arrays[0], arrays[1])]
    return [(a, [x for j, b in enumerate(arrays) if j != i for x in b]) for i, a in enumerate(arrays)]


def trials_disagree(trials: list[list[float]]) -> bool | None:
    """``TRIALS_DISAGREE_RULE``: True where the trials' samples differ beyond their noise, False where they do
    not (or there are under two trials with samples: nothing to differ), None where the samples are too few for
    the test to tell."""
    tests = _trial_tests(trials)
    if not tests:
        return False
    level = TRIAL_ALPHA / len(tests)
    judged = [(a, b) for a, b in tests if utest.min_p(len(a), len(b)) <= level]
    if not judged:
        return None
    return any(utest.p_value(a, b) < level for a, b in judged)


def trial_spread(trials: list[list[float]]) -> dict[str, Any] | None:
    """What the trials' processes show of the machine's noise: their medians' lowest and highest, the spread
    (highest over lowest less one) and the relative standard deviation of the medians (None under two trials)."""
    meds = [float(np.median(t)) for t in trials if len(t)]
    if len(meds) < 2:
        return None
    mean = float(np.mean(meds))
    return {"trial_low_s": min(meds), "trial_high_s": max(meds), "spread_rel": max(meds) / min(meds) - 1.0,
            "cv_rel": float(np.std(meds, ddof=1)) / mean if mean else None, "trials": len(meds),
            "samples_per_trial": sorted({len(t) for t in trials if len(t)})}


def overhead_verdict(capture_median_s: float, capture_steps: int, clean: dict[str, Any],
                     between_processes: bool = True) -> OverheadVerdict:
    """Judge a capture pass's median against the clean pass's interval (``StepStats.to_dict()``),
    widened between processes (``judging_interval``)."""
    if capture_steps < MIN_CAPTURE_STEPS:
        return OverheadVerdict.TOO_FEW_STEPS
    ci = judging_interval(clean, between_processes)
    if ci is None:
        return OverheadVerdict.NO_INTERVAL
    lo, hi = ci
    if capture_median_s > hi:
        return OverheadVerdict.ABOVE
    if capture_median_s < lo:
        return OverheadVerdict.BELOW
    return OverheadVerdict.WITHIN


def blocks(n_steps: int, block: int) -> list[int]:
    """Sizes of the timed blocks of ``n_steps`` steps: full blocks, then the rest."""
    if block < 1:
        raise ValueError("block must be at least 1")
    full, rest = divmod(n_steps, block)
    return [block] * full + ([rest] if rest else [])
