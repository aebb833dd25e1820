"""Scaling over devices (issue 39, reports/analyses/scaling.py): each multi-device case against the same framework,
mode and math on one device at the same global batch, efficiency = t1 / (N · tN) from the clean pass. On a real CPU
run (tests/data/cpu_scaling_run: `kernelmap run --framework all --device cpu --devices 1 2 --steps 20 --warmup 2
--batch-size 32 --data synthetic --trials 2 --max-repeats 0`, this 2-core machine, busy; its results.json and
manifest.json), figures checked against results.json read with the standard library; the check passes there and fails
where the work differs or (on the GPU) N devices are more than N times faster beyond the intervals; the report's
first screen puts the frameworks side by side."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from kernelmap.reports import commchecks
from kernelmap.reports.analyses import scaling as SC
from kernelmap.reports.checkrows import FAIL, NOT_CHECKED, PASS, Check

RUN = Path(__file__).parent / "data" / "cpu_scaling_run"
FRAMEWORKS = ("jax", "mxnet", "pytorch")


@pytest.fixture(scope="module")
def run():
    from kernelmap.reports.cli import load_runs

    return load_runs([str(RUN)])[0]


def _raw() -> dict[tuple[str, int], dict]:
    return {(e["framework"], e["devices"]): e for e in json.loads((RUN / "results.json").read_text())}


def test_efficiency_is_one_device_step_over_n_times_the_n_device_step(run):
    t = SC.scaling([run])
    raw = _raw()
    assert sorted(zip(t["framework"], t["devices"], strict=True)) == sorted(raw)
    for fw in FRAMEWORKS:
        one, two = raw[(fw, 1)], raw[(fw, 2)]
        row = t[(t["framework"] == fw) & (t["devices"] == 2)].iloc[0]
        assert row["efficiency"] == pytest.approx(one["median_step_s"] / (2 * two["median_step_s"]), rel=1e-12)
        assert row["speedup"] == pytest.approx(one["median_step_s"] / two["median_step_s"], rel=1e-12)
        assert row["efficiency_low"] == pytest.approx(one["ci95_low_s"] / (2 * two["ci95_high_s"]), rel=1e-12)
        assert row["efficiency_high"] == pytest.approx(one["ci95_high_s"] / (2 * two["ci95_low_s"]), rel=1e-12)
        assert row["one_device_case"] == one["dir"] and row["batch_size"] == one["batch_size"] == 32
        assert bool(row["busy"]) == (one["contention"]["contended"] or two["contention"]["contended"]) is True
    wide = SC.side_by_side(t)
    assert wide["devices"].tolist() == [1, 2] and {"JAX", "MXNet", "PyTorch"} <= set(wide.columns)
    assert wide.loc[0, "PyTorch"].startswith("1.00 (")


def _checks(table: pd.DataFrame) -> dict[str, dict]:
    return {r["subject"]: r for r in commchecks.scaling_checks("run", table)}


def test_the_check_passes_on_the_real_run(run):
    got = [r for r in commchecks.comm_checks(run) if r["check"] == Check.SCALING]
    assert len(got) == 3 and {r["status"] for r in got} == {PASS}
    assert all("not a scaling figure" in r["detail"] and "BUSY" in r["detail"] for r in got)


def test_other_work_fails_the_check(run):
    t = SC.scaling([run])
    t.loc[(t["framework"] == "mxnet") & (t["devices"] == 2), "steps"] = 10
    got = _checks(t)
    assert got["mxnet-x2/bs32"]["status"] == FAIL and "not the same work" in got["mxnet-x2/bs32"]["detail"]
    assert got["jax-x2/bs32"]["status"] == PASS


def test_superlinear_beyond_the_intervals_fails_on_the_gpu(run):
    t = SC.scaling([run]).assign(device="gpu")
    n2 = t["devices"] == 2
    assert _checks(t)["jax-x2/bs32"]["status"] == (FAIL if t.loc[n2 & (t["framework"] == "jax"), "efficiency_low"]
                                                   .iloc[0] > 1 else PASS)
    t.loc[n2, "efficiency_low"] = 1.2  # N devices surely more than N times faster
    assert {r["status"] for r in _checks(t).values()} == {FAIL}
    t.loc[n2, "efficiency_low"] = 0.99
    assert {r["status"] for r in _checks(t).values()} == {PASS}


def test_without_a_one_device_case_it_is_not_checked(run):
    t = SC.scaling([run])
    t.loc[t["devices"] == 2, "one_device_case"] = None
    got = _checks(t)
    assert {r["status"] for r in got.values()} == {NOT_CHECKED}
    assert "--devices 1 2" in got["pytorch-x2/bs32"]["detail"]


def test_the_first_screen_puts_the_frameworks_side_by_side(tmp_path):
    from kernelmap.reports import cli

    shutil.copytree(RUN, tmp_path / "run")
    out, _ = cli.build([str(tmp_path / "run")], tmp_path / "report")
    page = (out / "report.html").read_text()
    assert page.index('id="devices"') < page.index('id="answer"')  # before the per-layer answer
    scaled = pd.read_csv(out / "tables" / "scaling.csv")
    assert len(scaled) == 6 and set(scaled["devices"]) == {1, 2}
    assert cli.devices_screen(scaled.iloc[0:0]) == {"devices_html": ""}  # one device only: no section


def test_without_intervals_the_figure_is_still_checked_for_its_work(run):
    """Too few samples for a 95% interval (one block a trial): the efficiency stands, its interval says why not."""
    t = SC.scaling([run]).assign(device="gpu", efficiency_low=None, efficiency_high=None)
    got = _checks(t)
    assert {r["status"] for r in got.values()} == {PASS}
    assert all("no 95% interval" in r["detail"] for r in got.values())
