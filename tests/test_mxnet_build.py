"""`kernelmap build-mxnet` steps that need no GPU, the fatbin reader, and the MXNet-on-this-GPU verdict.

The fatbin fixtures in tests/data are real nvcc 13.0 output of tests/data/cuda_fatbin_fixture.cu:
``cuda_sm90_nvcc13.so`` (``-gencode arch=compute_90,code=sm_90 -shared -cudart shared``) and
``cuda_sm80_sm90_ptx90_nvcc13.so`` (sm_80 and sm_90 cubins plus compute_90 PTX). The patch and
source tests use the probe kit's MXNet 1.9.1 source trimmed into tests/data/mxnet_kit_trim (its
make_fixture.py says what is kept).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from kernelmap.frameworks.case import CaseKey
from kernelmap.frameworks.mxnet import build, built, cuda11, fatbin

from kernelmap import cli, frameworks
from kernelmap.errors import KernelmapError, MissingToolError, ParseError
from kernelmap.run import devices as run_devices

DATA = Path(__file__).parent / "data"
SM90 = DATA / "cuda_sm90_nvcc13.so"
MULTI = DATA / "cuda_sm80_sm90_ptx90_nvcc13.so"
ROOT = Path(__file__).resolve().parent.parent


# The probe kit's MXNet 1.9.1 source (shared/mxnet-sm90/src), trimmed by its make_fixture.py: every file
# a patch touches byte for byte, the other sources as empty files of the same names (what the counts
# and the cmake command read), the OpenBLAS tree's headers and library names
KIT = DATA / "mxnet_kit_trim"


# --- fatbin reader ------------------------------------------------------------------------------
def test_fatbin_sm90_fixture():
    s = fatbin.read_archs(SM90)
    assert s.sm == (90,)
    assert s.ptx == ()
    assert s.counts == {"sm_90": 2}
    assert s.fatbins == 2 and s.entries == 2
    assert s.runs_on(90)
    assert not s.runs_on(86)  # cubins never run on an older arch
    assert not s.runs_on(100)  # nor across majors, and there is no PTX to JIT
    assert s.describe() == "sm_90"


def test_fatbin_multi_arch_fixture():
    s = fatbin.read_archs(MULTI)
    assert s.sm == (80, 90)
    assert s.ptx == (90,)
    assert s.counts == {"sm_80": 2, "sm_90": 2, "compute_90": 1}
    assert s.runs_on(86)  # sm_80 cubin, same major
    assert s.runs_on(100)  # compute_90 PTX is JIT-compiled for newer GPUs
    assert not s.runs_on(75)
    assert s.describe() == "sm_80, sm_90, compute_90 (PTX)"


def test_needed_libraries_of_fixture():
    assert fatbin.needed_libraries(SM90) == ["libcudart.so.13", "libstdc++.so.6", "libgcc_s.so.1", "libc.so.6"]


def test_fatbin_reader_rejects_non_elf(tmp_path):
    f = tmp_path / "notelf.so"
    f.write_bytes(b"hello world, not an ELF file at all" * 4)
    with pytest.raises(ParseError, match=r"notelf\.so: not an ELF file"):
        fatbin.read_archs(f)


def test_fatbin_reader_rejects_missing_file(tmp_path):
    with pytest.raises(ParseError, match=r"nope\.so"):
        fatbin.read_archs(tmp_path / "nope.so")


def _fatbin_section(path: Path) -> tuple[int, int]:
    with open(path, "rb") as fh:
        return fatbin._elf_sections(fh, str(path))[".nv_fatbin"][0]


def test_fatbin_reader_rejects_corrupt_entry_size(tmp_path):
    data = bytearray(SM90.read_bytes())
    off, _size = _fatbin_section(SM90)
    assert data[off:off + 4] == (0xBA55ED50).to_bytes(4, "little")
    # first entry's payload size (offset 16 + 8) made larger than its fatbin
    data[off + 16 + 8:off + 16 + 16] = (10**9).to_bytes(8, "little")
    bad = tmp_path / "bad.so"
    bad.write_bytes(bytes(data))
    with pytest.raises(ParseError, match=r"bad\.so: fatbin entry at offset .* past its fatbin"):
        fatbin.read_archs(bad)


def test_fatbin_reader_rejects_garbage_in_section(tmp_path):
    data = bytearray(SM90.read_bytes())
    off, _size = _fatbin_section(SM90)
    data[off:off + 4] = b"\x01\x02\x03\x04"  # magic destroyed: neither padding nor a fatbin
    bad = tmp_path / "garbage.so"
    bad.write_bytes(bytes(data))
    with pytest.raises(ParseError, match=r"garbage\.so: bytes at offset .* neither padding nor a fatbin"):
        fatbin.read_archs(bad)


def test_fatbin_reader_library_without_device_code():
    import ctypes.util

    libc = ctypes.util.find_library("c")
    path = next((p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6") if os.path.exists(p)), None)
    if path is None:
        pytest.skip(f"no libc.so.6 at the usual paths (find_library says {libc})")
    s = fatbin.read_archs(path)
    assert (s.sm, s.ptx, s.entries) == ((), (), 0)
    assert not s.runs_on(90)


# --- source preparation -------------------------------------------------------------------------
def _fake_mxnet_tar(path: Path, version=(1, 9, 1), drop: str | None = None) -> Path:
    files = {r: b"x\n" for r in build.REQUIRED if r != drop}
    files["include/mxnet/base.h"] = (f"#define MXNET_MAJOR {version[0]}\n#define MXNET_MINOR {version[1]}\n"
                                     f"#define MXNET_PATCH {version[2]}\n").encode()
    with tarfile.open(path, "w:gz") as tf:
        for rel, content in files.items():
            info = tarfile.TarInfo(f"mxnet/{rel}")
            info.size = len(content)
            tf.addfile(info, io.BytesIO(content))
        link = tarfile.TarInfo("mxnet/include/mkldnn")  # dangling link into an uncarried submodule
        link.type = tarfile.SYMTYPE
        link.linkname = "../3rdparty/mkldnn/include"
        tf.addfile(link)
    return path


def test_prepare_source_from_small_tarball(tmp_path):
    tar = _fake_mxnet_tar(tmp_path / "mx.tar.gz")
    root, deps = build.prepare_source(str(tar), tmp_path / "work")
    assert root == tmp_path / "work" / "mxnet"
    assert build.source_version(root) == "1.9.1"
    assert deps is None
    assert not (root / "include" / "mkldnn").is_symlink()  # dangling link removed
    for rel in build.REQUIRED:
        assert (root / rel).exists()


def test_prepare_source_wrong_version(tmp_path):
    tar = _fake_mxnet_tar(tmp_path / "mx.tar.gz", version=(1, 8, 0))
    with pytest.raises(build.BuildError, match=r"^source: .*base\.h: MXNet 1\.8\.0, this recipe is for 1\.9\.1$"):
        build.prepare_source(str(tar), tmp_path / "work")


def test_prepare_source_missing_submodule(tmp_path):
    tar = _fake_mxnet_tar(tmp_path / "mx.tar.gz", drop="3rdparty/dmlc-core/CMakeLists.txt")
    with pytest.raises(build.BuildError, match=r"dmlc-core/CMakeLists\.txt: missing from the MXNet source"):
        build.prepare_source(str(tar), tmp_path / "work")


def test_prepare_source_not_a_tarball(tmp_path):
    f = tmp_path / "junk.tar.gz"
    f.write_bytes(b"not a tar")
    with pytest.raises(build.BuildError, match=r"junk\.tar\.gz: not a tar archive"):
        build.prepare_source(str(f), tmp_path / "work")
    with pytest.raises(build.BuildError, match=r"nothere: no such file or directory"):
        build.prepare_source(str(tmp_path / "nothere"), tmp_path / "work")


@pytest.fixture(scope="module")
def kit_source(tmp_path_factory):
    work = tmp_path_factory.mktemp("kit")
    root, deps = build.prepare_source(str(KIT), work)
    return root, deps


def test_prepare_source_from_kit(kit_source):
    root, deps = kit_source
    assert build.source_version(root) == "1.9.1"
    assert (deps / "usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0").exists()
    assert not [p for p in root.rglob("*") if p.is_symlink() and not p.exists()]
    build.check_operator_sources(root)  # every GPU operator source named by the recipe exists
    # what the estimate counts: the kit's configured build.ninja (patch 0006: EXCLUDED_SOURCE_DIRS and
    # EXCLUDED_SOURCES) has 238 .cc and 30 .cu compile steps for libmxnet (362 .cc without them; 28 .cu before
    # the fp16 operators' amp_cast.cu and all_finite.cu)
    assert build.count_sources(root) == (243, 30)


# --- patches on the real MXNet files --------------------------------------------------------------
def test_patch_files_are_package_data():
    names = [p.name for p in build.patch_files()]
    assert names == ["0001-cxx17-cudnn9-cuda12-graphs-thrust.patch", "0002-python-numpy-py312.patch",
                     "0003-cccl3-mshadow-cuda-namespace.patch", "0004-nvtx3-header-only.patch",
                     "0005-gpu-operator-subset.patch", "0006-cpu-source-subset.patch",
                     "0007-profiler-nvtx-ranges-end.patch", "0008-cudnn-algo-file-shared-by-processes.patch"]


@pytest.mark.parametrize("patch", build.patch_files(), ids=lambda p: p.name)
def test_each_patch_dry_runs_on_pristine_source(kit_source, patch):
    root, _ = kit_source
    out = build.apply_patch(root, patch, dry_run=True)
    assert "checking file" in out or "patching file" in out
    assert "FAILED" not in out


def test_apply_patches_then_again_fails_naming_the_patch(kit_source, tmp_path):
    root = tmp_path / "mxnet"
    shutil.copytree(kit_source[0], root, symlinks=True)
    names = build.apply_patches(root)
    assert len(names) == 8
    assert (root / ".kernelmap-patched").read_text().split() == names
    cmake = (root / "CMakeLists.txt").read_text()
    assert "set(CMAKE_CXX_STANDARD 17)" in cmake
    assert 'set(MXNET_CUDA_OPERATOR_SOURCES "" CACHE STRING' in cmake
    assert 'list(FILTER SOURCE EXCLUDE REGEX "/src/${excluded_dir}/")' in cmake
    assert 'list(REMOVE_ITEM SOURCE "${CMAKE_CURRENT_SOURCE_DIR}/src/${excluded_file}")' in cmake
    assert "DMLC_REGISTER_PARAMETER(NumpyBinaryScalarParam);" in (root / "cmake/kernelmap_np_params.cc").read_text()
    assert "template void ElemwiseBinaryOp::DnsCsrDnsOp<mshadow_op::plus>(" in \
        (root / "src/operator/tensor/elemwise_binary_op_basic.cu").read_text()
    # mxnet's import skips the numpy operators left out of the build (it failed on mx.np.all)
    assert "mx_np_op = getattr(mx_np, op_name, None)" in (root / "python/mxnet/numpy_dispatch_protocol.py").read_text()
    assert "except ValueError:  # kernelmap build-mxnet" in (root / "python/mxnet/numpy_op_signature.py").read_text()
    assert 'EXISTS "${CUDAToolkit_INCLUDE_DIRS}/nvtx3/nvToolsExt.h"' in cmake
    assert '#include "nvtx3/nvToolsExt.h"' in (root / "src/profiler/nvtx.h").read_text()
    assert "#define MXNET_RNN_USE_CUDNN 0" in (root / "src/operator/rnn-inl.h").read_text()
    assert "CUDA_VERSION < 12000" in (root / "src/executor/cuda_graphs.h").read_text()
    assert "using namespace mshadow;" not in (root / "src/operator/linalg.h").read_text()
    assert "bool = onp.bool_" in (root / "python/mxnet/numpy/utils.py").read_text()
    assert (root / "python/mxnet/_vershim.py").is_file()
    # patch 0007: an event's and a frame's stop() end their NVTX range; an operator keeps one range
    profiler_h = (root / "src/profiler/profiler.h").read_text()
    assert profiler_h.count("NVTX_ONLY_CODE(if (nvtx_duration_) nvtx_duration_->stop());") == 1
    assert "NVTX_ONLY_CODE(nvtx_duration_.reset());" in profiler_h
    # patch 0008: the cuDNN algorithm registry reads and appends MXNET_CUDNN_ALGO_FILE under a file lock
    algoreg = (root / "src/operator/nn/cudnn/cudnn_algoreg-inl.h").read_text()
    assert 'dmlc::GetEnv("MXNET_CUDNN_ALGO_FILE", std::string())' in algoreg and "flock(fd, LOCK_EX)" in algoreg
    # applied twice: the dry run of the first patch fails, and nothing is changed
    before = (root / "CMakeLists.txt").read_bytes()
    with pytest.raises(build.BuildError) as err:
        build.apply_patches(root)
    msg = str(err.value)
    assert msg.startswith("patch: ") and "0001-cxx17-cudnn9-cuda12-graphs-thrust.patch: does not apply to" in msg
    assert "\n" not in msg
    assert (root / "CMakeLists.txt").read_bytes() == before


def test_cmake_command_names_arch_and_operator_subset(kit_source, tmp_path):
    root, deps = kit_source
    openblas = build.find_openblas(deps)
    if shutil.which("cmake") is None:
        pytest.skip("cmake not installed")
    cmd = build.cmake_command(root, tmp_path / "b", tmp_path / "cu", 90, openblas)
    assert "-DMXNET_CUDA_ARCH=9.0" in cmd
    assert "-DUSE_NVTX=ON" in cmd
    subset = next(c for c in cmd if c.startswith("-DMXNET_CUDA_OPERATOR_SOURCES="))
    assert subset.split("=", 1)[1].split(";") == list(build.GPU_OPERATOR_SOURCES)
    assert "-DMXNET_EXCLUDE_SOURCE_DIRS=operator/numpy;operator/quantization;api/operator/numpy" in cmd
    excluded = next(c for c in cmd if c.startswith("-DMXNET_EXCLUDE_SOURCES=")).split("=", 1)[1].split(";")
    assert len(excluded) == 35 and "operator/convolution_v1.cc" in excluded
    assert all((root / "src" / f).is_file() for f in excluded)  # each names a real file of the source
    assert openblas[1].name == "libopenblas.so" and openblas[2]  # the kit's OpenBLAS is shipped in the tree
    # MXNet links -llapack by name: the linker looks beside OpenBLAS, and the tree ships that LAPACK
    assert f"-DCMAKE_SHARED_LINKER_FLAGS=-L{openblas[1].parent}" in cmd
    assert "liblapack.so.3" in {p.name for p in openblas[2]}


def test_parse_arch():
    assert build.parse_arch("90") == 90
    assert build.parse_arch("sm_90") == 90
    assert build.parse_arch("9.0") == 90
    assert build.parse_arch("sm_90a") == 90
    assert build.parse_arch("12.0") == 120
    with pytest.raises(build.BuildError, match=r"--arch 'hopper'"):
        build.parse_arch("hopper")


def test_cli_bad_arch_is_one_line(capsys):
    rc = cli.main(["build-mxnet", "--arch", "hopper"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == ["kernelmap build-mxnet: error: configure: --arch 'hopper': expected e.g. 90, sm_90 or 9.0"]


def test_cli_missing_source_is_one_line(capsys, tmp_path):
    rc = cli.main(["build-mxnet", "--arch", "90", "--source", str(tmp_path / "nothere")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err == [f"kernelmap build-mxnet: error: source: {tmp_path / 'nothere'}: no such file or directory"]


def test_install_refuses_a_library_without_the_arch(tmp_path):
    (tmp_path / "build").mkdir()
    shutil.copy(SM90, tmp_path / "build" / "libmxnet.so")
    home = tmp_path / "home"
    tc = build.Toolchain(Path("/x/nvcc"), Path("/x"), "13.0", [], [], Path("/x/cudnn.h"))
    with pytest.raises(build.BuildError, match=r"^install: .*libmxnet\.so: holds code for sm_90, not sm_80$"):
        build.install_tree(tmp_path / "src", tmp_path / "build", home, 80, tc, (Path(), Path(), []), None, {})
    assert not home.exists() or not any(home.iterdir())  # nothing half-written in the cache


def test_estimate_scales_with_jobs():
    cpu1, wall1 = build.estimate(100, 10, 1)
    cpu32, wall32 = build.estimate(100, 10, 32)
    assert cpu1 == cpu32 == pytest.approx((100 * build.CPU_S_PER_CC + 10 * build.CPU_S_PER_CU) / 60)
    assert wall32 < wall1


# --- the verdict: built tree first, then the cu11x wheel, then the CPU -------------------------------
def _tree(home: Path, lib: Path, name="1.9.1-sm90") -> Path:
    d = home / name
    (d / "python" / "mxnet").mkdir(parents=True)
    shutil.copy(lib, d / built.LIB_RELPATH)
    (d / built.INFO_FILE).write_text(json.dumps({"version": "1.9.1", "preload": []}))
    return d


def test_verdict_built_tree_for_sm90(tmp_path):
    _tree(tmp_path, SM90)
    ok, msg = built.gpu_verdict((9, 0), tmp_path)
    assert ok
    assert "kernelmap build-mxnet" in msg and "sm_90" in msg and str(tmp_path) in msg


def test_verdict_no_tree_on_sm90_says_cpu(tmp_path):
    ok, msg = built.gpu_verdict((9, 0), tmp_path)
    assert not ok
    assert "MXNet runs on the CPU here" in msg and "build one: kernelmap build-mxnet" in msg


def test_verdict_tree_without_code_for_this_gpu(tmp_path):
    _tree(tmp_path, SM90)
    ok, msg = built.gpu_verdict((10, 0), tmp_path)  # sm_90 cubins, no PTX: not on sm_100
    assert not ok
    assert "no built MXNet has code for sm_100 (1.9.1-sm90: sm_90)" in msg


def test_verdict_sm80_keeps_the_cu11_wheel_path(tmp_path):
    ok, msg = built.gpu_verdict((8, 0), tmp_path)
    assert ok and "cu11x wheel carries machine code" in msg


def test_loaded_tree_is_judged_by_its_own_library(tmp_path):
    """The worker judges the tree it loaded (ENV_TREE), not the trees beside it in its home: a tree for
    sm_90 only, loaded on sm_100 beside one with compute_90 PTX, or on sm_80 where the cu11x wheel
    would do, cannot run there, and the message names the tree and the GPU's sm."""
    loaded = _tree(tmp_path, SM90)
    _tree(tmp_path, MULTI, name="1.9.1-sm80")  # sm_80 + sm_90 cubins, compute_90 PTX: runs on sm_100
    assert built.gpu_verdict((10, 0), tmp_path)[0] and built.gpu_verdict((8, 0), tmp_path)[0]
    for cc, sm in (((10, 0), 100), ((8, 0), 80)):
        ok, msg = built.loaded_verdict(cc, str(loaded))
        assert not ok
        assert f"the loaded MXNet tree {loaded} has no code for this GPU (sm_{sm})" in msg
        assert f"{loaded / built.LIB_RELPATH} holds code for sm_90" in msg and f"--arch {sm}" in msg
    ok, msg = built.loaded_verdict((9, 0), str(loaded))
    assert ok and str(loaded / built.LIB_RELPATH) in msg
    assert built.loaded_verdict((10, 0), str(tmp_path / "1.9.1-sm80"))[0]  # PTX for compute_90
    (loaded / built.LIB_RELPATH).unlink()
    ok, msg = built.loaded_verdict((9, 0), str(loaded))
    assert not ok and f"{loaded / built.LIB_RELPATH} does not exist" in msg
    # no built tree loaded: the cu11x wheel's verdict
    assert built.loaded_verdict((8, 0), None) == cuda11.gpu_verdict((8, 0))
    assert built.loaded_verdict((9, 0), None) == cuda11.gpu_verdict((9, 0))


def test_mxnet_worker_judges_the_tree_it_loaded():
    """workload.py imports mxnet (not here): its GPU check is loaded_verdict of the tree it loaded."""
    source = (ROOT / "frameworks" / "mxnet" / "workload.py").read_text()
    assert "built.loaded_verdict(self.compute_capability, BUILT_TREE)" in source
    assert "gpu_verdict(" not in source


def test_partial_trees_are_ignored(tmp_path):
    d = _tree(tmp_path, SM90, name=".1.9.1-sm90.partial-abc")
    assert d.exists()
    assert built.find_trees(tmp_path) == []
    ok, _ = built.gpu_verdict((9, 0), tmp_path)
    assert not ok


def test_doctor_and_runner_use_the_built_tree(tmp_path, monkeypatch):
    tree = _tree(tmp_path, SM90)
    monkeypatch.setenv(built.ENV_HOME, str(tmp_path))
    ok, msg = built.gpu_verdict((9, 0))
    assert ok and str(tree / built.LIB_RELPATH) in msg
    env = frameworks.get("mxnet").worker_env("9.0")
    assert env[built.ENV_TREE] == str(tree)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(tree / "python")
    probe = {"installed": True, "cuda_build": True, "num_gpus": 2, "version": "1.9.1"}
    d = run_devices.decide_device("mxnet", "gpu", probe, "9.0")
    assert (d.device, d.note) == ("gpu", None)
    monkeypatch.setenv(built.ENV_HOME, str(tmp_path / "empty"))
    d = run_devices.decide_device("mxnet", "gpu", probe, "9.0")
    assert d.device == "cpu" and "MXNet runs on the CPU here" in d.note
    assert frameworks.get("mxnet").worker_env("9.0") is None


def test_libs_env_cudnn9_for_built_mxnet(tmp_path):
    tree_env = {built.ENV_TREE: str(tmp_path)}
    assert run_devices.libs_env("gpu", tmp_path, "mxnet", tree_env)["CUDNN_LOGLEVEL_DBG"] == "3"
    assert "CUDNN_LOGLEVEL_DBG" not in run_devices.libs_env("gpu", tmp_path, "mxnet")
    assert run_devices.libs_env("gpu", tmp_path, "mxnet")["CUDNN_LOGINFO_DBG"] == "1"


def test_preload_names_a_missing_library(tmp_path):
    tree = _tree(tmp_path, SM90)
    (tree / built.INFO_FILE).write_text(json.dumps({"preload": ["libdoesnotexist.so.42"], "runtime_lib_dirs": []}))
    with pytest.raises(OSError, match=r"libdoesnotexist\.so\.42: needed by .*libmxnet\.so and found in none of"):
        built.preload(tree)


def test_build_error_is_a_kernelmap_error():
    assert issubclass(build.BuildError, KernelmapError)


def test_ensure_libcuda_makes_a_stub_without_driver(tmp_path, monkeypatch):
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    monkeypatch.setattr(build, "driver_library", lambda: None)
    root = tmp_path / "curoot"
    (root / "lib64").mkdir(parents=True)
    tc = build.Toolchain(Path("/x/nvcc"), tmp_path / "cuda", "13.0", [], [], Path("/x/cudnn.h"))
    link = build.ensure_libcuda(tc, root)
    assert link == root / "lib64" / "libcuda.so"
    assert link.resolve() == root / "stubs" / "libcuda.so"
    assert fatbin.soname(link) == "libcuda.so.1"  # what the linker records as DT_NEEDED
    assert fatbin.read_archs(link).entries == 0


def test_soname_of_fixture():
    assert fatbin.soname(SM90) is None  # nvcc -shared sets no soname unless asked


# --- on a GPU machine with a built tree (skipped elsewhere) ---------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("hybridize", [False, True], ids=["imperative", "hybridized"])
def test_built_mxnet_trains_on_the_gpu(tmp_path, hybridize):
    import subprocess
    import sys

    from kernelmap import gpuinfo

    gpus = gpuinfo.query()
    cc = gpus.gpus[0].compute_capability if gpus.gpus else None
    if built.tree_for_gpu(cc) is None:
        pytest.skip(f"no MXNet built for this GPU in {built.mxnet_home()} (kernelmap build-mxnet)")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "kernelmap.cli", "run", "--framework", "mxnet", "--device", "gpu", "--steps", "20",
           "--batch-size", "64", "--data", "synthetic", "--out", str(out)] + (["--hybridize"] if hybridize else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (entry,) = json.loads((out / "results.json").read_text())
    assert entry["device"] == "gpu" and entry["device_note"] is None
    assert entry["median_step_s"] > 0
    versions = entry["versions"]
    assert versions["built_tree"] == str(built.tree_for_gpu(cc).path)
    assert versions["cuda_enabled"] and versions["cudnn_enabled"]
    assert versions["cudnn"] >= 90000  # cuDNN 9, reported by the preloaded library itself


def test_preload_real_cuda13_libraries_by_soname(tmp_path):
    """preload finds CUDA 13 / cuDNN 9 under pip's nvidia packages and the libraries report versions."""
    roots = cuda11.nvidia_roots()
    if not any((r / "cu13" / "lib" / "libcudart.so.13").exists() for r in roots) or \
            not any((r / "cudnn" / "lib" / "libcudnn.so.9").exists() for r in roots):
        pytest.skip(f"no nvidia cu13 + cudnn 9 pip packages under {roots}")
    tree = _tree(tmp_path, SM90)
    wanted = ["libcudart.so.13", "libcublasLt.so.13", "libcublas.so.13", "libnvrtc.so.13", "libcudnn.so.9"]
    (tree / built.INFO_FILE).write_text(json.dumps({"preload": wanted, "runtime_lib_dirs": []}))
    got = built.preload(tree)
    assert set(wanted) <= set(got.loaded)
    assert any(name.startswith("libnvrtc-builtins.so.") for name in got.loaded)
    versions = built.library_versions()
    assert versions["cudart"] // 1000 == 13  # e.g. 13000
    assert versions["cudnn"] // 10000 == 9  # e.g. 92400
    assert versions["cublas"] // 10000 == 13


def _cu13_lib_dir() -> Path | None:
    return next((r / "cu13" / "lib" for r in cuda11.nvidia_roots() if (r / "cu13" / "lib" / "libcudart.so.13").exists()),
                None)


def test_unresolved_symbols_of_real_cuda_fixture(tmp_path):
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) not installed")
    cu13 = _cu13_lib_dir()
    if cu13 is None:
        pytest.skip("no nvidia cu13 pip package (libcudart.so.13)")
    tc = build.Toolchain(Path("/x/nvcc"), tmp_path, "13.0", [], [cu13], Path("/x/cudnn.h"))
    assert build.unresolved_symbols(SM90, tmp_path, tc) == []  # __cudaRegisterFatBinary... from cudart


@pytest.mark.skipif(not any(Path(d, "ldconfig").exists() for d in ("/sbin", "/usr/sbin")),
                    reason="no ldconfig in /sbin or /usr/sbin")
def test_loader_cache_found_off_a_users_path(monkeypatch):
    """A non-root user's PATH on Debian has no /sbin, where ldconfig lives."""
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
    assert "libc.so.6" in build.loader_cache()


def test_missing_ldconfig_is_named_not_a_missing_libc(monkeypatch, tmp_path):
    """Without ldconfig every system library looked missing ("needs libc.so.6, found in none of its
    library dirs"): the error names ldconfig and where it was looked for."""
    monkeypatch.setenv("PATH", "/nowhere/bin")
    monkeypatch.setattr(build.shutil, "which", lambda *a, **k: None)
    where = r"ldconfig not found \(looked on PATH='/nowhere/bin' and in /usr/sbin:/sbin\)"
    for call in (build.loader_cache, build.driver_library):
        with pytest.raises(MissingToolError, match=where):
            call()
    tc = build.Toolchain(Path("/x/nvcc"), tmp_path, "13.0", [], [], Path("/x/cudnn.h"))
    with pytest.raises(MissingToolError, match=where) as err:
        build.unresolved_symbols(SM90, tmp_path, tc)
    assert err.value.exit_code != 0 and "found in none" not in str(err.value)
    fake = tmp_path / "ldconfig"  # one that fails
    fake.write_text("#!/bin/sh\necho 'ldconfig: cannot read /etc/ld.so.cache' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(build.shutil, "which", lambda *a, **k: str(fake))
    with pytest.raises(MissingToolError, match=r"ldconfig -p exited 1: ldconfig: cannot read /etc/ld.so.cache"):
        build.loader_cache()


def _gpu_job(tmp_path: Path, kit: Path, home: Path, mode: str = "job") -> subprocess.CompletedProcess:
    """benches/gpu_job.sh's job in the foreground with PHASES=mxnet (or its stage mode), the parts in MX_KIT, with
    a python3 that does nothing (no install, no kernelmap, no doctor)."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "python3").write_text("#!/bin/sh\nexit 0\n")
    (fake / "python3").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path), "KERNELMAP_MXNET_HOME": str(home),
           "KERNELMAP_MXPARTS": str(tmp_path / "staged"), "MX_KIT": str(kit), "PHASES": "mxnet",
           "OUT": str(tmp_path / "out")}
    return subprocess.run(["bash", str(ROOT / "benches" / "gpu_job.sh"), mode], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not all(shutil.which(t) for t in ("bash", "xz", "tar")), reason="needs bash, xz and tar")
def test_gpu_job_stops_on_a_carried_tree_that_does_not_unpack(tmp_path):
    kit, home = tmp_path / "kit", tmp_path / "home"
    kit.mkdir()
    (kit / "mxtree.tar.xz.00").write_bytes(b"not xz at all")
    proc = _gpu_job(tmp_path, kit, home)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert f"cannot unpack the carried MXNet tree from {kit}/mxtree.tar.xz.00" in proc.stderr
    assert "the job stops" in proc.stderr and "unpacked the carried tree" not in proc.stdout
    assert (tmp_path / "out" / "DONE").read_text().strip() == "5"  # what the waiting call reports
    assert list(home.iterdir()) == []  # nothing half-unpacked left to pass for a tree


@pytest.mark.skipif(not shutil.which("bash"), reason="needs bash")
def test_gpu_job_without_a_carried_tree_says_mxnet_runs_on_the_cpu(tmp_path):
    kit, home = tmp_path / "kit", tmp_path / "home"
    kit.mkdir()
    proc = _gpu_job(tmp_path, kit, home)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"none carried ({kit}/mxtree.tar.xz.NN): MXNet runs on the CPU, labelled" in proc.stdout
    assert not home.exists() or list(home.iterdir()) == []


def _tree_in_two_parts(tmp_path: Path) -> tuple[Path, bytes, bytes]:
    """A built tree (sm_90 library) as an xz tarball cut in two, as a carry brings it."""
    tree = _tree(tmp_path / "built", SM90)
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        tar.add(tree, arcname=tree.name)
    half = len(data.getvalue()) // 2
    return tree, data.getvalue()[:half], data.getvalue()[half:]


def _parts(folder: Path, parts: dict[str, bytes]) -> Path:
    """FOLDER holding mxtree.tar.xz.NN for each NN: bytes in PARTS."""
    folder.mkdir(exist_ok=True)
    for number, data in parts.items():
        (folder / f"mxtree.tar.xz.{number}").write_bytes(data)
    return folder


def _assert_unpacked(proc: subprocess.CompletedProcess, home: Path, tree: Path) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"unpacked the carried tree: {home / tree.name}" in proc.stdout, proc.stdout + proc.stderr
    assert [p.name for p in home.iterdir()] == [tree.name]
    assert (home / tree.name / built.LIB_RELPATH).read_bytes() == SM90.read_bytes()


NEEDS_XZ = pytest.mark.skipif(not all(shutil.which(t) for t in ("bash", "xz", "tar")), reason="needs bash, xz and tar")


@NEEDS_XZ
def test_gpu_job_unpacks_a_carried_tree_in_parts(tmp_path):
    tree, part0, part1 = _tree_in_two_parts(tmp_path)
    kit = _parts(tmp_path / "kit", {"00": part0, "01": part1})
    _assert_unpacked(_gpu_job(tmp_path, kit, tmp_path / "home"), tmp_path / "home", tree)


@NEEDS_XZ
def test_gpu_job_joins_parts_staged_by_an_earlier_call(tmp_path):
    """A tree too big for one call's carry: call 1 stages part 00, call 2 carries part 01 and unpacks both."""
    tree, part0, part1 = _tree_in_two_parts(tmp_path)
    home = tmp_path / "home"
    staged = _gpu_job(tmp_path, _parts(tmp_path / "kit1", {"00": part0}), home, mode="stage")
    assert staged.returncode == 0, staged.stdout + staged.stderr
    assert not home.exists() or list(home.iterdir()) == []  # staging unpacks nothing
    _assert_unpacked(_gpu_job(tmp_path, _parts(tmp_path / "kit2", {"01": part1}), home), home, tree)


@NEEDS_XZ
def test_gpu_job_takes_this_calls_part_over_a_staged_one_of_its_number(tmp_path):
    """A part staged by an earlier call (here a stale one) and this call's part of the same number: this call's."""
    tree, part0, part1 = _tree_in_two_parts(tmp_path)
    _parts(tmp_path / "staged", {"00": b"a stale part"})
    kit = _parts(tmp_path / "kit", {"00": part0, "01": part1})
    _assert_unpacked(_gpu_job(tmp_path, kit, tmp_path / "home"), tmp_path / "home", tree)


def test_unresolved_symbols_names_a_missing_one(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or shutil.which("nm") is None:
        pytest.skip("no C compiler or nm")
    import subprocess

    src = tmp_path / "m.c"
    src.write_text("extern int kernelmap_missing_fn(void); extern int cuInit(unsigned);\n"
                   "int f(void) { return kernelmap_missing_fn() + cuInit(0); }\n")
    lib = tmp_path / "libm_test.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    tc = build.Toolchain(Path("/x/nvcc"), tmp_path, "13.0", [], [], Path("/x/cudnn.h"))
    # cuInit is the driver API (bound where the driver is); the other one is a real hole
    assert build.unresolved_symbols(lib, tmp_path, tc) == ["kernelmap_missing_fn"]


def test_unresolved_symbols_names_a_missing_library(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or shutil.which("nm") is None:
        pytest.skip("no C compiler or nm")
    import subprocess

    (tmp_path / "dep.c").write_text("int dep_fn(void) { return 1; }\n")
    (tmp_path / "use.c").write_text("extern int dep_fn(void); int g(void) { return dep_fn(); }\n")
    dep = tmp_path / "libkernelmap_absent.so"
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libkernelmap_absent.so.7", "-o", str(dep),
                    str(tmp_path / "dep.c")], check=True)
    lib = tmp_path / "libuse.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "use.c"), str(dep)], check=True)
    assert "libkernelmap_absent.so.7" in fatbin.needed_libraries(lib)
    tc = build.Toolchain(Path("/x/nvcc"), tmp_path, "13.0", [], [], Path("/x/cudnn.h"))
    with pytest.raises(build.BuildError, match=r"libuse\.so: needs libkernelmap_absent\.so\.7, found in none"):
        build.unresolved_symbols(lib, tmp_path, tc)
    (tmp_path / "lib").mkdir()
    shutil.copy(dep, tmp_path / "lib" / "libkernelmap_absent.so.7")  # shipped in the tree's lib/: resolved
    assert build.unresolved_symbols(lib, tmp_path, tc) == []


def test_prepare_source_from_a_source_directory(kit_source, tmp_path):
    root, _ = kit_source
    copy, deps = build.prepare_source(str(root), tmp_path / "w")
    assert copy == tmp_path / "w" / "mxnet" and deps is None
    assert build.source_version(copy) == "1.9.1"
    assert (copy / "CMakeLists.txt").read_bytes() == (root / "CMakeLists.txt").read_bytes()


def _ninja_project(tmp_path: Path, fail: bool) -> Path:
    d = tmp_path / "b"
    d.mkdir()
    (d / "build.ninja").write_text(
        "rule ok\n  command = touch $out\n"
        "rule bad\n  command = echo 'x.cu(3): error: oops' && false\n"
        "build a.o: ok\nbuild c.o: ok\n"
        + ("build b.o: bad\nbuild mxnet: phony a.o b.o c.o\n" if fail else "build mxnet: phony a.o c.o\n"))
    return d


def test_run_ninja_shows_progress(tmp_path, capsys):
    if shutil.which("ninja") is None:
        pytest.skip("ninja not installed")
    d = _ninja_project(tmp_path, fail=False)
    build.run_ninja(d, 1, d / "ninja.log")
    err = capsys.readouterr().err
    assert "build-mxnet: [2/2] 100%" in err
    assert (d / "a.o").exists() and (d / "c.o").exists()


def test_run_ninja_failure_names_the_object(tmp_path, capsys):
    if shutil.which("ninja") is None:
        pytest.skip("ninja not installed")
    d = _ninja_project(tmp_path, fail=True)
    with pytest.raises(build.BuildError) as err:
        build.run_ninja(d, 1, d / "ninja.log")
    msg = str(err.value)
    assert msg.startswith("build: ") and "b.o" in msg and f"(full log: {d / 'ninja.log'})" in msg
    assert "\n" not in msg
    assert "x.cu(3): error: oops" in (d / "ninja.log").read_text()


def test_preload_loads_the_driver_first_or_says_it_is_missing(tmp_path, monkeypatch):
    """A tree built without a driver has no DT_NEEDED on libcuda.so.1 (the empty stub is dropped by
    --as-needed; seen on the first tree built on the 2-core VM): preload loads the driver globally."""
    tree = _tree(tmp_path, SM90)
    info = json.loads((tree / built.INFO_FILE).read_text())
    info["preload"] = []
    (tree / built.INFO_FILE).write_text(json.dumps(info))
    opened = []

    def no_driver(name, mode=0):
        opened.append((name, mode))
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(built, "_LOADED", {})
    monkeypatch.setattr(built.ctypes, "CDLL", no_driver)
    result = built.preload(tree)
    assert opened == [("libcuda.so.1", built.ctypes.RTLD_GLOBAL)]
    assert result.driver_missing and result.describe().endswith("; no CUDA driver (libcuda.so.1) found")
    monkeypatch.setattr(built.ctypes, "CDLL", lambda name, mode=0: opened.append((name, mode)) or object())
    result = built.preload(tree)
    assert not result.driver_missing and result.loaded == {"libcuda.so.1": "libcuda.so.1"}


def test_scipy_stub_turns_the_host_scipy_into_an_import_error(tmp_path, monkeypatch):
    """The tree's numpy 1.x under a host scipy built for numpy 2.x: MXNet's `try: import scipy.sparse
    except ImportError` must see an ImportError (on the H100 it saw AttributeError: np.long)."""
    (tmp_path / "scipy").mkdir()
    (tmp_path / "scipy" / "__init__.py").write_text(build.SCIPY_STUB)
    proc = subprocess.run([sys.executable, "-c", "try:\n import scipy.sparse as spsp\nexcept ImportError as e:\n"
                           " print('ImportError:', e)"], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ImportError: scipy is hidden from this MXNet tree (kernelmap build-mxnet)")


def test_resume_applies_only_the_patches_added_since(kit_source, tmp_path):
    """A source prepared before a patch joined the project: the resumed build applies the new one
    alone and the stamp lists all of them; a stamp naming a patch the project lost is an error."""
    root = tmp_path / "mxnet"
    shutil.copytree(kit_source[0], root, symlinks=True)
    every = build.patch_files()
    build.apply_patches(root, every[:-1])
    assert build.new_patches(root) == every[-1:]
    assert build.apply_patches(root, build.new_patches(root)) == [every[-1].name]
    assert build.applied_patches(root) == [p.name for p in every]
    assert build.new_patches(root) == []
    (root / build.PATCHED_STAMP).write_text("0000-gone.patch\n" + (root / build.PATCHED_STAMP).read_text())
    with pytest.raises(build.BuildError, match="0000-gone.patch, which the project no longer has"):
        build.new_patches(root)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["imperative", "hybridized"])
def test_built_mxnet_runs_one_set_of_cudnn_algorithms_in_every_pass(tmp_path, mode):
    """Issue 25: at bs 1024 MXNet's autotune chose other conv2 backward algorithms in the libs pass than in
    the nsys pass (each process tuned for itself), so 27-30% of the nsys pass's library-kernel time had no
    call. With patch 0008 the first process of the case writes its choice to the case's algorithms.tsv and
    every later one reads it: one line per conv layer, no cudnnFind in the libs pass's log, and every library
    kernel of every pass linked to its call."""
    import inspect
    import re
    import subprocess
    import sys

    from kernelmap.frameworks import spec
    from kernelmap.frameworks.mxnet import descriptor

    from kernelmap import doctor, gpuinfo, rundir

    # MXNet's libs pass records its kernels with nsys (Workload.libs_trace): without nsys no call can own a
    # kernel there, and the case has no algorithms_shared figure (an H200 run without nsys: KeyError below)
    if doctor.find_tool("nsys") is None:
        pytest.skip("needs nsys (MXNet's libs pass records its kernels with it): source .gpu/nsys-env.sh")
    gpus = gpuinfo.query()
    cc = gpus.gpus[0].compute_capability if gpus.gpus else None
    tree = built.tree_for_gpu(cc)
    if tree is None or descriptor.ALGO_FILE_PATCH not in built.tree_patches(tree.path):
        pytest.skip(f"no MXNet built with {descriptor.ALGO_FILE_PATCH} for this GPU in {built.mxnet_home()}")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "kernelmap.cli", "run", "--framework", "mxnet", "--mode", mode, "--device", "gpu",
           "--profile", "all", "--steps", "10", "--trials", "2", "--max-repeats", "0", "--batch-size", "1024",
           "--data", "synthetic", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    key = CaseKey("mxnet", mode, "fp32", 1, 1024)
    case = rundir.RunDir(out).case(key)
    lines = rundir.RunDir(out).algorithm_file(key).read_text().splitlines()
    keys = [line.split("\t")[0] for line in lines]
    assert all(k.startswith("Convolution|") for k in keys) and len(set(keys)) == len(keys)
    # conv1 and conv2 at the training batch, and again at evaluate()'s batch (its forward is tuned too:
    # on the H200 the file held 4 lines, the first ``...|[1000,32,14,14]|[64,32,3,3]|[1000,64,14,14]|...``)
    eval_bs = inspect.signature(spec.WorkloadBase.evaluate).parameters["batch_size"].default
    batches = sorted({int(re.search(r"\|\[(\d+),", k).group(1)) for k in keys})
    assert batches == sorted({1024, eval_bs}) and len(keys) == 2 * len(batches), keys
    assert "cudnnFindConvolution" not in (case / "cudnn.log").read_text()  # the libs pass read them
    run = json.loads((out / "attribution.json").read_text())["runs"][f"{key}/bs1024"]
    assert run["algorithms_shared"] is True
    for src, b in run["by_source"].items():
        assert b["library_kernels"] > 0 and b["library_kernels_linked"] == b["library_kernels"], (src, b)


def test_shipped_libraries_are_one_copy_each_and_links(tmp_path):
    """OpenBLAS's three names are one file on the build host: the tree holds it once and links the others
    (the tree carried to the H200 held three 36.5 MB copies)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "libopenblasp-r0.3.21.so").write_bytes(b"blas" * 100)
    (src / "libopenblas.so.0").symlink_to("libopenblasp-r0.3.21.so")
    (src / "libopenblas.so").symlink_to(src / "libopenblas.so.0")
    (src / "liblapack.so.3").write_bytes(b"lapack")
    (src / "liblapack.so").write_bytes(b"lapack")  # a second copy, not a link: shipped as a link all the same
    built.ship_libraries(sorted(src.iterdir()), tmp_path / "lib")
    lib = tmp_path / "lib"
    assert sorted(p.name for p in lib.iterdir()) == ["liblapack.so", "liblapack.so.3", "libopenblas.so",
                                                     "libopenblas.so.0", "libopenblasp-r0.3.21.so"]
    assert sorted(p.name for p in lib.iterdir() if not p.is_symlink()) == ["liblapack.so", "libopenblasp-r0.3.21.so"]
    for name, data in (("libopenblas.so", b"blas" * 100), ("libopenblas.so.0", b"blas" * 100),
                       ("liblapack.so.3", b"lapack")):
        link = lib / name
        assert link.is_symlink() and not Path(link.readlink()).is_absolute()  # the tree moves as a whole
        assert link.read_bytes() == data


def test_cudnn_is_loaded_beside_the_header_the_tree_was_compiled_against(tmp_path):
    """The 2-GPU H200s: the build's first recorded lib dir (/usr/local/cuda-13.0/lib64) held a system cuDNN 9.14,
    pip's nvidia/cudnn (whose header compiled the tree) 9.19; the workers loaded 9.14 and crashed. cuDNN now comes
    from beside its header; other libraries keep the recorded order; without that cuDNN, the order as before."""
    system, pip_cudnn = tmp_path / "cuda-13.0" / "lib64", tmp_path / "nvidia" / "cudnn"
    for d in (system, pip_cudnn / "lib", pip_cudnn / "include"):
        d.mkdir(parents=True)
    for f in (system / "libcudnn.so.9", system / "libcudart.so.13", pip_cudnn / "lib" / "libcudnn.so.9",
              pip_cudnn / "lib" / "libcudart.so.13", pip_cudnn / "include" / "cudnn.h"):
        f.write_bytes(b"")
    dirs = [system, pip_cudnn / "lib"]
    tree = built.BuiltTree(tmp_path / "tree", {"cudnn_header": str(pip_cudnn / "include" / "cudnn.h")})
    assert built.library_candidates(tree, "libcudnn.so.9", dirs) == [pip_cudnn / "lib" / "libcudnn.so.9",
                                                                      system / "libcudnn.so.9"]
    assert built.library_candidates(tree, "libcudart.so.13", dirs)[0] == system / "libcudart.so.13"
    (pip_cudnn / "lib" / "libcudnn.so.9").unlink()
    assert built.library_candidates(tree, "libcudnn.so.9", dirs) == [system / "libcudnn.so.9"]
    assert built.library_candidates(built.BuiltTree(tmp_path / "tree", {}), "libcudnn.so.9", dirs) == \
        [system / "libcudnn.so.9"]


def test_a_tree_built_elsewhere_takes_pips_cudnn_before_the_systems(tmp_path):
    """The fp16 tree was built on the 2-core VM: its build info names a cuDNN header of that VM, absent on the GPU
    machine, where /usr/local/cuda-13.0/lib64 may hold a system cuDNN 9.14 first (the 2-GPU H200s). pip's
    nvidia/cudnn/lib, the package the tree was compiled against, comes first; other libraries keep the order."""
    system, pip_lib = tmp_path / "cuda-13.0" / "lib64", tmp_path / "site-packages" / "nvidia" / "cudnn" / "lib"
    for d in (system, pip_lib):
        d.mkdir(parents=True)
    for f in (system / "libcudnn.so.9", system / "libcudart.so.13", pip_lib / "libcudnn.so.9"):
        f.write_bytes(b"")
    dirs = [system, pip_lib]
    elsewhere = built.BuiltTree(tmp_path / "tree", {"cudnn_header": "/nowhere/nvidia/cudnn/include/cudnn.h"})
    assert built.library_candidates(elsewhere, "libcudnn.so.9", dirs) == [pip_lib / "libcudnn.so.9",
                                                                           system / "libcudnn.so.9"]
    assert built.library_candidates(elsewhere, "libcudart.so.13", dirs) == [system / "libcudart.so.13"]
    (pip_lib / "libcudnn.so.9").unlink()  # no pip cuDNN here: the system's, as before
    assert built.library_candidates(elsewhere, "libcudnn.so.9", dirs) == [system / "libcudnn.so.9"]
