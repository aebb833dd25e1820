"""Two self-checks at their bounds, where a check loosened by a wrong comparison would still pass
(each test was run against that mutation of reports/checks.py: see the commit that added it):

* ``traced steps`` with more traced steps than the pass timed: the warm-up steps of an MXNet run
  leaking into its profile (docs/checks.md: MXNet's profile also holds the warm-up steps' marks, which
  once halved every MXNet per-step figure). A check that took ``>=`` for ``==`` passes this.
* ``time within step`` just over its bound: summed op time per step 1% above the mean step. A check
  given a few percent of slack passes this.

Fixture: tests/data/cpu_run_all (CPU, PyTorch and MXNet, 5 timed steps of the framework pass after 5
warm-up steps), copied and normalised here; each test doctors its copy's raw trace or pass JSON.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from kernelmap.reports import analysis as A
from kernelmap.reports import checks as C

from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data"
MXNET_TRACE = Path("mxnet") / "bs64" / "trace.json.gz"


@pytest.fixture(scope="module")
def run_all(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bounds") / "cpu_run_all"
    shutil.copytree(DATA / "cpu_run_all", d)
    normalise_run_dir(d)
    return d


def _copy(src: Path, tmp_path: Path) -> Path:
    d = tmp_path / src.name
    shutil.copytree(src, d)
    return d


def _checks(d: Path):
    return C.self_checks([A.load_run(d)], None)


def _row(checks, check: str, fw: str):
    m = checks[(checks["check"] == check) & (checks["framework"] == fw)]
    assert len(m) == 1, m
    return m.iloc[0]


def _failed(checks) -> list[tuple[str, str, str]]:
    f = C.failed(checks)
    return list(zip(f["check"], f["framework"], f["subject"], strict=True))


def _step_marks(events: list) -> dict[int, tuple[int, int]]:
    """kernelmap:step#N -> (begin ts, end ts) of the MXNet profile's step regions."""
    marks: dict[int, list] = {}
    for e in events:
        name = e.get("name", "")
        if e.get("cat") == "event" and name.startswith("kernelmap:step#"):
            marks.setdefault(int(name.rsplit("#", 1)[1]), [None, None])[e["ph"] == "E"] = e["ts"]
    return {k: (b, e) for k, (b, e) in marks.items()}


def test_traced_steps_fails_when_warm_up_steps_leak_into_the_trace(run_all, tmp_path):
    """The profile of MXNet's framework pass holds the marks of all 10 steps (5 warm-up, 5 timed)
    and the ops of the timed ones (5-9). Here the last warm-up step (4) also holds ops: those of
    step 5, moved by the distance between the two steps' starts (inside step 4's region, before
    step 5 begins), as a profiler started before the warm-up records them. The trace then holds 6
    steps of model ops where the pass timed 5: ``traced steps`` fails (per-step figures would divide
    6 steps' work by 5), and only it: the extra step has the calls and time of a real one."""
    d = _copy(run_all, tmp_path)
    doc = json.loads(gzip.decompress((d / MXNET_TRACE).read_bytes()))
    ev = doc["traceEvents"]
    marks = _step_marks(ev)
    assert sorted(marks) == list(range(10))
    (b4, _), (b5, _), (b6, _) = marks[4], marks[5], marks[6]
    shift = b4 - b5
    assert b6 - b5 < -shift  # step 5's events fit before step 5 begins
    leaked = [dict(e, ts=e["ts"] + shift) for e in ev
              if "ts" in e and b5 <= e["ts"] < b6 and not (e.get("cat") == "event")]
    assert sum(e.get("cat") == "operator" for e in leaked) > 20
    doc["traceEvents"] = ev + leaked
    (d / MXNET_TRACE).write_bytes(gzip.compress(json.dumps(doc).encode()))
    normalise_run_dir(d)

    untouched = _row(_checks(run_all), C.Check.TRACED_STEPS, "mxnet")
    assert (untouched["expected"], untouched["measured"], untouched["status"]) == (5, 5, C.PASS)
    checks = _checks(d)
    r = _row(checks, C.Check.TRACED_STEPS, "mxnet")
    assert (r["expected"], r["measured"], r["status"]) == (5, 6, C.FAIL)
    assert "iterations [4, 5, 6, 7, 8, 9]" in r["detail"]
    assert _failed(checks) == [(C.Check.TRACED_STEPS, "mxnet", "mxnet_profiler")]


def _scale_steps(path: Path, mean_s: float) -> None:
    d = json.loads(path.read_text())
    st = np.asarray(d["step_times_s"])
    d["step_times_s"] = list(st * (mean_s / st.mean()))
    path.write_text(json.dumps(d))


@pytest.mark.parametrize("fw", ["pytorch", "mxnet"])
def test_time_within_step_fails_one_percent_over_and_passes_at_the_bound(run_all, tmp_path, fw):
    """The framework pass's mean step set to 99% of the summed op time per step: the work does not
    fit in the step, FAIL (a check with 5% slack passes it); set to 100.0001%: PASS."""
    busy = _row(_checks(run_all), C.Check.TIME_WITHIN_STEP, fw)["measured"]  # ms per step
    d = _copy(run_all, tmp_path)
    framework_json = d / fw / "bs64" / "framework.json"
    _scale_steps(framework_json, 0.99 * busy / 1e3)
    r = _row(_checks(d), C.Check.TIME_WITHIN_STEP, fw)
    assert r["status"] == C.FAIL
    assert r["expected"] == pytest.approx(0.99 * busy, rel=1e-9) and r["measured"] == busy
    _scale_steps(framework_json, 1.000001 * busy / 1e3)
    assert _row(_checks(d), C.Check.TIME_WITHIN_STEP, fw)["status"] == C.PASS
