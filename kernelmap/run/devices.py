"""Where each framework of a run works, and the environment its workers get.

Decided before any worker starts: each framework's device (``decide_device``: its descriptor's GPU
verdict against the probe), its workers' environment (``worker_environ``: thread settings, its own
tree, the math mode's rule), the library logs of the libs pass (``libs_env``) and whether an nsys
pass can record anything here (``nsys_skips``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import doctor, frameworks, gpuinfo, heap, timing
from ..commlink import NCCL_LOG, NCCL_LOG_ENV
from ..frameworks.registry import NsysWindow
from ..frameworks.spec import Math


@dataclass(frozen=True)
class Decision:
    framework: str
    requested: str  # auto | cpu | gpu
    device: str | None  # cpu | gpu; None = this framework does not run
    note: str | None  # why the device differs from the request (or why it is skipped)
    explicit: bool = False  # skipped because --device gpu cannot be met

    def to_manifest(self) -> dict[str, Any]:
        return {"device_requested": self.requested, "device": self.device, "device_note": self.note}


def parse_cc(cc: str | None) -> tuple[int, int] | None:
    if not cc:
        return None
    major, minor = cc.split(".")
    return int(major), int(minor)


def decide_device(framework: str, requested: str, probe: dict[str, Any], compute_capability: str | None,
                  gpu_problem: str | None = None) -> Decision:
    """Where ``framework`` runs, given what its probe found and the GPU's compute capability: the
    framework's own ``gpu_verdict`` (frameworks/<name>/descriptor.py) decides whether it can use the GPU."""
    if not probe.get("installed"):
        return Decision(framework, requested, None, f"{framework} is not installed ({probe.get('error')}); "
                        f"fix: {probe.get('fix')}")
    if requested == "cpu":
        return Decision(framework, requested, "cpu", None)
    v = frameworks.get(framework).gpu_verdict(probe, parse_cc(compute_capability), gpu_problem)
    if v.usable:
        return Decision(framework, requested, "gpu", None)
    if v.cpu_regardless:  # no code for this GPU at all: the CPU, labelled, whatever was asked
        return Decision(framework, requested, "cpu", v.why)
    if requested == "auto":
        return Decision(framework, requested, "cpu", f"{v.why}; running on the CPU")
    return Decision(framework, requested, None, f"--device gpu: {v.why}; fix: {v.fix}", explicit=True)


def libs_env(device: str, log_dir: Path, framework: str = frameworks.REFERENCE,
             worker_env: dict[str, str] | None = None, devices: int = 1) -> dict[str, str]:
    """Environment that makes the math libraries log their calls into ``log_dir``; the framework's
    descriptor names its cuDNN's log variable (MXNet's cuDNN 8 wheel logs under the older one). On several GPUs
    NCCL logs each collective and its algorithm and protocol too (``commlink.NCCL_LOG_ENV``; each rank its own
    file: ``dataparallel.rank_paths``)."""
    if device == "gpu":
        nccl = ({**NCCL_LOG_ENV, "NCCL_DEBUG_FILE": str(log_dir / NCCL_LOG)} if devices > 1 else {})
        return {
            **nccl,
            **frameworks.get(framework).cudnn_log_env(worker_env),
            "CUDNN_LOGDEST_DBG": str(log_dir / "cudnn.log"),
            "CUBLAS_LOGINFO_DBG": "1",
            "CUBLAS_LOGDEST_DBG": str(log_dir / "cublas.log"),
            "CUBLASLT_LOG_LEVEL": "5",  # API trace
            "CUBLASLT_LOG_FILE": str(log_dir / "cublaslt.log"),
        }
    # oneDNN (PyTorch's and MXNet's MKL-DNN) print verbose lines on stdout: captured to onednn.log.
    # oneMKL (torch's CPU BLAS: linear's sgemm) writes its own verbose lines to blas.log.
    return {"DNNL_VERBOSE": "1", "ONEDNN_VERBOSE": "1", "MKLDNN_VERBOSE": "1",
            "MKL_VERBOSE": "1", "MKL_VERBOSE_OUTPUT_FILE": str(log_dir / "blas.log")}


def nsys_skip_reason(nsys: str | None, device: str, window: NsysWindow | None, label: str) -> str | None:
    """Why the nsys pass cannot record anything here, or None where it runs. On the CPU that is the
    reason whether or not nsys is installed (installing it would not change it)."""
    if device != "gpu":
        return "the CPU run launches no CUDA work for nsys to record"
    if nsys is None:
        return f"nsys not found; {doctor.FIX['nsys']}"
    if window is None:
        return f"{label}'s workload opens no nsys capture window (cudaProfilerStart/Stop or an NVTX range)"
    return None


def worker_own_env(framework: str, device: str) -> dict[str, str]:
    """The environment a framework's workers add on the GPU: its own (an MXNet built for this GPU: its
    tree first on PYTHONPATH), set before the framework loads its libraries; {} on the CPU."""
    if device != "gpu":
        return {}
    return frameworks.get(framework).own_env()


def worker_environ(device: str, math: str, *layers: Mapping[str, str]) -> dict[str, str]:
    """A worker's whole environment: this process's, then ``layers`` in order; on the GPU the math
    mode's rule last (``spec.Math.apply``: fp32 sets NVIDIA_TF32_OVERRIDE=0, tf32 removes one inherited
    from here). The CPU has no TF32: its environment keeps what it inherits."""
    env = dict(os.environ)
    for layer in layers:
        env.update(layer)
    return Math(math).apply(env) if device == "gpu" else env


def nsys_skips(decisions: dict[str, Decision], nsys: str | None) -> dict[str, str]:
    """Why the nsys pass of each framework that runs records nothing here ({framework: reason}; a
    framework whose nsys pass runs is left out)."""
    out = {}
    for fw, d in decisions.items():
        if d.device is None:
            continue
        descriptor = frameworks.get(fw)
        why = nsys_skip_reason(nsys, d.device, descriptor.nsys_window(worker_own_env(fw, d.device)),
                               descriptor.label)
        if why is not None:
            out[fw] = why
    return out


def said_once(skips: dict[str, str], what: str) -> list[str]:
    """One line per distinct reason of ``skips`` ({framework: reason}), naming the frameworks it
    holds for: a reason every framework shares (no GPU) is said once, not per framework x batch size."""
    by_reason: dict[str, list[str]] = {}
    for fw, why in skips.items():
        by_reason.setdefault(why, []).append(fw)
    return [f"{what} ({', '.join(fws)}): {why}" for why, fws in by_reason.items()]


def physical_cores() -> int:
    """Physical CPU cores of this machine (distinct physical id x core id in /proc/cpuinfo), else
    the logical count: the default thread setting of every framework."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return os.cpu_count() or 1
    cores, phys = set(), "0"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "physical id":
            phys = value.strip()
        elif key == "core id":
            cores.add((phys, value.strip()))
    return len(cores) or os.cpu_count() or 1


def thread_env(threads: int) -> dict[str, str]:
    """The same CPU thread settings for every framework's worker; OpenMP threads sleep while they wait
    (``timing.WAIT_ENV``), so that CPU time counts work, not spinning for a sibling a neighbour preempted; glibc
    malloc keeps what the worker frees (``timing.ALLOC_ENV``), so that no step pays for faulting in fresh pages
    that an earlier one gave back, by an allocation history that differs from process to process."""
    return {**{k: str(threads) for k in timing.THREAD_ENV}, **timing.WAIT_ENV, **timing.ALLOC_ENV}


# mallopt's parameters (glibc's malloc.h) for timing.ALLOC_ENV's variables
MALLOPT_PARAMS = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_TOP_PAD_": -2, "MALLOC_MMAP_THRESHOLD_": -3}


def keep_freed_memory(environ: Mapping[str, str] = os.environ) -> dict[str, int]:
    """``timing.ALLOC_ENV`` applied to this running process with glibc's mallopt (its variables are read only at
    a process's start): what the step benchmarks' pytest process does before a framework loads. A variable set in
    ``environ`` was applied by glibc at start and is left; returns what was set ({} without glibc's mallopt)."""
    import ctypes
    import ctypes.util

    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return {}
    done = {}
    for name, value in timing.ALLOC_ENV.items():
        if name not in environ and mallopt(MALLOPT_PARAMS[name], int(value)) == 1:
            done[name] = int(value)
    threshold = timing.MMAP_THRESHOLD_ENV
    if (environ.get(threshold) == timing.ALLOC_ENV[threshold] or threshold in done) and heap.set_mmap_threshold(
            timing.MMAP_THRESHOLD_RAISED):  # as every worker raises it (timing.MMAP_THRESHOLD_RAISED)
        done[threshold] = timing.MMAP_THRESHOLD_RAISED
    return done


def malloc_settings(applied: Mapping[str, int], environ: Mapping[str, str] = os.environ) -> dict[str, str | None]:
    """The glibc malloc settings of ``timing.ALLOC_ENV`` this process runs with: each the one ``keep_freed_memory``
    applied (``applied``: the mmap threshold raised to ``timing.MMAP_THRESHOLD_RAISED`` where glibc took it), else
    its value in ``environ`` (glibc read it at start), else None (glibc's default: its mmap threshold then moves
    with what the process frees)."""
    return {name: str(applied[name]) if name in applied else environ.get(name) for name in timing.ALLOC_ENV}


def decide_devices(chosen: list[str], device: str, python: dict[str, str],
                   gpus: gpuinfo.GpuReport) -> dict[str, Decision]:
    """Each framework's device, decided before any work, every downgrade said on stderr."""
    cc = gpus.gpus[0].compute_capability if gpus.gpus else None
    decisions: dict[str, Decision] = {}
    no_gpu_said = False
    for fw in chosen:
        # Only a GPU question needs the framework imported (in a subprocess); the CPU needs it installed.
        probe = (doctor.find_framework(fw, python) if device == "cpu"
                 else doctor.probe_framework(fw, python=python))
        d = decide_device(fw, device, probe, cc, gpus.problem)
        decisions[fw] = d
        if d.device is None:
            print(f"kernelmap run: {fw} will not run: {d.note}", file=sys.stderr)
        elif d.note and not gpus.gpus and d.device == "cpu" and device == "auto":
            if not no_gpu_said:  # the same reason for every framework: said once
                print(f"kernelmap run: no NVIDIA GPU here ({gpus.problem}): every framework runs on the CPU",
                      file=sys.stderr)
                no_gpu_said = True
        elif d.note:
            print(f"kernelmap run: {fw} runs on the {d.device.upper()}: {d.note}", file=sys.stderr)
    return decisions


