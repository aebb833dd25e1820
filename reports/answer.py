"""The report's answer, first on the page: per layer and direction, what each framework runs
(library call, algorithm, kernel or implementation), its time per step, and its time against the
reference framework's (PyTorch), frameworks side by side on one row.

Computed from ``analysis.layer_table`` (its rows: run x batch size x layer x direction x
framework); this module only pivots and compares them. Rendering is in ``cli.py``.

**One time basis per row.** A row compares one kind of time (``basis.TimeKind``) for every
framework, named in ``compared_on`` and printed in the table: GPU kernel time (kernel-level
traces); on the CPU the library calls' own time (oneDNN, oneMKL logs; libs pass) where every
CPU framework on the row has it, else the framework ops' time (framework profiler pass). Each
cell names its pass (``<fw>.pass``). A row whose frameworks ran on different devices holds
different kinds: no ratio crosses them.

**A ratio only between comparable figures** (``basis.comparable``, the rule in its docstring):
host-clock figures (framework-op, library-call time) only where their pass agrees with its own
clean pass within noise (95% intervals overlap; older runs: the overhead verdict "within noise")
and neither that pass nor the clean pass was flagged contended; device-clock figures (GPU kernel
time) only where their pass was not flagged contended. Where a ratio is not drawn, ``<fw>.no_ratio``
says why, in words the page prints (e.g. "no ratio: PyTorch's framework pass ran 5.14x its clean
pass").
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from kernelmap.frameworks import spec

from kernelmap import frameworks, schema

from . import analysis as A
from .analyses.basis import PassState, StateKey, TimeKind, comparable

# one answer row: which layer and direction it is, then per framework these fields
FW_FIELDS = ("libraries", "library_calls", "algos", "kernels", "ms_per_step", "time_source", "time_kind", "pass",
             "comparable", "why_not")
KEY = ("run", "batch_size", "layer", "direction")
GAP = A.TIME_GAP  # a time ratio this far from 1 (either way) is called a gap
LIBRARY_TIME = str(TimeKind.LIBRARY)
OP_TIME = str(TimeKind.OP)
KERNEL_TIME = str(TimeKind.KERNEL)
MIXED = "mixed"  # a row whose frameworks' figures are of different kinds
NO_RATIO = "no ratio"
UNSPLIT_BWD = "different work per framework (a backward whose halves could not be told apart)"


def no_capture_runs(runs: list[A.Run]) -> list[str]:
    """Names of the runs whose results record no capture pass (only the clean pass ran:
    ``--profile none``), so nothing per layer can be said of them."""
    out = []
    for run in runs:
        passes = {p for r in run.results if isinstance(r, dict) for p in A.passes_of(r)}
        if run.results and passes <= {"clean"}:
            out.append(run.name)
    return out


def _cell_time(r: pd.Series, lib_time: bool) -> tuple[TimeKind, Any, str | None, str]:
    """(kind, ms per step, pass, source) of one framework's cell on a row."""
    if r["level"] == "kernel":
        return TimeKind.KERNEL, r["ms_per_step"], r.get("pass"), r["time_source"]
    if lib_time:
        return TimeKind.LIBRARY, r["ms_per_step"], r.get("pass"), r["time_source"]
    return TimeKind.OP, r["op_ms_per_step"], r.get("op_pass"), f"framework ops of the trace ({r['framework']})"


def answer_table(layers: pd.DataFrame, states: dict[StateKey, PassState] | None = None
                 ) -> tuple[pd.DataFrame, list[str]]:
    """One row per run x batch size x layer x direction; per framework ``<fw>.<field>`` for
    ``FW_FIELDS``, and for each framework but the reference ``<fw>.vs_ref`` (its time / the
    reference's, drawn only between comparable figures of one kind) and ``<fw>.no_ratio`` (why there
    is none). ``states``: ``basis.pass_states`` of the runs; without them no figure is comparable.
    Returns (table, frameworks in column order, the reference first)."""
    if layers is None or layers.empty:
        return pd.DataFrame(columns=list(KEY)), []
    states = states or {}
    present = set(layers["framework"])
    fws = frameworks.key_order(present)  # frameworks, each in its modes (case keys)
    ref = frameworks.REFERENCE
    rows: list[dict[str, Any]] = []
    for key, g in layers.groupby(list(KEY), sort=False, dropna=False):
        row: dict[str, Any] = dict(zip(KEY, key, strict=True))
        row["canonical_op"] = g["canonical_op"].iloc[0]
        by_fw = {r["framework"]: r for _, r in g.iterrows()}
        # library-call time where every CPU (op-level) framework on the row has it
        lib_time = all(pd.notna(r["ms_per_step"]) for r in by_fw.values() if r["level"] == "op")
        kinds = set()
        for fw, r in by_fw.items():
            kind, ms, pass_, source = _cell_time(r, lib_time)
            ok, why = comparable(states, row["run"], fw, row["batch_size"], pass_, kind) if states else (
                False, "no pass figures were given to judge it by")
            kinds.add(kind)
            row.update({f"{fw}.libraries": r["libraries"], f"{fw}.library_calls": r["library_calls"],
                        f"{fw}.algos": r["algos"], f"{fw}.kernels": r["kernels"], f"{fw}.ms_per_step": ms,
                        f"{fw}.time_source": source, f"{fw}.time_kind": str(kind), f"{fw}.pass": pass_,
                        f"{fw}.comparable": ok, f"{fw}.why_not": why})
        row["compared_on"] = str(kinds.pop()) if len(kinds) == 1 else MIXED
        # a kernel-level bwd row is each framework's backward not split into its halves
        # (adapters._trace.refine_direction: PyTorch's FFT data gradient, MXNet's both halves):
        # different work per framework, so no ratio
        unsplit = (key[KEY.index("direction")] == schema.Direction.BWD
                   and any(r["level"] == "kernel" for r in by_fw.values()))
        for fw in fws:
            if fw == ref or fw not in by_fw:
                continue
            row[f"{fw}.vs_ref"], row[f"{fw}.no_ratio"] = _ratio(row, fw, ref, unsplit)
        rows.append(row)
    out = pd.DataFrame(rows)
    cols = [*KEY, "canonical_op", "compared_on"] + [
        f"{fw}.{k}" for fw in fws for k in (*FW_FIELDS, "vs_ref", "no_ratio") if fw != ref or k not in (
            "vs_ref", "no_ratio")]
    out = out.reindex(columns=cols)
    lorder = {layer.name: i for i, layer in enumerate(spec.LAYERS)}
    dorder = {d: i for i, d in enumerate(schema.DIRECTIONS)}
    out = out.assign(_l=out["layer"].map(lorder), _d=out["direction"].map(dorder)).sort_values(
        ["run", "batch_size", "_l", "_d"], na_position="last").drop(columns=["_l", "_d"]).reset_index(drop=True)
    return out, fws


def _ratio(row: dict[str, Any], fw: str, ref: str, unsplit: bool) -> tuple[float | None, str | None]:
    """(fw's time / ref's, None) where both figures may be compared, else (None, why not)."""
    ms, ref_ms = row.get(f"{fw}.ms_per_step"), row.get(f"{ref}.ms_per_step")
    if ms is None or pd.isna(ms):
        return None, None  # nothing of fw's to compare: the time cell says so
    if ref_ms is None or pd.isna(ref_ms) or not ref_ms > 0:
        return None, f"{NO_RATIO}: no {A.fw_label(ref)} time on this row"
    if unsplit:
        return None, f"{NO_RATIO}: {UNSPLIT_BWD}"
    if row[f"{fw}.time_kind"] != row[f"{ref}.time_kind"]:
        return None, (f"{NO_RATIO}: different kinds of time ({A.fw_label(fw)} {row[f'{fw}.time_kind']}, "
                      f"{A.fw_label(ref)} {row[f'{ref}.time_kind']})")
    why = [row[f"{f}.why_not"] for f in (ref, fw) if not row[f"{f}.comparable"]]
    if why:
        return None, f"{NO_RATIO}: " + "; ".join(why)
    return float(ms) / float(ref_ms), None
