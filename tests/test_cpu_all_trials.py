"""The clean pass's CPU time over every clean trial (reports/analyses/basis.CPU_ALL_TRIALS): CPU time is the clock
read on a busy machine, so the trials left out of the wall-time figure for running busy stay in it.

Fixture: tests/data/cpu_busy_trials, PyTorch bs 64 of bench job 20261127T080924Z on the shared 2-core VM: trial 1
quiet (the wall-time figure's one used trial), trials 2-5 busy; the framework and libs passes busy. Figures checked
against the trial files read with the standard library.
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest
from kernelmap.reports import analysis as A
from kernelmap.reports.analyses.basis import UNEVEN_STRETCH, Agreement, clean_cpu_figure, cpu_states

DATA = Path(__file__).parent / "data" / "cpu_busy_trials"
RUN = "cpu_busy_trials"


def _trial_samples() -> list[list[float]]:
    return [json.loads((DATA / "pytorch" / "bs64" / f"clean-{n}.json").read_text())["cpu_step_times_s"]
            for n in range(1, 6)]


def _states(d: Path = DATA) -> dict:
    return {k[3]: s for k, s in cpu_states([A.load_run(d)]).items()}


def test_the_clean_cpu_figure_pools_every_trial():
    r = json.loads((DATA / "results.json").read_text())[0]
    assert [t["trial"] for t in r["trials"] if t["used"]] == [1]  # the wall-time figure: the quiet trial alone
    assert r["cpu_time"]["n_trials"] == 1 and round(r["cpu_time"]["median_step_s"] * 1e3, 1) == 27.1
    fig = clean_cpu_figure(A.load_run(DATA), r)
    samples = _trial_samples()
    assert fig["n_trials"] == 5 and fig["n_samples"] == sum(len(s) for s in samples)
    assert fig["trial_medians_s"] == pytest.approx([statistics.median(s) for s in samples], rel=1e-12)
    assert [round(statistics.median(s) * 1e3, 1) for s in samples] == [27.1, 38.8, 31.4, 32.9, 32.4]
    assert fig["median_step_s"] == pytest.approx(statistics.median([x for s in samples for x in s]), rel=1e-12)


def test_a_capture_pass_is_held_against_every_trial():
    """The framework pass took 37.68 ms CPU a step: 1.39x the quiet trial alone ("its profiler's own work"), within
    the five trials' noise; the whole-step figure is the five trials' and says they ran busy."""
    s = _states()
    fw = s["framework"]
    assert round(fw.cpu_median_s * 1e3, 2) == 37.68 and fw.agreement is Agreement.AGREES
    assert s["libs"].agreement is Agreement.AGREES
    assert round(s["clean"].cpu_median_s * 1e3, 2) == round(fw.clean["median_step_s"] * 1e3, 2) == 32.38
    assert s["clean"].why_not() == "" and s["clean"].busy.contended is True
    assert s["clean"].busy.text == "4 of 5 trials: other processes used up to 1.6 of 2 cores"


def test_a_busy_capture_pass_gives_no_layer_ratio():
    """Its layers' CPU times are shares of its traced wall time, which a neighbour stretches unevenly: withheld."""
    fw = _states()["framework"]
    assert fw.busy.contended is True and fw.why_not() == (
        f"PyTorch's framework pass ran on a busy machine (other processes used 1.6 of 2 cores): {UNEVEN_STRETCH}")


def _quiet_doubled(tmp_path: Path) -> Path:
    """A copy whose framework pass is marked quiet and its CPU figure doubled."""
    d = tmp_path / RUN
    shutil.copytree(DATA, d)
    res = json.loads((d / "results.json").read_text())
    fw = res[0]["passes"]["framework"]
    fw["contention"] = {"contended": False, "text": "quiet"}
    for k in ("median_step_s", "ci95_low_s", "ci95_high_s"):
        fw["cpu_time"][k] *= 2
    (d / "results.json").write_text(json.dumps(res))
    return d


def test_a_pass_that_took_more_cpu_than_every_trial_is_still_withheld(tmp_path):
    """A quiet framework pass's CPU figure doubled: beyond the five trials' noise, withheld, saying by how much."""
    fw = _states(_quiet_doubled(tmp_path))["framework"]
    assert fw.agreement is Agreement.SLOWER
    assert fw.why_not() == "PyTorch's framework pass took 2.33x its clean pass's CPU time (its profiler's own work)"


def test_without_the_trial_files_the_recorded_figure_stands(tmp_path):
    d = tmp_path / RUN
    shutil.copytree(DATA, d)
    (d / "pytorch" / "bs64" / "clean-3.json").unlink()
    r = json.loads((d / "results.json").read_text())[0]
    assert clean_cpu_figure(A.load_run(d), r) == r["cpu_time"]
    assert _states(d)["framework"].agreement is Agreement.SLOWER  # 1.39x the quiet trial alone
    assert _states(d)["clean"].busy.contended is False  # the recorded figure's one quiet trial
