"""``library call within its op`` holds a call against its op only where both passes ran under one condition, and
compares per-step medians (reports/relations.py, ``SAME_CONDITION_RULE``).

Job 20261127T144314Z (the default CPU bench, mostly quiet) failed MXNet bs 64's fc2 forward: 0.1623 ms/step of calls
(libs pass, quiet) above its op's 0.04775 (framework pass, busy), a mean over 20 calls of which one lost its time
slice (1.77 ms; median 0.077), and a small MXNet op runs 3-4x faster beside a busy process (docs/checks.md).
Fixture: tests/data/cpu_quiet_bench (MXNet, both passes quiet), its contention records doctored here from
tests/data/cpu_busy_run's real busy framework pass.
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pandas as pd
import pytest
from kernelmap.reports import analysis as A
from kernelmap.reports import checks as C

from kernelmap import schema
from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data"
MIXED = ("the libs pass was quiet and the framework pass busy (small ops move opposite ways under load); "
         "libs pass: quiet: other processes used at most 0.00 of 2 cores, framework pass: BUSY: other processes "
         "used 1.9 of 2 cores")


def normalised_copy(tmp_path_factory, name: str) -> Path:
    """A normalised copy of the fixture run ``name``."""
    d = tmp_path_factory.mktemp("condition") / name
    shutil.copytree(DATA / name, d)
    normalise_run_dir(d)
    return d


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> Path:
    return normalised_copy(tmp_path_factory, "cpu_quiet_bench")


def busy_record() -> dict:
    """The real busy framework pass's contention record of tests/data/cpu_busy_run."""
    return json.loads((DATA / "cpu_busy_run" / "results.json").read_text())[0]["passes"]["framework"]["contention"]


def busy_copy(bench: Path, dest: Path, passes: tuple[str, ...]) -> Path:
    """A copy of the normalised fixture whose MXNet bs 64 ``passes`` ran busy."""
    shutil.copytree(bench, dest)
    res = json.loads((dest / "results.json").read_text())
    r = next(x for x in res if x["framework"] == "mxnet" and x["batch_size"] == 64)
    for p in passes:
        r["passes"][p]["contention"] = busy_record()
    (dest / "results.json").write_text(json.dumps(res))
    return dest


def within(d: Path, fw: str = "mxnet") -> pd.DataFrame:
    c = C.self_checks([A.load_run(d)])
    c = c[(c["check"] == C.Check.CALL_WITHIN_OP) & (c["framework"] == fw) & (c["batch_size"] == 64)]
    return c.set_index("subject")


def scale_calls(d: Path, layer: str, directions: tuple[str, ...], factor: float, last_only: bool = False,
                fw: str = "mxnet") -> None:
    """``fw`` bs 64's logged calls of one layer x direction (one warm-up and 20 timed steps each) made ``factor``
    longer: all of them, or the last one only (one call descheduled)."""
    rec = schema.read_parquet(d / "records.parquet")
    hit = (rec["framework"].eq(fw) & rec["batch_size"].eq(64) & rec["kind"].eq("library_call")
           & rec["layer"].eq(layer) & rec["direction"].isin(directions))
    assert int(hit.sum()) == 21 * len(directions)
    idx = rec.index[hit][-1:] if last_only else rec.index[hit]
    rec.loc[idx, "dur_ns"] = (rec.loc[idx, "dur_ns"] * factor).astype(rec["dur_ns"].dtype)
    schema.write_parquet(rec, d / "records.parquet")


def test_a_quiet_libs_pass_is_not_held_against_a_busy_framework_pass(bench, tmp_path):
    """Before the mend fc2 forward's call (0.1225 ms/step) was held against its op (0.1047) under the 5% rule and
    failed; now every row says why it is not checked."""
    rows = within(busy_copy(bench, tmp_path / "mixed", ("framework",)))
    assert len(rows) == 8 and set(rows["status"]) == {C.NOT_CHECKED}
    assert all(d.endswith(MIXED) for d in rows["detail"])
    fc2 = rows.loc["fc2 fwd"]
    assert fc2["detail"].startswith("library-call time 0.1321 ms/step (libs pass, median of 20 steps) not held "
                                    "against its op's 0.101 ms/step (framework pass, median of 20 steps): ")


def test_both_passes_busy_no_call_is_held_against_its_op(bench, tmp_path):
    """Both passes busy, each its own process at its own time (checkrows.BOTH_CONTENDED_RULE): fc2 backward's calls
    planted 3x longer (0.2593 ms/step median against the op's 0.123) are not held, nor any other row (conv2, fc1 and
    fc2 forward failed the 5% rule unplanted before); the same plant on the quiet passes fails beyond the noise between
    processes."""
    d = busy_copy(bench, tmp_path / "busy", ("framework", "libs"))
    scale_calls(d, "fc2", ("bwd_data", "bwd_weight"), 3)
    rows = within(d)
    assert len(rows) == 8 and set(rows["status"]) == {C.NOT_CHECKED}
    fc2 = rows.loc["fc2 bwd"]
    assert fc2["measured"] == pytest.approx(3 * 0.0864255, rel=1e-3)
    assert f": {C.BOTH_CONTENDED_RULE}; " in fc2["detail"] and "libs pass: BUSY: " in fc2["detail"]
    q = tmp_path / "quiet"
    shutil.copytree(bench, q)
    scale_calls(q, "fc2", ("bwd_data", "bwd_weight"), 3)
    rows = within(q)
    assert list(rows.index[rows["status"] == C.FAIL]) == ["fc2 bwd"]
    assert "and beyond the noise between the two processes: " in rows.loc["fc2 bwd", "detail"]


def test_one_descheduled_call_does_not_fail_its_op(bench, tmp_path):
    """Quiet passes, fc2 backward's last weight-gradient call made 40x longer (about 3 ms, like job 20261127T144314Z's 1.77 ms call):
    its mean per step rises above the op's (0.123 ms) beyond noise, its median barely moves (0.0864 to 0.0865 ms): still PASS."""
    d = tmp_path / "outlier"
    shutil.copytree(bench, d)
    scale_calls(d, "fc2", ("bwd_weight",), 40, last_only=True)
    lt = A.layer_table([A.load_run(d)])
    x = lt[(lt["framework"] == "mxnet") & (lt["batch_size"] == 64) & (lt["layer"] == "fc2")
           & (lt["direction"] == "bwd")].iloc[0]
    assert x["ms_per_step"] > 1.5 * x["op_ms_per_step"]  # the mean the check used to hold: 0.2328 against 0.123
    row = within(d).loc["fc2 bwd"]
    assert (row["status"], row["measured"], row["expected"]) == (C.PASS, pytest.approx(0.0865475), 0.123)


# --- the noise between the two processes (timing.TWO_PROCESS_RULE) ------------------------------------------------
# The sample report's two failures (docs/sample-report, job 20261127T041409Z, both passes quiet): the call above its
# op beyond each pass's own step-to-step interval, but the two figures are two processes'. PyTorch's bs 64 part of
# that job: tests/data/cpu_quiet_bench_pytorch.
NOISE = {"mxnet": ("fc2 fwd", ("fwd",), 0.1320805, 0.101,
                   "library-call time 0.1321 ms/step (libs pass, median of 20 steps) above its op's 0.101 ms/step "
                   "(framework pass, median of 20 steps) beyond the passes' own intervals (call [0.1154–0.1425] ms, "
                   "op [0.0995–0.106] ms) but within the noise between the two processes: the call's interval starts "
                   "at 0.1154 ms, the op's ends at 0.106, at 0.1318 once widened by 24.3%, the spread of the clean "
                   "pass's 5 trials, each its own process (medians 14.12–17.55 ms; "),
         "pytorch": ("fc1 bwd", ("bwd_data", "bwd_weight"), 1.04244, 0.9231965,
                     "library-call time 1.042 ms/step (libs pass, median of 20 steps) above its op's 0.9232 ms/step "
                     "(framework pass, median of 20 steps) beyond the passes' own intervals (call [0.9526–1.12] ms, "
                     "op [0.8723–0.9461] ms) but within the noise between the two processes: the call's interval "
                     "starts at 0.9526 ms, the op's ends at 0.9461, at 1.504 once widened by 59.0%, the spread of the "
                     "clean pass's 5 trials, each its own process (medians 16.89–26.86 ms; ")}


@pytest.fixture(scope="module")
def bench_pytorch(tmp_path_factory) -> Path:
    return normalised_copy(tmp_path_factory, "cpu_quiet_bench_pytorch")


def process_share(d: Path, fw: str) -> float:
    """TWO_PROCESS_RULE's share read from results.json with the standard library: each clean trial's median of its
    own samples (its clean-N.json), the slowest over the fastest, less one."""
    r = next(x for x in json.loads((d / "results.json").read_text()) if x["framework"] == fw and x["batch_size"] == 64)
    assert r["contention"]["contended"] is False and r["contention"]["trials_used"] == [1, 2, 3, 4, 5]
    meds = [statistics.median(json.loads((d / fw / "bs64" / f"clean-{t}.json").read_text())["step_times_s"])
            for t in r["contention"]["trials_used"]]
    return max(meds) / min(meds) - 1


def test_a_call_above_its_op_within_the_noise_between_processes_passes(bench, bench_pytorch):
    """Both rows failed on the passes' own intervals (the sample report: 2 failed); the gap between the intervals
    is within the noise between processes the same run measured (the clean trials), and the row says noise."""
    for fw, d in (("mxnet", bench), ("pytorch", bench_pytorch)):
        subject, _, call, op, said = NOISE[fw]
        row = within(d, fw).loc[subject]
        assert (row["status"], row["measured"], row["expected"]) == (C.PASS, pytest.approx(call, rel=1e-6),
                                                                     pytest.approx(op, rel=1e-6))
        assert row["detail"].startswith(said), row["detail"]
        assert row["detail"].endswith("noise between processes, not a call longer than its op")
        assert f" once widened by {process_share(d, fw):.1%}, " in row["detail"]  # the rule, read independently
    assert (process_share(bench, "mxnet"), process_share(bench_pytorch, "pytorch")) == (
        pytest.approx(0.24296, abs=5e-6), pytest.approx(0.58986, abs=5e-6))


def test_a_call_257x_its_op_fails_beyond_the_noise_between_processes(bench, bench_pytorch, tmp_path):
    """Issue 42's MXNet conv1 forward (a call 2.57x its op) planted on the same two rows: beyond the noise between
    processes too, FAIL."""
    for fw, src in (("mxnet", bench), ("pytorch", bench_pytorch)):
        subject, directions, call, op, _ = NOISE[fw]
        d = tmp_path / fw
        shutil.copytree(src, d)
        scale_calls(d, subject.split()[0], directions, 2.57 * op / call, fw=fw)
        row = within(d, fw).loc[subject]
        assert row["status"] == C.FAIL and row["measured"] == pytest.approx(2.57 * op, rel=1e-4)
        assert "and beyond the noise between the two processes: " in row["detail"]


def test_without_the_noise_between_processes_the_intervals_judge_alone(bench, tmp_path):
    """One used clean trial: the noise between processes is not measured; fc2 forward fails on the intervals and
    says why."""
    d = tmp_path / "one"
    shutil.copytree(bench, d)
    res = json.loads((d / "results.json").read_text())
    r = next(x for x in res if x["framework"] == "mxnet" and x["batch_size"] == 64)
    r["trial_medians_s"] = r["trial_medians_s"][:1]
    (d / "results.json").write_text(json.dumps(res))
    rows = within(d)
    assert list(rows.index[rows["status"] == C.FAIL]) == ["fc2 fwd"]
    assert ("beyond the passes' own intervals (call [0.1154–0.1425] ms, op [0.0995–0.106] ms) and the noise between "
            "the two processes is not measured (1 used clean trial; ") in rows.loc["fc2 fwd", "detail"]
