"""kernelmap compare against real pytest-benchmark storage made in subprocesses: a tiny keyed
benchmark (thresholds, selection, errors) and the real step benchmarks run as ``nox -s bench``
runs them (pairing like with like)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import require_framework

from kernelmap import history
from kernelmap.cli import main as cli_main
from kernelmap.errors import KernelmapError
from kernelmap.history import (
    BenchKey,
    Threshold,
    compare_runs,
    compare_storage,
    format_comparison,
    list_runs,
    load_history,
    pick_runs,
    trend_series,
)

pytest.importorskip("pytest_benchmark")

ROOT = Path(__file__).resolve().parents[1]

TINY = '''
import pytest
from kernelmap.history import BenchKey

@pytest.mark.parametrize("batch_size", [8, 16])
def test_step(benchmark, batch_size):
    benchmark.extra_info.update(BenchKey("tiny", "eager", "cpu", batch_size).extra_info())
    benchmark(sum, range(batch_size * 100))
'''


@pytest.fixture(scope="module")
def storage(tmp_path_factory) -> Path:
    """Two real autosaved runs (0001, 0002), a copy of 0002 with every time stat scaled by 1.2
    (0003), and an unchanged copy of 0002 (0004)."""
    root = tmp_path_factory.mktemp("bench")
    (root / "test_tiny.py").write_text(TINY)
    (root / "pytest.ini").write_text("[pytest]\n")
    st = root / "st"
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_tiny.py",
             "--benchmark-autosave", f"--benchmark-storage={st}", "--benchmark-min-rounds=5",
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
        b["stats"]["ops"] /= 1.2
    stem = files[1].name[4:]
    (files[1].parent / f"0003{stem}").write_text(json.dumps(slow))
    shutil.copy(files[1], files[1].parent / f"0004{stem}")
    return st


def compare(*argv: str) -> int:
    """``kernelmap compare ARGV`` through the module's own parser (as kernelmap.cli dispatches it)."""
    parser = argparse.ArgumentParser()
    history.add_arguments(parser)
    return history.main(parser.parse_args(argv))


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


# --- the real step benchmarks, run as `nox -s bench` runs them ----------------------------------
def _noxfile():
    from conftest import noxfile_module

    return noxfile_module()


@pytest.fixture(scope="module")
def bench_storage(tmp_path_factory) -> Path:
    """Two bench jobs, each one pytest process per framework (noxfile's own command line), CPU,
    batch size 64, synthetic data: 0001 PyTorch, 0002 MXNet, 0003 PyTorch, 0004 MXNet."""
    nf = _noxfile()
    job = ("pytorch", "mxnet")  # two frameworks of the noxfile's list are enough to test the pairing
    assert set(job) <= set(nf.STEP_BENCH_FRAMEWORKS)
    for fw in job:
        require_framework(fw)
    st = tmp_path_factory.mktemp("steps") / "st"
    for _job in range(2):
        for fw in job:
            argv = nf.step_benchmark_argv(fw, f"--benchmark-storage={st}", "--benchmark-max-time=0.01",
                                          "--benchmark-min-rounds=2", "--bench-data=synthetic", "-k", "cpu-64", "-q")
            assert argv[0] == "pytest"
            proc = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True,
                                  timeout=600)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [p.name[:4] for p in sorted(st.glob("*/*.json"))] == ["0001", "0002", "0003", "0004"]
    return st


def _saved(st: Path, number: str) -> dict:
    (path,) = st.glob(f"*/{number}_*.json")
    return json.loads(path.read_text())


PT = "test_train_step[pytorch-eager-cpu-64]"
MX = ("test_train_step[mxnet-hybridized-cpu-64]", "test_train_step[mxnet-imperative-cpu-64]")


@pytest.mark.slow
def test_bench_names_and_records_its_key(bench_storage):
    for number, names in (("0001", [PT]), ("0002", list(MX)), ("0003", [PT]), ("0004", list(MX))):
        benches = _saved(bench_storage, number)["benchmarks"]
        assert sorted(b["name"] for b in benches) == names
        for b in benches:
            fw, mode, device, bs = b["name"].split("[")[1].rstrip("]").split("-")
            assert b["params"] == {"mode": mode, "device": device, "batch_size": int(bs)}
            assert {k: b["extra_info"][k] for k in ("framework", "mode", "device", "batch_size", "key")} == {
                "framework": fw, "mode": mode, "device": device, "batch_size": int(bs), "key": f"{fw}-{mode}-cpu-64"}


@pytest.mark.slow
def test_pytorch_run_against_mxnet_run_exits_2_naming_both(bench_storage, capsys):
    rc = cli_main(["compare", "--storage", str(bench_storage), "0001", "0002", "--fail", "mean:5%"])
    cap = capsys.readouterr()
    assert rc == 2 and cap.out == ""
    assert cap.err == ("kernelmap compare: error: nothing to compare (BASE 0001, NEW 0002): "
                       f"BASE 0001 holds {PT}; NEW 0002 holds {MX[0]}, {MX[1]}\n")


@pytest.mark.slow
def test_two_pytorch_runs_pair_row_for_row(bench_storage, capsys):
    assert compare("--storage", str(bench_storage), "0001", "0003") == 0
    out = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(out) if line.startswith("benchmark "))
    rows = [line.split() for line in out[header + 1:] if line.strip()]
    assert [r[:8] for r in rows] == [["test_train_step", "pytorch", "eager", "cpu", "64", "0001", "->", "0003"]]
    cmp = compare_storage(bench_storage, "1", "3")
    base_mean = _saved(bench_storage, "0001")["benchmarks"][0]["stats"]["mean"]
    new_mean = _saved(bench_storage, "0003")["benchmarks"][0]["stats"]["mean"]
    assert cmp.table[["mean_base", "mean_new"]].values.tolist() == [[base_mean, new_mean]]
    assert cmp.only_base == [] and cmp.only_new == [] and cmp.unpaired == []


@pytest.mark.slow
def test_compare_after_two_bench_jobs_pairs_like_with_like(bench_storage, capsys):
    """`nox -s bench` twice, then `nox -s compare`'s defaults: each key against its own previous run."""
    cmp = compare_storage(bench_storage)
    got = sorted(zip(cmp.table["framework"], cmp.table["mode"], cmp.table["base_run"], cmp.table["new_run"],
                     strict=True))
    assert got == [("mxnet", "hybridized", "0002", "0004"), ("mxnet", "imperative", "0002", "0004"),
                   ("pytorch", "eager", "0001", "0003")]
    assert compare("--storage", str(bench_storage)) == 0
    out = capsys.readouterr().out
    assert sum(line.startswith("test_train_step  mxnet ") for line in out.splitlines()) == 2
    assert sum(line.startswith("test_train_step  pytorch ") for line in out.splitlines()) == 1
    # the same selection with BASE and NEW named as the two jobs' files
    both = compare_storage(bench_storage, "0001,0002", "0003,0004")
    assert both.table.drop(columns=["label"]).equals(cmp.table.drop(columns=["label"]))


@pytest.mark.slow
def test_compare_after_one_bench_job_says_each_key_is_saved_once(bench_storage, tmp_path, capsys):
    one = tmp_path / "st"
    for p in sorted(bench_storage.glob("*/000[12]_*.json")):
        (one / p.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(p, one / p.parent.name / p.name)
    assert cli_main(["compare", "--storage", str(one)]) == 2
    machine = next(one.iterdir()).name
    assert capsys.readouterr().err == (
        f"kernelmap compare: error: nothing to compare (latest two saved runs per key on {machine}): "
        f"no key is saved in two runs; saved once: {MX[0]} in 0002, {MX[1]} in 0002, {PT} in 0001\n")


@pytest.mark.slow
def test_file_saved_before_keys_cannot_be_paired(bench_storage, tmp_path, capsys):
    """An old-style benchmark (``test_train_step[cpu-64]``: framework, device and batch size, no
    mode) is listed as unpairable, never matched to a keyed one."""
    st = tmp_path / "st"
    shutil.copytree(bench_storage, st)
    (src,) = st.glob("*/0003_*.json")
    old = json.loads(src.read_text())
    for b in old["benchmarks"]:
        b["name"], b["fullname"] = "test_train_step[cpu-64]", "benches/bench_train_step.py::test_train_step[cpu-64]"
        b["params"] = {"device": "cpu", "batch_size": 64}
        del b["extra_info"]["mode"], b["extra_info"]["key"]
    (src.parent / ("0005" + src.name[4:])).write_text(json.dumps(old))
    assert cli_main(["compare", "--storage", str(st), "0005", "0001"]) == 2
    assert capsys.readouterr().err == (
        "kernelmap compare: error: nothing to compare (BASE 0005, NEW 0001): BASE 0005 holds nothing pairable; "
        f"NEW 0001 holds {PT}; cannot be paired: 1 benchmark(s) in 0005 records no mode\n")
    h = load_history(st)
    assert h.loc[h["run"] == "0005", "unpaired"].tolist() == ["records no mode"]
    # the default selection still pairs the keyed runs and says what it left out
    cmp = compare_storage(st)
    assert sorted(zip(cmp.table["framework"], cmp.table["new_run"], strict=True)) == [
        ("mxnet", "0004"), ("mxnet", "0004"), ("pytorch", "0003")]
    assert "cannot be paired: 1 benchmark(s) in 0005 records no mode" in format_comparison(cmp)


@pytest.mark.slow
def test_trend_has_one_series_per_key(bench_storage, tmp_path):
    from kernelmap.reports import figures as F

    h = load_history(bench_storage)
    series = trend_series(h)
    assert sorted(series) == ["mxnet hybridized cpu bs64", "mxnet imperative cpu bs64", "pytorch eager cpu bs64"]
    pt = series["pytorch eager cpu bs64"]
    assert pt["run"].tolist() == ["0001", "0003"]
    assert pt["value"].tolist() == [_saved(bench_storage, n)["benchmarks"][0]["stats"]["median"]
                                    for n in ("0001", "0003")]
    for label in MX:
        mode = label.split("-")[1]
        s = series[f"mxnet {mode} cpu bs64"]
        assert s["run"].tolist() == ["0002", "0004"]
        assert s["value"].tolist() == [next(b["stats"]["median"] for b in _saved(bench_storage, n)["benchmarks"]
                                            if b["name"] == label) for n in ("0002", "0004")]
    # both benchmarked frameworks' colours are drawn
    import matplotlib.colors as mcolors
    import matplotlib.image as mpimg

    png = F.trend_figure(h, tmp_path / "trend.png")
    img = (mpimg.imread(png)[..., :3] * 255).round().astype(int)
    for fw in ("pytorch", "mxnet"):
        colour = F.FW_COLOR[fw]
        rgb = np.array([round(c * 255) for c in mcolors.to_rgb(colour)])
        assert (np.abs(img - rgb).sum(axis=-1) <= 6).sum() > 200, fw


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
