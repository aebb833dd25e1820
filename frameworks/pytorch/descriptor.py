"""PyTorch as kernelmap sees it (no torch import here)."""

from __future__ import annotations

from ..dataparallel import DataParallel
from ..registry import Framework, GpuVerdict, NsysWindow, Option, no_gpu
from . import custom_op, ops

# the ops of its Kineto trace that run CPU library calls: oneDNN's (convolutions, and linear/pooling where
# torch sends them there; addmm and mm in bf16, which torch runs as oneDNN matmuls: no BLAS has bf16) and BLAS'
# (addmm, mm in fp32)
CPU_LIBRARY_ENTRY_OPS = {"oneDNN": ("aten::mkldnn_convolution", "aten::convolution_backward", "aten::mkldnn_linear",
                                    "aten::mkldnn_max_pool2d", "aten::addmm", "aten::mm"),
                         "BLAS": ("aten::addmm", "aten::mm")}

INSTALL_FIX = "pip install 'kernelmap[pytorch]' (a CUDA build for GPUs: see https://pytorch.org/get-started)"
CUDA_FIX = ("install a CUDA build of torch, e.g. pip install torch --index-url "
            "https://download.pytorch.org/whl/cu130, on a machine with an NVIDIA GPU and driver")

EAGER = "eager"  # op by op
CUDA_GRAPH = "cuda-graph"  # the whole step captured once with torch.cuda.graph after warm-up, then replayed
COMPILE = "compile"  # torch.compile (default mode) of the model and loss; optimizer eager
COMPILE_GRAPHS = "compile-graphs"  # torch.compile mode="reduce-overhead" of the model and loss and of the optimizer step
GRAPH_WARMUP = 3  # eager steps on a side stream before the capture (torch.cuda.graph's documented recipe)
MODE_HELP = {
    EAGER: "op by op",
    CUDA_GRAPH: "the whole training step captured with torch.cuda.graph after warm-up, replayed each step "
                "(static input buffers filled from the loader)",
    COMPILE: "torch.compile (default mode) of model + loss (forward and backward); the optimizer step eager",
    COMPILE_GRAPHS: "torch.compile mode='reduce-overhead' (CUDA graph trees) of model + loss and of the optimizer step",
}

# issue 38: autocast (+ GradScaler for fp16) in every mode on the GPU; bf16 autocast on the CPU (oneDNN)
MATH_REFUSALS = {
    "cpu": {"fp16":  # spec.Math.FP16's value (spec imports numpy; `kernelmap --help` imports none)
            "fp16 mixed precision is a GPU recipe here: oneDNN has fp16 convolutions only on CPUs "
            "with AVX512-FP16 or AMX-FP16 (torch.ops.mkldnn._is_mkldnn_fp16_supported()), elsewhere "
            "PyTorch's CPU autocast would run fp16 through slow reference kernels; use bf16 on the CPU"},
    "gpu": {},
}

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
    install_fix=INSTALL_FIX, probe=PROBE, gpu_verdict=gpu_verdict, trace_source="kineto",
    modes=(EAGER, CUDA_GRAPH, COMPILE, COMPILE_GRAPHS), gpu_only_modes=frozenset({CUDA_GRAPH, COMPILE_GRAPHS}),
    mode_help=MODE_HELP, math_refusals=MATH_REFUSALS,
    uncounted_call_modes={
        CUDA_GRAPH: "a replayed CUDA graph launches no framework op (its kernels are attributed from the reference "
                    "step: adapters/graph_replay.py)",
        **{m: "TorchInductor fuses the model's ops into generated kernels (adapters/inductor.py)"
           for m in (COMPILE, COMPILE_GRAPHS)}},
    replay_modes={CUDA_GRAPH: "the whole step is one CUDA graph, captured at the last warm-up step",
                  COMPILE_GRAPHS: "CUDA graph trees record the compiled step's graphs in its first calls"},
    min_warmup={CUDA_GRAPH: GRAPH_WARMUP + 1},  # the capture is the warm-up step after the eager ones
    train_memory_factor=1.0,  # two steps at batch 2048 (CPU, eager): peak resident growth 0.88x the forward's values
    nsys_window=lambda worker_env: NsysWindow.PROFILER_API,
    options=(Option(custom_op.OPTION, custom_op.ROUTES,
                    f"fc1's bias add by kernelmap's own C++/CUDA op ({custom_op.NAMESPACE}), built this way; "
                    "default: the built-in op",
                    mixed_refusal="kernelmap's custom op computes in float32 only (kernelmap_custom.cpp: check_float)"),),
    bias_grad_kernel_marks=(custom_op.BIAS_GRAD_KERNEL,), cpu_library_entry_ops=CPU_LIBRARY_ENTRY_OPS,
    vocabulary=ops.VOCABULARY,
    data_parallel=DataParallel(
        processes=True, cpu="DDP, gloo all-reduce", gpu=("nccl",), modes=(EAGER, COMPILE),
        why_not={m: "DDP's NCCL all-reduces are not captured into its CUDA graphs here" for m in (CUDA_GRAPH, COMPILE_GRAPHS)}),
    option_tools=custom_op.doctor_tools, option_tool_lines=custom_op.doctor_lines,
    commands={"custom-op": ("kernelmap.frameworks.pytorch.custom_op.cli",
                            "build kernelmap's own PyTorch op (jit|setuptools|cmake), run the seed's AddModel, "
                            "check parity")},
)
