"""XLA's pool work on a real JAX CPU run (tests/data/cpu_jax_pool: `kernelmap run --framework jax --device cpu
--profile framework --batch-size 64 --steps 20 --trials 1`, the 2-core VM with other processes using 1.2 of its
cores): the capture's pool tasks against a stdlib count of the trace, every layer row of the JAX case given its own
CPU time from its threads' clocks (kernelmap/poolcpu.py), and each way it is refused made to happen."""

from __future__ import annotations

import gzip
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from kernelmap.reports import analysis as A
from kernelmap.reports.analyses import opcpu as OC
from kernelmap.reports.checkrows import FAIL, NOT_CHECKED, PASS, Check
from kernelmap.reports.cpuchecks import op_cpu_checks

from kernelmap import cpusampler, poolcpu
from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data" / "cpu_jax_pool"
RECORD, START, STOP = ("ThreadpoolListener::Record", "ThreadpoolListener::StartRegion",  # XLA's names in the trace
                       "ThreadpoolListener::StopRegion")
CASE = DATA / "jax" / "bs64"
ROWS = [(layer, d) for layer in ("conv1", "conv2", "fc1", "fc2") for d in ({"fwd"}, {"bwd_data", "bwd_weight",
                                                                                        "bwd_bias", "bwd"})]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> A.Run:
    copy = shutil.copytree(DATA, tmp_path_factory.mktemp("pool") / DATA.name)
    normalise_run_dir(copy)
    return A.load_run(copy)


def _variant(run: A.Run, tmp_path: Path, edit) -> A.Run:
    d = tmp_path / "variant"
    shutil.copytree(run.path, d)
    edit(d / "jax" / "bs64")
    return A.load_run(d)


def _jax(run: A.Run) -> OC.OpCpu:
    return OC.op_cpu(run)[("jax", 64)]


def _rows(run: A.Run, subject: str) -> list[dict]:
    return [r for r in op_cpu_checks(run) if r["check"] == Check.OP_CPU_THREADS and r["subject"] == subject]


def test_the_pool_tasks_are_the_traces_regions_with_their_records():
    """Independent reading (stdlib gzip + json): each StartRegion/StopRegion pair of the trace is one task of
    pool_tasks.json; every Record of the trace starts exactly one of them, the rest are the unpaired."""
    doc = json.loads(gzip.open(CASE / "trace.json.gz").read())
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    ev = sorted((e for e in doc["traceEvents"] if e.get("ph") == "X"), key=lambda e: e["ts"])
    by: dict[int, list[str]] = {}
    for e in ev:
        if e["name"] in (START, STOP):
            by.setdefault(e["tid"], []).append(e["name"])
    pairs = sum(a == START and b == STOP for seq in by.values() for a, b in zip(seq, seq[1:], strict=False))
    records = sum(e["name"] == RECORD for e in ev)
    tasks = poolcpu.PoolTasks.read(CASE / poolcpu.POOL_TASKS_FILE)
    assert (pairs, records) == (931, 914)
    assert len(tasks.regions) == pairs and tasks.unpaired == pairs - records == 17 and tasks.unstopped == 0
    assert tasks.threads == {int(k): v for k, v in names.items()}
    per_thread = Counter(int(t) for t in tasks.regions[:, 0])
    assert per_thread == Counter({t: sum(n == START for n in seq) for t, seq in by.items()})


def test_every_jax_layer_row_is_measured_from_its_threads(run):
    oc = _jax(run)
    assert oc.measured and oc.pool is not None and not oc.pool.why
    assert oc.withheld == 0
    assert sorted(oc.pool.match.pairs.values()) == [21113, 21114, 21115, 21116]
    assert min(oc.pool.match.within.values()) >= poolcpu.MATCH_MIN
    figures = {(layer, min(d)): OC.layer_cpu(oc, layer, d) for layer, d in ROWS}
    assert all(lc.ms is not None and lc.ms > 0 for lc in figures.values()), {k: v.why for k, v in figures.items()}
    # the ops together within the marked steps' CPU time (their per-thread figures, shared_cpu_ns)
    assert oc.ops_ms_per_step <= float(np.mean(oc.ops_step_cpu_ms))
    (summed,) = _rows(run, "threads' sum")
    (paired,) = _rows(run, "trace threads paired")
    assert summed["status"] == PASS and summed["measured"] < 1e-9  # the same reads (float rounding only)
    assert paired["status"] == PASS and "17 pool tasks whose scheduling record" in paired["detail"]


def test_without_the_pool_tasks_the_ops_beside_pool_work_are_withheld_as_before(run, tmp_path):
    v = _variant(run, tmp_path, lambda d: (d / poolcpu.POOL_TASKS_FILE).unlink())
    oc = _jax(v)
    assert oc.pool is None and oc.withheld > 0
    assert sum(OC.layer_cpu(oc, layer, d).withheld for layer, d in ROWS) >= 5
    assert _rows(v, "threads' sum") == []


def test_a_per_thread_file_that_departs_from_the_samples_fails_and_draws_nothing(run, tmp_path):
    def doctor(d: Path) -> None:
        rows = np.load(d / cpusampler.THREADS_FILE)
        pool = rows[:, 1] == 21113
        rows[pool, 2] += np.arange(int(pool.sum())) * 1000  # a pool thread's CPU time growing 1 µs a row faster
        np.save(d / cpusampler.THREADS_FILE, rows)

    v = _variant(run, tmp_path, doctor)
    oc = _jax(v)
    assert oc.pool.cpu_ns is None and "departs" in oc.pool.why and oc.withheld > 0
    (summed,) = _rows(v, "threads' sum")
    assert summed["status"] == FAIL and summed["measured"] > poolcpu.SUM_SLACK


def test_threads_that_cannot_be_paired_keep_the_process_wide_reading(run, tmp_path):
    def rename(d: Path) -> None:  # the sampler saw no thread named as XLA's pool threads
        doc = json.loads((d / "framework.json").read_text())
        names = doc[cpusampler.RESULT_KEY][cpusampler.NAMES_KEY]
        doc[cpusampler.RESULT_KEY][cpusampler.NAMES_KEY] = {k: ("other" if v == "tf_XLAEigen" else v)
                                                            for k, v in names.items()}
        (d / "framework.json").write_text(json.dumps(doc))

    v = _variant(run, tmp_path, rename)
    oc = _jax(v)
    assert oc.pool.cpu_ns is None and "against 0 OS threads" in oc.pool.why and oc.withheld > 0
    held = [OC.layer_cpu(oc, layer, d) for layer, d in ROWS]
    assert any(h.withheld for h in held)
    assert all("not read per thread: 2 trace threads named 'tf_XLAEigen' against 0 OS threads" in h.why
               for h in held if h.withheld)
    (paired,) = _rows(v, "trace threads paired")
    assert paired["status"] == NOT_CHECKED and "process-wide reading" in paired["detail"]


def test_pool_work_given_to_no_op_fails_against_the_process_wide_reading(run, tmp_path):
    def orphan(d: Path) -> None:  # every task scheduled from a thread that ran no op: its CPU time in no op
        doc = json.loads((d / poolcpu.POOL_TASKS_FILE).read_text())
        doc["regions"] = [[*r[:3], 1 if r[3] >= 0 else r[3], r[4]] for r in doc["regions"]]
        (d / poolcpu.POOL_TASKS_FILE).write_text(json.dumps(doc))

    (good,) = _rows(run, "against the process-wide reading")
    assert good["status"] == PASS and 0.9 < good["measured"] <= poolcpu.AGREE_HIGH
    v = _variant(run, tmp_path, orphan)
    oc = _jax(v)
    assert oc.pool.cpu_ns is None and "x the process-wide" in oc.pool.why and oc.withheld > 0
    (bad,) = _rows(v, "against the process-wide reading")
    assert bad["status"] == FAIL and bad["measured"] < poolcpu.AGREE_LOW


def test_no_op_to_hold_the_per_thread_reading_against_draws_nothing_and_says_so(run, tmp_path, monkeypatch):
    """Where no traced op has the process-wide reading as its own, the per-thread figures have nothing to be checked
    against: not drawn, and the reason says that (it read 'nan x the process-wide reading'); the check: not checked."""
    monkeypatch.setattr(poolcpu, "agreement", lambda per_thread, process_wide, holds: (float("nan"), 0))
    v = _variant(run, tmp_path, lambda d: None)  # a fresh copy: the run's figures are computed once per load
    oc = _jax(v)
    assert oc.pool.cpu_ns is None and oc.pool.why.startswith("no traced op where the process-wide reading holds")
    assert "nan" not in oc.pool.why
    (row,) = _rows(v, "against the process-wide reading")
    assert row["status"] == NOT_CHECKED
