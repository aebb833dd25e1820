"""benches/gpu_job.sh's options, run for real with a python3 that only writes down how it was called: bad options
refused before anything starts, DATA_DIR given to every phase that reads data, and `nox -s reference_loop`'s job.
(The carried MXNet tree's unpack: tests/test_mxnet_build.py.)"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benches" / "gpu_job.sh"
pytestmark = pytest.mark.skipif(not shutil.which("bash"), reason="needs bash")


def _python(where: Path, log: Path, rc: int = 0) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "python3").write_text(f'#!/bin/sh\necho "$@" >>"{log}"\nexit {rc}\n')
    (where / "python3").chmod(0o755)
    return where


def _job(tmp_path: Path, *args: str, **options: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The job in the foreground from an empty checkout (no .gpu/, no tree); python3's calls, one line each."""
    log = tmp_path / "python3.log"
    log.unlink(missing_ok=True)
    fake = _python(tmp_path / "bin", log)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path), "OUT": str(tmp_path / "out"),
           "KERNELMAP_MXNET_HOME": str(tmp_path / "mxhome"), **options}
    checkout = tmp_path / "checkout"
    checkout.mkdir(exist_ok=True)
    proc = subprocess.run(["bash", str(SCRIPT), *args], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=120)
    return proc, log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize(("options", "message"), [
    ({"PHASES": "bare rn"}, "PHASES: unknown phase 'rn' (known: bare mxnet smoke"),
    ({"DATA_DIR": "/nonexistent/idx"}, "DATA_DIR=/nonexistent/idx: no such directory"),
    ({"RUN_ARGS": "--framework pytorch --data synthetic"}, "RUN_ARGS: no --data there; give a directory as DATA_DIR"),
    ({"VENV": "/nonexistent/venv"}, "VENV=/nonexistent/venv: no bin/python3 there"),
])
@pytest.mark.parametrize("mode", [(), ("job",)])
def test_bad_options_are_refused_before_anything_starts(tmp_path, options, message, mode):
    proc, calls = _job(tmp_path, *mode, **options)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert calls == [] and not (tmp_path / "out").exists()


def _data_args(calls: list[str]) -> dict[str, list[str]]:
    """Per phase (the script or module python3 ran), the data each call was given."""
    seen: dict[str, list[str]] = {}
    for line in calls:
        words = line.split()
        what = words[1] if words[0] == "-m" else Path(words[0]).name
        if what == "kernelmap.cli":
            what = f"kernelmap {words[2]}"
        if what == "pytest":
            what = Path(words[2]).name
        for i, w in enumerate(words):
            if w in ("--data", "--real-dir"):
                seen.setdefault(what, []).append(f"{w} {words[i + 1]}")
            elif w.startswith("--bench-data="):
                seen.setdefault(what, []).append(w)
    return seen


def test_data_dir_is_the_data_of_every_phase_that_reads_data(tmp_path):
    idx = tmp_path / "fashion-mnist"
    idx.mkdir()
    phases = "reference run bench repeats custom-op sweep"
    proc, calls = _job(tmp_path, "job", PHASES=phases, DATA_DIR=str(idx), CUSTOM_ROUTES="jit")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "out" / "DONE").read_text().strip() == "0"
    assert _data_args(calls) == {
        "bench_reference_loop.py": [f"--bench-data={idx}"],
        "kernelmap run": [f"--data {idx}"] * 5,  # the run, three repeats, the custom-op route's run
        "bench_train_step.py": [f"--bench-data={idx}"] * 3,  # one pytest process per framework
        "option_sweep.py": [f"--real-dir {idx}"],
    }, calls
    proc, calls = _job(tmp_path, "job", PHASES="run sweep")
    assert _data_args(calls) == {"kernelmap run": ["--data synthetic"]}, calls


def test_nox_reference_loop_runs_the_jobs_reference_and_repeats_with_nox_python(tmp_path):
    pytest.importorskip("nox")
    from conftest import noxfile_module

    nf = noxfile_module()
    assert nf.reference_loop_job([]) == {"PHASES": "reference repeats", "VENV": str(nf.FRAMEWORKS_ENV.absolute()),
                                         "OUT": nf.REFERENCE_LOOP_OUT}
    assert nf.reference_loop_job(["synthetic", "o"])["OUT"] == "o"
    assert "DATA_DIR" not in nf.reference_loop_job(["synthetic"])
    assert nf.reference_loop_job(["/data/idx"])["DATA_DIR"] == "/data/idx"
    with pytest.raises(ValueError, match=r"reference_loop takes \[DATA_DIR \[OUT\]\], not a b c"):
        nf.reference_loop_job(["a", "b", "c"])
    # the job with that environment: every python3 call is the venv's (a python3 first on PATH would be nox's own)
    venv_log = tmp_path / "venv.log"
    venv = tmp_path / "venv"
    _python(venv / "bin", venv_log)
    env = {**nf.reference_loop_job([]), "VENV": str(venv), "OUT": str(tmp_path / "ref")}
    proc, calls = _job(tmp_path, "job", **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert calls == []  # nothing ran with the python3 before VENV on PATH, and nothing was installed
    venv_calls = venv_log.read_text().splitlines()
    assert not any("pip install" in c for c in venv_calls)
    assert _data_args(venv_calls) == {"bench_reference_loop.py": ["--bench-data=synthetic"],
                                      "kernelmap run": ["--data synthetic"] * 3}
    assert any(c.endswith("benches/repeats.py " + " ".join(str(tmp_path / "ref" / f"repeat{i}.json")
                                                          for i in (1, 2, 3))) for c in venv_calls), venv_calls


def test_sweep_shards_run_side_by_side_one_gpu_each_and_merge_into_one_table(tmp_path):
    """SWEEP_SHARDS=3 on a machine of two GPUs: shards 1/3 and 3/3 on GPU 0, 2/3 on GPU 1, each its own rows,
    then one table of the three; TESTS_K and TESTS_DIR reach pytest."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/sh\n[ "$1" = -L ] && printf "GPU 0: H100 (UUID: a)\\nGPU 1: H100 (UUID: b)\\n"\nexit 0\n')
    smi.chmod(0o755)
    log = tmp_path / "python3.log"
    (bin_dir / "python3").write_text(f'#!/bin/sh\necho "GPU=$CUDA_VISIBLE_DEVICES $@" >>"{log}"\nexit 0\n')
    (bin_dir / "python3").chmod(0o755)
    out = tmp_path / "out"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "OUT": str(out), "PHASES": "sweep tests",
           "KERNELMAP_MXNET_HOME": str(tmp_path / "mxhome"), "SWEEP_SHARDS": "3", "TESTS_K": "graph_and_compiled",
           "TESTS_DIR": "/some/tests"}
    (tmp_path / "checkout").mkdir()
    proc = subprocess.run(["bash", str(SCRIPT), "job"], cwd=tmp_path / "checkout", env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = log.read_text().splitlines()
    shards = sorted((c.split()[0], c.split("--shard ")[1].split()[0], c.split("--out ")[1].split()[0])
                    for c in calls if "option_sweep.py" in c and "--shard" in c)
    assert shards == [("GPU=0", "1/3", f"{out}/sweep-1"), ("GPU=0", "3/3", f"{out}/sweep-3"),
                      ("GPU=1", "2/3", f"{out}/sweep-2")]
    (table,) = [c for c in calls if "--table" in c]
    assert table.split("--table ")[1].split() == [f"{out}/sweep-{k}" for k in (1, 2, 3)]
    (tests,) = [c for c in calls if "-m pytest" in c]
    assert "-k graph_and_compiled -rfs --continue-on-collection-errors /some/tests" in tests


def test_a_failing_shard_and_run_set_say_their_own_exit_status(tmp_path):
    """The status printed after a run set or a sweep shard is the command's, not the `date` substitution's
    beside it (every line said 'exit 0': the H200 hold's MXNet run set that ran nothing read as exit 0)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text('#!/bin/sh\ncase "$*" in *option_sweep.py*--shard*) exit 3;; '
                                     '*"kernelmap.cli run"*) exit 2;; esac\nexit 0\n')
    (bin_dir / "python3").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "OUT": str(tmp_path / "out"),
           "PHASES": "run sweep", "RUN_SETS": "@0 --framework pytorch", "SWEEP_SHARDS": "1",
           "KERNELMAP_MXNET_HOME": str(tmp_path / "mxhome")}
    (tmp_path / "checkout").mkdir()
    proc = subprocess.run(["bash", str(SCRIPT), "job"], cwd=tmp_path / "checkout", env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "run set 0 exit 2 (GPU 0)" in proc.stdout and "sweep shard 1/1 exit 3" in proc.stdout, proc.stdout


def test_commands_run_one_after_another_each_its_log_and_exit_status(tmp_path):
    """CMDS's lines (' ;; ' between them) run in order from /tmp, each with its own log and its own exit status;
    a failing one (or one that reads its standard input) does not stop the next; the phase without CMDS is refused before anything starts."""
    proc, _ = _job(tmp_path, "job", PHASES="commands",
                   CMDS='echo one; pwd ;; cat >/dev/null; echo "two words"; exit 3 ;; echo three')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "out"
    assert (out / "cmd-1.log").read_text().splitlines() == ["one", "/tmp"]
    assert (out / "cmd-2.log").read_text() == "two words\n" and (out / "cmd-3.log").read_text() == "three\n"
    assert [ln for ln in proc.stdout.splitlines() if ln.startswith("command ")] == [
        "command 1 exit 0", "command 2 exit 3", "command 3 exit 0"], proc.stdout
    proc, _ = _job(tmp_path, "job", PHASES="commands")
    assert proc.returncode == 2 and "the commands phase needs CMDS" in proc.stderr, proc.stdout + proc.stderr


def test_sweep_gpus_start_the_sweep_beside_the_run_sets_and_a_set_alone_waits_for_it(tmp_path):
    """SWEEP_GPUS=3: both shards on GPU 3, started with the side-by-side run sets (the @0 set starts before a shard
    ends), and the --devices set alone (every GPU) starts only after both shards ended."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "python3.log"
    (bin_dir / "python3").write_text(
        f'#!/bin/sh\necho "start GPU=$CUDA_VISIBLE_DEVICES $@" >>"{log}"\n'
        f'case "$*" in *option_sweep.py*--shard*) sleep 1; echo "end shard" >>"{log}";; esac\nexit 0\n')
    (bin_dir / "python3").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "OUT": str(tmp_path / "out"),
           "PHASES": "run sweep", "RUN_SETS": "@0 --framework pytorch;--framework all --devices 2",
           "SWEEP_SHARDS": "2", "SWEEP_GPUS": "3", "KERNELMAP_MXNET_HOME": str(tmp_path / "mxhome")}
    (tmp_path / "checkout").mkdir()
    proc = subprocess.run(["bash", str(SCRIPT), "job"], cwd=tmp_path / "checkout", env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = log.read_text().splitlines()
    shards = [x for x in lines if "option_sweep.py" in x and "--shard" in x]
    assert [x.split()[1] for x in shards] == ["GPU=3", "GPU=3"]
    first_run = next(i for i, x in enumerate(lines) if "kernelmap.cli run" in x and "--framework pytorch" in x)
    alone = next(i for i, x in enumerate(lines) if "kernelmap.cli run" in x and "--devices 2" in x)
    ends = [i for i, x in enumerate(lines) if x == "end shard"]
    assert len(ends) == 2 and first_run < min(ends) and alone > max(ends)
    assert sum("--table" in x for x in lines) == 1  # the sweep phase merged the shards it did not start again
