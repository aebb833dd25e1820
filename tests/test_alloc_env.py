"""glibc malloc keeps what a worker frees (``timing.ALLOC_ENV``, issue 42, docs/timing.md "Memory").

MXNet 1.9 on the CPU allocates every array with posix_memalign and frees it on its engine thread (no pool), so
glibc's dynamic mmap threshold moved with each process's history: on the 2-core VM one MXNet process faulted
10,000-17,000 fresh pages a step at bs 256 (CPU 65-74 ms a step) and the next almost none (46-50 ms), both quiet;
its clean trials ran at two speeds and its clean pass ran slower than its own framework pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from kernelmap import timing
from kernelmap.run import devices

# conv1's output at bs 256, float32: the largest array the model allocates a step on the CPU
LARGEST_ARRAY_BS256 = 256 * 32 * 28 * 28 * 4


def test_every_worker_gets_the_allocator_setting():
    env = devices.thread_env(2)
    assert {k: env[k] for k in timing.ALLOC_ENV} == timing.ALLOC_ENV
    # above the model's largest array, so that none of them is mmapped and unmapped a step
    assert int(timing.ALLOC_ENV["MALLOC_MMAP_THRESHOLD_"]) > LARGEST_ARRAY_BS256
    assert int(timing.ALLOC_ENV["MALLOC_TRIM_THRESHOLD_"]) > int(timing.ALLOC_ENV["MALLOC_MMAP_THRESHOLD_"])


def _keep(env: dict[str, str]) -> dict:
    code = "import json; from kernelmap.run import devices; print(json.dumps(devices.keep_freed_memory()))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env,
                          check=True)
    return json.loads(proc.stdout)


def test_the_benchmarks_process_sets_the_same_with_mallopt():
    """The step benchmarks run in the pytest process, whose start glibc's variables missed: mallopt sets them;
    one the user set is left as glibc read it."""
    env = {k: v for k, v in os.environ.items() if k not in timing.ALLOC_ENV}
    assert _keep(env) == {k: int(v) for k, v in timing.ALLOC_ENV.items()}
    mine = dict(env, MALLOC_TOP_PAD_="0")
    assert _keep(mine) == {k: int(v) for k, v in timing.ALLOC_ENV.items() if k != "MALLOC_TOP_PAD_"}


@pytest.mark.mxnet
def test_mxnet_cpu_steps_fault_in_no_fresh_pages(tmp_path):
    """Two MXNet clean trials at bs 256 (each its own process): every timed block's minor page faults a step
    (``timing.FAULT_SAMPLES``) stay near 0. Under the old environment (no ALLOC_ENV) 5 of 5 such processes faulted
    11,000-14,000 pages a step (a `kernelmap run` of 6 trials, 2026-11-27), and 2 of 14 processes of a script
    timing the same loop ran without."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "kernelmap.cli", "run", "--framework", "mxnet", "--device", "cpu", "--profile", "none",
         "--batch-size", "256", "--steps", "20", "--warmup", "5", "--trials", "2", "--max-repeats", "0",
         "--data", "synthetic", "--out", str(out), "--json"],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for trial in (1, 2):
        result = json.loads((out / "mxnet" / "bs256" / f"clean-{trial}.json").read_text())
        assert {k: result["threads"]["env"][k] for k in timing.ALLOC_ENV} == timing.ALLOC_ENV
        faults = result[timing.FAULT_SAMPLES]
        assert len(faults) == len(result["step_times_s"]) == 2
        # a step's arrays are ~100 MB; 100 pages (400 KiB) a step is far below one array faulted in again
        assert float(np.median(faults)) < 100, (trial, faults)
