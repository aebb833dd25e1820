"""MXNet Gluon as kernelmap sees it (no mxnet import here)."""

from __future__ import annotations

from ..dataparallel import DataParallel
from ..registry import ANY_OP, CUDNN9_LOG, Framework, GpuVerdict, NsysWindow, Option, no_gpu
from . import ops

INSTALL_FIX = ("pip install 'kernelmap[mxnet]' (CPU) or 'kernelmap[mxnet-gpu]' (mxnet-cu112 + CUDA 11 libraries); "
               "needs Python 3.11 and numpy < 1.24; on sm_90 and newer: kernelmap build-mxnet")

IMPERATIVE = "imperative"  # Gluon, op by op
HYBRIDIZED = "hybridized"  # Gluon after ``net.hybridize()``

# issue 39: the KVStore that sums the gradients of N contexts (mxnet/parallel.py), per device kind
KVSTORE_OPTION = "kvstore"
KVSTORES = {"cpu": ("local",), "gpu": ("device", "nccl")}
KVSTORE_DEFAULT = {"cpu": "local", "gpu": "device"}

PROBE = r"""
import json
# mxnet after its libraries: a built tree's (PYTHONPATH names its python/), else the CUDA 11 wheels', if any
from kernelmap.frameworks.mxnet.loaded import BUILT_TREE as tree, PRELOAD as pre, mx
f = mx.runtime.Features()
cuda = f.is_enabled("CUDA")
d = {"version": mx.__version__, "cuda_build": cuda, "cudnn_build": f.is_enabled("CUDNN"),
     "onednn_build": f.is_enabled("MKLDNN"), "num_gpus": mx.context.num_gpus() if cuda else 0,
     "cuda11_preload": pre.describe(), "built_tree": tree, "module": mx.__file__}
d["cuda_available"] = d["num_gpus"] > 0
print(json.dumps(d))
"""

# --math bf16|fp16 (MXNet's AMP), what this MXNet 1.9.1 cannot run, per device. Each seen, on this project's CPU
# (AMD EPYC, avx512_bf16; oneDNN v2.4.4): fp16 on the CPU ran its forward, then its FullyConnected backward
# raised "FP16 gemm on cpu not implemented!" (src/operator/linalg_impl.h); bf16 with oneDNN off
# (MXNET_MKLDNN_ENABLED=0) raised "Unknown type enum 12" (kBfloat16) in the generic operators, whose type
# switch (MSHADOW_REAL_TYPE_SWITCH: float32, float64, float16) the CUDA operators share; bf16 with oneDNN held
# to AVX2 (DNNL_MAX_CPU_ISA=AVX2) raised "could not create a primitive descriptor iterator" in its convolution
# (with AVX512_CORE: jit_bf16:avx512_core, bf16 emulated on AVX-512; with avx512_bf16: jit_bf16:avx512_core_bf16).
BF16_CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq")  # oneDNN 2.x's avx512_core: its least bf16 ISA
MATH_REFUSALS = {  # Framework.math_refusals: {device: {math: why}}
    "cpu": {"fp16": "its CPU operators have no float16 GEMM (1.9.1: AMP's float16 FullyConnected fails in its "
                    "backward, 'FP16 gemm on cpu not implemented!', src/operator/linalg_impl.h); fp16 is its GPU's"},
    "gpu": {"bf16": "it computes bfloat16 only in its oneDNN (CPU) operators; its CUDA operators have no bfloat16 "
                    "type (1.9.1: MSHADOW_REAL_TYPE_SWITCH holds float32, float64, float16); bf16 is its CPU's"},
}


def bf16_cpu_refusal(onednn_build: bool, cpu_flags: frozenset[str] | None) -> str | None:
    """Why this MXNet cannot run bf16 on this CPU, beyond ``MATH_REFUSALS`` (None where it can): an MXNet built
    without oneDNN (``onednn_build``, its probe's), or, where ``cpu_flags`` (/proc/cpuinfo's) are known, a CPU
    without AVX-512 (``BF16_CPU_FLAGS``)."""
    if not onednn_build:
        return ("this MXNet is built without oneDNN (MKLDNN), which holds its only bfloat16 operators; "
                "the mxnet wheel from PyPI has it")
    missing = [f for f in BF16_CPU_FLAGS if cpu_flags is not None and f not in cpu_flags]
    if missing:
        return (f"this CPU lacks {', '.join(missing)}: oneDNN 2.x (MXNet 1.9.1's) has no bfloat16 convolution below "
                "AVX-512 (avx512_core); held to AVX2, its convolution fails to create a primitive")
    return None


def machine_math_refusal(device: str, math: str) -> str | None:
    """``Framework.machine_math_refusal``: bf16 on a CPU without AVX-512 (``BF16_CPU_FLAGS``, read from
    /proc/cpuinfo), known before any worker starts; the workload checks the rest (oneDNN in the build) itself."""
    from ... import gpuinfo

    return bf16_cpu_refusal(True, gpuinfo.cpu_flags()) if (device, math) == ("cpu", "bf16") else None


# MXNet runs backward ops as one ImperativeBulk segment unless bulking is off; the profiler then
# shows no _backward_* operator. Read at `import mxnet`, hence the environment.
# Bulk execution off: the engine then runs (and its profiler and NVTX ranges name) each operator on
# its own. MXNET_EXEC_BULK_EXEC_TRAIN=0 turns it off for imperative backward; a hybridized block's
# CachedOp sets the engine's bulk size from MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN (default 15) whatever
# that says: on the H100 its forward and backward ran as 2 "ImperativeBulk" ranges a step.
PROFILE_ENV = {"MXNET_EXEC_BULK_EXEC_TRAIN": "0", "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN": "0"}


def gpu_verdict(probe: dict, cc: tuple[int, int] | None, gpu_problem: str | None) -> GpuVerdict:
    from .built import gpu_verdict as code_verdict  # framework-free: a built tree, else the cu11x wheel

    if cc is None:
        return no_gpu(gpu_problem)
    ok, message = code_verdict(cc)
    if not ok:  # the wheel has no code for this GPU at all: the CPU, labelled, whatever was asked
        from .built import BUILD_HINT

        return GpuVerdict(False, f"{message} (GPU sm {cc[0]}.{cc[1]})", BUILD_HINT, cpu_regardless=True)
    if not probe.get("cuda_build"):
        return GpuVerdict(False, f"mxnet {probe.get('version')} is the CPU build", INSTALL_FIX)
    if not probe.get("num_gpus"):
        return GpuVerdict(False, "MXNet sees no GPU (mx.context.num_gpus() == 0)",
                          "check the driver and the nvidia-*-cu11 wheels (kernelmap doctor)")
    return GpuVerdict(True)


def worker_env(compute_capability: str | None) -> dict[str, str] | None:
    """The environment that makes a probe or worker import the MXNet built for this GPU by
    ``kernelmap build-mxnet`` (its tree first on PYTHONPATH), or None where there is none."""
    from ... import gpuinfo
    from . import built  # framework-free

    if compute_capability is None:
        gpus = gpuinfo.query()
        compute_capability = gpus.gpus[0].compute_capability if gpus.gpus else None
    tree = built.tree_for_gpu(compute_capability)
    return built.worker_env(tree) if tree is not None else None


def cudnn_log_env(env: dict[str, str] | None) -> dict[str, str]:
    """A built MXNet links cuDNN 9; the cu11x wheel cuDNN 8, which logs under CUDNN_LOGINFO_DBG (cuDNN 9
    only tolerates that as deprecated)."""
    from .built import ENV_TREE

    return dict(CUDNN9_LOG) if env and env.get(ENV_TREE) else {"CUDNN_LOGINFO_DBG": "1"}


def nsys_window(env: dict[str, str] | None) -> NsysWindow | None:
    """Only an MXNet built by build-mxnet (with NVTX) opens a window: its ``kernelmap:capture`` range.
    Not cudaProfilerStart: on the H100 nsys' agent died ("Connection to Agent lost") whenever a capture
    started there mid-run (--trace cuda, nvtx or both, cuDNN autotune on or off), and recorded the whole
    process without fault."""
    from .built import ENV_TREE

    return NsysWindow.NVTX_RANGE if env and env.get(ENV_TREE) else None


# kernelmap's patch 0008 of the built MXNet: its cuDNN convolution algorithms, read from this file where it
# holds the layer's, else chosen (autotuned) and appended to it
ALGO_FILE_ENV = "MXNET_CUDNN_ALGO_FILE"
ALGO_FILE_PATCH = "0008-cudnn-algo-file-shared-by-processes.patch"


def shared_algorithms_env(path: str, env: dict[str, str] | None, pass_name: str | None = None) -> dict[str, str]:
    """Only an MXNet built by build-mxnet with patch 0008 reads and writes the file; the cu11x wheels and
    older built trees choose per process (MXNet's autotune: at bs 1024 on the H200 the libs and nsys
    passes ran different conv2 backward algorithms). Every pass gets the file (``pass_name`` is not read): the
    patch has no read-only mode, so a process that finds a layer missing autotunes it and appends it."""
    from .built import ENV_TREE, tree_patches

    return {ALGO_FILE_ENV: path} if env and ALGO_FILE_PATCH in tree_patches(env.get(ENV_TREE)) else {}


DESCRIPTOR = Framework(
    name="mxnet", label="MXNet", color="#1864ab", import_names=("mxnet",), install_fix=INSTALL_FIX, probe=PROBE,
    gpu_verdict=gpu_verdict, trace_source="mxnet_profiler", modes=(IMPERATIVE, HYBRIDIZED),
    mode_flags={"--hybridize": HYBRIDIZED},
    mode_help={IMPERATIVE: "Gluon op by op", HYBRIDIZED: "Gluon after net.hybridize(): one CachedOp graph a step"},
    # bulk execution off in the framework and nsys passes: their traces and NVTX ranges name each operator
    # (and in the libs pass, which runs under nsys: its kernels are linked to its logged calls in-process)
    pass_env={"framework": PROFILE_ENV, "nsys": PROFILE_ENV, "libs": PROFILE_ENV},
    cudnn_log_env=cudnn_log_env, worker_env=worker_env, nsys_window=nsys_window, libs_under_nsys=True,
    shared_algorithms_env=shared_algorithms_env,
    cpu_library_entry_ops={"oneDNN": ANY_OP, "BLAS": ANY_OP},  # its profiler's operators are flat
    commands={"build-mxnet": ("kernelmap.frameworks.mxnet.build",
                              "build MXNet 1.9.1 for this GPU's architecture (e.g. sm_90), about 16 min on 16 cores")},
    recorded_env=("MXNET_ENGINE_TYPE",),
    train_memory_factor=2.0,  # two steps at batch 2048 (CPU, imperative): peak resident growth 1.49x the forward's values
    vocabulary=ops.VOCABULARY,
    math_refusals=MATH_REFUSALS,  # bf16 on the CPU also needs AVX-512 (machine_math_refusal) and oneDNN (its workload)
    machine_math_refusal=machine_math_refusal,
    data_parallel=DataParallel(processes=False, cpu="KVStore local (N CPU contexts)", gpu=KVSTORES["gpu"],
                               modes=(IMPERATIVE, HYBRIDIZED)),
    options=(Option(KVSTORE_OPTION, tuple(dict.fromkeys(k for ks in KVSTORES.values() for k in ks)),
                    "on --devices N > 1: the KVStore that sums the contexts' gradients (CPU: local; GPU: device, "
                    "the default, or nccl where the build has NCCL)"),),
)
