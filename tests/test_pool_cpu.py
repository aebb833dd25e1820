"""Per-thread CPU time (kernelmap.cpusampler's THREADS_FILE) and XLA's pool work given to the thunk that scheduled
it (kernelmap.poolcpu): the sampler's per-thread rows against its own sum, each thread's stretches given to their
owners, and the pairing of trace threads with OS threads, each made to fail."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from kernelmap import cpusampler, poolcpu
from kernelmap.errors import KernelmapError


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@pytest.mark.parametrize("twin", [False, True], ids=["native", "twin"])
def test_per_thread_rows_sum_to_the_samples_and_hold_a_thread_idle_while_it_sleeps(tmp_path, twin):
    if not twin and cpusampler.native is None:
        pytest.skip("kernelmap._cpuclock is not built (python setup.py build_ext --inplace)")
    marks: dict[str, int] = {}

    def work() -> None:  # sleeps, then spins: its rows must not spread the spin over the sleep
        marks["sleep"] = time.monotonic_ns()
        time.sleep(0.08)
        marks["spin"] = time.monotonic_ns()
        _spin(0.06)
        marks["end"] = time.monotonic_ns()

    s = cpusampler.Sampler(tmp_path, twin=twin)
    s.start()
    time.sleep(0.02)
    th = threading.Thread(target=work)
    th.start()
    tid_box = th.native_id
    th.join()
    time.sleep(0.02)
    s.stop()
    samples = cpusampler.Samples.read(tmp_path / cpusampler.SAMPLES_FILE)
    threads = cpusampler.ThreadSamples.read(tmp_path / cpusampler.THREADS_FILE, samples)
    assert s.figures[cpusampler.THREADS_KEY] == cpusampler.THREADS_FILE
    assert str(tid_box) in s.figures[cpusampler.NAMES_KEY]
    m = samples.mono_ns
    starts, ends = m[[0, len(m) // 3, len(m) // 2]], m[[-1, 2 * len(m) // 3, -1]]
    assert threads.check(samples, starts, ends) == 0.0
    a, b, c = (np.asarray([marks[k]]) for k in ("sleep", "spin", "end"))
    slept = float(threads.between(tid_box, a + 5_000_000, b - 5_000_000)[0])
    spun = float(threads.between(tid_box, b, c)[0])
    assert slept < 0.005e9, slept  # interpolating between its first reading and the spin would give ~40 ms
    assert spun > 0.04e9, spun


def test_per_thread_file_errors_name_the_file(tmp_path):
    samples_path = tmp_path / cpusampler.SAMPLES_FILE
    np.save(samples_path, np.asarray([[0, 0, 0, 0], [10, 5, 1, 1]], dtype=np.int64))
    samples = cpusampler.Samples.read(samples_path)
    bad = tmp_path / cpusampler.THREADS_FILE
    np.save(bad, np.zeros((3, 4), dtype=np.int64))
    with pytest.raises(KernelmapError, match=str(bad)):
        cpusampler.ThreadSamples.read(bad, samples)
    np.save(bad, np.asarray([[0, 7, 5], [10, 7, 3]], dtype=np.int64))  # CPU time going back
    with pytest.raises(KernelmapError, match="go back in time or in CPU time"):
        cpusampler.ThreadSamples.read(bad, samples)


def _threads(series: dict[int, list[tuple[int, int]]]) -> cpusampler.ThreadSamples:
    return cpusampler.ThreadSamples({t: (np.asarray([p[0] for p in v], dtype=np.int64),
                                         np.asarray([p[1] for p in v], dtype=np.int64)) for t, v in series.items()})


# Two XLA threads: trace thread 1 (OS 101) dispatches dot X over [0, 10] and schedules a pool task from within it
# (record at 5); the task runs on trace thread 2 (OS 102) over [10, 50]; thread 1 runs fusion Y over [10, 50].
# Each OS thread works one core throughout its stretches, so X = 10 + 40, Y = 40; the summed samples cannot part
# the stretch [10, 50] (cpusampler.POOL_RULE withholds both).
NAMES = {1: "tf_XLAEigen/11", 2: "tf_XLAEigen/22", 9: "python"}
OPS = {"tid": np.asarray([1, 1]), "start": np.asarray([0, 10]), "running_end": np.asarray([10, 50]),
       "end": np.asarray([50, 50])}
NO_EXEC = {"tid": np.zeros(0, np.int64), "start": np.zeros(0, np.int64), "end": np.zeros(0, np.int64)}


def _tasks(rows, unpaired=0) -> poolcpu.PoolTasks:
    return poolcpu.PoolTasks(np.asarray(rows, dtype=np.int64).reshape(-1, 5), NAMES, unpaired, 0)


def test_a_pool_task_goes_to_the_thunk_that_scheduled_it():
    threads = _threads({101: [(0, 0), (50, 50)], 102: [(0, 0), (10, 0), (50, 40)], 100: [(0, 0), (50, 0)]})
    os_names = {100: "python", 101: "tf_XLAEigen", 102: "tf_XLAEigen"}
    got = poolcpu.attribute(threads, os_names, 100, _tasks([[2, 10, 50, 1, 5]]), OPS, NO_EXEC, 0, (0, 50))
    assert not got.why
    assert got.match.pairs == {1: 101, 2: 102}
    assert got.cpu_ns.tolist() == [50.0, 40.0]
    assert got.no_op_ns == 0.0
    # the task recorded within Y instead: it is Y's
    got = poolcpu.attribute(threads, os_names, 100, _tasks([[2, 10, 50, 1, 20]]), OPS, NO_EXEC, 0, (0, 50))
    assert got.cpu_ns.tolist() == [10.0, 80.0]
    # scheduled from within another task (nested), whose own record lies in X: X's
    nested = [[2, 10, 30, 1, 5], [2, 30, 50, 2, 20]]
    got = poolcpu.attribute(threads, os_names, 100, _tasks(nested), OPS, NO_EXEC, 0, (0, 50))
    assert got.cpu_ns.tolist() == [50.0, 40.0]
    # recorded where no op ran (the executor's start from the main thread): in no op
    got = poolcpu.attribute(threads, os_names, 100, _tasks([[2, 10, 50, 9, 3]]), OPS, NO_EXEC, 0, (0, 50))
    assert got.cpu_ns.tolist() == [10.0, 40.0] and got.no_op_ns == 40.0


def test_a_task_of_unknown_scheduler_leaves_the_ops_beside_it_without_a_figure():
    threads = _threads({101: [(0, 0), (50, 50)], 102: [(0, 0), (10, 0), (50, 40)]})
    os_names = {101: "tf_XLAEigen", 102: "tf_XLAEigen"}
    got = poolcpu.attribute(threads, os_names, 100, _tasks([[2, 10, 50, -1, -1]], unpaired=1), OPS, NO_EXEC, 0,
                            (0, 50))
    assert got.unsure.tolist() == [True, True]
    assert "1 pool tasks whose scheduling record" in got.describe()


def test_threads_are_paired_by_where_their_cpu_time_fell_and_left_unpaired_when_unclear():
    os_names = {101: "tf_XLAEigen", 102: "tf_XLAEigen"}
    # OS 101 worked over [10, 50] and 102 over [0, 10]: trace thread 1's spans are [0, 50], thread 2's [10, 50]
    swapped = _threads({102: [(0, 0), (10, 10), (50, 10)], 101: [(0, 0), (10, 0), (50, 40)]})
    busy = {1: (np.asarray([0]), np.asarray([10])), 2: (np.asarray([10]), np.asarray([50]))}
    m = poolcpu.match_threads(busy, NAMES, os_names, swapped, (0, 50), 100)
    assert m.pairs == {1: 102, 2: 101} and not m.why
    # both OS threads worked through both spans alike: no pairing leads
    alike = _threads({101: [(0, 0), (50, 50)], 102: [(0, 0), (50, 50)]})
    m = poolcpu.match_threads(busy, NAMES, os_names, alike, (0, 50), 100)
    assert "not told apart" in m.why
    # a trace thread without an OS thread of its name
    m = poolcpu.match_threads(busy, NAMES, {101: "tf_XLAEigen"}, alike, (0, 50), 100)
    assert "2 trace threads named 'tf_XLAEigen' against 1 OS threads" in m.why
    # a name over 15 characters (Linux refused it) is looked for among the threads named as the main thread
    long = {1: "tf_XLAPjRtCpuClient/1"}
    m = poolcpu.match_threads({1: busy[2]}, long, {100: "python", 101: "python"}, swapped, (0, 50), 100)
    assert m.pairs == {1: 101} and not m.why  # the main thread (100) is never a candidate


def test_a_pool_task_file_that_is_not_one_is_an_error_naming_it(tmp_path):
    p = tmp_path / poolcpu.POOL_TASKS_FILE
    p.write_text(json.dumps({"regions": [[1, 2, 3]], "threads": {}, "unpaired": 0, "unstopped": 0}))
    with pytest.raises(KernelmapError, match=str(p)):
        poolcpu.PoolTasks.read(p)
    p.write_text(json.dumps({"regions": [[1, 9, 3, 1, 1]], "threads": {}, "unpaired": 0, "unstopped": 0}))
    with pytest.raises(KernelmapError, match="stops before it starts"):
        poolcpu.PoolTasks.read(p)


def test_a_nested_thunks_cpu_time_is_its_ancestors_too():
    import pandas as pd
    from kernelmap.reports.analyses.opcpu import nested_into_outermost

    every = pd.DataFrame({"run": ["r"] * 4, "event_id": [1, 2, 3, 4],
                          "op_event_id": pd.array([None, 1, 2, None], dtype="Int64")})
    assert nested_into_outermost(every, np.asarray([1.0, 2.0, 4.0, 8.0])).tolist() == [7.0, 6.0, 4.0, 8.0]
