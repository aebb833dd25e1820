"""A normalised run whose cases hold library logs only (the 4x H200 packs of 2026-11-27 kept no trace: `kernelmap
normalise` of a copy read the cuDNN/cuBLAS logs, 0 kernels, 0 ops): the findings have no side for such a case, and
`kernelmap report` no longer stops with "no timed kernels or ops in any trace" (reports/analyses/diff.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from kernelmap.reports.analyses import findings
from kernelmap.reports.analyses.base import load_run

from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data" / "cpu_devices_run"


def test_a_case_without_timed_rows_has_no_side(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(DATA, run)
    normalise_run_dir(run)
    loaded = load_run(run)
    assert len(findings.run_sides(loaded)) == 3  # each case's traced kernels or ops
    rec = loaded.records
    # as a pack without traces: only the library logs' calls (no kernel, no op rows)
    loaded.records = rec.assign(kind="library_call", source="cudnn_log")
    assert findings.run_sides(loaded) == []  # raised KernelmapError before
    assert findings.run_findings([loaded]).empty
