"""Shared fixtures.

Frameworks are never imported into the pytest process: torch and mxnet must not share a process
(see docs/ARCHITECTURE.md), so framework code runs in subprocesses (``run_framework``), and
``require_framework`` skips a test cleanly when ``import <framework>`` fails in a subprocess
(``pytest.importorskip`` would import it here).
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kernelmap import frameworks  # noqa: E402  (descriptors import no framework)

FRAMEWORK_MODULES = {name: ", ".join(d.import_names) for name, d in frameworks.REGISTRY.items()}


@pytest.fixture(scope="session", autouse=True)
def _kernelmap_cache(tmp_path_factory):
    """Keep data layouts out of ~/.cache: KERNELMAP_CACHE points at a session tmp dir
    (inherited by subprocesses)."""
    yield from _env_dir("KERNELMAP_CACHE", tmp_path_factory.mktemp("kernelmap-cache"))


def _env_dir(name: str, path: Path):
    """Set ``name`` to ``path`` (inherited by subprocesses) for the session, then restore it."""
    old = os.environ.get(name)
    os.environ[name] = str(path)
    yield path
    if old is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = old


@pytest.fixture(scope="session", autouse=True)
def _no_built_mxnet_without_gpu(tmp_path_factory):
    """Without a GPU, an MXNet tree that `kernelmap build-mxnet` installed on this machine (it needs
    no GPU to build) must not change what the CPU tests see: KERNELMAP_MXNET_HOME points at an
    empty dir. On a GPU machine the tree is what its GPU tests run."""
    if shutil.which("nvidia-smi") is not None:
        yield None
        return
    yield from _env_dir("KERNELMAP_MXNET_HOME", tmp_path_factory.mktemp("mxnet-home"))


# --- framework subprocesses ----------------------------------------------------------------
_IMPORTABLE: dict[str, bool] = {}  # framework -> a subprocess imported it (set by a successful run)


@functools.cache
def _import_error(framework: str) -> str | None:
    python = frameworks.get(framework).python() or sys.executable  # its own environment where it has one
    proc = subprocess.run([python, "-c", f"import {FRAMEWORK_MODULES[framework]}"], capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    return (proc.stderr.strip().splitlines() or ["unknown error"])[-1]


def require_framework(framework: str) -> None:
    """Skip the calling test when ``framework`` cannot be imported (checked in a subprocess,
    unless a framework subprocess of this session already ran)."""
    if _IMPORTABLE.get(framework):
        return
    error = _import_error(framework)
    if error is not None:
        pytest.skip(f"{framework} not importable: {error}")


def run_framework(framework: str, argv: list[str], timeout: float = 300) -> dict:
    """Run ``python ARGV...`` for ``framework``; it must print one JSON object as its last stdout
    line, which is returned. It fails the test with stderr, or skips it when the framework
    itself cannot be imported."""
    proc = subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
    )
    if proc.returncode != 0:
        require_framework(framework)  # skips if the framework is the problem
        pytest.fail(f"{framework} subprocess failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    _IMPORTABLE[framework] = True
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def framework_report(idx_dir_gz, idx_dir_raw):
    """``get(fw)``: tests/framework_probe.py's report for ``fw``, one subprocess per framework per
    session (imports dominate the suite's time). Cases: the small IDX files gzipped and raw, and
    the installed Fashion-MNIST when there is one (``get.fashion`` is its DataInfo or None)."""
    from kernelmap.frameworks import data, spec

    from kernelmap.errors import KernelmapError

    cases = {"gz": [str(idx_dir_gz), 32, 96], "raw": [str(idx_dir_raw), 32, 96]}
    try:
        fashion = data.resolve_data(spec.TrainConfig(data="fashion-mnist"))
        cases["fashion"] = ["fashion-mnist", 1000, 3000]
    except KernelmapError:
        fashion = None
    probe = str(Path(__file__).with_name("framework_probe.py"))
    arg = json.dumps({"idx": str(idx_dir_gz), "cases": cases})
    cache: dict = {}

    def get(fw: str) -> dict:
        if fw not in cache:
            cache[fw] = run_framework(fw, [probe, fw, arg])
        return cache[fw]

    get.fashion = fashion
    return get


# --- MNIST-format IDX files written by the tests ---------------------------------------------
def write_idx(directory: Path, split: str, images: np.ndarray, labels: np.ndarray, gz: bool) -> None:
    """Write ``images`` (N, 28, 28) uint8 and ``labels`` (N,) as the IDX pair of ``split``."""
    prefix = "train" if split == "train" else "t10k"
    opener = gzip.open if gz else open
    suffix = ".gz" if gz else ""
    directory.mkdir(parents=True, exist_ok=True)
    with opener(directory / f"{prefix}-images-idx3-ubyte{suffix}", "wb") as fh:
        fh.write(struct.pack(">IIII", 2051, len(images), 28, 28))
        fh.write(np.ascontiguousarray(images, dtype=np.uint8).tobytes())
    with opener(directory / f"{prefix}-labels-idx1-ubyte{suffix}", "wb") as fh:
        fh.write(struct.pack(">II", 2049, len(labels)))
        fh.write(np.ascontiguousarray(labels, dtype=np.uint8).tobytes())


SMALL_SIZES = {"train": 96, "test": 40}


@pytest.fixture(scope="session")
def small_idx_arrays() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """split -> (images (N, 28, 28) uint8, labels (N,) uint8): small, deterministic, learnable."""
    rng = np.random.default_rng(1234)
    out = {}
    for split, n in SMALL_SIZES.items():
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = rng.integers(0, 100, (n, 28, 28)).astype(np.uint8)
        for i, label in enumerate(labels):
            images[i, :, 2 * label : 2 * label + 6] += 150  # a class-dependent vertical band
        out[split] = (images, labels)
    return out


def _idx_dir(tmp_path_factory, arrays, gz: bool) -> Path:
    directory = tmp_path_factory.mktemp("idx-gz" if gz else "idx-raw")
    for split, (images, labels) in arrays.items():
        write_idx(directory, split, images, labels, gz)
    return directory


@pytest.fixture(scope="session")
def idx_dir_gz(tmp_path_factory, small_idx_arrays) -> Path:
    """A directory of the four gzipped IDX files of ``small_idx_arrays``."""
    return _idx_dir(tmp_path_factory, small_idx_arrays, gz=True)


@pytest.fixture(scope="session")
def idx_dir_raw(tmp_path_factory, small_idx_arrays) -> Path:
    """A directory of the four uncompressed IDX files of ``small_idx_arrays``."""
    return _idx_dir(tmp_path_factory, small_idx_arrays, gz=False)


# --- markers: gpu / mxnet skip cleanly where the machine lacks them (kernelmap run/doctor tests) ---
@functools.cache
def _gpu_problem() -> str | None:
    """Why there is no usable NVIDIA GPU here (framework-free: nvidia-smi / NVML), or None."""
    from kernelmap import gpuinfo

    report = gpuinfo.query()
    return None if report.gpus else (report.problem or "no NVIDIA GPU found")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("gpu") is not None and _gpu_problem() is not None:
            item.add_marker(pytest.mark.skip(reason=f"needs a CUDA GPU: {_gpu_problem()}"))
        if item.get_closest_marker("mxnet") is not None and _import_error("mxnet") is not None:
            item.add_marker(pytest.mark.skip(reason=f"mxnet not importable: {_import_error('mxnet')}"))


def gpu_run_dir(d: Path) -> int:
    """A run directory assembled from the real H200 fixtures (one PyTorch bs-64 run: Kineto trace,
    cuDNN/cuBLAS/cuBLASLt logs, nsys export) with the pass step counts the recording had."""
    import shutil

    data = Path(__file__).parent / "data"
    info = json.loads((data / "gpu_fixtures.json").read_text())
    bs = info["batch_size"]
    b = d / "pytorch" / f"bs{bs}"
    b.mkdir(parents=True)
    shutil.copy(data / "gpu_kineto.json.gz", b / "trace.json.gz")
    for name in ("cudnn", "cublas", "cublaslt"):
        (b / f"{name}.log").write_bytes(gzip.decompress((data / f"gpu_{name}.log.gz").read_bytes()))
    (b / "nsys.sqlite").write_bytes(gzip.decompress((data / "gpu_nsys.sqlite.gz").read_bytes()))
    (d / "manifest.json").write_text(json.dumps({"gpu": info["gpu"], "frameworks": {"pytorch": {
        "device_requested": "gpu", "device": "gpu", "device_note": None, "versions": info["versions"],
        "skipped": False}}}))
    (d / "results.json").write_text(json.dumps([{"framework": "pytorch", "batch_size": bs, "device": "gpu",
                                                 "passes": info["steps"]}]))
    return bs


def report(*argv: str) -> int:
    """``kernelmap report ARGV`` through the module's own parser (as kernelmap.cli dispatches it)."""
    import argparse

    from kernelmap.reports import cli as report_cli

    parser = argparse.ArgumentParser()
    report_cli.add_arguments(parser)
    return report_cli.main(parser.parse_args(argv))


@functools.cache
def noxfile_module():
    """The checkout's noxfile as a module, loaded once per test session: nox warns (and will refuse)
    when a noxfile's sessions are registered twice."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "noxfile.py"
    spec = importlib.util.spec_from_file_location("_kernelmap_noxfile", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@functools.cache
def bench_module(name: str):
    """``benches/<name>.py`` as a module (registered in ``sys.modules``, where a dataclass of it
    looks its module up), loaded once per test session."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benches" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_kernelmap_bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# --- a fake nvidia-smi: the 2x H200 of session 10's GPU job, GPU 1 held by leaked processes ---------------
# free (MiB) as that job's sweep shards read them (GPU 0: 150,109,945,856 bytes; GPU 1: 585,105,408); used: the
# rest of GPU 0's free on an idle card (143,156 MiB); the holders (pids and split) stand in for the leaked JAX worker
FAKE_SMI = r"""#!/bin/sh
case "$*" in
  *compute_cap*) printf '0, NVIDIA H200, 9.0, 580.159.04, 143771\n1, NVIDIA H200, 9.0, 580.159.04, 143771\n' ;;
  *memory.free*) printf '0, GPU-aaa, NVIDIA H200, 143156, 0\n1, GPU-bbb, NVIDIA H200, 558, 142598\n' ;;
  *query-compute-apps*) printf 'GPU-bbb, 8790, pt_main_thread, 35078\nGPU-bbb, 8715, python3.12, 107520\n' ;;
  *) echo "fake nvidia-smi: $*" >&2; exit 9 ;;
esac
"""


def fake_nvidia_smi(where: Path) -> Path:
    """``where/nvidia-smi`` answering kernelmap's three queries (gpuinfo's, options.SMI_GPU_QUERY,
    options.SMI_APPS_QUERY) as ``FAKE_SMI`` says; returns ``where`` (for $PATH)."""
    where.mkdir(parents=True, exist_ok=True)
    smi = where / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    return where
