"""The counters pass (``kernelmap run --profile counters``): one training step under Nsight Compute.

The worker runs its warm-up, then ``STEPS`` timed step inside a profiler window: its framework's own
cudaProfilerStart/Stop (the window its nsys pass uses, ``registry.NsysWindow.PROFILER_API``: PyTorch), else the
driver's ``cuProfilerStart``/``cuProfilerStop`` on the primary context (``kernelmap/cudaprofiler.py``: JAX, MXNet;
not yet run on a GPU). ``ncu --profile-from-start off`` profiles exactly the kernels launched in it, on every thread (an NVTX push/pop filter would see only the launching thread's ranges:
the committed probe capture missed PyTorch's whole backward, which runs on its autograd thread;
tests/data/ncu/README.md). One metric set (``adapters.ncu.PASS_METRICS``), clocks left as the driver sets them
(``--clock-control none``: ncu's default locks the SM clock to base, ~1.4 GHz on the H200 against 1.98 GHz
boost, and the roofline's peaks are measured at the driver's clocks), caches flushed before each replay pass
(``--cache-control all``, ncu's default: DRAM bytes of a cold cache). The report goes to
``RUN_DIR/<case>/bs<N>/counters/`` (``ncu.ncu-rep`` for the GUI, ``ncu.csv`` its raw page, ``ncu.log`` ncu's own
messages): a folder, so that ``normalise`` never reads it as records; ``reports/analyses/roofline.py`` reads it.

Refused per case, with the reason in results.json (``counters.skipped``) and a note: on the CPU, without ncu, on
more than one device. A failure of ncu (no permission to the
counters, ``ERR_NVGPUCTRPERM``; a kernel it cannot replay) is recorded the same way with ncu's own ``==ERROR==``
lines; it never drops the case.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .. import doctor
from ..adapters import ncu as ncu_csv
from ..frameworks.registry import COUNTERS_PASS

COUNTERS = COUNTERS_PASS  # the pass's name (worker --pass, results.json entry field; frameworks read it too)
DIR = "counters"  # its folder in the case's folder
STEPS = 1  # one training step: the budget is 60 s per framework and case, and ncu replays each kernel
REPORT, CSV, LOG = "ncu.ncu-rep", "ncu.csv", "ncu.log"
# the worker's environment under ncu (beside its framework's ``pass_env["counters"]``): a crash of the process
# (JAX under ncu on the 2x H200: SIGSEGV, nothing else said) prints its Python stack in the worker's log
ENV = {"PYTHONFAULTHANDLER": "1"}
FLAGS = ("--profile-from-start", "off", "--clock-control", "none", "--cache-control", "all",
         "--replay-mode", "kernel", "--nvtx")


def skip_reason(device: str, ncu: str | None, devices: int = 1) -> str | None:
    """Why the counters pass of a case cannot run here, or None. On the CPU that is the reason whether or not
    ncu is installed."""
    if device != "gpu":
        return "Nsight Compute reads an NVIDIA GPU's counters; this case runs on the CPU"
    if ncu is None:
        return f"ncu not found; {doctor.FIX['ncu']}"
    if devices != 1:
        return f"the counters pass counts one device's step; this case trains on {devices}"
    return None


def commands(ncu: str, out_dir: Path, worker_cmd: list[str]) -> tuple[list[str], list[str]]:
    """(profile, import) commands: the worker under ncu into ``out_dir/ncu.ncu-rep``, then its raw page as CSV
    in base units (the import's stdout is ``out_dir/ncu.csv``)."""
    profile = [ncu, *FLAGS, "--metrics", ",".join(ncu_csv.PASS_METRICS), "--export", str(out_dir / "ncu"),
               "--force-overwrite", "--log-file", str(out_dir / LOG), *worker_cmd]
    imported = [ncu, "--import", str(out_dir / REPORT), "--csv", "--page", "raw", "--print-units", "base",
                "--print-kernel-base", "demangled"]  # whole names, as the probe's: the join reads their templates
    return profile, imported


def failure(out_dir: Path, exc: Exception) -> str:
    """The reason a counters pass recorded nothing: the worker's error (the process run is ncu, its target inside:
    an exit code is ncu's), how far ncu got by its log (connected to its target; kernels profiled) and its
    ``==ERROR==`` lines. The 4x H200 JAX fp32 case: "worker exited 139" where ncu's log ended at "Connected to
    process", no kernel profiled, and the JAX process outlived it: ncu itself died."""
    log = out_dir / LOG
    text = log.read_text(errors="replace") if log.is_file() else ""
    said = ncu_csv.messages(text)
    lines = text.splitlines()
    got = ""
    if any(line.startswith(CONNECTED) for line in lines):
        n = sum(1 for line in lines if line.startswith(PROFILING))
        got = (f"; ncu's log: connected to its target, {n} kernel(s) profiled"
               + ("" if any(line.startswith(DISCONNECTED) for line in lines) else ", never disconnected"))
    return f"ncu failed: {exc}{got}" + (f" (ncu said: {' | '.join(said[:5])})" if said else "")


# ncu's log lines: attached to its target, each kernel it profiled, the target's end
CONNECTED, PROFILING, DISCONNECTED = "==PROF== Connected to process", "==PROF== Profiling ", "==PROF== Disconnected"


def summary(result: dict[str, Any], out_dir: Path, rel: Path, ncu_wall_s: float) -> dict[str, Any]:
    """The results.json ``counters`` field of a case whose counters pass ran: its step, where the CSV is, the
    wall time under ncu (the issue's budget), ncu's messages and the peaks the worker measured."""
    log = out_dir / LOG
    return {"steps": result.get("steps"), "warmup_steps": result.get("warmup_steps"),
            "csv": str(rel / DIR / CSV), "report": str(rel / DIR / REPORT), "ncu_wall_s": ncu_wall_s,
            "metrics": list(ncu_csv.PASS_METRICS), "flags": list(FLAGS),
            "profiler_messages": ncu_csv.messages(log.read_text(errors="replace")) if log.is_file() else [],
            "peaks": result.get("peaks")}


def find_ncu() -> str | None:
    return doctor.find_tool("ncu")


class Clock:
    """Wall seconds of the profiled worker (the issue's budget: 60 s per framework and case)."""

    def __enter__(self) -> Clock:
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.monotonic() - self.t0
