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

    def synchronize(self):
        pass

    def threads(self):
        return {}


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
