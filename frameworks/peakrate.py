"""The arithmetic of the measured peaks (each framework's ``peaks.py``, the counters pass's roofline): a rate is
the work over the median run's time, the fastest run's beside it, with the times it was read from; and the host's
timing of a call that returns once its work is done, where a framework gives no device events (JAX, MXNet)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def rate(work: float, ms: list[float], unit: str) -> dict[str, Any]:
    """{unit: work per second at the median time, unit_best: at the fastest, "ms_median", "ms": every time}."""
    med = statistics.median(ms)
    return {unit: work / (med / 1e3), f"{unit}_best": work / (min(ms) / 1e3), "ms_median": med, "ms": ms}


def host_times_ms(run_and_wait: Callable[[], Any], warmup: int, repeats: int) -> list[float]:
    """``repeats`` times of ``run_and_wait`` (a call that returns once the device finished its work) in ms, read
    with ``time.perf_counter`` around it after ``warmup`` untimed calls: each time holds the call's dispatch."""
    for _ in range(warmup):
        run_and_wait()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run_and_wait()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


CPU_CASE = "a CPU case: the roofline's peaks are the GPU's"  # a workload's measure_peaks off the GPU: not_measured
