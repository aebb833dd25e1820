"""JAX as kernelmap sees it (no jax import here)."""

from __future__ import annotations

import os

from ..dataparallel import DataParallel
from ..registry import CLEAN_PASS, COUNTERS_PASS, Framework, GpuVerdict, no_gpu

INSTALL_FIX = ("pip install 'jax[cpu]' flax optax (CPU) or 'jax[cuda13]' flax optax (NVIDIA GPU), in an environment "
               "with numpy >= 2; point kernelmap at it with --python jax=PATH or KERNELMAP_PYTHON_JAX")

HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count"  # N CPU devices, read when jax starts

PROBE = r"""
import json, jax, flax, optax
devs = jax.devices()
gpus = [d for d in devs if d.platform == "gpu"]
d = {"version": jax.__version__, "flax": flax.__version__, "optax": optax.__version__,
     "backend": jax.default_backend(), "cuda_build": bool(gpus), "cuda_available": bool(gpus),
     "devices": [{"index": d.id, "name": d.device_kind} for d in gpus]}
print(json.dumps(d))
"""


def gpu_verdict(probe: dict, cc: tuple[int, int] | None, gpu_problem: str | None) -> GpuVerdict:
    if probe.get("cuda_available"):
        return GpuVerdict(True)
    if cc is None:
        return no_gpu(gpu_problem)
    return GpuVerdict(False, f"jax {probe.get('version')} sees no GPU (backend {probe.get('backend')})",
                      "install jax[cuda13] (or the CUDA build matching the driver)")


# XLA's autotuning results (the algorithm of each convolution, GEMM and fusion), shared by a case's processes
AUTOTUNE_DUMP = "--xla_gpu_dump_autotune_results_to"
AUTOTUNE_LOAD = "--xla_gpu_load_autotune_results_from"
AUTOTUNE_SUFFIX = ".textproto"  # XLA writes and reads a text proto where the name ends so


NO_AUTOTUNE = "--xla_gpu_autotune_level=0"  # XLA's default algorithms, none measured (the libs pass's too)


def algorithms_file(path: str) -> str:
    """Where a case's XLA autotuning results are (``path`` with XLA's text-proto suffix)."""
    return os.path.splitext(path)[0] + AUTOTUNE_SUFFIX


def shared_algorithms_env(path: str, env: dict[str, str] | None, pass_name: str | None = None) -> dict[str, str]:
    """XLA autotunes each convolution, GEMM and fusion when a process compiles the step: a clean trial of the case
    (``CLEAN_PASS``; the first that runs) writes the results it chose beside ``path`` (``algorithms.textproto``),
    every later process reads them and measures nothing (XLA's cache: a result it holds is used, one it lacks is
    still autotuned). Only a clean trial writes them: where the file is not there (the first clean trial failed
    before it compiled), the framework and nsys passes autotune on their own and write nothing, and the counters
    pass (``COUNTERS_PASS``) autotunes nothing (``NO_AUTOTUNE``: XLA's default algorithms; ``algorithms_note``
    says so): on the 2x H200 XLA's autotuner under ncu printed "Delay kernel timed out" (its timer's delay kernel
    outlasted by launches slowed by ncu) and the process died of SIGSEGV before the window opened
    (docs/COUNTERS.md). Every timing pass after the first clean trial runs the algorithms that trial chose. The
    libs pass's own ``XLA_FLAGS`` (``pass_env``) replace these: it does not autotune at all. An inherited
    ``XLA_FLAGS`` is kept."""
    file = algorithms_file(path)
    if os.path.isfile(file):
        flag = f"{AUTOTUNE_LOAD}={file}"
    elif pass_name == CLEAN_PASS:
        flag = f"{AUTOTUNE_DUMP}={file}"
    elif pass_name == COUNTERS_PASS:
        flag = NO_AUTOTUNE
    else:
        flag = ""
    inherited = os.environ.get("XLA_FLAGS", "").strip()
    return {"XLA_FLAGS": f"{inherited} {flag}".strip()} if flag or inherited else {}


def algorithms_note(path: str, pass_name: str) -> str | None:
    """The counters pass's note where no clean trial wrote the case's autotuning results (``shared_algorithms_env``):
    it ran XLA's default algorithms, not the timing passes' autotuned ones; None where it read them."""
    file = algorithms_file(path)
    if pass_name != COUNTERS_PASS or os.path.isfile(file):
        return None
    return (f"no clean trial wrote the case's XLA autotuning results ({os.path.basename(file)}): the counters pass "
            f"autotuned nothing under ncu ({NO_AUTOTUNE}) and ran XLA's default algorithms, which may not be the "
            "traced step's (a kernel of another algorithm is left unpaired)")


DESCRIPTOR = Framework(
    name="jax", label="JAX", color="#2b8a3e", import_names=("jax", "flax", "optax"), install_fix=INSTALL_FIX,
    probe=PROBE, gpu_verdict=gpu_verdict, trace_source="xla_trace", modes=("jit",),
    # XLA autotunes convolutions and GEMMs at compile time by running candidates through cuDNN and
    # cuBLASLt: with autotuning on, the library logs hold hundreds of trial calls (143 MB for 8 steps).
    # The libs pass turns it off, so its calls are the default algorithms, not necessarily the traced ones.
    pass_env={"libs": {"XLA_FLAGS": "--xla_gpu_autotune_level=0"},
              # the counters pass: memory taken as needed, not 75% of the GPU at start (ncu's kernel replay saves
              # and restores what each kernel writes; a process ncu leaves behind holds less); the kernels are the
              # compiled program's either way
              "counters": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}},
    shared_algorithms_env=shared_algorithms_env, shared_algorithms_note=algorithms_note,
    cpu_env={"JAX_PLATFORMS": "cpu"},  # jax's CPU backend, even where a CUDA plugin is installed
    # its kernels' hlo_op names the custom call (__cudnn$conv..., __cublas$lt$matmul) that launched them
    library_calls_in_trace=True, trace_ops_are_framework_ops=False,
    # N devices in one process: XLA's host platform devices on the CPU (jax/parallel.py), the GPUs on the GPU
    data_parallel=DataParallel(processes=False, cpu="XLA all-reduce over host platform devices",
                               gpu=("XLA all-reduce (NCCL)",), modes=("jit",),
                               env=lambda n, device: {"XLA_FLAGS": f"{HOST_DEVICES_FLAG}={n}"} if device == "cpu" else {}),
    # every math on both devices; on the CPU XLA computes bf16/fp16 convs and dots in fp32 (its workload's
    # versions()['hlo_conv_dot'] counts them; docs/MIXED_PRECISION.md)
    math_refusals={"cpu": {}, "gpu": {}},
    train_memory_factor=3.5,  # two steps at batch 2048 (CPU, jit): peak resident growth 2.95x the forward's values
)
