"""benches/option_sweep.py's verdicts: ran, refused before any work, or FAIL (a traceback, a refusal after a worker
started, a wrong number of timed steps); its steps within and past an epoch; its --quick combinations."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

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
    assert capsys.readouterr().out.splitlines()[-1] == "1 ran, 0 refused, 1 FAIL, 0 not run of 2 combinations"
