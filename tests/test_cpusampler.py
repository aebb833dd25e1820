"""kernelmap.cpusampler: the worker's per-thread CPU clocks sampled by a thread of its own (native, and its
Python twin), read back, fitted to a trace's clock and shared among ops that run at once."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time

import numpy as np
import pytest
from test_worker import FakeWorkload

from kernelmap import cpusampler
from kernelmap.errors import KernelmapError


def _busy(n: int, stop: threading.Event) -> list[threading.Thread]:
    def work() -> None:
        data = b"x" * 2_000_000
        while not stop.is_set():
            hashlib.sha256(data).digest()  # releases the interpreter lock: the threads run at once

    threads = [threading.Thread(target=work) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


@pytest.mark.parametrize("twin", [False, True], ids=["native", "twin"])
def test_sampler_reads_every_threads_cpu_time(tmp_path, twin):
    if not twin and cpusampler.native is None:
        pytest.skip("kernelmap._cpuclock is not built (python setup.py build_ext --inplace)")
    stop = threading.Event()
    threads = _busy(2, stop)
    s = cpusampler.Sampler(tmp_path, twin=twin)
    try:
        c0 = time.process_time()
        s.start()
        time.sleep(0.4)
        s.stop()
        c1 = time.process_time()
    finally:
        stop.set()
        for t in threads:
            t.join()
    rows = np.load(tmp_path / cpusampler.SAMPLES_FILE)  # numpy's own reader: the file is a plain .npy
    assert rows.dtype == np.int64 and rows.shape == (s.figures["samples"], cpusampler.COLUMNS)
    x = cpusampler.Samples.read(tmp_path / cpusampler.SAMPLES_FILE)
    rate = np.diff(x.cpu_ns) / np.diff(x.mono_ns)
    # per-thread clocks are up to date when read: never more cores than the machine has between two reads
    # (the process-wide clock of another process jumps a scheduler tick at a time: up to 13.8 cores on 2)
    assert rate.max() <= (os.cpu_count() or 1) * 1.02
    sampled = (x.cpu_ns[-1] - x.cpu_ns[0] + x.own_ns[-1] - x.own_ns[0]) / 1e9
    assert sampled == pytest.approx(c1 - c0, rel=0.15)  # the same threads' time; process_time spans a little more
    assert s.figures["threads"] >= 3 and s.figures["own_cpu_s"] > 0 and not s.figures["threads_missed"]
    assert s.figures["sampler"] == ("Python thread (twin)" if twin else "native thread")
    assert s.figures[cpusampler.MARKS_KEY] == []
    s.stop()  # a second stop does nothing


def test_a_bad_sampler_file_is_an_error_naming_it(tmp_path):
    missing = tmp_path / "none.npy"
    with pytest.raises(KernelmapError, match="none.npy"):
        cpusampler.Samples.read(missing)
    pairs = tmp_path / "pairs.npy"
    np.save(pairs, np.zeros((4, 3), dtype=np.int64))
    with pytest.raises(KernelmapError, match="pairs.npy.*want rows of 4 int64"):
        cpusampler.Samples.read(pairs)
    back = tmp_path / "back.npy"
    np.save(back, np.asarray([[0, 10, 0, 0], [1000, 5, 1, 0]], dtype=np.int64))
    with pytest.raises(KernelmapError, match="back.npy.*goes back"):
        cpusampler.Samples.read(back)


def test_fit_offset_takes_the_median_and_ignores_a_late_step():
    marks = [[5, 1_000, 2_000], [6, 3_000, 4_000], [7, 5_000, 6_000], [8, 7_000, 8_000]]
    trace = {5: 101_000, 6: 103_002, 7: 105_000 + 300_000, 8: 106_998, 9: 200_000}  # step 7 started late
    fit = cpusampler.fit_offset(trace, marks)
    assert (fit.offset_ns, fit.n, fit.late) == (100_001, 4, 1)
    assert fit.spread_ns == 2 and fit.good  # median |residual| of (1, 1, 3, 299999)
    assert cpusampler.fit_offset({1: 0}, marks) is None
    apart = {s: start + i * 200_000 for i, (s, start, _) in enumerate(marks)}  # no one offset
    assert not cpusampler.fit_offset(apart, marks).good


def _samples(rate: float = 1.0) -> cpusampler.Samples:
    t = np.arange(0, 11_000_000, 1_000_000, dtype=np.int64)
    return cpusampler.Samples(t, (t * rate).astype(np.int64), np.zeros_like(t), np.zeros_like(t))


def test_ops_that_run_at_once_share_the_cpu_time_of_their_overlap():
    s = _samples(1.0)  # one core busy throughout, samples every ms over 0-10 ms
    ms = 1_000_000
    start, end = np.asarray([0, 2 * ms, 7 * ms]), np.asarray([4 * ms, 6 * ms, 8 * ms])
    got = cpusampler.shared_cpu(s, start, end)
    # [0,2) alone 2 ms, [2,4) shared 1 + 1, [4,6) the second alone 2 ms, [7,8) the third 1 ms
    assert got.tolist() == pytest.approx([3 * ms, 3 * ms, 1 * ms])
    assert got[:2].sum() == pytest.approx(s.between(np.asarray([0]), np.asarray([6 * ms]))[0])
    assert s.between(start, end).tolist() == pytest.approx([4 * ms, 4 * ms, 1 * ms])  # unshared, each span
    out = cpusampler.shared_cpu(s, np.asarray([9 * ms]), np.asarray([12 * ms]))  # past the last sample
    assert np.isnan(out).all()


class _SpinWorkload(FakeWorkload):
    """test_worker's stand-in on the CPU, each step spinning ``SPIN_S`` of CPU on the main thread, with a
    framework profiler that records nothing."""

    SPIN_S = 0.004

    def __init__(self):
        super().__init__(n_train=1000, on_step=self._spin)

    def _spin(self) -> None:
        end = time.thread_time() + self.SPIN_S
        while time.thread_time() < end:
            pass

    def profile(self, out_dir):
        return contextlib.nullcontext()


def test_the_cpu_framework_pass_samples_its_traced_steps(tmp_path):
    """kernelmap.worker's CPU framework pass: the sampler runs through the timed steps (one mark each, inside the
    samples), and its CPU time of each step is the worker's own process_time of it."""
    from kernelmap import timing, worker

    wl = _SpinWorkload()
    result = worker.run_pass(wl, framework="fake", pass_name="framework", out_dir=tmp_path, steps=12, epochs=None,
                             warmup=3, progress=False)
    fig = result[cpusampler.RESULT_KEY]
    marks = fig[cpusampler.MARKS_KEY]
    assert [m[0] for m in marks] == list(range(3, 15))
    x = cpusampler.Samples.read(tmp_path / cpusampler.SAMPLES_FILE)
    assert x.mono_ns[0] < marks[0][1] and marks[-1][2] <= x.mono_ns[-1]
    a, b = (np.asarray([m[k] for m in marks]) for k in (1, 2))
    sampled = (x.between(a, b) + x.between(a, b, own=True)) / 1e9
    assert np.median(sampled) == pytest.approx(np.median(result[timing.CPU_SAMPLES]), rel=0.02)
    main = (np.interp(b, x.mono_ns, x.main_ns) - np.interp(a, x.mono_ns, x.main_ns)) / 1e9
    assert np.median(main) >= _SpinWorkload.SPIN_S * 0.9  # the steps spin on the main thread
    clean = worker.run_pass(_SpinWorkload(), framework="fake", pass_name="clean", out_dir=tmp_path / "c", steps=3,
                            epochs=None, warmup=1, progress=False)
    assert cpusampler.RESULT_KEY not in clean  # only the CPU framework pass samples
