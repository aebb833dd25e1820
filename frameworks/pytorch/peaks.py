"""The GPU's peaks as PyTorch reaches them, measured (never from a spec sheet) for the counters pass's roofline.

Per precision one square GEMM (``torch.mm``, cuBLAS/cuBLASLt: fp32 with TF32 off, tf32 with it on, bf16, fp16;
n = ``GEMM_N``) and one device-to-device copy (``Tensor.copy_`` of ``COPY_BYTES``: read + write = 2x its size),
each ``REPEATS`` times after ``WARMUP`` untimed runs, timed with CUDA events; the figure is the median run's
rate, the fastest run's beside it. Run by the counters pass after its ncu window closed (ncu profiles none of
these kernels) at the driver's clocks (``--clock-control none``). Where the process holds TF32 off
(``NVIDIA_TF32_OVERRIDE=0``: the run's math is not tf32) the tf32 GEMM would run fp32: it is not measured and
says why.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

import torch

GEMM_N = 8192
COPY_BYTES = 1 << 30
WARMUP, REPEATS = 3, 10
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
METHOD = (f"median of {REPEATS} CUDA-event-timed runs after {WARMUP} warm-up runs: torch.mm of two {GEMM_N}x{GEMM_N} "
          f"matrices per precision (2*n^3 FLOPs), Tensor.copy_ of {COPY_BYTES >> 20} MiB (2x its bytes moved)")


def _times_ms(fn) -> list[float]:
    for _ in range(WARMUP):
        fn()
    out = []
    for _ in range(REPEATS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out


def _rate(work: float, ms: list[float], unit: str) -> dict[str, Any]:
    med = statistics.median(ms)
    return {unit: work / (med / 1e3), f"{unit}_best": work / (min(ms) / 1e3), "ms_median": med, "ms": ms}


def measure(device: torch.device) -> dict[str, Any]:
    """{"gemm": {precision: {"flops_per_s", ...} or {"not_measured": why}}, "dram": {"bytes_per_s", ...},
    "method", "gpu"}."""
    old = torch.backends.cuda.matmul.allow_tf32
    gemm: dict[str, Any] = {}
    try:
        for name, dtype in DTYPES.items():
            if name == "tf32" and os.environ.get("NVIDIA_TF32_OVERRIDE") == "0":
                gemm[name] = {"not_measured": "NVIDIA_TF32_OVERRIDE=0 in this process (the run's math is not tf32): "
                                              "a tf32 GEMM would run in fp32"}
                continue
            torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
            a = torch.randn(GEMM_N, GEMM_N, device=device, dtype=dtype)
            b = torch.randn(GEMM_N, GEMM_N, device=device, dtype=dtype)
            gemm[name] = {**_rate(2.0 * GEMM_N**3, _times_ms(lambda a=a, b=b: torch.mm(a, b)), "flops_per_s"),
                          "n": GEMM_N}
            del a, b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dram = {**_rate(2.0 * COPY_BYTES, _times_ms(lambda s=src, d=dst: d.copy_(s)), "bytes_per_s"),
            "bytes": COPY_BYTES}
    del src, dst
    torch.cuda.empty_cache()
    return {"gemm": gemm, "dram": dram, "method": METHOD, "gpu": torch.cuda.get_device_name(device)}
