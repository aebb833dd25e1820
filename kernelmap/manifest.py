"""``manifest.json`` of a run directory: versions, hardware, git commit, data and the whole config."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import __version__, contention, frameworks, gpuinfo

MANIFEST_VERSION = 1
ENV_KEYS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", *(k for d in frameworks.REGISTRY.values() for k in d.recorded_env),
            "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG")

# Keys every manifest has (tests and readers rely on them).
REQUIRED_KEYS = (
    "manifest_version",
    "kernelmap_version",
    "created_utc",
    "job",
    "git_commit",
    "host",
    "gpu",
    "driver",
    "cuda_driver_version",
    "frameworks",
    "data",
    "config",
)

JOB_ENV = "KERNELMAP_JOB"  # set by `nox -s bench`: the id every run and history entry of one job carries

# Per framework (manifest["frameworks"][name]).
FRAMEWORK_KEYS = ("device_requested", "device", "device_note", "versions")


def git_commit(path: str | Path | None = None) -> dict[str, Any] | None:
    """The commit (and whether the tree is dirty) of the kernelmap checkout, or None outside git."""
    where = Path(path) if path else Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None  # no git binary, or it hung: the commit is unknown
    if head.returncode != 0:
        return None  # not a checkout (an installed wheel)
    status = subprocess.run(
        ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}


def job_id(run_dir: str | Path) -> str:
    """The job a run belongs to: $KERNELMAP_JOB where set, else the run directory's own name."""
    return os.environ.get(JOB_ENV) or Path(run_dir).name


def host_info() -> dict[str, Any]:
    return {
        "hostname": platform.node(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "cpu": gpuinfo.cpu_model(),
        "cpu_count": _cpu_count(),
        # logical CPUs (os.cpu_count): the cores kernelmap.contention counts other processes' CPU against
        "ncpu": contention.NCPU,
        # CPU timings depend on these: OpenMP threads spin-wait badly on a busy machine.
        "load_average_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "env": {k: os.environ.get(k) for k in ENV_KEYS},
    }


def _cpu_count() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()


def build(
    *,
    config: dict[str, Any],
    gpus: gpuinfo.GpuReport,
    frameworks: dict[str, dict[str, Any]],
    data: dict[str, Any] | None,
    job: str | None = None,
) -> dict[str, Any]:
    """Assemble the manifest.

    ``frameworks`` maps name -> {device_requested, device, device_note, versions, ...}; versions
    come from each worker's ``Workload.versions()`` (framework, CUDA, cuDNN, cuBLAS as that
    framework reports them, since PyTorch and MXNet carry different CUDA libraries). ``job``: ``job_id``.
    """
    for name, entry in frameworks.items():
        missing = [k for k in FRAMEWORK_KEYS if k not in entry]
        if missing:
            raise ValueError(f"manifest: framework {name} lacks {missing}")
    first = gpus.gpus[0] if gpus.gpus else None
    return {
        "manifest_version": MANIFEST_VERSION,
        "kernelmap_version": __version__,
        "created_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "job": job,
        "git_commit": git_commit(),
        "host": host_info(),
        "gpu": (
            {"name": first.name, "compute_capability": first.compute_capability, "memory_mib": first.memory_mib,
             "count": len(gpus.gpus)}
            if first
            else None
        ),
        "gpu_problem": gpus.problem,
        "driver": first.driver if first else None,
        "cuda_driver_version": gpus.cuda_driver_version,
        "frameworks": frameworks,
        "data": data,
        "config": config,
    }
