"""``kernelmap run``: device decisions, worker failures, the nsys command path and real CPU runs.

End-to-end runs go through the console entry (``python -m kernelmap.cli run``) in a subprocess,
so this pytest process never imports a framework.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import require_framework
from kernelmap.frameworks import spec
from kernelmap.frameworks.registry import NsysWindow

from kernelmap import frameworks, manifest, rundir, runner, timing
from kernelmap.errors import KernelmapError

MX_GPU_PROBE = {"installed": True, "version": "1.9.1", "cuda_build": True, "num_gpus": 1}
MX_CPU_PROBE = {"installed": True, "version": "1.9.1", "cuda_build": False, "num_gpus": 0}
TORCH_CUDA = {"installed": True, "version": "2.14.1+cu130", "cuda_build": "13.0", "cuda_available": True}
TORCH_CPU = {"installed": True, "version": "2.14.1+cpu", "cuda_build": None, "cuda_available": False}


# --- device decisions (the real gpu_verdict, with an injected compute capability) -------------------
@pytest.mark.parametrize("requested", ["auto", "gpu"])
def test_mxnet_on_hopper_runs_on_cpu_labelled(requested):
    d = runner.decide_device("mxnet", requested, MX_GPU_PROBE, "9.0")
    assert d.device == "cpu"
    assert "sm_90" in d.note and "CPU" in d.note
    assert d.to_manifest() == {"device_requested": requested, "device": "cpu", "device_note": d.note}


@pytest.mark.parametrize("cc", ["8.0", "8.6", "8.9", "7.0"])
def test_mxnet_gpu_where_the_wheel_has_code(cc):
    d = runner.decide_device("mxnet", "auto", MX_GPU_PROBE, cc)
    assert (d.device, d.note) == ("gpu", None)


def test_mxnet_blackwell_and_cpu_wheel():
    assert runner.decide_device("mxnet", "auto", MX_GPU_PROBE, "10.0").device == "cpu"
    auto = runner.decide_device("mxnet", "auto", MX_CPU_PROBE, "8.0")
    assert auto.device == "cpu" and "CPU build" in auto.note
    explicit = runner.decide_device("mxnet", "gpu", MX_CPU_PROBE, "8.0")
    assert explicit.device is None and explicit.explicit and "mxnet-gpu" in explicit.note


def test_torch_without_cuda():
    auto = runner.decide_device("pytorch", "auto", TORCH_CPU, None, "nvidia-smi not on PATH")
    assert auto.device == "cpu" and "CPU-only build" in auto.note
    gpu = runner.decide_device("pytorch", "gpu", TORCH_CPU, "9.0")
    assert gpu.device is None and gpu.explicit and "download.pytorch.org" in gpu.note
    assert runner.decide_device("pytorch", "gpu", TORCH_CUDA, "9.0").device == "gpu"
    assert runner.decide_device("pytorch", "cpu", TORCH_CUDA, "9.0").device == "cpu"


def test_missing_framework_is_skipped_with_fix():
    d = runner.decide_device("mxnet", "auto", {"installed": False, "error": "No module named 'mxnet'",
                                                "fix": "pip install x"}, None)
    assert d.device is None and not d.explicit and "pip install x" in d.note


# --- worker failures, the libs environment, nsys ----------------------------------------------------
def test_worker_failure_is_one_line_naming_the_pass():
    cmd = [sys.executable, "-c", "import sys; print('progress\\r', file=sys.stderr); sys.exit('boom: bad thing')"]
    with pytest.raises(KernelmapError) as exc:
        runner.run_worker(cmd, label="pytorch bs 64 (clean pass, cpu)", batch_size=64, forward_stderr=False)
    assert str(exc.value) == "pytorch bs 64 (clean pass, cpu): worker exited 1: boom: bad thing"


def test_worker_oom_names_the_batch_size():
    cmd = [sys.executable, "-c", f"import sys; sys.exit({runner.EXIT_OOM})"]
    with pytest.raises(KernelmapError, match="out of memory at batch size 1024"):
        runner.run_worker(cmd, label="mxnet bs 1024 (clean pass, gpu)", batch_size=1024, forward_stderr=False)


def test_worker_exit_oom_matches():
    from kernelmap import worker

    assert worker.EXIT_OOM == runner.EXIT_OOM


def test_libs_env():
    gpu = runner.libs_env("gpu", Path("/x"), "pytorch")
    assert gpu["CUDNN_LOGDEST_DBG"] == "/x/cudnn.log" and gpu["CUDNN_LOGLEVEL_DBG"] == "3"
    assert gpu["CUBLAS_LOGINFO_DBG"] == "1" and gpu["CUBLAS_LOGDEST_DBG"] == "/x/cublas.log"
    mx = runner.libs_env("gpu", Path("/x"), "mxnet")
    assert mx["CUDNN_LOGINFO_DBG"] == "1" and "CUDNN_LOGLEVEL_DBG" not in mx
    assert gpu["CUBLASLT_LOG_FILE"] == "/x/cublaslt.log"
    cpu = runner.libs_env("cpu", Path("/x"))
    assert cpu["ONEDNN_VERBOSE"] == "1"
    # oneMKL's own verbose log (torch's CPU sgemm) goes to its own file, not the oneDNN stdout capture
    assert cpu["MKL_VERBOSE"] == "1" and cpu["MKL_VERBOSE_OUTPUT_FILE"] == "/x/blas.log"


FAKE_NSYS = """\
#!{python}
# A stand-in for nsys: `profile ... -o BASE ... CMD...` runs CMD and writes BASE.nsys-rep;
# `export ... -o OUT REPORT` writes OUT. Records its argv in calls.jsonl beside itself.
import json, os, subprocess, sys
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "calls.jsonl"), "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\\n")
args = sys.argv[1:]
out = args[args.index("-o") + 1]
if args[0] == "profile":
    cmd = args[args.index("--force-overwrite") + 2:]
    rc = subprocess.call(cmd)
    open(out + ".nsys-rep", "w").write("report")
    sys.exit(rc)
open(out, "w").write("sqlite from " + args[-1])
"""


def test_nsys_command_path(tmp_path):
    nsys = tmp_path / "bin" / "nsys"
    nsys.parent.mkdir()
    nsys.write_text(FAKE_NSYS.format(python=sys.executable))
    nsys.chmod(nsys.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "run"
    out.mkdir()
    worker = [sys.executable, "-c", f"open({str(out / 'nsys.json')!r}, 'w').write('{{}}')"]
    profile, export = runner._nsys_commands(str(nsys), out, worker, NsysWindow.PROFILER_API)
    runner.run_worker(profile, label="pytorch bs 64 (nsys pass, gpu)", batch_size=64, forward_stderr=False)
    runner.run_worker([*export, str(runner._nsys_report(out))], label="export", batch_size=64)
    assert (out / "nsys.json").is_file() and (out / "nsys.sqlite").read_text().endswith("nsys.nsys-rep")
    calls = [json.loads(line) for line in (tmp_path / "bin" / "calls.jsonl").read_text().splitlines()]
    assert calls[0][:2] == ["profile", "--trace=cuda,nvtx"] and calls[0][-len(worker):] == worker
    assert "--capture-range=cudaProfilerApi" in calls[0]
    assert calls[1][:3] == ["export", "--type", "sqlite"]


def test_nsys_window_kind_sets_the_capture_flags(tmp_path):
    """cudaProfilerStart/Stop: nsys records only the window; an NVTX range (MXNet built for sm_90, whose
    nsys agent died when a capture started mid-run): nsys records the whole process, no capture range."""
    worker = ["python", "-m", "kernelmap.worker"]
    api, _ = runner._nsys_commands("nsys", tmp_path, worker, NsysWindow.PROFILER_API)
    nvtx, _ = runner._nsys_commands("nsys", tmp_path, worker, NsysWindow.NVTX_RANGE)
    assert api[api.index("--capture-range=cudaProfilerApi") + 1] == "--capture-range-end=stop"
    assert not any(a.startswith("--capture-range") for a in nvtx)
    assert nvtx[-len(worker):] == worker and api[-len(worker):] == worker
    mx = frameworks.get("mxnet")
    assert mx.nsys_window({}) is None  # the cu11x wheel or the CPU: no window, the pass is skipped
    assert mx.nsys_window({"KERNELMAP_MXNET_TREE": "/tmp/mxhome/1.9.1-sm90"}) is NsysWindow.NVTX_RANGE
    assert frameworks.get("pytorch").nsys_window(None) is NsysWindow.PROFILER_API


def test_nsys_skip_is_said_once_per_reason():
    """On a machine without a GPU the nsys pass was skipped with the same line, and nsys's install
    advice, once per framework x batch size: now one line per reason, naming the frameworks."""
    cpu = {fw: runner.Decision(fw, "auto", "cpu", "no NVIDIA GPU found; running on the CPU") for fw in frameworks.FRAMEWORKS}
    skips = runner.nsys_skips(cpu, None)
    assert set(skips) == set(frameworks.FRAMEWORKS)
    (line,) = runner.said_once(skips, "nsys pass skipped")
    assert line.startswith(f"nsys pass skipped ({', '.join(frameworks.FRAMEWORKS)}): ")
    assert "no CUDA work" in line and "not found" not in line  # installing nsys would not help on the CPU
    gpu = {fw: runner.Decision(fw, "auto", "gpu", None) for fw in frameworks.FRAMEWORKS}
    (line,) = runner.said_once(runner.nsys_skips(gpu, None), "nsys pass skipped")
    assert "nsys not found" in line and "nsight-systems" in line  # on a GPU machine: the fix, once
    with_nsys = runner.nsys_skips(gpu, "/opt/nsys")  # only a framework that opens no capture window
    assert set(with_nsys) == {fw for fw in frameworks.FRAMEWORKS
                              if not frameworks.get(fw).nsys_window(runner.worker_own_env(fw, "gpu"))}
    skipped = {**cpu, "jax": runner.Decision("jax", "gpu", None, "--device gpu: ...", explicit=True)}
    assert "jax" not in runner.nsys_skips(skipped, None)  # a framework that does not run has no pass


def test_progress_is_one_plain_line_per_worker_that_starts():
    """The overall progress: a line per worker, n of N, elapsed and (from the second) an ETA, with no
    carriage return (a log without a terminal reads it); N leaves out the nsys passes skipped here."""
    import io

    cpu = {fw: runner.Decision(fw, "auto", "cpu", "no NVIDIA GPU") for fw in frameworks.FRAMEWORKS}
    passes, trials, n_bs = runner.PROFILES["all"], 3, 2
    n = runner.planned_workers(list(cpu), n_bs, trials, passes, runner.nsys_skips(cpu, None))
    captures_that_run = [p for p in passes if p not in ("clean", "nsys")]
    assert n == n_bs * len(cpu) * (trials + len(captures_that_run))
    assert runner.planned_workers(list(cpu), n_bs, trials, passes, {}) == n + n_bs * len(cpu)  # nsys where it runs
    stream = io.StringIO()
    progress = runner.RunProgress(n, stream=stream)
    for k in range(n):
        progress.start(f"worker {k}")
        progress.finish()
    lines = stream.getvalue().split("\n")[:-1]
    assert "\r" not in stream.getvalue() and len(lines) == n
    assert f"[1/{n}] worker 0 (elapsed " in lines[0] and "ETA" not in lines[0]
    assert all(f"[{k + 1}/{n}] worker {k} (elapsed " in line and "ETA ~" in line for k, line in enumerate(lines) if k)


# --- the CLI ---------------------------------------------------------------------------------------
def _run_cli(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelmap.cli", "run", *argv], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))


def test_existing_out_is_refused(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = _run_cli("--framework", "pytorch", "--device", "cpu", "--out", str(out))
    assert proc.returncode == 2
    assert "already exists" in proc.stderr and "--replace" in proc.stderr
    assert (out / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


STEPS = 3
TRIALS = 2


def _check_run(out: Path, framework: str, proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)  # --json: stdout is only the summary
    assert summary["run_dir"] == str(out)
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".partial")]
    man = json.loads((out / "manifest.json").read_text())
    for key in manifest.REQUIRED_KEYS:
        assert key in man, key
    fw = man["frameworks"][framework]
    assert (fw["device_requested"], fw["device"]) == ("cpu", "cpu")
    assert fw["versions"]["framework"] == framework and fw["versions"]["version"]
    assert man["data"]["kind"] == "synthetic" and man["data"]["sha256"]
    assert man["config"]["train"]["steps"] == STEPS
    assert man["host"]["cpu"]
    (entry,) = json.loads((out / "results.json").read_text())
    assert (entry["framework"], entry["batch_size"], entry["device"]) == (framework, 64, "cpu")
    assert entry["mode"] == frameworks.get(framework).modes[0]  # not hybridized: the first mode
    # the CPU: no TF32; its worker keeps (and records) whatever NVIDIA_TF32_OVERRIDE it inherits
    assert entry["math"] == "fp32" and entry["tf32_override"] == os.environ.get(spec.TF32_OVERRIDE)
    # STEPS < timing.BLOCK_STEPS: each trial times one block of STEPS steps, so one sample per trial
    assert entry["steps"] == STEPS and entry["n_trials"] == TRIALS and len(entry["trials"]) == TRIALS
    assert len(entry["step_times_s"]) == TRIALS and all(t > 0 for t in entry["step_times_s"])
    assert entry["median_step_s"] == pytest.approx(float(np.median(entry["step_times_s"])))
    assert entry["ci95_low_s"] <= entry["median_step_s"] <= entry["ci95_high_s"]
    assert entry["images_per_s"] == pytest.approx(64 / entry["median_step_s"])
    assert entry["e2e_images_per_s"] == pytest.approx(64 / entry["e2e_step_s"])
    assert 0.0 <= entry["test_accuracy"] <= 1.0
    pids = set()
    for t in range(1, TRIALS + 1):
        trial = json.loads((out / framework / "bs64" / f"clean-{t}.json").read_text())
        pids.add(trial["pid"])
        assert trial["sample_steps"] == [STEPS] and trial["block_steps"] == timing.BLOCK_STEPS
        # end to end (loader included) is never shorter than the steps alone
        assert trial["e2e_step_s"] * STEPS >= trial["step_times_s"][0] * STEPS
        assert trial["threads"]["env"] == {k: str(man["config"]["threads"]) for k in timing.THREAD_ENV}
        assert (trial["test_accuracy"] is None) == (t > 1)  # accuracy from the first trial only
    assert len(pids) == TRIALS  # each trial its own process
    return entry


def test_run_pytorch_cpu_with_onednn_pass(tmp_path):
    """Every pass on the CPU. The console holds kernelmap's own lines only: what the workers and their
    libraries print (Kineto's `USDT: ... profiler_start`, `gpuGetDeviceCount failed with code 35` from a
    CUDA build without a GPU, third-party warnings) goes to RUN_DIR/logs/."""
    require_framework("pytorch")
    out = tmp_path / "run"
    proc = _run_cli("--framework", "pytorch", "--device", "cpu", "--steps", str(STEPS), "--warmup", "1",
                    "--trials", str(TRIALS), "--data", "synthetic", "--out", str(out), "--profile", "all", "--json")
    entry = _check_run(out, "pytorch", proc)
    console = proc.stderr.splitlines()
    assert console and all(line.startswith("kernelmap run: ") for line in console), proc.stderr[-3000:]
    assert sum("nsys pass skipped" in line for line in console) == 1 and "skipped" in entry["passes"]["nsys"]
    captures = [p for p in runner.PROFILES["all"] if p not in ("clean", "nsys")]  # nsys: none on the CPU
    n = TRIALS + len(captures)
    workers = [line for line in console if line.startswith("kernelmap run: [")]
    assert len(workers) == n and workers[-1].startswith(f"kernelmap run: [{n}/{n}]")
    logs = sorted(p.name for p in (out / "logs").iterdir())
    assert logs == sorted(rundir.worker_log("pytorch", 64, p, t).name for p, t in
                          [*(("clean", t) for t in range(1, TRIALS + 1)), *((p, None) for p in captures)])
    libs = entry["passes"]["libs"]
    assert libs["steps"] == STEPS and libs["overhead"] == pytest.approx(libs["median_step_s"] / entry["median_step_s"] - 1)
    assert libs["overhead_verdict"] == "too few steps"  # 3 < timing.MIN_CAPTURE_STEPS
    log = (out / "pytorch" / "bs64" / "onednn.log").read_text()
    assert "onednn_verbose" in log and ",exec," in log
    assert (out / "records.parquet").is_file()  # normalise ran over the captures


@pytest.mark.mxnet
def test_run_mxnet_cpu(tmp_path):
    out = tmp_path / "run"
    proc = _run_cli("--framework", "mxnet", "--device", "cpu", "--steps", str(STEPS), "--warmup", "1",
                    "--trials", str(TRIALS), "--data", "synthetic", "--out", str(out), "--json")
    _check_run(out, "mxnet", proc)


@pytest.mark.gpu
def test_run_all_gpu_all_passes(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "kernelmap.cli", "run", "--framework", "all", "--device", "auto",
                           "--steps", "10", "--data", "synthetic", "--out", str(out), "--profile", "all", "--json"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    man = json.loads((out / "manifest.json").read_text())
    assert man["gpu"]["compute_capability"]
    results = json.loads((out / "results.json").read_text())
    torch_entry = next(r for r in results if r["framework"] == "pytorch")
    assert torch_entry["device"] == "gpu"
    bs_dir = out / "pytorch" / "bs64"
    assert (bs_dir / "trace.json.gz").is_file() and (bs_dir / "cudnn.log").is_file()
    assert (bs_dir / "cublas.log").is_file() or (bs_dir / "cublaslt.log").is_file()
    assert {r["math"] for r in results if r["device"] == "gpu"} == {"fp32"}
    assert {r["tf32_override"] for r in results if r["device"] == "gpu"} == {"0"}
    ran = {r["framework"]: r["device"] for r in results}
    # issue 12's bar: PyTorch (Kineto) and MXNet (nsys NVTX, where built for this GPU) attribute >= 99% of
    # their kernel time in the profiled steps to canonical ops, and their library kernels link to log calls
    rows = json.loads((out / "attribution.json").read_text())["by_source"]
    # linked share of library-kernel time at bs 64 (H100, 2026-11-25: 1.0 for both; MXNet's per-process
    # cuDNN autotune can leave a backward its log pass did not run, unlinked)
    for fw, src, linked in (("pytorch", "kineto", 0.9), ("mxnet", "nsys", 0.8)):
        if ran.get(fw) != "gpu":
            continue
        if src == "nsys" and shutil.which("nsys") is None:  # the pass is skipped and says so
            assert any("nsys" in n for n in man["notes"]), man["notes"]
            assert not [r for r in rows if (r["framework"], r["source"]) == (fw, src)]
            continue
        (row,) = [r for r in rows if (r["framework"], r["batch_size"], r["source"]) == (fw, 64, src)]
        assert row["attributed_kernel_time_share_in_op_steps"] >= 0.99, (fw, row)
        assert row["library_kernels_in_op_steps"] > 0, (fw, row)
        assert row["library_kernel_time_linked_share_in_op_steps"] > linked, (fw, row)
    for fw, device in ran.items():
        if fw == "pytorch":
            continue
        par = json.loads((out / f"parity-{fw}.json").read_text())  # every framework against the reference
        assert par["device"] == ("gpu" if device == ran["pytorch"] == "gpu" else "cpu")


def test_parent_imports_no_framework():
    code = textwrap.dedent("""
        import sys
        import kernelmap.cli, kernelmap.runner, kernelmap.doctor, kernelmap.manifest, kernelmap.gpuinfo
        kernelmap.cli.build_parser()
        bad = [m for m in ("torch", "mxnet") if m in sys.modules]
        assert not bad, bad
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["pytorch", "mxnet"])
def test_real_cpu_oom_leaves_that_batch_size_out(tmp_path, framework):
    """A real allocation failure (6 GB address-space limit, batch 60000 needs a 6 GB activation):
    named as out of memory with the batch size, no traceback; the batch size that fits still runs."""
    import resource

    require_framework(framework)
    limit = 6_000_000 * 1024

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "kernelmap.cli", "run", "--framework", framework, "--device", "cpu", "--data",
         "synthetic", "--steps", "2", "--batch-size", "32", "60000", "--out", str(out), "--json"],
        capture_output=True, text=True, preexec_fn=cap, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""), timeout=600)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert [(r["framework"], r["batch_size"]) for r in summary["results"]] == [(framework, 32)]
    note = f"{framework} bs 60000 (clean pass trial 1/3, cpu): out of memory at batch size 60000; try a smaller --batch-size"
    assert any(n.startswith(note) for n in summary["notes"]), summary["notes"]
    assert [r["batch_size"] for r in json.loads((out / "results.json").read_text())] == [32]


def _workers_that_finish(monkeypatch):
    """Every framework installed, and each worker's clean pass finished (no subprocess)."""
    def fake_run_one(fw, decision, bs, *rest):
        return {"framework": fw, "mode": frameworks.get(fw).modes[0], "batch_size": bs, "device": decision.device,
                "device_note": decision.note, "median_step_s": 0.01, "ci95_low_s": None, "ci95_high_s": None,
                "ci95_half_width_rel": None, "noisy": None, "n_trials": 1, "iqr_step_s": 0.0, "images_per_s": 6400.0,
                "e2e_step_s": None, "e2e_images_per_s": None, "test_accuracy": None, "passes": {"clean": {}},
                "versions": {"framework": fw}}

    monkeypatch.setattr(runner, "_run_one", fake_run_one)
    monkeypatch.setattr(runner.doctor, "find_framework", lambda fw, python=None: {"installed": True})


def _quick_run_args(out: Path, framework: str, profile: str) -> argparse.Namespace:
    from kernelmap import cli

    return cli.build_parser(["run"]).parse_args(
        ["run", "--framework", framework, "--device", "cpu", "--steps", "3", "--trials", "1", "--profile", profile,
         "--data", "synthetic", "--out", str(out), "--json"])


def test_parity_failure_keeps_the_finished_run_and_says_why(tmp_path, monkeypatch, capsys):
    """A parity that cannot be computed (a KernelmapError, MissingToolError included) after every
    worker finished: the run directory is kept, its notes and manifest say why, and so does the report."""
    from kernelmap.reports.analyses.base import load_run

    from kernelmap import parity as parity_mod
    from kernelmap.errors import MissingToolError

    why = "parity: the second worker cannot start; fix: install it"

    def failing_parity(**kw):
        raise MissingToolError(why)

    _workers_that_finish(monkeypatch)
    monkeypatch.setattr(parity_mod, "compute_parity", failing_parity)
    out = tmp_path / "run"
    args = _quick_run_args(out, "all", "none")
    summary = runner.execute(args)
    assert summary["parity_failed"] == why and summary["parity_passed"] is None
    man = json.loads((out / "manifest.json").read_text())
    assert man["parity_failed"] == why and man["parity"] is None
    assert [n for n in man["notes"] if why in n] and why in capsys.readouterr().err
    assert (out / "results.json").is_file()
    problems = load_run(out).problems
    assert [p for p in problems if p.startswith("parity failed") and why in p], problems


def test_a_normalise_defect_keeps_the_captures_and_says_what_failed(tmp_path, monkeypatch, capsys):
    """A parser defect (not a KernelmapError) in normalise after every worker finished: the run directory
    and its captures are kept under --out, the error names the exception and how to redo the step."""

    def defect(run_tmp):
        (Path(run_tmp) / "pytorch" / "bs64").mkdir(parents=True, exist_ok=True)
        (Path(run_tmp) / "pytorch" / "bs64" / "cudnn.log").write_text("a capture\n")
        raise ValueError("invalid literal for int() with base 16: '0xd917110;'")

    _workers_that_finish(monkeypatch)
    monkeypatch.setattr(runner, "_normalise", defect)
    out = tmp_path / "run"
    args = _quick_run_args(out, "pytorch", "libs")
    with pytest.raises(KernelmapError) as err:
        runner.execute(args)
    msg = str(err.value)
    assert msg.startswith(f"{out}: the run is complete but normalising its captures failed: ValueError: invalid "
                          "literal for int() with base 16: '0xd917110;' (a kernelmap defect: traceback above)")
    assert f"rerun `kernelmap normalise {out}`" in msg
    assert "Traceback" in capsys.readouterr().err
    assert (out / "pytorch" / "bs64" / "cudnn.log").read_text() == "a capture\n"
    assert (out / "manifest.json").is_file() and (out / "results.json").is_file()
