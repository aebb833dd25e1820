"""MXNet Gluon as kernelmap sees it (no mxnet import here)."""

from __future__ import annotations

from ..registry import Framework, GpuVerdict, no_gpu

INSTALL_FIX = ("pip install 'kernelmap[mxnet]' (CPU) or 'kernelmap[mxnet-gpu]' (mxnet-cu112 + CUDA 11 libraries); "
               "needs Python 3.11 and numpy < 1.24")

PROBE = r"""
import json
from kernelmap.frameworks.mxnet import cuda11
pre = cuda11.preload()  # the CUDA 11 wheels of mxnet-cu112; a no-op without them
import mxnet as mx
f = mx.runtime.Features()
cuda = f.is_enabled("CUDA")
d = {"version": mx.__version__, "cuda_build": cuda, "cudnn_build": f.is_enabled("CUDNN"),
     "onednn_build": f.is_enabled("MKLDNN"), "num_gpus": mx.context.num_gpus() if cuda else 0,
     "cuda11_preload": pre.describe()}
d["cuda_available"] = d["num_gpus"] > 0
print(json.dumps(d))
"""

# MXNet runs backward ops as one ImperativeBulk segment unless bulking is off; the profiler then
# shows no _backward_* operator. Read at `import mxnet`, hence the environment.
PROFILE_ENV = {"MXNET_EXEC_BULK_EXEC_TRAIN": "0"}


def gpu_verdict(probe: dict, cc: tuple[int, int] | None, gpu_problem: str | None) -> GpuVerdict:
    from .cuda11 import gpu_verdict as wheel_verdict  # framework-free

    if cc is None:
        return no_gpu(gpu_problem)
    ok, message = wheel_verdict(cc)
    if not ok:  # the wheel has no code for this GPU at all: the CPU, labelled, whatever was asked
        return GpuVerdict(False, f"{message} (GPU sm {cc[0]}.{cc[1]})", None, cpu_regardless=True)
    if not probe.get("cuda_build"):
        return GpuVerdict(False, f"mxnet {probe.get('version')} is the CPU build", INSTALL_FIX)
    if not probe.get("num_gpus"):
        return GpuVerdict(False, "MXNet sees no GPU (mx.context.num_gpus() == 0)",
                          "check the driver and the nvidia-*-cu11 wheels (kernelmap doctor)")
    return GpuVerdict(True)


def _preload() -> object:
    from .cuda11 import preload

    return preload()  # mxnet-cu112's CUDA 11 libraries before `import mxnet`; a no-op without them


DESCRIPTOR = Framework(
    name="mxnet", label="MXNet", color="#1864ab", import_names=("mxnet",), install_fix=INSTALL_FIX, probe=PROBE,
    gpu_verdict=gpu_verdict, trace_source="mxnet_profiler", modes=("imperative", "hybridized"),
    pass_env={"framework": PROFILE_ENV}, before_import=_preload,
    cudnn_log_level={"CUDNN_LOGINFO_DBG": "1"},  # cuDNN 8 of the CUDA 11 wheel; cuDNN 9 only tolerates it
)
