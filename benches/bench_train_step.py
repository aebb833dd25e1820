"""One training step per framework x device x batch size, with the GPU synchronised inside the
timed call. Run one framework per process: ``pytest benches/bench_train_step.py --framework=pytorch
--benchmark-autosave`` (see benches/conftest.py)."""

from __future__ import annotations

import pytest
from conftest import _VERSIONS, BATCH_SIZES, decision

WARMUP_STEPS = 3


@pytest.fixture(scope="module")
def workload_cls(framework):
    d = decision(framework, "cpu")
    if d.device is None:
        pytest.skip(d.note)
    if framework == "mxnet":
        from kernelmap.frameworks.mxnet import cuda11

        cuda11.preload()  # mxnet-cu112's CUDA 11 libraries before `import mxnet`; a no-op without them
    from kernelmap.frameworks import load_workload

    return load_workload(framework)


@pytest.mark.parametrize("batch_size", BATCH_SIZES)
@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_train_step(benchmark, framework, workload_cls, bench_data, device, batch_size):
    d = decision(framework, device)
    if d.device != device:  # never benchmark one device under another's name
        pytest.skip(f"{framework} cannot run on the {device.upper()} here: {d.note}")
    from kernelmap.frameworks import spec

    config = spec.TrainConfig(batch_size=batch_size, device=device, data=bench_data, steps=None)
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
    benchmark.extra_info.update(framework=framework, device=device, batch_size=batch_size, data=info.kind,
                                data_sha256=info.sha256, warmup_steps=WARMUP_STEPS)
    benchmark(step)
