"""One case key, typed end to end (issue 36).

- A CPU run of every framework in every mode (``--mode all``) records each case's typed key in results.json
  and the manifest, and every row of its records carries mode, math and devices (schema v3).
- A run directory of the previous version (its results without devices, its records of schema 2 with the case's
  name in ``framework``) loads through the one loader, translated; a newer one is refused, saying so.
- The report's tables from a fixture run directory are the ones the code before the typed key made
  (tests/data/case_key_tables, its README says how they were made), but for the differences named here; and a
  run of the previous version gives the same tables as the same run written as the runner writes it now.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import report, require_framework
from kernelmap.frameworks.case import Case, CaseKey
from kernelmap.reports import analysis as A

from kernelmap import frameworks, rundir, schema
from kernelmap.errors import KernelmapError, SchemaError
from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data"
BEFORE = DATA / "case_key_tables"
RUNS = ("cpu_run_all", "gpu_replay_modes_run")
# Tables that other changes made since the code before the typed key changed: compared by the cases they name
# (run, framework, batch size) only. Every other table is compared whole.
OTHER_WORK = {
    "busy_share": "a CPU busy share over its own pass's mean step (issue 42, 1703862)",
    "self_checks": "issue 42's new self-checks (1703862)",
    "not_read": "the workers' pass results named as kernelmap's own, not 'unrecognised content' (36961b1)",
    "answer": "a 'bwd (all)' row where frameworks split a backward differently (c0dc628)",
}
# Columns other changes appended since (their values are new work): dropped before the tables are compared whole.
ADDED = {"launch_bound": ("compute_busy_ms",),  # c5da10b: a case's compute kernels beside GPU busy (issue 39)
         "layer_table": ("op_time_vs_call",),  # ef6c77c: whether a call and its op share one basis (issue 42)
         "library_calls": ("sources",)}  # c7e2255: the sources a row's calls come from (issue 39)
# The one difference the typed key makes: a run written before results.json recorded the mode and the math
# (cpu_run_all) now shows them, as the loader translates them (the framework's default mode, the run's math).
FILLED = {"summary": ("mode", "math")}
IDENTITY = ("run", "framework", "batch_size")


# --- a CPU run of every mode ---------------------------------------------------------------------------
def _python_args() -> list[str]:
    return [a for fw, d in frameworks.REGISTRY.items() if (py := d.python()) for a in ("--python", f"{fw}={py}")]


@pytest.mark.slow
def test_cpu_run_of_every_mode_types_every_record(tmp_path):
    """``kernelmap run --mode all`` on the CPU: each case's key is recorded typed (results.json, the manifest's
    config.cases, run_version 2) and every record of every framework has its mode, math and devices; the
    framework column holds the framework's name alone."""
    for fw in ("pytorch", "mxnet"):
        require_framework(fw)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "kernelmap.cli", "run", "--framework", "all", "--device", "cpu",
                           "--mode", "all", "--profile", "framework", "--data", "synthetic", "--batch-size", "16",
                           "--steps", "2", "--warmup", "1", "--trials", "1", "--max-repeats", "0",
                           "--out", str(out), *_python_args()],
                          capture_output=True, text=True, timeout=1200, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stderr[-3000:]
    man = json.loads((out / "manifest.json").read_text())
    results = json.loads((out / "results.json").read_text())
    assert man["run_version"] == rundir.RUN_VERSION == 2
    keys = [CaseKey.from_fields(r) for r in results]
    ran = {k.framework for k in keys}
    assert {"pytorch", "mxnet"} <= ran
    assert sorted((k.framework, k.mode) for k in keys) == sorted(
        (fw, m) for fw in ran for m in frameworks.get(fw).modes_on("cpu"))  # every CPU mode of each framework
    assert {(k.math, k.devices, k.batch_size) for k in keys} == {("fp32", 1, 16)}
    assert [r["dir"] for r in results] == [str(rundir.case_dir(k)) for k in keys]
    assert sorted(map(str, (CaseKey.from_fields(c) for c in man["config"]["cases"]))) == sorted(map(str, keys))
    rec = schema.read_parquet(out / "records.parquet")
    assert len(rec) and not rec[["framework", *schema.CASE_COLUMNS, "batch_size"]].isna().any().any()
    assert rec["devices"].dtype == "Int64" and set(rec["framework"]) == ran
    got = set(rec[["framework", "mode", "math", "devices", "batch_size"]].itertuples(index=False, name=None))
    assert got == {(k.framework, k.mode, k.math, k.devices, k.batch_size) for k in keys}
    for fw in ran:  # every framework's records: each of its CPU modes, typed
        assert set(rec.loc[rec["framework"] == fw, "mode"]) == set(frameworks.get(fw).modes_on("cpu"))
    run = A.load_run(out)
    assert set(run.cases) == {k.name for k in keys} and all(run.cases[k.name] == k.case for k in keys)


# --- runs of another version ---------------------------------------------------------------------------
def test_a_run_of_the_previous_version_loads_translated(tmp_path):
    """gpu_replay_modes_run (results without devices; records of schema 2, the case's name in framework):
    typed through the one loader, the math from its manifest; its records read alone have no math to say."""
    rd = rundir.RunDir(DATA / "gpu_replay_modes_run")
    assert [e.key for e in rd.read_cases()] == [CaseKey("pytorch", "cuda-graph", "fp32", 1, 64),
                                                CaseKey("pytorch", "compile-graphs", "fp32", 1, 64)]
    rec = rd.read_records()
    assert set(rec[["framework", "mode", "math", "devices"]].itertuples(index=False, name=None)) == {
        ("pytorch", "cuda-graph", "fp32", 1), ("pytorch", "compile-graphs", "fp32", 1)}
    alone = schema.read_parquet(rd.records)
    assert alone["math"].isna().all() and set(alone["mode"]) == {"cuda-graph", "compile-graphs"}
    # cpu_run_all's results recorded no mode: each framework's default, the manifest's math
    old = rundir.RunDir(DATA / "cpu_run_all")
    assert {e.key for e in old.read_cases()} == {CaseKey("pytorch", "eager", "fp32", 1, 64),
                                                 CaseKey("mxnet", "imperative", "fp32", 1, 64)}
    assert rundir.asked_cases(old.read_manifest(), old.manifest) is None  # made before the manifest listed modes
    assert rundir.asked_cases(rd.read_manifest(), rd.manifest) == [CaseKey("pytorch", "cuda-graph", "fp32", 1, 64),
                                                                   CaseKey("pytorch", "compile-graphs", "fp32", 1, 64)]


def test_a_newer_run_or_a_bad_entry_is_refused_with_what_to_do(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(DATA / "gpu_replay_modes_run", d)
    man = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").write_text(json.dumps({**man, "run_version": 3}))
    with pytest.raises(KernelmapError, match=r"manifest.json: written by a newer kernelmap \(run_version 3; this one "
                                             r"reads up to 2\): report it with that kernelmap, or upgrade this one"):
        A.load_run(d)
    results = json.loads((d / "results.json").read_text())
    (d / "manifest.json").write_text(json.dumps({**man, "run_version": 2}))
    (d / "results.json").write_text(json.dumps([{**results[0], "devices": 1, "mode": "hybridized"}]))
    with pytest.raises(KernelmapError, match=r"results.json: entry 0: no case key \(mode 'hybridized': pytorch has"):
        A.load_run(d)
    (d / "results.json").write_text(json.dumps([results[0]]))  # version 2 without devices: not guessed
    with pytest.raises(KernelmapError, match=r"entry 0: no case key \(no devices recorded\)"):
        A.load_run(d)
    import pyarrow.parquet as pq

    table = pq.read_table(d / "records.parquet")
    newer = table.replace_schema_metadata({**table.schema.metadata, b"kernelmap.schema_version": b"4"})
    pq.write_table(newer, d / "records.parquet")
    with pytest.raises(SchemaError, match="schema_version 4 is newer than this kernelmap's 3: read it with the "
                                          "kernelmap that wrote it"):
        schema.read_parquet(d / "records.parquet")


# --- the report's tables, before and after -------------------------------------------------------------
def _tables(run: Path, out: Path) -> dict[str, pd.DataFrame]:
    if not (run / "records.parquet").is_file():
        normalise_run_dir(run)
    assert report(str(run), "-o", str(out)) == 0
    return {p.stem: pd.read_csv(p, dtype=str, keep_default_na=False) for p in sorted((out / "tables").glob("*.csv"))}


@pytest.fixture(scope="module", params=RUNS)
def tables_now(request, tmp_path_factory) -> tuple[str, Path, dict[str, pd.DataFrame]]:
    name = request.param
    run = tmp_path_factory.mktemp("now") / name
    shutil.copytree(DATA / name, run)
    return name, run, _tables(run, run.parent / "report")


def _identity(df: pd.DataFrame) -> set[tuple]:
    cols = [c for c in IDENTITY if c in df.columns]
    return set(df[cols].itertuples(index=False, name=None))


def test_the_tables_are_those_made_before_the_typed_key(tables_now):
    name, run, now = tables_now
    keys = {(e.key.name, str(e.key.batch_size)): e.key for e in rundir.RunDir(run).read_cases()}
    before = {p.stem: pd.read_csv(p, dtype=str, keep_default_na=False) for p in sorted((BEFORE / name).glob("*.csv"))}
    assert len(before) > 15 and set(before) <= set(now)  # every table made before is made
    for table, old in before.items():
        new = now[table]
        if table in OTHER_WORK:
            assert _identity(new) == _identity(old), table
            continue
        new = new.drop(columns=[c for c in ADDED.get(table, ()) if c not in old.columns])
        assert list(new.columns) == list(old.columns), table
        for col in FILLED.get(table, ()):  # empty before, the translated key's field now; else unchanged
            was_empty = old[col] == ""
            want = [str(getattr(keys[(fw, bs)], col)) for fw, bs in zip(new["framework"], new["batch_size"],
                                                                       strict=True)]
            assert (new[col].where(~was_empty, "") == old[col]).all(), (table, col)
            assert (new.loc[was_empty, col] == pd.Series(want, index=new.index)[was_empty]).all(), (table, col)
            new, old = new.drop(columns=col), old.drop(columns=col)
        pd.testing.assert_frame_equal(new, old, obj=f"{name}/{table}.csv")
    if name == "cpu_run_all":  # the one run here of the previous version without modes: the difference shows
        assert list(now["summary"]["mode"]) == ["eager", "imperative"]


def _as_written_now(src: Path, dst: Path) -> None:
    """``src`` (a run of the previous version) as the runner and normalise write a run now: results.json and
    the manifest with the typed key (run_version 2), the records in schema 3."""
    shutil.copytree(src, dst)
    rd = rundir.RunDir(dst)
    man = rd.read_manifest()
    asked = rundir.asked_cases(man, rd.manifest)
    rd.write_json(rd.results, [{**e.entry, **e.key.to_fields(), "dir": str(e.dir)} for e in rd.read_cases()])
    cases = {} if asked is None else {"cases": [{**k.to_fields(), "dir": str(rundir.case_dir(k))} for k in asked]}
    rd.write_json(rd.manifest, {**man, "run_version": rundir.RUN_VERSION, "config": {**man["config"], **cases}})
    if rd.records.is_file():  # records without their captures: as the translation reads them, written anew
        schema.write_parquet(rd.read_records(), rd.records, extra_meta=schema.read_meta(rd.records))


def test_a_run_of_the_previous_version_reports_as_the_same_run_written_now(tables_now, tmp_path):
    name, run, now = tables_now
    typed = tmp_path / "typed" / name
    _as_written_now(DATA / name, typed)
    assert json.loads((typed / "results.json").read_text())[0]["devices"] == 1
    again = _tables(typed, tmp_path / "report")
    assert schema.read_parquet(typed / "records.parquet")["math"].notna().all()
    assert set(again) == set(now)
    for table in now:
        pd.testing.assert_frame_equal(again[table], now[table], obj=f"{name}/{table}.csv")


def test_a_case_name_is_looked_up_not_split():
    """The report's helpers take a case's name from its typed key; a name no registered case has is left as
    it is (never cut at its dashes)."""
    assert A.fw_label("pytorch-cuda-graph") == Case("pytorch", "cuda-graph").label == "PyTorch cuda-graph"
    assert A.fw_label("mxnet-cuda-graph") == "mxnet-cuda-graph"
    assert A.fw_label("pytorch") == "PyTorch"
