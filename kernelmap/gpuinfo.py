"""Framework-free GPU and host facts: GPU name, compute capability, driver, CPU model.

Read through ``nvidia-smi`` where it is on PATH, else through NVML (``libnvidia-ml.so.1``) with
ctypes. No framework is imported, so the parent process of ``kernelmap run`` and ``kernelmap
doctor`` can decide about devices before any framework (and its CUDA) is loaded.
"""

from __future__ import annotations

import ctypes
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Any

_SMI_FIELDS = "index,name,compute_cap,driver_version,memory.total"


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_capability: str | None  # "9.0"
    driver: str | None
    memory_mib: int | None
    source: str  # nvidia-smi | nvml

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GpuReport:
    gpus: tuple[Gpu, ...]
    source: str | None  # where the facts came from; None when no GPU was found
    problem: str | None  # why no GPU could be listed (no nvidia-smi, NVML error, ...), else None
    cuda_driver_version: str | None  # libcuda's cuDriverGetVersion, "13.0"

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": [g.to_dict() for g in self.gpus],
            "source": self.source,
            "problem": self.problem,
            "cuda_driver_version": self.cuda_driver_version,
        }


def parse_smi_csv(text: str) -> list[Gpu]:
    """Parse ``nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total
    --format=csv,noheader,nounits`` output."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            raise ValueError(f"unexpected nvidia-smi line: {line!r}")
        index, name, cc, driver, mem = parts
        gpus.append(
            Gpu(
                index=int(index),
                name=name,
                compute_capability=None if cc in ("", "[N/A]", "N/A") else cc,
                driver=driver or None,
                memory_mib=int(float(mem)) if mem.replace(".", "").isdigit() else None,
                source="nvidia-smi",
            )
        )
    return gpus


def _from_smi(smi: str) -> list[Gpu]:
    out = subprocess.run(
        [smi, f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if out.returncode != 0:
        last = (out.stderr or out.stdout).strip().splitlines()
        raise RuntimeError(f"nvidia-smi exited {out.returncode}: {last[-1] if last else ''}")
    return parse_smi_csv(out.stdout)


def _from_nvml() -> list[Gpu]:
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    rc = nvml.nvmlInit_v2()
    if rc != 0:
        raise RuntimeError(f"nvmlInit_v2 returned {rc}")
    try:
        buf = ctypes.create_string_buffer(96)
        driver = None
        if nvml.nvmlSystemGetDriverVersion(buf, 96) == 0:
            driver = buf.value.decode()
        count = ctypes.c_uint()
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            raise RuntimeError("nvmlDeviceGetCount_v2 failed")
        gpus = []
        for i in range(count.value):
            handle = ctypes.c_void_p()
            if nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                raise RuntimeError(f"nvmlDeviceGetHandleByIndex_v2({i}) failed")
            name = "unknown"
            if nvml.nvmlDeviceGetName(handle, buf, 96) == 0:
                name = buf.value.decode()
            major, minor = ctypes.c_int(), ctypes.c_int()
            cc = None
            if nvml.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)) == 0:
                cc = f"{major.value}.{minor.value}"
            gpus.append(Gpu(i, name, cc, driver, None, "nvml"))
        return gpus
    finally:
        nvml.nvmlShutdown()


def cuda_driver_version() -> str | None:
    """The CUDA version the installed driver supports (libcuda), e.g. "13.0"; None without libcuda."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    v = ctypes.c_int()
    if cuda.cuDriverGetVersion(ctypes.byref(v)) != 0:
        return None
    return f"{v.value // 1000}.{(v.value % 1000) // 10}"


def query() -> GpuReport:
    """List the GPUs of this machine without importing any framework."""
    problems = []
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            return GpuReport(tuple(_from_smi(smi)), "nvidia-smi", None, cuda_driver_version())
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
            problems.append(f"nvidia-smi: {exc}")
    else:
        problems.append("nvidia-smi not on PATH")
    try:
        gpus = _from_nvml()
        return GpuReport(tuple(gpus), "nvml", None if gpus else "; ".join(problems), cuda_driver_version())
    except (OSError, RuntimeError, AttributeError) as exc:
        problems.append(f"NVML: {exc}")
    return GpuReport((), None, "; ".join(problems), cuda_driver_version())


def cpu_model() -> str:
    """The CPU model name (from /proc/cpuinfo on Linux)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str] | None:
    """The CPU's feature flags (the first ``flags`` line of /proc/cpuinfo: avx2, avx512f, amx_bf16, ...), None where
    they cannot be read (no such file, no such line)."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None
