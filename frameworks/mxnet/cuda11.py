"""Making the MXNet 1.9.1 GPU wheel (``mxnet-cu112``) loadable from PyPI's CUDA 11 wheels.

``mxnet-cu112==1.9.1`` links its CUDA 11 libraries dynamically (libcudart.so.11.0,
libcublas.so.11, libcublasLt.so.11, libcudnn.so.8 and its sub-libraries, libcufft.so.10,
libcurand.so.10, libcusolver.so.11, libnvrtc.so.11.2, libnccl.so.2, libnvToolsExt.so.1). The
``nvidia-*-cu11`` wheels put them under ``site-packages/nvidia/<component>/lib``, which is not on
the loader's search path. ``preload()`` finds those directories through the ``nvidia`` namespace
package and loads the libraries with RTLD_GLOBAL, in dependency order, before ``import mxnet``;
the dynamic loader then resolves mxnet's DT_NEEDED entries by soname to the already-loaded
libraries. Nothing in this module imports mxnet, so it can be tested without it.
"""

from __future__ import annotations

import ctypes
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

# Compute capabilities the 1.9.1 cu11x wheels carry machine code for: a measured fact about the
# wheel's libmxnet.so (its fatbins hold sm_50/60/70/80/86 cubins and no PTX, as listed by
# `cuobjdump --list-elf` / `--list-ptx`), recorded by the project rather than re-measured here.
# Without PTX there is no JIT path to a newer major architecture (sm_90 Hopper and later):
# kernels fail with "no kernel image is available for execution on the device".
SUPPORTED_SM: tuple[int, ...] = (50, 60, 70, 80, 86)

# (nvidia namespace sub-package, soname) in load order: each library only needs earlier ones.
LIBRARIES: tuple[tuple[str, str], ...] = (
    ("cuda_runtime", "libcudart.so.11.0"),
    ("nvtx", "libnvToolsExt.so.1"),
    ("cuda_nvrtc", "libnvrtc.so.11.2"),
    ("cublas", "libcublasLt.so.11"),
    ("cublas", "libcublas.so.11"),
    ("cufft", "libcufft.so.10"),
    ("curand", "libcurand.so.10"),
    ("cusolver", "libcusolver.so.11"),
    ("cudnn", "libcudnn_ops_infer.so.8"),
    ("cudnn", "libcudnn_ops_train.so.8"),
    ("cudnn", "libcudnn_cnn_infer.so.8"),
    ("cudnn", "libcudnn_cnn_train.so.8"),
    ("cudnn", "libcudnn_adv_infer.so.8"),
    ("cudnn", "libcudnn_adv_train.so.8"),
    ("cudnn", "libcudnn.so.8"),
    ("nccl", "libnccl.so.2"),
)


@dataclass
class PreloadResult:
    """What ``preload`` did. ``loaded`` is empty when no CUDA 11 wheels are installed (CPU wheel)."""

    lib_dirs: dict[str, str] = field(default_factory=dict)  # component -> directory found
    loaded: dict[str, str] = field(default_factory=dict)  # soname -> file loaded
    missing: list[str] = field(default_factory=list)  # sonames not found in any directory

    @property
    def active(self) -> bool:
        return bool(self.loaded)

    @property
    def complete(self) -> bool:
        return bool(self.loaded) and not self.missing

    def describe(self) -> str:
        if not self.loaded:
            return "no CUDA 11 runtime from nvidia-*-cu11 wheels found; nothing preloaded (CPU mxnet, or CUDA 11 on the loader path)"
        text = f"preloaded {len(self.loaded)} CUDA 11 libraries from {len(self.lib_dirs)} nvidia wheel(s)"
        if self.missing:
            text += f"; missing: {', '.join(self.missing)} (pip install 'kernelmap[mxnet-gpu]')"
        return text


def nvidia_roots() -> list[Path]:
    """Directories of the ``nvidia`` namespace package (from importlib, never a fixed path)."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def find_lib_dirs(roots: list[Path] | None = None) -> dict[str, Path]:
    """component -> ``<root>/<component>/lib`` for each component of ``LIBRARIES`` present."""
    roots = nvidia_roots() if roots is None else roots
    found: dict[str, Path] = {}
    for component in dict.fromkeys(c for c, _ in LIBRARIES):
        for root in roots:
            lib = Path(root) / component / "lib"
            if lib.is_dir():
                found[component] = lib
                break
    return found


# component -> the PyPI wheel that must own its library. Other CUDA majors' wheels (torch's
# nvidia-*-cu12/cu13) install into the same ``nvidia/<component>/lib`` directories, e.g.
# ``nvidia/nccl/lib/libnccl.so.2``, so a soname alone does not say which CUDA a file is for.
WHEELS: dict[str, str] = {
    "cuda_runtime": "nvidia-cuda-runtime-cu11",
    "nvtx": "nvidia-nvtx-cu11",
    "cuda_nvrtc": "nvidia-cuda-nvrtc-cu11",
    "cublas": "nvidia-cublas-cu11",
    "cufft": "nvidia-cufft-cu11",
    "curand": "nvidia-curand-cu11",
    "cusolver": "nvidia-cusolver-cu11",
    "cudnn": "nvidia-cudnn-cu11",
    "nccl": "nvidia-nccl-cu11",
}


def owned_by_cu11_wheel(component: str, path: Path) -> bool:
    """Whether ``path`` is a file installed by the CUDA 11 wheel of ``component`` (package metadata)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(WHEELS[component])
    except metadata.PackageNotFoundError:
        return False
    target = Path(path).resolve()
    return any(Path(dist.locate_file(f)).resolve() == target for f in dist.files or ())


def plan(
    roots: list[Path] | None = None, owned=owned_by_cu11_wheel
) -> tuple[list[Path], list[str], dict[str, Path]]:
    """(files to load in order, sonames missing, lib dirs) without loading anything.

    A file counts only if ``owned(component, path)`` says a CUDA 11 wheel installed it; without a
    CUDA 11 runtime nothing is planned at all (CPU wheel, or only other CUDA majors' wheels).
    """
    dirs = find_lib_dirs(roots)
    files: list[Path] = []
    missing: list[str] = []
    for component, soname in LIBRARIES:
        candidate = dirs[component] / soname if component in dirs else None
        if candidate is not None and candidate.exists() and owned(component, candidate):
            files.append(candidate)
        else:
            missing.append(soname)
    if not any(f.name == "libcudart.so.11.0" for f in files):
        return [], missing, dirs
    return files, missing, dirs


_LOADED: dict[str, ctypes.CDLL] = {}


def preload(roots: list[Path] | None = None, owned=owned_by_cu11_wheel) -> PreloadResult:
    """Load the CUDA 11 libraries of the nvidia-*-cu11 wheels globally; call before ``import mxnet``.

    A no-op returning an inactive result (``.active`` False) when no CUDA 11 runtime wheel is
    installed. A library that is present but fails to load raises ``OSError`` from ctypes (a
    broken install should not look like a CPU one).
    """
    files, missing, dirs = plan(roots, owned)
    result = PreloadResult(lib_dirs={c: str(d) for c, d in dirs.items()})
    if not files:
        return result
    result.missing = missing
    for path in files:
        if path.name not in _LOADED:
            _LOADED[path.name] = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        result.loaded[path.name] = str(path)
    return result


def gpu_verdict(compute_capability: tuple[int, int]) -> tuple[bool, str]:
    """Whether the mxnet-cu11x 1.9.1 wheel can run kernels on a GPU of this compute capability.

    The wheel has machine code for ``SUPPORTED_SM`` only and no PTX. A cubin for sm_XY runs on
    sm_XZ with Z >= Y (same major), never across majors.
    """
    major, minor = (int(v) for v in compute_capability)
    sm = major * 10 + minor
    if sm in SUPPORTED_SM:
        return True, f"sm_{sm}: the mxnet 1.9.1 cu11x wheel carries machine code for it"
    same_major = [s for s in SUPPORTED_SM if s // 10 == major and s <= sm]
    if same_major:
        return True, (
            f"sm_{sm}: runs the wheel's sm_{max(same_major)} machine code (binary compatible within a major version)"
        )
    supported = ", ".join(f"sm_{s}" for s in SUPPORTED_SM)
    return False, (
        f"sm_{sm}: the mxnet 1.9.1 cu11x wheel has machine code for {supported} only and no PTX, "
        "so its kernels cannot run on this GPU; MXNet runs on the CPU here"
    )


def library_versions() -> dict[str, int | None]:
    """Versions reported by the preloaded CUDA 11 libraries themselves (None where not loaded)."""
    out: dict[str, int | None] = {"cudart": None, "cudnn": None, "cublas": None}
    if "libcudart.so.11.0" in _LOADED:
        v = ctypes.c_int()
        if _LOADED["libcudart.so.11.0"].cudaRuntimeGetVersion(ctypes.byref(v)) == 0:
            out["cudart"] = v.value
    if "libcudnn.so.8" in _LOADED:
        _LOADED["libcudnn.so.8"].cudnnGetVersion.restype = ctypes.c_size_t
        out["cudnn"] = int(_LOADED["libcudnn.so.8"].cudnnGetVersion())
    if "libcublas.so.11" in _LOADED:
        parts = []
        for prop in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            v = ctypes.c_int()
            if _LOADED["libcublas.so.11"].cublasGetProperty(prop, ctypes.byref(v)) != 0:
                break
            parts.append(v.value)
        if len(parts) == 3:
            out["cublas"] = parts[0] * 10000 + parts[1] * 100 + parts[2]
    return out
