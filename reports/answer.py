"""The report's answer, first on the page: per layer and direction, what each framework runs
(library call, algorithm, kernel or implementation), its time per step, and its time against the
reference framework's (PyTorch), frameworks side by side on one row.

Computed from ``analysis.layer_table`` (its rows: run x batch size x layer x direction x
framework); this module only pivots and compares them. Rendering is in ``cli.py``.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from kernelmap.frameworks import spec

from kernelmap import frameworks, schema

from . import analysis as A

# one answer row: which layer and direction it is, then per framework these fields
FW_FIELDS = ("libraries", "library_calls", "algos", "kernels", "ms_per_step", "time_source")
KEY = ("run", "batch_size", "layer", "direction")
GAP = A.TIME_GAP  # a time ratio this far from 1 (either way) is called a gap
LIBRARY_TIME = "library-call time"
OP_TIME = "framework-op time"


def no_capture_runs(runs: list[A.Run]) -> list[str]:
    """Names of the runs whose results record no capture pass (only the clean pass ran:
    ``--profile none``), so nothing per layer can be said of them."""
    out = []
    for run in runs:
        passes = {p for r in run.results if isinstance(r, dict) for p in A._passes(r)}
        if run.results and passes <= {"clean"}:
            out.append(run.name)
    return out


def answer_table(layers: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """One row per run x batch size x layer x direction; per framework ``<fw>.<field>`` for
    ``FW_FIELDS``, and for each framework but the reference ``<fw>.vs_ref``: its time / the
    reference's time on that row.

    Times compared on one row are of one kind: the library calls' own time (CPU library logs)
    where every framework on the row has it, else the framework ops' time (``op_ms_per_step``;
    on the GPU both are kernel time). ``compared_on`` names it. Returns (table, frameworks in
    column order, the reference first)."""
    if layers is None or layers.empty:
        return pd.DataFrame(columns=list(KEY)), []
    present = set(layers["framework"])
    fws = [f for f in frameworks.FRAMEWORKS if f in present] + sorted(present - set(frameworks.FRAMEWORKS))
    ref = frameworks.REFERENCE
    rows: list[dict[str, Any]] = []
    for key, g in layers.groupby(list(KEY), sort=False, dropna=False):
        row: dict[str, Any] = dict(zip(KEY, key, strict=True))
        row["canonical_op"] = g["canonical_op"].iloc[0]
        by_fw = {r["framework"]: r for _, r in g.iterrows()}
        lib_time = all(pd.notna(r["ms_per_step"]) for r in by_fw.values())
        row["compared_on"] = LIBRARY_TIME if lib_time and any(r["level"] == "op" for r in by_fw.values()) else (
            "kernel time" if lib_time else OP_TIME)
        for fw, r in by_fw.items():
            ms = r["ms_per_step"] if lib_time else r["op_ms_per_step"]
            row.update({f"{fw}.libraries": r["libraries"], f"{fw}.library_calls": r["library_calls"], f"{fw}.algos": r["algos"],
                        f"{fw}.kernels": r["kernels"], f"{fw}.ms_per_step": ms,
                        f"{fw}.time_source": r["time_source"] if lib_time else
                        f"framework ops of the trace ({r['framework']})"})
        ref_ms = row.get(f"{ref}.ms_per_step")
        # a kernel-level bwd row is each framework's backward not split into its halves
        # (adapters._trace.refine_direction: PyTorch's FFT data gradient, MXNet's both halves):
        # different work per framework, so no ratio
        if key[KEY.index("direction")] == schema.Direction.BWD and any(r["level"] == "kernel" for r in by_fw.values()):
            ref_ms = None
        for fw in fws:
            if fw == ref:
                continue
            ms = row.get(f"{fw}.ms_per_step")
            row[f"{fw}.vs_ref"] = (float(ms) / float(ref_ms) if ms is not None and pd.notna(ms)
                                   and ref_ms is not None and pd.notna(ref_ms) and ref_ms > 0 else None)
        rows.append(row)
    out = pd.DataFrame(rows)
    cols = [*KEY, "canonical_op", "compared_on"] + [f"{fw}.{k}" for fw in fws for k in (*FW_FIELDS, "vs_ref")
                                                     if fw != ref or k != "vs_ref"]
    out = out.reindex(columns=cols)
    lorder = {layer.name: i for i, layer in enumerate(spec.LAYERS)}
    dorder = {d: i for i, d in enumerate(schema.DIRECTIONS)}
    out = out.assign(_l=out["layer"].map(lorder), _d=out["direction"].map(dorder)).sort_values(
        ["run", "batch_size", "_l", "_d"], na_position="last").drop(columns=["_l", "_d"]).reset_index(drop=True)
    return out, fws
