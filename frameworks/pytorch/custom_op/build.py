"""Build (once) and load kernelmap's custom op by each of PyTorch's three routes (``Route``).

A build lives in ``cache_root()/<route>-<cpu|cuda>-<key>/`` (``~/.cache/kernelmap/custom_op`` unless
``$KERNELMAP_CUSTOM_OP_HOME``), ``key`` = sha256 of the sources (``csrc/``), the torch version, the
Python ABI, the route and the CUDA architectures. A folder that holds its artifact is loaded as it
is: a second run compiles nothing (``Ops.built`` False). A build is made in a ``.partial`` folder and
renamed when complete, so a failed or interrupted one leaves nothing that looks built; its compiler
output is in ``build.log`` (the error names it). Before building, every tool the route needs is
looked for (``missing_tools``); one missing is one line naming it (``MissingToolError``).

Imports torch (a worker's module, like ``workload.py``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from kernelmap.errors import KernelmapError, MissingToolError

from . import NAMESPACE, OP_NAMES, Route, cuda_headers, cuda_home, nvcc, tools_missing

CSRC = Path(__file__).resolve().parent / "csrc"
CPP_SOURCES = ("kernelmap_custom.cpp",)
CUDA_SOURCES = ("kernelmap_custom_cuda.cu",)
SOURCES = ("kernelmap_custom.h", *CPP_SOURCES, *CUDA_SOURCES)  # what every route compiles
ROUTE_FILES = {Route.JIT: (), Route.SETUPTOOLS: ("setup_ext.py",), Route.CMAKE: ("CMakeLists.txt",)}
CMAKE_LIBRARY = f"lib{NAMESPACE}.so"
BUILD_LOG = "build.log"


def cache_root() -> Path:
    env = os.environ.get("KERNELMAP_CUSTOM_OP_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kernelmap" / "custom_op"


def cuda_arch_list() -> str | None:
    """The CUDA architectures built for: ``$TORCH_CUDA_ARCH_LIST``, else this machine's GPU ("9.0")."""
    env = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if env:
        return env
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(0)
        return f"{major}.{minor}"
    return None


def build_key(route: str, cuda: bool) -> str:
    """What a build depends on, hashed: sources (and the route's own build file), torch, Python ABI,
    route, CUDA architectures."""
    h = hashlib.sha256()
    for name in (*SOURCES, *ROUTE_FILES[Route(route)]):
        h.update(name.encode() + b"\0" + (CSRC / name).read_bytes() + b"\0")
    arch = cuda_arch_list() if cuda else None
    for part in (torch.__version__, sysconfig.get_config_var("SOABI") or "", route, str(cuda), arch or ""):
        h.update(str(part).encode() + b"\0")
    return h.hexdigest()[:16]


def build_dir(route: str, cuda: bool) -> Path:
    return cache_root() / f"{route}-{'cuda' if cuda else 'cpu'}-{build_key(route, cuda)}"


def missing_tools(route: str, cuda: bool) -> list[str]:
    """``custom_op.tools_missing``, and what this torch asks of a build: a CUDA build of torch for the
    CUDA kernels, and for the cmake route of a CUDA build of torch the toolkit even for the CPU kernel."""
    try:
        missing = tools_missing(route, cuda)
    except ValueError as exc:
        raise KernelmapError(str(exc)) from None
    if cuda and not torch.version.cuda:
        missing.append(f"a CUDA build of torch (torch {torch.__version__} is CPU-only)")
    if route == Route.CMAKE and not cuda and torch.version.cuda and not cuda_headers():
        # torch's Caffe2Config.cmake of a CUDA build of torch requires the toolkit even for C++-only code
        missing.append(f"the CUDA toolkit (torch {torch.__version__}'s CMake config requires it even for "
                       "the CPU kernel; or a CPU build of torch)")
    return missing


def check_tools(route: str, cuda: bool) -> None:
    """Raise ``MissingToolError`` (one line, every missing tool named) unless ``route`` can build here."""
    missing = missing_tools(route, cuda)
    if missing:
        raise MissingToolError(f"custom op ({route} route, {'CUDA' if cuda else 'CPU'}) cannot be built: "
                               f"missing {'; '.join(missing)}")


@dataclass
class Ops:
    """The loaded op: its three functions (tensors in, tensor out), and where and how it was built."""

    route: str
    cuda: bool
    artifact: Path  # the .so loaded
    built: bool  # compiled by this call (False: loaded from the cache)
    build_s: float  # seconds spent building (0 when loaded from the cache)
    add2: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    bias_add: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    bias_grad: Callable[[torch.Tensor], torch.Tensor]

    def info(self) -> dict:
        return {"route": self.route, "cuda": self.cuda, "artifact": str(self.artifact), "built": self.built,
                "build_s": round(self.build_s, 3), "torch": torch.__version__}


def _recorded(name: str, fn: Callable) -> Callable:
    """A pybind11 function the profiler cannot see, called inside a ``record_function`` of the dispatcher op's name."""
    record = torch.profiler.record_function

    def call(*args):
        with record(name):
            return fn(*args)

    call.__name__ = fn.__name__ if hasattr(fn, "__name__") else name
    return call


def _module_ops(route: str, cuda: bool, mod, artifact: Path, built: bool, build_s: float) -> Ops:
    return Ops(route, cuda, artifact, built, build_s,
               add2=_recorded(OP_NAMES["add2"], mod.torch_launch_add2),
               bias_add=_recorded(OP_NAMES["bias_add"], mod.torch_launch_bias_add),
               bias_grad=_recorded(OP_NAMES["bias_grad"], mod.torch_launch_bias_grad))


def _import_so(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _ext_name(route: str, cuda: bool, key: str) -> str:
    return f"{NAMESPACE}_{route}_{'cuda' if cuda else 'cpu'}_{key}"


def _artifact(route: str, d: Path, name: str) -> Path | None:
    """The built library in folder ``d``, or None."""
    if route == Route.CMAKE:
        p = d / CMAKE_LIBRARY
        return p if p.is_file() else None
    found = sorted(d.glob(f"{name}*.so"))
    return found[0] if found else None


def _run(cmd: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None) -> None:
    with open(log, "a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.run(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        raise KernelmapError(f"custom op: `{' '.join(cmd[:3])} ...` failed (exit {proc.returncode}); "
                             f"its output: {log}")


def _env(cuda: bool, name: str) -> dict[str, str]:
    env = dict(os.environ, KERNELMAP_EXT_NAME=name, KERNELMAP_WITH_CUDA="1" if cuda else "0")
    if cuda_home() is not None:
        env["CUDA_HOME"] = str(cuda_home())
    # torch's CMake config of a CUDA build picks architectures by running a CUDA program unless told:
    # a CPU build is told anything (it compiles no CUDA)
    arch = cuda_arch_list() if cuda else (env.get("TORCH_CUDA_ARCH_LIST") or "9.0")
    if arch:
        env["TORCH_CUDA_ARCH_LIST"] = arch
    return env


def _build_jit(tmp: Path, name: str, cuda: bool, log: Path) -> None:
    from torch.utils.cpp_extension import load

    sources = [str(CSRC / s) for s in (*CPP_SOURCES, *(CUDA_SOURCES if cuda else ()))]
    flags = ["-O2", *(["-DWITH_CUDA"] if cuda else [])]
    arch = cuda_arch_list() if cuda else None
    saved = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if arch:
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    # load() prints ninja's output to fd 1/2: sent to the build log, as the other routes' is
    with open(log, "a") as fh:
        out, err = os.dup(1), os.dup(2)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fh.fileno(), 1)
        os.dup2(fh.fileno(), 2)
        try:
            load(name=name, sources=sources, build_directory=str(tmp), extra_cflags=flags,
                 extra_cuda_cflags=["-O2", "-DWITH_CUDA"] if cuda else None, with_cuda=cuda, verbose=True,
                 is_python_module=True)
        except Exception as exc:  # torch raises RuntimeError with the compiler's output: in the log
            raise KernelmapError(f"custom op: the jit build failed ({type(exc).__name__}); its output: {log}") from exc
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(out, 1)
            os.dup2(err, 2)
            os.close(out)
            os.close(err)
            if arch:
                if saved is None:
                    os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
                else:
                    os.environ["TORCH_CUDA_ARCH_LIST"] = saved


def _build_setuptools(tmp: Path, name: str, cuda: bool, log: Path) -> None:
    src = tmp / "src"
    shutil.copytree(CSRC, src)
    _run([sys.executable, "setup_ext.py", "-q", "build_ext", "--build-lib", str(tmp), "--build-temp",
          str(tmp / "obj")], src, log, _env(cuda, name))


def _build_cmake(tmp: Path, name: str, cuda: bool, log: Path) -> None:
    from torch.utils import cmake_prefix_path

    cfg = ["cmake", "-S", str(CSRC), "-B", str(tmp / "cmake"), f"-DCMAKE_PREFIX_PATH={cmake_prefix_path}",
           "-DCMAKE_BUILD_TYPE=Release", f"-DKERNELMAP_WITH_CUDA={'ON' if cuda else 'OFF'}",
           f"-DPython_EXECUTABLE={sys.executable}"]
    if cuda_home() is not None and torch.version.cuda:
        cfg += [f"-DCUDA_TOOLKIT_ROOT_DIR={cuda_home()}", f"-DCUDAToolkit_ROOT={cuda_home()}"]
    if cuda:
        cfg.append(f"-DCMAKE_CUDA_COMPILER={nvcc()}")
    _run(cfg, tmp, log, _env(cuda, name))
    _run(["cmake", "--build", str(tmp / "cmake"), "-j", str(max(os.cpu_count() or 1, 1))], tmp, log, _env(cuda, name))
    shutil.copy2(tmp / "cmake" / CMAKE_LIBRARY, tmp / CMAKE_LIBRARY)


BUILDERS = {Route.JIT: _build_jit, Route.SETUPTOOLS: _build_setuptools, Route.CMAKE: _build_cmake}


def build(route: str, cuda: bool) -> tuple[Path, bool, float]:
    """(the artifact, whether it was compiled now, seconds spent): from the cache where it is there."""
    d = build_dir(route, cuda)
    name = _ext_name(route, cuda, d.name.rsplit("-", 1)[-1])
    found = _artifact(route, d, name)
    if found is not None:
        return found, False, 0.0
    check_tools(route, cuda)
    d.parent.mkdir(parents=True, exist_ok=True)
    tmp = d.parent / f".{d.name}.{os.getpid()}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    log = d.parent / f"{d.name}.{BUILD_LOG}"  # beside the build: kept, and named, when the build fails
    log.unlink(missing_ok=True)
    t0 = time.perf_counter()
    try:
        BUILDERS[Route(route)](tmp, name, cuda, log)
        if _artifact(route, tmp, name) is None:
            raise KernelmapError(f"custom op: the {route} build made no library; its output: {log}")
        shutil.move(log, tmp / BUILD_LOG)
        try:
            tmp.rename(d)
        except OSError:  # another process finished the same build first: use its
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _artifact(route, d, name), True, time.perf_counter() - t0


_LOADED: dict[tuple[str, bool], Ops] = {}


def load(route: str, cuda: bool) -> Ops:
    """The op built by ``route`` (with its CUDA kernels where ``cuda``), built first if not cached."""
    if (route, cuda) in _LOADED:
        return _LOADED[(route, cuda)]
    artifact, built, secs = build(route, cuda)
    if route == Route.CMAKE:
        torch.ops.load_library(str(artifact))
        ns = getattr(torch.ops, NAMESPACE)
        ops = Ops(route, cuda, artifact, built, secs, add2=ns.add2, bias_add=ns.bias_add, bias_grad=ns.bias_grad)
    else:
        name = artifact.name.split(".")[0]
        ops = _module_ops(route, cuda, _import_so(name, artifact), artifact, built, secs)
    _LOADED[(route, cuda)] = ops
    return ops
