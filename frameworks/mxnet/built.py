"""An MXNet that ``kernelmap build-mxnet`` built for this GPU: finding it, judging it, loading it.

A built tree lives in ``mxnet_home()/<version>-sm<NN>/`` (``~/.cache/kernelmap/mxnet`` unless
``KERNELMAP_MXNET_HOME`` says otherwise)::

    python/mxnet/            MXNet's Python package, patched (frameworks/mxnet/patches)
    python/mxnet/libmxnet.so the library (MXNet's libinfo looks beside the package first)
    python/numpy/            numpy < 2, only where the building Python had numpy 2.x
    lib/                     OpenBLAS and libgfortran, when they came with the source
    kernelmap-mxnet.json     what was built: version, arch, CUDA/cuDNN used, build time

Whether a tree suits this GPU is read from the library's own fatbins (``fatbin.read_archs``),
never from its directory name or a version string. Loading happens only in MXNet's own worker
subprocess: the runner puts ``python/`` first on that process's PYTHONPATH (``worker_env``) and
the workload calls ``preload`` (CUDA 13 / cuDNN 9 libraries of pip's nvidia packages, by path,
RTLD_GLOBAL) before ``import mxnet``. Nothing here imports numpy or mxnet.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from kernelmap.errors import ParseError

from . import cuda11, fatbin

ENV_HOME = "KERNELMAP_MXNET_HOME"
ENV_TREE = "KERNELMAP_MXNET_TREE"  # set by the runner in an MXNet worker's environment
INFO_FILE = "kernelmap-mxnet.json"
LIB_RELPATH = Path("python") / "mxnet" / "libmxnet.so"


def mxnet_home() -> Path:
    """Where built trees live: ``$KERNELMAP_MXNET_HOME`` or ``~/.cache/kernelmap/mxnet``."""
    env = os.environ.get(ENV_HOME)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kernelmap" / "mxnet"


def tree_name(version: str, sm: int) -> str:
    return f"{version}-sm{sm}"


@dataclass(frozen=True)
class BuiltTree:
    path: Path
    info: dict = field(default_factory=dict, compare=False)

    @property
    def lib(self) -> Path:
        return self.path / LIB_RELPATH

    @property
    def python_dir(self) -> Path:
        return self.path / "python"


def find_trees(home: Path | None = None) -> list[BuiltTree]:
    """Complete built trees under ``home`` (a tree counts once its info file and library exist;
    the builder writes both before it renames the tree into place). Hidden names are work dirs."""
    home = mxnet_home() if home is None else home
    if not home.is_dir():
        return []
    trees = []
    for d in sorted(home.iterdir()):
        if d.name.startswith(".") or not d.is_dir():
            continue
        info_path = d / INFO_FILE
        if not info_path.is_file() or not (d / LIB_RELPATH).is_file():
            continue
        try:
            info = json.loads(info_path.read_text())
        except (OSError, ValueError) as exc:
            raise ParseError(str(info_path), f"unreadable build info: {exc}") from None
        trees.append(BuiltTree(d, info))
    return trees


@functools.lru_cache(maxsize=8)
def _archs(lib: str, mtime_ns: int, size: int) -> fatbin.FatbinSummary:
    return fatbin.read_archs(lib)


def archs(tree: BuiltTree) -> fatbin.FatbinSummary:
    st = tree.lib.stat()
    return _archs(str(tree.lib), st.st_mtime_ns, st.st_size)


def find_for_sm(sm: int, home: Path | None = None) -> tuple[BuiltTree | None, str]:
    """The first built tree whose library holds code for ``sm``, and what was found, in words."""
    trees = find_trees(home)
    if not trees:
        return None, f"no MXNet built by `kernelmap build-mxnet` in {mxnet_home() if home is None else home}"
    seen = []
    for tree in trees:
        summary = archs(tree)
        if summary.runs_on(sm):
            return tree, f"{tree.lib} holds code for {summary.describe()}"
        seen.append(f"{tree.path.name}: {summary.describe()}")
    return None, f"no built MXNet has code for sm_{sm} ({'; '.join(seen)})"


# the one command that makes MXNet run on a GPU its wheels have no code for, with its measured time
BUILD_HINT = ("kernelmap build-mxnet, about 16 min on 16 cores and 35 min on 2; cached under "
              "~/.cache/kernelmap/mxnet, an interrupted build resumes")


def gpu_verdict(compute_capability: tuple[int, int], home: Path | None = None) -> tuple[bool, str]:
    """Whether MXNet can run kernels on this GPU: a built tree with code for it first, else the
    mxnet-cu11x wheel's verdict (sm <= 86, CUDA 11 preload), else no (MXNet runs on the CPU)."""
    major, minor = (int(v) for v in compute_capability)
    sm = major * 10 + minor
    tree, why = find_for_sm(sm, home)
    if tree is not None:
        return True, f"sm_{sm}: MXNet built by kernelmap build-mxnet: {why}"
    ok, message = cuda11.gpu_verdict((major, minor))
    if ok:
        return ok, message
    return False, f"{message}; {why} (build one: {BUILD_HINT})"


def loaded_verdict(compute_capability: tuple[int, int], tree_path: str | os.PathLike | None) -> tuple[bool, str]:
    """Whether the MXNet loaded in this process can run kernels on this GPU: the built tree at
    ``tree_path`` (``ENV_TREE``) judged by its own library's archs, never by the other trees in its
    home; without a tree, the mxnet-cu11x wheel's verdict."""
    major, minor = (int(v) for v in compute_capability)
    if not tree_path:
        return cuda11.gpu_verdict((major, minor))
    sm = major * 10 + minor
    tree = BuiltTree(Path(tree_path))
    summary = fatbin.read_archs(tree.lib) if tree.lib.is_file() else None
    if summary is not None and summary.runs_on(sm):
        return True, f"sm_{sm}: MXNet built by kernelmap build-mxnet: {tree.lib} holds code for {summary.describe()}"
    has = f"holds code for {summary.describe()}" if summary is not None else "does not exist"
    return False, (f"the loaded MXNet tree {tree.path} has no code for this GPU (sm_{sm}): {tree.lib} {has} "
                   f"(build one for it: kernelmap build-mxnet --arch {sm})")


def tree_for_gpu(compute_capability: str | None, home: Path | None = None) -> BuiltTree | None:
    """The built tree to use on a GPU of compute capability ``"9.0"``, or None."""
    if not compute_capability:
        return None
    major, minor = compute_capability.split(".")
    return find_for_sm(int(major) * 10 + int(minor), home)[0]


def worker_env(tree: BuiltTree, base: dict[str, str] | None = None) -> dict[str, str]:
    """The entries to add to a subprocess's environment (``base``, default ours) so that it
    imports MXNet from ``tree``: its python/ first on PYTHONPATH (so its numpy < 2 wins where it
    has one) and ``ENV_TREE`` for ``preload``."""
    old = (os.environ if base is None else base).get("PYTHONPATH")
    return {"PYTHONPATH": str(tree.python_dir) + (os.pathsep + old if old else ""), ENV_TREE: str(tree.path)}


# --- loading ------------------------------------------------------------------------------------
_LOADED: dict[str, ctypes.CDLL] = {}


DRIVER = "libcuda.so.1"


@dataclass
class Preloaded:
    tree: str
    loaded: dict[str, str] = field(default_factory=dict)  # soname -> file
    driver_missing: bool = False  # no CUDA driver (libcuda.so.1) could be loaded

    @property
    def active(self) -> bool:
        return bool(self.loaded)

    def describe(self) -> str:
        return (f"MXNet built tree {self.tree}; preloaded {len(self.loaded)} libraries (CUDA, cuDNN, BLAS)"
                + ("; no CUDA driver (libcuda.so.1) found" if self.driver_missing else ""))


def runtime_lib_dirs(tree: BuiltTree) -> list[Path]:
    """Directories to load the tree's libraries from: its lib/, then those recorded at build time
    (pip's nvidia CUDA/cuDNN lib dirs), then the same components under today's nvidia roots."""
    dirs = [tree.path / "lib"]
    dirs += [Path(d) for d in tree.info.get("runtime_lib_dirs", [])]
    for root in cuda11.nvidia_roots():
        dirs += sorted(Path(p) for p in glob.glob(str(root / "*" / "lib")))
    seen: dict[str, Path] = {}
    for d in dirs:
        if d.is_dir():
            seen.setdefault(str(d.resolve()), d)
    return list(seen.values())


def library_candidates(tree: BuiltTree, soname: str, dirs: list[Path]) -> list[Path]:
    """The files ``soname`` may be loaded from, best first: ``dirs``' order, except that cuDNN comes first from
    the lib/ beside the cuDNN header the tree was compiled against (its build info's ``cudnn_header``). On the
    2-GPU H200s a system cuDNN 9.14 in /usr/local/cuda-13.0/lib64, the first of the build's recorded dirs, was
    loaded under a tree compiled against pip's cuDNN 9.19 (MXNet: "cuDNN lib mismatch: linked-against version
    91400 != compiled-against version 91900"), and the workers crashed at their first GPU operator. A tree built
    on another machine (the 2-core VM's) names a header that is not here: then pip's cuDNN (``nvidia/cudnn/lib``,
    the package it was compiled against) comes before the system's."""
    hits = [d / soname for d in dirs if (d / soname).exists()]
    header = tree.info.get("cudnn_header")
    if soname.startswith("libcudnn") and header:
        own = Path(header).parent.parent / "lib" / soname
        if own.exists():
            hits = [own] + [h for h in hits if h.resolve() != own.resolve()]
        else:
            pip = [h for h in hits if h.parent.parts[-3:] == ("nvidia", "cudnn", "lib")]
            hits = pip + [h for h in hits if h not in pip]
    return hits


def tree_patches(tree_path: str | os.PathLike | None) -> list[str]:
    """The patches a built tree was built with (its build info), [] where there is no tree or no info."""
    if not tree_path:
        return []
    try:
        return list(json.loads((Path(tree_path) / INFO_FILE).read_text()).get("patches", []))
    except (OSError, ValueError):
        return []


def preload(tree_path: str | os.PathLike) -> Preloaded:
    """Load what the tree's libmxnet.so needs, by path and RTLD_GLOBAL, before ``import mxnet``.

    The sonames come from the build info (``preload``: libmxnet.so's DT_NEEDED entries that are not
    system libraries). cuDNN 9 finds its sub-libraries itself (libcudnn.so.9 has RPATH $ORIGIN);
    NVRTC's builtins library, which it dlopens by name, is loaded from beside libnvrtc. A soname
    found nowhere raises ``OSError`` naming it: a broken install must not look like a CPU one.
    """
    tree = BuiltTree(Path(tree_path), json.loads((Path(tree_path) / INFO_FILE).read_text()))
    dirs = runtime_lib_dirs(tree)
    wanted = list(tree.info.get("preload", []))
    result = Preloaded(str(tree.path))
    # libmxnet.so calls the driver API (cuLaunchKernel... for its run-time compiled fused kernels). A
    # tree built on a machine without a driver links an empty libcuda stub, which the linker drops
    # (--as-needed), so no DT_NEEDED names libcuda.so.1 and those symbols bind only to a driver that is
    # already loaded: load it first, globally, from the loader's search path. Where there is none (a
    # machine without a GPU) the import of mxnet then names the first such symbol.
    if DRIVER not in _LOADED:
        try:
            _LOADED[DRIVER] = ctypes.CDLL(DRIVER, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            result.driver_missing = True
    if DRIVER in _LOADED:
        result.loaded[DRIVER] = DRIVER
    pending = []
    for soname in wanted:
        hits = library_candidates(tree, soname, dirs)
        if not hits:
            raise OSError(f"{soname}: needed by {tree.lib} and found in none of {', '.join(map(str, dirs))}")
        pending.append(hits[0])
        if soname.startswith("libnvrtc.so"):
            pending += sorted(p for p in hits[0].parent.glob("libnvrtc-builtins.so.*") if ".alt." not in p.name)
    # Load in rounds: a library whose own dependency is not loaded yet fails and is retried later.
    while pending:
        failed, last_error = [], None
        for path in pending:
            if path.name in _LOADED:
                result.loaded[path.name] = str(path)
                continue
            try:
                _LOADED[path.name] = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
                result.loaded[path.name] = str(path)
            except OSError as exc:
                failed.append(path)
                last_error = exc
        if len(failed) == len(pending):
            raise OSError(f"cannot load {failed[0]}: {last_error}")
        pending = failed
    return result


def library_versions() -> dict[str, int | None]:
    """Versions reported by the preloaded CUDA runtime, cuDNN and cuBLAS (None where not loaded)."""
    out: dict[str, int | None] = {"cudart": None, "cudnn": None, "cublas": None}
    for name, lib in _LOADED.items():
        if name.startswith("libcudart.so"):
            v = ctypes.c_int()
            if lib.cudaRuntimeGetVersion(ctypes.byref(v)) == 0:
                out["cudart"] = v.value
        elif name.startswith("libcudnn.so"):
            lib.cudnnGetVersion.restype = ctypes.c_size_t
            out["cudnn"] = int(lib.cudnnGetVersion())
        elif name.startswith("libcublas.so"):
            parts = []
            for prop in (0, 1, 2):
                v = ctypes.c_int()
                if lib.cublasGetProperty(prop, ctypes.byref(v)) != 0:
                    break
                parts.append(v.value)
            if len(parts) == 3:
                out["cublas"] = parts[0] * 10000 + parts[1] * 100 + parts[2]
    return out


def ship_libraries(files: list[Path], dest: Path) -> None:
    """Copy the runtime libraries into ``dest``: each distinct file once, every other name of it (the system's
    ``libopenblas.so``, ``.so.0`` and ``-r0.3.21.so`` are one file) a relative link to that copy. Copied as three
    files, OpenBLAS alone took 110 MB of the tree and 14 MB of its xz (49 -> 35 MB with the links)."""
    dest.mkdir()
    first: dict[str, str] = {}
    for f in sorted(files, key=lambda p: (p.is_symlink(), p.name)):  # a real file's own name first
        same = hashlib.sha256(f.read_bytes()).hexdigest()  # by content: a deb unpacked may hold copies, not links
        if same in first:
            (dest / f.name).symlink_to(first[same])
        else:
            shutil.copy2(f, dest / f.name, follow_symlinks=True)
            first[same] = f.name
