"""pytest-benchmark setup: one framework per pytest process (``--framework``).

PyTorch's CUDA 13 and MXNet's CUDA 11 must never share a process, so a pytest invocation
benchmarks exactly one framework: ``pytest benches/bench_train_step.py --framework=mxnet
--benchmark-json=mxnet.json`` (the ``bench`` and ``benchmarks`` nox sessions run it once per framework
and save the frameworks' files as one job: ``kernelmap save-job``). Device
decisions are made as ``kernelmap run`` makes them (``run_devices.decide_device``), before the framework
is imported here.
"""

from __future__ import annotations

import functools
import math
import os

import pytest

from kernelmap import doctor, frameworks, gpuinfo
from kernelmap.history.keys import FRAMEWORK_MODES, MALLOC_INFO, Mode
from kernelmap.run import devices as run_devices

BATCH_SIZES = (64, 256, 1024)

# The CPU thread settings `kernelmap run` gives every worker (run_devices.thread_env: the physical cores), set
# before any framework loads here, so that a step benchmark and its clean pass run with the same threads.
# A variable already set is kept (as the runner's --threads would say it).
# glibc reads timing.ALLOC_ENV's variables at a process's start only: this process applies them with mallopt
# (those not already set) and raises the mmap threshold as every worker does (timing.MMAP_THRESHOLD_RAISED).
MALLOC = run_devices.malloc_settings(run_devices.keep_freed_memory())
for _name, _value in run_devices.thread_env(run_devices.physical_cores()).items():
    os.environ.setdefault(_name, _value)


def pytest_addoption(parser):
    group = parser.getgroup("kernelmap")
    group.addoption("--framework", choices=frameworks.FRAMEWORKS, default="pytorch",
                    help="the one framework this pytest process benchmarks (default pytorch)")
    group.addoption("--mode", action="append", choices=[m.value for m in Mode], default=None,
                    help="execution mode(s) to benchmark (may be repeated; default: every mode of the framework: "
                         + "; ".join(f"{fw}: {', '.join(m.value for m in ms)}" for fw, ms in FRAMEWORK_MODES.items())
                         + ")")
    group.addoption("--bench-batch-size", type=int, action="append", default=None, metavar="N",
                    help=f"batch size(s) to benchmark (may be repeated; default {', '.join(map(str, BATCH_SIZES))}); "
                         "`nox -s bench` passes its run's, so that every key has its clean pass in the same job")
    group.addoption("--bench-data", default="synthetic",
                    help="data of the benchmarked batch: synthetic (default), auto, fashion-mnist, mnist or a "
                         "directory (`nox -s bench` passes its run's --data, default auto)")


def pytest_benchmark_update_json(config, benchmarks, output_json):
    """Every saved benchmark records the malloc settings its process ran with (``extra_info["malloc"]``:
    ``history.keys.MALLOC``), so that ``kernelmap compare`` and the trend say where two saved runs differ in them
    (a step at e894c6d: MXNet's CPU step 65-74 -> 46-50 ms CPU at bs 256, docs/timing.md "Memory")."""
    for b in output_json.get("benchmarks", []):
        b.setdefault("extra_info", {})[MALLOC_INFO] = MALLOC


def bench_batch_sizes(config) -> tuple[int, ...]:
    """The batch sizes this process benchmarks (``--bench-batch-size``, else ``BATCH_SIZES``)."""
    return tuple(config.getoption("--bench-batch-size") or BATCH_SIZES)


def pytest_collect_file(file_path, parent):
    """Collect ``bench_*.py`` here (pyproject's python_files is the default ``test_*.py``)."""
    if parent.session.isinitpath(file_path):
        return None  # named on the command line: pytest collects it already
    if file_path.suffix == ".py" and file_path.name.startswith("bench_"):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


def pytest_configure(config):
    bench_modes(config)  # a --mode the framework lacks is a usage error before collection
    for line in frameworks.deprecation_filters():  # the framework's own deprecations: not on the console
        config.addinivalue_line("filterwarnings", line)


def bench_modes(config) -> tuple[Mode, ...]:
    """The modes this process benchmarks: ``--mode`` (each must be one of the framework's), else all of them."""
    fw = config.getoption("--framework")
    wanted = config.getoption("--mode")
    if not wanted:
        return FRAMEWORK_MODES[fw]
    bad = [m for m in wanted if Mode(m) not in FRAMEWORK_MODES[fw]]
    if bad:
        raise pytest.UsageError(f"--mode {', '.join(bad)}: {fw} runs only "
                                f"{', '.join(m.value for m in FRAMEWORK_MODES[fw])}")
    return tuple(dict.fromkeys(Mode(m) for m in wanted))


def block_rounds(config, block_s: float) -> int:
    """Rounds of one block each for ``benchmark.pedantic``, chosen as pytest-benchmark chooses them for
    a plain benchmark: ``--benchmark-max-time`` over one block's time ``block_s``, at least
    ``--benchmark-min-rounds``."""
    max_time = float(config.getoption("benchmark_max_time"))
    min_rounds = int(config.getoption("benchmark_min_rounds"))
    return max(min_rounds, math.ceil(max_time / block_s) if block_s > 0 else min_rounds, 1)


@functools.cache
def gpu_report() -> gpuinfo.GpuReport:
    return gpuinfo.query()


@functools.cache
def probe(framework: str) -> dict:
    return doctor.probe_framework(framework)


@functools.cache
def decision(framework: str, device: str) -> run_devices.Decision:
    report = gpu_report()
    cc = report.gpus[0].compute_capability if report.gpus else None
    return run_devices.decide_device(framework, device, probe(framework), cc, report.problem)


@pytest.fixture(scope="session")
def framework(request) -> str:
    return request.config.getoption("--framework")


@pytest.fixture(scope="session")
def bench_data(request) -> str:
    return request.config.getoption("--bench-data")


_VERSIONS: dict = {}


def pytest_benchmark_update_machine_info(config, machine_info):
    """GPU, driver, CUDA, cuDNN and framework versions beside pytest-benchmark's CPU facts."""
    report = gpu_report()
    fw = config.getoption("--framework")
    machine_info["kernelmap"] = {
        "framework": fw,
        "framework_versions": _VERSIONS.get(fw) or probe(fw),
        "gpus": [g.to_dict() for g in report.gpus],
        "gpu_problem": report.problem,
        "driver": report.gpus[0].driver if report.gpus else None,
        "cuda_driver_version": report.cuda_driver_version,
        "cpu": gpuinfo.cpu_model(),
    }
