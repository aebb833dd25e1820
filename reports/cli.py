"""``kernelmap report RUN_DIR... -o DIR``: the side-by-side HTML/PNG report and timeline export.

DIR is built under a temporary name and renamed when complete; an existing DIR is refused unless
``--replace``. Contents: report.html (self-contained), one PNG per figure, timeline.json
(Chrome trace / Perfetto), and every table the page shows as CSV under ``tables/`` (``TABLES``).

Every report runs its self-checks (``checks.py``; with ``--storage`` also the clean pass against
the step benchmarks of the same job) and shows them; with ``--strict`` a failed check makes the
command exit ``checks.EXIT_CHECK_FAILED`` (4) after writing the report. A banner tops the page
where a figure was measured under contention (``busy_notes``) or a check failed.
"""

from __future__ import annotations

import argparse
import html as _html
import json
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from kernelmap import __version__, frameworks, timing
from kernelmap.atomic import atomic_dir, atomic_file
from kernelmap.errors import KernelmapError
from kernelmap.history.keys import flagged

from . import analysis as A
from . import answer as ANS
from . import checks as C
from . import diffsection as DS
from . import figures as F
from . import html as H
from . import mathchecks as MC
from . import rankfigure as RF
from .analyses import basis as B
from .analyses import commfigures as CF
from .analyses import findings as FD
from .analyses import math as MATH
from .analyses import scaling as SC
from .analyses.base import NOT_MEASURED as BUSY_NOT_MEASURED
from .analyses.opcpu import OP_CPU_METHOD, op_cpu_of
from .analyses.roofline import counter_kernels, layer_counters, peak_table
from .relations import CALL_VS_OP, library_call_statement, with_call_op_basis
from .timeline import chrome_trace

SUMMARY_COLS = {"run": "run", "framework_html": "framework", "mode": "mode", "device_html": "device", "math": "math",
                "batch_size": "batch",
                "steps_timed": "steps timed / trial", "trials": "trials", "step_ms_median": "step median (ms)",
                "ci_html": "step 95% CI (ms)", "step_ms_iqr": "step IQR (ms)",
                "images_per_s": "images/s (step)", "e2e_step_ms": "end-to-end step with loader (ms)",
                "e2e_images_per_s": "images/s (end to end)", "test_accuracy": "test accuracy",
                "contention_html": "machine during the clean pass"}
OP_FIELDS = {"op_names": "op", "libraries": "library", "library_calls": "library call(s)",
             "kernels": "kernel(s)", "calls_per_step": "calls/step", "ms_per_step": "time/step (ms)",
             "share_of_step": "share", "math_modes": "math mode"}

ABBREVIATED = {"op_names", "library_calls", "kernels"}  # list cells cut to a few short names (full in a title)
NEAR_ZERO = 0.01  # op-table rows under this share of every framework's summed time are folded away
LAUNCH_BS = 64  # the first screen's launch-bound line: each framework's fastest mode at this batch size
WITHIN = str(timing.Placement.WITHIN)  # a ratio whose two figures' intervals overlap: called noise (answer.NOISE_RULE)


LAYER_FIELDS = {"run": "run", "batch_size": "batch size", "layer": "layer", "canonical_op": "op",
                "direction": "direction", "framework": "framework", "libraries": "library",
                "library_calls": "library call(s)",
                "algos": "algorithm", "kernels": "kernel(s)", "calls_per_step": "library calls/step",
                "ms_per_step": "time/step (ms)", "time_source": "time from", "op_ms_per_step": "op time/step (ms)",
                "reorders_per_step": "reorders/step", "reorder_ms_per_step": "reorder time/step (ms)",
                "flops_per_step": "FLOP/step", "achieved_flops": "achieved FLOP/s", "math_modes": "math mode",
                CALL_VS_OP: "op time against the call's"}
LIBCALL_FIELDS = {"run": "run", "framework": "framework", "batch_size": "batch size", "library": "library",
                  "library_call": "library call", "canonical_op": "op", "layer": "layer", "direction": "direction",
                  "linked_to_op": "linked to an op", "kernels_linked": "kernels linked to it",
                  "calls_per_step": "calls/step", "ms_per_step": "time/step (ms)",
                  "calls_outside_steps": "calls outside the steps (warm-up, autotuning)", "basis": "per step of"}
CHECK_FIELDS = {"run": "run", "framework": "framework", "batch_size": "batch size", "check": "check",
                "subject": "subject", "expected": "expected", "measured": "measured", "status": "status",
                "detail": "detail"}

# tables/<name>.csv: every table the page renders, under a stable name
TABLES = {
    "answer": "the answer: per layer x direction, frameworks side by side (library call, algorithm, kernel, "
              f"time per step, time against {frameworks.get(frameworks.REFERENCE).label}'s)",
    "summary": "Summary: clean-pass step time, images/s, accuracy per framework x batch size",
    "parity": "parity.json's headline figures",
    "environment": "versions and machine, one column per run",
    "op_table": "side-by-side op table, all runs and batch sizes (long form: one row per op x direction x framework)",
    "layer_table": "per layer: conv and linear",
    "library_calls": "library-log calls per step, reorders as their own rows",
    "self_checks": "the report's self-checks",
    "op_time": "figure data: time per canonical op",
    "library_mix": "figure data: library mix",
    "kernel_count": "figure data: kernels per op",
    "busy_share": "figure data: busy share",
    "launch_bound": "launch-bound: clean step, GPU busy (union of kernel intervals), summed kernel time, idle share, "
                    "per framework x mode x batch size",
    "best_modes": "launch-bound: each framework's fastest mode per batch size 64",
    "overhead": "figure data: profiler overhead",
    "roofline": "figure data: achieved FLOP/s",
    "counter_kernels": "counters pass: each counted kernel (Nsight Compute), paired with its timing-pass kernel or why "
                       "not; FLOPs, DRAM bytes, math from the counters beside the log's, roofline position",
    "counter_layers": "counters pass: per layer x direction, tensor-core share of the time, counter FLOPs vs the "
                      "shapes' FLOP model (a ratio) and vs the FLOPs its conv/GEMM kernels execute by shape, tile "
                      "and launch (+-10%, or why not derivable)",
    "counter_status": "counters pass: per case, kernels counted and paired, or why the pass recorded nothing",
    "counter_peaks": "counters pass: the roofs each run measured (a large GEMM per precision, a device copy), the "
                     "case that measured each and how it was timed",
    "math": "math each library call really ran (issue 38), per case x layer x direction x call: math, its source, "
            "the unit its kernels ran on (tensor core, FMA, none: by name), data types, kernels or calls per step "
            "and their time",
    "math_coverage": "math: per case, the share of library time whose math is known (the issue asks >= 99%)",
    "coverage": "coverage: unattributed timed time",
    "coverage_top": "coverage: largest unattributed events",
    "attribution": "coverage: attribution.json per part",
    "not_read": "files normalise did not read",
    "unlinked_library_kernels": "coverage: library kernels not linked to the call that launched them, with the reason",
    "trend": "history: saved benchmarks (with --storage)",
    "cpu_answer": "the answer on CPU time: whole step and per layer x direction, frameworks side by side, ratios "
                  "drawn on a busy machine too (answer.cpu_table; <fw>.method: how each cell was measured, "
                  "docs/timing.md)",
    "cpu_wall": "CPU time against wall time per clean pass (basis.CPU_WALL_RULE)",
    "findings": "findings ranked by what they would save, per run: place (layer x direction) and whole step, "
                "each with its cause, 95% interval and call (finding, busy machine, noise; analyses.findings)",
    "comm_steps": "communication of multi-device cases per traced step and rank: compute, communication, exposed "
                  "communication, overlap share, bytes, share attributed to its op (analyses/comm.py)",
    "comm_cases": "communication of multi-device cases per case and rank: medians over the traced steps",
    "comm_arrivals": "communication: which rank arrived last at each collective of each traced step, and how long "
                     "after the first",
    "scaling": "scaling over devices per case: the clean step at N against one device at the same global batch, "
               "speedup, efficiency t1 / (N · tN) with its interval, the traced steps' communication (analyses/scaling.py)",
    "comm_collectives": "communication: every collective of each traced step and rank, its bytes, the work linked to "
                        "it, its kernels' CUDA streams and NCCL algorithm/protocol where their names say them",
    "comm_nccl": "NCCL's own log per multi-GPU case and rank (libs pass): each collective's bytes, communicator, "
                 "stream, and algorithm/protocol where rank 0 logged them",
    "comm_independent": "exposed communication from the traces against the clean step less the same step without "
                        "the gradients' reduction (--profile comm), per case and rank, within 5% or not",
    "diff_pairs": "differences between a run's cases that differ in one of mode, math, devices or framework (issue 40; "
                  "reports/diffsection.py): a row a pair; every pair's rows under tables/diff/",
    "trial_noise": "noise between processes: each case's clean trials, their spread and whether they differ (basis.trial_noise)",
    "step_noise": "each clean step against the reference's on wall and CPU time, within noise or not (basis.step_noise)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="run directories (kernelmap run [+ normalise]); or trace files / directories of traces "
                             "that are not a kernelmap run (any format the adapters read): a page per step "
                             "(reports/foreign.py)")
    parser.add_argument("-o", "--out", required=True, metavar="DIR", help="report directory to create")
    parser.add_argument("--replace", action="store_true", help="replace DIR if it exists")
    parser.add_argument("--storage", metavar="DIR", help="pytest-benchmark storage: add the step-time trend")
    parser.add_argument("--all-iterations", action="store_true",
                        help="timeline.json: every traced iteration, not only one")
    parser.add_argument("--strict", action="store_true",
                        help=f"exit {C.EXIT_CHECK_FAILED} when a self-check fails (the report is still written)")
    parser.add_argument("--diff-against", metavar="RUN_DIR", help="differences section: also each case against the "
                        "same case of this run directory (docs/diff.md)")


def _fallbacks(runs: list[A.Run]) -> list[dict]:
    out = []
    for run in runs:
        d = A.framework_devices(run)
        for _, r in d[d["fallback"]].iterrows():
            out.append({"run": run.name, "framework": A.fw_label(r["framework"]), "fw": r["framework"],
                        "device": r["device"], "device_requested": r["device_requested"], "note": r["device_note"]})
    return out


ANSWER_FIELDS = {"library_calls": "library call", "algos": "algorithm", "kernels": "kernel / implementation",
                 "ms_per_step": "time/step (ms)"}


def _answer_tables(ans: pd.DataFrame, fws: list[str], fallbacks: list[dict], summ: pd.DataFrame,
                   libcalls: pd.DataFrame | None = None, tag: str = "") -> list[dict]:
    """The answer table (``answer.answer_table``) as one HTML table per run x batch size, its title
    naming the device each framework ran on (the summary's). Each row prints the kind of time it
    compares, each time cell its pass, and each ratio cell either the ratio or why there is none. ``tag``: the
    prefix of its notes' ids, where the page holds another set of these tables (each [n] leads to its own table's)."""
    out: list[dict] = []
    if ans.empty:
        return out
    ref = ANS.frameworks.REFERENCE
    for (run, bs), g in ans.groupby(["run", "batch_size"], sort=False, dropna=False):
        here = [fw for fw in fws if g.get(f"{fw}.ms_per_step") is not None and g[f"{fw}.ms_per_step"].notna().any()]
        others = [fw for fw in here if fw != ref and ref in here]
        marks = {f["fw"]: f for f in fallbacks if f["run"] == run}
        head1 = ('<th rowspan="2">layer</th><th rowspan="2">direction</th>'
                 '<th rowspan="2">time compared</th>')
        head2 = ""
        for fw in here:
            warn = (f' <span class="fallback">⚠ on {_html.escape(str(marks[fw]["device"]))}</span>'
                    if fw in marks else "")
            head1 += f'<th colspan="{len(ANSWER_FIELDS)}">{_html.escape(A.fw_label(fw))}{warn}</th>'
            head2 += "".join(f"<th>{h}</th>" for h in ANSWER_FIELDS.values())
        for fw in others:
            head1 += (f'<th rowspan="2">{_html.escape(A.fw_label(fw))} time / {_html.escape(A.fw_label(ref))}'
                      f"<br><small>(same kind, comparable passes only)</small></th>")
        body = []
        notes: dict[str, int] = {}  # why a ratio is not drawn -> its note number (each reason printed once)
        stated: dict[str, int] = {}  # a framework's one statement of its calls -> its note letter (H.letter)
        for _, row in g.iterrows():
            cells = [f'<td class="key">{_html.escape(str(row["layer"]))}</td>',
                     f'<td class="key">{_html.escape(str(row["direction"]))}</td>',
                     f'<td class="kind">{_html.escape(str(row["compared_on"]))}</td>']
            for fw in here:
                if not isinstance(row.get(f"{fw}.library_calls"), list):
                    cells.append(f'<td colspan="{len(ANSWER_FIELDS)}" class="empty">not in this trace</td>')
                    continue
                calls = row[f"{fw}.library_calls"]
                libs = row.get(f"{fw}.libraries") or []
                said = library_call_statement(libcalls, run, fw, bs)  # the one statement of its calls
                call_html = H.abbr_list(calls, 28, wrap=True) if calls else (
                    f'<span class="empty">{_html.escape("/".join(libs) or "none")} '
                    f'({_html.escape(f"no call linked: {said}" if said else "no call logged")})</span>')
                bare = not calls and not any(row.get(f"{fw}.{k}") for k in ("algos", "kernels"))
                if bare and said:  # the one statement of its calls, said once under the table, not in every row
                    n = stated.setdefault(f"no call linked: {said}", len(stated) + 1)
                    call_html = (f'<span class="empty">{_html.escape("/".join(libs) or "none")} (no call linked '
                                 f'<a href="#{tag}callnote-{_html.escape(str(run))}-{bs}-{n}">[{H.letter(n)}]</a>)</span>')
                ms = row[f"{fw}.ms_per_step"]
                pass_ = row.get(f"{fw}.pass")
                kind = str(row.get(f"{fw}.time_kind"))
                # the pass (and, on a mixed row, the kind) under every time, in words
                under = (f"{pass_} pass" if isinstance(pass_, str) else "pass unknown") + (
                    f" · {kind}" if row["compared_on"] == ANS.MIXED else "")
                suspect = not bool(row.get(f"{fw}.comparable"))
                cells += [f'<td colspan="3">{call_html}</td>'] if bare else [
                    f"<td>{call_html}</td>", f"<td>{H.abbr_list(row[f'{fw}.algos'], 24, wrap=True)}</td>",
                    f"<td>{H.abbr_list(row[f'{fw}.kernels'], 34, wrap=True)}</td>"]
                cells.append(f'<td class="num" title="{_html.escape(str(row[f"{fw}.time_source"]))}">'
                             f"{H.fmt(ms, 'ms_per_step')}"
                             f'<br><span class="pass{" suspect" if suspect else ""}">{_html.escape(under)}</span></td>')
            for fw in others:
                v = row.get(f"{fw}.vs_ref")
                if v is None or pd.isna(v):
                    why = row.get(f"{fw}.no_ratio")
                    if not isinstance(why, str):
                        cells.append("<td>–</td>")
                        continue
                    n = notes.setdefault(why, len(notes) + 1)
                    cells.append(f'<td class="noratio" title="{_html.escape(why)}">{ANS.NO_RATIO} '
                                 f'<a href="#{tag}noratio-{_html.escape(str(run))}-{bs}-{n}">[{n}]</a></td>')
                    continue
                cells.append(H.ratio_value_cell(float(v), ANS.GAP, row.get(f"{fw}.vs_ref_noise") == WITHIN,
                                                ANS.NOISE_RULE))
            body.append("<tr>" + "".join(cells) + "</tr>")
        basis = sorted(set(g["compared_on"].dropna()))
        dev = summ[(summ["run"] == run) & (summ["batch_size"] == bs)] if len(summ) else summ
        on = {f: d for f, d in zip(dev.get("framework", []), dev.get("device", []), strict=True)}
        where = ", ".join(f"{A.fw_label(fw)} on {str(on[fw]).upper()}" for fw in here if fw in on)
        n_ratio = sum(int(pd.notna(g.get(f"{fw}.vs_ref")).sum()) for fw in others if f"{fw}.vs_ref" in g)
        n_noise = sum(int((g[f"{fw}.vs_ref_noise"] == WITHIN).sum()) for fw in others if f"{fw}.vs_ref_noise" in g)
        n_cells = sum(int(g[f"{fw}.ms_per_step"].notna().sum()) for fw in others)
        why_list = "".join(f'<li id="{tag}noratio-{_html.escape(str(run))}-{bs}-{n}" value="{n}">{_html.escape(w)}</li>'
                           for w, n in notes.items())
        out.append({"title": f"Run {run}, batch size {bs}" + (f": {where}" if where else ""),
                    # a table of many frameworks' calls is wider than the page: it scrolls in its own box
                    "html": f'<div class="wide"><table class="answer"><thead><tr>{head1}</tr><tr>{head2}</tr></thead>'
                            f"<tbody>{''.join(body)}</tbody></table></div>"
                            + (f'<ol class="noratio-notes">{why_list}</ol>' if notes else "")
                            + H.statements_list(stated, f"{tag}callnote-{_html.escape(str(run))}-{bs}"),
                    "basis": ", ".join(basis), "ratios": n_ratio, "noise": n_noise, "ratio_cells": n_cells})
    return out


def _summary_html(summ: pd.DataFrame) -> str:
    if summ.empty:
        return '<p class="empty">results.json lists no results.</p>'
    s = summ.copy()
    s["framework_html"] = [_html.escape(A.fw_label(f)) for f in s["framework"]]
    s["device_html"] = [
        (f'<span class="fallback" title="{_html.escape(str(n or ""))}">⚠ {_html.escape(str(d))} '
         f"(asked {_html.escape(str(q))})</span>") if fb else _html.escape(str(d))
        for d, q, fb, n in zip(s["device"], s["device_requested"], s["fallback"], s["device_note"], strict=True)]
    s["ci_html"] = [
        ("not measured" if pd.isna(lo) else
         f"{lo:.3f}–{hi:.3f} (±{hw:.1f}%)" + (' <span class="fallback">noisy</span>' if nz else ""))
        + (f' <span class="fallback">trials disagree{f" after {int(rp)} repeat(s)" if pd.notna(rp) and rp else ""}'
           "</span>" if flagged(td) else "")
        for lo, hi, hw, nz, td, rp in zip(s["step_ms_ci95_low"], s["step_ms_ci95_high"], s["ci95_half_width_pct"],
                                          s["noisy"], s["trials_disagree"], s["repeats"], strict=True)]
    s["contention_html"] = [_busy_html(c, t) for c, t in zip(s["contended"], s["contention"], strict=True)]
    # one run: the page's header names it; its column would only narrow the others (issue 42: a row a line or two)
    cols = SUMMARY_COLS if s["run"].nunique() > 1 else {k: v for k, v in SUMMARY_COLS.items() if k != "run"}
    return H.table(s, cols, raw={"framework_html", "device_html", "ci_html", "contention_html"})


def _busy_html(contended: Any, text: Any) -> str:
    """A contention text, marked where the pass was flagged contended."""
    if flagged(contended):
        return H.busy_span(text)
    return f'<span class="empty">{_html.escape(str(text))}</span>' if text == BUSY_NOT_MEASURED else _html.escape(
        str(text))


def busy_notes(summ: pd.DataFrame, ov: pd.DataFrame) -> list[str]:
    """Every figure of the run(s) measured while the machine was busy (flagged contended), in words: the clean
    passes (summary), the capture passes (overhead figure, and so every per-op and per-layer figure of that
    pass); the history's step benchmarks: ``history_busy_notes``. Trials that disagree on a quiet machine are noise between processes,
    not a busy machine: ``basis.noise_statements`` says them apart."""
    out = []
    for _, r in summ.iterrows():
        who = f"{r['run']}: {A.fw_label(r['framework'])} bs {r['batch_size']}"
        if flagged(r.get("contended")):
            out.append(f"{who} clean pass: {r['contention']}")
    for _, r in ov.iterrows():
        if r["pass"] != "clean" and flagged(r.get("contended")):
            out.append(f"{r['run']}: {A.fw_label(r['framework'])} bs {r['batch_size']} {r['pass']} pass: "
                       f"{r['contention']}")
    return out


def history_busy_notes(hist: pd.DataFrame | None) -> list[str]:
    """The saved step benchmarks of the History section measured while the machine was busy, in words: said apart
    from this run's figures (``busy_notes``), since a quiet run's page read as busy when they were counted with
    its own."""
    if hist is None or "contended" not in hist.columns:
        return []
    return [f"step benchmark {h['name']} (saved run {h['run']}): BUSY: {h.get('contention_text') or 'contended'}"
            for _, h in hist[hist["contended"].map(flagged).astype(bool)].iterrows()]


def _op_tables(runs: list[A.Run], fallbacks: list[dict]) -> list[dict]:
    out = []
    for run in runs:
        for bs in sorted({t.batch_size for t in A.timed_events(run)}, key=lambda x: (x is None, x)):
            df, fws = A.op_table(run, bs)
            if df.empty:
                continue
            marks = {f["fw"]: f for f in fallbacks if f["run"] == run.name}
            head1 = '<th rowspan="2">op</th><th rowspan="2">direction</th>'
            head2 = ""
            for fw in fws:
                levels = df.get(f"{fw}.level")
                level = levels.dropna().iloc[0] if levels is not None and levels.notna().any() else "?"
                warn = (f' <span class="fallback">⚠ on {_html.escape(str(marks[fw]["device"]))}</span>'
                        if fw in marks else "")
                head1 += f'<th colspan="{len(OP_FIELDS)}">{_html.escape(A.fw_label(fw))} ({level} time){warn}</th>'
                head2 += "".join(f"<th>{h}</th>" for h in OP_FIELDS.values())
            head1 += '<th rowspan="2">differences</th>'
            thead = f"<thead><tr>{head1}</tr><tr>{head2}</tr></thead>"
            totals = {fw: df[f"{fw}.ms_per_step"].sum() if f"{fw}.ms_per_step" in df else 0.0 for fw in fws}
            body, folded = [], []
            for _, row in df.iterrows():
                cells = [f'<td class="key">{_html.escape(row["canonical_op"])}</td>',
                         f'<td class="key">{_html.escape(row["direction"])}</td>']
                for fw in fws:
                    for k in OP_FIELDS:
                        v = row.get(f"{fw}.{k}")
                        num = isinstance(v, float)
                        text = H.abbr_list(v, 24, keep=2) if k in ABBREVIATED and isinstance(v, list) else H.fmt(v, k)
                        cells.append(f'<td class="{"num" if num else ""}">{text}</td>')
                diff = row["differences"]
                cells.append(f'<td class="differs">{H.fmt(diff)}</td>' if diff else "<td></td>")
                shares = [row.get(f"{fw}.ms_per_step") / totals[fw] for fw in fws
                          if totals[fw] and pd.notna(row.get(f"{fw}.ms_per_step"))]
                small = bool(shares) and max(shares) < NEAR_ZERO
                (folded if small else body).append("<tr>" + "".join(cells) + "</tr>")
            html_ = f'<div class="wide"><table>{thead}<tbody>{"".join(body)}</tbody></table></div>'
            if folded:
                html_ += (f"<details><summary>{len(folded)} more row(s), each under {NEAR_ZERO:.0%} of every "
                          f"framework's summed time/step in this table</summary>"
                          f'<div class="wide"><table>{thead}<tbody>{"".join(folded)}</tbody></table></div></details>')
            out.append({"title": f"Run {run.name}, batch size {bs}", "html": html_,
                        "notes": [f"{f['framework']} ran on {f['device']}, not {f['device_requested']}"
                                  + (f": {f['note']}" if f["note"] else "") for f in marks.values()]})
    return out


def op_table_long(runs: list[A.Run]) -> pd.DataFrame:
    """All op tables of all runs in long form: one row per run x batch size x op x direction x framework."""
    rows = []
    for run in runs:
        for bs in sorted({t.batch_size for t in A.timed_events(run)}, key=lambda x: (x is None, x)):
            df, fws = A.op_table(run, bs)
            for _, r in df.iterrows():
                for fw in fws:
                    if not isinstance(r.get(f"{fw}.level"), str):
                        continue
                    rows.append({"run": run.name, "batch_size": bs, "canonical_op": r["canonical_op"],
                                 "direction": r["direction"], "framework": fw,
                                 **{k: r.get(f"{fw}.{k}") for k in ("level", *OP_FIELDS, "calls_basis")},
                                 "differences": r["differences"]})
    return pd.DataFrame(rows)


def _csv_cell(v: Any) -> Any:
    if isinstance(v, list | tuple):
        return "; ".join(map(str, v))
    return v


def write_tables(out: Path, tables: dict[str, pd.DataFrame | None]) -> list[dict]:
    """``out/tables/<name>.csv`` for each table (``TABLES`` names); lists become '; '-joined text.
    Returns [{name, file, rows, what}] for the page."""
    (out / "tables").mkdir(exist_ok=True)
    written = []
    for name, df in tables.items():
        if name not in TABLES:
            raise KernelmapError(f"table {name!r} has no entry in reports.cli.TABLES")
        if df is None:
            continue
        path = out / "tables" / f"{name}.csv"
        with atomic_file(path) as fh:
            df.map(_csv_cell).to_csv(fh, index=False)
        written.append({"name": name, "file": f"tables/{name}.csv", "rows": len(df), "what": TABLES[name]})
    return written


def _figure(out: Path, stem: str, title: str, caption: str, draw, data: pd.DataFrame | None, *args,
            table_cols: dict | None = None, why_empty: str = "") -> dict[str, Any]:
    path = draw(*args, out / f"{stem}.png")
    return {"stem": stem, "title": title, "caption": caption, "file": f"{stem}.png" if path else None,
            "data_uri": H.data_uri(path) if path else None, "why_empty": why_empty or "no data for it in these runs",
            "table_html": H.table(data, table_cols) if data is not None and not data.empty else ""}


@dataclass
class Analysed:
    """Every table and figure input of one report, computed once (``analyse``) before anything is written."""

    runs: list[A.Run]
    fallbacks: list[dict]
    summ: pd.DataFrame
    ot: pd.DataFrame
    mix: pd.DataFrame
    kc: pd.DataFrame
    tl: pd.DataFrame
    busy: pd.DataFrame
    launch: pd.DataFrame
    best: pd.DataFrame
    ov: pd.DataFrame
    roof: pd.DataFrame
    peaks: dict
    cov: pd.DataFrame
    cov_top: pd.DataFrame
    attr: pd.DataFrame
    not_read: pd.DataFrame
    unlinked: pd.DataFrame
    raw_hist: pd.DataFrame | None
    layers: pd.DataFrame
    ans: pd.DataFrame
    ans_fws: list[str]
    checks: pd.DataFrame
    libcalls: pd.DataFrame
    contended: list[str]
    hist_busy: list[str]
    no_capture: list[str]
    parity: pd.DataFrame
    env: pd.DataFrame
    trace: dict
    cpu: pd.DataFrame  # the answer on CPU time (answer.cpu_table)
    cpu_fws: list[str]
    cpu_wall: pd.DataFrame  # CPU time against wall time (basis.cpu_wall_agreement)
    findings: pd.DataFrame  # ranked by what they would save (analyses.findings.run_findings)
    noise: pd.DataFrame  # the clean trials' spread and verdict per case (basis.trial_noise)
    step_noise: pd.DataFrame  # each clean step against the reference's, within noise or not (basis.step_noise)
    counters: dict[str, Any]  # the counters pass: kernels, layers, status, peaks (``_counters``)
    comm: CF.CommFigures  # issue 39: every run's communication figures, computed once (tables, checks, figures)
    diffs: list[DS.Pair]  # issue 40: the runs' pairs of cases differing in one dimension (reports/diffsection.py)


def load_runs(run_dirs: list[str]) -> list[A.Run]:
    """The run directories, each read once; two of one name are refused (the page keys runs by name)."""
    runs = [A.load_run(d) for d in run_dirs]
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise KernelmapError(f"two run directories share a name ({names}); rename one")
    return runs


def analyse(runs: list[A.Run], storage: str | None = None, all_iterations: bool = False,
            against: A.Run | None = None) -> Analysed:
    """Every analysis of the page, the answer and the self-checks (which read the same layer and answer
    tables the page shows)."""
    raw_hist = None
    if storage:
        from kernelmap.history.trend import load_history

        raw_hist = load_history(storage)
    summ, ov = A.summary_table(runs), A.profiler_overhead(runs)
    launch = A.launch_bound(runs)
    roof, peaks = A.roofline(runs)
    cov, cov_top, attr, not_read = A.coverage(runs)
    layers = A.layer_table(runs)
    ans, ans_fws = ANS.answer_table(layers, B.pass_states(runs))
    comm, diffs = CF.of(runs), DS.pairs(runs, against=against)
    return Analysed(
        runs=runs, fallbacks=_fallbacks(runs), summ=summ, ot=A.op_time(runs), mix=A.library_mix(runs),
        kc=A.kernel_counts(runs),
        tl=A.timeline_events(runs[0]) if len(runs) == 1 else pd.concat(
            [A.timeline_events(r) for r in runs], ignore_index=True),
        busy=A.busy_share(runs), launch=launch, best=A.best_modes(launch, LAUNCH_BS), ov=ov, roof=roof, peaks=peaks,
        cov=cov, cov_top=cov_top, attr=attr, not_read=not_read, unlinked=A.unlinked_library_kernels(runs),
        raw_hist=raw_hist, layers=with_call_op_basis(runs, layers), ans=ans, ans_fws=ans_fws,
        checks=DS.with_checks(C.self_checks(runs, raw_hist, layers, ans, comm), diffs), libcalls=A.library_calls(runs),
        contended=busy_notes(summ, ov), hist_busy=history_busy_notes(raw_hist), no_capture=ANS.no_capture_runs(runs),
        parity=A.parity_table(runs), env=A.environment_table(runs), findings=FD.run_findings(runs),
        trace=chrome_trace(runs, all_iterations=all_iterations),
        counters=_counters(runs), comm=comm, diffs=diffs,
        **_cpu_time(runs, layers))


def _counters(runs: list[A.Run]) -> dict[str, Any]:
    """The counters pass's tables (analyses/roofline.py: counter_kernels, layer_counters) and measured peaks."""
    kernels, status, peaks = counter_kernels(runs)
    return {"kernels": kernels, "layers": layer_counters(kernels), "status": status, "peaks": peaks,
            "peak_table": peak_table(peaks)}


def _cpu_time(runs: list[A.Run], layers: pd.DataFrame) -> dict[str, Any]:
    """The answer on CPU time and its check against wall time (``Analysed.cpu*``)."""
    cpu, cpu_fws = ANS.cpu_table(layers, B.cpu_states(runs), B.traced_op_ms(runs), op_cpu_of(runs))
    return {"cpu": cpu, "cpu_fws": cpu_fws, "cpu_wall": B.cpu_wall_agreement(runs), "noise": B.trial_noise(runs),
            "step_noise": B.step_noise(runs)}


FIGURE_PASSES = {"op_time": ("framework", "nsys"), "library_mix": ("framework", "libs", "nsys"),
                 "kernel_count": ("framework", "nsys"), "timeline": ("framework", "libs", "nsys"),
                 "busy_share": ("clean", "framework", "nsys"), "overhead": ("clean", "framework", "libs", "nsys"),
                 "roofline": ("framework", "nsys"), "counters_roofline": ("counters",)}  # the passes each figure draws from: its contention mark


def _figures(out: Path, a: Analysed) -> list[dict[str, Any]]:
    """The page's PNG figures, drawn into ``out``, each with its caption, data table and contention mark."""
    figs = _figure_list(out, a)
    for f in figs:
        f["busy"], f["mark"] = H.busy_mark(a.ov, FIGURE_PASSES[f["stem"]], A.fw_label)
    return RF.figures(out, list(a.comm.timelines.items()), a.ov, len(a.runs) > 1) + figs  # the multi-device cases' first


def _figure_list(out: Path, a: Analysed) -> list[dict[str, Any]]:
    """The page's PNG figures, drawn into ``out``, each with its caption and data table."""
    ot, mix, kc, tl, libcalls, busy, ov, roof, peaks = (a.ot, a.mix, a.kc, a.tl, a.libcalls, a.busy, a.ov, a.roof,
                                                        a.peaks)
    return [
        _figure(out, "op_time", "Time per canonical op",
                "Per framework, time per training step spent in each canonical op, stacked by phase "
                "(forward / backward / optimizer). GPU runs sum kernel time; CPU runs sum outermost framework-op time "
                "(XLA's CPU thunks: start to completion, an asynchronous one's including waiting for a pool thread).",
                F.op_time_figure, ot, ot),
        _figure(out, "library_mix", "Library mix",
                "Share of the timed time per step that runs in each library (cuDNN, cuBLAS, cuBLASLt, oneDNN, "
                "native framework code).", F.library_mix_figure, mix, mix),
        _figure(out, "kernel_count", "Kernels per op",
                "Distinct kernels each canonical op launches, per framework; launches per step on each bar.",
                F.kernel_count_figure, kc, kc, why_empty="no kernels recorded (CPU runs have none)"),
        _figure(out, "timeline", "One iteration",
                "One traced iteration per framework: lanes for the step and its phases, framework ops, library "
                "calls and kernels, coloured by canonical op. Time from the start of the iteration.",
                F.timeline_figure, None, tl, libcalls),
        _figure(out, "busy_share", "Busy share",
                "Summed kernel time (GPU) or outermost op time (CPU) per step of the capture pass, over the clean "
                "pass's median step on the GPU (kernels run on the device's clock; the capture pass's own step is "
                "slowed by its per-step synchronisation), over the same pass's mean step on the CPU (op time is "
                "the host's clock, slowed with its own pass). "
                "Below 100%: the device waits (launch latency, host work); above: work overlaps (several streams or threads).",
                F.busy_share_figure, busy, busy),
        _figure(out, "overhead", "Profiler overhead",
                "Median step time of each capture pass (clean, framework profiler, library logs, nsys) and "
                "its change against the clean pass, stated only where it lies outside the clean pass's 95% "
                "interval ('noise' otherwise; 'too few steps' under 20 timed steps). Capture passes synchronise "
                "after every step (their traces need step boundaries), the clean pass every 10 steps, so a "
                "capture pass's change includes that. On the CPU the framework pass also runs the CPU sampler "
                "(a thread of the worker reading every thread's CPU clock, 3.7-6% of a core: cpusampler.OWN_RULE), "
                "so its change includes that thread's too. The data lists each pass against its clean pass "
                "(against_clean) and what else used the machine meanwhile (contention, BUSY where flagged).", F.overhead_figure, ov, ov,
                why_empty="results.json records no capture passes"),
        _figure(out, "roofline", "Achieved FLOP/s vs peak",
                "FLOPs of each conv and linear op (from its shapes) over its summed kernel time, per layer and "
                "direction, against the GPU's dense FP32 and TF32 peak from the datasheet table in "
                "reports/analysis.py. " + " ".join(
                    f"{r}: {p.get('note')}." for r, p in peaks.items() if "note" in p) + " " + " ".join(
                    f"{r}: {p['not_shown']}." for r, p in peaks.items() if "not_shown" in p),
                F.roofline_figure, roof, roof, peaks, why_empty="no conv/linear event carries FLOPs"),
        _figure(out, "counters_roofline", "Roofline from hardware counters",
                "Counters pass (--profile counters): every kernel of one training step under Nsight Compute, at its "
                "arithmetic intensity (counter FLOPs over DRAM bytes read + written) and achieved FLOP/s (counter "
                "FLOPs over ncu's duration of the kernel, replayed alone with caches flushed, clocks not locked), "
                "coloured by the math its counters say it ran; roofs: this run's measured GEMM peak per precision "
                "and device-copy bandwidth (never a datasheet). Conv and linear layers named at their costliest "
                "kernel; grey x: kernels not paired with a timing-pass kernel (tables/counter_status.csv says why; "
                "each kernel: tables/counter_kernels.csv). The data: per layer x direction, the tensor-core share "
                "of its time and its counter FLOPs against the shapes' (+-10%). "
                "docs/COUNTERS.md.",
                F.counters_roofline_figure, a.counters["layers"], a.counters["kernels"], a.counters["peaks"],
                why_empty="no counters pass in these runs, or it recorded nothing (counter_status says why)"),
    ]


def _trend(out: Path, raw_hist: pd.DataFrame | None, storage: str | None) -> tuple[dict | None, pd.DataFrame | None]:
    """The saved step benchmarks (``--storage``): the trend figure and its table, in ms; (None, None) without."""
    trend, hist = None, None
    if raw_hist is None:
        return trend, hist
    from kernelmap.history.keys import TIME_STATS

    hist = raw_hist
    p = F.trend_figure(hist, out / "trend.png")
    # pytest-benchmark keeps seconds; the page and the CSV say ms, like the trend figure, in
    # columns named by their unit (no unitless seconds beside them)
    hist = hist.assign(**{f"{c}_ms": hist[c] * 1e3 for c in TIME_STATS}).drop(
        columns=list(TIME_STATS))
    extra = {}  # the job and what else used the machine, where the storage records them
    if "job" in hist.columns:
        extra["job"] = "job"
    if "contended" in hist.columns:
        hist = hist.assign(contention=[
            BUSY_NOT_MEASURED if c is None or (not isinstance(c, bool) and pd.isna(c)) else
            f"BUSY: {t or 'contended'}" if bool(c) else str(t or "quiet")
            for c, t in zip(hist["contended"], hist.get("contention_text", [None] * len(hist)),
                            strict=True)])
        extra["contention"] = "machine during the benchmark"
    if "malloc" in hist.columns:
        extra["malloc"] = "malloc settings (timing.ALLOC_ENV)"
    # the storage by its folder's name, as runs are: no path of this machine on the page
    trend = {"storage": Path(storage).name or str(storage),
             "file": "trend.png" if p else None, "data_uri": H.data_uri(p) if p else None,
             "why_empty": "no saved benchmark records framework, mode, device and batch size",
             "table_html": H.table(hist, {**{c: c for c in ("run", "datetime", "name", "framework", "mode",
                                                             "device", "batch_size", "unpaired")},
                                          **{f"{c}_ms": f"{c} (ms)" for c in ("median", "mean", "min")},
                                          "rounds": "rounds", **extra})}
    return trend, hist


def _first_screen(a: Analysed) -> dict[str, Any]:
    """The answer on CPU time, the rows only one framework has (folded), the failed checks (the full table folded)."""
    shared, alone = ANS.split_alone(a.ans, a.ans_fws)
    failed, every = H.checks_tables(a.checks, CHECK_FIELDS, C.FAIL)
    ref = ANS.frameworks.REFERENCE
    return {"cpu_answers": H.cpu_tables(a.cpu, a.cpu_fws, ref, A.fw_label, ANS.GAP, WITHIN, ANS.NOISE_RULE),
            "cpu_method": f"{B.PER_OP_CPU}. {OP_CPU_METHOD}. {B.PER_LAYER_CPU}. {timing.CPU_RULE}.",
            "cpu_wall_html": H.table(a.cpu_wall),
            "answers_alone": _answer_tables(alone, a.ans_fws, a.fallbacks, a.summ, a.libcalls, "alone-"),
            "answers_shared": _answer_tables(shared, a.ans_fws, a.fallbacks, a.summ, a.libcalls),
            "checks_failed_html": failed, "checks_html": every}


def devices_screen(scaled: pd.DataFrame) -> dict[str, Any]:
    """The first screen's section of a run with cases on several devices (issue 39): the frameworks side by side
    per batch size and N, then every figure per case; nothing where no case ran on more than one device."""
    if scaled.empty:
        return {"devices_html": ""}
    cols = ["run", "label", "device", "batch_size", "devices", "step_ms", "ci95_low_ms", "ci95_high_ms", "speedup",
            "efficiency", "efficiency_low", "efficiency_high", "busy", "compute_ms", "communication_ms", "exposed_ms",
            "overlap_share", "ranks", "comm_source"]
    return {"devices_html": H.table(SC.side_by_side(scaled)), "devices_detail_html": H.table(scaled[cols]),
            "devices_kind": SC.KIND}


def _context(a: Analysed, figs: list[dict], trend: dict | None, csvs: list[dict]) -> dict[str, Any]:
    """What the page's template reads."""
    runs, checks, contended, trace, best, summ, fallbacks = (a.runs, a.checks, a.contended, a.trace, a.best,
                                                             a.summ, a.fallbacks)
    procs = [e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"]
    problems = [f"{r.name}: {p}" for r in runs for p in r.problems]
    return {
        "runs": [r.name for r in runs], "run_info": [{"name": r.name, "path": str(r.path)} for r in runs],
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "version": __version__,
        "fallbacks": fallbacks, "problems": problems,
        "summary_html": _summary_html(summ),
        "launch_lines": A.best_mode_lines(best), "launch_bs": LAUNCH_BS,
        "launch_html": H.table(a.launch) if len(a.launch) else "",
        "answers": _answer_tables(a.ans, a.ans_fws, fallbacks, summ, a.libcalls), "no_capture": a.no_capture,
        "only_clean": bool(runs) and len(a.no_capture) == len(runs),
        "gap": ANS.GAP, "reference": A.fw_label(ANS.frameworks.REFERENCE),
        "parity_html": H.table(a.parity),
        "findings_place_html": H.findings_html(a.findings, str(FD.Kind.PLACE)),
        "findings_step_html": H.findings_html(a.findings, str(FD.Kind.STEP)), "findings_rule": FD.NOISE_RULE,
        "diff_html": DS.section_html(DS.table(a.diffs)), "diff_rule": DS.RULE, "diff_top": DS.TOP,
        "env_html": H.table(a.env),
        "op_tables": _op_tables(runs, fallbacks),
        "layer_html": H.table(a.layers, LAYER_FIELDS, compact=True),
        "libcalls_html": H.table(a.libcalls, LIBCALL_FIELDS, compact=True),
        **_first_screen(a),
        "checks_failed": int((checks["status"] == C.FAIL).sum()),
        "checks_not_checked": int((checks["status"] == C.NOT_CHECKED).sum()),
        "checks_total": len(checks), "exit_check_failed": C.EXIT_CHECK_FAILED,
        "check_causes": C.causes(checks), "contended": contended,
        "check_lines": H.failure_lines(checks, C.FAIL, A.fw_label, C.Check.MATH_AS_ASKED),
        "math_lines": MC.first_screen_lines(checks, A.fw_label),  # issue 38: the libraries' fp32 on the tensors asked
        "contended_total": len(contended), "hist_busy": a.hist_busy,
        "noise_lines": B.noise_statements(a.noise, a.step_noise),
        "csvs": csvs,
        "figures": figs,
        "coverage_html": H.table(a.cov), "coverage_top_html": H.table(a.cov_top), "attribution_html": H.table(a.attr),
        "not_read_html": H.table(a.not_read), "unlinked_html": H.table(a.unlinked),
        "timeline_events": sum(1 for e in trace["traceEvents"] if e["ph"] == "X"),
        "timeline_processes": procs, "trend": trend,
    }


def build(run_dirs: list[str], out: Path, replace: bool = False, storage: str | None = None,
          all_iterations: bool = False, diff_against: str | None = None) -> tuple[Path, pd.DataFrame]:
    """Write the report of ``run_dirs`` into ``out`` (atomically); returns (out, the self-checks)."""
    a = analyse(load_runs(run_dirs), storage, all_iterations, A.load_run(diff_against) if diff_against else None)
    with atomic_dir(out, replace=replace) as tmp:
        figs = _figures(tmp, a)
        trend, hist = _trend(tmp, a.raw_hist, storage)
        with atomic_file(tmp / "timeline.json") as fh:
            json.dump(a.trace, fh)
        csvs = write_tables(tmp, {
            "answer": a.ans, "summary": a.summ, "parity": a.parity, "environment": a.env,
            "op_table": op_table_long(a.runs), "layer_table": a.layers, "library_calls": a.libcalls,
            "self_checks": a.checks, "op_time": a.ot, "library_mix": a.mix, "kernel_count": a.kc,
            "busy_share": a.busy, "overhead": a.ov, "launch_bound": a.launch, "best_modes": a.best,
            "roofline": a.roof, "counter_kernels": a.counters["kernels"], "counter_layers": a.counters["layers"],
            "counter_status": a.counters["status"], "counter_peaks": a.counters["peak_table"],
            "coverage": a.cov, "coverage_top": a.cov_top, "attribution": a.attr,
            "not_read": a.not_read, "unlinked_library_kernels": a.unlinked, "trend": hist,
            "math": MATH.math_table(a.runs), "math_coverage": MATH.math_coverage(a.runs),
            "cpu_answer": a.cpu, "cpu_wall": a.cpu_wall, "findings": a.findings, "trial_noise": a.noise, "step_noise": a.step_noise,
            "scaling": (scaled := a.comm.scaling), **CF.tables(a.runs, a.comm), "diff_pairs": DS.table(a.diffs)})
        DS.write(tmp, a.diffs)
        with atomic_file(tmp / "report.html") as fh:
            fh.write(H.render({**_context(a, figs, trend, csvs), **devices_screen(scaled)}))
    return Path(out), a.checks


def main(args: argparse.Namespace) -> int:
    from . import foreign

    runs = [foreign.is_run_dir(p) for p in args.run_dirs]
    if not any(runs):  # other people's traces: their own page
        out = foreign.build(args.run_dirs, Path(args.out), replace=args.replace)
        print(f"wrote {out / 'report.html'}")
        return 0
    if not all(runs):
        raise KernelmapError("give either kernelmap run directories or trace files, not both: "
                             + ", ".join(p for p, r in zip(args.run_dirs, runs, strict=True) if not r) + " is not a run directory")
    out, checks = build(args.run_dirs, Path(args.out), replace=args.replace, storage=args.storage,
                        all_iterations=args.all_iterations, diff_against=args.diff_against)
    print(f"wrote {out / 'report.html'}")
    return say_checks(checks, out, args.strict)


def _said(v: Any) -> str:
    """A check's expected or measured figure on the console: numbers to 4 significant digits."""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def say_checks(checks: pd.DataFrame, out: Path, strict: bool) -> int:
    """The self-checks on the console: the counts, each failed row (stderr), and with ``strict`` each check
    left unchecked with its first reason (a strict pass says what it did not check); the exit code."""
    bad = C.failed(checks)
    unchecked = checks[checks["status"] == C.NOT_CHECKED]
    print(f"self-checks: {len(checks) - len(bad) - len(unchecked)} passed, {len(bad)} failed, "
          f"{len(unchecked)} not checked ({out / 'tables' / 'self_checks.csv'})")
    for _, r in bad.iterrows():
        who = (f" {A.fw_label(r['framework'])}" if isinstance(r["framework"], str) else "") + (
            f" bs {r['batch_size']}" if pd.notna(r["batch_size"]) else "")
        print(f"  FAIL {r['run']}{who}: {r['check']}: {r['subject']}: "
              f"expected {_said(r['expected'])}, measured {_said(r['measured'])} ({r['detail']})", file=sys.stderr)
    if strict:
        for check, g in unchecked.groupby("check", sort=False):
            print(f"  not checked: {check} ({len(g)} row(s)): {g['detail'].iloc[0]}", file=sys.stderr)
    if strict and len(bad):
        print(f"kernelmap report: --strict: {len(bad)} self-check(s) failed: "
              + ", ".join(f"{c} ({n})" for c, n in bad.groupby("check", sort=False).size().items()), file=sys.stderr)
        return C.EXIT_CHECK_FAILED
    return 0
