"""Each traced op's own CPU time (``kernelmap.cpusampler``): the CPU framework pass's process CPU time
within each op's span of its trace, per layer and direction per traced step.

``op_cpu`` puts each case's trace on its sampler's clock (``cpusampler.fit_offset``) and gives every timed
event of ``timed.timed_events`` its CPU ns (``cpusampler.shared_cpu``); ``layer_cpu`` sums them per traced
step for a layer and a set of directions. A case without a sampler file (a run made before kernelmap sampled,
a GPU case, several devices) has none, and says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kernelmap import cpusampler, timing
from kernelmap.errors import KernelmapError
from kernelmap.rundir import pass_result_name, read_json
from kernelmap.worker import FRAMEWORK_PASS

from .base import Run, case_of, field_at
from .ops import LAYER_OPS
from .timed import Timed, records_of, timed_events

MAIN_RULE = ("where no traced op runs on the worker's main thread (an asynchronous engine's or XLA's ops, on threads of "
             "their own), the main thread's CPU time is the framework's front end (Python, dispatch, the profiler's "
             "records) and is left out of every op: else an op on an engine thread would hold the front end's work of "
             "the moments it runs (measured, the asynchronous engine at bs 64 on a busy 2-core VM: its ops 20.6 ms CPU a "
             "step with it, above its clean pass's whole step, 17.9 ms); where ops run on the main thread (the trace "
             "names its thread: ops run as they are called), its time within an op is the op's")
OP_CPU_METHOD = f"{cpusampler.SAMPLER_RULE}; {cpusampler.SHARE_RULE}; {MAIN_RULE}; {cpusampler.FIT_RULE}"


@dataclass(frozen=True)
class OpCpu:
    """One case's traced ops on CPU time: ``events`` (the timed events with ``cpu_ns``) where measured, else
    ``why`` says why not."""

    framework: str
    batch_size: int | None
    why: str = ""
    events: pd.DataFrame | None = None  # Timed.events plus cpu_ns, span_cpu_ns (NaN: outside the samples)
    iterations: tuple[int, ...] = ()
    fit: cpusampler.Fit | None = None
    sampler: dict | None = None  # the framework pass's cpusampler.RESULT_KEY (its figures, the marks)
    step_cpu_ms: tuple[float, ...] = ()  # the worker's threads' sampled CPU time over each marked step
    ops_step_cpu_ms: tuple[float, ...] = ()  # the same, of the threads the ops are given (MAIN_RULE)
    main_in_ops: bool = True  # MAIN_RULE: whether the main thread's CPU time is within the ops'
    sampler_step_cpu_ms: tuple[float, ...] = ()  # the sampler thread's own over each marked step
    worker_step_cpu_ms: tuple[float, ...] = ()  # the worker's own process CPU time of each step (timing.CPU_SAMPLES)

    @property
    def measured(self) -> bool:
        return not self.why

    @property
    def ops_ms_per_step(self) -> float | None:
        """All traced ops' CPU time per traced step (their sum / the steps; NaN ops left out)."""
        if not self.measured or not self.iterations:
            return None
        return float(np.nansum(self.events["cpu_ns"].to_numpy(dtype=float))) / len(self.iterations) / 1e6


def _entry(run: Run, t: Timed) -> dict | None:
    return next((r for r in run.results if case_of(r) == t.framework and field_at(r, "batch_size") == t.batch_size),
                None)


def _measure(run: Run, t: Timed) -> OpCpu:
    """``OpCpu`` of one timed case (see the module docstring)."""
    fw, bs = t.framework, t.batch_size
    r = _entry(run, t)
    if t.level != "op" or t.pass_name != FRAMEWORK_PASS or r is None or field_at(r, "device") != "cpu":
        return OpCpu(fw, bs, "not a CPU case timed from its framework pass's ops")
    if int(field_at(r, "devices", default=1) or 1) > 1:
        return OpCpu(fw, bs, "a case on several devices: its ranks' ops are not sampled apart")
    folder = field_at(r, "dir")
    path = run.path / str(folder) / pass_result_name(FRAMEWORK_PASS, None)
    result = read_json(path) if isinstance(folder, str) and path.is_file() else {}
    fig = result.get(cpusampler.RESULT_KEY)
    if not isinstance(fig, dict):
        return OpCpu(fw, bs, "its framework pass sampled no CPU time (a run made before kernelmap did)")
    samples_path = path.parent / str(fig.get("file", cpusampler.SAMPLES_FILE))
    if not samples_path.is_file():
        raise KernelmapError(f"{samples_path}: missing (the framework pass's result names it)")
    full = cpusampler.Samples.read(samples_path)
    marks = [list(map(int, m)) for m in fig.get(cpusampler.MARKS_KEY) or []]
    rec = records_of(run)
    steps = rec[(rec["case"] == fw) & (rec["batch_size"] == bs) & (rec["source"] == t.source)
                & (rec["kind"] == "step") & rec["iteration"].notna() & rec["start_ns"].notna()]
    starts = {int(i): int(s) for i, s in zip(steps["iteration"], steps["start_ns"], strict=True)}
    fit = cpusampler.fit_offset(starts, marks)
    ev = t.events
    starts_ns = np.asarray([m[1] for m in marks], dtype=np.int64)
    ends_ns = np.asarray([m[2] for m in marks], dtype=np.int64)
    pid = result.get("pid")
    on_main = pid is not None and bool((ev["tid"] == pid).any())
    samples = full if on_main else full.without_main()
    base = dict(iterations=t.iterations, fit=fit, sampler=fig, main_in_ops=on_main,
                step_cpu_ms=tuple(float(x) / 1e6 for x in full.between(starts_ns, ends_ns)),
                ops_step_cpu_ms=tuple(float(x) / 1e6 for x in samples.between(starts_ns, ends_ns)),
                sampler_step_cpu_ms=tuple(float(x) / 1e6 for x in full.between(starts_ns, ends_ns, own=True)),
                worker_step_cpu_ms=tuple(float(x) * 1e3 for x in result.get(timing.CPU_SAMPLES) or ()))
    if fit is None or not fit.good:
        said = "no step of the trace among the worker's marks" if fit is None else (
            f"the trace's step starts lie {fit.spread_ns / 1e3:.4g} µs (median) from one offset of the marks' clock")
        return OpCpu(fw, bs, f"its trace is not put on the sampler's clock: {said}", **base)
    start = ev["start_ns"].to_numpy(dtype=np.int64) - fit.offset_ns
    end = start + ev["dur_ns"].to_numpy(dtype=np.int64)
    # cpu_ns: the op's share (cpusampler.SHARE_RULE); span_cpu_ns: the process's CPU time over its span, unshared
    return OpCpu(fw, bs, "", ev.assign(cpu_ns=cpusampler.shared_cpu(samples, start, end),
                                       span_cpu_ns=samples.between(start, end)), **base)


def op_cpu(run: Run) -> dict[tuple[str, Any], OpCpu]:
    """Per (case, batch size) timed from ops: its ``OpCpu`` (computed once per Run)."""
    if run._op_cpu is None:
        run._op_cpu = {(t.framework, t.batch_size): _measure(run, t) for t in timed_events(run)}
    return run._op_cpu


def op_cpu_of(runs: list[Run]) -> dict[tuple[str, str, Any], OpCpu]:
    """``op_cpu`` of every run, by (run, case, batch size)."""
    return {(run.name, fw, bs): oc for run in runs for (fw, bs), oc in op_cpu(run).items()}


@dataclass(frozen=True)
class LayerCpu:
    """A layer's CPU time in some directions per traced step of one case: ``steps_ms`` (one a traced step),
    their median ``ms`` and its 95% interval (``timing.capture_ci``: a step that spun or waited on a busy
    machine moves it less than a mean), the same ops' wall time per step (median), and ``why`` where it is not
    measured (an op outside the samples)."""

    ms: float | None
    ci_ms: tuple[float, float] | None
    steps_ms: tuple[float, ...]
    wall_ms: float | None
    why: str = ""

    @property
    def utilisation(self) -> float | None:
        return self.ms / self.wall_ms if self.ms is not None and self.wall_ms else None


def layer_cpu(oc: OpCpu, layer: str, directions: set[str]) -> LayerCpu:
    """``LayerCpu`` of ``layer``'s conv/linear ops of ``directions`` in case ``oc``."""
    if not oc.measured:
        return LayerCpu(None, None, (), None, oc.why)
    ev = oc.events
    ev = ev[ev["canonical_op"].isin(LAYER_OPS) & (ev["layer"] == layer)
            & ev["direction"].fillna("none").isin(directions)]
    if ev.empty:
        return LayerCpu(None, None, (), None, "no traced op of this layer and direction")
    lost = int(ev["cpu_ns"].isna().sum())
    if lost:
        return LayerCpu(None, None, (), None, f"{lost} of its {len(ev)} traced ops lie outside the CPU samples")
    its = oc.iterations or tuple(sorted(int(i) for i in ev["iteration"].dropna().unique()))
    per, wall = ev.groupby("iteration")["cpu_ns"].sum(), ev.groupby("iteration")["dur_ns"].sum()
    steps = tuple(float(per.get(i, 0.0)) / 1e6 for i in its)
    return LayerCpu(float(np.median(steps)), timing.capture_ci(list(steps)), steps,
                    float(np.median([float(wall.get(i, 0.0)) / 1e6 for i in its])))
