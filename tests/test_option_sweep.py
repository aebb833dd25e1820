"""benches/option_sweep.py's verdicts: ran, refused before any work, blocked (refused for memory other processes
held) or FAIL (a traceback, a refusal after a worker started, a wrong number of timed steps); its steps within and
past an epoch; its --quick combinations; what it expects of the device's capacity."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import fake_nvidia_smi

from kernelmap import options

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benches"))
import option_sweep as S  # noqa: E402

COMBO = {"framework": "pytorch", "mode": "cuda-graph", "batch_size": 1024, "nofit": False, "length": "beyond",
         "data": "synthetic", "device": "gpu"}


def test_lengths_within_and_past_an_epoch():
    assert S.length_args("within", 1024, 60_000) == (["--steps", "20"], 20)
    assert S.length_args("beyond", 1024, 60_000) == (["--steps", "59"], 59)  # 5 + 59 = 64 steps: 6 into epoch 1
    assert S.length_args("epochs", 1024, 60_000) == (["--epochs", "1"], 53)  # 58 full batches, 5 of them warm-up
    assert S.length_args("epochs", 1024, 3000) == (["--epochs", "1"], None)  # 2 steps: all warm-up, refused
    assert S.length_args("beyond", 100_000, 60_000)[1] is None  # no full batch


def _results(tmp_path: Path, steps: int) -> Path:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "results.json").write_text(json.dumps([{"mode": "cuda-graph", "batch_size": 1024, "steps": steps,
                                                         "device": "gpu"}]))
    return tmp_path


def test_ran_needs_the_timed_steps_asked(tmp_path):
    assert S.classify(COMBO, 60_000, 0, "", "", _results(tmp_path / "a", 59)) == ("ran", "59 steps timed on the GPU")
    outcome, said = S.classify(COMBO, 60_000, 0, "", "", _results(tmp_path / "b", 58))
    assert outcome == "FAIL" and "expected [('cuda-graph', 1024, 59)]" in said


@pytest.mark.parametrize("stderr, rc, made_dir, outcome", [
    ("kernelmap run: error: --batch-size 200000: larger than the 60,000 training images\n", 2, False, "refused"),
    ("kernelmap run: pytorch-cuda-graph: mode skipped: it needs a GPU\nkernelmap run: error: --mode cuda-graph: no "
     "mode of pytorch can run here\n", 2, False, "refused"),
    # a worker started: not before any work
    ("kernelmap run: [1/1] pytorch bs 1024 (clean pass trial 1/1, gpu)\nkernelmap run: error: nothing ran: worker "
     "exited 1: RuntimeError: The size of tensor a (1024) must match the size of tensor b (608)\n", 2, False, "FAIL"),
    ("Traceback (most recent call last):\n  File ...\nRuntimeError: boom\n", 1, False, "FAIL"),
    ("kernelmap run: error: --batch-size 200000: too large\n", 2, True, "FAIL"),  # a run directory left behind
])
def test_refused_only_before_any_work_with_one_line(tmp_path, stderr, rc, made_dir, outcome):
    out = tmp_path / "run"
    if made_dir:
        out.mkdir()
    assert S.classify(COMBO, 60_000, rc, stderr, "", out)[0] == outcome


def test_a_traceback_fails_even_a_run_that_finished(tmp_path):
    assert S.classify(COMBO, 60_000, 0, "Traceback (most recent call last):\n", "", _results(tmp_path, 59))[0] == "FAIL"


def test_quick_and_full_combinations():
    nofit = {"pytorch": 400_000, "mxnet": 200_000, "jax": 130_000}
    modes = sum(len(d.modes) for d in S.frameworks.REGISTRY.values())
    full = S.combos("gpu", False, None, nofit)
    assert len(full) == modes * 5 * 3 * 2 == len({S.key(c) for c in full})
    quick = S.combos("gpu", True, "jax", nofit)
    assert [(c["batch_size"], c["data"], c["length"]) for c in quick] == [
        (1, "synthetic", "within"), (64, "real", "beyond"), (64, "real", "epochs"), (1024, "synthetic", "within"),
        (1024, "real", "beyond"), (1024, "real", "epochs"), (130_000, "synthetic", "within")]


def test_the_budget_stops_before_the_next_combination_and_the_table_fails_on_a_fail(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert S.main(["--device", "cpu", "--quick", "--framework", "jax", "--out", str(out), "--budget", "0",
                   "--real-dir", str(tmp_path / "none")]) == 2
    assert "7 combinations left; run again with --out" in capsys.readouterr().err and not (out / "runs").exists()
    row = {**COMBO, "expected": "run", "exit": 2, "outcome": "FAIL", "said": "exit 2: worker exited 1", "wall_s": 1.0}
    (out / "sweep.jsonl").write_text(json.dumps(row) + "\n" + json.dumps({**row, "outcome": "ran", "said": "x"}) + "\n")
    assert S.main(["--table", str(out)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == \
        "1 ran, 0 refused, 0 blocked, 1 FAIL, 0 not run of 2 combinations"


# --- what fits: the device's capacity, not what other processes leave free -------------------------------------
GIB = options.GIB
HELD = options.Memory("gpu", "GPU 1 (NVIDIA H200, nvidia-smi memory.free)", 585_105_408, 143156 << 20,
                      (options.Holder(8715, "python3.12", 105 * GIB),))  # session 10's GPU 1: 0.5 GiB free


def test_expectation_and_the_batch_that_does_not_fit_come_from_the_capacity():
    # session 10's shards on GPU 1 read "no-fit batch sizes {'pytorch': 2, 'mxnet': 2, 'jax': 2}" from the 0.5 GiB
    # free; GPU 0, free, read these (its sweep.md): the capacity gives them whoever holds GPU 1
    assert S.nofit_sizes(HELD) == {"pytorch": 712_764, "mxnet": 356_382, "jax": 203_646}
    combo = {**COMBO, "framework": "mxnet", "mode": "imperative", "batch_size": 64, "length": "within"}
    assert S.expectation(combo, 60_000, HELD.capacity()) == "run"
    assert S.expectation(combo, 60_000, HELD) == "refuse"  # what the sweep said before: refusals "as expected"
    assert S.nofit_sizes(options.Memory("cpu", "host RAM (MemAvailable)", 20 * GIB))["pytorch"] == \
        2 * options.largest_fitting("pytorch", options.Memory("cpu", "x", 20 * GIB))  # no capacity read: the free


@pytest.mark.parametrize("expected, outcome, said, verdict", [
    ("run", "refused", f"--batch-size 64: {options.MEMORY_NEED} 1.0 GiB in MXNet", "blocked"),
    ("run", "refused", "--mode cuda-graph: no case of pytorch can run here", "FAIL"),
    ("refuse", "refused", f"--batch-size 356382: {options.MEMORY_NEED} 278.6 GiB in MXNet", "refused"),
    ("refuse", "ran", "20 steps timed on the GPU", "FAIL"),
    ("run", "ran", "20 steps timed on the GPU", "ran"),
])
def test_a_memory_refusal_of_a_batch_that_fits_the_device_is_blocked(expected, outcome, said, verdict):
    row = S.verdict({**COMBO, "expected": expected, "outcome": outcome, "said": said}, HELD)
    assert row["outcome"] == verdict
    if verdict == "blocked":
        assert row["said"] == ("blocked: GPU 1 held by other processes, 0.5 of 139.8 GiB free (pid 8715 python3.12 "
                               f"holds 105.0 GiB): {said}")


def test_a_sweep_on_a_gpu_others_hold_is_blocked_not_passed(tmp_path, monkeypatch, capsys):
    """The real `kernelmap run` against a fake nvidia-smi (session 10's GPU 1): batch 1 fits the H200 and is
    refused for the memory others hold: blocked, named, the sweep fails; the batch that does not fit the H200 is
    refused as expected; a sweep that goes on runs the blocked one again, and a later row replaces it."""
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    out = tmp_path / "sweep"
    argv = ["--device", "gpu", "--quick", "--framework", "mxnet", "--out", str(out), "--real-dir", str(tmp_path / "no"),
            "--only", "mxnet-imperative-bs1-*,mxnet-imperative-bsnofit-*", "--timeout", "300"]
    assert S.main(argv) == 1
    std = capsys.readouterr()
    rows = S.read_rows(out)
    assert [(r["batch_size"], r["expected"], r["outcome"]) for r in rows] == [(1, "run", "blocked"),
                                                                              (356_382, "refuse", "refused")]
    assert rows[0]["said"].startswith(
        "blocked: GPU 1 held by other processes, 0.5 of 139.8 GiB free (pid 8715 python3.12 holds 105.0 GiB, pid 8790 "
        "pt_main_thread holds 34.3 GiB): --batch-size 1: a training step needs about 1.0 GiB in MXNet")
    assert rows[0]["said"].endswith("it would fit GPU 1's 139.8 GiB were other processes not holding it")
    assert "| mxnet | imperative | 1 | within | synthetic | run | **blocked** | 2 |" in std.out
    assert std.out.splitlines()[-1].startswith("0 ran, 1 refused, 1 blocked, 0 FAIL, 0 not run of 2 combinations (1 "
                                               "blocked: a batch that fits the device refused")
    assert "GPU 1 held by other processes, 0.5 of 139.8 GiB free" in std.err.splitlines()[1]
    assert S.main([*argv, "--budget", "0"]) == 2  # the blocked row is to run again, the refused one is done
    assert "1 combinations left" in capsys.readouterr().err
    again = tmp_path / "again"
    again.mkdir()
    (again / "sweep.jsonl").write_text(json.dumps({**rows[0], "outcome": "ran", "said": "20 steps timed"}) + "\n")
    assert S.main(["--table", str(out), str(again)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == \
        "1 ran, 1 refused, 0 blocked, 0 FAIL, 0 not run of 2 combinations"


def test_only_names_combinations_or_is_refused(capsys):
    todo = S.combos("gpu", True, "mxnet", {"mxnet": 356_382})
    assert [S.key(c) for c in S.only(todo, "mxnet-hybridized-bsnofit-*, mxnet-imperative-bs64-epochs-real")] == [
        "mxnet-imperative-bs64-epochs-real", "mxnet-hybridized-bs356382-within-synthetic"]
    with pytest.raises(ValueError, match="--only mxnet-eager-bs1-within-synthetic: no combination of this sweep"):
        S.only(todo, "mxnet-imperative-bs1-within-synthetic,mxnet-eager-bs1-within-synthetic")
    assert S.only(todo, None) == todo
