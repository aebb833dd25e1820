"""The round schedule of a run: which worker runs when, and which case gets another clean trial.

Workers run in rounds that interleave the frameworks (``schedule``, ``round_order``), so that a busy
minute lands on every framework alike; a case whose trials ran under contention or disagree gets
extra clean trials within a budget (``repeat_reason``, ``repeat_budget_s``), and its step figure
leaves contended trials out where a quiet one exists (``used_trials``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import frameworks, timing
from ..errors import KernelmapError
from ..frameworks import dataparallel
from ..frameworks.case import Case, CaseKey

PROFILES = {
    "none": ("clean",),
    "framework": ("clean", "framework"),
    "libs": ("clean", "libs"),
    "nsys": ("clean", "nsys"),
    # and on N > 1 devices the step without the gradients' reduction (issue 39's independent measure, as "comm")
    "all": ("clean", "framework", "libs", "nsys", dataparallel.NO_REDUCTION),
    # every capture pass, then one step under Nsight Compute (kernelmap/run/counters.py): its kernels are paired
    # with a timing pass's traced step and their calls' logged math; not in "all" yet
    "counters": ("clean", "framework", "libs", "nsys", dataparallel.NO_REDUCTION, "counters"),
    # issue 39: the framework pass, then the step without the gradients' reduction on N > 1 devices, timed as the
    # clean pass is (dataparallel.NO_REDUCTION): the exposed communication of the traces against the difference
    "comm": ("clean", "framework", dataparallel.NO_REDUCTION),
}
# Timed steps of each capture pass (at most the clean pass's): enough for its overhead to be judged
# against the clean pass's interval (kernelmap.timing).
PASS_STEPS = {"framework": timing.MIN_CAPTURE_STEPS, "libs": timing.MIN_CAPTURE_STEPS,
              "nsys": timing.MIN_CAPTURE_STEPS, "counters": 1}  # counters.STEPS: one step under ncu
LIBS_WARMUP = 1
# nsys traces a CUDA graph's replay as one launch unless told otherwise, and even per node it has no
# reference step to give replayed kernels the ops that launched them at capture: the framework pass does
REPLAY_NSYS_SKIP = ("{label} replays CUDA graphs ({why}): nsys would record each replay's kernels without "
                    "the ops that launched them at capture; the framework pass attributes them "
                    "(adapters/graph_replay.py)")


def case_nsys_skips(cases: list[Case], skips: dict[str, str]) -> dict[Case, str]:
    """Why each case's nsys pass records nothing ({case: reason}): its framework's reason (``nsys_skips``),
    else, for a mode that replays CUDA graphs (``Framework.replay_modes``), that."""
    out = {}
    for c in cases:
        why = skips.get(c.framework)
        if why is None and c.replay_reason:
            why = REPLAY_NSYS_SKIP.format(label=c.label, why=c.replay_reason)
        if why is not None:
            out[c] = why
    return out


def libs_warmup(descriptor: frameworks.Framework, mode: str, warmup_steps: int) -> int:
    """The libs pass's warm-up: LIBS_WARMUP (its logs stay short), or fewer where the run asked for fewer,
    but never below what the mode needs (``min_warmup``: a CUDA graph is captured at its last warm-up step)."""
    return max(min(LIBS_WARMUP, warmup_steps), descriptor.min_warmup.get(mode, 0))


def check_warmup(warmup_steps: int, cases: list[Case]) -> None:
    """Refuse a --warmup below what a chosen mode needs, before anything runs (its worker would fail)."""
    need = {c: frameworks.get(c.framework).min_warmup.get(c.mode, 0) for c in cases}
    short = [f"{frameworks.get(c.framework).label}'s {c.mode} mode needs at least {n}"
             for c, n in need.items() if warmup_steps < n]
    if short:
        raise KernelmapError(f"--warmup {warmup_steps}: too few warm-up steps: " + "; ".join(dict.fromkeys(short))
                             + " (a CUDA graph is captured at the last warm-up step)")


def planned_workers(cases: list[Case], n_batch_sizes: int, trials: int, passes: tuple[str, ...],
                    nsys_skipped: dict[Case, str]) -> int:
    """How many worker processes the run starts (the progress line's N): per case x batch size, the clean
    pass's trials and each capture pass, less an nsys pass that is skipped (``case_nsys_skips``) and the step
    without reduction of a case on one device (none to remove)."""
    per_case = {c: trials + sum(1 for p in passes if p != "clean" and not (p == "nsys" and c in nsys_skipped)
                                and not (p == dataparallel.NO_REDUCTION and c.devices < 2))
                for c in cases}
    return n_batch_sizes * sum(per_case.values())


REPEAT_BUDGET_SHARE = 0.30  # default --repeat-budget: this share of the run's wall time before the repeats
DEFAULT_MAX_REPEATS = 2


@dataclass(frozen=True)
class Job:
    """One worker process of the run: a clean-pass trial (``trial``) or a capture pass (``trial`` None)."""

    key: CaseKey
    pass_name: str
    trial: int | None
    round: int


def round_order(keys: list[CaseKey], r: int) -> list[CaseKey]:
    """The cases of round ``r`` in the order they run: batch size after batch size, the cases
    alternating within each, their order rotated by one place each round (each case takes each
    place in turn, so none always runs first or last)."""
    cases = list(dict.fromkeys(k.case for k in keys))
    bss = list(dict.fromkeys(k.batch_size for k in keys))
    n = r % len(cases) if cases else 0
    rotated = cases[n:] + cases[:n]
    present = set(keys)
    return [c.at(bs) for bs in bss for c in rotated if c.at(bs) in present]


def schedule(keys: list[CaseKey], trials: int, capture_passes: tuple[str, ...]) -> list[Job]:
    """Every planned worker of the run, in the order they run: ``max(trials, len(capture_passes))``
    rounds; round r holds clean trial r + 1 of every case (framework x batch size), then capture pass
    r of every case (``round_order``), so that a busy minute falls on every framework alike rather than
    on one framework's clean pass."""
    jobs: list[Job] = []
    for r in range(max(trials, len(capture_passes))):
        order = round_order(keys, r)
        if r < trials:
            jobs += [Job(k, "clean", r + 1, r) for k in order]
        if r < len(capture_passes):
            jobs += [Job(k, capture_passes[r], None, r) for k in order]
    return jobs


def trial_contended(trial: dict[str, Any]) -> bool | None:
    """Whether a clean trial (its worker's result) ran under contention (``kernelmap.contention``)."""
    return (trial.get("contention") or {}).get("contended")


def used_trials(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trials the clean figure is computed from: those not run under contention where there is at
    least one, else all of them (the figure is then flagged contended)."""
    quiet = [t for t in trials if trial_contended(t) is not True]
    return quiet or list(trials)


def repeat_reason(trials: list[dict[str, Any]], wanted: int, repeats: int, max_repeats: int,
                  captures: dict[str, dict[str, Any]] | None = None) -> str | None:
    """Why a case gets one more clean trial, or None: fewer than ``wanted`` of its trials ran without
    contention, the trials its figure uses disagree (``timing.trials_disagree``), or a capture pass of
    ``captures`` ({pass: its worker's result}) ran faster than them beyond noise (``faster_capture``); never more
    than ``max_repeats`` extra trials."""
    if repeats >= max_repeats:
        return None
    busy = [t["trial"] for t in trials if trial_contended(t) is True]
    if len(trials) - len(busy) < wanted:
        return f"trial{'s' if len(busy) > 1 else ''} {', '.join(str(b) for b in busy)} ran under contention"
    if timing.trials_disagree([t["step_times_s"] for t in used_trials(trials)]):
        return "its trials disagree beyond noise"
    faster = faster_capture(trials, captures or {})
    if faster is not None:
        return f"its {faster} pass ran faster than its clean trials beyond noise (a clean process ran slow)"
    return None


FASTER_RULE = ("a capture pass (its profiler added, the device synchronised after every step) cannot run a step faster "
               "than the clean pass: where its 95% interval of the median lies wholly below the clean trials' "
               "(timing.judging_interval, widened to one more process where they ran quiet: timing.PROCESS_RULE), a "
               "clean process ran slow, and the case gets one more clean trial (the report's check 'capture not "
               "faster' holds the same comparison)")


def faster_capture(trials: list[dict[str, Any]], captures: dict[str, dict[str, Any]]) -> str | None:
    """The first capture pass of ``captures`` ({pass: its worker's result}) that ran faster than the clean
    ``trials`` beyond noise (``FASTER_RULE``), or None; a pass skipped, without two timed steps, or of the step
    without reduction (faster by design: dataparallel.NO_REDUCTION) is not held against them."""
    used = used_trials(trials)
    if not used:
        return None
    clean = timing.step_stats([t["step_times_s"] for t in used]).to_dict()
    clean_ci = timing.judging_interval(clean, between_processes=all(trial_contended(t) is False for t in used))
    if clean_ci is None:
        return None
    for name, result in captures.items():
        if name == dataparallel.NO_REDUCTION or "skipped" in result:
            continue
        ci = timing.capture_ci(result.get("step_times_s") or [])
        if ci is not None and timing.placement(ci, clean_ci) is timing.Placement.BELOW:
            return name
    return None


def repeat_budget_s(spent_s: float, budget_s: float | None) -> float:
    """Seconds the repeats may take: ``--repeat-budget``, else ``REPEAT_BUDGET_SHARE`` of the run so far."""
    return REPEAT_BUDGET_SHARE * spent_s if budget_s is None else budget_s
