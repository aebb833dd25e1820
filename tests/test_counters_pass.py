"""The counters pass (kernelmap/run/counters.py): refused per case with its reason (CPU, no ncu, no profiler
window), the worker under ncu with the pass's flags and metric set where it runs, ncu's failure recorded without
dropping the case. Workers are stand-ins: no framework, no GPU."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kernelmap.frameworks.case import CaseKey
from test_worker import FakeWorkload

from kernelmap import cudaprofiler, frameworks, normalise, rundir, worker
from kernelmap.adapters import ncu as ncu_csv
from kernelmap.errors import KernelmapError
from kernelmap.run import case as run_case
from kernelmap.run import counters
from kernelmap.run import devices as run_devices
from kernelmap.run import processes as run_processes
from kernelmap.run import schedule as run_schedule

TRAIN = {"steps": 20, "warmup_steps": 5, "math": "fp32"}


def _case(tmp_path: Path, fw: str, device: str) -> run_case.CaseRun:
    key = CaseKey(fw, frameworks.get(fw).default_mode, "fp32", 1, 64)
    return run_case.CaseRun(key, run_devices.Decision(fw, device, device, None), TRAIN,
                            '{"n_train": 60000, "n_test": 10000}', tmp_path, None, None, 1, {})


def test_refused_on_the_cpu_with_its_reason(tmp_path, monkeypatch):
    def no_worker(*a, **k):
        raise AssertionError("no worker may start for a refused counters pass")

    monkeypatch.setattr(run_processes, "run_worker", no_worker)
    monkeypatch.setattr(counters, "find_ncu", lambda: "/opt/nvidia/nsight-compute/2025.3.1/ncu")  # even with ncu
    progress, notes = run_processes.RunProgress(3, enabled=False), []
    for fw in frameworks.FRAMEWORKS:
        case = _case(tmp_path, fw, "cpu")
        case.run_capture(counters.COUNTERS, progress, notes)
        assert case.pass_results[counters.COUNTERS] == {
            "skipped": "Nsight Compute reads an NVIDIA GPU's counters; this case runs on the CPU"}
        assert not case.failed
    assert len(notes) == len(frameworks.FRAMEWORKS) and all("counters pass skipped" in n for n in notes)
    assert progress.total == 3 - len(frameworks.FRAMEWORKS)  # none of them started a worker


def test_skip_reasons():
    assert counters.skip_reason("gpu", None).startswith("ncu not found; install")
    assert counters.skip_reason("gpu", "/x/ncu", 2) == "the counters pass counts one device's step; this case trains on 2"
    assert counters.skip_reason("gpu", "/x/ncu") is None


class Windowed(FakeWorkload):
    """A stand-in workload whose own profiler window records the steps it opened and closed at."""

    def __init__(self, seen, **kw):
        super().__init__(on_step=lambda: seen.__setitem__("steps", seen["steps"] + 1), **kw)
        self.seen = seen

    @contextlib.contextmanager
    def nsys_window(self):
        self.seen["own"] = self.seen["steps"]
        yield
        self.seen["own_end"] = self.seen["steps"]


@pytest.mark.parametrize("fw, own", [("pytorch", True), ("jax", False)])
def test_window_of_one_step_own_or_the_drivers(tmp_path, monkeypatch, fw, own):
    """The counters pass's one step inside the framework's own cudaProfilerStart/Stop window where its
    descriptor says it opens one (PyTorch), else the driver's (kernelmap/cudaprofiler.py)."""
    seen = {"steps": 0}

    @contextlib.contextmanager
    def driver_window(synchronize):
        seen["driver"] = seen["steps"]
        yield
        seen["driver_end"] = seen["steps"]

    monkeypatch.setattr(cudaprofiler, "window", driver_window)
    worker.run_pass(Windowed(seen, n_train=1000), framework=fw, pass_name="counters", out_dir=tmp_path,
                    steps=counters.STEPS, epochs=None, warmup=2, progress=False)
    key = "own" if own else "driver"
    assert (seen[key], seen[f"{key}_end"]) == (2, 3)
    assert ("driver" if own else "own") not in seen


def test_driver_window_without_a_driver_says_so(monkeypatch):
    monkeypatch.setattr(cudaprofiler, "LIBCUDA", "libcuda-absent-for-this-test.so.1")
    with pytest.raises(KernelmapError, match="no CUDA driver to open a profiler window"), \
            cudaprofiler.window(lambda: None):
        pass


def test_runs_the_worker_under_ncu(tmp_path, monkeypatch):
    calls = []

    def fake_worker(cmd, *, label, batch_size, env=None, log_path=None, stdout_path=None, forward_stderr=True,
                    stall_s=None):
        calls.append((list(cmd), stdout_path))
        if "kernelmap.worker" in cmd:
            d = Path(cmd[cmd.index("--dir") + 1])
            (d / rundir.pass_result_name(counters.COUNTERS)).write_text(json.dumps(
                {"steps": 1, "warmup_steps": 5, "peaks": {"gemm": {"bf16": {"flops_per_s": 6.0e14}}}}))
        else:
            stdout_path.write_text("csv")

    monkeypatch.setattr(run_processes, "run_worker", fake_worker)
    monkeypatch.setattr(counters, "find_ncu", lambda: "/opt/ncu")
    case = _case(tmp_path, "pytorch", "gpu")
    case.run_capture(counters.COUNTERS, run_processes.RunProgress(1, enabled=False), [])
    (profile, _), (imported, csv_out) = calls
    out = case.out_dir / counters.DIR
    assert profile[:9] == ["/opt/ncu", "--profile-from-start", "off", "--clock-control", "none",
                           "--cache-control", "all", "--replay-mode", "kernel"]
    assert profile[profile.index("--metrics") + 1].split(",") == list(ncu_csv.PASS_METRICS)
    assert profile[profile.index("--export") + 1] == str(out / "ncu")
    worker = profile[profile.index("-m") - 1:]
    assert worker[worker.index("--pass") + 1] == "counters" and worker[worker.index("--steps") + 1] == "1"
    assert imported == ["/opt/ncu", "--import", str(out / counters.REPORT), "--csv", "--page", "raw",
                        "--print-units", "base", "--print-kernel-base", "demangled"]
    assert csv_out == out / counters.CSV
    got = case.pass_results[counters.COUNTERS]
    assert got["csv"] == "pytorch/bs64/counters/ncu.csv" and got["steps"] == 1 and got["ncu_wall_s"] >= 0
    assert got["peaks"] == {"gemm": {"bf16": {"flops_per_s": 6.0e14}}}


def test_ncu_failure_is_recorded_and_the_case_goes_on(tmp_path, monkeypatch):
    def fake_worker(cmd, *, label, batch_size, env=None, log_path=None, stdout_path=None, forward_stderr=True,
                    stall_s=None):
        log = Path(cmd[cmd.index("--log-file") + 1])
        log.write_text("==PROF== Connected to process 1\n==ERROR== ERR_NVGPUCTRPERM - The user does not have "
                       "permission to access NVIDIA GPU Performance Counters on the target device 0.\n")
        raise KernelmapError(f"{label}: worker exited 1: (no message)")

    monkeypatch.setattr(run_processes, "run_worker", fake_worker)
    monkeypatch.setattr(counters, "find_ncu", lambda: "/opt/ncu")
    case, notes = _case(tmp_path, "pytorch", "gpu"), []
    case.run_capture(counters.COUNTERS, run_processes.RunProgress(1, enabled=False), notes)
    why = case.pass_results[counters.COUNTERS]["skipped"]
    assert why.startswith("ncu failed: ") and "ERR_NVGPUCTRPERM" in why and "==PROF==" not in why
    assert not case.failed and notes == [f"{case.name}: counters pass recorded nothing: {why}"]


def test_pass_is_a_profile_of_one_step_and_its_result_is_kernelmaps_own():
    # the timing passes too: the counters step is paired with a traced step, its kernels with their calls' math
    assert run_schedule.PROFILES["counters"] == (*run_schedule.PROFILES["all"], "counters")
    assert run_schedule.PASS_STEPS["counters"] == counters.STEPS == 1
    assert normalise.own_file(Path("counters.json")) == normalise.OWN_RESULT



@pytest.mark.gpu
@pytest.mark.parametrize("override", ["0", None])
def test_peaks_measured_through_pytorch(override):
    """On a GPU: every precision's GEMM peak and the copy bandwidth measured, bf16 above fp32 (tensor cores);
    the tf32 peak not measured, with its reason, where NVIDIA_TF32_OVERRIDE=0 holds TF32 off."""
    code = ("import json, torch; from kernelmap.frameworks.pytorch.peaks import measure\n"
            "print(json.dumps(measure(torch.device('cuda'))))")
    env = {k: v for k, v in os.environ.items() if k != "NVIDIA_TF32_OVERRIDE"}
    if override is not None:
        env["NVIDIA_TF32_OVERRIDE"] = override
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    p = json.loads(out.stdout.splitlines()[-1])
    g = p["gemm"]
    assert g["bf16"]["flops_per_s"] > 2 * g["fp32"]["flops_per_s"] > 0 and g["fp16"]["flops_per_s"] > 0
    assert ("not_measured" in g["tf32"]) == (override == "0")
    assert p["dram"]["bytes_per_s"] > 1e11 and len(p["dram"]["ms"]) == 10


def test_jax_counters_pass_reads_the_algorithms_its_case_chose(tmp_path, monkeypatch):
    """JAX's processes of a GPU case share XLA's autotuning results (frameworks/jax/descriptor.py): the first writes
    them, every later one, the counters pass under ncu too, reads them and autotunes nothing; the counters pass
    takes memory as needed and prints a crash's Python stack. On the CPU no flag is added."""
    from kernelmap.frameworks.jax import descriptor as jax_descriptor

    envs = []

    def fake_worker(cmd, *, label, batch_size, env=None, log_path=None, stdout_path=None, forward_stderr=True,
                    stall_s=None):
        envs.append(dict(env or {}))
        raise KernelmapError(f"{label}: worker exited 139: Segmentation fault")

    monkeypatch.setattr(run_processes, "run_worker", fake_worker)
    monkeypatch.setattr(counters, "find_ncu", lambda: "/opt/ncu")
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/mine")
    case = _case(tmp_path, "jax", "gpu")
    tuned = case.out_dir / "algorithms.textproto"
    case.out_dir.mkdir(parents=True)
    first = case._env("clean")["XLA_FLAGS"]
    assert first == f"--xla_dump_to=/tmp/mine {jax_descriptor.AUTOTUNE_DUMP}={tuned}"
    tuned.write_text("version: 3\n")  # what the first process wrote
    notes = []
    case.run_capture(counters.COUNTERS, run_processes.RunProgress(1, enabled=False), notes)
    (env,) = envs
    assert env["XLA_FLAGS"] == f"--xla_dump_to=/tmp/mine {jax_descriptor.AUTOTUNE_LOAD}={tuned}"
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" and env["PYTHONFAULTHANDLER"] == "1"
    assert case.pass_results[counters.COUNTERS]["skipped"].startswith("ncu failed: ")
    assert "algorithms" not in case.pass_results[counters.COUNTERS] and not any("autotun" in n for n in notes)
    assert _case(tmp_path / "cpu", "jax", "cpu")._env("clean")["XLA_FLAGS"] == "--xla_dump_to=/tmp/mine"


@pytest.mark.parametrize("pass_name", ["framework", "nsys", "noreduce", "counters"])
def test_only_a_clean_trial_writes_jaxs_algorithms(tmp_path, monkeypatch, pass_name):
    """Where no clean trial wrote the case's XLA autotuning results (the first failed before it compiled), no other
    pass writes them: the framework and nsys passes autotune on their own, the counters pass autotunes nothing under
    ncu (XLA's default algorithms) and its note and results.json say so; once the file is there every pass reads it."""
    from kernelmap.frameworks.jax import descriptor as jax_descriptor

    monkeypatch.delenv("XLA_FLAGS", raising=False)
    case = _case(tmp_path, "jax", "gpu")
    case.out_dir.mkdir(parents=True)
    tuned = case.out_dir / "algorithms.textproto"
    flags = case._env(pass_name).get("XLA_FLAGS", "")
    assert jax_descriptor.AUTOTUNE_DUMP not in flags and jax_descriptor.AUTOTUNE_LOAD not in flags
    assert (flags == jax_descriptor.NO_AUTOTUNE) == (pass_name == counters.COUNTERS)
    assert case._env("clean")["XLA_FLAGS"] == f"{jax_descriptor.AUTOTUNE_DUMP}={tuned}"
    if pass_name == counters.COUNTERS:
        envs = []

        def fake_worker(cmd, *, label, batch_size, env=None, log_path=None, stdout_path=None, forward_stderr=True,
                        stall_s=None):
            envs.append(dict(env or {}))
            raise KernelmapError(f"{label}: worker exited 1")

        monkeypatch.setattr(run_processes, "run_worker", fake_worker)
        monkeypatch.setattr(counters, "find_ncu", lambda: "/opt/ncu")
        notes = []
        case.run_capture(counters.COUNTERS, run_processes.RunProgress(1, enabled=False), notes)
        assert envs[0]["XLA_FLAGS"] == jax_descriptor.NO_AUTOTUNE
        said = case.pass_results[counters.COUNTERS]["algorithms"]
        assert "no clean trial wrote" in said and jax_descriptor.NO_AUTOTUNE in said
        assert [n for n in notes if said in n] == [f"{case.name}: counters pass: {said}"]
    tuned.write_text("version: 3\n")
    assert case._env(pass_name)["XLA_FLAGS"] == f"{jax_descriptor.AUTOTUNE_LOAD}={tuned}"
    assert jax_descriptor.algorithms_note(str(tuned), counters.COUNTERS) is None


def test_the_shared_algorithm_files_are_kernelmaps_own(tmp_path):
    """normalise lists a case's shared algorithm file (MXNet's algorithms.tsv, XLA's algorithms.textproto) as
    kernelmap's own, not as a file no adapter recognises."""
    for name in ("algorithms.tsv", "algorithms.textproto"):
        (tmp_path / name).write_text("version: 3\n")
        assert normalise.own_file(tmp_path / name) == normalise.OWN_ALGORITHMS
    (tmp_path / "other.textproto").write_text("version: 3\n")
    assert normalise.own_file(tmp_path / "other.textproto") is None
