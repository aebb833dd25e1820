"""``every rank traced`` (reports/commchecks.py): a multi-device case of a framework that runs a process per device
(PyTorch DDP) whose rank traces are absent is not reported as if it were the case. Today's 4x H200 packs (s11 r2,
r3, commit e953021) held no rank<r>/ folder and no trace at all: their figures would have been rank 0's, or none,
with every communication check passing or silent. On the real CPU capture tests/data/cpu_devices_run."""

from __future__ import annotations

import shutil
from pathlib import Path

from kernelmap.reports import checks, commchecks
from kernelmap.reports.analyses.base import load_run
from kernelmap.reports.checkrows import FAIL, PASS, Check

from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data" / "cpu_devices_run"
CASE = "pytorch-x2/bs32"


def _run(tmp: Path, drop=(), normalise: bool = True):
    run = tmp / "run"
    shutil.copytree(DATA, run)
    for rel in drop:
        p = run / rel
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    if normalise:
        normalise_run_dir(run)
    return load_run(run)


def _ranks_rows(rows):
    return [r for r in rows if r["check"] == Check.RANKS_TRACED.value]


def test_every_rank_of_ddp_traced_passes(tmp_path):
    got = _ranks_rows(commchecks.comm_checks(_run(tmp_path)))
    assert [(r["subject"], r["measured"], r["status"]) for r in got] == [(CASE, "0, 1", PASS)]  # JAX, MXNet: one process


def test_rank_folder_left_out_fails_and_says_so(tmp_path):
    got = _ranks_rows(commchecks.comm_checks(_run(tmp_path, drop=[f"{CASE}/rank1"])))
    assert len(got) == 1 and got[0]["status"] == FAIL and got[0]["measured"] == "0"
    assert f"rank 1: no {CASE}/rank1/ (its captures are absent" in got[0]["detail"]
    assert "communication figures are rank 0's only" in got[0]["detail"]


def test_rank_trace_absent_names_what_its_folder_holds(tmp_path):
    got = _ranks_rows(commchecks.comm_checks(_run(tmp_path, drop=[f"{CASE}/rank1/trace.json.gz"])))
    assert got[0]["status"] == FAIL
    assert f"rank 1: no traced step in the records ({CASE}/rank1/ holds clean-1.json, framework.json)" in got[0]["detail"]


def test_no_trace_and_no_records_still_checks_ranks_and_scaling(tmp_path):
    # as the s11 packs: no trace of any rank, no records.parquet; the report's checks still run these two
    run = _run(tmp_path, drop=[f"{CASE}/trace.json.gz", f"{CASE}/rank1"], normalise=False)
    rows = checks.self_checks([run]).to_dict("records")
    got = _ranks_rows(rows)
    assert len(got) == 1 and got[0]["status"] == FAIL and got[0]["measured"] == "none"
    assert got[0]["detail"].startswith("no records.parquet (run `kernelmap normalise` on run)")
    assert "no communication figure of this case" in got[0]["detail"]
    assert f"results.json lists 1 file(s) of the case absent here: {CASE}/trace.json.gz" in got[0]["detail"]
    scaling = [r for r in rows if r["check"] == Check.SCALING.value]
    assert {r["subject"] for r in scaling} == {"pytorch-x2/bs32", "mxnet-x2/bs32", "jax-x2/bs32"}


def test_independent_measure_without_records_says_why_and_what_the_step_without_reduction_gave(tmp_path):
    # tests/data/cpu_comm_run (--profile comm) read as a pack without traces and records: its figures of the step
    # without reduction are still said, from results.json as written (read here with json)
    import json

    run = tmp_path / "run"
    shutil.copytree(DATA.parent / "cpu_comm_run", run)
    for p in run.glob("*/bs*/**/trace.json.gz"):
        p.unlink()
    rows = [r for r in commchecks.comm_checks(load_run(run)) if r["check"] == Check.COMM_INDEPENDENT.value]
    want = {r["dir"]: r["noreduce"]["ranks"] for r in json.loads((run / "results.json").read_text())}
    assert {r["subject"] for r in rows} == set(want) and {r["status"] for r in rows} == {"not checked"}
    for r in rows:
        assert r["detail"].startswith("no records.parquet: no traced step to read")
        for x in want[r["subject"]]:
            clean, without = x["clean_median_step_s"] * 1e3, x["median_step_s"] * 1e3
            assert f"rank {x['rank']}: {clean:.4g} − {without:.4g} = {clean - without:.4g} ms" in r["detail"]
