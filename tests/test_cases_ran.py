"""A run that leaves cases out (a failed pass) exits 3; its report must not read as if those modes were
never asked for. On the H200 (`--mode all --profile all --batch-size 64 256 1024`), 7 of 24 cases were left
out and `report --strict` still passed 453 checks with 0 failed. ``every case ran`` fails there now, with
the note that says why; and the note names the error, not torch.compile's closing advice."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from kernelmap.reports import analysis as A
from kernelmap.reports import checks as C

from kernelmap.run import processes as run_processes

DATA = Path(__file__).parent / "data"
RUN = DATA / "gpu_replay_modes_run"


def _rows(d: Path):
    return C.cases_ran(A.load_run(d))


def test_a_run_whose_every_case_ran_passes():
    (row,) = _rows(RUN)
    assert (row["status"], row["expected"], row["measured"]) == (C.PASS, 2, 2)


def test_a_case_left_out_fails_with_the_note_that_says_why(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(RUN, d)
    results = json.loads((d / "results.json").read_text())
    kept = [r for r in results if r.get("mode") != "compile-graphs"]
    assert len(kept) == len(results) - 1
    (d / "results.json").write_text(json.dumps(kept))
    man = json.loads((d / "manifest.json").read_text())
    why = ("pytorch-compile-graphs bs 64 (clean pass trial 1/1, gpu): worker exited 1: torch._dynamo.exc."
           "InternalTorchDynamoError: ...; pytorch-compile-graphs bs 64 left out of the run")
    man["notes"] = [*man["notes"], "pytorch-compile-graphs bs 640 (libs pass, gpu): another case's note", why]
    (d / "manifest.json").write_text(json.dumps(man))
    (row,) = _rows(d)
    assert (row["framework"], row["batch_size"], row["status"], row["detail"]) == (
        "pytorch-compile-graphs", 64, C.FAIL, why)
    # and in the report's self-checks, so that --strict fails
    ch = C.self_checks([A.load_run(d)], None)
    assert (ch[ch["check"] == C.Check.CASES_RAN]["status"] == C.FAIL).sum() == 1


def test_a_manifest_without_what_was_asked_is_not_checked(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(RUN, d)
    man = json.loads((d / "manifest.json").read_text())
    del man["config"]["modes"]
    (d / "manifest.json").write_text(json.dumps(man))
    (row,) = _rows(d)
    assert row["status"] == C.NOT_CHECKED


@pytest.mark.parametrize(("log", "expected"), [
    ("compile_graphs_h200.log.gz", "torch._dynamo.exc.InternalTorchDynamoError: RuntimeError: Error: accessing "
                                   "tensor output of CUDAGraphs that has been overwritten by a subsequent run."),
    ("compile_devnull_h200.log.gz", "FileNotFoundError: [Errno 2] No such file or directory: '/dev/null'"),
])
def test_a_workers_error_line_is_its_error_not_the_advice_after_it(log, expected):
    text = gzip.decompress((DATA / "worker_stderr" / log).read_bytes()).decode()
    assert run_processes.error_line(text).startswith(expected)
    if "TORCHDYNAMO" in text:  # torch.compile's advice is its last line
        assert text.strip().splitlines()[-1].startswith("Set TORCHDYNAMO_VERBOSE=1")


def test_without_an_error_line_the_last_line_is_said():
    assert run_processes.error_line("a\n  b  \n\n") == "b"
    assert run_processes.error_line("kernelmap-worker: error: no graph captured\nlater\n") == \
        "kernelmap-worker: error: no graph captured"
    assert run_processes.error_line("") == ""
