"""kernelmap's own PyTorch op (issue 26): a C++/CUDA kernel of ours in place of one built-in op, built
the three ways PyTorch offers, so that a user's kernel shows in the map beside the library kernels.

The op: the **bias add of fc1** (``spec.LAYERS``' first linear layer). The variant's fc1 is
``KernelmapLinear`` (``function.py``), an ``autograd.Function`` whose forward is ``x @ W.T`` (ATen's
``mm``) plus our ``bias_add`` kernel, and whose backward is ATen's two ``mm`` (input and weight
gradients) plus our ``bias_grad`` kernel (the bias gradient, a column sum). The built-in fc1 is
``aten::addmm`` (the bias in the gemm) and ATen's ``reduce_kernel`` for the bias gradient. The seed's own
op ``add2`` (an element-wise add of two vectors) is in the same library, for ``addmodel.py``.

Sources: ``csrc/`` (CPU kernels in C++, CUDA kernels in ``.cu``; the CUDA ones are compiled only where
nvcc is found). Build routes (``ROUTES``, ``build.py``):

- ``jit``: ``torch.utils.cpp_extension.load(name, sources)`` (needs ninja); a pybind11 module whose
  functions are called directly;
- ``setuptools``: ``CppExtension``/``CUDAExtension`` in ``csrc/setup_ext.py``, ``build_ext``; the module
  is imported;
- ``cmake``: a shared library registering the ops with the dispatcher (``TORCH_LIBRARY``), loaded by
  ``torch.ops.load_library``, called as ``torch.ops.kernelmap_custom.bias_add``.

**What the profiler sees of each route.** The dispatcher records every op it dispatches: the cmake
route's ``kernelmap_custom::bias_add`` is a ``cpu_op`` of the Kineto trace (with input shapes) and an
``emit_nvtx`` range under nsys, as any ``aten::`` op. A pybind11 function never passes the dispatcher
and is invisible; ``build.py`` wraps each call of the jit and setuptools routes in a
``record_function`` of the same name, which the trace holds as a ``user_annotation`` (kind
``annotation`` in records: no shapes, and not an op that kernels are attributed to). The
``autograd.Function`` itself is recorded in every route: its forward as a ``cpu_op`` named after the
class (``KernelmapLinear``, with input shapes and a sequence number) and its backward node as
``KernelmapLinearBackward``. Those two names map to the canonical ``linear`` (``adapters/canonical.py``),
fc1 by the weight argument, so the custom kernels of all three routes land in the layer's row: on the
GPU a kernel's op is the innermost op around its launch (cmake: ``kernelmap_custom::bias_add``; jit and
setuptools: ``KernelmapLinear``), and its canonical op, layer and direction are those of the outermost
mapped op (``KernelmapLinear`` / its backward) in every route.

This module imports no torch: the records' side (adapters) reads its names from here.
"""

from __future__ import annotations

import enum
import importlib.util
import os
import shutil
from pathlib import Path


class Route(enum.StrEnum):
    """How the op is built and called."""

    JIT = "jit"  # torch.utils.cpp_extension.load: pybind11 module, functions called directly
    SETUPTOOLS = "setuptools"  # CppExtension/CUDAExtension + build_ext: pybind11 module, imported
    CMAKE = "cmake"  # TORCH_LIBRARY shared library: dispatcher ops, torch.ops.kernelmap_custom.*


ROUTES = tuple(r.value for r in Route)
OPTION = "custom_op"  # the PyTorch workload option (registry.Option) that picks a route; absent: built-in

NAMESPACE = "kernelmap_custom"  # the C++ namespace of the kernels and the dispatcher's op namespace
KERNEL_MARK = f"{NAMESPACE}::"  # in every kernel's demangled name, and every op's (the records' library "custom")
OPS = ("add2", "bias_add", "bias_grad")
OP_NAMES = {op: f"{NAMESPACE}::{op}" for op in OPS}  # what the trace calls them, in every route
BIAS_GRAD_KERNEL = f"{NAMESPACE}::bias_grad_kernel"  # the bias gradient's kernel (direction bwd_bias)

LAYER = "fc1"  # the layer whose bias add the op does
FUNCTION = "KernelmapLinear"  # the autograd.Function (its forward's record name; position 1: the weight)
FUNCTION_BACKWARD = f"{FUNCTION}Backward"  # its backward node's record name
ADD2_FUNCTION = "KernelmapAdd2"  # the seed example's autograd.Function
ADDMODEL_N = 1 << 20  # the seed example's vector length (addmodel.py)
ADDMODEL_EPOCHS = 500  # its epochs


def needs(route: str, cuda: bool) -> tuple[str, ...]:
    """What a build of ``route`` needs besides torch (for doctor and the error naming what is missing)."""
    tools = ["C++ compiler (c++ or $CXX)"]
    if cuda:
        tools.append("nvcc (CUDA toolkit: $CUDA_HOME/bin/nvcc)")
    if route == Route.JIT:
        tools.append("ninja (pip install ninja)")
    elif route == Route.SETUPTOOLS:
        tools.append("setuptools")
    elif route == Route.CMAKE:
        tools.append("cmake >= 3.18")
    return tuple(tools)


def cuda_home() -> Path | None:
    """The CUDA toolkit: ``$CUDA_HOME`` or ``$CUDA_PATH``, else /usr/local/cuda where it has nvcc, else
    the folder above the ``nvcc`` on PATH (torch's own rule, in that order)."""
    env = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if env:
        return Path(env)
    if (Path("/usr/local/cuda") / "bin" / "nvcc").is_file():
        return Path("/usr/local/cuda")
    found = shutil.which("nvcc")
    return Path(found).resolve().parent.parent if found else None


def nvcc() -> str | None:
    """``cuda_home()/bin/nvcc`` where it is an executable file, else None."""
    home = cuda_home()
    path = home / "bin" / "nvcc" if home else None
    return str(path) if path and path.is_file() and os.access(path, os.X_OK) else None


def cuda_headers() -> bool:
    home = cuda_home()
    return bool(home and (home / "include" / "cuda_runtime.h").is_file())


def tools_missing(route: str, cuda: bool) -> list[str]:
    """What a build of ``route`` needs (``needs``) and this machine lacks, in that order; [] = all found.
    Imports nothing (doctor asks it): the torch build's own requirements are ``build.missing_tools``'."""
    if route not in ROUTES:
        raise ValueError(f"unknown custom-op route {route!r}; choose from {', '.join(ROUTES)}")
    want = needs(route, cuda)
    missing = []
    if shutil.which(os.environ.get("CXX") or "c++") is None:
        missing.append(want[0])
    if cuda and nvcc() is None:
        missing.append(want[1])
    elif cuda and not cuda_headers():
        missing.append(f"the CUDA headers ({cuda_home()}/include/cuda_runtime.h)")
    if route == Route.JIT and shutil.which("ninja") is None:
        missing.append(want[-1])
    if route == Route.SETUPTOOLS and importlib.util.find_spec("setuptools") is None:
        missing.append(want[-1])
    if route == Route.CMAKE and shutil.which("cmake") is None:
        missing.append(want[-1])
    return missing


def doctor_tools(gpu: bool) -> dict[str, dict[str, list[str] | None]]:
    """What each build route lacks here (``kernelmap doctor``, the descriptor's ``option_tools``):
    {route: {"cpu": [missing], "gpu": [missing] or None without a GPU}}."""
    return {r: {"cpu": tools_missing(r, False), "gpu": tools_missing(r, True) if gpu else None} for r in ROUTES}


def doctor_lines(tools: dict[str, dict[str, list[str] | None]]) -> list[str]:
    """One line per route: what it needs and whether this machine has it."""
    out = []
    for route, where in tools.items():
        parts = [f"{dev.upper()} " + (f"missing {'; '.join(m)}" if m else "ready")
                 for dev, m in where.items() if m is not None]
        out.append(f"custom op   --custom-op {route}: {', '.join(parts)} "
                   f"(needs {', '.join(needs(route, where['gpu'] is not None))})")
    return out
