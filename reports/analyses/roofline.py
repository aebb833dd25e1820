"""Achieved FLOP/s against the device's peak."""

from __future__ import annotations

from typing import Any

import pandas as pd

from kernelmap import schema
from kernelmap.flops import layer_flops

from .base import Run, field_at, fw_label, peak_flops
from .ops import distinct_values
from .timed import records_of, timed_events


# --- roofline ----------------------------------------------------------------------------------
def gpu_name(run: Run) -> str | None:
    v = field_at(run.manifest, "gpu.name")
    return v if isinstance(v, str) else None


def roofline(runs: list[Run]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Achieved FLOP/s of conv and linear work vs the device's peak.

    One row per framework x batch size x layer x canonical op x direction: FLOPs per step (from
    the op's ``flops``) over the kernel time per step of that op. Returns (table, peaks) where
    peaks maps run -> {'gpu', 'fp32', 'tf32'} or a 'note' why no peak is known, and 'not_shown':
    the frameworks whose backward is left out, and why."""
    rows, peaks = [], {}
    for run in runs:
        no_bwd: list[str] = []  # frameworks whose backward this run's traces cannot place
        name = gpu_name(run)
        pk = peak_flops(name)
        peaks[run.name] = {"gpu": name, **(pk or {})} if pk else {
            "gpu": name, "note": "peak unknown (CPU run, or a GPU not in the peak table)"}
        rec = records_of(run)
        for t in timed_events(run):
            ev = t.events[t.events["canonical_op"].isin(["conv2d", "linear"])]
            if ev.empty:
                continue
            src_ops = rec[(rec["source"] == t.source) & (rec["kind"] == "op")
                          & rec["run"].isin(t.events["run"].dropna().unique())]
            for (layer, op, d), g in ev.groupby([ev["layer"].fillna(schema.UNKNOWN), "canonical_op",
                                                 ev["direction"].fillna("none")]):
                flops = g["flops"].dropna()
                if flops.empty and t.level == "kernel":
                    linked = src_ops[src_ops["event_id"].isin(g["op_event_id"].dropna().unique())
                                     & src_ops["run"].isin(g["run"].unique())]
                    flops = linked["flops"].dropna()
                if flops.empty and t.batch_size is not None:
                    # Nothing recorded per event: the spec's shapes give the layer's FLOPs per step.
                    model = layer_flops(layer, d, int(t.batch_size))
                    flops = pd.Series([model] * t.n_steps, dtype="float64") if model else flops
                if flops.empty:
                    if t.level == "op" and d == "bwd" and t.framework not in no_bwd:
                        no_bwd.append(t.framework)
                    continue
                ns = float(g["dur_ns"].sum())
                modes = distinct_values(g["math_mode"])
                rows.append({"run": run.name, "framework": t.framework, "batch_size": t.batch_size,
                             "layer": layer, "canonical_op": op, "direction": d, "level": t.level,
                             "device": "gpu" if t.level == "kernel" else "cpu",
                             "flops_per_step": float(flops.sum()) / t.n_steps,
                             "ms_per_step": ns / t.n_steps / 1e6,
                             "achieved_flops": float(flops.sum()) / (ns / 1e9) if ns else None,
                             "math_mode": "/".join(modes) if modes else None})
        if no_bwd:  # named: a framework whose trace splits the gradients (XLA's) shows its backward
            peaks[run.name]["not_shown"] = (
                f"backward not shown for {', '.join(fw_label(fw) for fw in no_bwd)}: a CPU trace's backward op "
                "covers both gradients (data and weight) and records no FLOPs; the model gives FLOPs per gradient only")
    return pd.DataFrame(rows, columns=["run", "framework", "batch_size", "layer", "canonical_op",
                                       "direction", "level", "device", "flops_per_step", "ms_per_step",
                                       "achieved_flops", "math_mode"]), peaks


