"""tests/data/trim_devices_run.py (the tool that makes a multi-GPU run's fixture, next GPU hold: the 2026-11-27 packs
held no trace) on the real CPU capture tests/data/cpu_devices_run: the kept steps' communication figures and
collectives are those of the whole run, every rank kept; a rank whose trace is absent stops it, naming the file."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
from kernelmap.reports.analyses import comm

from kernelmap import schema
from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data"
TOOL = DATA / "trim_devices_run.py"
CASES = ["pytorch-x2/bs32", "jax-x2/bs32"]


def _records(run: Path) -> pd.DataFrame:
    normalise_run_dir(run)
    return schema.read_parquet(run / "records.parquet")


def _trim(src: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), str(src), str(out), "--steps", "2", "--cases", *CASES],
                          capture_output=True, text=True, check=False)


def test_the_last_steps_keep_their_figures_on_every_rank(tmp_path):
    whole = tmp_path / "whole"
    shutil.copytree(DATA / "cpu_devices_run", whole)
    p = _trim(DATA / "cpu_devices_run", tmp_path / "trimmed")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "trimmed" / "pytorch-x2/bs32/rank1/trace.json.gz").is_file()
    with gzip.open(tmp_path / "trimmed" / "pytorch-x2/bs32/trace.json.gz", "rt") as fh:
        steps = sorted(e["name"] for e in json.load(fh)["traceEvents"] if e.get("name", "").startswith("kernelmap:step#"))
    assert steps == ["kernelmap:step#2", "kernelmap:step#3"]
    a, b = _records(whole), _records(tmp_path / "trimmed")
    cols = ["run", "rank", "iteration", "step_ms", "compute_ms", "communication_ms", "exposed_ms", "collectives",
            "comm_bytes", "linked_share"]
    want = comm.per_step(a)
    want = want[want["run"].isin(CASES) & want["iteration"].isin([2, 3])][cols].reset_index(drop=True)
    got = comm.per_step(b)[cols].reset_index(drop=True)
    assert len(got) == 8  # PyTorch 2 ranks x 2 steps, JAX 2 devices x 2 steps
    pd.testing.assert_frame_equal(got, want)
    ca = comm.collectives(a)
    ca = ca[ca["run"].isin(CASES) & ca["iteration"].isin([2, 3])].reset_index(drop=True)
    pd.testing.assert_frame_equal(comm.collectives(b).reset_index(drop=True), ca)


def test_a_rank_without_its_trace_stops_the_trim(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(DATA / "cpu_devices_run", src)
    (src / "pytorch-x2/bs32/rank1/trace.json.gz").unlink()
    p = _trim(src, tmp_path / "out")
    assert p.returncode != 0 and "pytorch-x2/bs32/rank1/trace.json.gz: absent" in p.stderr
