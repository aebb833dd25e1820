"""kernelmap compare and save-job against real pytest-benchmark files: storage of a tiny keyed
benchmark made in subprocesses (thresholds, selection, errors); the step benchmarks' per-framework
files of two real bench jobs (tests/data/bench_jobs) saved as one run per job (merging, numbering,
broken parts), compared and drawn as a trend over jobs; storages saved before jobs (one file per
framework); the step benchmark's block timing."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from conftest import require_framework

from kernelmap.cli import main as cli_main
from kernelmap.errors import KernelmapError
from kernelmap.history import compare as history_compare
from kernelmap.history.compare import Threshold, compare_runs, compare_storage, format_comparison
from kernelmap.history.job import save_job
from kernelmap.history.keys import JOB_ENV, BenchKey
from kernelmap.history.storage import BenchStorage, list_runs, machine_id, pick_runs
from kernelmap.history.trend import load_history, trend_series

pytest.importorskip("pytest_benchmark")

ROOT = Path(__file__).resolve().parents[1]

TINY = '''
import pytest
from kernelmap.history.keys import BenchKey

@pytest.mark.parametrize("batch_size", [8, 16])
def test_step(benchmark, batch_size):
    benchmark.extra_info.update(BenchKey("tiny", "eager", "cpu", batch_size).extra_info())
    benchmark(sum, range(batch_size * 100))
'''


@pytest.fixture(scope="module")
def storage(tmp_path_factory) -> Path:
    """Two real autosaved runs (0001, 0002) with their samples, a copy of 0002 with every time stat and
    sample scaled by 1.2 (0003), and an unchanged copy of 0002 (0004)."""
    root = tmp_path_factory.mktemp("bench")
    (root / "test_tiny.py").write_text(TINY)
    (root / "pytest.ini").write_text("[pytest]\n")
    st = root / "st"
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_tiny.py",
             "--benchmark-autosave", "--benchmark-save-data", f"--benchmark-storage={st}", "--benchmark-min-rounds=5",
             "--benchmark-max-time=0.02"],
            cwd=root, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    files = sorted(st.glob("*/*.json"))
    assert [f.name[:4] for f in files] == ["0001", "0002"]
    second = json.loads(files[1].read_text())
    slow = json.loads(json.dumps(second))
    for b in slow["benchmarks"]:
        for k in ("min", "max", "mean", "median", "q1", "q3", "iqr", "stddev", "total",
                  "ld15iqr", "hd15iqr"):
            b["stats"][k] *= 1.2
        b["stats"]["data"] = [v * 1.2 for v in b["stats"]["data"]]  # every sample: a change beyond noise
        b["stats"]["ops"] /= 1.2
    stem = files[1].name[4:]
    (files[1].parent / f"0003{stem}").write_text(json.dumps(slow))
    shutil.copy(files[1], files[1].parent / f"0004{stem}")
    return st


def compare(*argv: str) -> int:
    """``kernelmap compare ARGV`` through the module's own parser (as kernelmap.cli dispatches it)."""
    parser = argparse.ArgumentParser()
    history_compare.add_arguments(parser)
    return history_compare.main(parser.parse_args(argv))


def test_slowdown_is_flagged(storage, capsys):
    rc = compare("--storage", str(storage), "0002", "0003", "--fail", "mean:5%")
    out = capsys.readouterr().out
    assert rc == 1
    assert out.count("+20.0%") == 8  # 2 benchmarks x 4 printed stats
    fails = [line.strip() for line in out.splitlines() if "exceeds" in line]
    assert fails == [f"test_step[tiny-eager-cpu-{bs}] (0002 -> 0003): mean +20.00% exceeds mean:5%" for bs in (8, 16)]


def test_unchanged_rerun_passes(storage, capsys):
    rc = compare("--storage", str(storage), "0002", "0004", "--fail", "mean:5%",
                 "--fail", "median:10%")
    assert rc == 0, capsys.readouterr().out


def test_defaults_are_per_key_latest_two_and_json(storage, capsys):
    cmp = compare_storage(storage)
    assert set(zip(cmp.table["base_run"], cmp.table["new_run"], strict=True)) == {("0003", "0004")}
    rc = compare("--storage", str(storage), "--json", "--fail", "mean:5%")
    payload = json.loads(capsys.readouterr().out)
    # 0004 is 0002 unchanged, 0003 is 1.2x slower: NEW is faster, nothing fails
    assert rc == 0 and payload["failed"] is False
    assert sorted((b["benchmark"], b["framework"], b["mode"], b["device"], b["batch_size"])
                  for b in payload["benchmarks"]) == [("test_step", "tiny", "eager", "cpu", 8),
                                                       ("test_step", "tiny", "eager", "cpu", 16)]
    for b in payload["benchmarks"]:
        assert b["mean_rel"] == pytest.approx(1 / 1.2 - 1)


def test_base_only_pairs_with_latest_later_run(storage):
    cmp = compare_storage(storage, "0001")
    assert sorted(zip(cmp.table["batch_size"], cmp.table["base_run"], cmp.table["new_run"], strict=True)) == [
        (8, "0001", "0004"), (16, "0001", "0004")]
    with pytest.raises(KernelmapError, match="NEW given without BASE"):
        compare_storage(storage, None, "0002")


def test_compare_numbers_are_the_files_numbers(storage):
    runs = list_runs(storage)
    base, new = pick_runs(runs, "1"), pick_runs(runs, "2")
    cmp = compare_runs(base, new, [Threshold.parse("mean:1000%")])
    raw = {b["extra_info"]["batch_size"]: b["stats"] for b in json.loads(base[0].path.read_text())["benchmarks"]}
    assert len(cmp.table) == 2
    for _, row in cmp.table.iterrows():
        assert row["mean_base"] == raw[row["batch_size"]]["mean"]
    assert not cmp.failed
    assert "ok: no benchmark beyond mean:1000%" in format_comparison(cmp)


def test_one_side_may_not_hold_a_key_twice(storage):
    with pytest.raises(KernelmapError, match=r"BASE holds test_step\[tiny-eager-cpu-8\] twice"):
        compare_storage(storage, "0001,0002", "0003")


def test_history_table(storage):
    h = load_history(storage)
    assert sorted(h["run"].unique()) == ["0001", "0002", "0003", "0004"]
    assert set(h["key"]) == {"tiny-eager-cpu-8", "tiny-eager-cpu-16"}
    assert h["unpaired"].isna().all()
    assert set(h["batch_size"]) == {8, 16}


def test_bad_threshold_and_missing_run(storage):
    with pytest.raises(KernelmapError):
        Threshold.parse("mean5")
    with pytest.raises(KernelmapError):
        Threshold.parse("ops:5%")
    with pytest.raises(KernelmapError, match="not found"):
        compare_storage(storage, "0009", "0002")


def test_broken_file_is_one_line_naming_it(tmp_path, capsys):
    bad = tmp_path / "st" / "m" / "0001_abc_20260101_000000.json"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    assert cli_main(["compare", "--storage", str(tmp_path / "st")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"kernelmap compare: error: {bad}: not valid JSON")


def test_params_and_extra_info_disagree(tmp_path):
    f = tmp_path / "m" / "0001_x.json"
    f.parent.mkdir()
    b = {"name": "test_train_step[pytorch-eager-cpu-64]", "params": {"batch_size": 64},
         "extra_info": {**BenchKey("pytorch", "eager", "cpu", 256).extra_info()}, "stats": {"mean": 1.0}}
    f.write_text(json.dumps({"benchmarks": [b]}))
    with pytest.raises(KernelmapError, match=r"0001_x.json: benchmark .*batch_size is 64 in params but 256 in extra_info"):
        compare_storage(tmp_path, str(f), str(f))


def _noxfile():
    from conftest import noxfile_module

    return noxfile_module()


# --- bench jobs: real per-framework --benchmark-json files, saved as one run per job ------------------
# tests/data/bench_jobs/job<N>/<framework>.json.gz: two jobs of `nox -s bench`'s step benchmarks (CPU,
# bs 64; tests/data/record_bench_fixtures.py), as pytest-benchmark wrote them.
JOBS = ROOT / "tests" / "data" / "bench_jobs"
JOB_IDS = ("20261126T044900Z", "20261126T045010Z")
FRAMEWORK_ORDER = ("jax", "mxnet", "pytorch")  # the noxfile's order (STEP_BENCH_FRAMEWORKS)
KEYS = ("jax-jit-cpu-64", "mxnet-imperative-cpu-64", "mxnet-hybridized-cpu-64", "pytorch-eager-cpu-64")
MACHINE = "Linux-CPython-3.11-64bit"


def _part(job: int, fw: str) -> dict:
    return json.loads(gzip.decompress((JOBS / f"job{job}" / f"{fw}.json.gz").read_bytes()))


@pytest.fixture
def parts(tmp_path) -> dict[int, list[Path]]:
    """job -> its per-framework files (decompressed into tmp_path), in the noxfile's order."""
    out = {}
    for job in (1, 2):
        d = tmp_path / f"parts{job}"
        d.mkdir()
        out[job] = []
        for fw in FRAMEWORK_ORDER:
            (d / f"{fw}.json").write_text(json.dumps(_part(job, fw)))
            out[job].append(d / f"{fw}.json")
    return out


def _saved_files(st: Path) -> list[str]:
    return sorted(str(p.relative_to(st)) for p in st.rglob("*") if p.is_file())


def _tag(job: int) -> str:
    first = _part(job, "jax")  # the job's earliest part
    when = datetime.fromisoformat(first["datetime"]).strftime("%Y%m%d_%H%M%S")
    return f"{first['commit_info']['id']}_{when}_uncommitted-changes"  # the fixtures' tree was dirty


def test_the_fixtures_are_the_step_benchmark_as_it_is_now():
    """The recorded parts hold what bench_train_step.py records: the key, blocks of BLOCK_STEPS
    steps (pytest-benchmark's iterations, stats per step), the GC off, the contention figure."""
    from kernelmap import timing

    for job in (1, 2):
        names = []
        for fw in FRAMEWORK_ORDER:
            for b in _part(job, fw)["benchmarks"]:
                names.append(b["extra_info"]["key"])
                assert b["name"] == f"test_train_step[{b['extra_info']['key']}]"
                assert b["stats"]["iterations"] == b["extra_info"]["steps_per_round"] == timing.BLOCK_STEPS
                assert b["stats"]["rounds"] == 2 == len(b["stats"]["data"])  # --benchmark-min-rounds=2
                assert b["options"]["disable_gc"] is True
                c = b["extra_info"]["contention"]
                assert isinstance(c["contended"], bool) and c["text"] and c["windows"] == 1
        assert names == list(KEYS)


def test_save_job_merges_every_framework_into_one_run(parts, tmp_path):
    st = tmp_path / "st"
    path = save_job(st, parts[1], JOB_IDS[0], machine=MACHINE)
    assert _saved_files(st) == [f"{MACHINE}/0001_{_tag(1)}.json"] and path == st / _saved_files(st)[0]
    saved = json.loads(path.read_text())
    inputs = [_part(1, fw) for fw in FRAMEWORK_ORDER]
    assert saved["kernelmap_job"] == JOB_IDS[0]
    assert saved["benchmarks"] == [b for d in inputs for b in d["benchmarks"]]  # each as pytest wrote it
    assert len(saved["benchmarks"]) == 4
    assert saved["datetime"] == inputs[0]["datetime"]  # the earliest part's
    assert saved["commit_info"] == inputs[0]["commit_info"]
    assert [p["framework"] for p in saved["kernelmap_parts"]] == list(FRAMEWORK_ORDER)
    assert [p["benchmarks"] for p in saved["kernelmap_parts"]] == [1, 2, 1]
    assert saved["machine_info"]["kernelmap"]["framework_versions"] == {
        fw: d["machine_info"]["kernelmap"]["framework_versions"] for fw, d in zip(FRAMEWORK_ORDER, inputs, strict=True)}
    assert "framework" not in saved["machine_info"]["kernelmap"]
    # it is one run of pytest-benchmark's storage: kernelmap reads it as such
    (run,) = list_runs(st)
    assert (run.number, run.machine, run.job) == ("0001", MACHINE, JOB_IDS[0])


def test_numbering_continues_and_nothing_is_overwritten(parts, tmp_path, monkeypatch):
    st = tmp_path / "st"
    older = {f"{MACHINE}/0001_abc_20260101_000000.json": b'{"benchmarks": []}',
             f"{MACHINE}/0003_abc_20260102_000000.json": b'{"benchmarks": [], "x": 3}',
             "Other-CPython-3.12-64bit/0007_abc_20260103_000000.json": b'{"benchmarks": []}'}
    for name, body in older.items():
        (st / name).parent.mkdir(parents=True, exist_ok=True)
        (st / name).write_bytes(body)
    first = save_job(st, parts[1], JOB_IDS[0], machine=MACHINE)
    assert first.name == f"0004_{_tag(1)}.json"  # after this machine's highest, not the other machine's
    # a writer that took the number in between: the next one is taken, nothing replaced
    real = BenchStorage.next_number
    asked = []

    def stale(self, machine):
        asked.append(machine)
        return "0003" if len(asked) == 1 else real(self, machine)

    monkeypatch.setattr(BenchStorage, "next_number", stale)
    second = save_job(st, parts[2], JOB_IDS[1], machine=MACHINE)
    assert second.name == f"0005_{_tag(2)}.json" and asked == [MACHINE, MACHINE]
    for name, body in older.items():
        assert (st / name).read_bytes() == body
    assert json.loads(first.read_text())["kernelmap_job"] == JOB_IDS[0]
    assert _saved_files(st) == sorted([*older, f"{MACHINE}/0004_{_tag(1)}.json", f"{MACHINE}/0005_{_tag(2)}.json"])
    # the very name taken (same number, same commit and time): not replaced, the next number taken
    asked.clear()
    before = first.read_bytes()

    def same_name(self, machine):
        asked.append(machine)
        return "0004" if len(asked) == 1 else real(self, machine)

    monkeypatch.setattr(BenchStorage, "next_number", same_name)
    third = save_job(st, parts[1], "again", machine=MACHINE)
    assert third.name == f"0006_{_tag(1)}.json" and asked == [MACHINE, MACHINE]
    assert first.read_bytes() == before and json.loads(third.read_text())["kernelmap_job"] == "again"


@pytest.mark.parametrize("damage, says", [
    ("missing", "no such file"),
    ("empty", "empty"),
    ("cut", "not valid JSON"),
    ("not pytest-benchmark", "not a pytest-benchmark JSON file"),
    ("no stats", "has no stats"),
])
def test_a_broken_part_is_an_error_naming_it_and_nothing_is_written(parts, tmp_path, capsys, damage, says):
    st = tmp_path / "st"
    bad = parts[1][1]  # mxnet's
    text = bad.read_text()
    if damage == "missing":
        bad.unlink()
    elif damage == "empty":
        bad.write_text("")
    elif damage == "cut":
        bad.write_text(text[: len(text) // 2])
    elif damage == "not pytest-benchmark":
        bad.write_text(json.dumps({"machine_info": {}}))
    else:
        data = json.loads(text)
        del data["benchmarks"][1]["stats"]
        bad.write_text(json.dumps(data))
    with pytest.raises(KernelmapError, match=re.escape(str(bad)) + ".*" + says):
        save_job(st, parts[1], JOB_IDS[0], machine=MACHINE)
    assert not st.exists() or _saved_files(st) == []
    assert cli_main(["save-job", "--job", JOB_IDS[0], "--storage", str(st), "--machine", MACHINE,
                     *map(str, parts[1])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"kernelmap save-job: error: {bad}: ")
    assert not st.exists() or _saved_files(st) == []


def test_a_key_in_two_parts_is_an_error_naming_both(parts, tmp_path):
    with pytest.raises(KernelmapError, match=re.escape(f"{parts[1][2]} and {parts[2][2]} both hold benchmark "
                                                       "'test_train_step[pytorch-eager-cpu-64]'")):
        save_job(tmp_path / "st", [parts[1][2], parts[2][2]], JOB_IDS[0], machine=MACHINE)
    assert not (tmp_path / "st").exists()


def test_save_job_cli_takes_the_job_from_the_environment(parts, tmp_path, capsys, monkeypatch):
    st = tmp_path / "st"
    monkeypatch.setenv(JOB_ENV, JOB_IDS[0])
    assert cli_main(["save-job", "--storage", str(st), "--machine", MACHINE, *map(str, parts[1])]) == 0
    path = st / MACHINE / f"0001_{_tag(1)}.json"
    assert capsys.readouterr().out == f"saved job {JOB_IDS[0]}: {path}\n"
    assert json.loads(path.read_text())["kernelmap_job"] == JOB_IDS[0]
    monkeypatch.delenv(JOB_ENV)
    assert cli_main(["save-job", "--storage", str(st), *map(str, parts[2])]) == 2
    assert "a job id is required" in capsys.readouterr().err


def test_machine_id_is_pytest_benchmarks():
    from pytest_benchmark.utils import get_machine_id

    assert machine_id() == get_machine_id()


@pytest.fixture
def one_job(parts, tmp_path) -> Path:
    st = tmp_path / "st"
    save_job(st, parts[1], JOB_IDS[0], machine=MACHINE)
    return st


@pytest.fixture
def two_jobs(one_job, parts) -> Path:
    save_job(one_job, parts[2], JOB_IDS[1], machine=MACHINE)
    return one_job


def test_compare_after_the_first_job_says_nothing_earlier_and_passes(one_job, capsys):
    assert cli_main(["compare", "--storage", str(one_job), "--fail", "mean:5%"]) == 0
    assert capsys.readouterr().out == (
        f"nothing earlier to compare yet (latest two saved runs per key on {MACHINE}): its 4 benchmark(s) are "
        f"saved in one job only, job {JOB_IDS[0]} (run 0001); the next bench job will be compared against it; "
        "mean:5% not applied\n")
    assert compare("--storage", str(one_job), "--json") == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["benchmarks"] == [] and payload["failed"] is False
    assert payload["nothing_earlier"].startswith("nothing earlier to compare yet")
    # a BASE named by the user with nothing later is still an error
    assert cli_main(["compare", "--storage", str(one_job), "0001"]) == 2
    assert capsys.readouterr().err.startswith("kernelmap compare: error: nothing to compare (BASE 0001 against ")


def test_compare_two_jobs_like_with_like(two_jobs, capsys):
    cmp = compare_storage(two_jobs)
    assert sorted(zip(cmp.table["framework"], cmp.table["mode"], cmp.table["base_run"], cmp.table["new_run"],
                      cmp.table["base_job"], cmp.table["new_job"], strict=True)) == [
        ("jax", "jit", "0001", "0002", *JOB_IDS), ("mxnet", "hybridized", "0001", "0002", *JOB_IDS),
        ("mxnet", "imperative", "0001", "0002", *JOB_IDS), ("pytorch", "eager", "0001", "0002", *JOB_IDS)]
    raw = {(job, b["extra_info"]["key"]): b for job in (1, 2) for fw in FRAMEWORK_ORDER
           for b in _part(job, fw)["benchmarks"]}
    for _, r in cmp.table.iterrows():
        key = f"{r['framework']}-{r['mode']}-cpu-64"
        assert (r["mean_base"], r["mean_new"]) == (raw[1, key]["stats"]["mean"], raw[2, key]["stats"]["mean"])
        for side, job in (("base", 1), ("new", 2)):
            c = raw[job, key]["extra_info"]["contention"]
            assert (r[f"contended_{side}"], r[f"contention_{side}"]) == (c["contended"], c["text"])
    rc = compare("--storage", str(two_jobs), "--fail", "mean:5%")
    out = capsys.readouterr().out
    slower = sorted(k for k in KEYS if raw[2, k]["stats"]["mean"] / raw[1, k]["stats"]["mean"] - 1 > 0.05)
    assert rc == (1 if slower else 0)
    assert sorted(line.split()[0].removeprefix("test_train_step[").removesuffix("]") for line in out.splitlines()
                  if "exceeds mean:5%" in line) == slower
    # every side measured under contention is named with its figure, and only those
    busy = [(k, side, raw[job, k]["extra_info"]["contention"]["text"]) for k in KEYS
            for side, job in (("BASE", 1), ("NEW", 2)) if raw[job, k]["extra_info"]["contention"]["contended"]]
    block = out.split("measured under contention", 1)[1].split("\n\n")[0] if busy else ""
    for k, side, text in busy:
        assert f"{side} {'0001' if side == 'BASE' else '0002'}: {text}" in next(
            line for line in block.splitlines() if f"[{k}]" in line)
    assert sum(f"[{k}]" in block for k in KEYS) == len({k for k, _, _ in busy})


def test_load_history_has_job_and_contention_columns(two_jobs):
    from kernelmap import timing

    h = load_history(two_jobs)
    assert {"job", "contended", "contention_text", "steps_per_round"} <= set(h.columns)
    assert len(h) == 8 and h["run"].tolist() == ["0001"] * 4 + ["0002"] * 4
    assert h["job"].tolist() == [JOB_IDS[0]] * 4 + [JOB_IDS[1]] * 4
    assert h["steps_per_round"].tolist() == [timing.BLOCK_STEPS] * 8
    want = [b["extra_info"]["contention"] for job in (1, 2) for fw in FRAMEWORK_ORDER
            for b in _part(job, fw)["benchmarks"]]
    assert h["contended"].tolist() == [c["contended"] for c in want]
    assert h["contention_text"].tolist() == [c["text"] for c in want]
    assert {True, False} <= set(h["contended"])  # the fixtures hold both


def test_trend_has_one_line_per_key_over_two_jobs(two_jobs, tmp_path):
    from kernelmap.reports import figures as F

    h = load_history(two_jobs)
    series = trend_series(h)
    assert sorted(series) == ["jax jit cpu bs64", "mxnet hybridized cpu bs64", "mxnet imperative cpu bs64",
                              "pytorch eager cpu bs64"]
    for label, s in series.items():
        fw, mode = label.split()[:2]
        key = f"{fw}-{mode}-cpu-64"
        assert s["x"].tolist() == [0, 1] and s["point"].tolist() == list(JOB_IDS)
        assert s["run"].tolist() == ["0001", "0002"]
        assert s["value"].tolist() == [next(b["stats"]["median"] for b in _part(job, fw)["benchmarks"]
                                            if b["extra_info"]["key"] == key) for job in (1, 2)]
    # each framework's colour is drawn as a line across the two jobs
    import matplotlib.colors as mcolors
    import matplotlib.image as mpimg

    png = F.trend_figure(h, tmp_path / "trend.png")
    img = (mpimg.imread(png)[..., :3] * 255).round().astype(int)
    for fw in FRAMEWORK_ORDER:
        rgb = np.array([round(c * 255) for c in mcolors.to_rgb(F.FW_COLOR[fw])])
        assert (np.abs(img - rgb).sum(axis=-1) <= 6).sum() > 200, fw


def test_trend_of_one_job_is_one_point_per_key(one_job):
    series = trend_series(load_history(one_job))
    assert len(series) == 4 and all(s["x"].tolist() == [0] for s in series.values())


# --- storages saved before jobs: one file per framework -------------------------------------------
def _old_storage(st: Path, jobs=(1, 2)) -> dict[str, tuple[int, str]]:
    """pytest-benchmark's autosave as `nox -s bench` made it before jobs: one run per framework
    (0001 JAX, 0002 MXNet, 0003 PyTorch, then the second job), the raw timings left out as
    --benchmark-autosave leaves them. Returns number -> (job, framework)."""
    made = {}
    for job in jobs:
        for fw in FRAMEWORK_ORDER:
            data = _part(job, fw)
            for b in data["benchmarks"]:
                del b["stats"]["data"]
            number = f"{len(made) + 1:04d}"
            path = st / MACHINE / f"{number}_{_tag(job)}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(data, indent=4))
            made[number] = (job, fw)
    return made


def test_old_storage_still_loads_and_compares_per_key(tmp_path, capsys):
    st = tmp_path / "st"
    _old_storage(st)
    cmp = compare_storage(st)
    assert sorted(zip(cmp.table["framework"], cmp.table["mode"], cmp.table["base_run"], cmp.table["new_run"],
                      strict=True)) == [("jax", "jit", "0001", "0004"), ("mxnet", "hybridized", "0002", "0005"),
                                        ("mxnet", "imperative", "0002", "0005"), ("pytorch", "eager", "0003", "0006")]
    assert cmp.table["base_job"].isna().all() and cmp.table["new_job"].isna().all()
    # BASE and NEW named as the two old jobs' files pair the same way
    both = compare_storage(st, "0001,0002,0003", "0004,0005,0006")
    cols = ["framework", "mode", "base_run", "new_run", "mean_base", "mean_new"]
    assert both.table[cols].equals(cmp.table[cols])
    h = load_history(st)
    assert h["job"].isna().all() and h["steps_per_round"].tolist() == [10] * 8
    series = trend_series(h)
    assert series["pytorch eager cpu bs64"]["point"].tolist() == ["run 0003", "run 0006"]
    assert series["jax jit cpu bs64"]["x"].tolist() == [0, 3]  # a run without a job is a job of its own


def test_old_storage_after_one_job_says_nothing_earlier(tmp_path, capsys):
    st = tmp_path / "st"
    _old_storage(st, jobs=(1,))
    assert cli_main(["compare", "--storage", str(st)]) == 0
    assert capsys.readouterr().out == (
        f"nothing earlier to compare yet (latest two saved runs per key on {MACHINE}): each of its 4 benchmark(s) "
        "is saved in one run only (run 0001 (no job recorded), run 0002 (no job recorded), run 0003 (no job "
        "recorded)); the next bench job will be compared against it\n")


def test_an_old_per_framework_run_against_a_job(tmp_path, parts):
    """Old runs and jobs in one storage: each key's latest two runs, whichever kind."""
    st = tmp_path / "st"
    _old_storage(st, jobs=(1,))
    save_job(st, parts[2], JOB_IDS[1], machine=MACHINE)
    cmp = compare_storage(st)
    assert sorted(zip(cmp.table["framework"], cmp.table["base_run"], cmp.table["new_run"], strict=True)) == [
        ("jax", "0001", "0004"), ("mxnet", "0002", "0004"), ("mxnet", "0002", "0004"), ("pytorch", "0003", "0004")]


def test_pytorch_run_against_mxnet_run_exits_2_naming_both(tmp_path, capsys):
    st = tmp_path / "st"
    _old_storage(st, jobs=(1,))
    rc = cli_main(["compare", "--storage", str(st), "0003", "0002", "--fail", "mean:5%"])
    cap = capsys.readouterr()
    assert rc == 2 and cap.out == ""
    assert cap.err == ("kernelmap compare: error: nothing to compare (BASE 0003, NEW 0002): "
                       f"BASE 0003 holds {PT}; NEW 0002 holds {MX[0]}, {MX[1]}\n")


def test_file_saved_before_keys_cannot_be_paired(tmp_path, capsys):
    """An old-style benchmark (``test_train_step[cpu-64]``: framework, device and batch size, no
    mode) is listed as unpairable, never matched to a keyed one."""
    st = tmp_path / "st"
    _old_storage(st)
    (src,) = st.glob("*/0006_*.json")
    old = json.loads(src.read_text())
    for b in old["benchmarks"]:
        b["name"], b["fullname"] = "test_train_step[cpu-64]", "benches/bench_train_step.py::test_train_step[cpu-64]"
        b["params"] = {"device": "cpu", "batch_size": 64}
        del b["extra_info"]["mode"], b["extra_info"]["key"]
    (src.parent / ("0007" + src.name[4:])).write_text(json.dumps(old))
    assert cli_main(["compare", "--storage", str(st), "0007", "0003"]) == 2
    assert capsys.readouterr().err == (
        "kernelmap compare: error: nothing to compare (BASE 0007, NEW 0003): BASE 0007 holds nothing pairable; "
        f"NEW 0003 holds {PT}; cannot be paired: 1 benchmark(s) in 0007 records no mode\n")
    h = load_history(st)
    assert h.loc[h["run"] == "0007", "unpaired"].tolist() == ["records no mode"]
    cmp = compare_storage(st)
    assert sorted(zip(cmp.table["framework"], cmp.table["new_run"], strict=True)) == [
        ("jax", "0004"), ("mxnet", "0005"), ("mxnet", "0005"), ("pytorch", "0006")]
    assert "cannot be paired: 1 benchmark(s) in 0007 records no mode" in format_comparison(cmp)


PT = "test_train_step[pytorch-eager-cpu-64]"
MX = ("test_train_step[mxnet-hybridized-cpu-64]", "test_train_step[mxnet-imperative-cpu-64]")


# --- the step benchmark itself ----------------------------------------------------------------------
def test_block_step_synchronises_once_per_block():
    """bench_train_step.block_step: the batches in turn and a device synchronisation on every
    BLOCK_STEPS-th call only (a stand-in workload logs them), so a pedantic round of BLOCK_STEPS
    iterations is one clean-pass block on the clean pass's batches."""
    code = """
import json, sys
sys.path.insert(0, "benches")
import bench_train_step as b
from kernelmap import timing

class W:
    def __init__(self): self.log = []
    def train_step(self, images, labels): self.log.append(f"step {images}"); return 0.0
    def synchronize(self): self.log.append("sync")

w = W()
step = b.block_step(w, [(0, "l0"), (1, "l1"), (2, "l2")])
for _ in range(2 * timing.BLOCK_STEPS + 3):
    step()
print(json.dumps({"block": timing.BLOCK_STEPS, "log": w.log}))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    block = got["block"]
    assert block > 1
    # every batch in turn (not one batch repeated), a synchronisation after each block
    steps = [f"step {i % 3}" for i in range(2 * block + 3)]
    assert got["log"] == steps[:block] + ["sync"] + steps[block:2 * block] + ["sync"] + steps[2 * block:]


@pytest.mark.slow
def test_the_noxfile_job_end_to_end(tmp_path, capsys):
    """PyTorch's step benchmark run by the noxfile's command line into a scratch file, then saved
    as a job: one run, BLOCK_STEPS steps per round, the rounds pytest-benchmark's rules give."""
    from kernelmap import timing

    nf = _noxfile()
    require_framework("pytorch")
    part = tmp_path / "pytorch.json"
    argv = nf.step_benchmark_argv("pytorch", part, "--benchmark-max-time=0.01", "--benchmark-min-rounds=3",
                                  "--bench-data=synthetic", "-k", "eager-cpu-64", "-q")
    assert argv[0] == "pytest" and f"--benchmark-json={part}" in argv and "--benchmark-autosave" not in argv
    proc = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert nf.job_parts({"pytorch": part}) == ([part], [])
    st = tmp_path / "st"
    assert cli_main(["save-job", "--job", "J", "--storage", str(st), str(part)]) == 0
    (run,) = list_runs(st)
    (b,) = run.data["benchmarks"]
    assert run.job == "J" and b["name"] == PT
    assert b["params"] == {"mode": "eager", "device": "cpu", "batch_size": 64}
    assert b["stats"]["iterations"] == b["extra_info"]["steps_per_round"] == timing.BLOCK_STEPS
    assert b["stats"]["rounds"] == 3  # max(min rounds, max time / one block's time): 0.01 s is less than a block
    assert b["options"]["disable_gc"] is True
    assert set(b["extra_info"]["contention"]) >= {"contended", "text", "other_cpu_cores_max", "windows"}


def test_mode_option_rejects_another_frameworks_mode():
    proc = subprocess.run([sys.executable, "-m", "pytest", "benches/bench_train_step.py", "--framework=pytorch",
                           "--mode=hybridized", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "--mode hybridized: pytorch runs only eager" in proc.stderr


def test_step_benchmarks_keep_the_frameworks_own_deprecations_off_the_console(tmp_path):
    """MXNet 1.9.1 raised 11 DeprecationWarnings in `nox -s bench`'s step-benchmark summary. Stand-in
    packages named like every framework's modules raise one at import; under the step benchmarks'
    conftest (loaded as a plugin) none reaches pytest's summary, while another library's still does."""
    from kernelmap import frameworks

    names = [m for d in frameworks.REGISTRY.values() for m in d.import_names]
    for name in [*names, "otherlib"]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"import warnings\nwarnings.warn('deprecated in {name}', DeprecationWarning)\n")
    (tmp_path / "test_imports.py").write_text(
        "def test_imports():\n" + "".join(f"    import {n}  # noqa: F401\n" for n in [*names, "otherlib"]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "benches"), str(tmp_path),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-c", os.devnull,
                           "--rootdir", str(tmp_path), str(tmp_path / "test_imports.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "deprecated in otherlib" in proc.stdout  # the filter is narrow: other warnings still show
    shown = [n for n in names if f"deprecated in {n}\n" in proc.stdout]
    assert shown == [], proc.stdout[-3000:]
