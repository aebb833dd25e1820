"""One training step per framework x mode x device x batch size, timed as the clean pass of
``kernelmap run`` times it (``kernelmap.timing``): rounds of ``timing.BLOCK_STEPS`` back-to-back steps
on the ``timing.WINDOW_STEPS`` batches of one window in turn (as the clean pass's trials reuse them)
with one device synchronisation at the end of each round (``benchmark.pedantic(iterations=BLOCK_STEPS)``,
so pytest-benchmark's stats are per step), the batch already on the device, Python's garbage collector
off within each round (the ``benchmark`` marker's ``disable_gc``), the framework's per-step profiler
ranges off. Rounds: as pytest-benchmark chooses them for a plain benchmark, ``--benchmark-max-time``
over one untimed round's time, at least ``--benchmark-min-rounds``. What else used the machine while
the rounds ran is measured (``kernelmap.contention``: a CPU window around them, on the GPU the device's
state before and after) and recorded as ``extra_info["contention"]``; ``extra_info["steps_per_round"]``
is ``BLOCK_STEPS``.

Run one framework per process: ``pytest benches/bench_train_step.py --framework=pytorch
--benchmark-json=pytorch.json`` (see benches/conftest.py; ``nox -s bench`` saves the frameworks'
files as one job, ``kernelmap save-job``).

Each benchmark is named and recorded by its key (``kernelmap.history.keys.BenchKey``):
``test_train_step[pytorch-eager-cpu-64]``, with framework, mode, device and batch size in its params
and ``extra_info``, so that ``kernelmap compare`` pairs only like with like."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import pytest
from conftest import _VERSIONS, bench_batch_sizes, bench_modes, block_rounds, decision

from kernelmap import contention, frameworks, timing
from kernelmap.history.keys import CONTENTION, STEPS_PER_ROUND, BenchKey, Mode

WARMUP_STEPS = 3


def block_step(workload, batches: list, block_steps: int = timing.BLOCK_STEPS) -> Callable[[], object]:
    """One training step per call on the next of ``batches`` (cycled, as the clean pass's trials
    cycle through the ``timing.WINDOW_STEPS`` batches they fetched: one batch repeated would sit in
    the GPU's L2 cache, and ran 4.6-6.7% faster than the clean pass at bs 1024 on an H200), the device
    synchronised on every ``block_steps``-th call only: a round of
    ``benchmark.pedantic(iterations=block_steps)`` is then one block of the clean pass (its rounds
    start on a call count of 0 mod ``block_steps``, every round being exactly that many calls)."""
    calls = 0

    def step():
        nonlocal calls
        images, labels = batches[calls % len(batches)]
        loss = workload.train_step(images, labels)
        calls += 1
        if calls % block_steps == 0:
            workload.synchronize()
        return loss

    return step


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
            if mode.value not in frameworks.get(framework).modes_on(device):  # a CUDA graph on the CPU: no key
                continue
            for bs in bench_batch_sizes(metafunc.config):
                key = BenchKey(framework, mode.value, device, bs)
                params.append(pytest.param(mode.value, device, bs, id=key.id,
                                           marks=[pytest.mark.gpu] if device == "gpu" else []))
    metafunc.parametrize(("mode", "device", "batch_size"), params)


@pytest.mark.benchmark(disable_gc=True)  # timing.GC_RULE: the collector off within each timed block
def test_train_step(benchmark, request, framework, workload_cls, bench_data, mode, device, batch_size):
    d = decision(framework, device)
    if d.device != device:  # never benchmark one device under another's name
        pytest.skip(f"{framework} cannot run on the {device.upper()} here: {d.note}")
    from kernelmap.frameworks import spec

    key = BenchKey(framework, Mode(mode).value, device, batch_size)
    config = spec.TrainConfig(batch_size=batch_size, device=device, data=bench_data, steps=None, mode=key.mode)
    workload = workload_cls(config)
    workload.trace_regions = False  # as the clean pass: no per-step profiler ranges
    info = workload.data_info
    # the batches of one clean-pass window, on the device before any timing (timing.REUSE_METHOD)
    batches = list(itertools.islice(workload.batches("train", batch_size, spec.training_order(
        info.n_train, 0, batch_size)), timing.WINDOW_STEPS))
    for i in range(WARMUP_STEPS):
        workload.train_step(*batches[i % len(batches)])
    workload.synchronize()
    _VERSIONS[framework] = workload.versions()

    step = block_step(workload, batches)
    # one untimed round: warms the block up and sets the number of rounds
    t0 = time.perf_counter()
    for _ in range(timing.BLOCK_STEPS):
        step()
    rounds = block_rounds(request.config, time.perf_counter() - t0)

    benchmark.group = f"train_step {device} bs{batch_size}"
    benchmark.extra_info.update(**key.extra_info(), data=info.kind, data_sha256=info.sha256,
                                warmup_steps=WARMUP_STEPS + timing.BLOCK_STEPS,
                                **{STEPS_PER_ROUND: timing.BLOCK_STEPS})
    gpu = [contention.gpu_state()] if device == "gpu" else []
    window = contention.CpuWindow.start()
    benchmark.pedantic(step, rounds=rounds, iterations=timing.BLOCK_STEPS)
    cpu = window.stop()
    workload.synchronize()  # pedantic's one call after the rounds (its return value) is not a round's
    if device == "gpu":
        gpu.append(contention.gpu_state())
    benchmark.extra_info[CONTENTION] = contention.summarise([cpu], gpu)
