"""The counters pass's self-checks (reports/counterchecks.py) on the real bf16 capture with the stand-in timing
step of test_roofline_counters: each passes where it should and fails, naming why, where it should not."""

from __future__ import annotations

from pathlib import Path

from kernelmap.reports.analyses.base import Run
from kernelmap.reports.checkrows import FAIL, NOT_CHECKED, PASS, Check
from kernelmap.reports.counterchecks import counter_checks
from test_roofline_counters import MATH, PEAKS, _names, _run

CSV = "pytorch/bs64/counters/ncu.csv"


def _by_check(rows: list[dict]) -> dict[str, dict]:
    assert len(rows) == 3
    return {r["check"]: r for r in rows}


def test_all_pass_where_the_steps_agree(tmp_path):
    rows = _by_check(counter_checks(_run(tmp_path, _names(), {"csv": CSV, "peaks": PEAKS, "ncu_wall_s": 22.0})))
    cover, math, budget = rows[Check.COUNTERS_COVER], rows[Check.COUNTER_MATH], rows[Check.COUNTERS_BUDGET]
    assert (cover["status"], cover["measured"]) == (PASS, "100.0%")
    assert cover["detail"] == "31 of 31 counted kernels paired with the kineto step's 31"
    # the three stand-in bf16 kernels and cuDNN's three layout transforms, FP32 by their compute type (the conv's FMA
    # kernel and cuBLASLt's split-K reduction have a log math, but the probe's counters lack HFMA2.MMA: unknown)
    assert (math["status"], math["measured"]) == (PASS, "6 of 6")
    assert (budget["status"], budget["measured"]) == (PASS, "22.0 s")


def test_each_fails_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.setitem(MATH, 18, "tf32")
    names = _names()
    names[11] = "cutlass__5x_cudnn::Kernel<something_else>"
    rows = _by_check(counter_checks(_run(tmp_path, names, {"csv": CSV, "peaks": PEAKS, "ncu_wall_s": 75.0})))
    cover, math, budget = rows[Check.COUNTERS_COVER], rows[Check.COUNTER_MATH], rows[Check.COUNTERS_BUDGET]
    assert cover["status"] == FAIL and "name differs at position 11" in cover["detail"]
    # the unpaired fprop leaves two bf16 kernels and the three layout transforms compared; the log calls one tf32
    assert (math["status"], math["measured"]) == (FAIL, "4 of 5")
    assert math["detail"] == ("nvjet_sm90_tst_64x32_64x16_2x2_h_bz_splitK_bias_TNT: log tf32, counters bf16 (3 of them "
                              "by the kernel's name alone, not the call's math: 0 FMA-unit kernel(s), 3 that multiply "
                              "no operands (layout, FFT and Winograd transforms, split-K reductions, elementwise, "
                              "pooling: their template's compute type))")
    assert (budget["status"], budget["measured"]) == (FAIL, "75.0 s")


def test_not_checked_where_the_pass_recorded_nothing(tmp_path):
    why = "Nsight Compute reads an NVIDIA GPU's counters; this case runs on the CPU"
    rows = _by_check(counter_checks(_run(tmp_path, _names(), {"skipped": why})))
    assert {r["status"] for r in rows.values()} == {NOT_CHECKED}
    assert rows[Check.COUNTERS_COVER]["detail"] == f"the counters pass recorded nothing: {why}"


def test_no_rows_without_a_counters_pass(tmp_path):
    assert counter_checks(Run(Path(tmp_path), {}, [{"case": "pytorch", "batch_size": 64, "dir": "pytorch/bs64"}])) == []
