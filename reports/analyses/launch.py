"""The launch-bound answer: per run x framework x mode x batch size, the clean step beside the time the
GPU is busy in it, and the share of the clean step the GPU sits idle.

* ``clean_step_ms``: the clean pass's median step (all its trials' samples; ``summary_table``).
* ``gpu_busy_ms``: the union of the kernel intervals of each counted step of the kernel-level timed
  source (a capture pass: Kineto or the XLA trace, else nsys), averaged over those steps. Kernels
  that overlap (several streams) count once.
* ``kernel_sum_ms``: the same kernels' summed time per step (the busy-share table's figure).
* ``idle_share``: 1 - gpu_busy_ms / clean_step_ms: the share of the clean step in which no kernel
  runs (launch latency, host-side dispatch, synchronisation). Kernel durations are device-clock
  figures and do not depend on the profiler's host-side cost; the step they are set against is the
  clean pass's, never the capture pass's synchronised step (``capture_step_ms``, shown for reference).

``best_modes`` picks, per run x framework at one batch size, the mode with the lowest clean step.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kernelmap import frameworks
from kernelmap.commlink import is_communication

from .base import Run, fw_label
from .summary import summary_table
from .timed import timed_events

COLUMNS = ["run", "framework", "framework_name", "mode", "batch_size", "source", "steps", "clean_step_ms",
           "gpu_busy_ms", "kernel_sum_ms", "idle_ms", "idle_share", "busy_share_of_clean", "capture_step_ms",
           "pass", "compute_busy_ms"]
BEST_COLUMNS = ["run", "framework_name", "label", "batch_size", "best", "mode", "clean_step_ms", "gpu_busy_ms",
                "idle_share", "modes_compared"]


def union_ns(start: np.ndarray, end: np.ndarray) -> int:
    """Length of the union of the intervals [start, end) (ns)."""
    if not len(start):
        return 0
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)  # the furthest end so far
    # an interval opens a new stretch where it starts after everything before it ended
    new = np.r_[True, s[1:] > reach[:-1]]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, len(s) - 1]
    return int((reach[last] - s[first]).sum())


def busy_per_step_ns(events: pd.DataFrame, iterations) -> float | None:
    """Mean over ``iterations`` of the union of the kernel intervals of each, on its busiest device (None without
    any): a case on N devices keeps each device's clock apart (``rank``, ``device_index``): a union across
    devices would count their offsets as busy time (2x H200, session 13: JAX x2's kernels 1.259 ms a step
    against its clean step 1.203, the two devices' unions 1.2 ms or less)."""
    its = list(iterations)
    if not its:
        return None
    k = events[events["iteration"].isin(its) & events["start_ns"].notna() & events["dur_ns"].notna()]
    clock = [c for c in ("rank", "device_index") if c in k]  # each (rank, device) its own clock
    keys = pd.DataFrame({"it": k["iteration"].astype("int64"),
                         **{c: pd.to_numeric(k[c], errors="coerce").fillna(-1) for c in clock}})
    start = k["start_ns"].to_numpy(dtype="int64")
    end = start + k["dur_ns"].to_numpy(dtype="int64")
    unions = pd.Series({g: union_ns(start[ix], end[ix]) for g, ix in keys.groupby(list(keys.columns)).indices.items()},
                       dtype="float64")
    if unions.empty:
        return 0.0
    busiest = unions.groupby(level=0).max()  # per iteration, its busiest device
    return float(busiest.sum()) / len(its)


def _registry_rank(name: str) -> tuple[int, str]:
    """Frameworks in registry order, names no framework has last."""
    fws = list(frameworks.FRAMEWORKS)
    return (fws.index(name) if name in fws else len(fws), str(name))


def launch_bound(runs: list[Run]) -> pd.DataFrame:
    """One row per run x framework key x batch size with a kernel-level timed source (a GPU run)."""
    summ = summary_table(runs)
    rows = []
    for run in runs:
        for t in timed_events(run):
            if t.level != "kernel":
                continue
            m = summ[(summ["run"] == run.name) & (summ["framework"] == t.framework) & (summ["batch_size"] == t.batch_size)]
            clean = float(m["step_ms_median"].iloc[0]) if len(m) and pd.notna(m["step_ms_median"].iloc[0]) else None
            busy_ns = busy_per_step_ns(t.events, t.iterations)
            busy = None if busy_ns is None else busy_ns / 1e6
            comm = is_communication(t.events)  # a collective kernel's time holds its wait for the other ranks
            compute_ns = busy_per_step_ns(t.events[~comm], t.iterations) if comm.any() else busy_ns
            ksum = float(t.events["dur_ns"].sum()) / t.n_steps / 1e6
            case = run.cases.get(t.framework)  # the typed case (load_run)
            name, mode = (case.framework, case.mode) if case is not None else (t.framework, None)
            mode = mode or (m["mode"].iloc[0] if len(m) and isinstance(m["mode"].iloc[0], str) else None)
            rows.append({
                "run": run.name, "framework": t.framework, "framework_name": name, "mode": mode,
                "batch_size": t.batch_size, "source": t.source, "steps": len(t.iterations), "clean_step_ms": clean,
                "gpu_busy_ms": busy, "kernel_sum_ms": ksum,
                "idle_ms": None if clean is None or busy is None else clean - busy,
                "idle_share": None if not clean or busy is None else 1 - busy / clean,
                "busy_share_of_clean": None if not clean else ksum / clean,
                "capture_step_ms": None if not t.step_ns else t.step_ns / 1e6, "pass": t.pass_name,
                "compute_busy_ms": None if compute_ns is None else compute_ns / 1e6})
    return pd.DataFrame(rows, columns=COLUMNS)


def best_modes(lb: pd.DataFrame, batch_size: int = 64) -> pd.DataFrame:
    """Per run x framework at ``batch_size``: the mode with the lowest clean step and its idle share
    (rows without a clean step are not candidates); ``modes_compared`` lists every mode with its step."""
    rows = []
    sub = lb[(lb["batch_size"] == batch_size) & lb["clean_step_ms"].notna()]
    for (run, name), g in sub.groupby(["run", "framework_name"], sort=False):
        g = g.sort_values("clean_step_ms", kind="stable")
        b = g.iloc[0]
        rows.append({"run": run, "framework_name": name, "label": fw_label(name),
                     "batch_size": batch_size, "best": b["framework"], "mode": b["mode"],
                     "clean_step_ms": b["clean_step_ms"], "gpu_busy_ms": b["gpu_busy_ms"],
                     "idle_share": b["idle_share"],
                     "modes_compared": ", ".join(f"{m} {s:.3f} ms" for m, s in zip(g["mode"], g["clean_step_ms"],
                                                                                    strict=True))})
    out = pd.DataFrame(rows, columns=BEST_COLUMNS)
    if len(out):
        order = {k: i for i, k in enumerate(sorted(set(out["framework_name"]), key=_registry_rank))}
        out = out.sort_values(["run", "framework_name"], key=lambda c: c.map(order) if c.name == "framework_name"
                              else c, kind="stable").reset_index(drop=True)
    return out


def best_mode_lines(best: pd.DataFrame) -> list[str]:
    """The first screen's sentences, one per framework: best mode, its clean step, busy and idle share."""
    out = []
    for _, b in best.iterrows():
        busy = "no GPU-busy figure" if pd.isna(b["gpu_busy_ms"]) else (
            f"GPU busy {b['gpu_busy_ms']:.3f} ms of it (union of kernel intervals per traced step), idle "
            f"{b['idle_share']:.0%}")
        out.append(f"{b['label']} bs {b['batch_size']} ({b['run']}): fastest mode {b['mode']}, clean step "
                   f"{b['clean_step_ms']:.3f} ms (median), {busy}; modes: {b['modes_compared']}")
    return out
