"""benches/harness_vs_bare.py. The fp32 summary on a real run recorded on an H200 by the GPU job of commit 78dc362
(tests/data/harness_h200: the bare loops' JSON lines and each `kernelmap run --json` summary, as the job wrote
them): medians over processes, their ranges and kernelmap / bare, exact. The mixed-precision comparison (``run``,
issue 38's 5%): its plan, each branch of the verdict and the noise rule, a real CPU run's lines and a real H200
results.json (tests/data/harness_mixed), the script end to end on the CPU, and the GPU job's harness phase calling it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benches"))
import harness_vs_bare as H  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
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


# --- the mixed-precision comparison (``run``): issue 38's 5% ----------------------------------------------------
MIXED = Path(__file__).parent / "data" / "harness_mixed"


def test_the_plan_interleaves_and_swaps_the_order_every_round():
    p = H.plan(["pytorch", "jax"], 3, [1024])
    assert len(p) == 12
    assert p[:4] == [(1, "pytorch", 1024, "bare"), (1, "pytorch", 1024, "kernelmap"),
                     (1, "jax", 1024, "bare"), (1, "jax", 1024, "kernelmap")]
    assert p[4:6] == [(2, "pytorch", 1024, "kernelmap"), (2, "pytorch", 1024, "bare")]
    assert [x[3] for x in p if x[0] == 3][:2] == ["bare", "kernelmap"]


def test_mxnet_runs_fp16_on_the_gpu_bf16_on_the_cpu():
    assert H.math_of("mxnet-hybridized", "bf16", "gpu") == "fp16" and H.math_of("mxnet", "fp16", "cpu") == "bf16"
    assert H.math_of("pytorch", "bf16", "gpu") == "bf16" and H.math_of("jax", "fp16", "gpu") == "fp16"


def test_each_clean_trial_of_the_case_from_a_real_results_json():
    # the H200 bf16 run of last session's job (--mode all --trials 1), trimmed to each case's trials
    results = json.loads((MIXED / "results_h200_bf16.json").read_text())
    t = H.trial_lines(results, "pytorch", "bf16", 1024)  # eager, not cuda-graph/compile/compile-graphs
    # trimmed without the case's cpu_time: no main-thread figure, not a made-up one
    assert t == [{"trial": 1, "median_ms": pytest.approx(2.8787955), "contended": False, "used": True,
                  "main_cpu_ms": None}]
    results[0]["cpu_time"] = {"main_thread_median_step_s": 0.00205}
    assert H.trial_lines(results, "pytorch", "bf16", 1024)[0]["main_cpu_ms"] == pytest.approx(2.05)
    assert H.trial_lines(results, "jax", "bf16", 1024)[0]["median_ms"] == pytest.approx(0.9185971)
    with pytest.raises(ValueError, match="no case mxnet fp16 bs 1024"):
        H.trial_lines(results, "mxnet", "fp16", 1024)


def _v(bare, km):
    return H.verdict(bare, km)


def test_verdict_pass_within_five_percent_and_resolved():
    v = _v([2.00, 2.01, 2.02], [2.05] * 3 + [2.06] * 3 + [2.07] * 3)
    assert v["verdict"] == H.PASS and v["ratio"] == pytest.approx(2.06 / 2.01)
    assert v["spread"]["bare"] == pytest.approx(0.02 / 2.01)
    # exactly 5% slower passes (the goal is "within 5%")
    assert _v([2.0, 2.0, 2.0], [2.1, 2.1, 2.1])["verdict"] == H.PASS


def test_verdict_within_five_percent_but_the_processes_spread_wider_is_not_resolved():
    v = _v([1.8, 2.0, 2.3], [2.0, 2.05, 2.1])
    assert v["verdict"] == H.UNRESOLVED and "spread ±12.5%" in v["why"]


def test_verdict_fail_slower_beyond_noise():
    bare, km = [2.20, 2.23, 2.29], [2.85, 2.86, 2.87, 2.88, 2.89, 2.90, 2.91, 2.92, 2.93]
    v = _v(bare, km)
    assert v["verdict"] == H.FAIL and v["u_p"] == pytest.approx(2 / 220) and v["u_min_p"] == pytest.approx(2 / 220)
    assert "kernelmap 29.6% slower" in v["why"] and "same step" not in v["why"]


def test_verdict_fail_faster_beyond_noise_says_the_steps_differ():
    v = _v([1.15, 1.16, 1.17], [0.90, 0.91, 0.92, 0.93, 0.94, 0.95, 0.96, 0.97, 0.98])
    assert v["verdict"] == H.FAIL and "faster" in v["why"] and "they do not run the same step" in v["why"]


def test_verdict_beyond_five_percent_but_too_few_processes_or_within_noise():
    few = _v([2.0, 2.01], [2.5, 2.5, 2.6, 2.6, 2.7, 2.7])  # 2 bare, 6 trials: smallest p 2/28 = 0.071
    assert few["verdict"] == H.UNRESOLVED and "too few processes" in few["why"]
    assert few["u_min_p"] == pytest.approx(2 / 28)
    noisy = _v([2.0, 2.2, 3.0], [2.1, 2.2, 2.4, 2.5, 2.6, 2.7, 2.8, 2.9, 3.1])  # 18% slower, overlapping: U p 0.52
    assert noisy["verdict"] == H.UNRESOLVED and "within the noise" in noisy["why"] and noisy["u_p"] > 0.05


def test_verdict_not_measured_without_a_side():
    assert _v([], [2.0])["verdict"] == H.NOT_MEASURED and _v([2.0], [])["verdict"] == H.NOT_MEASURED


def test_a_real_cpu_run_summarised_failures_counted_never_dropped():
    # a real `harness_vs_bare.py run --device cpu` (see the fixture's README), plus one failed process
    lines = H.read_processes(MIXED / "cpu_run")
    lines.append({"side": "bare", "mode": "pytorch", "math": "bf16", "bs": 8, "round": 4, "error": "exit 1: boom"})
    rows = {r["mode"]: r for r in H.summarise_processes(lines)}
    assert sorted(rows) == ["jax", "mxnet-hybridized", "pytorch"]
    r = rows["pytorch"]
    assert r["bare"]["n"] == 3 and r["bare"]["failed"] == ["exit 1: boom"] and r["kernelmap"]["n"] == 9
    assert r["kernelmap"]["runs"] == 3
    bare = [x["median_ms"] for x in lines if x["mode"] == "pytorch" and x["side"] == "bare" and "error" not in x]
    assert r["bare"]["median_ms"] == pytest.approx(sorted(bare)[1])
    text = H.format_verdicts(list(rows.values()))
    assert "    bare failed: exit 1: boom" in text and "(9 trials of 3 runs" in text


def test_the_main_threads_cpu_time_shown_only_where_both_sides_have_it():
    lines = H.read_processes(MIXED / "cpu_run")
    rows = {r["mode"]: r for r in H.summarise_processes(lines)}
    assert rows["pytorch"]["bare"]["main_cpu_ms"] is None  # the fixture's script did not read it yet
    assert "main thread's CPU ms" not in H.format_verdicts(list(rows.values()))
    for side, base in (("bare", 1.0), ("kernelmap", 3.0)):
        for i, x in enumerate(x for x in lines if x["mode"] == "pytorch" and x["side"] == side):
            x["main_cpu_ms"] = base + i / 100  # bare: 3 processes, kernelmap: 9 trials
    rows = {r["mode"]: r for r in H.summarise_processes(lines)}
    assert rows["pytorch"]["bare"]["main_cpu_ms"] == pytest.approx(1.01)  # median of 1.00, 1.01, 1.02
    assert "main thread's CPU ms a step (median): bare 1.010, kernelmap 3.040" in H.format_verdicts(list(rows.values()))


def test_the_summary_of_a_mixed_run_dir_and_a_second_run_into_it_refused(tmp_path, capsys):
    shutil.copytree(MIXED / "cpu_run", tmp_path / "h")
    assert H.main([str(tmp_path / "h")]) == 0
    assert "mode math bs | bare | kernelmap clean" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="processes.jsonl exists"):
        H.main(["run", str(tmp_path / "h"), "--device", "cpu", "--modes", "jax"])


@pytest.mark.parametrize(("args", "message"), [
    (["--steps", "15"], "--steps must be a positive multiple of 10"),
    (["--python", "jax"], "--python takes NAME=PATH"),
    (["--device", "cpu", "--math", "fp16"], "pytorch fp16 runs on the GPU only"),
])
def test_bad_options_are_refused(tmp_path, args, message, capsys):
    with pytest.raises(SystemExit) as e:
        H.main(["run", str(tmp_path / "h"), *args])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "h").exists()


@pytest.mark.slow
def test_end_to_end_on_the_cpu(tmp_path):
    """One round of the bare PyTorch loop and `kernelmap run --trials 2`, for real, on the CPU at bs 4."""
    out = tmp_path / "h"
    r = subprocess.run([sys.executable, str(H.__file__), "run", str(out), "--device", "cpu", "--n", "1", "--modes",
                        "pytorch", "--batch-size", "4", "--steps", "10", "--trials", "2"], capture_output=True,
                       text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = H.read_processes(out)
    assert [(x["side"], x.get("trial")) for x in lines] == [("bare", None), ("kernelmap", 1), ("kernelmap", 2)]
    assert all(x["math"] == "bf16" and x["bs"] == 4 and x["median_ms"] > 0 for x in lines)
    row = json.loads((out / "verdict.json").read_text())[0]
    assert row["verdict"] == H.UNRESOLVED or row["verdict"] == H.PASS  # 1 bare vs 2 trials: never a FAIL
    assert "pytorch bf16 4 |" in r.stdout


def _harness_calls(tmp_path, **extra) -> tuple[subprocess.CompletedProcess, list[str]]:
    """gpu_job.sh PHASES=harness HARNESS_MATH=bf16 with a stand-in python3: its exit and its calls of the script."""
    log = tmp_path / "python3.log"
    log.unlink(missing_ok=True)
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "python3").write_text(f'#!/bin/sh\necho "$@" >>"{log}"\nexit 0\n')
    (fake / "python3").chmod(0o755)
    (tmp_path / "checkout").mkdir(exist_ok=True)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path), "OUT": str(tmp_path / "out"),
           "KERNELMAP_MXNET_HOME": str(tmp_path / "mxhome"), "PHASES": "harness", "HARNESS_MATH": "bf16",
           "BARE_BS": "1024", "HARNESS_MODES": "pytorch jax mxnet", "HARNESS_N": "4", **extra}
    p = subprocess.run(["bash", str(ROOT / "benches" / "gpu_job.sh"), "job"], cwd=tmp_path / "checkout", env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return p, [c for c in log.read_text().splitlines() if "harness_vs_bare.py" in c]


def test_the_jobs_harness_phase_at_bf16_runs_the_comparison(tmp_path):
    """gpu_job.sh PHASES=harness HARNESS_MATH=bf16: one call of the script's `run` with the job's options."""
    p, calls = _harness_calls(tmp_path)
    assert calls == [f"{tmp_path}/checkout/benches/harness_vs_bare.py run {tmp_path}/out/harness --math bf16 --n 4 "
                     "--batch-size 1024 --trials 3 --modes pytorch jax mxnet --steps 200"]
    assert "harness exit 0" in p.stdout
    # both sides pinned, one kernelmap trial a round
    _, calls = _harness_calls(tmp_path, HARNESS_CPUS="0-7", HARNESS_TRIALS="1")
    assert calls == [f"{tmp_path}/checkout/benches/harness_vs_bare.py run {tmp_path}/out/harness --math bf16 --n 4 "
                     "--batch-size 1024 --cpus 0-7 --trials 1 --modes pytorch jax mxnet --steps 200"]


def test_both_sides_pinned_to_the_same_cpus_and_said(tmp_path):
    assert H.pinned(["python", "x.py"], "0-3") == ["taskset", "-c", "0-3", "python", "x.py"]
    assert H.pinned(["python", "x.py"], None) == ["python", "x.py"]
    assert H.parse([str(tmp_path), "--cpus", "0-3,8"]).cpus == "0-3,8"
    for bad in ("0-", "a", "0;3", "0-3,"):
        with pytest.raises(SystemExit):
            H.parse([str(tmp_path), "--cpus", bad])
    lines = H.read_processes(MIXED / "cpu_run")
    for x in lines:
        x["cpus"] = "0-3"
    rows = {r["mode"]: r for r in H.summarise_processes(lines)}
    assert rows["pytorch"]["cpus"] == ["0-3"]
    assert "    every process on CPUs 0-3 (taskset -c)" in H.format_verdicts(list(rows.values()))
    rows = {r["mode"]: r for r in H.summarise_processes(H.read_processes(MIXED / "cpu_run"))}
    assert rows["pytorch"]["cpus"] == [] and "taskset" not in H.format_verdicts(list(rows.values()))
