"""kernelmap.history.trend alone: every saved benchmark as one table (``load_history``), the jobs in time
order (``job_axis``) and one series per key over them (``trend_series``), on synthetic saved runs whose
figures are known."""

from __future__ import annotations

import pytest

from kernelmap.history.keys import CONTENTION, JOB_KEY, STEPS_PER_ROUND, BenchKey
from kernelmap.history.storage import BenchStorage
from kernelmap.history.trend import HISTORY_COLUMNS, job_axis, load_history, trend_series

pytest.importorskip("pytest_benchmark")


def _bench(key: BenchKey, median: float, contended: bool | None = None) -> dict:
    extra = {**key.extra_info(), STEPS_PER_ROUND: 4}
    if contended is not None:
        extra[CONTENTION] = {"contended": contended, "text": "other processes used 1.7 of 2 cores" if contended else ""}
    return {"name": f"test_train_step[{key.id}]", "fullname": f"b.py::test_train_step[{key.id}]",
            "params": {"framework": key.framework, "mode": key.mode, "device": key.device, "batch_size": key.batch_size},
            "extra_info": extra, "stats": {"median": median, "mean": median, "min": median, "max": median,
                                            "stddev": 0.0, "iqr": 0.0, "ops": 1 / median, "rounds": 5}}


PT, MX = BenchKey("pytorch", "eager", "cpu", 64), BenchKey("mxnet", "imperative", "cpu", 64)


@pytest.fixture
def storage(tmp_path):
    st = BenchStorage(tmp_path / "st")
    for job, when, medians, contended in (("job-b", "2026-11-26T10:00:00+00:00", (0.02, 0.05), True),
                                          ("job-a", "2026-11-25T10:00:00+00:00", (0.01, 0.04), False)):
        data = {"machine_info": {}, "commit_info": {"id": "c0ffee"}, "datetime": when, JOB_KEY: job,
                "benchmarks": [_bench(PT, medians[0], contended), _bench(MX, medians[1])]}
        st.save(data, "m", st.tag(data))
    # a benchmark that records some key fields but not all: listed, never guessed
    old = {"machine_info": {}, "commit_info": {}, "datetime": "2026-11-24T10:00:00+00:00",
           "benchmarks": [{"name": "test_train_step[cpu-64]", "params": {"device": "cpu", "batch_size": 64},
                           "stats": {"median": 0.5}}]}
    st.save(old, "m", st.tag(old))
    return st.root


def test_load_history_is_one_row_per_saved_benchmark(storage):
    h = load_history(storage)
    assert list(h.columns) == HISTORY_COLUMNS and len(h) == 5
    keyed = h[h["key"].notna()].sort_values(["run", "framework"])
    assert keyed[["run", "job", "framework", "median"]].values.tolist() == [
        ["0001", "job-b", "mxnet", 0.05], ["0001", "job-b", "pytorch", 0.02],
        ["0002", "job-a", "mxnet", 0.04], ["0002", "job-a", "pytorch", 0.01]]
    assert keyed["steps_per_round"].tolist() == [4, 4, 4, 4]
    assert keyed["contended"].tolist() == [None, True, None, False]  # None: no contention recorded
    (old,) = h[h["unpaired"].notna()].itertuples()
    assert old.run == "0003" and old.unpaired == "records no framework, mode" and old.job is None


def test_the_trend_follows_time_not_run_numbers(storage):
    h = load_history(storage)
    axis = job_axis(h[h["key"].notna()])
    assert axis["point"].tolist() == ["job-a", "job-b"] and axis["x"].tolist() == [0, 1]  # job-a was saved second
    series = trend_series(h)
    assert sorted(series) == ["mxnet imperative cpu bs64", "pytorch eager cpu bs64"]
    pt = series["pytorch eager cpu bs64"]
    assert pt["value"].tolist() == [0.01, 0.02] and pt["job"].tolist() == ["job-a", "job-b"]
    assert pt["contended"].tolist() == [False, True]
    assert trend_series(h, "min")["mxnet imperative cpu bs64"]["value"].tolist() == [0.04, 0.05]
    assert trend_series(h[h["key"].isna()]) == {}
