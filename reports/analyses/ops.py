"""Op time and the side-by-side, per-layer and library-call tables."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kernelmap import schema
from kernelmap.calllink import without_return_type
from kernelmap.flops import layer_flops

from .base import Run, fw_label, replay_reason
from .basis import LIBS_PASS, TimeKind, comparable, pair_basis, pass_states
from .linked import framework_rows, libs_warmup, linked_calls, linked_libraries, log_steps, op_signature
from .mix import event_library
from .timed import direction_group, fill_from_links, op_calls, records_of, timed_events


# --- op time and the side-by-side table ------------------------------------------------------
def op_time(runs: list[Run]) -> pd.DataFrame:
    """Per run x framework x batch size x canonical op x direction x phase: time per step (ms),
    events per step, share of the step. ``level`` says whether kernels or ops were summed."""
    rows = []
    for run in runs:
        for t in timed_events(run):
            ev = t.events.assign(canonical_op=t.events["canonical_op"].fillna(schema.UNATTRIBUTED),
                                 direction=t.events["direction"].fillna("none"),
                                 phase=t.events["phase"].fillna("other"))
            for (op, d, ph), g in ev.groupby(["canonical_op", "direction", "phase"]):
                ms = float(g["dur_ns"].sum()) / t.n_steps / 1e6
                rows.append({"run": run.name, "framework": t.framework, "batch_size": t.batch_size,
                             "canonical_op": op, "direction": d, "phase": ph, "level": t.level,
                             "source": t.source, "ms_per_step": ms,
                             "events_per_step": len(g) / t.n_steps,
                             "share_of_step": ms * 1e6 / t.step_ns if t.step_ns else None})
    return pd.DataFrame(rows, columns=["run", "framework", "batch_size", "canonical_op", "direction",
                                       "phase", "level", "source", "ms_per_step", "events_per_step",
                                       "share_of_step"])


def short_kernel(name: str, limit: int = 110) -> str:
    """A kernel's name without return type, template arguments and parameters, for tables."""
    n = without_return_type(str(name).replace("<unnamed>", "{anon}"))  # void, cuBLAS gemv's std::enable_if<...>::type
    depth, out = 0, []
    for ch in n:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            break
        elif depth == 0:
            out.append(ch)
    n = "".join(out).strip() or n
    return n if len(n) <= limit else n[: limit - 1] + "…"


def distinct_values(s: pd.Series, limit: int = 6) -> list[str]:
    vals = [str(v) for v in pd.unique(s.dropna())]
    return vals[:limit] + ([f"... {len(vals) - limit} more"] if len(vals) > limit else [])


def op_table(run: Run, batch_size: int | None = None) -> tuple[pd.DataFrame, list[str]]:
    """The side-by-side table of one run at one batch size: one row per canonical op x direction,
    columns ``<framework>.<field>``, and ``differences`` saying plainly where the frameworks part.

    Returns (table, frameworks)."""
    rec = records_of(run)
    timed = [t for t in timed_events(run) if batch_size is None or t.batch_size == batch_size]
    if batch_size is None and timed:
        batch_size = timed[0].batch_size
        timed = [t for t in timed if t.batch_size == batch_size]
    fws = [t.framework for t in timed]
    per: dict[tuple[str, str], dict[str, Any]] = {}
    states = pass_states([run])
    for t in timed:
        kind = TimeKind.KERNEL if t.level == "kernel" else TimeKind.OP
        ok, why = comparable(states, run.name, t.framework, t.batch_size, t.pass_name, kind)
        allrows = framework_rows(rec, t.framework, t.batch_size)
        allrows = fill_from_links(allrows, allrows)
        ev = t.events.assign(canonical_op=t.events["canonical_op"].fillna(schema.UNATTRIBUTED),
                             direction=t.events["direction"].fillna("none"))
        lib = event_library(run, t)
        calls_n = op_calls(t).set_index(["canonical_op", "direction"])["calls_per_step"]
        by_sig = linked_libraries(run, t.framework, t.batch_size) if t.level == "op" else {}
        for (op, d), g in ev.groupby(["canonical_op", "direction"]):
            key = (op, d)
            a = allrows[(allrows["canonical_op"] == op) & (allrows["direction"].fillna("none") == d)]
            kernels = a[a["kind"] == "kernel"]
            ms = float(g["dur_ns"].sum()) / t.n_steps / 1e6
            if t.level == "op":
                # what was linked to these ops (CPU library logs), not what a name suggests
                sigs = set(op_signature(g))
                lib_calls = sorted({c for k in sigs if k in by_sig for c in by_sig[k]["library_calls"]})
            else:
                lib_calls = distinct_values(a[a["kind"] == "library_call"]["library_call"]) or distinct_values(a["library_call"])
            # kernel-level rows split a backward op (bwd_data/bwd_weight): their calls are kernel launches
            n_calls = calls_n.get((op, d)) if (op, d) in calls_n.index else None
            per.setdefault(key, {})[t.framework] = {
                "op_names": distinct_values(g["op_name"]) or distinct_values(a[a["kind"] == "op"]["op_name"]),
                "libraries": sorted(set(lib[g.index])),
                "library_calls": lib_calls,
                "kernels": distinct_values(kernels["kernel_name"].map(short_kernel, na_action="ignore")),
                "n_kernels": int(kernels["kernel_name"].nunique()),
                "calls_per_step": float(n_calls) if n_calls is not None else len(g) / t.n_steps,
                "calls_basis": "framework-op calls" if n_calls is not None else f"{t.level}s",
                "ms_per_step": ms,
                "share_of_step": ms * 1e6 / t.step_ns if t.step_ns else None,
                "math_modes": distinct_values(a["math_mode"]),
                "level": t.level,
                "time_kind": str(kind), "pass": t.pass_name, "comparable": ok, "why_not": why,
            }
    rows = []
    for (op, d), cells in per.items():
        row: dict[str, Any] = {"canonical_op": op, "direction": d}
        for fw in fws:
            for k, v in (cells.get(fw) or {}).items():
                row[f"{fw}.{k}"] = v
        row["differences"] = differences(cells, fws)
        rows.append(row)
    df = pd.DataFrame(rows)
    if len(df):
        order = {o: i for i, o in enumerate((*schema.CANONICAL_OPS, schema.UNATTRIBUTED))}
        dorder = {o: i for i, o in enumerate(schema.DIRECTIONS)}
        df = df.assign(_o=df["canonical_op"].map(order), _d=df["direction"].map(dorder)).sort_values(
            ["_o", "_d"]).drop(columns=["_o", "_d"]).reset_index(drop=True)
    return df, fws


LAYER_COLUMNS = ("run", "batch_size", "layer", "canonical_op", "direction", "framework", "level",
                 "libraries", "library_calls", "algos", "kernels", "calls_per_step", "ms_per_step", "time_source",
                 "time_kind", "pass", "op_ms_per_step", "op_pass", "reorders_per_step", "reorder_ms_per_step",
                 "flops_per_step", "achieved_flops", "math_modes", "steps_ms", "op_steps_ms")


def iteration_sums_ms(ev: pd.DataFrame, iterations: tuple[int, ...]) -> list[float] | None:
    """Per traced step (``iterations``, in order): the summed duration (ms) of ``ev`` in it, 0 where
    it has none. None where the trace has no iterations."""
    if not iterations:
        return None
    s = ev.groupby("iteration")["dur_ns"].sum()
    return [float(s.get(i, 0.0)) / 1e6 for i in iterations]


def logged_step_sums_ms(calls: pd.DataFrame, n_log: int | None) -> list[float] | None:
    """Per logged step of the libs pass: the summed duration (ms) of ``calls`` (one layer x
    direction's library-log calls). A log has no step marks, and every step makes the same calls:
    each log's calls, in log order, are cut into ``n_log`` runs of equal count, the k-th run being
    step k's. None where a log's count is not a multiple of ``n_log`` or a duration is missing."""
    if not n_log or calls.empty or calls["dur_ns"].isna().any():
        return None
    total = np.zeros(n_log)
    for _, g in calls.sort_values(["source_file", "event_id"]).groupby("source_file", sort=False):
        if len(g) % n_log:
            return None
        total += g["dur_ns"].to_numpy(dtype=float).reshape(n_log, -1).sum(axis=1)
    return [float(x) / 1e6 for x in total]


def layer_table(runs: list[Run]) -> pd.DataFrame:
    """Conv and linear work per layer and direction, for each framework: the library call(s), the
    algorithm (cuDNN engine id, oneDNN implementation), the kernel(s), the time per step and the
    FLOP/s that gives (the spec's FLOPs for the layer).

    Time per step: on the GPU the kernels' (the timed source's); on the CPU the library calls'
    own time from the library log (oneDNN primitives, BLAS calls; libs pass, per timed step: the
    log cut into its logged steps by ``logged_step_sums_ms`` and its warm-up steps left out, as the
    libs pass's own step times leave them out; per logged step, warm-up included, where its calls
    do not cut into steps), with ``time_source`` naming it; ``op_ms_per_step`` is the framework
    ops' time in the trace's pass (as in the op table), and the oneDNN layout reorders feeding the
    layer's primitives are counted apart (``reorders_per_step``, ``reorder_ms_per_step``, per
    logged step). ``time_kind`` and ``pass`` say what ``ms_per_step`` sums and which capture pass
    measured it (``basis.TimeKind``), ``op_pass`` the same of ``op_ms_per_step``; ``steps_ms`` and
    ``op_steps_ms`` are their per-step values (the traced iterations; the libs pass's timed steps),
    whose mean they are."""
    rows = []
    for run in runs:
        rec = records_of(run)
        for t in timed_events(run):
            rows += _layer_rows(run, rec, t)
    df = pd.DataFrame(rows, columns=list(LAYER_COLUMNS))
    if len(df):
        dorder = {o: i for i, o in enumerate(schema.DIRECTIONS)}
        df = df.assign(_d=df["direction"].map(dorder)).sort_values(
            ["run", "batch_size", "layer", "_d", "framework"]).drop(columns="_d").reset_index(drop=True)
    return df


LAYER_OPS = ("conv2d", "linear")  # the canonical ops of the model's layers (spec.Layer.kind): the layer table's rows


def _layer_rows(run: Run, rec: pd.DataFrame, t) -> list[dict]:
    """``layer_table``'s rows of one timed framework x batch size: one per layer x op x direction."""
    ev = t.events[t.events["canonical_op"].isin(LAYER_OPS) & t.events["layer"].notna()]
    if ev.empty:
        return []
    allrows = fill_from_links(framework_rows(rec, t.framework, t.batch_size), framework_rows(rec, t.framework, t.batch_size))
    lcalls = linked_calls(run, t.framework, t.batch_size) if t.level == "op" else None
    n_log, log_basis = log_steps(run, t.framework, t.batch_size) if t.level == "op" else (None, "")
    rows = []
    for (layer, op, d), g in ev.groupby(["layer", "canonical_op", ev["direction"].fillna("none")]):
        # an op-level "bwd" (CPU traces do not split a backward op) covers both gradients;
        # a kernel-level "bwd": kernels of the backward op not split into their halves
        split = d == "bwd" and t.level == "op"
        dirs = {"bwd", "bwd_data", "bwd_weight"} if split else {d}
        a = allrows[(allrows["canonical_op"] == op) & (allrows["layer"] == layer)
                    & allrows["direction"].fillna("none").isin(dirs)]
        calls = a[a["kind"] == "library_call"]
        kernels = a[a["kind"] == "kernel"]["kernel_name"]
        # on the GPU the algorithm is the one of the calls the kernels link to: a log also
        # holds a framework's autotuning calls (MXNet tries every algorithm once per process)
        algo_calls = calls if t.level == "op" else calls[calls["event_id"].isin(
            set(a.loc[a["kind"] == "kernel", "call_event_id"].dropna()))]
        onednn = calls[calls["library"] == "oneDNN"]
        # the user's own op inside the layer's (kernelmap's custom op): on the CPU it is all there
        # is of its kernel, so it is named where oneDNN names its implementation
        custom = a[a["kind"].isin(["op", "annotation"]) & (a["library"] == schema.Library.CUSTOM)]
        op_ms = float(g["dur_ns"].sum()) / t.n_steps / 1e6
        op_steps = iteration_sums_ms(g, t.iterations)
        if t.level == "op":
            time = _library_time(run, t, calls, n_log, log_basis)
            time.update(_reorders(lcalls, calls, n_log, layer, op, d))
            pair = pair_basis(pass_states([run]), run.name, t.framework, t.batch_size, LIBS_PASS, t.pass_name)
            if time["kind"] is TimeKind.LIBRARY and pair.withheld:  # the cell says why (basis.PAIR_RULE)
                time["source"] += f"; not held against the op time: {pair.why}"
        else:
            time = {"ms": op_ms, "calls_ps": None, "kind": TimeKind.KERNEL, "pass": t.pass_name,
                    "steps_ms": op_steps, "source": f"{t.level}s of the {t.source} trace ({t.pass_name} pass)",
                    "reorders_ps": None, "reorder_ms": None}
        ms = time["ms"]
        # FLOPs of an op-level "bwd": the gradients its library calls computed
        parts = sorted(set(calls["direction"].dropna()) & {"bwd_data", "bwd_weight"}) if split else [d]
        flops = sum(layer_flops(layer, x, int(t.batch_size)) or 0 for x in parts) or None \
            if t.batch_size is not None else None
        rows.append({
            "run": run.name, "batch_size": t.batch_size, "layer": layer, "canonical_op": op,
            "direction": d, "framework": t.framework, "level": t.level,
            "libraries": distinct_values(pd.concat([g["library"], calls["library"], custom["library"]]))
            or ["native"],
            # on the GPU the calls its kernels link to (not another pass's log of the same calls)
            "library_calls": distinct_values(pd.concat([(calls if t.level == "op" else algo_calls)["library_call"],
                                                        g["library_call"]])),
            "algos": distinct_values(algo_calls["algo"]),
            # oneDNN names its implementation (its "kernel") in the verbose line
            "kernels": distinct_values(kernels.map(short_kernel, na_action="ignore"))
            or distinct_values(onednn["kernel_name"]) + distinct_values(custom["op_name"]),
            "calls_per_step": time["calls_ps"], "ms_per_step": ms, "time_source": time["source"],
            "time_kind": None if time["kind"] is None else str(time["kind"]), "pass": time["pass"],
            "op_ms_per_step": op_ms, "op_pass": t.pass_name,
            "reorders_per_step": time["reorders_ps"], "reorder_ms_per_step": time["reorder_ms"],
            "flops_per_step": flops,
            "achieved_flops": flops / (ms / 1e3) if flops and ms else None,
            "math_modes": distinct_values(pd.concat([g["math_mode"], calls["math_mode"]])),
            "steps_ms": time["steps_ms"], "op_steps_ms": op_steps,
        })
    return rows


def _library_time(run: Run, t, calls: pd.DataFrame, n_log: int | None, log_basis: str) -> dict:
    """A CPU layer's time per step from its library calls' own durations (the libs pass's log; see
    ``layer_table``): ms, calls_ps, kind, pass, steps_ms and source (what it is, or why none)."""
    ms, calls_ps, source = None, None, f"no library log for this layer ({t.framework})"
    kind, pass_, steps_ms = None, None, None
    if len(calls) and n_log:
        calls_ps = len(calls) / n_log
        log = f"{'/'.join(sorted(set(calls['library'].dropna())))} log"
        source = f"{log}, {log_basis}; the log records no durations"
        if calls["dur_ns"].notna().all():
            kind, pass_ = TimeKind.LIBRARY, LIBS_PASS
            logged = logged_step_sums_ms(calls, n_log)
            w = libs_warmup(run, t.framework, t.batch_size)
            if logged is not None and w is not None and 0 <= w < n_log:
                # the timed steps only, like the steps the libs pass timed: a warm-up
                # step holds the libraries' first-call work (oneDNN's JIT)
                steps_ms = logged[w:]
                ms = float(np.mean(steps_ms))
                source = (f"{log}, libs pass: its {n_log - w} timed steps ({w} warm-up step(s) "
                          f"left out; each log's calls cut into its {n_log} logged steps in log order)")
            else:
                steps_ms = logged
                ms = float(calls["dur_ns"].sum()) / n_log / 1e6
                source = (f"{log}, {log_basis}, warm-up included (its calls do not cut into "
                          "its logged steps)")
    elif len(calls):
        source = f"library log: {log_basis}"
    return {"ms": ms, "calls_ps": calls_ps, "kind": kind, "pass": pass_, "steps_ms": steps_ms, "source": source}


def _reorders(lcalls: pd.DataFrame, calls: pd.DataFrame, n_log: int | None, layer, op: str, d: str) -> dict:
    """The oneDNN layout reorders feeding a CPU layer's primitives, per logged step (None where the
    layer has no logged calls)."""
    ro = lcalls[lcalls["canonical_op"].eq("reorder") & lcalls["op_canonical"].eq(op)
                & lcalls["op_layer"].eq(layer) & lcalls["op_dgroup"].eq(direction_group(d))]
    if n_log and len(calls):
        return {"reorders_ps": len(ro) / n_log, "reorder_ms": float(ro["dur_ns"].sum()) / n_log / 1e6}
    return {"reorders_ps": None, "reorder_ms": None}


LIBRARY_CALL_COLUMNS = ("run", "framework", "batch_size", "library", "library_call", "canonical_op", "layer",
                        "direction", "linked_to_op", "kernels_linked", "calls_per_step", "ms_per_step",
                        "logged_calls", "logged_steps", "calls_outside_steps", "basis", "sources")


def _step_basis(c: pd.DataFrame) -> tuple[pd.Series, dict[str, int]]:
    """Per call row, whether it ran in a traced step, and per source the number of traced steps its calls
    ran in (the per-step denominators)."""
    in_step = c["iteration"].notna()
    steps = {str(src): int(g["iteration"].nunique()) for src, g in c[in_step].groupby("source")}
    return in_step, steps


def library_calls(runs: list[Run]) -> pd.DataFrame:
    """Every library call kind per framework x batch size: library, call, the framework op it is linked
    to (``linked_to_op``: CPU library logs, by canonical op, layer, direction group; a oneDNN layout
    reorder is counted under the op of the primitive it feeds, as its own row; calls not linked to an op
    are listed under their own canonical op), how many kernels are linked to calls of the row
    (``kernels_linked``, GPU), and calls and time per step.

    Calls per step are the model's where the steps of the calls are known (``iteration``: XLA's own
    custom calls; GPU log calls that owned kernels in the libs pass's own trace): the calls in those
    steps over their number; calls of the log outside them (warm-up, the framework's autotuning trials)
    are ``calls_outside_steps``, never per step. Otherwise (a run without the libs pass's trace; the
    CPU) every logged call over the logged steps, as ``basis`` says."""
    rows = []
    for run in runs:
        rec = records_of(run)
        keys = rec[rec["kind"] == "library_call"][["case", "batch_size"]].drop_duplicates()
        for fw, bs in keys.itertuples(index=False):
            bs_v = None if pd.isna(bs) else int(bs)
            c = linked_calls(run, str(fw), bs_v)
            n_log, basis = log_steps(run, str(fw), bs_v)
            in_step, steps = _step_basis(c)
            by_steps = set(steps)  # sources whose calls per step come from their traced steps
            kern = framework_rows(rec, str(fw), bs_v)
            kern = kern[(kern["kind"] == "kernel") & kern["call_event_id"].notna()]
            per_call = kern.groupby("call_event_id").size()
            linked = c["op_canonical"].notna()
            c = c.assign(_op=c["op_canonical"].fillna(c["canonical_op"]).fillna(schema.UNATTRIBUTED),
                         _layer=c["op_layer"].where(linked, c["layer"]).fillna(schema.UNKNOWN),
                         # a call not linked to an op keeps its own direction (a conv's bwd_data and
                         # bwd_weight calls are two rows: cuDNN's two calls)
                         _dir=c["op_dgroup"].where(linked, c["direction"]).fillna("none"), _linked=linked,
                         _in_step=in_step)
            for (lib, call, op, layer, d, lk), g in c.groupby(
                    [c["library"].fillna(schema.UNKNOWN), c["library_call"].fillna(schema.UNKNOWN), "_op", "_layer", "_dir", "_linked"]):
                timed = g["dur_ns"].notna().all()
                srcs = sorted(set(g["source"].dropna().astype(str)))
                stepped = bool(srcs) and all(s in by_steps for s in srcs)
                replay = replay_reason(run, str(fw))
                if replay:  # calls made while warming up and capturing; a replayed step makes none
                    per_step, ms, outside = None, None, None
                    why = (f"{len(g)} call(s) while warming up and capturing, none in a replayed step "
                           f"({replay})")
                elif stepped:
                    inside = g[g["_in_step"]]
                    n_steps = max(steps[s] for s in srcs)
                    per_step = len(inside) / n_steps if n_steps else None
                    ms = float(inside["dur_ns"].sum()) / n_steps / 1e6 if n_steps and timed else None
                    why = (f"{n_steps} traced step(s) of the {'/'.join(srcs)} calls (calls outside them: warm-up, "
                           "autotuning, counted apart)")
                    outside = int((~g["_in_step"]).sum())
                else:
                    per_step = len(g) / n_log if n_log else None
                    ms = float(g["dur_ns"].sum()) / n_log / 1e6 if n_log and timed else None
                    why, outside = basis, None
                rows.append({"run": run.name, "framework": fw, "batch_size": bs_v, "library": lib,
                             "library_call": call, "canonical_op": op, "layer": None if layer == "-" else layer,
                             "direction": d, "linked_to_op": bool(lk),
                             "kernels_linked": int(per_call.reindex(g["event_id"].to_numpy()).fillna(0).sum()),
                             "calls_per_step": per_step, "ms_per_step": ms,
                             "logged_calls": len(g), "logged_steps": n_steps if stepped else n_log,
                             "calls_outside_steps": outside,
                             "basis": why if timed else f"{why}; no durations recorded", "sources": "/".join(srcs)})
    df = pd.DataFrame(rows, columns=list(LIBRARY_CALL_COLUMNS))
    if len(df):
        order = {o: i for i, o in enumerate(schema.CANONICAL_OPS)}
        df = df.assign(_o=df["canonical_op"].map(order).fillna(99)).sort_values(
            ["run", "batch_size", "framework", "_o", "layer", "direction", "library_call"],
            na_position="first").drop(columns="_o").reset_index(drop=True)
    return df


TIME_GAP = 1.5  # times on one row this many times apart (either way) are named as a gap


def _gap(ms: dict[str, float]) -> float | None:
    return max(ms.values()) / min(ms.values()) if len(ms) >= 2 and min(ms.values()) > 0 else None


def time_differences(cells: dict[str, dict], present: list[str]) -> list[str]:
    """"time differs Nx" between the frameworks whose figures may be compared (``basis.comparable``:
    the cell's ``comparable``, ``why_not``; the same ``time_kind``), and where a gap of ``TIME_GAP``
    would show only with a figure that may not be compared, "time not compared" with the reason. A
    cell without ``comparable`` is not compared."""
    ms = {fw: float(cells[fw]["ms_per_step"]) for fw in present
          if cells[fw].get("ms_per_step") is not None and not pd.isna(cells[fw]["ms_per_step"])}
    out = []
    ok = {fw: v for fw, v in ms.items() if cells[fw].get("comparable")}
    by_kind: dict[str, dict[str, float]] = {}
    for fw, v in ok.items():
        by_kind.setdefault(str(cells[fw].get("time_kind")), {})[fw] = v
    stated: set[str] = set()
    for kind, group in by_kind.items():
        gap = _gap(group)
        if gap is not None and gap >= TIME_GAP:
            out.append(f"time differs {gap:.1f}x ({kind}): "
                       + ", ".join(f"{fw_label(fw)} {v:.3g} ms" for fw, v in group.items()))
        if len(group) >= 2:
            stated |= set(group)
    gap = _gap(ms)
    left = [fw for fw in ms if fw not in stated]
    if left and gap is not None and gap >= TIME_GAP:
        why = [f"{cells[fw]['why_not']}" for fw in left if cells[fw].get("why_not")]
        kinds = {str(cells[fw].get("time_kind")) for fw in ms}
        if len(kinds) > 1:
            why.append("different kinds of time: " + ", ".join(
                f"{fw_label(fw)} {cells[fw].get('time_kind')}" for fw in ms))
        out.append("time not compared: " + "; ".join(dict.fromkeys(why or ["not judged"])))
    return out


def differences(cells: dict[str, dict], fws: list[str]) -> list[str]:
    """Plain statements of where frameworks differ for one op row: library, math mode, kernels,
    a time gap of ``TIME_GAP`` or more between figures that may be compared (``time_differences``),
    and different calls per step (counted the same way)."""
    present = [fw for fw in fws if fw in cells]
    missing = [fw for fw in fws if fw not in cells]
    out = []
    if missing and present:
        out.append(f"only {', '.join(fw_label(f) for f in present)} has this op")
    if len(present) < 2:
        return out

    def say(field_: str, what: str) -> None:
        sets = {fw: tuple(sorted(cells[fw][field_])) for fw in present}
        if len(set(sets.values())) > 1:
            out.append(f"{what} differs: " + ", ".join(
                f"{fw_label(fw)}: {'/'.join(v) or 'none recorded'}" for fw, v in sets.items()))

    say("libraries", "library")
    modes = {fw: tuple(sorted(cells[fw]["math_modes"])) for fw in present}
    if len(set(modes.values())) > 1:
        tf32 = {fw for fw, m in modes.items() if "tf32" in m}
        lead = "TF32 differs" if tf32 and len(tf32) < len(present) else "math mode differs"
        out.append(f"{lead}: " + ", ".join(f"{fw_label(fw)}: {'/'.join(m) or 'not recorded'}"
                                         for fw, m in modes.items()))
    libs = {fw: tuple(sorted(cells[fw]["libraries"])) for fw in present}
    kern = {fw: set(cells[fw]["kernels"]) for fw in present}
    if len(set(libs.values())) == 1 and all(kern.values()) and not set.intersection(*kern.values()):
        out.append("different algorithms (no kernel in common)")
    out += time_differences(cells, present)
    bases = {cells[fw].get("calls_basis") for fw in present}
    calls = {fw: cells[fw].get("calls_per_step") for fw in present}
    if len(bases) == 1 and None not in calls.values() and len({round(float(v), 2) for v in calls.values()}) > 1:
        out.append(f"{bases.pop()} per step differ: " + ", ".join(f"{fw_label(fw)} {v:.3g}" for fw, v in calls.items()))
    return out


