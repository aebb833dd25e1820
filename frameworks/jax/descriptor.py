"""JAX as kernelmap sees it (no jax import here)."""

from __future__ import annotations

from ..dataparallel import DataParallel
from ..registry import Framework, GpuVerdict, no_gpu

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


DESCRIPTOR = Framework(
    name="jax", label="JAX", color="#2b8a3e", import_names=("jax", "flax", "optax"), install_fix=INSTALL_FIX,
    probe=PROBE, gpu_verdict=gpu_verdict, trace_source="xla_trace", modes=("jit",),
    # XLA autotunes convolutions and GEMMs at compile time by running candidates through cuDNN and
    # cuBLASLt: with autotuning on, the library logs hold hundreds of trial calls (143 MB for 8 steps).
    # The libs pass turns it off, so its calls are the default algorithms, not necessarily the traced ones.
    pass_env={"libs": {"XLA_FLAGS": "--xla_gpu_autotune_level=0"}},
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
