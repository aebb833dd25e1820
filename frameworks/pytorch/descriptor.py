"""PyTorch as kernelmap sees it (no torch import here)."""

from __future__ import annotations

from ..registry import Framework, GpuVerdict, NsysWindow, Option, no_gpu
from . import custom_op

INSTALL_FIX = "pip install 'kernelmap[pytorch]' (a CUDA build for GPUs: see https://pytorch.org/get-started)"
CUDA_FIX = ("install a CUDA build of torch, e.g. pip install torch --index-url "
            "https://download.pytorch.org/whl/cu130, on a machine with an NVIDIA GPU and driver")

PROBE = r"""
import json, torch
d = {"version": torch.__version__, "cuda_build": torch.version.cuda,
     "cuda_available": bool(torch.cuda.is_available()), "devices": []}
d["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
if d["cuda_available"]:
    for i in range(torch.cuda.device_count()):
        cc = torch.cuda.get_device_capability(i)
        d["devices"].append({"index": i, "name": torch.cuda.get_device_name(i),
                             "compute_capability": f"{cc[0]}.{cc[1]}"})
    d["arch_list"] = torch.cuda.get_arch_list()
print(json.dumps(d))
"""


def gpu_verdict(probe: dict, cc: tuple[int, int] | None, gpu_problem: str | None) -> GpuVerdict:
    if probe.get("cuda_available"):
        return GpuVerdict(True)
    if not probe.get("cuda_build"):
        return GpuVerdict(False, f"torch {probe.get('version')} is a CPU-only build", CUDA_FIX)
    if cc is None:
        return no_gpu(gpu_problem)
    return GpuVerdict(False, f"torch {probe.get('version')} (CUDA {probe.get('cuda_build')}) sees no usable GPU "
                             "(torch.cuda.is_available() is False; is the driver new enough?)",
                      "update the NVIDIA driver, or install a torch build for the driver's CUDA version")


DESCRIPTOR = Framework(
    name="pytorch", label="PyTorch", color="#d9480f", import_names=("torch", "torchvision"),
    install_fix=INSTALL_FIX, probe=PROBE, gpu_verdict=gpu_verdict, trace_source="kineto", modes=("eager",),
    nsys_window=lambda worker_env: NsysWindow.PROFILER_API,
    options=(Option(custom_op.OPTION, custom_op.ROUTES,
                    f"fc1's bias add by kernelmap's own C++/CUDA op ({custom_op.NAMESPACE}), built this way; "
                    "default: the built-in op"),),
)
