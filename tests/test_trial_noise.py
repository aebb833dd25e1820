"""Noise between processes: whether a case's clean trials disagree (timing.trials_disagree: a U test of each trial
against the others, as google/benchmark's compare.py judges repetitions; no fixed percentage), how far they spread,
and which step comparisons lie within noise (reports/analyses/basis.trial_noise, step_noise, noise_statements).

Fixtures: tests/data/cpu_quiet_bench/results_all_cases.json.gz (the quiet sample job, 20 steps: 2 samples a trial,
which the old rule called "disagree" in all 6 cases) and tests/data/trial_noise (two 100-step runs: 10 a trial).
"""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path

import pytest
from kernelmap.reports import analysis as A
from kernelmap.reports.analyses import basis as B
from kernelmap.reports.analyses.summary import judged_trials, trial_samples

from kernelmap import timing, utest

DATA = Path(__file__).parent / "data"
QUIET = DATA / "cpu_quiet_bench" / "results_all_cases.json.gz"


def _quiet_results() -> list[dict]:
    return json.loads(gzip.open(QUIET).read())


def _entry(name: str) -> dict:
    return json.loads((DATA / "trial_noise" / name).read_text())[0]


def test_samples_are_cut_trial_by_trial():
    r = next(x for x in _quiet_results() if x["framework"] == "pytorch" and x["batch_size"] == 64)
    s = trial_samples(r)
    assert [len(t) for t in s] == [2] * 5 and sum(s, []) == r["step_times_s"]
    # each trial's median as results.json recorded it from its own samples
    assert [sum(t) / 2 for t in s] == pytest.approx([t["median_step_s"] for t in r["trials"] if t["used"]], rel=1e-12)
    assert trial_samples({**r, "step_times_s": r["step_times_s"][:-1]}) is None  # counts that do not add up


def test_two_samples_a_trial_are_never_judged_on_the_quiet_job():
    """The old rule called all 6 cases' trials disagreeing (2-sample 'intervals' apart by over 5%); a U test of a
    trial's 2 samples against the other 8 can reach p = 2 / C(10, 2) = 0.044 at best, above its share 0.05 / 5."""
    res = _quiet_results()
    assert [r["trials_disagree"] for r in res] == [True] * 6  # as the runner recorded them
    assert 2 / math.comb(10, 2) == utest.min_p(2, 8) > timing.TRIAL_ALPHA / 5
    assert 2 / math.comb(8, 2) == utest.min_p(2, 6) > timing.TRIAL_ALPHA / 4
    assert [judged_trials(r)[0] for r in res] == [None] * 6


def test_the_spread_of_the_quiet_jobs_trials():
    got = {(r["framework"], r["batch_size"]): timing.trial_spread(trial_samples(r)) for r in _quiet_results()}
    # by hand from results.json's trials: the used trials' medians, highest over lowest less one
    for r in _quiet_results():
        meds = [t["median_step_s"] for t in r["trials"] if t["used"]]
        g = got[(r["framework"], r["batch_size"])]
        assert g["spread_rel"] == pytest.approx(max(meds) / min(meds) - 1, rel=1e-12)
    assert {k: round(v["spread_rel"] * 100, 1) for k, v in got.items()} == {
        ("pytorch", 64): 59.0, ("pytorch", 256): 29.3, ("mxnet", 64): 24.3, ("mxnet", 256): 54.2,
        ("jax", 64): 41.0, ("jax", 256): 14.8}


def test_ten_samples_a_trial_are_judged_both_ways():
    """PyTorch: trial 2 (84.8-150.1 ms) against trials 1 and 3 (48.5-97.6 ms): p below 0.05 / 3, disagree.
    MXNet: its samples jump between ~24 and ~64 ms within every trial: no trial apart from the others."""
    pt, mx = trial_samples(_entry("pytorch_bs64_100steps.json")), trial_samples(_entry("mxnet_bs64_100steps.json"))
    assert [len(t) for t in pt] == [len(t) for t in mx] == [10, 10, 10]
    assert utest.p_value(pt[1], pt[0] + pt[2]) < timing.TRIAL_ALPHA / 3
    assert timing.trials_disagree(pt) is True
    assert all(utest.p_value(t, [x for u in mx if u is not t for x in u]) >= timing.TRIAL_ALPHA / 3 for t in mx)
    assert timing.trials_disagree(mx) is False


def test_no_fixed_percentage():
    """Two trials 1.8% apart with 0.1% noise each differ (the old rule's 5% floor said they agree); two trials 40%
    apart with 2 samples each cannot be told apart by a U test (the old rule said they disagree)."""
    a = [1.000 + 0.001 * math.sin(i) for i in range(20)]
    assert timing.trials_disagree([a, [x * 1.018 for x in a]]) is True
    assert timing.trials_disagree([a, a]) is False
    assert timing.trials_disagree([[1.0, 1.01], [1.4, 1.41]]) is None
    assert timing.trials_disagree([a]) is False and timing.trials_disagree([]) is False  # one trial: nothing to differ


def test_the_report_says_the_noise_and_which_steps_are_within_it(tmp_path):
    """The quiet job's MXNet part: its trials spread 24% and 54%, not tested; its steps against the reference."""
    d = tmp_path / "cpu_quiet_bench"
    shutil.copytree(DATA / "cpu_quiet_bench", d)
    run = A.load_run(d)
    noise = B.trial_noise([run])
    assert list(noise["trials_disagree"]) == [None, None]
    assert [round(x, 1) for x in noise["spread_pct"]] == [24.3, 54.2]
    assert all(w.startswith("not tested: too few samples a trial") for w in noise["why"])
    steps = B.step_noise([run])
    assert steps.empty  # one framework: no reference to stand against
    lines = B.noise_statements(noise, steps)
    assert lines == [
        "cpu_quiet_bench: the clean trials (each its own process) of 2 case(s) spread 24–54% between their medians "
        "(widest: MXNet bs 256, 37.76–58.23 ms); each step figure's 95% interval is over its trials and holds that "
        "spread",
        "cpu_quiet_bench: whether the trials differ beyond their own samples (U test) was not tested in 2 case(s): "
        "2 sample(s) a trial are too few"]
    summ = A.summary_table([run])
    assert summ["trials_disagree"].isna().all()  # re-judged by the current rule, not the recorded True


def _whole_job(tmp_path: Path, edit=None) -> A.Run:
    """The quiet job's results.json with all six cases (its manifest's cases as the entries name them)."""
    d = tmp_path / "quiet_job"
    shutil.copytree(DATA / "cpu_quiet_bench", d)
    res = _quiet_results()
    if edit:
        edit(res)
    (d / "results.json").write_text(json.dumps(res))
    man = json.loads((d / "manifest.json").read_text())
    man["config"]["cases"] = [{k: r[k] for k in ("framework", "mode", "math", "devices", "batch_size", "dir")}
                              for r in res]
    (d / "manifest.json").write_text(json.dumps(man))
    return A.load_run(d)


def test_step_comparisons_within_and_beyond_noise(tmp_path):
    """The whole quiet job's steps against PyTorch's: all 8 beyond noise as recorded; MXNet bs 64's wall-time
    interval moved onto PyTorch's comes out within noise, and the page's statement names it."""
    steps = B.step_noise([_whole_job(tmp_path / "a")])
    assert len(steps) == 8 and not steps["within_noise"].any() and not steps["busy"].any()
    assert set(steps["reference"]) == {"pytorch"} and set(steps["clock"]) == {"wall", "CPU"}
    mx = steps[(steps["framework"] == "mxnet") & (steps["batch_size"] == 64) & (steps["clock"] == "wall")].iloc[0]
    assert (round(mx["ms"], 2), round(mx["ref_ms"], 2)) == (16.69, 21.78)  # the summary's medians

    def onto_pytorch(res: list) -> None:
        next(r for r in res if r["framework"] == "mxnet" and r["batch_size"] == 64).update(
            ci95_low_s=0.019, ci95_high_s=0.020)
    run = _whole_job(tmp_path / "b", onto_pytorch)
    steps = B.step_noise([run])
    hit = steps[steps["within_noise"].astype(bool)]
    assert list(zip(hit["framework"], hit["batch_size"], hit["clock"], strict=True)) == [("mxnet", 64, "wall")]
    lines = B.noise_statements(B.trial_noise([run]), steps)
    assert lines[-1] == ("quiet_job: clean step against PyTorch's (wall and CPU time): 7 of 8 beyond noise (95% "
                         "intervals apart); within noise: MXNet bs 64 (wall)")


def test_one_trial_a_case_is_not_judged_and_the_gpu_has_no_cpu_time_comparison(tmp_path):
    """The real H200 run (tests/data/gpu_link_run/all: one trial of 20 steps a case): its step intervals are one
    process's, so no comparison is called within or beyond noise; no CPU-time row (the host's CPU time is not a GPU
    step's work); the page says so in one line."""
    d = tmp_path / "h200"
    shutil.copytree(DATA / "gpu_link_run" / "all", d)
    run = A.load_run(d)
    steps = B.step_noise([run])
    assert len(steps) == 6 and set(steps["clock"]) == {"wall"} and steps["within_noise"].isna().all()
    noise = B.trial_noise([run])
    assert noise["trials"].isna().all() and list(noise["trials_disagree"]) == [False] * 9  # one trial: nothing differs
    assert B.noise_statements(noise, steps) == [
        "h200: clean steps against PyTorch's not judged for noise: one trial (or no interval) a case, whose interval "
        "holds no noise between processes"]


def test_a_busy_run_says_its_wall_times_are_stretched_not_noise(tmp_path):
    """The real busy CPU run (tests/data/cpu_run_cputime: other processes used up to 1.8 of 2 cores): its trials
    spread 51-437%, and every comparison has a clean pass run busy, said so."""
    d = tmp_path / "busy"
    shutil.copytree(DATA / "cpu_run_cputime", d)
    run = A.load_run(d)
    steps = B.step_noise([run])
    assert len(steps) == 4 and steps["busy"].all()
    hit = steps[steps["within_noise"].astype(bool)]
    assert list(zip(hit["framework"], hit["clock"], strict=True)) == [("mxnet", "wall")]
    lines = B.noise_statements(B.trial_noise([run]), steps)
    assert lines[0].startswith("busy: the clean trials (each its own process) of 3 case(s) spread 51–437% between "
                               "their medians (widest: MXNet bs 64, 20.36–109.3 ms)")
    assert lines[-1] == ("busy: clean step against PyTorch's (wall and CPU time): 3 of 4 beyond noise (95% intervals "
                         "apart); within noise: MXNet bs 64 (wall); 4 of the 4 with a clean pass run on a busy machine "
                         "(its wall time stretched by other processes, not noise: read its CPU time)")
