"""benches/repeats.py on the summaries of three real `kernelmap run`s (H100, 2026-11-23, PyTorch,
fashion-mnist, 200 steps, bs 64 and 256, 3 trials each) and on a run that was stopped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import bench_module

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "gpu_repeats"


@pytest.fixture(scope="module")
def repeats():
    return bench_module("repeats")


def _paths():
    return [str(p) for p in sorted(DATA.glob("repeat*.json"))]


def test_agreement_of_three_h100_runs(repeats):
    summaries, problems = repeats.load(_paths())
    assert problems == [] and len(summaries) == 3
    table = repeats.agreement(summaries)
    assert sorted(table) == [("pytorch", 64), ("pytorch", 256)]
    # step medians as each run's summary gives them (ms): 1.908, 2.095, 2.124 and 1.784, 2.140, 2.336
    meds64 = [r["median_step_s"] for r in table[("pytorch", 64)]["runs"]]
    assert [round(m * 1e3, 3) for m in meds64] == [1.908, 2.095, 2.124]
    # spread = max |x - median of the runs| / median: (2.095 - 1.908) / 2.095 and (2.140 - 1.784) / 2.140
    assert table[("pytorch", 64)]["spread"] == pytest.approx((meds64[1] - meds64[0]) / meds64[1])
    assert round(table[("pytorch", 64)]["spread"], 3) == 0.089
    assert round(table[("pytorch", 256)]["spread"], 3) == 0.166
    text = repeats.format_agreement(table)
    assert "pytorch bs 64: 1.908 [1.727-2.052], 2.095 [1.796-2.273], 2.124 [2.071-2.213]; spread 8.9%" in text


def test_a_stopped_run_is_named_not_skipped(repeats, tmp_path, capsys):
    stopped = tmp_path / "repeat4.json"
    stopped.write_text(json.dumps({"error": "terminated", "type": "KeyboardInterrupt"}))  # what a stopped run prints
    empty = tmp_path / "repeat5.json"
    empty.write_text("")
    rc = repeats.main(_paths() + [str(stopped), str(empty), str(tmp_path / "missing.json")])
    out, err = capsys.readouterr()
    assert rc == 1
    assert "pytorch bs 256:" in out  # the runs that hold results are still compared
    assert f"repeats: {stopped}: the run failed: terminated" in err
    assert f"repeats: {empty}: empty" in err
    assert "missing.json: no such file" in err


def test_no_results_at_all_exits_1(repeats, tmp_path, capsys):
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"results": [], "exit_code": 1}))
    assert repeats.main([str(p)]) == 1
    assert "no results in the summary" in capsys.readouterr().err
