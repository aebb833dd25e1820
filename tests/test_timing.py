"""kernelmap.timing: the step figure, its interval, the noise flag and the overhead verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernelmap import timing
from kernelmap.timing import OverheadVerdict


def test_blocks_cover_the_steps_exactly():
    assert timing.blocks(25, 10) == [10, 10, 5]
    assert timing.blocks(20, 10) == [10, 10]
    assert timing.blocks(3, 10) == [3]
    assert timing.blocks(0, 10) == []
    with pytest.raises(ValueError):
        timing.blocks(5, 0)


def test_step_stats_pools_trials():
    trials = [[1.0, 2.0, 3.0], [4.0, 5.0], [6.0]]
    s = timing.step_stats(trials)
    assert s.median_s == 3.5 and s.n_trials == 3 and s.n_samples == 6
    assert s.trial_medians_s == (2.0, 4.5, 6.0)
    assert s.q25_s == pytest.approx(np.percentile([1, 2, 3, 4, 5, 6], 25))
    assert s.ci95_low_s <= s.median_s <= s.ci95_high_s
    d = s.to_dict()
    assert d["iqr_step_s"] == pytest.approx(s.q75_s - s.q25_s) and d["noisy"] is True  # huge spread


def test_interval_is_deterministic_and_widens_when_trials_disagree():
    rng = np.random.default_rng(0)
    base = [list(1.0 + 0.001 * rng.standard_normal(30)) for _ in range(3)]
    same = timing.step_stats(base)
    assert same == timing.step_stats(base)  # fixed bootstrap seed
    assert same.half_width_rel < 0.01 and same.noisy is False
    shifted = timing.step_stats([base[0], base[1], [x * 1.2 for x in base[2]]])
    assert shifted.half_width_rel > 5 * same.half_width_rel


def test_single_sample_has_no_interval():
    s = timing.step_stats([[0.002]])
    assert s.ci95_low_s is None and s.half_width_rel is None and s.noisy is None
    assert timing.overhead_verdict(0.003, 50, s.to_dict()) is OverheadVerdict.NO_INTERVAL
    with pytest.raises(ValueError):
        timing.step_stats([[]])


def test_overhead_verdict():
    clean = {"ci95_low_s": 0.98, "ci95_high_s": 1.02}
    assert timing.overhead_verdict(1.05, 20, clean) is OverheadVerdict.ABOVE
    assert timing.overhead_verdict(1.01, 20, clean) is OverheadVerdict.WITHIN
    assert timing.overhead_verdict(0.90, 20, clean) is OverheadVerdict.BELOW
    assert timing.overhead_verdict(1.50, timing.MIN_CAPTURE_STEPS - 1, clean) is OverheadVerdict.TOO_FEW_STEPS
    assert str(OverheadVerdict.WITHIN) == "within noise"


def test_no_gc_turns_the_collector_off_inside_and_restores_it():
    import gc

    from kernelmap.gcpause import no_gc

    assert gc.isenabled()
    with no_gc(collect=True):
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with no_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a caller's own choice is kept
    finally:
        gc.enable()


def test_intervals_overlap():
    # the H100 reference loop of 2026-11-23, bs 256: bare 2.512 ms, clean 2.832 [2.570-3.168]
    assert not timing.intervals_overlap((2.40, 2.56), (2.570, 3.168))
    assert timing.intervals_overlap((2.40, 2.60), (2.570, 3.168))
    assert timing.intervals_overlap((2.570, 3.168), (2.40, 2.60))  # symmetric
    assert timing.intervals_overlap((1.0, 2.0), (2.0, 3.0))  # a shared end point
    assert timing.intervals_overlap((1.0, 4.0), (2.0, 3.0))  # one inside the other


def test_placement_of_one_interval_against_another():
    """The one comparison behind every "beyond noise" verdict (capture pass, pair of passes, CPU time, diff's
    step, the repeat rule): wholly below, sharing a point, wholly above."""
    clean = (2.570, 3.168)
    assert timing.placement((2.40, 2.56), clean) is timing.Placement.BELOW
    assert timing.placement((2.40, 2.57), clean) is timing.Placement.WITHIN  # a shared end point
    assert timing.placement((3.0, 3.3), clean) is timing.Placement.WITHIN
    assert timing.placement((3.169, 3.3), clean) is timing.Placement.ABOVE
    assert timing.placement(clean, (2.40, 2.56)) is timing.Placement.ABOVE  # the mirror


def test_capture_ci_is_one_trials_interval():
    rng = np.random.default_rng(1)
    samples = list(1.0 + 0.01 * rng.standard_normal(40))
    lo, hi = timing.capture_ci(samples)
    assert (lo, hi) == timing.median_ci([samples])
    assert lo < float(np.median(samples)) < hi and hi - lo < 0.02
    assert timing.capture_ci([0.5]) is None


def test_trials_disagree_by_a_u_test_of_each_trial_against_the_others():
    """timing.TRIALS_DISAGREE_RULE (tests/test_trial_noise.py has the real runs)."""
    rng = np.random.default_rng(2)
    a = list(1.000 + 0.001 * rng.standard_normal(30))
    b = list(1.000 + 0.001 * rng.standard_normal(30))
    far = [x + 0.06 for x in b]  # 6% slower, noise 0.1%
    near = [x + 0.04 for x in b]  # 4% slower: beyond 30 samples' noise too (no fixed percentage any more)
    assert timing.trials_disagree([a, b]) is False
    assert timing.trials_disagree([a, near]) is True
    assert timing.trials_disagree([a, far]) is True
    assert timing.trials_disagree([a, b, far]) is True  # one trial apart from the others is enough
    assert timing.trials_disagree([far, a]) is True  # either order
    assert timing.trials_disagree([a]) is False and timing.trials_disagree([]) is False
    assert timing.trials_disagree([a, [2.0]]) is None  # one sample against 30: an exact test reaches 2/31 at best
    assert timing.trials_disagree([[1.0, 1.1], [2.0, 2.1]]) is None  # 2 against 2: p >= 1/3 whatever they hold


def test_process_interval_is_a_t_prediction_interval():
    """t(n-1) x s x sqrt(1 + 1/n) around the centre: trials 1, 2, 3 ms (s = 1 ms), t(2) = 4.303."""
    lo, hi = timing.process_interval([1.0, 2.0, 3.0], 2.5)
    half = 4.303 * 1.0 * math.sqrt(1 + 1 / 3)
    assert (lo, hi) == pytest.approx((2.5 - half, 2.5 + half), rel=1e-12)
    assert timing.process_interval([1.0], 1.0) is None
    assert timing.t975(1) == 12.706 and timing.t975(11) == 2.228 and timing.t975(500) == 1.96


def test_judging_interval_widens_only_between_processes():
    clean = {"ci95_low_s": 1.9, "ci95_high_s": 2.1, "median_step_s": 2.0, "trial_medians_s": [1.0, 2.0, 3.0]}
    half = 4.303 * math.sqrt(1 + 1 / 3)
    assert timing.judging_interval(clean) == pytest.approx((2.0 - half, 2.0 + half))
    assert timing.judging_interval(clean, between_processes=False) == (1.9, 2.1)
    # one trial: nothing to widen by; no interval: None
    assert timing.judging_interval({**clean, "trial_medians_s": [2.0]}) == (1.9, 2.1)
    assert timing.judging_interval({**clean, "ci95_low_s": None}) is None
    # the overhead verdict follows it: 1.5 s is below the clean interval, inside the widened one
    assert timing.overhead_verdict(1.5, 50, clean) == timing.OverheadVerdict.WITHIN
    assert timing.overhead_verdict(1.5, 50, clean, between_processes=False) == timing.OverheadVerdict.BELOW


def _median_ci_by_definition(trials, confidence=timing.CONFIDENCE, resamples=timing.BOOTSTRAP_RESAMPLES,
                             seed=timing.BOOTSTRAP_SEED):
    """The bootstrap as its docstring defines it, one resample at a time: trials, then samples within each."""
    arrays = [np.asarray(t, dtype=np.float64) for t in trials if len(t)]
    if sum(len(a) for a in arrays) < 2:
        return None
    rng = np.random.default_rng(seed)
    meds = np.empty(resamples)
    for i in range(resamples):
        picked = rng.integers(0, len(arrays), size=len(arrays)) if len(arrays) > 1 else np.zeros(1, dtype=int)
        meds[i] = np.median(np.concatenate([arrays[j][rng.integers(0, len(arrays[j]), size=len(arrays[j]))]
                                            for j in picked]))
    lo, hi = np.quantile(meds, [(1 - confidence) / 2, 1 - (1 - confidence) / 2])
    return float(lo), float(hi)


def test_median_ci_is_the_bootstrap_by_definition_exactly():
    """median_ci draws the resamples together and takes their medians in blocks (7x faster self-checks on
    report_cpu_run: 39 s -> 5.5 s); its intervals are the one-at-a-time bootstrap's to the bit, on a real run's
    step samples (every trial of every case of report_cpu_run, alone and pooled) and on ties and short trials."""
    import json
    from pathlib import Path

    results = json.loads((Path(__file__).parent / "data" / "report_cpu_run" / "results.json").read_text())
    trials = [[r["step_times_s"]] for r in results if r.get("step_times_s")]
    trials += [[r["step_times_s"][:7], r["step_times_s"][7:]] for r in results if len(r.get("step_times_s", ())) > 9]
    trials += [[[1.0, 1.0, 2.0]], [[0.5], [0.7, 0.9]], [[3.0]], [[], [2.0, 1.0]], [[1.0, 2.0], [2.0], [1.0, 1.0, 3.0]]]
    assert len(trials) > 10
    for t in trials:
        assert timing.median_ci(t) == _median_ci_by_definition(t), t
