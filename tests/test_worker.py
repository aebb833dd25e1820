"""kernelmap.worker.run_pass with a framework-free stand-in workload: what its timed figures include."""

from __future__ import annotations

import contextlib
import gc
import time
import weakref
from types import SimpleNamespace

from kernelmap.frameworks import spec

from kernelmap import timing, worker

PAUSE_S = 0.2  # a stand-in garbage collection, far longer than the stand-in steps


class FakeWorkload:
    """Steps and batches that do no work; ``on_step`` / ``on_batch`` see each one."""

    def __init__(self, n_train: int, batch_size: int = 1, on_step=None, on_batch=None):
        self.config = spec.TrainConfig(batch_size=batch_size)
        self.data_info = SimpleNamespace(n_train=n_train)
        self.on_step = on_step or (lambda: None)
        self.on_batch = on_batch or (lambda: None)

    def batches(self, split, batch_size, order):
        for start in range(0, len(order), batch_size):
            self.on_batch()
            yield order[start : start + batch_size], None

    def region(self, name):
        return contextlib.nullcontext()

    def train_step(self, images, labels):
        self.on_step()
        return 0.0

    # the worker converts the loss through the workload (spec.WorkloadBase.to_float, 2889bb4): the real default
    to_float = spec.WorkloadBase.to_float

    def synchronize(self):
        pass

    def threads(self):
        return {}

    def libs_trace(self, out_dir):
        return contextlib.nullcontext()


def _run(workload, tmp_path, **kw):
    kw.setdefault("steps", None if "epochs" in kw else 20)
    kw.setdefault("epochs", None)
    kw.setdefault("warmup", 2)
    return worker.run_pass(workload, framework="fake", pass_name="clean", out_dir=tmp_path, progress=False, **kw)


def test_e2e_figure_excludes_the_collection_before_the_timed_steps(tmp_path, monkeypatch):
    real_collect = gc.collect
    calls = []

    def slow_collect(*args):
        calls.append(time.perf_counter())
        time.sleep(PAUSE_S)
        return real_collect(*args)

    monkeypatch.setattr(gc, "collect", slow_collect)
    result = _run(FakeWorkload(n_train=1000), tmp_path)
    assert calls, "the timed steps must follow a collection"
    e2e_total_s = result["e2e_step_s"] * result["steps"]
    assert e2e_total_s < PAUSE_S / 2, f"the end-to-end window holds a collection ({e2e_total_s:.3f} s)"


class _Cycle:
    pass


def test_epochs_collect_cyclic_garbage_between_windows_outside_the_clocks(tmp_path, monkeypatch):
    """Whole epochs: each window's reference cycles are gone by the next window; the collector is off
    while a window fetches and steps; collections between windows stay out of the end-to-end figure."""
    n_train, warmup = 2 * timing.WINDOW_STEPS + 7, 2
    seen = {"steps": 0}
    cycles: list[tuple[int, weakref.ref]] = []  # (window, a cycle made in that window's step)
    survivors, gc_on = [], []

    def step():
        j = seen["steps"] - warmup  # timed step number (negative: warm-up)
        seen["steps"] += 1
        if j < 0:
            return
        window = j // timing.WINDOW_STEPS
        survivors.extend(w for w, ref in cycles if w < window and ref() is not None)
        gc_on.append(gc.isenabled())
        c = _Cycle()
        c.me = c
        cycles.append((window, weakref.ref(c)))

    def batch():
        if seen["steps"] >= warmup:
            gc_on.append(gc.isenabled())

    real_collect = gc.collect
    calls = []

    def slow_collect(*args):
        calls.append(seen["steps"])
        time.sleep(PAUSE_S / 4)
        return real_collect(*args)

    monkeypatch.setattr(gc, "collect", slow_collect)
    result = _run(FakeWorkload(n_train, on_step=step, on_batch=batch), tmp_path, epochs=2, warmup=warmup)
    n_windows = len(timing.blocks(result["steps"], timing.WINDOW_STEPS))
    assert n_windows > 2 and len(calls) >= n_windows
    assert not survivors, f"reference cycles of earlier windows alive in windows {sorted(set(survivors))}"
    assert gc_on and not any(gc_on), "the collector ran inside a window"
    e2e_total_s = result["e2e_step_s"] * result["steps"]
    assert e2e_total_s < PAUSE_S / 8, f"the end-to-end figure holds collections ({e2e_total_s:.3f} s)"
    assert timing.GC_RULE in result["e2e_timing"] and timing.GC_RULE in result["timing"]


# --- contention windows, GPU states, reused batches, region tracing ------------------------------------
class SlowWindow:
    """A stand-in CpuWindow whose start and stop each take PAUSE_S: were either inside a timed block or
    the end-to-end window, the figures would hold it."""

    started = 0

    @classmethod
    def start(cls, sources=None):
        cls.started += 1
        time.sleep(PAUSE_S)
        return cls()

    def stop(self):
        time.sleep(PAUSE_S)
        return {"wall_s": 1.0, "own_cpu_cores": 1.0, "other_cpu_cores": 0.0, "steal_cores": 0.0, "ncpu": 2,
                "load1": 0.1, "resolution_cores": 0.02, "measured": True, "why_not": None, "contended": False}


def test_contention_windows_wrap_each_timed_window_outside_the_clocks(tmp_path, monkeypatch):
    from kernelmap import contention

    monkeypatch.setattr(contention, "CpuWindow", SlowWindow)
    steps = 2 * timing.WINDOW_STEPS + 5
    result = _run(FakeWorkload(n_train=10_000), tmp_path, steps=steps)
    assert len(result["contention_windows"]) == 3  # one per timed window: 50, 50, 5 steps
    assert result["e2e_step_s"] * steps < PAUSE_S / 2, "a window's start or stop is inside the end-to-end figure"
    assert max(result["step_times_s"]) * timing.BLOCK_STEPS < PAUSE_S / 2, "... inside a timed block"
    assert result["contention"]["contended"] is False and result["contention"]["windows"] == 3
    assert result["contention_gpu"] == []  # the CPU: nvidia-smi is not asked
    capture = worker.run_pass(FakeWorkload(n_train=10_000), framework="fake", pass_name="libs", out_dir=tmp_path,
                              steps=30, epochs=None, warmup=1, progress=False)
    assert len(capture["contention_windows"]) == 1  # the whole capture
    assert max(capture["step_times_s"]) < PAUSE_S / 2


def test_gpu_state_is_read_before_and_after_the_timed_steps(tmp_path):
    seen = {"steps": 0}
    reads = []

    def gpu_state():
        reads.append(seen["steps"])
        return {"index": 0, "sm_clock_mhz": 1980.0, "max_sm_clock_mhz": 1980.0, "clock_reasons": [],
                "compute_processes": [31337]}

    def step():
        seen["steps"] += 1

    wl = FakeWorkload(n_train=1000, on_step=step)
    wl.config = spec.TrainConfig(batch_size=1, device="gpu")
    result = worker.run_pass(wl, framework="fake", pass_name="clean", out_dir=tmp_path, steps=20, epochs=None,
                             warmup=3, progress=False, gpu_state=gpu_state)
    assert reads == [3, 23]  # after the warm-up, after the last timed step
    assert len(result["contention_gpu"]) == 2
    assert result["contention"]["contended"] is True and result["contention"]["gpu_other_processes"] == 1
    assert "1 other process on the GPU (pid 31337)" in result["contention"]["reasons"]


def test_reused_batches_are_fetched_once_and_cycled(tmp_path):
    fetched, used = [], []

    class Recording(FakeWorkload):
        def train_step(self, images, labels):
            used.append(int(images[0]))
            return 0.0

    wl = Recording(n_train=10_000, on_batch=lambda: fetched.append(1))
    steps, warmup = 2 * timing.WINDOW_STEPS + 7, 2
    fresh = _run(Recording(n_train=10_000), tmp_path, steps=steps, warmup=warmup)
    fresh_used, used[:] = list(used), []
    result = _run(wl, tmp_path, steps=steps, warmup=warmup, reuse_batches=True)
    assert len(fetched) == warmup + timing.WINDOW_STEPS  # the loader ran once per cached batch
    timed = used[warmup:]
    assert timed == [fresh_used[warmup + k % timing.WINDOW_STEPS] for k in range(steps)]  # cycled, in order
    assert result["batches_reused"] == timing.WINDOW_STEPS and result["e2e_step_s"] is None
    assert result["e2e_timing"] == timing.REUSE_METHOD
    assert result["sample_steps"] == fresh["sample_steps"]  # the same blocks: step times of the same kind
    assert "batches_reused" not in fresh and fresh["e2e_step_s"] > 0


def test_regions_are_traced_only_in_capture_passes(tmp_path):
    for pass_name, traced in (("clean", False), ("libs", True)):
        wl = FakeWorkload(n_train=100)
        worker.run_pass(wl, framework="fake", pass_name=pass_name, out_dir=tmp_path, steps=3, epochs=None,
                        warmup=1, progress=False)
        assert wl.trace_regions is traced, pass_name


def test_libs_pass_traces_its_own_timed_steps(tmp_path):
    """Issue 25: the libs pass opens the workload's ``libs_trace`` (its own kernels, beside the logs) around
    its timed steps only, writing under RUN_DIR/<fw>/bs<N>/libs/."""
    seen = {"steps": 0, "at_enter": None, "at_exit": None, "dir": None}

    class Traced(FakeWorkload):
        @contextlib.contextmanager
        def libs_trace(self, out_dir):
            seen["dir"], seen["at_enter"] = out_dir, seen["steps"]
            yield
            seen["at_exit"] = seen["steps"]

    wl = Traced(n_train=10_000, on_step=lambda: seen.__setitem__("steps", seen["steps"] + 1))
    worker.run_pass(wl, framework="fake", pass_name="libs", out_dir=tmp_path, steps=7, epochs=None, warmup=2,
                    progress=False)
    assert (seen["at_enter"], seen["at_exit"], seen["dir"]) == (2, 9, tmp_path / "libs")
    seen.update(at_enter=None)
    worker.run_pass(wl, framework="fake", pass_name="clean", out_dir=tmp_path, steps=3,
                    epochs=None, warmup=1, progress=False)
    assert seen["at_enter"] is None  # no other pass opens it
