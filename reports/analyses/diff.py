"""Two sides (a case of a run, or other people's traces), kernel by kernel: ``kernelmap diff``'s table.

A side's unit of time is its finest timed event in one trace (``Side.level``): every GPU kernel of the source
(graph replays included), else, on a CPU, every outermost framework op. Rows are aligned on
``where`` (the layer, else the canonical op where the event has no layer) -> direction -> library call ->
kernel (a CPU op's name where there is no kernel); events of no counted step form one row of their own, so
the rows hold 100% of each side's time (``conserve``: a mismatch is an error). Each row: the time per counted
step on each side, the change, the calls per step, and a verdict from the steps' spread (``kernelmap/utest``).
Nothing here prints (``reports/diffcli.py`` does).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from kernelmap.frameworks.spec import LAYERS

from kernelmap import frameworks, timing, utest
from kernelmap.errors import KernelmapError

from .base import TRACE_SOURCES, field_at, passes_of
from .timed import direction_group, fill_from_links, model_ops, outermost_ops

ALPHA = 0.05  # the U test's level, as google/benchmark's compare.py
KEY = ("where", "direction", "library_call", "kernel")
PLACE = ("where", "direction")  # ``by_place``: the kernels of a layer (or op) and direction together
NONE = "-"  # a key field the event has not (no library call, no direction)
OUTSIDE = "(outside the counted steps)"
WHOLE = 0  # the one "step" of a trace without step marks
WHOLE_BASIS = "no step marks in the trace: the whole trace counted as one step"


class Verdict(enum.StrEnum):
    FASTER = "faster"
    SLOWER = "slower"
    NOISE = "within noise"
    FEW = "too few steps"  # the exact test cannot reach ALPHA with these step counts
    NO_STEPS = "no steps"  # a side without counted steps: no spread to judge by
    NO_TRIALS = "no trials recorded"  # a side without a results.json entry (another's trace)


class Status(enum.StrEnum):
    SAME = "same"
    CALLS = "calls per step changed"
    APPEARED = "appeared"
    DISAPPEARED = "disappeared"
    ALGORITHM = "algorithm changed"  # same where, direction and library call; another kernel
    CALL = "library call changed"  # same where and direction; another library call
    MOVED = "moved"  # the kernel left this row for another row of the other side, or came from one
    OP = "op changed"  # a CPU side's ``algorithm changed``: another framework op in the same place
    OUTSIDE = "not in a counted step"  # the row of the events outside the counted steps


LEVEL_KERNEL, LEVEL_OP = "kernel", "op"


def source_pass(source: str) -> str | None:
    """The capture pass a trace source belongs to in a run directory (the framework's profiler, nsys)."""
    if source == "nsys":
        return "nsys"
    return "framework" if any(d.trace_source == source for d in frameworks.REGISTRY.values()) else None


@dataclass
class Side:
    """One side of a diff: the timed events of one case at one batch size in one trace source."""

    label: str
    source: str
    level: str
    events: pd.DataFrame  # key columns + dur_ns + iteration (counted steps) / NA (outside)
    iterations: tuple[int, ...]
    steps_basis: str
    total_ns: int  # every timed event of the source, counted steps or not
    entry: dict[str, Any] = field(default_factory=dict)  # its results.json entry (empty for a foreign trace)

    @property
    def n_steps(self) -> int:
        return len(self.iterations)

    @property
    def contended(self) -> bool | None:
        """Whether the pass that recorded this trace ran on a busy machine (None: not measured)."""
        return field_at(passes_of(self.entry).get(source_pass(self.source) or "", {}), "contention.contended")

    @property
    def clean_contended(self) -> bool | None:
        return field_at(self.entry, "contention.contended")


def _text(s: pd.Series) -> pd.Series:
    return s.astype(object).where(s.notna(), NONE)


TIMED_LEVELS = (LEVEL_KERNEL, LEVEL_OP)  # the rows a side is made of (timed_rows)


def timed_rows(records: pd.DataFrame, source: str | None = None) -> tuple[str, str, pd.DataFrame]:
    """(source, level, rows) of one case's records: the first trace source (``TRACE_SOURCES``, or ``source``)
    with kernels, else with ops; kernels as they are, ops outermost only; labels filled from their links."""
    sources = [source] if source else list(TRACE_SOURCES)
    for level in TIMED_LEVELS:
        for src in sources:
            srows = records[records["source"] == src]
            rows = srows[(srows["kind"] == level) & srows["dur_ns"].notna()]
            if len(rows):
                rows = fill_from_links(rows, srows)
                return src, level, outermost_ops(rows, srows) if level == LEVEL_OP else rows
    present = sorted(map(str, records["source"].dropna().unique()))
    raise KernelmapError(f"no timed kernels or ops in {'source ' + source if source else 'any trace'} "
                         f"(sources here: {', '.join(present) or 'none'})")


def keyed(rows: pd.DataFrame, level: str) -> pd.DataFrame:
    """The rows' alignment key: where (layer, else canonical op), direction, library call, kernel; beside it the
    event's algorithm and math (not keys)."""
    where = rows["layer"].astype(object).where(rows["layer"].notna(), rows["canonical_op"].astype(object))
    name = rows["kernel_name"] if level == LEVEL_KERNEL else rows["op_name"]
    return pd.DataFrame({"where": _text(where), "direction": _text(rows["direction"]),
                         "library_call": _text(rows["library_call"]), "kernel": _text(name),
                         "dur_ns": rows["dur_ns"].astype("int64"), "iteration": rows["iteration"],
                         "algo": _column(rows, "algo"), "math": _column(rows, *MATH_FROM)},
                        index=rows.index)


MATH_FROM = ("math_ran", "math_mode")  # an event's math: what its multiply ran in, else the library's math mode


def _column(rows: pd.DataFrame, *names: str) -> pd.Series:
    """The first of ``names`` that the rows have, filled from the next where missing; ``NONE`` where none has it
    (a cause's detail, not a key: ``findings.place_cause``)."""
    out = pd.Series([pd.NA] * len(rows), index=rows.index, dtype=object)
    for n in names:
        if n in rows.columns:
            out = out.where(out.notna(), rows[n].astype(object))
    return _text(out)


def counted_iterations(rows: pd.DataFrame) -> tuple[tuple[int, ...], str]:
    """The traced steps the per-step figures are over: iterations that hold timed work of the model's layers
    (as the report counts them), else, for a trace of another model, every iteration of its timed events."""
    its = rows.loc[rows["canonical_op"].isin(model_ops()), "iteration"].dropna()
    if len(its):
        return tuple(sorted(int(i) for i in its.unique())), "traced steps holding timed work of the model's layers"
    its = rows["iteration"].dropna()
    return tuple(sorted(int(i) for i in its.unique())), "every traced step with timed events"


def make_side(label: str, records: pd.DataFrame, entry: dict[str, Any] | None = None,
              source: str | None = None) -> Side:
    """A side from one case's records (one case at one batch size) and its results.json entry."""
    src, level, rows = timed_rows(records, source)
    its, basis = counted_iterations(rows)
    ev = keyed(rows, level)
    if not its:  # a trace without step marks (inference, a capture of another program): one step, the whole trace
        ev["iteration"] = pd.array([WHOLE] * len(ev), dtype="Int64")
        its, basis = (WHOLE,), WHOLE_BASIS
    outside = ~ev["iteration"].isin(its)
    ev.loc[outside, list(KEY)] = [OUTSIDE, NONE, NONE, NONE]
    ev["iteration"] = ev["iteration"].where(~outside, pd.NA)
    return Side(label, src, level, ev.reset_index(drop=True), its, basis, int(rows["dur_ns"].sum()), entry or {})


# --- per row --------------------------------------------------------------------------------------
def per_step(side: Side, key: tuple[str, ...] = KEY) -> pd.DataFrame:
    """Per key: total ns, calls, and the time in each counted step (a column per step, 0 where absent)."""
    ev = side.events
    tot = ev.groupby(list(key), sort=False).agg(ns=("dur_ns", "sum"), calls=("dur_ns", "size"))
    inside = ev[ev["iteration"].notna()]
    steps = inside.pivot_table(index=list(key), columns="iteration", values="dur_ns", aggfunc="sum", fill_value=0)
    steps = steps.reindex(columns=list(side.iterations), fill_value=0)
    return tot.join(steps, how="left").fillna(0)


RULE = (f"faster or slower: the U test's p < alpha and the medians of the per-step times differ by at least "
        f"{timing.NOISE_THRESHOLD:.0%} of A's (timing.NOISE_THRESHOLD: a steady change smaller than that is called "
        "within noise, as trials that disagree by less are); too few steps: the exact test cannot reach alpha")


def verdict(a: list[float], b: list[float], alpha: float = ALPHA) -> tuple[Verdict, float | None]:
    """B against A from their per-step samples (``utest``): faster, slower or within noise (``RULE``), with the
    p-value."""
    if not a or not b:
        return Verdict.NO_STEPS, None
    if utest.min_p(len(a), len(b)) > alpha:
        return Verdict.FEW, None
    p = utest.p_value(a, b)
    ma, mb = float(np.median(a)), float(np.median(b))
    if p >= alpha or abs(mb - ma) < timing.NOISE_THRESHOLD * ma:
        return Verdict.NOISE, p
    return (Verdict.SLOWER if mb > ma else Verdict.FASTER), p


def _where_order(w: str) -> tuple[int, str]:
    names = [x.name for x in LAYERS]
    return (names.index(w), w) if w in names else ((len(names) + 1, w) if w != OUTSIDE else (len(names) + 9, w))


def _status(df: pd.DataFrame, level: str = LEVEL_KERNEL) -> tuple[list[str], list[str]]:
    """Each row's status and note. A row on one side only is named: ``moved`` where the other side has more
    calls of that kernel and direction in another place (layer or op); ``algorithm changed`` where the other side has, on one
    side only too, another kernel of the same where, direction and library call; ``library call changed``
    where it has another call of the same where and direction; ``algorithm changed`` too where it has another
    kernel of the same where and direction group (a bias gradient's kernel renamed is no longer ``bwd_bias``
    but ``bwd``: the half is told by name); else appeared or disappeared."""
    only = {"a": (df["a_calls"] > 0) & (df["b_calls"] == 0), "b": (df["b_calls"] > 0) & (df["a_calls"] == 0)}
    groups = {side: {"3": set(map(tuple, df.loc[m, ["where", "direction", "library_call"]].to_numpy())),
                     "2": set(map(tuple, df.loc[m, ["where", "direction"]].to_numpy())),
                     "g": {(w, direction_group(d)) for w, d in df.loc[m, ["where", "direction"]].to_numpy()}}
              for side, m in only.items()}
    more = {"b": df["b_calls"] > df["a_calls"], "a": df["b_calls"] < df["a_calls"]}
    status, note = [], []
    algorithm, what = (Status.ALGORITHM, "kernel") if level == LEVEL_KERNEL else (Status.OP, "op")
    for i, r in df.iterrows():
        this = "a" if only["a"][i] else "b" if only["b"][i] else None
        if r["where"] == OUTSIDE:
            status.append(Status.OUTSIDE)
            note.append(f"{r['a_calls']} / {r['b_calls']} events, {r['a_ns']} / {r['b_ns']} ns")
            continue
        if this is None:
            same = r["a_calls"] == r["b_calls"]
            status.append(Status.SAME if same else Status.CALLS)
            note.append("" if same else f"calls per step {_calls(r['a_calls_step'])} -> {_calls(r['b_calls_step'])}")
            continue
        other = "b" if this == "a" else "a"
        moved = df[(df["kernel"] == r["kernel"]) & (df["direction"] == r["direction"]) & (df["where"] != r["where"])
                   & more[other] & (df["where"] != OUTSIDE)]  # the same place under another call: not a move
        real = r["where"] != OUTSIDE and r["kernel"] != NONE
        if real and len(moved):
            status.append(Status.MOVED)
            note.append(f"{'to' if this == 'a' else 'from'} {', '.join(sorted(set(moved['where'])))}")
        elif real and (r["where"], r["direction"], r["library_call"]) in groups[other]["3"]:
            status.append(algorithm)
            note.append(f"the other side runs another {what} for this layer/op, direction and call")
        elif real and (r["where"], r["direction"]) in groups[other]["2"] and r["library_call"] != NONE:
            status.append(Status.CALL)
            note.append("the other side runs another library call for this layer/op and direction")
        elif real and (r["where"], direction_group(r["direction"])) in groups[other]["g"]:
            # a backward's half is told from its kernels' names (docs/SCHEMA.md): another kernel may be another half
            status.append(algorithm)
            note.append(f"the other side runs another {what} for this layer/op's {direction_group(r['direction'])}")
        else:
            status.append(Status.APPEARED if this == "b" else Status.DISAPPEARED)
            note.append("")
    return [str(s) for s in status], note


def _calls(x: float) -> str:
    return f"{x:g}" if x == int(x) else f"{x:.2f}"


# --- the diff -------------------------------------------------------------------------------------
def diff(a: Side, b: Side, alpha: float = ALPHA, key: tuple[str, ...] = KEY) -> pd.DataFrame:
    """B against A, row by aligned ``key`` (module docstring); ``attrs["summary"]`` holds each side's totals,
    steps and the whole step's verdict. Conserved (``conserve``) before it is returned."""
    pa, pb = per_step(a, key), per_step(b, key)
    keys = pa.index.union(pb.index, sort=False) if len(pa) or len(pb) else pa.index
    rows = []
    for k in keys:
        k = k if isinstance(k, tuple) else (k,)
        rows.append(_row(k, pa.loc[k] if k in pa.index else None, pb.loc[k] if k in pb.index else None, a, b, alpha))
    df = pd.DataFrame(rows, columns=[*key, *VALUES])
    if len(df):
        df = df.iloc[sorted(range(len(df)), key=lambda i: (_where_order(df["where"].iat[i]),
                                                            *(df[k].iat[i] for k in key[1:])))]
        df = df.reset_index(drop=True)
    if key == KEY and len(df):
        df["status"], df["note"] = _status(df, a.level)
    elif key != KEY:
        df = df.drop(columns=["status", "note"])
    for col in ("a_ns", "b_ns"):
        df[col] = df[col].astype("int64")
    df.attrs["summary"] = summary(a, b, alpha)
    conserve(df, a, b)
    return df


def by_place(a: Side, b: Side, alpha: float = ALPHA) -> pd.DataFrame:
    """``diff`` with the kernels of each layer (or op) and direction together: where two sides run other kernels
    (another framework, a compiled mode) their place still meets on one row, judged on its per-step sums."""
    return diff(a, b, alpha, PLACE)


VALUES = ["a_ms", "b_ms", "change_ms", "change_pct", "a_share", "b_share", "a_calls_step", "b_calls_step",
          "verdict", "p_value", "busy", "status", "note", "a_ns", "b_ns", "a_calls", "b_calls"]


def _side_figures(r: pd.Series | None, side: Side, outside: bool) -> tuple[int, int, list[float], float, float]:
    """(ns, calls, per-step samples in ns, ms per step, calls per step) of one side of a row."""
    if r is None:
        samples = [0.0] * side.n_steps
        return 0, 0, samples, (np.nan if outside else 0.0), 0.0
    samples = [float(r[i]) for i in side.iterations] if not outside else []
    n = side.n_steps
    ms = np.nan if outside or not n else float(r["ns"]) / n / 1e6
    calls = np.nan if outside or not n else float(r["calls"]) / n
    return int(r["ns"]), int(r["calls"]), samples, ms, calls


def _row(key: tuple, ra: pd.Series | None, rb: pd.Series | None, a: Side, b: Side, alpha: float) -> list:
    outside = key[0] == OUTSIDE
    ns_a, calls_a, sa, ms_a, cs_a = _side_figures(ra, a, outside)
    ns_b, calls_b, sb, ms_b, cs_b = _side_figures(rb, b, outside)
    v, p = verdict(sa, sb, alpha) if not outside else (Verdict.NO_STEPS, None)
    change = ms_b - ms_a
    pct = change / ms_a * 100 if ms_a and not np.isnan(ms_a) else np.nan
    busy = ", ".join(n for n, s in (("A", a), ("B", b)) if s.contended)
    return [*key, ms_a, ms_b, change, pct, ns_a / a.total_ns if a.total_ns else np.nan,
            ns_b / b.total_ns if b.total_ns else np.nan, cs_a, cs_b, str(v), p, busy, "", "", ns_a, ns_b,
            calls_a, calls_b]


@dataclass(frozen=True)
class Held:
    """What a diff's rows hold of each side's time against that side's 100% (integer ns): the one reckoning of a
    diff's conservation, which ``conserve`` enforces, ``kernelmap diff`` prints (reports/diffcli.py) and the
    report's self-check judges (reports/diffsection.py)."""

    a_ns: int
    b_ns: int
    a_total_ns: int
    b_total_ns: int

    @property
    def conserved(self) -> bool:
        return (self.a_ns, self.b_ns) == (self.a_total_ns, self.b_total_ns)

    def share(self, side: str) -> str:
        """Side ``a`` or ``b``'s held share of its 100% (4 decimals of a percent; "no time" for an empty side)."""
        got, total = (self.a_ns, self.a_total_ns) if side == "a" else (self.b_ns, self.b_total_ns)
        return f"{got / total:.4%}" if total else "no time"


def held(rows: pd.DataFrame, a_total_ns: int, b_total_ns: int) -> Held:
    """What ``rows`` (a ``diff`` or ``by_place`` table) hold of each side's 100%: the sums of their a_ns, b_ns."""
    return Held(int(rows["a_ns"].sum()), int(rows["b_ns"].sum()), int(a_total_ns), int(b_total_ns))


def conserve(df: pd.DataFrame, a: Side, b: Side) -> None:
    """The rows hold 100% of each side's time, exactly (integer ns, ``held``): every timed event of its source is
    in one row, and the per-step rows hold every event of the counted steps. KernelmapError otherwise."""
    whole = held(df, a.total_ns, b.total_ns)
    for name, side in (("A", a), ("B", b)):
        col = df[f"{name.lower()}_ns"]
        rows_ns = whole.a_ns if name == "A" else whole.b_ns
        ev_ns = int(side.events["dur_ns"].sum())
        in_steps = int(side.events.loc[side.events["iteration"].notna(), "dur_ns"].sum())
        rows_in_steps = int(col[df["where"] != OUTSIDE].sum())
        if not rows_ns == ev_ns == side.total_ns or rows_in_steps != in_steps:
            raise KernelmapError(
                f"diff: side {name} ({side.label}) is not conserved: the rows hold {rows_ns} ns "
                f"({rows_in_steps} ns in counted steps), its {side.level}s {side.total_ns} ns "
                f"({in_steps} ns in counted steps)")


def step_verdict(a: dict[str, Any], b: dict[str, Any]) -> Verdict:
    """The whole step of B against A from the clean trials (results.json): their 95% intervals of the median
    (``timing.intervals_overlap``) overlap: within noise."""
    ia = (field_at(a, "ci95_low_s"), field_at(a, "ci95_high_s"))
    ib = (field_at(b, "ci95_low_s"), field_at(b, "ci95_high_s"))
    if None in ia or None in ib:
        return Verdict.NO_TRIALS
    return {timing.Placement.WITHIN: Verdict.NOISE, timing.Placement.ABOVE: Verdict.SLOWER,
            timing.Placement.BELOW: Verdict.FASTER}[timing.placement(ib, ia)]


def _step_samples(side: Side) -> list[float]:
    inside = side.events[side.events["iteration"].notna()]
    per = inside.groupby("iteration")["dur_ns"].sum()
    return [float(per.get(i, 0)) for i in side.iterations]


def summary(a: Side, b: Side, alpha: float = ALPHA) -> dict[str, Any]:
    """Each side's totals and steps, the traced time's verdict and the clean step's (from the trials)."""
    out: dict[str, Any] = {}
    for name, side in (("a", a), ("b", b)):
        in_steps = int(side.events.loc[side.events["iteration"].notna(), "dur_ns"].sum())
        out[name] = {"label": side.label, "source": side.source, "level": side.level, "steps": side.n_steps,
                     "steps_basis": side.steps_basis, "total_ns": side.total_ns, "in_steps_ns": in_steps,
                     "outside_ns": side.total_ns - in_steps,
                     "ms_per_step": in_steps / side.n_steps / 1e6 if side.n_steps else None,
                     "contended": side.contended, "clean_contended": side.clean_contended,
                     "clean_median_ms": _ms(field_at(side.entry, "median_step_s")),
                     "clean_ci95_ms": [_ms(field_at(side.entry, "ci95_low_s")), _ms(field_at(side.entry, "ci95_high_s"))],
                     "clean_trials": field_at(side.entry, "n_trials")}
    v, p = verdict(_step_samples(a), _step_samples(b), alpha)
    out["traced_verdict"], out["traced_p"] = str(v), p
    out["clean_verdict"] = str(step_verdict(a.entry, b.entry))
    out["rule"] = f"{utest.RULE}; alpha = {alpha}; {RULE}"
    return out


def _ms(s: Any) -> float | None:
    return None if s is None else float(s) * 1e3
