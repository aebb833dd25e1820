"""``kernelmap build-mxnet``: build MXNet 1.9.1 for this GPU's architecture (e.g. sm_90, Hopper).

The published MXNet wheels have no code for sm_90. This recipe builds a small libmxnet.so for one
architecture against nvcc (CUDA 12/13) and the CUDA / cuDNN 9 libraries of pip's ``nvidia``
packages, and installs an importable tree that ``kernelmap doctor`` and ``kernelmap run`` find
(frameworks/mxnet/built.py). Steps (``Step``):

1. source: ``git clone`` of tag 1.9.1 with its submodules, or ``--source`` (a source directory, a
   tarball, or a directory of tarballs such as shared/mxnet-sm90/src/);
2. patch: frameworks/mxnet/patches/*.patch, each checked with a dry run first;
3. configure: cmake (Ninja) for ``--arch`` (default: the GPU's compute capability from nvidia-smi)
   with only the GPU operator kernels kernelmap's CNN needs (``GPU_OPERATOR_SOURCES``) and without
   the numpy-style and quantized CPU operators (``EXCLUDED_SOURCE_DIRS``);
4. build: ninja, its progress lines shown; restartable (``--work`` keeps the build directory);
5. install: a tree in a hidden temporary directory of the cache, checked (library loads, holds
   code for the arch), then renamed to ``<home>/<version>-sm<NN>``.

A failure is one line naming the file and cause, with a non-zero exit; nothing is left in the cache
under the final name unless the install completed.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kernelmap.errors import KernelmapError, MissingToolError

from . import built, cuda11, fatbin

MXNET_VERSION = "1.9.1"
MXNET_GIT = "https://github.com/apache/mxnet.git"
# Submodules the build needs (the others: mkldnn, onnx-tensorrt, ps-lite... stay out).
SUBMODULES = ("3rdparty/dmlc-core", "3rdparty/dlpack", "3rdparty/tvm")
# Files that must exist once the source is prepared (relative to the MXNet root).
REQUIRED = ("CMakeLists.txt", "include/mxnet/base.h", "python/mxnet/__init__.py",
            "3rdparty/dmlc-core/CMakeLists.txt", "3rdparty/dlpack/include/dlpack/dlpack.h",
            "3rdparty/tvm/nnvm/include/nnvm/graph.h", "3rdparty/mshadow/mshadow/tensor.h")

# GPU kernels of the operators the MNIST CNN uses (relative to src/operator): Convolution,
# FullyConnected, Activation, Pooling, Flatten/reshape, softmax/log_softmax, pick, mean/sum,
# argmax, sgd(_mom)_update and multi_sgd, casts, elementwise and broadcast arithmetic/comparison,
# zeros/ones, add_n (gradient accumulation), pointwise fusion (hybridized graphs); for --math fp16,
# AMP's amp_cast/amp_multicast and the loss scaler's multi_all_finite (the last two files). Every other
# operator keeps its CPU version only. The .cu files outside src/operator are always compiled.
GPU_OPERATOR_SOURCES = (
    "nn/activation.cu", "nn/convolution.cu", "nn/fully_connected.cu", "nn/pooling.cu",
    "nn/softmax.cu", "nn/log_softmax.cu", "nn/im2col.cu",
    "optimizer_op.cu", "fusion/fused_op.cu",
    "tensor/elemwise_binary_op_basic.cu", "tensor/elemwise_binary_op_logic.cu",
    "tensor/elemwise_binary_scalar_op_basic.cu", "tensor/elemwise_binary_scalar_op_logic.cu",
    "tensor/elemwise_binary_broadcast_op_basic.cu", "tensor/elemwise_binary_broadcast_op_logic.cu",
    "tensor/elemwise_unary_op_basic.cu", "tensor/broadcast_reduce_op_value.cu",
    "tensor/broadcast_reduce_sum_value.cu", "tensor/broadcast_reduce_op_index.cu",
    "tensor/init_op.cu", "tensor/matrix_op.cu", "tensor/elemwise_sum.cu", "tensor/cast_storage.cu",
    "tensor/amp_cast.cu", "contrib/all_finite.cu",
)

# CPU source folders (relative to src/) left out of the build (patch 0006): the numpy-style operators
# (mx.np/npx, with their FFI in api/operator/numpy) and the quantized ones. Gluon in NDArray mode, as
# kernelmap's workload runs it, calls neither; they are 62 of the 390 compile steps, the numpy ones
# among the slowest (a minute each on one core, some four). Their operators are not registered.
EXCLUDED_SOURCE_DIRS = ("operator/numpy", "operator/quantization", "api/operator/numpy")
# Legacy and contrib operators (relative to src/) whose .cc creates their GPU version (CreateOp<gpu>)
# from a .cu left out of GPU_OPERATOR_SOURCES: compiled, they leave libmxnet.so with undefined symbols.
# None of them is in kernelmap's CNN. Found with `nm --undefined-only` on the objects of the first link.
EXCLUDED_SOURCES = tuple(f"operator/{name}.cc" for name in (
    "batch_norm_v1", "bilinear_sampler", "convolution_v1", "correlation", "crop", "custom/native_op",
    "grid_generator", "identity_attach_KL_sparse_reg", "instance_norm", "l2_normalization", "make_loss", "pad",
    "pooling_v1", "roi_pooling", "sequence_last", "sequence_mask", "sequence_reverse", "slice_channel",
    "spatial_transformer", "svm_output", "swapaxis",
    *(f"contrib/{c}" for c in ("count_sketch", "deformable_convolution", "deformable_psroi_pooling", "fft",
                                "gradient_multiplier_op", "ifft", "modulated_deformable_convolution",
                                "multi_proposal", "multibox_detection", "multibox_prior", "multibox_target",
                                "proposal", "psroi_pooling", "sync_batch_norm"))))

# Cost model for the estimate printed before the build, in CPU-seconds per compile step. Measured on
# the kit's build (shared/mxnet-sm90): 456 steps (its slim set, 113 .cu files) in 243 CPU-minutes on
# an H200 x4 machine (64 cores, gcc 13.3, nvcc 13.0). The .cc/.cu split is an assumption: .cu steps
# dominate (one sm_90 device pass plus the host pass each).
CPU_S_PER_CC = 12.0
CPU_S_PER_CU = 105.0
LINK_S = 60.0
# The slowest objects finish last, one core each. On the H200 x2 machine (32 jobs) 388 of 390 steps
# were done within two calls (8.8 + 8.3 min; ninja restarts the objects in flight when a call stops
# it) and one object was still compiling after 8.3 min of its own; which one, the log does not say.
# On a loaded 2-core VM (2 jobs) no object took more than 5.8 min (nn/pooling.cu); with 32 jobs on
# that machine each job ran slower.
# Modelled as a serial tail after the parallel part.
SERIAL_TAIL_S = 540.0
# Disk: the extracted source (~0.2 GB), the build tree (objects ~2 GB for the kit's slim set), the
# installed tree (library ~0.2-0.4 GB); measured figures replace these when known (README).
DISK_GB = 4.0


class Step(enum.Enum):
    SOURCE = "source"
    PATCH = "patch"
    CONFIGURE = "configure"
    BUILD = "build"
    INSTALL = "install"


class BuildError(KernelmapError):
    """A step of the build failed; the message names the step, the file and the cause."""

    def __init__(self, step: Step, message: str):
        self.step = step
        super().__init__(f"{step.value}: {message}")


def _say(msg: str) -> None:
    print(f"build-mxnet: {msg}", file=sys.stderr, flush=True)


# --- 1. source ----------------------------------------------------------------------------------
def _safe_extract(archive: Path, dest: Path) -> None:
    try:
        with tarfile.open(archive) as tf:
            if hasattr(tarfile, "data_filter"):
                tf.extractall(dest, filter="data")
            else:  # pragma: no cover - Python < 3.11.4
                for m in tf.getmembers():
                    if m.name.startswith("/") or ".." in Path(m.name).parts:
                        raise BuildError(Step.SOURCE, f"{archive}: unsafe member path {m.name!r}")
                tf.extractall(dest)
    except (tarfile.TarError, OSError) as exc:
        raise BuildError(Step.SOURCE, f"{archive}: cannot extract: {exc}") from None


def source_version(root: Path) -> str:
    """MXNet's version from include/mxnet/base.h (MXNET_MAJOR/MINOR/PATCH)."""
    header = root / "include" / "mxnet" / "base.h"
    text = header.read_text(errors="replace")
    parts = []
    for key in ("MXNET_MAJOR", "MXNET_MINOR", "MXNET_PATCH"):
        m = re.search(rf"#define\s+{key}\s+(\d+)", text)
        if not m:
            raise BuildError(Step.SOURCE, f"{header}: no #define {key}")
        parts.append(m.group(1))
    return ".".join(parts)


def check_source(root: Path) -> None:
    missing = [r for r in REQUIRED if not (root / r).exists()]
    if missing:
        raise BuildError(Step.SOURCE, f"{root / missing[0]}: missing from the MXNet source "
                                      f"({len(missing)} required file(s) missing; submodules {', '.join(SUBMODULES)} needed)")
    version = source_version(root)
    if version != MXNET_VERSION:
        raise BuildError(Step.SOURCE, f"{root / 'include/mxnet/base.h'}: MXNet {version}, this recipe is for {MXNET_VERSION}")


def prepare_source(source: str | None, work: Path) -> tuple[Path, Path | None]:
    """Lay the MXNet source out in ``work/mxnet``; return (source root, deps dir or None).

    ``source`` None: git clone of tag ``MXNET_VERSION`` and ``SUBMODULES`` (network). A directory
    with CMakeLists.txt: copied. A tarball, or a directory of tarballs: each extracted into
    ``work`` (the MXNet one and its submodules unpack under ``mxnet/``); a tarball whose members
    start with ``usr/`` (the kit's OpenBLAS) goes to ``work/deps``. Dangling symbolic links that
    point into submodules not carried (mkldnn...) are removed: they break CMake's globs.
    """
    root = work / "mxnet"
    deps = work / "deps"
    if root.exists():
        shutil.rmtree(root)
    if source is None:
        git = shutil.which("git")
        if git is None:
            raise MissingToolError("source: git not found; install git or pass --source DIR_OR_TARBALL")
        cmd = [git, "clone", "--depth", "1", "--branch", MXNET_VERSION, MXNET_GIT, str(root)]
        _run_checked(Step.SOURCE, cmd, work)
        _run_checked(Step.SOURCE, [git, "-C", str(root), "submodule", "update", "--init", "--depth", "1",
                                   *SUBMODULES], work)
    else:
        src = Path(source).expanduser()
        if not src.exists():
            raise BuildError(Step.SOURCE, f"{src}: no such file or directory")
        if src.is_dir() and (src / "CMakeLists.txt").is_file():
            shutil.copytree(src, root, symlinks=True)
        else:
            archives = sorted(src.glob("*.tar*")) if src.is_dir() else [src]
            if not archives:
                raise BuildError(Step.SOURCE, f"{src}: neither an MXNet source directory nor a directory of tarballs")
            for archive in archives:
                if not tarfile.is_tarfile(archive):
                    raise BuildError(Step.SOURCE, f"{archive}: not a tar archive")
                with tarfile.open(archive) as tf:
                    first = tf.next()
                top = first.name.split("/", 1)[0] if first else ""
                _safe_extract(archive, deps if top == "usr" else work)
    if not root.is_dir():
        raise BuildError(Step.SOURCE, f"{source}: no mxnet/ directory came out of it")
    for path in root.rglob("*"):
        if path.is_symlink() and not path.exists():
            path.unlink()
    check_source(root)
    return root, (deps if deps.is_dir() else None)


# --- 2. patches ---------------------------------------------------------------------------------
def patch_files() -> list[Path]:
    """The project's patches, in order (package data: kernelmap/frameworks/mxnet/patches)."""
    folder = resources.files("kernelmap.frameworks.mxnet") / "patches"
    return sorted(Path(str(p)) for p in folder.iterdir() if p.name.endswith(".patch"))


def apply_patch(root: Path, patch: Path, dry_run: bool = False) -> str:
    """Apply one patch (``patch -p1``); ``BuildError`` naming the patch if any hunk fails."""
    tool = shutil.which("patch")
    if tool is None:
        raise MissingToolError("patch: the `patch` program is not installed (apt-get install patch)")
    cmd = [tool, "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-i", str(patch)]
    if dry_run:
        cmd.append("--dry-run")
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if out.returncode != 0:
        lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
        bad = next((ln for ln in lines if "FAILED" in ln or "can't find" in ln.lower()
                    or "Reversed" in ln or "malformed" in ln.lower()), lines[-1] if lines else "")
        raise BuildError(Step.PATCH, f"{patch}: does not apply to {root}: {bad.strip()}")
    return out.stdout


PATCHED_STAMP = ".kernelmap-patched"  # in the source root: the names of the patches applied, in order


def applied_patches(root: Path) -> list[str] | None:
    """The patches a prepared source holds (its stamp), or None where it was never patched."""
    stamp = root / PATCHED_STAMP
    return stamp.read_text().split() if stamp.is_file() else None


def apply_patches(root: Path, patches: list[Path] | None = None) -> list[str]:
    """Check every patch with a dry run, then apply them all; returns the names applied. The stamp
    lists them after those the source already held (a patch added to the project since it was
    prepared is applied on its own: ``new_patches``)."""
    patches = patch_files() if patches is None else patches
    for p in patches:  # all checked before any is applied: nothing half-patched
        apply_patch(root, p, dry_run=True)
    for p in patches:
        apply_patch(root, p)
    names = [*(applied_patches(root) or []), *(p.name for p in patches)]
    (root / PATCHED_STAMP).write_text("\n".join(names) + "\n")
    return [p.name for p in patches]


def new_patches(root: Path) -> list[Path]:
    """The project's patches that a prepared source does not hold yet, in order. A patch the stamp
    names that the project no longer has is an error: the source cannot be un-patched here."""
    done = applied_patches(root) or []
    have = {p.name: p for p in patch_files()}
    gone = [n for n in done if n not in have]
    if gone:
        raise BuildError(Step.PATCH, f"{root / PATCHED_STAMP}: the source holds {', '.join(gone)}, which the project "
                                     "no longer has; build from a fresh --work directory")
    return [p for name, p in have.items() if name not in done]


def check_operator_sources(root: Path, sources: tuple[str, ...] = GPU_OPERATOR_SOURCES) -> None:
    missing = [s for s in sources if not (root / "src" / "operator" / s).is_file()]
    if missing:
        raise BuildError(Step.CONFIGURE, f"{root / 'src/operator' / missing[0]}: GPU operator source not in the tree")


# --- 3. toolchain and configure ---------------------------------------------------------------
def parse_arch(text: str) -> int:
    """'90', 'sm_90', '9.0' -> 90."""
    m = re.fullmatch(r"(?:sm_?)?(\d+)(?:\.(\d+))?a?", text.strip().lower())
    if not m:
        raise BuildError(Step.CONFIGURE, f"--arch {text!r}: expected e.g. 90, sm_90 or 9.0")
    return int(m.group(1)) * 10 + int(m.group(2)) if m.group(2) is not None else int(m.group(1))


def detect_arch() -> int:
    """The first GPU's compute capability as an sm number, from nvidia-smi."""
    from kernelmap import gpuinfo

    gpus = gpuinfo.query()
    if not gpus.gpus:
        raise MissingToolError(f"configure: no NVIDIA GPU found ({gpus.problem}); pass --arch, e.g. --arch 90")
    return parse_arch(gpus.gpus[0].compute_capability)


@dataclass
class Toolchain:
    nvcc: Path
    cuda_home: Path
    cuda_version: str
    include_dirs: list[Path]  # CUDA runtime/libraries and cuDNN headers (pip's nvidia dirs)
    lib_dirs: list[Path]  # their libraries
    cudnn_header: Path


def find_toolchain(nvcc: str | None = None) -> Toolchain:
    """nvcc (``--nvcc``, $CUDA_HOME/bin, PATH, /usr/local/cuda) and the CUDA/cuDNN headers and
    libraries of pip's nvidia packages (CUDA 13 layout ``nvidia/cu13``, CUDA 12 per component)."""
    cand = [nvcc] if nvcc else []
    if os.environ.get("CUDA_HOME"):
        cand.append(str(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"))
    cand += [shutil.which("nvcc") or "", "/usr/local/cuda/bin/nvcc"]
    found = next((Path(c) for c in cand if c and Path(c).is_file() and os.access(c, os.X_OK)), None)
    if found is None:
        raise MissingToolError("configure: nvcc not found; install the CUDA toolkit or pass --nvcc PATH")
    # the real nvcc (wrappers like `exec /usr/local/cuda-13.0/bin/nvcc "$@"` are common)
    out = subprocess.run([str(found), "--version"], capture_output=True, text=True)
    m = re.search(r"release (\d+\.\d+)", out.stdout)
    if out.returncode != 0 or not m:
        raise BuildError(Step.CONFIGURE, f"{found}: `nvcc --version` failed: {(out.stderr or out.stdout).strip()[:200]}")
    real = found.resolve()
    text = found.read_text(errors="replace") if found.stat().st_size < 4096 else ""
    w = re.search(r"exec\s+(\S+/bin/nvcc)", text)
    if w:
        real = Path(w.group(1)).resolve()
    cuda_home = real.parent.parent
    include_dirs = [cuda_home / "include"]
    if (cuda_home / "include" / "cccl").is_dir():  # CUDA 13: thrust/cub/libcu++ live under include/cccl
        include_dirs.append(cuda_home / "include" / "cccl")
    lib_dirs = [d for d in (cuda_home / "lib64", cuda_home / "lib") if d.is_dir()]
    cudnn_header = None
    for root in cuda11.nvidia_roots():
        for sub in sorted(root.iterdir()):
            inc, lib = sub / "include", sub / "lib"
            if sub.name in ("cudnn",) or re.fullmatch(r"cu\d+", sub.name) or (inc / "cublas_v2.h").exists() \
                    or (inc / "cufft.h").exists() or (inc / "curand.h").exists() or (inc / "cusolverDn.h").exists() \
                    or (inc / "cuda_runtime.h").exists() or (inc / "nvrtc.h").exists():
                if inc.is_dir():
                    include_dirs.append(inc)
                if lib.is_dir():
                    lib_dirs.append(lib)
                if (inc / "cudnn.h").is_file() and cudnn_header is None:
                    cudnn_header = inc / "cudnn.h"
    for d in include_dirs:
        if cudnn_header is None and (d / "cudnn.h").is_file():
            cudnn_header = d / "cudnn.h"
    if cudnn_header is None:
        raise MissingToolError("configure: cudnn.h not found (pip install nvidia-cudnn-cu13, or cu12)")
    major = re.search(r"#define\s+CUDNN_MAJOR\s+(\d+)", (cudnn_header.parent / "cudnn_version.h").read_text()
                      if (cudnn_header.parent / "cudnn_version.h").is_file() else cudnn_header.read_text())
    if not major or int(major.group(1)) < 9:
        raise BuildError(Step.CONFIGURE, f"{cudnn_header}: cuDNN {major.group(1) if major else '?'}; the patches target cuDNN 9")
    return Toolchain(found, cuda_home, m.group(1), include_dirs, lib_dirs, cudnn_header)


def make_cuda_root(tc: Toolchain, dest: Path) -> Path:
    """One CUDA root of symbolic links (bin, nvvm, include, lib64) merging the toolkit with pip's
    nvidia headers and libraries, which is the layout CMake's FindCUDAToolkit expects."""
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "include").mkdir(parents=True)
    (dest / "lib64").mkdir()
    (dest / "bin").symlink_to(tc.cuda_home / "bin")
    if (tc.cuda_home / "nvvm").is_dir():
        (dest / "nvvm").symlink_to(tc.cuda_home / "nvvm")
    for d in tc.include_dirs:
        for f in sorted(d.iterdir()):
            if not (dest / "include" / f.name).exists():
                (dest / "include" / f.name).symlink_to(f)
    for d in tc.lib_dirs:
        for f in sorted(d.iterdir()):
            if (".so" in f.name or f.suffix == ".a") and not (dest / "lib64" / f.name).exists():
                (dest / "lib64" / f.name).symlink_to(f)
    for f in sorted((dest / "lib64").iterdir()):  # unversioned names for the linker
        m = re.match(r"(.+\.so)\.\d", f.name)
        if m and not (dest / "lib64" / m.group(1)).exists():
            (dest / "lib64" / m.group(1)).symlink_to(f)
    ensure_libcuda(tc, dest)
    return dest


LDCONFIG_DIRS = "/usr/sbin:/sbin"  # Debian keeps ldconfig in /sbin, which is not on a non-root user's PATH


def loader_cache() -> str:
    """``ldconfig -p``: the dynamic loader's cache (the system libraries libmxnet.so needs, the CUDA
    driver's). ``MissingToolError`` where ldconfig is not found (on PATH, then in ``LDCONFIG_DIRS``) or
    fails: without the cache every system library would look missing."""
    ldconfig = shutil.which("ldconfig") or shutil.which("ldconfig", path=LDCONFIG_DIRS)
    if ldconfig is None:
        raise MissingToolError(f"ldconfig not found (looked on PATH={os.environ.get('PATH', '')!r} and in "
                               f"{LDCONFIG_DIRS}): it lists the system libraries libmxnet.so needs and the "
                               "CUDA driver; install glibc's (Debian: libc-bin)")
    try:
        out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True)
    except OSError as exc:
        raise MissingToolError(f"{ldconfig} -p: cannot run it: {exc.strerror or exc}") from None
    if out.returncode != 0:
        raise MissingToolError(f"{ldconfig} -p exited {out.returncode}: {out.stderr.strip()[:200]}")
    return out.stdout


def driver_library() -> Path | None:
    """The CUDA driver's libcuda.so.1 known to the dynamic loader, or None (a machine without GPU)."""
    m = re.search(r"libcuda\.so\.1 .*=> (\S+)", loader_cache())
    return Path(m.group(1)) if m else None


def ensure_libcuda(tc: Toolchain, curoot: Path) -> Path:
    """``curoot/lib64/libcuda.so`` for the linker (MXNet's run-time compilation links the driver API):
    the driver's library, else the toolkit's stub, else an empty stub with soname libcuda.so.1 made
    here (a machine without a GPU: the symbols stay undefined and bind to the driver where it runs)."""
    link = curoot / "lib64" / "libcuda.so"
    if link.exists():
        return link
    for target in (driver_library(), tc.cuda_home / "lib64" / "stubs" / "libcuda.so",
                   tc.cuda_home / "lib" / "stubs" / "libcuda.so"):
        if target is not None and target.exists():
            link.symlink_to(target)
            return link
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise MissingToolError("configure: no libcuda.so (no driver, no toolkit stub) and no C compiler to make a stub")
    stub = curoot / "stubs" / "libcuda.so"
    stub.parent.mkdir(exist_ok=True)
    _run_checked(Step.CONFIGURE, [cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-x", "c", os.devnull,
                                  "-o", str(stub)], curoot)
    link.symlink_to(stub)
    return link


def find_openblas(deps: Path | None) -> tuple[Path, Path, list[Path]]:
    """(include dir, libopenblas.so, runtime files to ship) from the source's deps or the system."""
    roots = ([deps / "usr"] if deps else []) + [Path("/usr")]
    for r in roots:
        for inc in [r / "include/x86_64-linux-gnu/openblas-pthread", r / "include/openblas", r / "include"]:
            if not (inc / "cblas.h").is_file():
                continue
            for lib in [r / "lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so",
                        r / "lib/x86_64-linux-gnu/libopenblas.so", r / "lib64/libopenblas.so", r / "lib/libopenblas.so"]:
                if lib.exists():
                    ship = []
                    if deps and r == deps / "usr":  # not on the target system: ship them in the tree
                        # OpenBLAS, the LAPACK beside it (MXNet links -llapack) and gfortran
                        ship = [p for p in lib.parent.glob("libopenblas*.so*")] + \
                               [p for p in lib.parent.glob("liblapack.so*")] + \
                               list((r / "lib/x86_64-linux-gnu").glob("libgfortran.so*"))
                    return inc, lib, ship
    raise MissingToolError("configure: OpenBLAS not found (cblas.h + libopenblas.so); apt-get install "
                           "libopenblas-dev, or pass the kit's openblas tarball in --source")


def cmake_command(src: Path, build: Path, curoot: Path, arch: int, openblas: tuple[Path, Path, list[Path]],
                  nvtx: bool = True, operator_sources: tuple[str, ...] = GPU_OPERATOR_SOURCES) -> list[str]:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise MissingToolError("configure: cmake not found (pip install cmake)")
    inc, lib, _ = openblas
    return [
        cmake, "-G", "Ninja", "-S", str(src), "-B", str(build),
        "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_POLICY_VERSION_MINIMUM=3.5",
        f"-DCMAKE_CUDA_COMPILER={curoot / 'bin' / 'nvcc'}", f"-DCUDAToolkit_ROOT={curoot}",
        "-DUSE_CUDA=ON", f"-DMXNET_CUDA_ARCH={arch // 10}.{arch % 10}", "-DUSE_CUDNN=ON",
        f"-DCUDNN_INCLUDE={curoot / 'include'}", f"-DCUDNN_LIBRARY={curoot / 'lib64' / 'libcudnn.so'}",
        "-DUSE_MKLDNN=OFF", "-DUSE_OPENCV=OFF", "-DUSE_LAPACK=ON", "-DUSE_BLAS=Open",
        f"-DOpenBLAS_INCLUDE_DIR={inc}", f"-DOpenBLAS_LIB={lib}",
        # MXNet links USE_LAPACK's `-llapack` by name: look beside OpenBLAS (Debian's openblas-pthread/
        # holds liblapack.so, the LAPACK OpenBLAS provides), which is on no default linker path
        f"-DCMAKE_SHARED_LINKER_FLAGS=-L{lib.parent}",
        "-DUSE_NCCL=OFF", "-DUSE_INTGEMM=OFF", "-DUSE_OPENMP=ON", "-DUSE_CPP_PACKAGE=OFF",
        "-DBUILD_CPP_EXAMPLES=OFF", f"-DUSE_NVTX={'ON' if nvtx else 'OFF'}", "-DUSE_DIST_KVSTORE=OFF",
        "-DUSE_TVM_OP=OFF", "-DUSE_JEMALLOC=OFF", "-DUSE_GPERFTOOLS=OFF", "-DUSE_F16C=ON", "-DUSE_CCACHE=OFF",
        "-DMXNET_CUDA_OPERATOR_SOURCES=" + ";".join(operator_sources),
        "-DMXNET_EXCLUDE_SOURCE_DIRS=" + ";".join(EXCLUDED_SOURCE_DIRS),
        "-DMXNET_EXCLUDE_SOURCES=" + ";".join(EXCLUDED_SOURCES),
    ]


# --- 4. build -----------------------------------------------------------------------------------
_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\]\s+(.*)$")


def run_ninja(build: Path, jobs: int, log: Path) -> None:
    """ninja -j JOBS mxnet; progress lines on stderr (every 5%), everything in ``log``.

    Ctrl-C / SIGINT (``timeout -s INT``) stops ninja cleanly; the build directory stays and the
    next run resumes it.
    """
    ninja = shutil.which("ninja")
    if ninja is None:
        raise MissingToolError("build: ninja not found (pip install ninja)")
    t0 = time.monotonic()
    last_pct = -5
    failed: list[str] = []
    with open(log, "a") as fh:
        proc = subprocess.Popen([ninja, "-C", str(build), "-j", str(jobs), "mxnet"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace")
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                fh.write(line)
                m = _PROGRESS.match(line)
                if m:
                    done, total = int(m.group(1)), int(m.group(2))
                    pct = 100 * done // total
                    if pct >= last_pct + 5 or done == total:
                        last_pct = pct
                        el = time.monotonic() - t0
                        print(f"build-mxnet: [{done}/{total}] {pct}% {el / 60:.1f} min "
                              f"{m.group(3).split(' ')[-1][-70:]}", file=sys.stderr, flush=True)
                elif line.startswith("FAILED:"):
                    failed.append(line.strip())
                    print(line.rstrip(), file=sys.stderr, flush=True)
            rc = proc.wait()
        except BaseException:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
    if rc != 0:
        what = failed[0][len("FAILED: "):] if failed else f"ninja exited {rc}"
        raise BuildError(Step.BUILD, f"{what} (full log: {log})")


# --- 5. install ---------------------------------------------------------------------------------
def _numpy_major() -> int:
    out = subprocess.run([sys.executable, "-c", "import numpy; print(numpy.__version__)"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return 0
    return int(out.stdout.strip().split(".")[0])


def install_tree(src: Path, build: Path, home: Path, arch: int, tc: Toolchain,
                 openblas: tuple[Path, Path, list[Path]], numpy_wheel: str | None,
                 info_extra: dict) -> Path:
    """Assemble the tree in ``home/.NAME.partial-*``, check it, rename it to ``home/NAME``."""
    lib = build / "libmxnet.so"
    if not lib.is_file():
        raise BuildError(Step.INSTALL, f"{lib}: not built")
    summary = fatbin.read_archs(lib)
    if arch not in summary.sm:
        raise BuildError(Step.INSTALL, f"{lib}: holds code for {summary.describe()}, not sm_{arch}")
    need_numpy = _numpy_major() >= 2
    if need_numpy and not numpy_wheel:
        raise BuildError(Step.INSTALL, f"{sys.executable} has numpy 2.x and MXNet {MXNET_VERSION} needs numpy < 2: "
                                       "pass --numpy-wheel numpy-1.26.*.whl")
    if numpy_wheel and not zipfile.is_zipfile(numpy_wheel):
        raise BuildError(Step.INSTALL, f"{numpy_wheel}: not a wheel (zip) file")
    home.mkdir(parents=True, exist_ok=True)
    name = built.tree_name(MXNET_VERSION, arch)
    final = home / name
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.partial-", dir=home))
    try:
        shutil.copytree(src / "python" / "mxnet", tmp / "python" / "mxnet",
                        ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        shutil.copy2(lib, tmp / built.LIB_RELPATH)
        built.ship_libraries(openblas[2], tmp / "lib")
        if numpy_wheel:  # given: bundled (also when building here for a machine with numpy 2.x)
            with zipfile.ZipFile(numpy_wheel) as zf:
                zf.extractall(tmp / "python")
            # The host's scipy is built for its numpy 2.x and fails under this numpy 1.x with an
            # AttributeError (np.long), which MXNet's `try: import scipy... except ImportError` does not
            # catch (seen on the H100: mxnet/ndarray/sparse.py). A stub package first on the path makes
            # the import an ImportError, so MXNet runs without scipy, as it does where none is installed.
            (tmp / "python" / "scipy").mkdir()
            (tmp / "python" / "scipy" / "__init__.py").write_text(SCIPY_STUB)
        needed = fatbin.needed_libraries(tmp / built.LIB_RELPATH)
        system = re.compile(r"^(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|libgomp|ld-linux.*)\.so")
        preload = [n for n in needed if not system.match(n) and n != "libcuda.so.1"]
        gfortran = sorted(p.name for p in (tmp / "lib").glob("libgfortran.so.*") if re.search(r"\.so\.\d+$", p.name))
        info = {
            "version": MXNET_VERSION, "sm": arch, "archs": summary.describe(),
            "cuda": tc.cuda_version, "nvcc": str(tc.nvcc), "cudnn_header": str(tc.cudnn_header),
            "runtime_lib_dirs": [str(d) for d in tc.lib_dirs],
            "preload": list(dict.fromkeys(gfortran + preload)),
            "needed": needed, "numpy": Path(numpy_wheel).name if numpy_wheel else "host",
            "patches": applied_patches(src),
            "gpu_operator_sources": list(GPU_OPERATOR_SOURCES),
            "excluded_source_dirs": list(EXCLUDED_SOURCE_DIRS), "excluded_sources": list(EXCLUDED_SOURCES),
            "library_bytes": (tmp / built.LIB_RELPATH).stat().st_size,
            **info_extra,
        }
        (tmp / built.INFO_FILE).write_text(json.dumps(info, indent=1))
        # the tree must load: its libraries, then libmxnet.so with every symbol resolved (RTLD_NOW).
        # Only where a CUDA driver is: without one, libcuda.so.1 cannot be loaded at all.
        if driver_library() is not None:
            check = ("import ctypes, sys; from kernelmap.frameworks.mxnet import built; "
                     "built.preload(sys.argv[1]); ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_GLOBAL | 2)")
            out = subprocess.run([sys.executable, "-c", check, str(tmp), str(tmp / built.LIB_RELPATH)],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                err = [ln for ln in out.stderr.splitlines() if ln.strip()]
                raise BuildError(Step.INSTALL, f"{lib}: does not load: {err[-1] if err else out.returncode}")
        else:
            missing = unresolved_symbols(tmp / built.LIB_RELPATH, tmp, tc)
            if missing:
                raise BuildError(Step.INSTALL, f"{lib}: {len(missing)} symbol(s) defined by none of its libraries, "
                                               f"e.g. {missing[0]}")
            _say("install: no CUDA driver here: checked with nm that every symbol but the driver API's (cu*) "
                 "is defined by libmxnet.so's libraries; the load itself is checked by `kernelmap doctor` on the GPU")
        if final.exists():
            old = home / f".{name}.old-{os.getpid()}"
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


SCIPY_STUB = ('raise ImportError("scipy is hidden from this MXNet tree (kernelmap build-mxnet): the host\'s scipy "\n'
              '                  "is built for numpy 2.x and this tree runs numpy 1.x")\n')


def _dynamic_symbols(path: Path, defined: bool) -> set[str]:
    nm = shutil.which("nm")
    if nm is None:
        raise MissingToolError("install: nm (binutils) not found; it checks the link where no CUDA driver is")
    flag = "--defined-only" if defined else "--undefined-only"
    out = subprocess.run([nm, "-D", flag, str(path)], capture_output=True, text=True)
    if out.returncode != 0:
        raise BuildError(Step.INSTALL, f"{path}: nm failed: {out.stderr.strip()[:200]}")
    names = set()
    for line in out.stdout.splitlines():
        parts = line.split()
        if not parts or (not defined and parts[0] in ("w", "v")):  # weak references may stay undefined
            continue
        names.add(parts[-1].split("@")[0])
    return names


def unresolved_symbols(lib: Path, tree: Path, tc: Toolchain) -> list[str]:
    """Symbols ``lib`` needs that none of its DT_NEEDED libraries defines (found in the tree's lib/,
    the toolchain's library dirs, or the system's loader cache), except the driver API (``cu*``,
    bound to libcuda.so.1 where the driver is)."""
    cache = loader_cache()
    system = dict(re.findall(r"^\s*(\S+) \(libc6,x86-64[^)]*\) => (\S+)", cache, flags=re.M))
    defined: set[str] = set()
    for soname in fatbin.needed_libraries(lib):
        if soname == "libcuda.so.1":
            continue
        cands = [tree / "lib" / soname, *(d / soname for d in tc.lib_dirs)]
        path = next((c for c in cands if c.exists()), None) or (Path(system[soname]) if soname in system else None)
        if path is None:
            raise BuildError(Step.INSTALL, f"{lib}: needs {soname}, found in none of its library dirs")
        defined |= _dynamic_symbols(path, defined=True)
    return sorted(s for s in _dynamic_symbols(lib, defined=False) - defined if not s.startswith("cu"))


def _run_checked(step: Step, cmd: list[str], cwd: Path, log: Path | None = None) -> str:
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if log is not None:
        log.write_text(out.stdout + out.stderr)
    if out.returncode != 0:
        lines = [ln for ln in (out.stderr + out.stdout).splitlines() if ln.strip()]
        err = next((ln for ln in lines if "Error" in ln or "error" in ln), lines[-1] if lines else "")
        raise BuildError(step, f"{cmd[0]} exited {out.returncode}: {err.strip()[:300]}"
                               + (f" (log: {log})" if log else ""))
    return out.stdout


def estimate(n_cc: int, n_cu: int, jobs: int) -> tuple[float, float]:
    """(CPU-minutes, wall minutes with ``jobs`` parallel jobs) of the compile, from the cost model."""
    cpu_s = n_cc * CPU_S_PER_CC + n_cu * CPU_S_PER_CU
    wall_s = cpu_s / max(1, jobs) + SERIAL_TAIL_S + LINK_S  # the slowest objects and the link are serial
    return cpu_s / 60, wall_s / 60


def count_sources(root: Path, operator_sources: tuple[str, ...] = GPU_OPERATOR_SOURCES) -> tuple[int, int]:
    """(C++ compile units, CUDA compile units) that the configured build compiles: every .cc of src/
    and of nnvm, dmlc-core's local I/O; the .cu files outside src/operator plus the operator subset.
    (Checked against the generated build.ninja of the kit's source: 362 and 28 of its 390 steps before
    ``EXCLUDED_SOURCE_DIRS``.)"""
    rel = [p.relative_to(root / "src").as_posix() for p in (root / "src").rglob("*.cc")]
    cc = sum(1 for r in rel if not r.startswith(tuple(d + "/" for d in EXCLUDED_SOURCE_DIRS)) and r not in EXCLUDED_SOURCES)
    cc += 1 if "operator/numpy" in EXCLUDED_SOURCE_DIRS else 0  # cmake/kernelmap_np_params.cc (patch 0006)
    cc += sum(1 for _ in (root / "3rdparty" / "tvm" / "nnvm" / "src").rglob("*.cc"))
    dmlc = root / "3rdparty" / "dmlc-core" / "src"
    cc += sum(1 for p in [*dmlc.glob("*.cc"), *dmlc.glob("io/*.cc")]
              if not re.match(r"(azure|hdfs|s3)_", p.name))
    cu = sum(1 for p in (root / "src").rglob("*.cu") if "operator" not in p.relative_to(root / "src").parts[:1])
    return cc, cu + len(operator_sources)


# --- the command --------------------------------------------------------------------------------
def default_work(home: Path, name: str) -> Path:
    """The build directory when ``--work`` is not given: hidden beside the cache's trees (``find_trees``
    skips hidden names), not in $TMPDIR, so a build interrupted by a reboot resumes too."""
    return home / f".build-{name}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", help="MXNet 1.9.1 source: a directory, a tarball, or a directory of tarballs "
                        "(e.g. shared/mxnet-sm90/src); default: git clone of tag 1.9.1 (network)")
    parser.add_argument("--arch", help="GPU architecture to build for (90, sm_90, 9.0); default: this GPU's")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compile jobs (default: all cores)")
    parser.add_argument("--work", help="build directory, kept between runs so an interrupted build resumes "
                        "(default: <home>/.build-<version>-sm<NN> beside the cache, removed after a good install)")
    parser.add_argument("--nvcc", help="path of nvcc (default: $CUDA_HOME/bin, PATH, /usr/local/cuda)")
    parser.add_argument("--numpy-wheel", help="a numpy<2 wheel, installed in the tree (MXNet 1.9.1 needs numpy < 2); "
                        "required where this Python's numpy is 2.x, and for a machine that has numpy 2.x")
    parser.add_argument("--no-nvtx", action="store_true", help="build without NVTX ranges per operator")
    parser.add_argument("--keep-work", action="store_true", help="keep the build directory after the install")
    parser.add_argument("--configure-only", action="store_true", help="stop after cmake (no compile, no install)")


def main(args: argparse.Namespace) -> int:
    t_start = time.monotonic()
    arch = parse_arch(args.arch) if args.arch else detect_arch()
    if args.jobs < 1:
        raise KernelmapError(f"--jobs {args.jobs}: must be at least 1")
    if args.source and not Path(args.source).expanduser().exists():
        raise BuildError(Step.SOURCE, f"{args.source}: no such file or directory")
    if args.numpy_wheel and not Path(args.numpy_wheel).is_file():
        raise KernelmapError(f"{args.numpy_wheel}: --numpy-wheel: no such file")
    home = built.mxnet_home()
    name = built.tree_name(MXNET_VERSION, arch)
    work = Path(args.work) if args.work else default_work(home, name)
    tc = find_toolchain(args.nvcc)
    _say(f"MXNet {MXNET_VERSION} for sm_{arch}; nvcc {tc.cuda_version} ({tc.nvcc}); cuDNN {tc.cudnn_header.parent}")
    _say(f"work dir {work}; install to {home / name}")
    work.mkdir(parents=True, exist_ok=True)
    free_gb = shutil.disk_usage(work).free / 1e9
    src = work / "mxnet"
    stamp = work / "build" / "build.ninja"
    if applied_patches(src) is None:
        _say(f"step 1/5 source: {args.source or MXNET_GIT + ' @ ' + MXNET_VERSION}")
        src, deps = prepare_source(args.source, work)
        _say("step 2/5 patches: " + ", ".join(p.name for p in patch_files()))
        apply_patches(src)
    else:
        _say(f"steps 1-2/5: source already prepared and patched in {src} (resuming)")
        added = new_patches(src)
        if added:  # ninja then rebuilds what they touch
            _say("step 2/5 patches added since: " + ", ".join(p.name for p in added))
            apply_patches(src, added)
        deps = work / "deps" if (work / "deps").is_dir() else None
    check_operator_sources(src)
    n_cc, n_cu = count_sources(src)
    cpu_min, wall_min = estimate(n_cc, n_cu, args.jobs)
    _say(f"estimate: ~{cpu_min:.0f} CPU-minutes ({n_cc} C++ and {n_cu} CUDA compile units), ~{wall_min:.0f} min "
         f"with {args.jobs} jobs; disk ~{DISK_GB:.0f} GB in {work} (free: {free_gb:.0f} GB)")
    if free_gb < DISK_GB:
        raise KernelmapError(f"{work}: {free_gb:.1f} GB free, the build needs about {DISK_GB:.0f} GB")
    openblas = find_openblas(deps)
    if not stamp.is_file():
        _say(f"step 3/5 configure (cmake, sm_{arch}, {len(GPU_OPERATOR_SOURCES)} GPU operator sources)")
        curoot = make_cuda_root(tc, work / "curoot")
        cmd = cmake_command(src, work / "build", curoot, arch, openblas, nvtx=not args.no_nvtx)
        (work / "build").mkdir(exist_ok=True)
        log = work / "build" / "cmake.log"
        _run_checked(Step.CONFIGURE, cmd, work, log)
        text = log.read_text()
        for pat in (r"Found CUDAToolkit.*", r"CUDA: Using the following NVCC architecture flags.*",
                    r"Found CUDNN.*", r"NVTX 3.*", r"GPU operator subset.*"):
            m = re.search(pat, text)
            if m:
                _say("  " + m.group(0).strip())
        if f"sm_{arch}" not in text:
            raise BuildError(Step.CONFIGURE, f"{log}: cmake did not configure sm_{arch}")
    else:
        _say(f"step 3/5 configure: {stamp} exists (resuming)")
        ensure_libcuda(tc, work / "curoot")
    if args.configure_only:
        _say("configured; stopping (--configure-only)")
        return 0
    _say(f"step 4/5 build: ninja -j {args.jobs} (log: {work / 'build' / 'ninja.log'})")
    t_build = time.monotonic()
    try:
        run_ninja(work / "build", args.jobs, work / "build" / "ninja.log")
    except KeyboardInterrupt:
        _say(f"interrupted; the build directory {work} is kept: the same command resumes it")
        raise
    build_s = time.monotonic() - t_build
    _say(f"step 5/5 install into {home / name}")
    final = install_tree(src, work / "build", home, arch, tc, openblas, args.numpy_wheel,
                         {"jobs": args.jobs, "last_build_call_wall_s": round(build_s, 1),
                          "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    size_mb = (final / built.LIB_RELPATH).stat().st_size / 2**20
    _say(f"done: {final} (libmxnet.so {size_mb:.0f} MiB; {fatbin.read_archs(final / built.LIB_RELPATH).describe()}) "
         f"in {(time.monotonic() - t_start) / 60:.1f} min")
    if not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    print(str(final))
    return 0
