"""Findings ranked by what they would save, and the check of a finding's prediction (``kernelmap findings``).

Two kinds of finding, each in its own kind of time (never ranked against each other):

* **place** (a layer, or an op where no layer, x direction): the same place on two sides (two cases of one run
  at one batch size, or the two sides of a diff), one side's kernel time per traced step (op time on a CPU)
  above the other's. The predicted saving per step is the difference of the two sides' mean per-step times at
  that place (what ``kernelmap diff`` shows for it); its cause, each side's kernels there (library call,
  kernel, algorithm, math). A place is compared only where both sides run work there: a side whose work for it
  lies in another place (a fusion that carries no layer) has no row for it, so is no reference for it.
* **step** (the whole clean step): one case's clean-step median above another's; its cause split into the
  traced kernel (op) time per step and the rest of the step (host, launches, idle GPU).

A predicted saving inside the noise is called ``noise``, not a finding: a place's saving is a finding where the
U test over the traced steps calls the other side faster (``diff.verdict``: p < alpha and at least
``timing.NOISE_THRESHOLD`` of the median) **and** the saving's 95% bootstrap interval (steps resampled on each
side) is above 0; a step's where the clean trials' 95% intervals of the median do not overlap
(``diff.step_verdict``). Each side is compared with its fastest counterpart only.

The remedy of a finding is what differs between the two sides' cases (framework, mode, math); where it is a
case kernelmap runs, ``check`` judges the prediction against fresh runs of both cases: a hit where the measured
saving is within ``HIT_TOLERANCE`` of the predicted one. Nothing here runs or prints (``reports/findingscli.py``).
"""

from __future__ import annotations

import enum
import re
from typing import Any

import numpy as np
import pandas as pd
from kernelmap.frameworks.case import FIELDS

from kernelmap import timing
from kernelmap.calllink import mangled_head, without_return_type

from . import diff as D
from .base import Run, field_at

HIT_TOLERANCE = 0.30  # a prediction came true where the measured saving is within 30% of it
RESAMPLES, SEED = 2000, 0  # the saving's bootstrap interval
REMEDY_FIELDS = ("framework", "mode", "math")  # what a remedy may change that kernelmap can run
CAUSE_KERNELS = 2  # kernels named per side in a place's cause


class Kind(enum.StrEnum):
    PLACE = "place"
    STEP = "step"


class Call(enum.StrEnum):
    FINDING = "finding"
    BUSY = "busy machine"  # beyond noise, but a side's figures were measured on a busy machine: not called a finding
    NOISE = "noise"  # the predicted saving is inside the noise
    NOT_JUDGED = "not judged"  # too few steps or no trials' intervals to judge by


BASIS = {Kind.PLACE: "{level} time per traced step at this layer (op) x direction, from {source}; mean over "
                     "{steps} counted steps",
         Kind.STEP: "clean step: median of the clean trials' samples (wall time)"}
NOISE_RULE = (f"a place's saving is a finding where the U test calls the other side faster ({D.RULE}) and the "
              "saving's 95% bootstrap interval (steps resampled on each side) is above 0; a step's where the clean "
              "trials' 95% intervals of the median do not overlap; else noise (too few steps or no intervals: not "
              "judged); beyond noise but with a side measured on a busy machine: busy machine, not a finding")
HIT_RULE = (f"hit: the measured saving (fresh runs of both cases) within {HIT_TOLERANCE:.0%} of the predicted "
            "one; the hit rate is over the findings checked, and over those whose fresh runs ran on a quiet machine")

# share_of_case: the saving over the case's figure of the same kind of time (its traced kernel or op time per step
# for a place, its clean step for a step finding)
COLUMNS = ["rank", "kind", "call", "batch_size", "case", "remedy_case", "remedy", "runnable", "where", "direction",
           "saving_ms", "saving_lo_ms", "saving_hi_ms", "case_ms", "remedy_ms", "share_of_case", "p_value",
           "verdict", "cause", "caveat", "case_calls_step", "remedy_calls_step", "busy", "basis"]
CHECK_COLUMNS = ["measured_saving_ms", "measured_lo_ms", "measured_hi_ms", "measured_call", "measured_busy",
                 "error_pct", "hit", "check"]


# --- the sides of a run ----------------------------------------------------------------------------
def run_sides(run: Run, batch_sizes: set[int] | None = None, source: str | None = None) -> list[D.Side]:
    """A side per case x batch size of a normalised run that holds timed kernels or ops (``diff.make_side``)."""
    if run.records is None:
        return []
    out = []
    for e in run.results:
        bs = field_at(e, "batch_size")
        if not isinstance(e, dict) or (batch_sizes and bs not in batch_sizes):
            continue
        rec = run.records[(run.records["case"] == e.get("case")) & (run.records["batch_size"] == bs)]
        timed = rec["kind"].isin(D.TIMED_LEVELS) & rec["dur_ns"].notna() & rec["source"].isin(
            [source] if source else D.TRACE_SOURCES)
        if timed.any():  # a case with library logs only (a pack that kept no trace) has no side
            out.append(D.make_side(f"{e['case']} bs{bs}", rec, e, source))
    return out


def case_fields(side: D.Side) -> dict[str, Any]:
    return {k: side.entry.get(k) for k in FIELDS}


def remedy_of(x: D.Side, y: D.Side) -> tuple[str, bool]:
    """What differs between the cases of ``x`` and ``y`` (``field a -> b``), and whether kernelmap can run it: both
    are cases of a run (a framework and a mode) at one batch size and number of devices, differing in
    framework, mode or math."""
    fx, fy = case_fields(x), case_fields(y)
    changed = [k for k in FIELDS if fx[k] != fy[k]]
    text = ", ".join(f"{k} {fx[k]} -> {fy[k]}" for k in changed) or "none (the same case: another run of it)"
    runnable = (all(fx[k] is not None and fy[k] is not None for k in ("framework", "mode", "batch_size"))
                and bool(changed) and set(changed) <= set(REMEDY_FIELDS))
    return text, runnable


def comparable(x: D.Side, y: D.Side) -> bool:
    """Two sides whose per-step figures may be compared: one unit of time, one batch size, one device count."""
    fx, fy = case_fields(x), case_fields(y)
    return x.level == y.level and fx["batch_size"] == fy["batch_size"] and fx["devices"] == fy["devices"]


# --- noise -----------------------------------------------------------------------------------------
def saving_interval(x: list[float], y: list[float]) -> tuple[float, float] | None:
    """95% bootstrap interval of mean(x) - mean(y), each side's samples resampled on its own; None under two
    samples a side."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.size < 2 or b.size < 2:
        return None
    rng = np.random.default_rng(SEED)
    da = a[rng.integers(0, a.size, size=(RESAMPLES, a.size))].mean(axis=1)
    db = b[rng.integers(0, b.size, size=(RESAMPLES, b.size))].mean(axis=1)
    lo, hi = np.quantile(da - db, [(1 - timing.CONFIDENCE) / 2, 1 - (1 - timing.CONFIDENCE) / 2])
    return float(lo), float(hi)


def place_call(x: list[float], y: list[float], alpha: float) -> tuple[Call, str, float | None, tuple | None]:
    """(call, verdict, p, interval in ns) of the saving of going from ``x``'s per-step samples to ``y``'s."""
    v, p = D.verdict(x, y, alpha)
    ci = saving_interval(x, y)
    if v in (D.Verdict.FEW, D.Verdict.NO_STEPS) or ci is None:
        return Call.NOT_JUDGED, str(v), p, ci
    return (Call.FINDING if v == D.Verdict.FASTER and ci[0] > 0 else Call.NOISE), str(v), p, ci


# --- causes --------------------------------------------------------------------------------------------
def short_kernel(name: str) -> str:
    """A kernel's name without its return type, template arguments, parameters and namespaces
    (``calc_bias_diff_nchw_packed``; cuBLAS's ``std::enable_if<!(false), void>::type internal::gemvx::kernel<...>``:
    ``gemvx::kernel``, a function called ``kernel`` keeps its last namespace); a name left mangled (cuDNN's CUTLASS
    kernels in Kineto, 1,600 characters) by its function and the head of its first template argument
    (``Kernel<ImplicitGemmConvolution>``: ``calllink.mangled_head``)."""
    head = mangled_head(name)
    if head:
        fn = head[0].rsplit("::", 1)[-1]
        return f"{fn}<{head[1]}>" if head[1] else fn
    text = without_return_type(re.sub(r"\(anonymous namespace\)::", "", str(name).strip()))
    parts = re.split(r"[<(]", text, maxsplit=1)[0].strip().split("::")
    return "::".join(parts[-2:] if parts[-1] == "kernel" else parts[-1:]) or str(name)  # gemvx::kernel


def place_cause(side: D.Side, place: tuple[str, str]) -> str:
    """The side's work at ``place``: its largest kernels (ops), each with its library call, algorithm and math, ms
    and calls per step."""
    ev = side.events[(side.events["where"] == place[0]) & (side.events["direction"] == place[1])
                     & side.events["iteration"].notna()]
    if ev.empty or not side.n_steps:
        return "nothing here"
    g = ev.groupby(["library_call", "kernel"], sort=False).agg(
        ns=("dur_ns", "sum"), n=("dur_ns", "size"), algo=("algo", _first), math=("math", _first))
    g = g.sort_values("ns", ascending=False)
    parts = []
    for (call, kernel), r in g.head(CAUSE_KERNELS).iterrows():
        extra = "".join(f", {k} {r[k]}" for k in ("algo", "math") if r[k] != D.NONE)
        via = f" via {call}" if call != D.NONE else " (no library call)"
        parts.append(f"{short_kernel(kernel)}{via}{extra}: {r['ns'] / side.n_steps / 1e6:.4f} ms, "
                     f"{r['n'] / side.n_steps:g}/step")
    more = len(g) - CAUSE_KERNELS
    return "; ".join(parts) + (f"; +{more} more" if more > 0 else "")


def _first(s: pd.Series) -> str:
    vals = [v for v in s.unique() if v != D.NONE]
    return ",".join(map(str, vals[:2])) if vals else D.NONE


def step_cause(x: D.Side, y: D.Side, x_ms: float, y_ms: float) -> str:
    """A step saving split into the traced kernel time per step and the rest of the step; on a CPU (op time)
    not split (``OP_STEP``)."""
    kx, ky = _traced_ms(x), _traced_ms(y)
    if x.level != D.LEVEL_KERNEL:
        return f"traced op time {kx:.4f} -> {ky:.4f} ms/step; not split: {OP_STEP}"
    rest_x, rest_y = x_ms - kx, y_ms - ky
    main = (f"{x.level} time" if abs(kx - ky) >= abs(rest_x - rest_y)
            else f"time outside the traced {x.level}s (host, launches, idle)")
    return (f"mostly {main}: traced {x.level} time {kx:.4f} -> {ky:.4f} ms/step, the rest of the clean step "
            f"{rest_x:.4f} -> {rest_y:.4f} ms (traced in the capture pass, the step in the clean pass)")


OP_STEP = ("op time adds up over the engine's threads and is traced in the capture pass, which runs slower than "
           "the clean one: it is no part of the clean step")


def _traced_ms(side: D.Side) -> float:
    ev = side.events
    return float(ev.loc[ev["iteration"].notna(), "dur_ns"].sum()) / side.n_steps / 1e6 if side.n_steps else 0.0


# --- findings ---------------------------------------------------------------------------------------
def _busy(x: D.Side, y: D.Side) -> str:
    return ", ".join(s.label for s in (x, y) if s.contended)


def place_findings(sides: list[D.Side], alpha: float = D.ALPHA) -> pd.DataFrame:
    """Per side x place: the saving of running that place as its fastest comparable counterpart does."""
    steps = {id(s): D.per_step(s, D.PLACE) for s in sides}
    rows = []
    for x in sides:
        px = steps[id(x)]
        for place, rx in px.iterrows():
            if place[0] == D.OUTSIDE or not rx["calls"] or not x.n_steps:
                continue
            sx = [float(rx[i]) for i in x.iterations]
            best = None
            for y in sides:
                py = steps[id(y)]
                if y is x or not comparable(x, y) or place not in py.index or not py.loc[place, "calls"]:
                    continue
                sy = [float(py.loc[place, i]) for i in y.iterations]
                if best is None or np.mean(sy) < np.mean(best[1]):
                    best = (y, sy, py.loc[place])
            if best is None or np.mean(best[1]) >= np.mean(sx):
                continue
            rows.append(_place_row(x, best[0], place, sx, best[1], rx, best[2], alpha))
    return pd.DataFrame(rows, columns=COLUMNS)


def _place_row(x: D.Side, y: D.Side, place: tuple[str, str], sx: list[float], sy: list[float], rx: pd.Series,
               ry: pd.Series, alpha: float) -> list:
    call, v, p, ci = place_call(sx, sy, alpha)
    call = Call.BUSY if call == Call.FINDING and _busy(x, y) else call
    x_ms, y_ms = float(np.mean(sx)) / 1e6, float(np.mean(sy)) / 1e6
    remedy, runnable = remedy_of(x, y)
    traced = _traced_ms(x)  # the share is of the same kind of time: the case's traced kernel (op) time per step
    cause = f"{x.label}: {place_cause(x, place)} | {y.label}: {place_cause(y, place)}"
    basis = BASIS[Kind.PLACE].format(level=x.level, source=x.source, steps=x.n_steps)
    nx, ny = float(rx["calls"]) / x.n_steps, float(ry["calls"]) / y.n_steps
    caveat = FEWER.format(ny=ny, nx=nx) if ny < nx else ""
    return [0, str(Kind.PLACE), str(call), case_fields(x)["batch_size"], x.label, y.label, remedy, runnable,
            place[0], place[1], x_ms - y_ms, None if ci is None else ci[0] / 1e6, None if ci is None else ci[1] / 1e6,
            x_ms, y_ms, (x_ms - y_ms) / traced if traced else None, p, v, cause, caveat, nx, ny, _busy(x, y), basis]


FEWER = ("the remedy runs fewer kernels (ops) here, {ny:g} against {nx:g} per step: part of its work for this place "
         "may run fused in another place, so a switch may save less")


def step_findings(sides: list[D.Side]) -> pd.DataFrame:
    """Per side: the clean-step saving of running as its fastest comparable case, and as the fastest comparable
    case of its own framework (another mode or math) where that is another (``diff.step_verdict``)."""
    rows = []
    timed = [s for s in sides if field_at(s.entry, "median_step_s") is not None]
    for x in timed:
        cands = [y for y in timed if y is not x and comparable(x, y) and _ms(y) < _ms(x)]
        own = [y for y in cands if case_fields(y)["framework"] == case_fields(x)["framework"]]
        best = [min(c, key=_ms) for c in (cands, own) if c]
        rows.extend(_step_row(x, y) for i, y in enumerate(best) if all(y is not z for z in best[:i]))
    return pd.DataFrame(rows, columns=COLUMNS)


def _step_row(x: D.Side, y: D.Side) -> list:
    """One step finding: ``x``'s clean step against ``y``'s."""
    v = D.step_verdict(x.entry, y.entry)
    call = {D.Verdict.FASTER: Call.FINDING, D.Verdict.NOISE: Call.NOISE}.get(v, Call.NOT_JUDGED)
    busy = ", ".join(s.label for s in (x, y) if s.clean_contended)
    call = Call.BUSY if call == Call.FINDING and busy else call
    lo, hi = _ci(x), _ci(y)
    interval = (lo[0] - hi[1], lo[1] - hi[0]) if lo and hi else (None, None)
    remedy, runnable = remedy_of(x, y)
    return [0, str(Kind.STEP), str(call), case_fields(x)["batch_size"], x.label, y.label, remedy, runnable,
            "(whole step)", D.NONE, _ms(x) - _ms(y), *interval, _ms(x), _ms(y), (_ms(x) - _ms(y)) / _ms(x),
            None, str(v), step_cause(x, y, _ms(x), _ms(y)), "", None, None, busy, BASIS[Kind.STEP]]


def _ms(side: D.Side) -> float:
    return float(field_at(side.entry, "median_step_s")) * 1e3


def _ci(side: D.Side) -> tuple[float, float] | None:
    lo, hi = field_at(side.entry, "ci95_low_s"), field_at(side.entry, "ci95_high_s")
    return None if lo is None or hi is None else (float(lo) * 1e3, float(hi) * 1e3)


def findings(sides: list[D.Side], alpha: float = D.ALPHA) -> pd.DataFrame:
    """Every place and step finding of ``sides``, ranked within each kind: findings first, by predicted saving
    per step (largest first), then what was called noise or not judged. ``attrs``: the rules."""
    rows = [*place_findings(sides, alpha).to_dict("records"), *step_findings(sides).to_dict("records")]
    df = pd.DataFrame(rows, columns=COLUMNS)
    if len(df):
        order = {str(c): i for i, c in enumerate(Call)}
        df = df.assign(_k=df["kind"].map({str(k): i for i, k in enumerate(Kind)}), _c=df["call"].map(order))
        df = df.sort_values(["_k", "_c", "saving_ms"], ascending=[True, True, False], kind="stable")
        df = df.drop(columns=["_k", "_c"]).reset_index(drop=True)
        df["rank"] = df.groupby("kind").cumcount() + 1
    df.attrs["rules"] = {"noise": NOISE_RULE, "hit": HIT_RULE, **{str(k): v for k, v in BASIS.items()}}
    df.attrs["pairs"] = sum(comparable(x, y) for i, x in enumerate(sides) for y in sides[i + 1:])
    return df


# --- checking predictions ---------------------------------------------------------------------------
def measure(row: pd.Series, x: D.Side, y: D.Side, alpha: float = D.ALPHA) -> dict[str, Any]:
    """The saving of ``row``'s finding as fresh sides ``x`` (its case) and ``y`` (its remedy) measure it."""
    if row["kind"] == str(Kind.STEP):
        f = step_findings([x, y])
        got = f[f["case"] == x.label]
        if got.empty:  # the remedy was not faster this time: a negative saving
            saving = _ms(x) - _ms(y) if field_at(y.entry, "median_step_s") and field_at(x.entry, "median_step_s") else None
            return {"measured_saving_ms": saving, "measured_lo_ms": None, "measured_hi_ms": None,
                    "measured_call": str(Call.NOISE) if saving is not None else str(Call.NOT_JUDGED)}
        r = got.iloc[0]
        return {"measured_saving_ms": r["saving_ms"], "measured_lo_ms": r["saving_lo_ms"],
                "measured_hi_ms": r["saving_hi_ms"], "measured_call": r["call"]}
    place = (row["where"], row["direction"])
    px, py = D.per_step(x, D.PLACE), D.per_step(y, D.PLACE)
    if place not in px.index or place not in py.index:
        gone = "case" if place not in px.index else "remedy"
        return {"measured_saving_ms": None, "measured_lo_ms": None, "measured_hi_ms": None,
                "measured_call": f"place not in the fresh {gone} run"}
    sx = [float(px.loc[place, i]) for i in x.iterations]
    sy = [float(py.loc[place, i]) for i in y.iterations]
    call, _, _, ci = place_call(sx, sy, alpha)
    call = Call.BUSY if call == Call.FINDING and _busy(x, y) else call
    return {"measured_saving_ms": (np.mean(sx) - np.mean(sy)) / 1e6, "measured_lo_ms": ci[0] / 1e6 if ci else None,
            "measured_hi_ms": ci[1] / 1e6 if ci else None, "measured_call": str(call)}


def judge(predicted: float, measured: float | None) -> tuple[float | None, bool]:
    """(error in % of the prediction, hit: within ``HIT_TOLERANCE``)."""
    if measured is None or not predicted:
        return None, False
    err = (measured - predicted) / abs(predicted)
    return err * 100, abs(err) <= HIT_TOLERANCE


def check(found: pd.DataFrame, fresh: dict[tuple[str, str], tuple[D.Side, D.Side]],
          alpha: float = D.ALPHA) -> pd.DataFrame:
    """The findings in ``found`` whose (case, remedy case) pair has fresh sides in ``fresh``, each with its
    measured saving and whether the prediction came true; ``attrs["hit_rate"]``: hits / checked."""
    rows = []
    for _, r in found.iterrows():
        pair = fresh.get((r["case"], r["remedy_case"]))
        if pair is None:
            continue
        m = measure(r, *pair, alpha)
        err, hit = judge(float(r["saving_ms"]), m["measured_saving_ms"])
        busy = ", ".join(s.label for s in pair if (s.clean_contended if r["kind"] == str(Kind.STEP) else s.contended))
        rows.append({**r.to_dict(), **m, "measured_busy": busy, "error_pct": err, "hit": hit,
                     "check": f"fresh runs: {pair[0].label} vs {pair[1].label}"})
    df = pd.DataFrame(rows, columns=[*COLUMNS, *CHECK_COLUMNS])
    df.attrs["hit_rate"] = (int(df["hit"].sum()), len(df))
    quiet = df[df["measured_busy"] == ""]
    df.attrs["quiet_hit_rate"] = (int(quiet["hit"].sum()), len(quiet))
    df.attrs["rule"] = HIT_RULE
    return df


def run_findings(runs: list[Run], alpha: float = D.ALPHA) -> pd.DataFrame:
    """``findings`` of each run on its own (its cases side by side at each batch size), a ``run`` column first."""
    parts = []
    for run in runs:
        f = findings(run_sides(run), alpha)
        parts.extend({"run": run.name, **r} for r in f.to_dict("records"))
    df = pd.DataFrame(parts, columns=["run", *COLUMNS])
    df.attrs["rules"] = findings([]).attrs["rules"]
    return df
