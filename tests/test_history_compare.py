"""kernelmap.history.compare alone, on synthetic saved runs whose figures are known: pairing like with
like, the deltas, thresholds and the noise test, and ``kernelmap compare``'s exit codes (0 unchanged or
nothing earlier yet, 1 a regression, 2 nothing pairs)."""

from __future__ import annotations

import argparse
import json

import pytest
from test_history_trend import MX, PT, _bench

from kernelmap.errors import KernelmapError
from kernelmap.history import compare
from kernelmap.history.keys import JOB_KEY
from kernelmap.history.storage import BenchStorage, list_runs, pick_runs

pytest.importorskip("pytest_benchmark")


def _save(st: BenchStorage, job: str, when: str, benches: list[dict]) -> None:
    data = {"machine_info": {}, "commit_info": {"id": job}, "datetime": when, JOB_KEY: job, "benchmarks": benches}
    st.save(data, "m", st.tag(data))


def _sampled(key, median: float, spread: float = 0.0) -> dict:
    b = _bench(key, median)
    b["stats"]["data"] = [median * (1 + spread * (i - 3.5) / 3.5) for i in range(8)]
    return b


def _main(*argv: str) -> int:
    p = argparse.ArgumentParser()
    compare.add_arguments(p)
    return compare.main(p.parse_args(list(argv)))


def test_like_with_like_and_the_deltas(tmp_path):
    st = BenchStorage(tmp_path / "st")
    _save(st, "job-1", "2026-11-25T10:00:00+00:00", [_sampled(PT, 0.010, 0.01), _sampled(MX, 0.040, 0.01)])
    _save(st, "job-2", "2026-11-26T10:00:00+00:00", [_sampled(PT, 0.012, 0.01), _sampled(MX, 0.040, 0.01)])
    runs = list_runs(st.root)
    cmp = compare.compare_runs(pick_runs(runs, "1"), pick_runs(runs, "2"), [compare.Threshold.parse("median:5%")])
    t = cmp.table.set_index("framework")
    assert t.loc["pytorch", "median_delta"] == pytest.approx(0.002)
    assert t.loc["pytorch", "median_rel"] == pytest.approx(0.2) and t.loc["mxnet", "median_rel"] == 0
    # 8 samples a side, disjoint: the change is called (p < NOISE_ALPHA), and only PyTorch's
    assert t.loc["pytorch", "p_value"] < compare.NOISE_ALPHA
    assert cmp.failed and len(cmp.failures) == 1 and cmp.failures[0].startswith("test_train_step[pytorch-eager-cpu-64]")
    assert "+20.00% exceeds median:5%" in cmp.failures[0]
    text = compare.format_comparison(cmp)
    assert "FAILED: 1 regression(s) beyond median:5%" in text and "(+20.0%)" in text
    assert _main("--storage", str(st.root), "--fail", "median:5%") == 1
    assert _main("--storage", str(st.root), "--fail", "median:25%") == 0


def test_past_the_threshold_within_the_noise_is_not_a_change(tmp_path):
    st = BenchStorage(tmp_path / "st")
    _save(st, "job-1", "2026-11-25T10:00:00+00:00", [_sampled(PT, 0.010, 0.5)])
    _save(st, "job-2", "2026-11-26T10:00:00+00:00", [_sampled(PT, 0.0106, 0.5)])  # +6%, samples overlapping
    cmp = compare.compare_storage(st.root, thresholds=[compare.Threshold.parse("median:5%")])
    assert not cmp.failed and len(cmp.within_noise) == 1 and "within the samples' noise" in cmp.within_noise[0]


def test_nothing_earlier_and_nothing_pairs(tmp_path, capsys):
    st = BenchStorage(tmp_path / "st")
    _save(st, "job-1", "2026-11-25T10:00:00+00:00", [_sampled(PT, 0.010)])
    assert _main("--storage", str(st.root), "--json") == 0  # the first job: nothing earlier yet
    out = json.loads(capsys.readouterr().out)
    assert out["nothing_earlier"].startswith("nothing earlier to compare yet") and out["benchmarks"] == []
    _save(st, "job-2", "2026-11-26T10:00:00+00:00", [_sampled(MX, 0.040)])
    with pytest.raises(compare.NothingToCompare, match=r"BASE 0001 holds .*pytorch.*; NEW 0002 holds .*mxnet"):
        _main("--storage", str(st.root), "0001", "0002")
    assert compare.NothingToCompare.exit_code == 2


def test_a_threshold_is_read_as_pytest_benchmark_reads_it():
    assert str(compare.Threshold.parse("mean:5%")) == "mean:5%" and compare.Threshold.parse("mean:5%").value == 0.05
    assert str(compare.Threshold.parse(" min : 0.001 ")) == "min:0.001s"
    for bad in ("ops:5%", "rounds:1", "mean", "mean:x%"):
        with pytest.raises(KernelmapError, match="--fail"):
            compare.Threshold.parse(bad)
