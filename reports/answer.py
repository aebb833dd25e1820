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

import numpy as np
import pandas as pd
from kernelmap.frameworks import spec
from kernelmap.frameworks.case import order_names

from kernelmap import adapters, frameworks, schema, timing

from . import analysis as A
from .analyses.basis import CLEAN, CpuState, PassState, StateKey, TimeKind, comparable
from .analyses.opcpu import LayerCpu, OpCpu, layer_cpu

# one answer row: which layer and direction it is, then per framework these fields
FW_FIELDS = ("libraries", "library_calls", "algos", "kernels", "ms_per_step", "ci_ms", "time_source", "time_kind",
             "pass", "comparable", "why_not")
RATIO_FIELDS = ("vs_ref", "no_ratio", "vs_ref_noise")  # per framework but the reference
KEY = ("run", "batch_size", "layer", "direction")
GAP = A.TIME_GAP  # a time ratio this far from 1 (either way) is called a gap
LIBRARY_TIME = str(TimeKind.LIBRARY)
OP_TIME = str(TimeKind.OP)
KERNEL_TIME = str(TimeKind.KERNEL)
MIXED = "mixed"  # a row whose frameworks' figures are of different kinds
NO_RATIO = "no ratio"
UNSPLIT_BWD = "different work per framework (a backward whose halves could not be told apart)"
# A layer's backward rows of every kind (bwd, bwd_data, bwd_weight, bwd_bias) summed per framework: the row on
# which frameworks that split a backward differently do the same work (merge_backward)
BWD_ALL = "bwd (all)"
BACKWARD = frozenset({schema.Direction.BWD, schema.Direction.BWD_DATA, schema.Direction.BWD_WEIGHT,
                      schema.Direction.BWD_BIAS})
_SUMMED = ("ms_per_step", "op_ms_per_step", "calls_per_step", "reorders_per_step", "reorder_ms_per_step",
           "flops_per_step")
_JOINED = ("libraries", "library_calls", "algos", "kernels", "math_modes")
_STEPWISE = ("steps_ms", "op_steps_ms")  # per traced step, in the same steps' order (layer_table)


def _whole_backward(directions: frozenset) -> bool:
    """Whether a framework's backward rows of a layer can be its whole backward: an unsplit ``bwd``, or split
    rows that hold its weight gradient (a layer whose input is the model's needs no data gradient, and a
    trace may label a data gradient as the weight's: the sum counts each backward op once either way)."""
    return bool({schema.Direction.BWD, schema.Direction.BWD_WEIGHT} & directions)


def one_backward_row(merged: pd.DataFrame) -> pd.DataFrame:
    """``merge_backward``'s rows with, where a layer has a ``BWD_ALL`` row, its other backward rows left out:
    one forward and one backward row per layer, every framework on each."""
    if merged is None or merged.empty:
        return merged
    key = ["run", "batch_size", "layer"]
    summed = merged.loc[merged["direction"] == BWD_ALL, key].drop_duplicates()
    hit = merged[key].merge(summed.assign(_all=True), on=key, how="left")["_all"].notna().to_numpy()
    return merged[~(hit & merged["direction"].isin(BACKWARD).to_numpy(bool))]


def merge_backward(layers: pd.DataFrame) -> pd.DataFrame:
    """``layers`` plus, for each run x batch size x layer whose frameworks split its backward into different
    rows (one framework a single ``bwd``, another ``bwd_data`` + ``bwd_weight``) and each holds both halves
    (``_whole_backward``), a ``BWD_ALL`` row per framework: the sum of its backward rows of that layer (times, calls and FLOPs summed, NaN where a part
    has none; lists joined), so every framework's whole backward meets on one row. The split rows stay."""
    if layers is None or layers.empty:
        return layers
    bwd = layers[layers["direction"].isin(BACKWARD)]
    extra = []
    for _, g in bwd.groupby(["run", "batch_size", "layer"], sort=False, dropna=False):
        splits = {fw: frozenset(x["direction"]) for fw, x in g.groupby("framework")}
        if len(set(splits.values())) < 2 or not all(map(_whole_backward, splits.values())):
            continue  # on the same rows already, or a framework's backward is not all here: a sum would compare halves
        for _, x in g.groupby("framework", sort=False):
            row = x.iloc[0].to_dict()
            row["direction"] = BWD_ALL
            for c in _SUMMED:
                if c in x:
                    row[c] = x[c].sum() if x[c].notna().all() else float("nan")
            for c in _JOINED:
                if c in x:
                    row[c] = list(dict.fromkeys(v for lst in x[c] if isinstance(lst, list) for v in lst))
            for c in _STEPWISE:  # the same traced steps in every part: summed step by step, else none
                if c in x:
                    parts = [v for v in x[c] if isinstance(v, list | tuple)]
                    same = len(parts) == len(x) and len({len(v) for v in parts}) == 1
                    row[c] = [float(s) for s in np.sum(np.asarray(parts, dtype=float), axis=0)] if same else None
            row["time_source"] = f"{row.get('time_source')}; summed over {', '.join(sorted(x['direction']))}"
            extra.append(row)
    return pd.concat([layers, pd.DataFrame(extra)], ignore_index=True) if extra else layers


def no_capture_runs(runs: list[A.Run]) -> list[str]:
    """Names of the runs whose results record no capture pass (only the clean pass ran:
    ``--profile none``), so nothing per layer can be said of them."""
    out = []
    for run in runs:
        passes = {p for r in run.results if isinstance(r, dict) for p in A.passes_of(r)}
        if run.results and passes <= {"clean"}:
            out.append(run.name)
    return out


def _cell_ci(r: pd.Series, kind: TimeKind) -> tuple[float, float] | None:
    """The 95% interval of a cell's time per step (the mean of its per-step values: ``timing.mean_ci``), None
    without two of them."""
    steps = r.get("op_steps_ms" if kind == TimeKind.OP else "steps_ms")
    return timing.mean_ci(list(steps)) if isinstance(steps, list | tuple) and len(steps) > 1 else None


def _cell_time(r: pd.Series, lib_time: bool) -> tuple[TimeKind, Any, str | None, str]:
    """(kind, ms per step, pass, source) of one framework's cell on a row."""
    if r["level"] == "kernel":
        return TimeKind.KERNEL, r["ms_per_step"], r.get("pass"), r["time_source"]
    if lib_time:
        return TimeKind.LIBRARY, r["ms_per_step"], r.get("pass"), r["time_source"]
    says = _op_time_says(r["framework"])
    return TimeKind.OP, r["op_ms_per_step"], r.get("op_pass"), (
        f"framework ops of the trace ({r['framework']}){f' ({says})' if says else ''}; a CPU framework pass that "
        "sampled CPU time also ran the CPU sampler's thread beside them (cpusampler.OWN_RULE)")


def _op_time_says(framework: str) -> str | None:
    """What an op's time is in the framework's trace where its adapter says (``OP_TIME_SAYS``: XLA's CPU thunks)."""
    source = getattr(frameworks.REGISTRY.get(framework), "trace_source", None)
    return getattr(adapters.FORMATS.get(source), "OP_TIME_SAYS", None) if source else None


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
    layers = merge_backward(layers)
    present = set(layers["framework"])
    fws = order_names(present)  # frameworks, each in its modes (cases' names)
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
                        f"{fw}.ci_ms": _cell_ci(r, kind),
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
            row[f"{fw}.vs_ref_noise"] = ratio_noise(row, fw, ref)
        rows.append(row)
    out = pd.DataFrame(rows)
    cols = [*KEY, "canonical_op", "compared_on"] + [
        f"{fw}.{k}" for fw in fws for k in (*FW_FIELDS, *RATIO_FIELDS) if fw != ref or k not in RATIO_FIELDS]
    out = out.reindex(columns=cols)
    return _layer_order(out), fws


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


# --- the comparison on CPU time (timing.CPU_RULE): ratios that hold on a busy machine ----------------
WHOLE_STEP = "whole step"  # the CPU table's first row: the clean pass's CPU time per training step
ALL_DIRECTIONS = "fwd + bwd + update"
CPU_FIELDS = ("cpu_ms", "ci_ms", "pass", "utilisation", "busy", "method", "not_sampled", "comparable", "why_not")
SAMPLED = "ops' own CPU time (sampled)"  # a layer cell of opcpu.layer_cpu (basis.PER_OP_CPU)
SHARED = "pass CPU time (less the CPU sampler's own where it ran) x the layer's share of traced op time"  # basis.PER_LAYER_CPU
STEP_CPU = "process CPU time per step"  # the whole step's (timing.CPU_METHOD)
WITHHELD = "not sampled: withheld (no figure, no estimate)"  # a layer whose ops shared XLA's pool (cpusampler.POOL_RULE)


def _cpu_cell(st: CpuState | None, ms: Any, lc: LayerCpu | None = None, ops_ms: float | None = None,
              ops_ci: tuple[float, float] | None = None) -> dict[str, Any]:
    """One framework's CPU-time cell: its ms, the pass, how it was measured, whether it may be compared and why
    not; ``lc``: the layer's sampled CPU time (``basis.PER_OP_CPU``), used where measured, ``ops_ms`` the pass's
    traced ops' CPU time a step (``basis.OPS_WITHIN_CLEAN``), ``ops_ci`` its 95% interval."""
    if st is None:
        return {"cpu_ms": None, "comparable": False, "why_not": "no pass figures in results.json"}
    fig = st.figure or {}
    if lc is not None and lc.withheld:  # cpusampler.POOL_RULE: the samples hold another op's work; no estimate either
        return {"cpu_ms": None, "ci_ms": None, "pass": st.pass_name, "utilisation": None,
                "busy": st.busy.text if st.busy.contended else None, "method": WITHHELD, "not_sampled": lc.why,
                "comparable": False, "why_not": f"its ops' own CPU time not sampled: {lc.why}"}
    if lc is not None and lc.ms is not None:
        why = st.why_not(per_op_ms=ops_ms, per_op_ci=ops_ci)
        return {"cpu_ms": lc.ms, "ci_ms": lc.ci_ms, "pass": st.pass_name, "utilisation": lc.utilisation,
                "busy": st.busy.text if st.busy.contended else None, "method": SAMPLED, "comparable": not why,
                "why_not": why}
    why = st.why_not()
    not_sampled = lc.why if lc is not None and lc.why else None  # why a layer's cell is not its ops' sampled time
    if why and not_sampled:  # the share estimate withheld: why the sampled time is not there either
        why = f"{why}; its ops' own CPU time: {not_sampled}"
    ci = (fig.get("ci95_low_s"), fig.get("ci95_high_s")) if st.pass_name == CLEAN else (None, None)
    return {"cpu_ms": ms, "ci_ms": tuple(v * 1e3 for v in ci) if None not in ci else None,
            "pass": st.pass_name, "utilisation": st.utilisation,
            "busy": st.busy.text if st.busy.contended else None,
            "method": STEP_CPU if st.pass_name == CLEAN else SHARED, "not_sampled": not_sampled,
            "comparable": not why, "why_not": why}


def cpu_table(layers: pd.DataFrame, states: dict[StateKey, CpuState],
              op_totals: dict[tuple[str, str, Any], float],
              sampled: dict[tuple[str, str, Any], OpCpu] | None = None) -> tuple[pd.DataFrame, list[str]]:
    """The comparison on CPU time: per run x batch size, a whole-step row (the clean pass's CPU time per
    step, median of every clean trial: ``basis.CPU_ALL_TRIALS``, 95% interval) and a row per layer x direction (``PER_LAYER_CPU``:
    ``op_totals`` is ``basis.traced_op_ms``,
    from ``merge_backward(layers)`` so that every framework's backward is on one row); per framework
    ``<fw>.<field>`` for ``CPU_FIELDS`` and, but the reference, ``<fw>.vs_ref`` / ``<fw>.no_ratio`` and
    ``<fw>.vs_ref_noise`` (``ratio_noise``: where the ratio lies against the noise of its two figures).
    ``sampled`` (``opcpu.op_cpu_of``, by run, framework, batch size): a layer's cell is its ops' own sampled CPU
    time where measured (``basis.PER_OP_CPU``), compared on a busy machine too; else the share estimate, whose
    busy pass is a reason (``basis.UNEVEN_STRETCH``). Contention is marked (``busy``)."""
    sampled = sampled or {}
    keys = sorted({(k[0], k[2]) for k, st in states.items() if k[3] == CLEAN and st.figure},
                  key=lambda x: (str(x[0]), x[1] is None, x[1]))
    if not keys:
        return pd.DataFrame(columns=list(KEY)), []
    fws = order_names({k[1] for k in states})
    rows = []
    merged = (one_backward_row(merge_backward(layers)) if layers is not None and not layers.empty
              else pd.DataFrame(columns=list(KEY)))
    for run, bs in keys:
        row: dict[str, Any] = {"run": run, "batch_size": bs, "layer": WHOLE_STEP, "direction": ALL_DIRECTIONS}
        for fw in fws:
            st = states.get((run, fw, bs, CLEAN))
            ms = st.cpu_median_s * 1e3 if st and st.cpu_median_s is not None else None
            row.update({f"{fw}.{k}": v for k, v in _cpu_cell(st, ms).items()})
        rows.append(row)
        here = merged[(merged["run"] == run) & (merged["batch_size"] == bs)]
        for (layer, d), g in here.groupby(["layer", "direction"], sort=False):
            row = {"run": run, "batch_size": bs, "layer": layer, "direction": d}
            for _, r in g.iterrows():
                st = states.get((run, r["framework"], bs, r.get("op_pass") or ""))
                total = op_totals.get((run, r["framework"], bs))
                ms = (r["op_ms_per_step"] / total * st.cpu_median_s * 1e3 if st and st.cpu_median_s is not None
                      and total and pd.notna(r["op_ms_per_step"]) else None)
                oc = sampled.get((run, r["framework"], bs))
                lc = layer_cpu(oc, layer, set(BACKWARD) if d == BWD_ALL else {d}) if oc is not None else None
                cell = _cpu_cell(st, ms, lc, oc.ops_ms_per_step if oc is not None else None,
                                 oc.ops_ms_ci if oc is not None else None)
                row.update({f"{r['framework']}.{k}": v for k, v in cell.items()})
            rows.append(row)
    out = pd.DataFrame(rows)
    for fw in fws:
        if fw != frameworks.REFERENCE:
            out[[f"{fw}.vs_ref", f"{fw}.no_ratio"]] = [
                _cpu_ratio(r, fw, frameworks.REFERENCE) for r in out.to_dict("records")]
            out[f"{fw}.vs_ref_noise"] = [ratio_noise(r, fw, frameworks.REFERENCE) for r in out.to_dict("records")]
    return _layer_order(out), fws


NOISE_RULE = ("a ratio is within noise where the two figures' 95% intervals overlap (timing.placement): the "
              "difference it shows is then called noise, however far from 1 it reads. Each cell's interval: on CPU "
              "time its clean trials' median on the whole-step row, its sampled ops' per-step time on a layer's row; "
              "in the calls-and-kernels tables the mean over its traced steps (timing.mean_ci: within the one "
              "process each figure comes from, not widened by the noise between processes)")


def ratio_noise(row: dict[str, Any], fw: str, ref: str) -> str | None:
    """Where ``fw``'s figure lies against ``ref``'s on an answer row (``answer_table``, ``cpu_table``; ``NOISE_RULE``): a
    ``timing.Placement`` value (below: faster beyond noise, within, above: slower beyond noise), or None where the
    row has no ratio or either figure no interval."""
    v = row.get(f"{fw}.vs_ref")
    a, b = row.get(f"{fw}.ci_ms"), row.get(f"{ref}.ci_ms")
    if v is None or pd.isna(v) or not isinstance(a, tuple) or not isinstance(b, tuple):
        return None
    return str(timing.placement(a, b))


def _cpu_ratio(row: dict[str, Any], fw: str, ref: str) -> tuple[float | None, str | None]:
    """(fw's CPU time / ref's, None) where both cells are of one method and may be compared, else (None, why not):
    a sampled cell (``SAMPLED``) and a share estimate (``SHARED``: a case whose trace was not put on the samples'
    clock, or a layer whose ops lie outside them) measure different things, so no ratio crosses them."""
    ms, ref_ms = row.get(f"{fw}.cpu_ms"), row.get(f"{ref}.cpu_ms")
    withheld = [f for f in (fw, ref) if row.get(f"{f}.method") == WITHHELD]
    if withheld:  # cpusampler.POOL_RULE: no ratio, and the row says why
        return None, f"{NO_RATIO}: " + "; ".join(f"{A.fw_label(f)}'s ops' own CPU time not sampled: "
                                                 f"{row.get(f'{f}.not_sampled')}" for f in withheld)
    if ms is None or pd.isna(ms):
        return None, None
    if ref_ms is None or pd.isna(ref_ms) or not ref_ms > 0:
        return None, f"{NO_RATIO}: no {A.fw_label(ref)} CPU time on this row"
    how, ref_how = row.get(f"{fw}.method"), row.get(f"{ref}.method")
    if how != ref_how:
        why = "; ".join(f"{A.fw_label(f)}'s ops' own CPU time: {row[f'{f}.not_sampled']}" for f in (ref, fw)
                        if isinstance(row.get(f"{f}.not_sampled"), str))
        return None, (f"{NO_RATIO}: measured apart ({A.fw_label(fw)} {how}, {A.fw_label(ref)} {ref_how})"
                      + (f"; {why}" if why else ""))
    why = [row[f"{f}.why_not"] for f in (ref, fw) if not row.get(f"{f}.comparable")]
    return (None, f"{NO_RATIO}: " + "; ".join(why)) if why else (float(ms) / float(ref_ms), None)


def _layer_order(out: pd.DataFrame) -> pd.DataFrame:
    """Rows by run, batch size, the spec's layer order (the whole step first), direction order."""
    lorder = {WHOLE_STEP: -1, **{layer.name: i for i, layer in enumerate(spec.LAYERS)}}
    dorder = {d: i for i, d in enumerate((ALL_DIRECTIONS, *schema.DIRECTIONS, BWD_ALL))}
    return out.assign(_l=out["layer"].map(lorder), _d=out["direction"].map(dorder)).sort_values(
        ["run", "batch_size", "_l", "_d"], na_position="last", kind="stable").drop(
        columns=["_l", "_d"]).reset_index(drop=True)


def split_alone(ans: pd.DataFrame, fws: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows two or more frameworks have, rows only one has): a backward one framework alone splits into
    gradients (JAX's per-gradient rows) stands beside the others' on its layer's ``BWD_ALL`` row, so the
    page folds its own rows away."""
    if ans.empty:
        return ans, ans
    have = sum(ans[f"{fw}.library_calls"].map(lambda v: isinstance(v, list)).astype(int)
               for fw in fws if f"{fw}.library_calls" in ans)
    alone = (have == 1) & (len(fws) > 1)
    return ans[~alone], ans[alone]
