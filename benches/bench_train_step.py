"""One training step per framework x mode x device x batch size, with the GPU synchronised inside the
timed call. Run one framework per process: ``pytest benches/bench_train_step.py --framework=pytorch
--benchmark-autosave`` (see benches/conftest.py).

Each benchmark is named and recorded by its key (``kernelmap.history.BenchKey``):
``test_train_step[pytorch-eager-cpu-64]``, with framework, mode, device and batch size in its params
and ``extra_info``, so that ``kernelmap compare`` pairs only like with like."""

from __future__ import annotations

import pytest
from conftest import _VERSIONS, BATCH_SIZES, bench_modes, decision

from kernelmap.history import BenchKey, Mode

WARMUP_STEPS = 3


@pytest.fixture(scope="module")
def workload_cls(framework):
    d = decision(framework, "cpu")
    if d.device is None:
        pytest.skip(d.note)
    from kernelmap.frameworks import load_workload  # a workload module prepares its own libraries

    return load_workload(framework)


def pytest_generate_tests(metafunc):
    """mode x device x batch size of this process's framework, each named by its key."""
    if metafunc.function.__name__ != "test_train_step":
        return
    framework = metafunc.config.getoption("--framework")
    params = []
    for mode in bench_modes(metafunc.config):
        for device in ("cpu", "gpu"):
            for bs in BATCH_SIZES:
                key = BenchKey(framework, mode.value, device, bs)
                params.append(pytest.param(mode.value, device, bs, id=key.id,
                                           marks=[pytest.mark.gpu] if device == "gpu" else []))
    metafunc.parametrize(("mode", "device", "batch_size"), params)


def test_train_step(benchmark, framework, workload_cls, bench_data, mode, device, batch_size):
    d = decision(framework, device)
    if d.device != device:  # never benchmark one device under another's name
        pytest.skip(f"{framework} cannot run on the {device.upper()} here: {d.note}")
    from kernelmap.frameworks import spec

    key = BenchKey(framework, Mode(mode).value, device, batch_size)
    config = spec.TrainConfig(batch_size=batch_size, device=device, data=bench_data, steps=None,
                              hybridize=key.mode == Mode.HYBRIDIZED.value)
    workload = workload_cls(config)
    info = workload.data_info
    images, labels = next(iter(workload.batches("train", batch_size, spec.training_order(info.n_train, 0, batch_size))))
    for _ in range(WARMUP_STEPS):
        workload.train_step(images, labels)
    workload.synchronize()
    _VERSIONS[framework] = workload.versions()

    def step():
        loss = workload.train_step(images, labels)
        workload.synchronize()
        return loss

    benchmark.group = f"train_step {device} bs{batch_size}"
    benchmark.extra_info.update(**key.extra_info(), data=info.kind,
                                data_sha256=info.sha256, warmup_steps=WARMUP_STEPS)
    benchmark(step)
