"""``kernelmap diff A B``: two run directories, two cases of one run, or other people's traces, kernel by
kernel (the table: ``reports/analyses/diff.py``; docs/diff.md). This module reads the sides and prints."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from html import escape
from pathlib import Path
from typing import Any, TextIO

import pandas as pd
from kernelmap.frameworks.case import FIELDS

from kernelmap import normalise
from kernelmap.atomic import atomic_file
from kernelmap.errors import KernelmapError

from . import findingscli
from .analyses import diff as D
from .analyses import findings as F
from .analyses.base import load_run, with_case_column
from .foreign import is_run_dir, trace_files

SELECTOR_FIELDS = (*FIELDS, "case")
KERNEL_WIDTH = 70


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A", help="run directory, or trace file / directory of traces (kernelmap normalise "
                                          "reads them): the side compared against")
    p.add_argument("b", metavar="B", help="the same for the other side (may be A again, with another --case-b)")
    p.add_argument("--case", metavar="SEL", help="case on both sides, e.g. framework=NAME,mode=MODE,batch_size=64 "
                                                 f"(fields: {', '.join(SELECTOR_FIELDS)})")
    p.add_argument("--case-a", metavar="SEL", help="case of A (overrides --case)")
    p.add_argument("--case-b", metavar="SEL", help="case of B (overrides --case)")
    p.add_argument("--source", metavar="SOURCE", help="trace source to time from (the records' source "
                                                      "column); default: the framework's profiler trace, else nsys")
    p.add_argument("--alpha", type=float, default=D.ALPHA, help=f"the U test's level (default {D.ALPHA})")
    p.add_argument("--csv", metavar="FILE", help="write every row as CSV (the table's columns, ns totals included)")
    p.add_argument("--places-csv", metavar="FILE", help="write the by-layer-and-direction rows as CSV")
    p.add_argument("--html", metavar="FILE", help="write the header and both tables as one HTML page")
    p.add_argument("--top", type=int, metavar="N", help="print only the N rows of largest change (CSV: all rows)")
    p.add_argument("--findings", type=int, nargs="?", const=10, metavar="N",
                   help="then the two sides' findings ranked by what they would save, the N first of each kind "
                        "(default 10; reports/analyses/findings.py)")
    p.add_argument("--findings-csv", metavar="FILE", help="write every finding as CSV")


def parse_selector(text: str | None) -> dict[str, str]:
    """``k=v,k=v`` into {field: value}; KernelmapError naming a field that is not a case field."""
    out: dict[str, str] = {}
    for part in filter(None, (text or "").split(",")):
        k, sep, v = part.partition("=")
        k = k.strip()
        if not sep or k not in SELECTOR_FIELDS or not v.strip():
            raise KernelmapError(f"--case {text!r}: {part!r} is not FIELD=VALUE with FIELD one of "
                                 f"{', '.join(SELECTOR_FIELDS)}")
        out[k] = v.strip()
    return out


def _matches(fields: dict[str, Any], sel: dict[str, str]) -> bool:
    return all(str(fields.get(k)) == v for k, v in sel.items())


def _describe(fields: dict[str, Any]) -> str:
    return ",".join(f"{k}={fields[k]}" for k in SELECTOR_FIELDS if fields.get(k) is not None)


def _one(candidates: list[dict[str, Any]], sel: dict[str, str], where: str) -> dict[str, Any]:
    hits = [c for c in candidates if _matches(c, sel)]
    if len(hits) == 1:
        return hits[0]
    listed = "; ".join(_describe(c) for c in candidates) or "none"
    what = "no case matches" if not hits else f"{len(hits)} cases match"
    raise KernelmapError(f"{where}: {what} {_describe(sel) or '(no --case)'}; its cases: {listed}")


def run_side(path: Path, sel: dict[str, str], source: str | None) -> tuple[D.Side, str]:
    """A case of a run directory: its results.json entry and its records (``load_run``), and the machine it ran
    on (``machine``, from the manifest the run was loaded with)."""
    run = load_run(path)
    entry = _one([r for r in run.results if isinstance(r, dict)], sel, str(path))
    if run.records is None:
        raise KernelmapError(f"{path}: no records.parquet (run `kernelmap normalise {path}` first)")
    rec = run.records
    rec = rec[(rec["case"] == entry["case"]) & (rec["batch_size"] == entry["batch_size"])]
    if rec.empty:
        raise KernelmapError(f"{path}: no records of {_describe(entry)}")
    return (D.make_side(f"{path.name}:{entry['case']} bs{entry['batch_size']}", rec, entry, source),
            machine(run.manifest, entry.get("device")))


def trace_side(path: Path, sel: dict[str, str], source: str | None) -> tuple[D.Side, str]:
    """Traces that are not a kernelmap run (``normalise``; a ParseError names a file it cannot read), which record
    no machine."""
    rec, _ = normalise.normalise(trace_files([path]))
    rec = with_case_column(rec)
    keys = rec[["case", "framework", "batch_size"]].drop_duplicates()
    cands = [{k: (None if pd.isna(v) else v) for k, v in row.items()} for row in keys.to_dict("records")]
    c = _one(cands, sel, str(path))
    m = (rec["case"] == c["case"]) if c["case"] is not None else rec["case"].isna()
    m &= rec["batch_size"].isna() if c["batch_size"] is None else (rec["batch_size"] == c["batch_size"])
    return D.make_side(f"{path.name}:{c['case']}", rec[m], None, source), NO_MACHINE


def side(path: str, sel: dict[str, str], source: str | None) -> tuple[D.Side, str]:
    """A side and the machine it ran on (``run_side``, ``trace_side``)."""
    p = Path(path)
    if not p.exists():
        raise KernelmapError(f"{p}: no such file or directory")
    return run_side(p, sel, source) if is_run_dir(p) else trace_side(p, sel, source)


# --- printing ------------------------------------------------------------------------------------
def _f(x: Any, fmt: str) -> str:
    return "" if x is None or (isinstance(x, float) and pd.isna(x)) else format(x, fmt)


NO_MACHINE = "a machine not recorded (a trace, not a run directory)"


def machine(manifest: dict[str, Any], device: Any) -> str:
    """The machine a case ran on, from its run's manifest: the GPU's name for a GPU case, else the host's CPU and
    cores."""
    gpu, host = manifest.get("gpu") or {}, manifest.get("host") or {}
    if str(device) == "gpu" and gpu.get("name"):
        return str(gpu["name"])
    cores = host.get("ncpu") or host.get("cpu_count")
    return f"CPU {host.get('cpu') or 'unknown'}" + (f" ({cores} cores)" if cores else "")


def machines_line(s: dict[str, Any]) -> str | None:
    """A line where A and B ran on different machines: every change then holds the machines' difference too."""
    a, b = s["a"].get("machine"), s["b"].get("machine")
    if a is None or b is None or a == b or NO_MACHINE in (a, b):
        return None
    return f"A and B ran on different machines ({a}; {b}): each change holds the machines' difference too"


def header(s: dict[str, Any]) -> list[str]:
    """What each side's figures are: source, unit, steps, 100% of its time, the machine, the clean step."""
    lines = []
    for name in ("a", "b"):
        x = s[name]
        busy = {True: "a BUSY machine", False: "a quiet machine", None: "a machine not measured"}[x["contended"]]
        lines.append(f"{name.upper()}: {x['label']} — {x['level']} time from {x['source']}, {x['steps']} steps "
                     f"({x['steps_basis']}); {_f(x['ms_per_step'], '.4f')} ms/step; 100% = {x['total_ns']} ns "
                     f"({x['outside_ns']} ns outside the counted steps); that pass on {busy}"
                     + (f", {x['machine']}" if x.get("machine") else ""))
        if x["clean_median_ms"] is not None:
            lo, hi = x["clean_ci95_ms"]
            ci = (f"95% CI [{lo:.4f}, {hi:.4f}] over {x['clean_trials']} trial(s)" if lo is not None and hi is not None
                  else "no interval recorded")
            lines.append(f"   clean step {x['clean_median_ms']:.4f} ms, {ci}" + (" (BUSY)" if x["clean_contended"] else ""))
    if (apart := machines_line(s)) is not None:
        lines.append(apart)
    lines.append(f"clean step, B vs A (trials' 95% intervals): {s['clean_verdict']}")
    lines.append(f"traced {s['a']['level']} time per step, B vs A: {s['traced_verdict']}"
                 + (f" (p = {s['traced_p']:.3g})" if s["traced_p"] is not None else ""))
    lines.append(f"verdicts: {s['rule']}")
    return lines


FIGURES = [("a_ms", "A ms", ".4f"), ("b_ms", "B ms", ".4f"), ("change_ms", "change", "+.4f"),
           ("change_pct", "%", "+.1f"), ("a_calls_step", "A n", "g"), ("b_calls_step", "B n", "g"),
           ("verdict", "verdict", "s"), ("p_value", "p", ".2g"), ("busy", "busy", "s")]
KERNEL_COLUMNS = [("where", "where", "s"), ("direction", "dir", "s"), ("library_call", "call", "s"),
                  ("kernel", "kernel", "s"), *FIGURES, ("status", "status", "s"), ("note", "note", "s")]
PLACE_COLUMNS = [("where", "where", "s"), ("direction", "dir", "s"), *FIGURES]


def table(df: pd.DataFrame, top: int | None = None, cols: list[tuple[str, str, str]] = KERNEL_COLUMNS) -> str:
    """The rows as a terminal table (every row, or the ``top`` of largest absolute change)."""
    if top is not None:
        df = df.loc[df["change_ms"].abs().fillna(0).sort_values(ascending=False).index[:top]].sort_index()
    cells = [[h for _, h, _ in cols]]
    for _, r in df.iterrows():
        row = []
        for c, _, fmt in cols:
            v = r[c]
            text = _f(v, fmt) if fmt != "s" else str(v)
            row.append(text[:KERNEL_WIDTH - 1] + "…" if c == "kernel" and len(text) > KERNEL_WIDTH else text)
        cells.append(row)
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    return "\n".join("  ".join(t.ljust(w) for t, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def write(df: pd.DataFrame, places: pd.DataFrame, out: TextIO, top: int | None = None) -> None:
    """The header, the places (each layer or op and direction, its kernels together), then the kernels."""
    s = df.attrs["summary"]
    print("\n".join([*header(s), *conservation(df, places)]), file=out)
    print(f"\nby layer (op where no layer) and direction, ms per step of {s['a']['level']} time:", file=out)
    print(table(places, None, PLACE_COLUMNS), file=out)
    print(f"\nby {s['a']['level']}" + (f" (the {top} largest changes)" if top else "") + ":", file=out)
    print(table(df, top), file=out)
    counts = df["status"].value_counts()
    print("rows: " + ", ".join(f"{n} {k}" for k, n in counts.items()), file=out)


def conservation(df: pd.DataFrame, places: pd.DataFrame) -> list[str]:
    """Each side's 100%, summed from the rows themselves (both tables) against its source's total."""
    s = df.attrs["summary"]
    rows, at_places = (D.held(t, s["a"]["total_ns"], s["b"]["total_ns"]) for t in (df, places))
    lines = []
    for name in ("a", "b"):
        x = s[name]
        k, p = (getattr(h, f"{name}_ns") for h in (rows, at_places))
        lines.append(f"conservation, {name.upper()}: the {len(df)} {x['level']} rows hold {k} ns and the {len(places)} "
                     f"place rows {p} ns of its {x['total_ns']} ns of {x['level']} time from {x['source']} "
                     f"({rows.share(name)})")
    return lines


def _side_html(line: str, contended: bool | None) -> str:
    mark = {True: "<span class='busy'>BUSY machine</span> ", False: "<span class='quiet'>quiet machine</span> ",
            None: "<span class='empty'>machine not measured</span> "}[contended]
    return f"<p>{mark}{escape(line)}</p>"


def _findings_html(found: pd.DataFrame) -> str:
    """Each kind's findings, every row ranked with its cause (``html.findings_html``), and what its time is."""
    from . import html as H

    parts = [f"<h2 id='findings'>Findings, B against A and A against B</h2><div class='noise'>noise: "
             f"{escape(found.attrs.get('rules', {}).get('noise', F.NOISE_RULE))}</div>"]
    for kind in F.Kind:
        rows = found[found["kind"] == str(kind)]
        n = int((rows["call"] == str(F.Call.FINDING)).sum())
        parts.append(f"<h3>{escape(str(kind))} findings <span class='meta'>({n} beyond noise, {len(rows) - n} noise "
                     "or not judged)</span></h3>")
        parts.append(H.findings_html(rows, str(kind), top=len(rows)) or "<p class='empty'>none</p>")
        parts += [f"<p class='meta'>basis: {escape(b)}</p>" for b in dict.fromkeys(rows["basis"])]
    return "".join(parts)


def page(df: pd.DataFrame, places: pd.DataFrame, found: pd.DataFrame | None = None) -> str:
    """The header (each side, its kind of time, trials, busy mark), the conservation, both tables (every row) and
    the findings (every row, with its cause) as one self-contained HTML page, styled as the report."""
    from importlib import resources

    from . import html as H

    css = resources.files("kernelmap.reports").joinpath("report.css").read_text()
    s = df.attrs["summary"]
    cols = {c: h for c, h, _ in PLACE_COLUMNS}
    kcols = {c: h for c, h, _ in KERNEL_COLUMNS}
    lines = header(s)
    head, sides = [], iter(("a", "b"))
    for line in lines:
        starts = line[:3] in ("A: ", "B: ")
        head.append(_side_html(line, s[next(sides)]["contended"]) if starts else f"<p>{escape(line)}</p>")
    head += [f"<p class='quiet'>{escape(line)}</p>" for line in conservation(df, places)]
    title = escape(f"kernelmap diff: {s['a']['label']} vs {s['b']['label']}")
    level = escape(s["a"]["level"])
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{css}</style></head>"
            f"<body><h1>{title}</h1>{''.join(head)}<h2>By layer (op where no layer) and direction, ms per step of "
            f"{level} time</h2>{H.table(places, cols)}<h2>By {level}, ms per step</h2>{H.table(df, kcols)}"
            f"{_findings_html(found) if found is not None else ''}</body></html>")


def csv_text(df: pd.DataFrame) -> str:
    return df.to_csv(index=False)


def writable(path: str) -> None:
    """KernelmapError naming ``path`` where it cannot be written: a directory, or under a file or a folder this
    process may not write (checked before anything is read, so a bad path costs nothing)."""
    p = Path(path)
    if p.is_dir():
        raise KernelmapError(f"{p}: is a directory, not a file to write")
    parent = p.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise KernelmapError(f"{p}: cannot be written: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise KernelmapError(f"{p}: cannot be written: no permission to write in {parent}")


def write_all(texts: dict[str, str]) -> None:
    """Every output file, each written under a temporary name (``atomic_file``) and renamed into place only after
    every one is written: an error names the file, and no output is left half-written."""
    current = ""
    try:
        with contextlib.ExitStack() as stack:
            for current, text in texts.items():
                stack.enter_context(atomic_file(current)).write(text)
    except OSError as exc:
        raise KernelmapError(f"{exc.filename2 or current}: cannot be written: {exc.strerror or exc}") from exc


def main(args: argparse.Namespace) -> int:
    sa = parse_selector(args.case_a if args.case_a is not None else args.case)
    sb = parse_selector(args.case_b if args.case_b is not None else args.case)
    if not 0 < args.alpha < 1:
        raise KernelmapError(f"--alpha {args.alpha}: a level between 0 and 1")
    if args.top is not None and args.top < 1:
        raise KernelmapError(f"--top {args.top}: at least 1")
    outputs = [p for p in (args.csv, args.places_csv, args.html, args.findings_csv) if p]
    for path in outputs:
        writable(path)
    if len({os.path.realpath(p) for p in outputs}) < len(outputs):
        raise KernelmapError(f"two outputs name one file ({', '.join(outputs)}): one would overwrite the other")
    (a, a_machine), (b, b_machine) = side(args.a, sa, args.source), side(args.b, sb, args.source)
    if a.level != b.level:
        raise KernelmapError(f"A is timed by {a.level}s ({a.source}), B by {b.level}s ({b.source}): "
                             "not one unit of time; diff a GPU side against a GPU side")
    df, places = D.diff(a, b, args.alpha), D.by_place(a, b, args.alpha)
    df.attrs["summary"]["a"]["machine"], df.attrs["summary"]["b"]["machine"] = a_machine, b_machine
    want = args.findings is not None or args.findings_csv or args.html
    found = F.findings([a, b], args.alpha) if want else None
    texts = {path: csv_text(frame) for frame, path in ((df, args.csv), (places, args.places_csv),
                                                        (found, args.findings_csv)) if path}
    if args.html:
        texts[args.html] = page(df, places, found)
    write_all(texts)
    write(df, places, sys.stdout, args.top)
    if args.findings is not None:
        print("\nfindings, B against A and A against B:", file=sys.stdout)
        findingscli.write(found, sys.stdout, args.findings)
    return 0
