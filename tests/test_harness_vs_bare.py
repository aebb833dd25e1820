"""benches/harness_vs_bare.py on a real run recorded on an H200 by the GPU job of commit 78dc362
(tests/data/harness_h200: the bare loops' JSON lines and each `kernelmap run --json` summary, as the job wrote
them): medians over processes, their ranges and kernelmap / bare, exact."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benches"))
import harness_vs_bare as H  # noqa: E402

DATA = Path(__file__).parent / "data" / "harness_h200"


def test_every_mode_and_batch_size_has_five_processes_each():
    rows = H.summarise(H.collect(DATA))
    assert [(r["mode"], r["batch_size"]) for r in rows] == [
        (m, bs) for m in ("jax", "mxnet", "mxnet-hybridized", "pytorch") for bs in (64, 1024)]
    assert all(r["bare_n"] == 5 and r["kernelmap_n"] == 5 for r in rows)


def test_medians_ranges_and_ratio_are_the_runs():
    rows = {(r["mode"], r["batch_size"]): r for r in H.summarise(H.collect(DATA))}
    r = rows[("pytorch", 1024)]
    assert r["bare_ms"] == pytest.approx(2.644, abs=5e-4) and r["kernelmap_ms"] == pytest.approx(2.636, abs=5e-4)
    assert r["ratio"] == pytest.approx(r["kernelmap_ms"] / r["bare_ms"])
    assert r["bare_range_ms"][0] == pytest.approx(2.626, abs=5e-4)
    # the harness is never slower than the bare loop by more than 5% on this run
    assert max(x["ratio"] for x in rows.values()) < 1.05
    text = H.format_rows(list(rows.values()))
    assert "pytorch 1024 | 2.644 [2.626-2.667] (5) | 2.636 [2.620-2.650] (5) | 0.997 | 1.5%" in text


def test_an_empty_run_summary_is_left_out(tmp_path):
    (tmp_path / "bare.jsonl").write_text((DATA / "bare.jsonl").read_text().splitlines()[0] + "\n")
    (tmp_path / "run-pytorch-1.json").write_text("")
    rows = H.summarise(H.collect(tmp_path))
    assert all(r["kernelmap_n"] == 0 and "ratio" not in r for r in rows)
