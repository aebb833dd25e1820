"""Findings ranked by what they would save (reports/analyses/findings.py, reports/findingscli.py).

GPU: the real H200 run tests/data/gpu_link_run/all (PyTorch eager, MXNet imperative, JAX jit at bs 64, 256, 1024,
20 traced steps each), normalised on a copy. Figures are checked against pyarrow's own rows of the records and
the stdlib's json of results.json. Planted: a case's records against a copy with one place's kernels scaled (a
saving inside the noise, one beyond it), a side set busy, and fresh "remedy runs" whose measured saving is known,
for the prediction check. CPU: a real MXNet imperative + hybridized run and its check (slow)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from kernelmap.reports.analyses import diff as D
from kernelmap.reports.analyses import findings as F
from kernelmap.reports.analyses.base import load_run

from kernelmap.normalise import normalise_run_dir

DATA = Path(__file__).parent / "data"
LINK = DATA / "gpu_link_run" / "all"
STEPS = 20  # the run's --steps: every case's counted steps


@pytest.fixture(scope="module")
def link_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("findings") / "all"
    shutil.copytree(LINK, d)
    normalise_run_dir(d)
    return d


@pytest.fixture(scope="module")
def link(link_dir):
    return load_run(link_dir)


@pytest.fixture(scope="module")
def found_1024(link):
    return F.findings(F.run_sides(link, {1024}))


def place_ms(run_dir: Path, framework: str, source: str, layer: str, direction: str, bs: int) -> float:
    """Kernel ms per step at a place from pyarrow's rows of records.parquet (the counted steps: every iteration
    of the place's kernels in these runs holds model work)."""
    cols = ["framework", "source", "kind", "layer", "direction", "batch_size", "dur_ns", "iteration"]
    rows = pq.read_table(run_dir / "records.parquet", columns=cols).to_pylist()
    mine = [r for r in rows if r["framework"] == framework and r["source"] == source and r["kind"] == "kernel"
            and r["layer"] == layer and r["direction"] == direction and r["batch_size"] == bs]
    assert len({r["iteration"] for r in mine}) == STEPS
    return sum(r["dur_ns"] for r in mine) / STEPS / 1e6


def median_ms(run_dir: Path, framework: str, bs: int) -> float:
    res = json.loads((run_dir / "results.json").read_text())
    res = res if isinstance(res, list) else res["results"]
    return next(r["median_step_s"] for r in res if r["framework"] == framework and r["batch_size"] == bs) * 1e3


# --- one run, frameworks side by side ------------------------------------------------------------------
def test_the_issues_example_is_the_top_place_finding(link_dir, found_1024):
    """MXNet's conv1 bias gradient (calc_bias_diff, cudnnConvolutionBackwardBias) against PyTorch's reduce."""
    top = found_1024[found_1024["kind"] == "place"].iloc[0]
    mx = place_ms(link_dir, "mxnet", "nsys", "conv1", "bwd_bias", 1024)
    pt = place_ms(link_dir, "pytorch", "kineto", "conv1", "bwd_bias", 1024)
    assert (top["rank"], top["call"], top["case"], top["remedy_case"]) == (1, "finding", "mxnet bs1024", "pytorch bs1024")
    assert (top["where"], top["direction"]) == ("conv1", "bwd_bias")
    assert top["case_ms"] == pytest.approx(mx, rel=1e-12) and top["remedy_ms"] == pytest.approx(pt, rel=1e-12)
    assert top["saving_ms"] == pytest.approx(mx - pt, rel=1e-12)
    assert round(mx, 3) == 0.906 and round(pt, 3) == 0.055  # README's first screen
    assert top["saving_lo_ms"] < top["saving_ms"] < top["saving_hi_ms"] and top["saving_lo_ms"] > 0
    assert top["remedy"] == "framework mxnet -> pytorch, mode imperative -> eager" and top["runnable"]
    assert "calc_bias_diff_nchw_packed via cudnnConvolutionBackwardBias" in top["cause"]
    assert "reduce_kernel (no library call)" in top["cause"]
    # of MXNet's traced kernel time per step (the same kind of time), from pyarrow's rows
    rows = pq.read_table(link_dir / "records.parquet", columns=["framework", "source", "kind", "batch_size", "dur_ns",
                                                                 "iteration"]).to_pylist()
    traced = sum(r["dur_ns"] for r in rows if r["framework"] == "mxnet" and r["source"] == "nsys"
                 and r["kind"] == "kernel" and r["batch_size"] == 1024 and r["iteration"] is not None)
    assert top["share_of_case"] == pytest.approx((mx - pt) / (traced / STEPS / 1e6), rel=1e-6)


def test_ranked_by_saving_findings_first(found_1024):
    for kind in ("place", "step"):
        rows = found_1024[found_1024["kind"] == kind]
        assert list(rows["rank"]) == list(range(1, len(rows) + 1))
        calls = [list(F.Call).index(F.Call(c)) for c in rows["call"]]
        assert calls == sorted(calls)  # findings, then busy, noise, not judged
        for _, group in rows.groupby("call"):
            assert list(group["saving_ms"]) == sorted(group["saving_ms"], reverse=True)
    assert (found_1024["saving_ms"] > 0).all()
    # each case x place against its fastest counterpart only
    assert not found_1024.duplicated(["kind", "case", "where", "direction"]).any()


def test_inside_the_noise_is_not_a_finding(found_1024):
    """Real: JAX's fc1 data gradient against MXNet's (its FullyConnected backward's data-gradient gemm, owned by
    its own cublasSgemmEx) differs by 0.7 us of 27 us a step: noise, its interval crosses 0; nothing called noise
    has an interval above 0 and a faster verdict."""
    r = found_1024[(found_1024["case"] == "jax bs1024") & (found_1024["where"] == "fc1")
                   & (found_1024["direction"] == "bwd_data")].iloc[0]
    assert r["remedy_case"] == "mxnet bs1024"
    assert r["call"] == "noise" and r["saving_lo_ms"] < 0 < r["saving_hi_ms"]
    noise = found_1024[found_1024["call"] == "noise"]
    assert len(noise) and not ((noise["verdict"] == "faster") & (noise["saving_lo_ms"] > 0)).any()
    hits = found_1024[found_1024["call"] == "finding"]
    assert (hits["verdict"] == "faster").all() and (hits["saving_lo_ms"] > 0).all()


def test_step_finding_from_the_clean_trials(link_dir, found_1024):
    steps = found_1024[found_1024["kind"] == "step"].set_index("case")
    mx = steps.loc["mxnet bs1024"]
    assert mx["remedy_case"] == "jax bs1024"  # the fastest clean step at bs 1024
    assert mx["saving_ms"] == pytest.approx(median_ms(link_dir, "mxnet", 1024) - median_ms(link_dir, "jax", 1024))
    assert mx["call"] == "finding" and mx["saving_lo_ms"] > 0
    assert mx["cause"].startswith("mostly kernel time")
    assert "jax bs1024" not in steps.index  # the fastest has nothing to gain


def test_a_fused_counterpart_is_named(found_1024):
    """JAX runs one kernel at relu bwd where PyTorch runs three: the finding says the remedy may save less."""
    r = found_1024[(found_1024["case"] == "pytorch bs1024") & (found_1024["where"] == "relu")
                   & (found_1024["direction"] == "bwd")].iloc[0]
    assert (r["case_calls_step"], r["remedy_calls_step"]) == (3, 1) and "fewer kernels" in r["caveat"]
    top = found_1024.iloc[0]
    assert top["caveat"] == ""


# --- planted: one case against a changed copy of itself ------------------------------------------------
def pytorch_1024(link) -> tuple[pd.DataFrame, dict]:
    entry = next(e for e in link.results if e["case"] == "pytorch" and e["batch_size"] == 1024)
    rec = link.records[(link.records["case"] == "pytorch") & (link.records["batch_size"] == 1024)].copy()
    return rec, entry


def scaled(rec: pd.DataFrame, layer: str, direction: str, factor: float) -> pd.DataFrame:
    out = rec.copy()
    m = (out["layer"] == layer).fillna(False) & (out["direction"] == direction).fillna(False) & (out["kind"] == "kernel")
    out.loc[m, "dur_ns"] = (out.loc[m, "dur_ns"] * factor).round().astype("int64")
    return out


def two(link, factor: float, entry_b: dict | None = None, place=("conv2", "bwd_data")) -> pd.DataFrame:
    rec, entry = pytorch_1024(link)
    a = D.make_side("A", scaled(rec, *place, factor), entry)
    b = D.make_side("B", rec, entry_b or entry)
    return F.findings([a, b])


def test_planted_saving_beyond_noise_is_found_exactly(link, link_dir):
    df = two(link, 1.5)
    r = df[(df["where"] == "conv2") & (df["direction"] == "bwd_data")].iloc[0]
    ms = place_ms(link_dir, "pytorch", "kineto", "conv2", "bwd_data", 1024)
    assert r["call"] == "finding" and (r["case"], r["remedy_case"]) == ("A", "B")
    assert r["saving_ms"] == pytest.approx(0.5 * ms, rel=1e-5)  # rounding to whole ns per kernel
    assert r["remedy"].startswith("none") and not r["runnable"]  # the same case: nothing to run
    assert (df["call"] == "finding").sum() == 1  # nothing else differs


def test_planted_saving_inside_the_noise_is_noise(link):
    df = two(link, 1.02)  # 2%: under timing.NOISE_THRESHOLD however steady
    r = df[(df["where"] == "conv2") & (df["direction"] == "bwd_data")].iloc[0]
    assert r["call"] == "noise" and r["verdict"] == "within noise"
    assert not (df["call"] == "finding").any()


def test_a_busy_side_is_not_called_a_finding(link):
    rec, entry = pytorch_1024(link)
    busy = json.loads(json.dumps(entry))
    busy["passes"]["framework"]["contention"] = {"contended": True}
    df = two(link, 1.5, busy)
    r = df[(df["where"] == "conv2") & (df["direction"] == "bwd_data")].iloc[0]
    assert (r["call"], r["busy"]) == ("busy machine", "B")


# --- checking a prediction against fresh runs ------------------------------------------------------------
def fresh_pair(link, factor: float) -> tuple[D.Side, D.Side]:
    """Fresh "runs" of MXNet and PyTorch at bs 1024: the recorded ones, MXNet's conv1 bias gradient scaled."""
    sides = {s.label: s for s in F.run_sides(link, {1024})}
    mx = sides["mxnet bs1024"]
    rec = link.records[(link.records["case"] == "mxnet") & (link.records["batch_size"] == 1024)]
    return D.make_side(mx.label, scaled(rec, "conv1", "bwd_bias", factor), mx.entry), sides["pytorch bs1024"]


def test_prediction_checked_hit_and_miss(link, found_1024):
    top = found_1024.iloc[[0]]
    pred, mx, pt = top["saving_ms"].iloc[0], top["case_ms"].iloc[0], top["remedy_ms"].iloc[0]
    for factor, hit in ((1.0, True), (1.25, True), (1.4, False), (0.7, False)):
        got = F.check(top, {("mxnet bs1024", "pytorch bs1024"): fresh_pair(link, factor)})
        r = got.iloc[0]
        measured = factor * mx - pt  # the fresh MXNet place, scaled, less PyTorch's
        assert r["measured_saving_ms"] == pytest.approx(measured, rel=1e-5)
        assert r["error_pct"] == pytest.approx((measured - pred) / pred * 100, rel=1e-4)
        assert bool(r["hit"]) is hit, (factor, r["error_pct"])
        assert got.attrs["hit_rate"] == (int(hit), 1)


def test_check_hit_rate_and_unchecked_findings(link, found_1024):
    """Two findings of one pair checked (a hit and a miss), a finding of another pair without fresh runs left out."""
    rows = found_1024[(found_1024["case"] == "mxnet bs1024") & (found_1024["remedy_case"] == "pytorch bs1024")
                      & found_1024["where"].isin(["conv1", "conv2"]) & (found_1024["direction"] == "bwd_bias")]
    other = found_1024[found_1024["remedy_case"] == "jax bs1024"].head(1)
    got = F.check(pd.concat([rows, other]), {("mxnet bs1024", "pytorch bs1024"): fresh_pair(link, 1.5)})
    assert list(got["where"]) == ["conv1", "conv2"]
    assert list(got["hit"]) == [False, True]  # conv1 scaled by 1.5: +53% off; conv2 as recorded: exact
    assert got.attrs["hit_rate"] == (1, 2) and got.attrs["quiet_hit_rate"] == (1, 2)


def test_step_prediction_checked(link, found_1024):
    row = found_1024[(found_1024["kind"] == "step") & (found_1024["case"] == "mxnet bs1024")]
    sides = {s.label: s for s in F.run_sides(link, {1024})}
    mx, jx = sides["mxnet bs1024"], sides["jax bs1024"]
    slower = json.loads(json.dumps(mx.entry))
    for k in ("median_step_s", "ci95_low_s", "ci95_high_s"):
        slower[k] = mx.entry[k] + 0.001  # the fresh MXNet step 1 ms slower: 2.18 + 1 ms saved, +46%
    fresh = D.Side(mx.label, mx.source, mx.level, mx.events, mx.iterations, mx.steps_basis, mx.total_ns, slower)
    for pair, hit in (((mx, jx), True), ((fresh, jx), False)):
        r = F.check(row, {("mxnet bs1024", "jax bs1024"): pair}).iloc[0]
        assert bool(r["hit"]) is hit
    assert r["measured_saving_ms"] == pytest.approx(row["saving_ms"].iloc[0] + 1.0)


# --- the command --------------------------------------------------------------------------------------
def test_cli_prints_and_writes_csv(link_dir, tmp_path, found_1024):
    out = tmp_path / "f.csv"
    p = subprocess.run([sys.executable, "-m", "kernelmap.cli", "findings", str(link_dir), "--batch-size", "1024",
                        "--top", "3", "--csv", str(out)], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr
    assert "calc_bias_diff_nchw_packed via cudnnConvolutionBackwardBias" in p.stdout
    assert "0.8512" in p.stdout  # the top saving, ms per step
    got = pd.read_csv(out)
    assert len(got) == len(found_1024) and got["saving_ms"].iloc[0] == pytest.approx(found_1024["saving_ms"].iloc[0])


def test_cli_refuses_a_run_without_records(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(LINK, d)
    p = subprocess.run([sys.executable, "-m", "kernelmap.cli", "findings", str(d)], capture_output=True, text=True,
                       check=False)
    assert p.returncode != 0 and "no records.parquet" in p.stderr and str(d) in p.stderr


@pytest.mark.slow
@pytest.mark.mxnet
def test_cpu_remedy_run_and_checked(tmp_path):
    """Real runs on the CPU: MXNet imperative and hybridized (the prediction's run), then the step finding's remedy
    run by the check (one `kernelmap run` of both modes, trials interleaved) and judged against the fresh clean
    medians, read here from the fresh results.json. The check runs whatever the machine's load called the finding
    (a busy machine calls it "busy machine"): the runner is what is tested, its verdict depends on the load."""
    from kernelmap.reports import findingscli

    pred = tmp_path / "pred"
    common = ["--framework", "mxnet", "--mode", "imperative", "hybridized", "--device", "cpu", "--batch-size", "32",
              "--trials", "2", "--max-repeats", "0", "--data", "synthetic", "--warmup", "2"]
    p = subprocess.run([sys.executable, "-m", "kernelmap.cli", "run", *common, "--steps", "20", "--profile",
                        "framework", "--out", str(pred)], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    sides = F.run_sides(load_run(pred))
    found = F.findings(sides)
    step = found[found["kind"] == "step"]  # the slower mode against the faster (the load decides which)
    mode = {s.label: s.entry["mode"] for s in sides}
    assert len(step) == 1 and step["runnable"].iloc[0]
    slow, fast = mode[step["case"].iloc[0]], mode[step["remedy_case"].iloc[0]]
    assert {slow, fast} == {"imperative", "hybridized"} and step["remedy"].iloc[0] == f"mode {slow} -> {fast}"
    step = step.assign(call=str(F.Call.FINDING))
    checked = findingscli.check_remedies(pred, step, sides, 1, tmp_path / "checks", 20, 2, [], D.ALPHA, None)
    runs = sorted(p.name for p in (tmp_path / "checks").iterdir())
    assert runs == ["1-mxnet"]  # both modes in one run
    res = json.loads((tmp_path / "checks" / "1-mxnet" / "results.json").read_text())
    res = res if isinstance(res, list) else res["results"]
    med = {r["mode"]: r["median_step_s"] * 1e3 for r in res}
    assert {r["steps"] for r in res} == {20} and {r["batch_size"] for r in res} == {32}
    r = checked.iloc[0]
    assert r["measured_saving_ms"] == pytest.approx(med[slow] - med[fast])
    err = (r["measured_saving_ms"] - r["saving_ms"]) / r["saving_ms"]
    assert r["error_pct"] == pytest.approx(err * 100) and bool(r["hit"]) is bool(abs(err) <= F.HIT_TOLERANCE)
    assert checked.attrs["hit_rate"] == (int(r["hit"]), 1)


def test_check_run_command_repeats_the_run():
    g = {"framework": "mxnet", "modes": ["imperative", "hybridized"], "math": "fp32", "batch_sizes": [64],
         "device": "cpu", "profile": "framework"}
    cli = {"steps": 50, "warmup": 5, "data": "synthetic", "data_dir": None, "threads": 2, "lr": 0.01, "seed": 0,
           "python": ["jax=/x/python"]}
    from kernelmap.reports import findingscli

    cmd = findingscli.run_command(g, cli, Path("/o"), None, 3, ["jax=/y"])
    text = " ".join(cmd[1:])
    assert text == ("-m kernelmap.cli run --framework mxnet --mode imperative hybridized --math fp32 --batch-size 64 "
                    "--device cpu --profile framework --trials 3 --max-repeats 0 --steps 50 --out /o --warmup 5 "
                    "--data synthetic --threads 2 --lr 0.01 --seed 0 --python jax=/x/python --python jax=/y")


def test_report_section_and_table(link, found_1024):
    from kernelmap.reports import html as H

    every = F.run_findings([link])
    assert set(every["run"]) == {"all"} and set(every["batch_size"]) == {64, 256, 1024}
    mine = every[every["batch_size"] == 1024].drop(columns=["run", "rank"]).reset_index(drop=True)
    assert mine.equals(found_1024[found_1024["batch_size"] == 1024].drop(columns=["rank"]).reset_index(drop=True))
    page = H.findings_html(every, "place")
    assert page.count("<tr>") == 1 + 10  # the header and the first ten
    assert "calc_bias_diff_nchw_packed via cudnnConvolutionBackwardBias" in page
    assert H.findings_html(every.iloc[0:0], "place") == ""


def test_mode_remedies_on_the_modes_run():
    """tests/data/gpu_modes_run (H200, every mode, bs 64): eager -> cuda-graph is launch overhead (the kernels'
    time barely moves), and each case is also set against its own framework's fastest mode."""
    run_dir = DATA / "gpu_modes_run"
    found = F.findings(F.run_sides(load_run(run_dir)))
    steps = found[found["kind"] == "step"]
    res = json.loads((run_dir / "results.json").read_text())
    res = res if isinstance(res, list) else res["results"]
    med = {(r["framework"], r["mode"]): r["median_step_s"] * 1e3 for r in res}
    eager = steps[(steps["case"] == "pytorch bs64")]
    assert list(eager["remedy"]) == ["mode eager -> cuda-graph"]  # the fastest overall is its own framework's
    r = eager.iloc[0]
    assert r["saving_ms"] == pytest.approx(med[("pytorch", "eager")] - med[("pytorch", "cuda-graph")])
    assert r["call"] == "finding" and r["runnable"] and r["cause"].startswith("mostly time outside the traced kernels")
    mx = steps[steps["case"] == "mxnet bs64"].set_index("remedy")
    assert set(mx.index) == {"framework mxnet -> pytorch, mode imperative -> cuda-graph", "mode imperative -> hybridized"}
    assert mx.loc["mode imperative -> hybridized", "saving_ms"] == pytest.approx(
        med[("mxnet", "imperative")] - med[("mxnet", "hybridized")])


def test_diff_prints_and_writes_the_two_sides_findings(tmp_path):
    run_dir = str(DATA / "gpu_modes_run")
    out = tmp_path / "f.csv"
    p = subprocess.run([sys.executable, "-m", "kernelmap.cli", "diff", run_dir, run_dir, "--case-a",
                        "framework=pytorch,mode=eager", "--case-b", "framework=pytorch,mode=cuda-graph", "--top", "2",
                        "--findings", "3", "--findings-csv", str(out)], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr
    assert "findings, B against A and A against B" in p.stdout and "mode eager -> cuda-graph" in p.stdout
    got = pd.read_csv(out)
    step = got[got["kind"] == "step"]
    assert len(step) == 1 and step["saving_ms"].iloc[0] == pytest.approx(1.5647, abs=1e-4)
    assert set(got["case"]) <= {"gpu_modes_run:pytorch bs64", "gpu_modes_run:pytorch-cuda-graph bs64"}


def test_a_busy_check_is_said_and_left_out_of_the_quiet_hit_rate(link, found_1024):
    top = found_1024.iloc[[0]]
    mx, pt = fresh_pair(link, 1.0)
    busy = json.loads(json.dumps(mx.entry))
    busy["passes"]["nsys"]["contention"] = {"contended": True}  # MXNet's kernels come from its nsys pass
    mx = D.Side(mx.label, mx.source, mx.level, mx.events, mx.iterations, mx.steps_basis, mx.total_ns, busy)
    got = F.check(top, {("mxnet bs1024", "pytorch bs1024"): (mx, pt)})
    r = got.iloc[0]
    assert (r["measured_call"], r["measured_busy"], bool(r["hit"])) == ("busy machine", "mxnet bs1024", True)
    assert got.attrs["hit_rate"] == (1, 1) and got.attrs["quiet_hit_rate"] == (0, 0)


def test_the_gpu_checks_commands():
    """What --check-remedies would run for gpu_modes_run's first step findings (no GPU here): one run per framework,
    the modes it needs, the capture pass that records each framework's GPU trace source."""
    from kernelmap.reports import findingscli

    run = load_run(DATA / "gpu_modes_run")
    sides = {s.label: s for s in F.run_sides(run)}
    found = F.findings(list(sides.values()))
    todo = found[(found["kind"] == "step") & (found["call"] == "finding")].head(4)  # compile, eager, MXNet x2
    needed = [sides[x] for x in dict.fromkeys([*todo["case"], *todo["remedy_case"]])]
    groups = findingscli.run_groups(needed)
    got = {g["framework"]: (sorted(g["modes"]), g["profile"], g["device"], g["batch_sizes"]) for g in groups.values()}
    assert got == {"pytorch": (["compile", "cuda-graph", "eager"], "framework", "gpu", [64]),
                   "mxnet": (["hybridized", "imperative"], "nsys", "gpu", [64])}
    # the checked run's --profile where it records the source: the fresh runs place kernels as it did (their
    # library calls logged too); one that does not record it (libs: no trace of ops) gives way to the source's pass
    assert {g["profile"] for g in findingscli.run_groups(needed, "all").values()} == {"all"}
    assert {g["framework"]: g["profile"] for g in findingscli.run_groups(needed, "libs").values()} == {
        "pytorch": "framework", "mxnet": "nsys"}
