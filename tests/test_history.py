"""kernelmap compare against real pytest-benchmark storage made in a subprocess."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernelmap import history
from kernelmap.errors import KernelmapError
from kernelmap.history import Threshold, compare_runs, format_comparison, load_history, select_runs

pytest.importorskip("pytest_benchmark")

TINY = '''
import pytest

@pytest.mark.parametrize("batch_size", [8, 16])
def test_step(benchmark, batch_size):
    benchmark.extra_info["framework"] = "tiny"
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
    assert "FAILED" in out and "+20.0%" in out
    assert "test_step[8]" in out and "test_step[16]" in out


def test_unchanged_rerun_passes(storage, capsys):
    rc = compare("--storage", str(storage), "0002", "0004", "--fail", "mean:5%",
                   "--fail", "median:10%")
    assert rc == 0, capsys.readouterr().out


def test_defaults_are_two_latest_and_json(storage, capsys):
    base, new = select_runs(storage, None, None)
    assert (base.number, new.number) == ("0003", "0004")
    rc = compare("--storage", str(storage), "--json", "--fail", "mean:5%")
    payload = json.loads(capsys.readouterr().out)
    # 0004 is 0002 unchanged, 0003 is 1.2x slower: NEW is faster, nothing fails
    assert rc == 0 and payload["failed"] is False
    assert {b["name"].split("::")[-1] for b in payload["benchmarks"]} == {"test_step[8]", "test_step[16]"}
    for b in payload["benchmarks"]:
        assert b["mean_rel"] == pytest.approx(1 / 1.2 - 1)


def test_compare_numbers_are_the_files_numbers(storage):
    base, new = select_runs(storage, "1", "2")
    cmp = compare_runs(base, new, [Threshold.parse("mean:1000%")])
    raw = {b["fullname"]: b["stats"] for b in json.loads(base.path.read_text())["benchmarks"]}
    for _, row in cmp.table.iterrows():
        assert row["mean_base"] == raw[row["name"]]["mean"]
    assert not cmp.failed
    assert "ok: no benchmark beyond mean:1000%" in format_comparison(cmp)


def test_history_table(storage):
    h = load_history(storage)
    assert sorted(h["run"].unique()) == ["0001", "0002", "0003", "0004"]
    assert set(h["framework"]) == {"tiny"}
    assert set(h["batch_size"]) == {8, 16}


def test_bad_threshold_and_missing_run(storage):
    with pytest.raises(KernelmapError):
        Threshold.parse("mean5")
    with pytest.raises(KernelmapError):
        Threshold.parse("ops:5%")
    with pytest.raises(KernelmapError, match="not found"):
        select_runs(storage, "0009", "0002")
