"""A case whose capture pass ran faster than its clean trials beyond noise gets one more clean trial
(kernelmap/run/schedule.py: faster_capture, FASTER_RULE), on the worker results of a real GPU run whose report
failed "capture not faster" (tests/data/gpu_repeat_faster)."""

import copy
import json
from pathlib import Path

from kernelmap.frameworks import dataparallel

from kernelmap.run import schedule

DATA = json.loads((Path(__file__).parent / "data" / "gpu_repeat_faster" / "mxnet_fp16_bs64.json").read_text())
FASTER = "its framework pass ran faster than its clean trials beyond noise (a clean process ran slow)"


def _case():
    d = copy.deepcopy(DATA)
    return [d["clean-1"]], {p: d[p] for p in ("framework", "libs", "nsys")}


def test_the_real_slow_clean_trial_gets_a_repeat():
    trials, captures = _case()
    assert schedule.faster_capture(trials, captures) == "framework"
    assert schedule.repeat_reason(trials, 1, 0, 2, captures) == FASTER
    assert schedule.repeat_reason(trials, 1, 0, 2) is None  # what the run said before: no capture passes held
    assert schedule.repeat_reason(trials, 1, 0, 0, captures) is None  # --max-repeats 0: no repeat, as that run


def test_slower_passes_skipped_passes_and_the_step_without_reduction_are_not_held():
    trials, captures = _case()
    assert schedule.faster_capture(trials, {p: captures[p] for p in ("libs", "nsys")}) is None  # both slower
    fast = captures["framework"]
    assert schedule.faster_capture(trials, {dataparallel.NO_REDUCTION: fast}) is None  # faster by design
    assert schedule.faster_capture(trials, {"framework": {"skipped": "why"}, "nsys": captures["nsys"]}) is None
    assert schedule.faster_capture(trials, {"framework": {"step_times_s": fast["step_times_s"][:1]}}) is None


def test_a_pass_at_the_clean_speed_or_a_second_quiet_trial_ends_it():
    trials, captures = _case()
    clean = trials[0]["step_times_s"]
    same = {"framework": {"step_times_s": [clean[i % 2] for i in range(20)]}}
    assert schedule.faster_capture(trials, same) is None
    # the repeat ran at the framework pass's speed: two quiet processes 4.14 and 3.55 ms apart widen the clean
    # interval to one more process's (timing.PROCESS_RULE), which the framework pass now lies within
    second = {"trial": 2, "step_times_s": [0.003703, 0.003389], "contention": {"contended": False}}
    assert schedule.faster_capture([*trials, second], captures) is None
    assert schedule.repeat_reason([*trials, second], 1, 1, 2, captures) is None


def test_a_contended_clean_trial_is_not_widened_between_processes():
    trials, captures = _case()
    second = {"trial": 2, "step_times_s": [0.003703, 0.003389], "contention": {"contended": True}}
    # the quiet trial alone is used (schedule.used_trials): the framework pass is still faster than it
    assert schedule.faster_capture([*trials, second], captures) == "framework"
