"""The GPU's peaks as JAX/XLA reaches them, measured (never from a spec sheet) for the counters pass's roofline.

The same measurement as PyTorch's (frameworks/pytorch/peaks.py), through XLA: per precision one square GEMM
(``jnp.dot`` of two ``GEMM_N`` x ``GEMM_N`` matrices, jitted, at the workload's ``MATMUL_PRECISION`` of each: fp32
``highest``, no TF32; tf32 ``tensorfloat32``, TF32 where XLA's GPU backend runs it; bf16 and fp16
at XLA's default) and one device-to-device copy (``jnp.copy`` of ``COPY_BYTES``, jitted: an HLO ``copy``, read +
write = 2x its size), each ``REPEATS`` times after ``WARMUP`` untimed runs (the first compiles). Timed on the host:
``time.perf_counter`` around the jitted call and ``block_until_ready``, not CUDA events (JAX has none to offer): each
time holds the call's dispatch (tens of microseconds), so a rate is at most that much low. The figure is the median
run's rate, the fastest run's beside it, in the shape PyTorch's ``measure`` returns (the report reads either).

Each program is compiled with XLA's autotuning off (``xla_gpu_autotune_level=0``) and its GEMMs given to cuBLAS, not
Triton (``xla_gpu_enable_triton_gemm=False``): cuBLAS's heuristic, as ``torch.mm`` takes it. With autotuning off
alone the bf16 and fp16 GEMMs ran 10.4 TFLOP/s on an H200 (session 13), below fp32's 26.7 (the report rejects such a
roof: ``roofline.not_a_roof``); the likely cause, not read there, is Triton's untuned default tiles (XLA gives GEMMs
to Triton by default); the cuBLAS route has not yet run on a GPU. Autotuning stays off: the counters pass runs under
ncu, where XLA's autotuner once died ("Delay kernel timed out", then SIGSEGV: docs/COUNTERS.md), and a dying worker
would lose the case. An autotuned step kernel may therefore run above these roofs. Where the process holds TF32 off (``NVIDIA_TF32_OVERRIDE=0``: any ``--math``
but tf32) the tf32 GEMM is not measured and says why: cuBLAS and cuDNN then never use TF32 whatever XLA asks, while
a GEMM XLA gives to Triton would, so its math would be the backend's choice, not tf32's.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp

from kernelmap.errors import KernelmapError

from .. import spec
from ..peakrate import host_times_ms, rate

GEMM_N = 8192
COPY_BYTES = 1 << 30
WARMUP, REPEATS = 3, 10
DTYPES = {spec.Math.FP32: jnp.float32, spec.Math.TF32: jnp.float32, spec.Math.BF16: jnp.bfloat16,
          spec.Math.FP16: jnp.float16}
# each program's compile options: no autotuning, and no Triton GEMM (docstring)
DEFAULT_ALGORITHMS = {"xla_gpu_autotune_level": 0, "xla_gpu_enable_triton_gemm": False}
TF32_HELD_OFF = (f"{spec.TF32_OVERRIDE}=0 in this process (the run's math is not tf32): cuBLAS and cuDNN never use "
                 "TF32 whatever XLA asks, a Triton GEMM would: a tf32 GEMM's math would be the backend's choice")


def method(precisions: dict[spec.Math, str], n: int = GEMM_N, nbytes: int = COPY_BYTES, warmup: int = WARMUP,
           repeats: int = REPEATS) -> str:
    return (f"median of {repeats} host-timed runs (time.perf_counter around the jitted call and block_until_ready, "
            f"not CUDA events: each time holds the call's dispatch) after {warmup} warm-up runs: jnp.dot of two "
            f"{n}x{n} matrices per precision (2*n^3 FLOPs; fp32 at precision {precisions[spec.Math.FP32]}, "
            f"tf32 at {precisions[spec.Math.TF32]}), jnp.copy of {nbytes / 2**20:g} MiB (2x its bytes moved); "
            "XLA's default algorithms (xla_gpu_autotune_level=0 for these programs: none autotuned)")


def _compiled(fn, *args):
    return jax.jit(fn).lower(*args).compile(compiler_options=DEFAULT_ALGORITHMS)


def _gemm(device, math: spec.Math, precision: str, n: int, warmup: int, repeats: int) -> dict[str, Any]:
    if math is spec.Math.TF32 and os.environ.get(spec.TF32_OVERRIDE) == "0":
        return {"not_measured": TF32_HELD_OFF}
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.device_put(jax.random.normal(ka, (n, n), DTYPES[math]), device)  # committed: the programs run there
    b = jax.device_put(jax.random.normal(kb, (n, n), DTYPES[math]), device)
    compiled = _compiled(lambda x, y: jnp.dot(x, y, precision=precision), a, b)
    ms = host_times_ms(lambda: compiled(a, b).block_until_ready(), warmup, repeats)
    return {**rate(2.0 * n**3, ms, "flops_per_s"), "n": n}


def measure_on(device, precisions: dict[spec.Math, str], gemm_n: int = GEMM_N, copy_bytes: int = COPY_BYTES,
               warmup: int = WARMUP, repeats: int = REPEATS) -> dict[str, Any]:
    """The measurement on any JAX device at any sizes, no GPU check (``measure`` is the counters pass's; the CPU
    tests call this one, small), each GEMM at ``precisions[math]`` (the workload's ``MATMUL_PRECISION``):
    {"gemm": {precision: {"flops_per_s", "flops_per_s_best", "ms_median", "ms", "n"} or {"not_measured": why}},
    "dram": {"bytes_per_s", "bytes_per_s_best", "ms_median", "ms", "bytes"}, "method", "gpu"} (``gpu``: the device's
    kind)."""
    with jax.default_device(device):  # the random keys and the copy's source made there too
        gemm = {math.value: _gemm(device, math, precisions[math], gemm_n, warmup, repeats) for math in DTYPES}
        src = jax.device_put(jnp.zeros(copy_bytes, jnp.uint8), device)
    copy = _compiled(jnp.copy, src)
    ms = host_times_ms(lambda: copy(src).block_until_ready(), warmup, repeats)
    dram = {**rate(2.0 * copy_bytes, ms, "bytes_per_s"), "bytes": copy_bytes}
    return {"gemm": gemm, "dram": dram, "method": method(precisions, gemm_n, copy_bytes, warmup, repeats),
            "gpu": device.device_kind}


def measure(device, precisions: dict[spec.Math, str]) -> dict[str, Any]:
    """The GPU's peaks through XLA at the full sizes (the counters pass, after its window closed), each GEMM at
    ``precisions[math]`` (the workload's ``MATMUL_PRECISION``, passed in: this module imports no workload)."""
    if device.platform != "gpu":
        raise KernelmapError(f"peaks: {device} is no GPU (the roofline's peaks are the GPU's)")
    return measure_on(device, precisions)
