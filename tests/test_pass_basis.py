"""One time basis per comparison between two capture passes (reports/analyses/basis.PAIR_RULE): a library call
of the libs pass is held against its op of the framework pass only where the two passes ran alike.

Fixture: tests/data/cpu_quiet_bench, MXNet's part of the quiet CPU bench job the sample report shows
(20261127T041409Z, both batch sizes, every pass quiet). At bs 256 MXNet's libs pass (oneDNN's verbose log) ran
79.58 ms/step against its framework pass's 36.75: its oneDNN calls read longer than the ops they run in (conv1
fwd 8.466 ms/step inside an op of 3.475), which "library call within its op" failed on 5 rows of 8.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from kernelmap.reports import analysis as A
from kernelmap.reports import checks as C
from kernelmap.reports.analyses.basis import pair_basis, pass_states

from kernelmap import timing
from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data"
SLOWED = ("MXNet's libs pass ran 2.17x its framework pass (79.58 against 36.75 ms/step), slower beyond noise")
# the five rows of bs 256 whose calls read longer than their ops beyond noise (the sample report's five FAILs)
ABOVE = ["conv1 fwd", "conv2 bwd", "conv2 fwd", "fc1 bwd", "fc1 fwd"]


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pair") / "cpu_quiet_bench"
    shutil.copytree(DATA / "cpu_quiet_bench", d)
    normalise_run_dir(d)
    return d


def _within(d: Path) -> pd.DataFrame:
    c = C.self_checks([A.load_run(d)])
    return c[c["check"] == C.Check.CALL_WITHIN_OP]


def _entry(d: Path, bs: int) -> dict:
    return next(r for r in json.loads((d / "results.json").read_text()) if r["batch_size"] == bs)


def _doctored(bench: Path, tmp_path: Path, bs: int, edit) -> Path:
    """A copy of the normalised fixture with ``edit`` applied to its results.json entry of batch size ``bs``."""
    d = tmp_path / "doctored"
    shutil.copytree(bench, d)
    res = json.loads((d / "results.json").read_text())
    edit(next(x for x in res if x["batch_size"] == bs))
    (d / "results.json").write_text(json.dumps(res))
    return d


def test_the_passes_as_recorded(bench):
    r = _entry(bench, 256)
    libs, fw = r["passes"]["libs"], r["passes"]["framework"]
    assert (round(libs["median_step_s"] * 1e3, 2), round(fw["median_step_s"] * 1e3, 2)) == (79.58, 36.75)
    assert libs["contention"]["contended"] is False and fw["contention"]["contended"] is False
    assert r["contention"]["contended"] is False and len(r["trial_medians_s"]) == 5


def test_the_widened_interval_is_the_process_rule_around_the_framework_pass(bench):
    """[16.43-57.08] ms: the framework pass's median +- t(4) x s x sqrt(1 + 1/5), s of the 5 clean trials'
    medians as a share of the clean median, by the standard library."""
    r = _entry(bench, 256)
    meds, fw = r["trial_medians_s"], r["passes"]["framework"]
    half = 2.776 * statistics.stdev(meds) * math.sqrt(1 + 1 / 5) / r["median_step_s"] * fw["median_step_s"]
    assert timing.t975(4) == 2.776
    pair = pair_basis(pass_states([A.load_run(bench)]), "cpu_quiet_bench", "mxnet", 256, "libs", "framework")
    assert pair.same is False and pair.ratio == pytest.approx(libs_over_fw(r), rel=1e-12)
    lo, hi = (fw["median_step_s"] - half) * 1e3, (fw["median_step_s"] + half) * 1e3
    assert f"against framework [{lo:.4g}–{hi:.4g}] ms" in pair.why and (f"{lo:.4g}", f"{hi:.4g}") == ("16.43", "57.08")
    assert pair.why.startswith(SLOWED)
    # bs 64: 20.37 against 20.56 ms/step, their own intervals overlap: one basis
    same = pair_basis(pass_states([A.load_run(bench)]), "cpu_quiet_bench", "mxnet", 64, "libs", "framework")
    assert same.same is True and "within noise" in same.why


def libs_over_fw(r: dict) -> float:
    return float(np.median(r["passes"]["libs"]["step_times_s"]) / np.median(r["passes"]["framework"]["step_times_s"]))


def test_calls_of_a_slowed_libs_pass_are_not_held_against_their_ops(bench):
    rows = _within(bench)
    assert {(bs, s): n for (bs, s), n in rows.groupby(["batch_size", "status"]).size().items()} == {
        (64, C.PASS): 8, (256, C.NOT_CHECKED): 8}
    at256 = rows[rows["batch_size"] == 256].set_index("subject")
    assert all(SLOWED in d and "not one time basis" in d for d in at256["detail"])
    conv1 = at256.loc["conv1 fwd"]
    assert (conv1["measured"], conv1["expected"]) == (pytest.approx(8.4656245), pytest.approx(3.4751))
    # the layer table's cell says why its call time is not held against the op time; bs 64's say nothing
    lt = A.layer_table([A.load_run(bench)])
    said = lt["time_source"].str.contains("not held against the op time", regex=False)
    assert sorted(lt.loc[said, "batch_size"].tolist()) == [256] * 8 and said.sum() == 8


def test_the_check_still_fails_where_the_passes_ran_alike(bench, tmp_path):
    """The libs pass's step figures set to the framework pass's (one basis): the five calls above their ops fail."""
    def alike(r: dict) -> None:
        fw = r["passes"]["framework"]
        r["passes"]["libs"].update({k: fw[k] for k in ("median_step_s", "ci95_low_s", "ci95_high_s", "step_times_s")})
    rows = _within(_doctored(bench, tmp_path, 256, alike))
    at256 = rows[rows["batch_size"] == 256]
    assert sorted(at256.loc[at256["status"] == C.FAIL, "subject"]) == ABOVE
    assert (at256["status"] == C.PASS).sum() == 3 and (at256["status"] == C.NOT_CHECKED).sum() == 0


def test_a_libs_pass_faster_beyond_noise_is_withheld_too(bench, tmp_path):
    def faster(r: dict) -> None:
        libs = r["passes"]["libs"]
        libs.update({k: v / 4 for k, v in libs.items() if k in ("median_step_s", "ci95_low_s", "ci95_high_s")},
                    step_times_s=[v / 4 for v in libs["step_times_s"]])
    rows = _within(_doctored(bench, tmp_path, 64, faster))
    at64 = rows[rows["batch_size"] == 64]
    assert set(at64["status"]) == {C.NOT_CHECKED}
    assert all("faster beyond noise" in x for x in at64["detail"])


def _vs_batch(d: Path) -> pd.DataFrame:
    c = C.self_checks([A.load_run(d)])
    return c[c["check"] == C.Check.LAYER_VS_BATCH]


def test_layer_time_vs_batch_size_holds_no_slowed_pass_against_another(bench, tmp_path):
    """bs 64 -> 256 library-call time: bs 256's libs pass ran 1.76x its clean pass (45.11 ms), bs 64's within
    noise of its own: the 8 library-call rows not checked, saying so; the 8 framework-op rows (both framework
    passes within noise of their clean passes) checked. The libs pass set to its clean pass's figures: all 16 checked."""
    rows = _vs_batch(bench)
    lib = rows[rows["subject"].str.contains("library-call time")]
    op = rows[rows["subject"].str.contains("framework-op time")]
    assert (len(lib), len(op)) == (8, 8)
    assert set(lib["status"]) == {C.NOT_CHECKED} and set(op["status"]) == {C.PASS}
    assert set(lib["detail"]) == {"not held against each other: bs 256: MXNet's libs pass ran 1.76x its clean pass"}

    def like_clean(r: dict) -> None:
        r["passes"]["libs"].update({k: r[k] for k in ("median_step_s", "ci95_low_s", "ci95_high_s", "step_times_s")})
    rows = _vs_batch(_doctored(bench, tmp_path, 256, like_clean))
    assert (rows["status"] == C.NOT_CHECKED).sum() == 0 and len(rows) == 16
