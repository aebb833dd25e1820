"""The GPU's peaks as MXNet reaches them, measured (never from a spec sheet) for the counters pass's roofline.

The same measurement as PyTorch's and JAX's (frameworks/{pytorch,jax}/peaks.py), through MXNet 1.9's operators: per
precision one square GEMM of two ``GEMM_N`` x ``GEMM_N`` matrices and one device-to-device copy
(``NDArray.copyto`` of ``COPY_BYTES`` into a second array on the same GPU: read + write = 2x its size), each
``REPEATS`` times after ``WARMUP`` untimed runs, host-timed (``time.perf_counter`` around the call and its
``wait_to_read``: MXNet's engine offers no device events; each time holds the engine's dispatch).

Which operator and what it computes, per precision (MXNet 1.9.1's sources): ``FullyConnected`` (``no_bias``, an
``GEMM_N`` x ``GEMM_N`` weight: out = data x weight^T, 2*n^3 FLOPs), the operator of the workload's own fc layers and
one the sm_90 tree builds GPU kernels for (nn/fully_connected.cu; ``linalg_gemm2`` and ``dot``, used here before,
are not in ``build.GPU_OPERATOR_SOURCES``: on an H200, session 13, the measurement died at its operands, ``Operator
_random_normal is not implemented for GPU``). The operands are made on the host (numpy) and copied to the GPU.

- fp32 and tf32: float32 ``FullyConnected``: ``linalg_gemm`` (src/operator/linalg_impl.h): cuBLAS with the handle set
  to ``CUBLAS_TF32_TENSOR_OP_MATH`` on CUDA >= 11. MXNet has no switch of its own: TF32 is held off only by
  ``NVIDIA_TF32_OVERRIDE=0`` (``spec.Math``). So where the variable is 0 (any ``--math`` but tf32) the GEMM is fp32
  and tf32 is not measured; where it is not, the GEMM is TF32, measured as tf32, and fp32 is not measured.
- fp16: float16 ``FullyConnected``: ``linalg_gemm<gpu, half_t>`` (cuBLAS ``cublasSgemmEx``/``cublasGemmEx``, float16
  in and out, tensor cores by cuBLAS's default math), the fc layers' GEMM at fp16 (AMP lists FullyConnected as fp16).
  MXNet's CPU has no float16 FullyConnected (its tests skip it).
- bf16: not measured: MXNet's CUDA operators have no bfloat16 type (its descriptor's refusal).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

from kernelmap.errors import KernelmapError

from .. import spec
from ..peakrate import host_times_ms, rate
from .descriptor import MATH_REFUSALS
from .loaded import mx  # mxnet after its libraries (loaded.py)

GEMM_N = 8192
COPY_BYTES = 1 << 30
WARMUP, REPEATS = 3, 10
TF32_HELD_OFF = (f"{spec.TF32_OVERRIDE}=0 in this process (the run's math is not tf32): cuBLAS never uses TF32, "
                 "so a tf32 GEMM would run fp32")
NO_TF32_SWITCH = (f"MXNet has no TF32 switch and {spec.TF32_OVERRIDE}=0 is not set in this process (a tf32 case): "
                  "its float32 GEMM (FullyConnected: linalg_gemm, cuBLAS in TF32 math mode) runs TF32, measured as tf32")
DTYPES = {spec.Math.FP32: "float32", spec.Math.TF32: "float32", spec.Math.FP16: "float16"}


def method(n: int = GEMM_N, nbytes: int = COPY_BYTES, warmup: int = WARMUP, repeats: int = REPEATS) -> str:
    return (f"median of {repeats} host-timed runs (time.perf_counter around the call and wait_to_read, not CUDA "
            f"events: each time holds MXNet's engine dispatch) after {warmup} warm-up runs: {n}x{n} GEMMs, "
            "mx.nd.FullyConnected (no bias) in float32 (fp32 under NVIDIA_TF32_OVERRIDE=0, else tf32) and float16 "
            f"(2*n^3 FLOPs), operands made on the host; NDArray.copyto of {nbytes / 2**20:g} MiB (2x its bytes moved)")


def _why_not(math: spec.Math, held_off: bool) -> str | None:
    if math is spec.Math.BF16:
        return MATH_REFUSALS["gpu"][math.value]
    if math is (spec.Math.TF32 if held_off else spec.Math.FP32):
        return TF32_HELD_OFF if held_off else NO_TF32_SWITCH
    return None


def _gemm(ctx, math: spec.Math, n: int, warmup: int, repeats: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    a, b = (mx.nd.array(rng.standard_normal((n, n), dtype=np.float32), ctx=ctx, dtype=DTYPES[math]) for _ in range(2))
    ms = host_times_ms(lambda: mx.nd.FullyConnected(a, b, num_hidden=n, no_bias=True).wait_to_read(), warmup, repeats)
    return {**rate(2.0 * n**3, ms, "flops_per_s"), "n": n}


def measure_on(ctx, gemm_n: int = GEMM_N, copy_bytes: int = COPY_BYTES, warmup: int = WARMUP, repeats: int = REPEATS,
               skip: dict[str, str] | None = None) -> dict[str, Any]:
    """The measurement in any context at any sizes, no GPU check (``measure`` is the counters pass's; the CPU tests
    call this one, small, with ``skip``: {precision: why} not run, e.g. fp16, which MXNet's CPU has no GEMM for), in
    the shape PyTorch's ``measure`` returns."""
    held_off = os.environ.get(spec.TF32_OVERRIDE) == "0"
    gemm: dict[str, Any] = {}
    for math in (spec.Math.FP32, spec.Math.TF32, spec.Math.BF16, spec.Math.FP16):
        why = (skip or {}).get(math.value) or _why_not(math, held_off)
        gemm[math.value] = {"not_measured": why} if why else _gemm(ctx, math, gemm_n, warmup, repeats)
    src = mx.nd.zeros((copy_bytes,), ctx=ctx, dtype="uint8")
    dst = mx.nd.empty((copy_bytes,), ctx=ctx, dtype="uint8")
    ms = host_times_ms(lambda: src.copyto(dst).wait_to_read(), warmup, repeats)
    dram = {**rate(2.0 * copy_bytes, ms, "bytes_per_s"), "bytes": copy_bytes}
    return {"gemm": gemm, "dram": dram, "method": method(gemm_n, copy_bytes, warmup, repeats), "gpu": gpu_name(ctx)}


def gpu_name(ctx) -> str:
    """The GPU's name as the driver gives it (``cuDeviceGetName``; MXNet has no call for it), or what ``ctx`` is and
    why no name was read."""
    if ctx.device_type != "gpu":
        return str(ctx)
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        dev, buf = ctypes.c_int(), ctypes.create_string_buffer(256)
        codes = (cuda.cuInit(0), cuda.cuDeviceGet(ctypes.byref(dev), ctx.device_id),
                 cuda.cuDeviceGetName(buf, len(buf), dev))
    except OSError as exc:
        return f"{ctx}: name not read ({exc})"
    return buf.value.decode() if not any(codes) else f"{ctx}: name not read (CUresult {codes})"


def measure(ctx) -> dict[str, Any]:
    """The GPU's peaks through MXNet at the full sizes (the counters pass, after its window closed)."""
    if ctx.device_type != "gpu":
        raise KernelmapError(f"peaks: {ctx} is no GPU (the roofline's peaks are the GPU's)")
    return measure_on(ctx)
