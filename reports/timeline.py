"""Chrome-trace / Perfetto JSON export of the merged op / library-call / kernel timeline.

One process per run x framework x batch size (named e.g. "PyTorch bs64 (run r1)"), one thread
per lane (step/phase, framework ops, library calls, kernels), each split by the source's own
thread or stream so that events in one lane never overlap unless they nest. Every process's
time starts at 0, so two frameworks line up side by side when the file is opened in
https://ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

from typing import Any

from .analysis import Run, fw_label, timeline_events

LANE_TID = {"phase": 1, "op": 100, "library_call": 200, "kernel": 300}
LANE_NAME = {"phase": "step / phase", "op": "framework ops", "library_call": "library calls",
             "kernel": "kernels"}
_ARG_COLS = ("kind", "canonical_op", "direction", "phase", "layer", "op_name", "library", "library_call",
             "kernel_name", "math_mode", "shapes", "flops", "iteration", "source", "stream", "grid_x",
             "grid_y", "grid_z", "block_x", "block_y", "block_z", "correlation_id", "derived")


def _name(e: dict) -> str:
    for col in ("kernel_name", "library_call", "op_name"):
        if col == "kernel_name" and e["lane"] != "kernel":
            continue
        if e.get(col) is not None:
            return str(e[col])
    return str(e.get("canonical_op") or e["kind"])


def _jsonable(v: Any) -> Any:
    return v.item() if hasattr(v, "item") else v


def chrome_trace(runs: list[Run], all_iterations: bool = False) -> dict:
    """The trace as a dict ({"traceEvents": [...], "displayTimeUnit": "ms"})."""
    events: list[dict] = []
    pid = 0
    for run in runs:
        tl = timeline_events(run, all_iterations=all_iterations)
        for (fw, bs), g in tl.groupby(["framework", tl["batch_size"].fillna(-1)], sort=False):
            pid += 1
            label = f"{fw_label(fw)} bs{bs if bs != -1 else '?'}" + (f" (run {run.name})" if len(runs) > 1 else "")
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
            tids: dict[tuple[str, Any], int] = {}
            g = g.sort_values(["lane", "rel_ns", "dur_ns"], ascending=[True, True, False])
            for e in g.astype(object).where(g.notna(), None).to_dict("records"):
                lane = e["lane"]
                sub = e["stream"] if lane == "kernel" else e["tid"]
                sub = None if sub is None else int(sub)
                key = (lane, sub)
                if key not in tids:
                    tid = LANE_TID[lane] + sum(1 for k in tids if k[0] == lane)
                    tids[key] = tid
                    suffix = "" if sub is None else (f" (stream {sub})" if lane == "kernel" else f" (thread {sub})")
                    events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                                   "args": {"name": LANE_NAME[lane] + suffix}})
                    events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                                   "args": {"sort_index": tid}})
                args = {c: _jsonable(e.get(c)) for c in _ARG_COLS if c in e}
                events.append({"ph": "X", "name": _name(e), "cat": lane, "pid": pid, "tid": tids[key],
                               "ts": e["rel_ns"] / 1e3, "dur": max(float(e["dur_ns"]) / 1e3, 0.001),
                               "args": {k: v for k, v in args.items() if v is not None}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": "kernelmap report", "runs": [r.name for r in runs],
                          "note": "each process starts at 0: times are relative to its shown iteration"}}
