"""The glibc malloc settings (``timing.ALLOC_ENV``) with the saved step benchmarks: each benchmark's process records
them in its ``extra_info`` (benches/conftest.py, through pytest-benchmark's own json hook), and ``kernelmap compare``
and the trend say where two saved runs differ in them (the step at e894c6d: MXNet's CPU step faulted fresh pages
without them, docs/timing.md "Memory"). The saved runs are the real bench jobs of tests/data/bench_jobs, saved
before the settings were recorded; the second job's benchmarks are given the settings as the hook records them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_history import FRAMEWORK_ORDER, JOB_IDS, KEYS, MACHINE, _part

from kernelmap import timing
from kernelmap.history.compare import Threshold, compare_storage, format_comparison
from kernelmap.history.job import save_job
from kernelmap.history.keys import MALLOC_INFO
from kernelmap.history.trend import load_history, trend_series

ROOT = Path(__file__).resolve().parents[1]
SET = dict(timing.ALLOC_ENV)  # as recorded where the benchmarks' process applied them (mallopt or environment)
SET_TEXT = " ".join(f"{k}={v}" for k, v in sorted(SET.items()))
TINY = '''
from kernelmap.history.keys import BenchKey

def test_step(benchmark):
    benchmark.extra_info.update(BenchKey("tiny", "eager", "cpu", 8).extra_info())
    benchmark(sum, range(800))
'''


def _bench_json(tmp_path: Path, env: dict[str, str]) -> dict:
    """A tiny benchmark run by pytest with the step benchmarks' conftest (benches/conftest.py), its json."""
    root = tmp_path / "bench"
    root.mkdir(parents=True)
    shutil.copy(ROOT / "benches" / "conftest.py", root / "conftest.py")
    (root / "test_tiny.py").write_text(TINY)
    (root / "pytest.ini").write_text("[pytest]\n")
    out = root / "out.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_tiny.py",
                           f"--benchmark-json={out}", "--benchmark-min-rounds=2", "--benchmark-max-time=0.01"],
                          cwd=root, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


def test_each_saved_benchmark_records_its_malloc_settings(tmp_path):
    """Applied with mallopt (none in the environment): ALLOC_ENV's values, the mmap threshold raised as the workers
    raise it (glibc 2.36 takes it); one set in the environment that is not ALLOC_ENV's: that one (glibc read it at
    start; keep_freed_memory leaves it)."""
    env = {k: v for k, v in os.environ.items() if k not in timing.ALLOC_ENV}
    (b,) = _bench_json(tmp_path / "a", env)["benchmarks"]
    assert b["extra_info"][MALLOC_INFO] == {**SET, "MALLOC_MMAP_THRESHOLD_": str(timing.MMAP_THRESHOLD_RAISED)}
    (b,) = _bench_json(tmp_path / "b", {**env, "MALLOC_MMAP_THRESHOLD_": "131072"})["benchmarks"]
    assert b["extra_info"][MALLOC_INFO] == {**SET, "MALLOC_MMAP_THRESHOLD_": "131072"}


def _storage(tmp_path: Path, second: dict | None) -> Path:
    """The two real bench jobs saved as runs 0001 and 0002; job 2's benchmarks record ``second`` (None: nothing,
    as both jobs were saved)."""
    st = tmp_path / "st"
    for job in (1, 2):
        d = tmp_path / f"parts{job}"
        d.mkdir(parents=True)
        paths = []
        for fw in FRAMEWORK_ORDER:
            data = _part(job, fw)
            if job == 2 and second is not None:
                for b in data["benchmarks"]:
                    b["extra_info"][MALLOC_INFO] = second
            (d / f"{fw}.json").write_text(json.dumps(data))
            paths.append(d / f"{fw}.json")
        save_job(st, paths, JOB_IDS[job - 1], machine=MACHINE)
    return st


def test_compare_says_where_the_malloc_settings_differ(tmp_path):
    st = _storage(tmp_path, SET)
    cmp = compare_storage(st)
    want = f"malloc settings differ (timing.ALLOC_ENV): BASE not recorded; NEW {SET_TEXT}"
    assert len(cmp.table) == len(KEYS) and cmp.table["malloc"].tolist() == [want] * len(KEYS)
    text = format_comparison(cmp)
    block = text.split("malloc settings differ between the two sides", 1)[1].split("\n\n")[0]
    assert [line.strip() for line in block.splitlines()[1:]] == [
        f"test_train_step[{k}] (0001 -> 0002): {want}" for k in sorted(KEYS)]
    # a failure past a threshold names it too (-100%: every pair is past it)
    cmp = compare_storage(st, thresholds=[Threshold("mean", -1.0, relative=True)])
    assert len(cmp.failures) == len(KEYS) and all(f.endswith(want) for f in cmp.failures)  # 2 rounds: no noise test


@pytest.mark.parametrize("second", [None, "same"])
def test_compare_is_silent_where_they_agree_or_neither_recorded(tmp_path, second):
    st = _storage(tmp_path, None if second is None else SET)
    if second == "same":  # job 1 recorded the same settings too
        for f in sorted(st.rglob("0001_*.json")):
            data = json.loads(f.read_text())
            for b in data["benchmarks"]:
                b["extra_info"][MALLOC_INFO] = SET
            f.write_text(json.dumps(data))
    cmp = compare_storage(st)
    assert cmp.table["malloc"].isna().all() and "malloc settings differ" not in format_comparison(cmp)


def test_the_trend_marks_a_point_whose_malloc_settings_changed(tmp_path):
    from kernelmap.reports import figures as F

    st = _storage(tmp_path, SET)
    h = load_history(st)
    assert h["malloc"].tolist() == ["not recorded"] * 4 + [SET_TEXT] * 4
    for s in trend_series(h).values():
        assert s["malloc_changed"].tolist() == [False, True]
    assert F.trend_figure(h, tmp_path / "trend.png") is not None
    same = trend_series(load_history(_storage(tmp_path / "none", None)))
    assert all(s["malloc_changed"].tolist() == [False, False] for s in same.values())


def test_the_run_manifest_records_the_workers_malloc_settings():
    import argparse

    from kernelmap.run.results import timing_config

    cfg = timing_config(argparse.Namespace(max_repeats=2), 1.0, "30%")
    assert cfg["malloc"] == SET
