"""The workers' own CPU time beside wall time (timing.CPU_METHOD): what it counts and what it does not."""

from __future__ import annotations

import time

import pytest
from test_worker import FakeWorkload, _run

from kernelmap import timing

STEP_S = 0.004


def _spin():
    end = time.perf_counter() + STEP_S
    while time.perf_counter() < end:
        pass


def test_a_step_that_waits_costs_wall_time_not_cpu_time(tmp_path):
    """A step that sleeps (what waiting for a core looks like from inside) adds wall time, not CPU time; a
    step that computes adds both: the CPU clock is the one a neighbour barely moves."""
    waits = _run(FakeWorkload(n_train=10_000, on_step=lambda: time.sleep(STEP_S)), tmp_path, steps=20)
    works = _run(FakeWorkload(n_train=10_000, on_step=_spin), tmp_path, steps=20)
    for r in (waits, works):
        assert len(r[timing.CPU_SAMPLES]) == len(r["step_times_s"]) == len(r[timing.MAIN_THREAD_SAMPLES]) == 2
        assert r["cpu_timing"] == timing.CPU_METHOD
    assert min(waits["step_times_s"]) >= STEP_S
    assert max(waits[timing.CPU_SAMPLES]) < STEP_S / 4
    assert min(works[timing.CPU_SAMPLES]) > STEP_S * 0.8
    assert min(works[timing.MAIN_THREAD_SAMPLES]) > STEP_S * 0.8


def test_cpu_figure_pools_trials_like_the_wall_figure():
    trials = [{timing.CPU_SAMPLES: [0.010, 0.011, 0.012], timing.MAIN_THREAD_SAMPLES: [0.009, 0.010, 0.011],
               "threads": {"env": {"OMP_WAIT_POLICY": "PASSIVE"}}},
              {timing.CPU_SAMPLES: [0.013, 0.014], timing.MAIN_THREAD_SAMPLES: [0.012, 0.013]}]
    f = timing.cpu_figure(trials)
    same = timing.step_stats([[0.010, 0.011, 0.012], [0.013, 0.014]]).to_dict()
    assert {k: f[k] for k in same} == same
    assert f["median_step_s"] == pytest.approx(0.012)
    assert f["main_thread_median_step_s"] == pytest.approx(0.011)
    assert f["clock"] == timing.CPU_CLOCK and f["wait_policy"] == "PASSIVE"
    # a trial without CPU time (a worker older than it): no figure rather than one from some trials
    assert timing.cpu_figure([*trials, {"step_times_s": [0.01]}]) is None
    assert timing.cpu_figure([]) is None
