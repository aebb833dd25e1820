"""Scaling over devices (issue 39): each multi-device case against the same framework, mode and math on one device
at the same **global** batch size (``--devices 1 2 4``: every N trains the same B images a step, B/N a device;
docs/DEVICES.md). DataFrames only.

From the clean pass (results.json: the median step over the used trials and its 95% interval; rank 0's on a
framework of one process per device, whose ranks step together): ``speedup`` = t1 / tN and ``efficiency`` =
t1 / (N · tN), the strong-scaling efficiency of a fixed global batch (1: N devices take 1/N of the time), with the
interval the two steps' 95% intervals give (``efficiency_low`` = t1 low / (N · tN high), ``efficiency_high``). On
the CPU the N "devices" are shares of the same cores: the figure says what the code path costs, not how the
framework scales. Beside it, the communication of the case's traced steps (``comm.per_case``: the median over the
ranks of each rank's median step): compute, communication, exposed communication, overlap share.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
from kernelmap.frameworks.case import Case

from .base import Busy, field_at
from .comm import per_case, per_step

COLUMNS = ["run", "case", "label", "framework", "mode", "math", "device", "batch_size", "devices", "step_ms",
           "ci95_low_ms", "ci95_high_ms", "images_per_s", "one_device_case", "one_device_step_ms", "speedup",
           "efficiency", "efficiency_low", "efficiency_high", "busy", "steps", "one_device_steps", "comm_source",
           "ranks", "compute_ms", "communication_ms", "exposed_ms", "overlap_share"]
KIND = "strong scaling: the same global batch at every N; efficiency = t1 / (N · tN) from the clean pass's medians"
_COMM = ("compute_ms", "communication_ms", "exposed_ms", "overlap_share")


def _key(r: dict) -> tuple:
    """What an N-device case shares with its one-device case: framework, mode, math, device, global batch."""
    return (field_at(r, "framework"), field_at(r, "mode"), field_at(r, "math"), field_at(r, "device"),
            field_at(r, "batch_size"))


def _label(r: dict) -> str:
    """The case's label on one device (its columns line up across N): ``PyTorch``, ``MXNet hybridized``."""
    fw, mode, math = (field_at(r, k) for k in ("framework", "mode", "math"))
    try:
        return Case(fw, mode, math).label
    except ValueError:  # an older entry without its mode or math: the framework's name
        return str(fw)


def _comm(steps: pd.DataFrame | None) -> dict[str, dict[str, Any]]:
    """{case folder: the communication figures of its traced steps (``steps``: ``comm.per_step`` of a run's
    records), the median over its ranks} (the first source in name order where a case was traced by several
    passes)."""
    if steps is None:
        return {}
    cases = per_case(steps)
    out = {}
    for case, g in cases.groupby("run", sort=True):
        src = sorted(g["source"].unique())[0]
        g = g[g["source"] == src]
        out[str(case)] = {"comm_source": src, "ranks": len(g), **{c: float(g[c].median()) for c in _COMM}}
    return out


def _ms(x: Any) -> float | None:
    return None if x is None else float(x) * 1e3


def scaling(runs: list, steps: Mapping[str, pd.DataFrame] | None = None) -> pd.DataFrame:
    """``COLUMNS``: one row per case of every run that has a case on more than one device (its one-device cases
    too, efficiency 1 by definition), sorted by device, batch size, framework and N. ``steps``: run name ->
    ``comm.per_step`` of its records where the caller has them (computed here otherwise)."""
    rows = []
    for run in runs:
        if not any((field_at(r, "devices") or 1) > 1 for r in run.results):
            continue
        base = {_key(r): r for r in run.results if (field_at(r, "devices") or 1) == 1}
        comm = _comm(steps.get(run.name) if steps is not None
                     else per_step(run.records) if run.records is not None else None)
        for r in run.results:
            n = int(field_at(r, "devices") or 1)
            one = base.get(_key(r))
            t, t1 = field_at(r, "median_step_s"), field_at(one, "median_step_s") if one else None
            lo, hi = field_at(r, "ci95_low_s"), field_at(r, "ci95_high_s")
            lo1, hi1 = (field_at(one, "ci95_low_s"), field_at(one, "ci95_high_s")) if one else (None, None)
            eff = t1 / (n * t) if t and t1 else None
            busy = [Busy.of(x).contended for x in (r, one) if x is not None]
            rows.append({"run": run.name, "case": field_at(r, "dir"), "label": _label(r),
                         "framework": field_at(r, "framework"), "mode": field_at(r, "mode"),
                         "math": field_at(r, "math"), "device": field_at(r, "device"),
                         "batch_size": field_at(r, "batch_size"), "devices": n, "step_ms": _ms(t),
                         "ci95_low_ms": _ms(lo), "ci95_high_ms": _ms(hi),
                         "images_per_s": field_at(r, "images_per_s"),
                         "one_device_case": field_at(one, "dir") if one else None, "one_device_step_ms": _ms(t1),
                         "speedup": t1 / t if t and t1 else None, "efficiency": eff,
                         "efficiency_low": lo1 / (n * hi) if lo1 and hi else None,
                         "efficiency_high": hi1 / (n * lo) if hi1 and lo else None,
                         "busy": None if None in busy else any(busy),
                         "steps": field_at(r, "steps"), "one_device_steps": field_at(one, "steps") if one else None,
                         **comm.get(str(field_at(r, "dir")), {})})
    out = pd.DataFrame(rows, columns=COLUMNS)
    return out.sort_values(["run", "device", "batch_size", "framework", "mode", "math", "devices"],
                           kind="stable").reset_index(drop=True)


def side_by_side(table: pd.DataFrame) -> pd.DataFrame:
    """The first screen's table: per run, device, batch size and N, one column per framework (its mode and math in
    its label): efficiency, the clean step (ms) and the exposed communication per step (ms) where traced."""
    if table.empty:
        return pd.DataFrame(columns=["run", "device", "batch_size", "devices"])

    def cell(x: pd.Series) -> str:
        step = f"{x['step_ms']:.3g} ms" if pd.notna(x["step_ms"]) else "–"
        eff = "–" if pd.isna(x["efficiency"]) else f"{x['efficiency']:.2f}"
        exposed = "" if pd.isna(x["exposed_ms"]) else f", exposed comm {x['exposed_ms']:.3g} ms"
        busy = " BUSY" if x["busy"] is True else ""
        return f"{eff} ({step}{exposed}){busy}"

    t = table.assign(cell=table.apply(cell, axis=1))
    wide = t.pivot_table(index=["run", "device", "batch_size", "devices"], columns="label", values="cell",
                         aggfunc="first", sort=False)
    return wide.reset_index().rename_axis(columns=None)
