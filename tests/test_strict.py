"""``kernelmap report --strict`` on an incomplete run (issue 42): a run whose records.parquet is gone, or whose
records hold no conv or linear layer, fails the self-check ``run files present`` and exits 4, saying so on
the console; a complete one exits 0.

Fixture: tests/data/cpu_custom_op/jit (a real CPU run, every capture pass), normalised here, with its
contention records set to a real quiet window (test_checks_quiet.all_quiet) so that only the doctoring fails.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from conftest import report
from kernelmap.reports import analysis as A
from kernelmap.reports import checks as C
from test_checks_quiet import all_quiet, copy_run

from kernelmap import schema
from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def quiet_run(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("strict")
    shutil.copytree(DATA / "cpu_custom_op" / "jit", base / "src")
    normalise_run_dir(base / "src")
    (base / "q").mkdir()
    return copy_run(base / "src", base / "q", all_quiet)


def _complete(d: Path) -> dict[str, str]:
    c = C.self_checks([A.load_run(d)])
    c = c[c["check"] == C.Check.RUN_COMPLETE]
    return dict(zip(c["subject"], c["status"], strict=True))


def test_a_complete_run_passes_strict(quiet_run, tmp_path):
    assert _complete(quiet_run) == {"records.parquet": C.PASS, "attribution.json": C.PASS,
                                    "layer table rows": C.PASS}
    assert report(str(quiet_run), "-o", str(tmp_path / "rep"), "--strict") == 0


def test_records_deleted_fails_strict_and_says_so(quiet_run, tmp_path, capsys):
    d = tmp_path / "run"
    shutil.copytree(quiet_run, d)
    (d / "records.parquet").unlink()
    assert _complete(d) == {"records.parquet": C.FAIL, "attribution.json": C.PASS, "layer table rows": C.FAIL}
    assert report(str(d), "-o", str(tmp_path / "rep"), "--strict") == C.EXIT_CHECK_FAILED
    err = capsys.readouterr().err
    assert "run files present: records.parquet: expected present, measured missing" in err
    assert "run files present: layer table rows: expected >0, measured 0" in err
    assert "--strict: 2 self-check(s) failed: run files present (2)" in err


def test_records_without_layers_fail_strict(quiet_run, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(quiet_run, d)
    rec = schema.read_parquet(d / "records.parquet")
    assert rec["layer"].notna().sum() > 0
    rec["layer"] = pd.Series([None] * len(rec), dtype=rec["layer"].dtype, index=rec.index)
    schema.write_parquet(rec, d / "records.parquet")
    assert _complete(d) == {"records.parquet": C.PASS, "attribution.json": C.PASS, "layer table rows": C.FAIL}
    assert report(str(d), "-o", str(tmp_path / "rep"), "--strict") == C.EXIT_CHECK_FAILED


def test_strict_names_what_it_did_not_check(quiet_run, tmp_path, capsys):
    assert report(str(quiet_run), "-o", str(tmp_path / "rep"), "--strict") == 0
    err = capsys.readouterr().err
    assert ("not checked: clean vs step benchmark (1 row(s)): no step benchmark history given "
            "(kernelmap report --storage DIR)") in err
