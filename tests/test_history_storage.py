"""kernelmap.history.storage alone: BenchStorage owns pytest-benchmark's layout on disk
(``ROOT/<machine>/NNNN_<tag>.json``): it lists, reads strictly, numbers, names and writes runs, never
over another; ``pick_runs`` reads BASE/NEW. Synthetic runs, written by hand where a test needs a file
that kernelmap did not write."""

from __future__ import annotations

import json

import pytest

from kernelmap.errors import KernelmapError
from kernelmap.history.keys import JOB_KEY
from kernelmap.history.storage import NAME_RE, BenchStorage, list_runs, pick_runs

pytest.importorskip("pytest_benchmark")


def _run(commit: str = "abc123", when: str = "2026-11-25T10:15:00+00:00", dirty: bool = False, **extra) -> dict:
    return {"machine_info": {}, "commit_info": {"id": commit, "dirty": dirty}, "datetime": when, "version": "5.1.0",
            "benchmarks": [{"name": "test_x", "fullname": "b.py::test_x", "stats": {"mean": 1.0}}], **extra}


def test_numbers_per_machine_from_0001_and_the_file_is_the_data(tmp_path):
    st = BenchStorage(tmp_path / "st")
    assert st.files() == [] and st.next_number("m1") == "0001"
    a = st.save(_run(), "m1", st.tag(_run()))
    b = st.save(_run("def456", **{JOB_KEY: "job-2"}), "m1", "def456_20261125_101500")
    c = st.save(_run(), "m2", "abc123_20261125_101500")
    assert [p.relative_to(st.root).as_posix() for p in (a, b, c)] == [
        "m1/0001_abc123_20261125_101500.json", "m1/0002_def456_20261125_101500.json", "m2/0001_abc123_20261125_101500.json"]
    assert json.loads(a.read_text()) == _run()
    assert a.read_text().startswith('{\n    "machine_info"')  # indented as pytest-benchmark writes it
    assert [(m, n) for m, n, _ in st.files()] == [("m1", "0001"), ("m1", "0002"), ("m2", "0001")]
    assert [(m, n) for m, n, _ in st.files("m1")] == [("m1", "0001"), ("m1", "0002")]
    assert not list(st.root.glob("*/.save-job.*"))  # nothing half-written left beside them


def test_a_number_another_writer_took_is_never_overwritten(tmp_path):
    st = BenchStorage(tmp_path / "st")
    st.save(_run(), "m", "a_20261125_101500")
    taken = st.root / "m" / "0002_autosave.json"  # pytest's own autosave took 0002 meanwhile
    taken.write_text(json.dumps(_run("theirs")))
    path = st.save(_run("ours"), "m", "ours_20261125_101500")
    assert path.name == "0003_ours_20261125_101500.json"
    assert json.loads(taken.read_text())["commit_info"]["id"] == "theirs"


def test_the_tag_is_pytest_benchmarks_and_a_bad_one_is_refused(tmp_path):
    assert BenchStorage.tag(_run()) == "abc123_20261125_101500"
    assert BenchStorage.tag(_run(dirty=True, when="2026-11-25T10:15:00")) == "abc123_20261125_101500_uncommitted-changes"
    assert BenchStorage.tag({"benchmarks": [], "datetime": "2026-01-02T03:04:05+00:00"}) == "unversioned_20260102_030405"
    assert NAME_RE.match("0001_abc123_20261125_101500.json")["num"] == "0001"
    st = BenchStorage(tmp_path / "st")
    with pytest.raises(KernelmapError, match="not a name a saved run can have"):
        st.save(_run(), "m", "a/b")
    assert not (tmp_path / "st" / "m").exists() or not list((tmp_path / "st" / "m").iterdir())


def test_reading_is_strict_and_names_the_file(tmp_path):
    st = BenchStorage(tmp_path / "st")
    with pytest.raises(KernelmapError, match="no pytest-benchmark storage here"):
        st.runs()
    (tmp_path / "st" / "m").mkdir(parents=True)
    with pytest.raises(KernelmapError, match="no saved runs"):
        st.runs()
    bad = tmp_path / "st" / "m" / "0001_x.json"
    bad.write_text("{not json")
    with pytest.raises(KernelmapError, match=r"0001_x\.json: not valid JSON"):
        st.runs()
    bad.write_text(json.dumps({"machine_info": {}}))
    with pytest.raises(KernelmapError, match=r"0001_x\.json: not a pytest-benchmark file"):
        st.runs()
    bad.write_text(json.dumps(_run()))
    (run,) = st.runs()
    assert (run.number, run.machine, run.path) == ("0001", "m", bad)
    (tmp_path / "st" / "0009_loose.json").write_text(json.dumps(_run()))  # directly under ROOT: no machine's run
    assert [r.number for r in list_runs(tmp_path / "st")] == ["0001"]


def test_pick_runs_reads_numbers_files_and_lists(tmp_path):
    st = BenchStorage(tmp_path / "st")
    for _ in range(2):
        st.save(_run(), "m1", "a_20261125_101500")
    runs = st.runs()
    assert [r.number for r in pick_runs(runs, "1")] == ["0001"]
    assert [r.number for r in pick_runs(runs, "0001,0002,0001")] == ["0001", "0002"]
    outside = tmp_path / "elsewhere" / "0007_b.json"
    outside.parent.mkdir()
    outside.write_text(json.dumps(_run()))
    (picked,) = pick_runs(runs, str(outside))
    assert (picked.number, picked.machine) == ("0007", "elsewhere")
    with pytest.raises(KernelmapError, match="run 0003 not found; saved runs: 0001, 0002"):
        pick_runs(runs, "3")
    with pytest.raises(KernelmapError, match="expected a run number"):
        pick_runs(runs, "latest")
    with pytest.raises(KernelmapError, match="no run named"):
        pick_runs(runs, ",")
    st.save(_run(), "m2", "a_20261125_101500")
    with pytest.raises(KernelmapError, match=r"run 0001 exists for several machines \(m1, m2\)"):
        pick_runs(st.runs(), "0001")
