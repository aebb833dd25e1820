"""The report's differences section (issue 40; docs/diff.md): ``kernelmap diff`` between a run's own cases.

Two cases of one run are paired where they differ in exactly one dimension at one batch size (``axis_of``):
another mode of the same framework, math and devices; another math; another device count; another framework, each
at its default mode. A is the earlier case in registry order (``frameworks.case.Case.rank``: the reference
framework, the default mode, one device, fp32 first). Each pair is ``analyses.diff``'s table (kernel rows) and its
``by_place`` table, from each side's default trace source, as ``kernelmap diff RUN RUN --case-a .. --case-b ..``
computes them. The page shows a row a pair (``table``: traced time per step each side and the verdict, the
conservation, rows appeared, disappeared and changed algorithm, the three places of largest change with the saving);
every row goes to ``tables/diff/<run>/`` (``write``), and the conservation of each pair is a self-check
(``check_rows``: the rows hold 100% of each side's time, exactly, in integer ns).
"""

from __future__ import annotations

import enum
import html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from kernelmap.frameworks import REGISTRY
from kernelmap.frameworks.case import FIELDS, Case

from kernelmap.atomic import atomic_file
from kernelmap.errors import KernelmapError

from .analyses import diff as D
from .analyses import findings as FD
from .analyses.base import Run
from .checkrows import FAIL, NOT_CHECKED, PASS, Check, check_row

TOP = 3  # places of largest change named per pair
FOLDER = "tables/diff"  # every pair's rows, one folder per run
CHANGED = (D.Status.ALGORITHM, D.Status.OP)  # "algorithm changed": another kernel (a CPU side: another op)


class Axis(enum.StrEnum):
    """The one dimension two paired cases differ in."""

    MODE = "mode"
    MATH = "math"
    DEVICES = "devices"
    FRAMEWORK = "framework"  # each at its framework's default mode
    RUN = "run"  # the same case in another run (``kernelmap report RUN --diff-against OTHER``: A is OTHER's)


RULE = ("two cases of a run are paired where they differ in exactly one of: the mode (same framework, math and "
        "devices), the math, the device count, or the framework (each at its default mode); at one batch size; A is "
        "the earlier in registry order")
NO_PAIRS = ("no two cases of these runs differ in exactly one of mode, math, device count or framework (at its "
            "default mode) at one batch size: nothing to diff")


@dataclass
class Pair:
    """Two cases of one run that differ in one dimension, and their diff (None where it could not be made)."""

    run: str
    axis: Axis
    a: D.Side
    b: D.Side
    rows: pd.DataFrame | None = None  # analyses.diff.diff: every kernel (op) row
    places: pd.DataFrame | None = None  # analyses.diff.by_place
    problem: str = ""  # why there is no diff: another unit of time, or the diff's own error (not conserved)
    file: str = ""  # the rows' CSV, relative to the report
    places_file: str = ""
    against: str = ""  # A's run where it is another (Axis.RUN)

    @property
    def batch_size(self) -> Any:
        return self.a.entry.get("batch_size")


def _case(side: D.Side) -> Case | None:
    """The side's registered case (framework, mode, math, devices), None where its entry does not say one."""
    f = side.entry
    if any(f.get(k) is None for k in FIELDS) or f["framework"] not in REGISTRY:
        return None
    if f["mode"] not in REGISTRY[f["framework"]].modes:
        return None
    return Case(f["framework"], f["mode"], f["math"], f["devices"])


def axis_of(x: Case, y: Case) -> Axis | None:
    """The one dimension ``x`` and ``y`` differ in (module docstring), None for none or several."""
    changed = {k for k in ("framework", "mode", "math", "devices") if getattr(x, k) != getattr(y, k)}
    if changed == {"mode"}:
        return Axis.MODE
    if changed == {"math"}:
        return Axis.MATH
    if changed == {"devices"}:
        return Axis.DEVICES
    defaults = all(c.mode == REGISTRY[c.framework].default_mode for c in (x, y))
    return Axis.FRAMEWORK if changed in ({"framework"}, {"framework", "mode"}) and defaults else None


def case_pairs(sides: list[D.Side]) -> list[tuple[Axis, D.Side, D.Side]]:
    """Every pair of ``sides`` at one batch size that differs in one dimension, A before B in registry order."""
    known = [(c, s) for s in sides if (c := _case(s)) is not None]
    known.sort(key=lambda cs: (cs[1].entry.get("batch_size") is None, cs[1].entry.get("batch_size") or 0, cs[0].rank))
    out = []
    for i, (cx, x) in enumerate(known):
        for cy, y in known[i + 1:]:
            axis = axis_of(cx, cy)
            if axis is not None and x.entry.get("batch_size") == y.entry.get("batch_size"):
                out.append((axis, x, y))
    return out


def diffed(pair: Pair, alpha: float = D.ALPHA) -> Pair:
    """``pair`` with its diff, or its problem: sides timed in other units (GPU kernels against CPU ops) are not
    diffed; a diff that does not conserve its sides' time keeps its error (its self-check fails: ``check_rows``)."""
    a, b = pair.a, pair.b
    if a.level != b.level:
        pair.problem = f"not compared: A timed by {a.level}s ({a.source}), B by {b.level}s ({b.source})"
        return pair
    try:
        pair.rows, pair.places = D.diff(a, b, alpha), D.by_place(a, b, alpha)
    except KernelmapError as exc:  # the diff's conservation (analyses.diff.conserve): a failed self-check
        pair.problem = str(exc)
    return pair


def across(name: str, sides: list[D.Side], other: Run, alpha: float = D.ALPHA) -> list[Pair]:
    """Each case of run ``name`` (its ``sides``) against the same case (framework, mode, math, devices, batch size)
    of ``other``: A is ``other``'s side."""
    theirs = {tuple(s.entry.get(k) for k in FIELDS): s for s in FD.run_sides(other)}
    out = []
    for b in sides:
        a = theirs.get(tuple(b.entry.get(k) for k in FIELDS))
        if a is not None:
            out.append(diffed(Pair(name, Axis.RUN, a, b, against=other.name), alpha))
    return out


def pairs(runs: list[Run], alpha: float = D.ALPHA, against: Run | None = None) -> list[Pair]:
    """Every run's pairs (``case_pairs``, each diffed), and with ``against`` each run's cases against that run's
    (``across``), each given its CSVs' names (``file_names``). Each run's sides are read once."""
    sides = [(run.name, FD.run_sides(run)) for run in runs]
    out = [diffed(Pair(name, axis, a, b), alpha) for name, these in sides for axis, a, b in case_pairs(these)]
    if against is not None:
        out += [p for name, these in sides for p in across(name, these, against, alpha)]
    file_names(out)
    return out


# --- conservation: the self-check ---------------------------------------------------------------------
def conservation(rows: pd.DataFrame, a_total: int, b_total: int) -> tuple[str, str, str]:
    """(status, measured, detail) of one pair: its rows' ns summed per side against each side's 100% (every timed
    event of its source), exactly."""
    h = D.held(rows, a_total, b_total)
    measured = f"A {h.a_ns} ns, B {h.b_ns} ns"
    if h.conserved:
        return PASS, measured, f"the {len(rows)} rows hold 100% of each side's time"
    return FAIL, measured, f"the {len(rows)} rows hold A {h.share('a')}, B {h.share('b')} of each side's time"


def check_rows(found: list[Pair]) -> list[dict[str, Any]]:
    """A ``diff conserves each side's time`` row per pair (``conservation``)."""
    out = []
    for p in found:
        expected = f"A {p.a.total_ns} ns, B {p.b.total_ns} ns"
        subject = (f"{p.against}:{_name(p.a)} -> {p.run}:{_name(p.b)}" if p.against
                   else f"{_name(p.a)} -> {_name(p.b)} ({p.axis})")
        if p.rows is not None:
            status, measured, detail = conservation(p.rows, p.a.total_ns, p.b.total_ns)
        elif p.a.level != p.b.level:
            status, measured, detail = NOT_CHECKED, None, p.problem
        else:
            status, measured, detail = FAIL, "not conserved", p.problem
        out.append(check_row(p.run, p.a.entry.get("case"), p.batch_size, Check.DIFF_CONSERVED, subject, expected,
                             measured, status, detail))
    return out


def with_checks(checks: pd.DataFrame, found: list[Pair]) -> pd.DataFrame:
    """The report's self-checks with the pairs' rows after them."""
    rows = check_rows(found)
    return pd.concat([checks, pd.DataFrame(rows, columns=checks.columns)], ignore_index=True) if rows else checks


# --- the table a pair a row, and the files -----------------------------------------------------------
def _name(side: D.Side) -> str:
    return str(side.entry.get("case"))


def _label(side: D.Side) -> str:
    c = _case(side)
    return c.label if c is not None else _name(side)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "run"


def file_names(found: list[Pair]) -> None:
    """Each pair's CSVs: ``tables/diff/<run>/bs<N>-<A>-vs-<B>.csv`` (and ``-places.csv``); two pairs whose names
    would meet (a run's name cut to the same slug as another's) are numbered."""
    seen: set[str] = set()
    for p in found:
        if p.rows is None:
            continue
        folder = _slug(p.run) + (f"-vs-{_slug(p.against)}" if p.against else "")
        stem = f"{FOLDER}/{folder}/bs{p.batch_size}-{_slug(_name(p.a))}-vs-{_slug(_name(p.b))}"
        base, n = stem, 1
        while stem in seen:
            n += 1
            stem = f"{base}-{n}"
        seen.add(stem)
        p.file, p.places_file = f"{stem}.csv", f"{stem}-places.csv"


def write(out: Path, found: list[Pair]) -> int:
    """Every pair's rows and places as CSV under ``out`` (``file_names``); refuses a file that exists (nothing is
    overwritten). Returns the files written."""
    n = 0
    for p in found:
        for frame, rel in ((p.rows, p.file), (p.places, p.places_file)):
            if frame is None:
                continue
            path = out / rel
            if path.exists():
                raise KernelmapError(f"{path}: exists; a diff's rows are never written over another file")
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(path) as fh:
                frame.to_csv(fh, index=False)
            n += 1
    return n


def top_places(places: pd.DataFrame, top: int = TOP) -> list[dict[str, Any]]:
    """The ``top`` places (layer or op x direction) of largest change: saving = A's ms per step less B's (what A ->
    B saves a step; negative: what it costs), with the place's verdict."""
    inside = places[places["where"] != D.OUTSIDE]
    order = inside["change_ms"].abs().fillna(0).sort_values(ascending=False, kind="stable").index[:top]
    return [{"place": f"{r['where']} {r['direction']}", "saving_ms": -float(r["change_ms"]), "verdict": r["verdict"]}
            for _, r in inside.loc[order].iterrows()]


def _top_text(places: list[dict[str, Any]]) -> str:
    return "; ".join(f"{x['place']} {x['saving_ms']:+.4f}" + ("" if x["verdict"] in (D.Verdict.FASTER, D.Verdict.SLOWER)
                                                              else f" ({x['verdict']})") for x in places)


COLUMNS = ["run", "against", "batch_size", "differs_in", "a", "b", "a_label", "b_label", "level", "a_source", "b_source", "a_ms", "b_ms", "change_pct",
           "verdict", "p_value", "clean_verdict", "a_total_ns", "b_total_ns", "a_rows_ns", "b_rows_ns", "conserved",
           "rows", "same", "appeared", "disappeared", "algorithm_changed", "other_changes", "top", "problem",
           "rows_csv", "places_csv"]


def table(found: list[Pair]) -> pd.DataFrame:
    """A row a pair (``COLUMNS``): each side's traced time per step and the verdict (the U test over the traced
    steps), the clean step's verdict, each side's 100% and what its rows hold, the rows by status, the ``TOP``
    places of largest change (``top_places``: ms per step saved by A -> B) and the CSVs."""
    out = []
    for p in found:
        s = p.rows.attrs["summary"] if p.rows is not None else None
        counts = p.rows["status"].value_counts() if p.rows is not None else pd.Series(dtype=int)
        k = {str(x): int(counts.get(str(x), 0)) for x in D.Status}
        changed = sum(k[str(x)] for x in CHANGED)
        h = D.held(p.rows, p.a.total_ns, p.b.total_ns) if s else None
        a_ms, b_ms = (s["a"]["ms_per_step"], s["b"]["ms_per_step"]) if s else (None, None)
        out.append({
            "run": p.run, "against": p.against, "batch_size": p.batch_size, "differs_in": str(p.axis), "a": _name(p.a), "b": _name(p.b),
            "a_label": _label(p.a), "b_label": _label(p.b), "level": p.a.level, "a_source": p.a.source, "b_source": p.b.source, "a_ms": a_ms, "b_ms": b_ms,
            "change_pct": (b_ms - a_ms) / a_ms * 100 if a_ms else None,
            "verdict": s["traced_verdict"] if s else None, "p_value": s["traced_p"] if s else None,
            "clean_verdict": s["clean_verdict"] if s else None, "a_total_ns": p.a.total_ns, "b_total_ns": p.b.total_ns,
            "a_rows_ns": h.a_ns if s else None, "b_rows_ns": h.b_ns if s else None,
            "conserved": h.conserved if s else False,
            "rows": len(p.rows) if s else 0, "same": k[str(D.Status.SAME)], "appeared": k[str(D.Status.APPEARED)],
            "disappeared": k[str(D.Status.DISAPPEARED)], "algorithm_changed": changed,
            "other_changes": int(counts.sum()) - changed - sum(k[str(x)] for x in (D.Status.SAME, D.Status.APPEARED,
                                                                            D.Status.DISAPPEARED, D.Status.OUTSIDE)),
            "top": _top_text(top_places(p.places)) if p.places is not None else "", "problem": p.problem,
            "rows_csv": p.file, "places_csv": p.places_file})
    return pd.DataFrame(out, columns=COLUMNS)


# --- the page ---------------------------------------------------------------------------------------
def _cells(r: pd.Series, runs: int) -> list[str]:
    e = html.escape
    who = f"{e(r['a_label'])} → {e(r['b_label'])}" + (f" <span class='meta'>({e(r['run'])})</span>" if runs > 1 else "")
    if r["against"]:
        who = f"{e(r['a_label'])} <span class='meta'>({e(r['against'])} → {e(r['run'])})</span>"
    if r["rows"] == 0:
        return [e(str(r["batch_size"])), who, e(r["differs_in"]), f"<span class='status'>{e(r['problem'])}</span>",
                "", "", "", ""]
    time = f"{r['a_ms']:.4f} → {r['b_ms']:.4f}" + (f" ({r['change_pct']:+.1f}%)" if pd.notna(r["change_pct"]) else "")
    src = e(r["a_source"]) if r["a_source"] == r["b_source"] else f"{e(r['a_source'])} / {e(r['b_source'])}"
    kept = "100% / 100%" if r["conserved"] else "<span class='status'>FAIL</span> " + e(
        f"{r['a_rows_ns']} of {r['a_total_ns']} / {r['b_rows_ns']} of {r['b_total_ns']} ns")
    links = f"<a href='{e(r['rows_csv'])}'>rows</a> · <a href='{e(r['places_csv'])}'>places</a>"
    return [e(str(r["batch_size"])), who, e(r["differs_in"]), f"{e(r['level'])} {time} <span class='meta'>{src}</span>",
            e(str(r["verdict"])), kept, f"{r['appeared']} / {r['disappeared']} / {r['algorithm_changed']} of {r['rows']}",
            f"{e(r['top'])} <span class='meta'>({links})</span>"]


UNBROKEN = {0, 2, 4, 5}  # short cells kept on one line (bs, what differs, the verdict, the conservation)
HEAD = ["bs", "A → B", "differs in", "traced time, ms/step (source)", "B vs A", "rows hold (A / B)",
        "appeared / disappeared / algorithm (op) changed", f"top {TOP} places: ms/step A → B saves (CSV)"]


def section_html(frame: pd.DataFrame) -> str:
    """The pairs as one short table (a row a pair), or the line that says there are none."""
    if frame.empty:
        return f"<p class='empty'>{html.escape(NO_PAIRS)}.</p>"
    runs = frame["run"].nunique()
    body = "".join("<tr>" + "".join(f"<td class='key'>{c}</td>" if i in UNBROKEN else f"<td>{c}</td>"
                                    for i, c in enumerate(_cells(r, runs))) + "</tr>" for _, r in frame.iterrows())
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEAD)
    return f"<table class='diff-pairs words'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
