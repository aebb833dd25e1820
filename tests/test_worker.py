"""kernelmap.worker.run_pass with a framework-free stand-in workload: what its timed figures include."""

from __future__ import annotations

import contextlib
import gc
import time
from types import SimpleNamespace

from kernelmap.frameworks import spec

from kernelmap import worker

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
