"""The one-file HTML page: renders what ``analysis`` returned and embeds ``figures``' PNGs.

No network: styles are inlined, every image is a base64 data URI (the PNGs are also written
beside the page). Tables are rendered from DataFrames with escaping; lists become bullet lists.
"""

from __future__ import annotations

import base64
import html
import re
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

_PCT_COLS = {"share", "share_of_step", "busy_share", "overhead", "unattributed_share"}


def data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(png).read_bytes()).decode("ascii")


def fmt(v: Any, col: str = "") -> str:
    """A cell as escaped HTML."""
    if isinstance(v, list | tuple):
        if not v:
            return ""
        if len(v) == 1:
            return html.escape(str(v[0]))
        return "<ul>" + "".join(f"<li>{html.escape(str(x))}</li>" for x in v) + "</ul>"
    if v is None or (not isinstance(v, str | dict) and pd.isna(v)):
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        base = col.rsplit(".", 1)[-1]
        if base in _PCT_COLS:
            return f"{v * 100:+.1f}%" if base == "overhead" else f"{v * 100:.1f}%"
        if base == "test_accuracy":
            return f"{v * 100:.2f}%"
        if v == 0:
            return "0"
        if abs(v) >= 1e6 or abs(v) < 1e-3:
            return f"{v:.3e}"
        return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    return html.escape(str(v))


def _empty(v: Any) -> bool:
    if isinstance(v, list | tuple):
        return not v
    return v is None or (not isinstance(v, str | dict) and pd.isna(v)) or v == ""


def table(df: pd.DataFrame, columns: dict[str, str] | None = None, cell_class: dict[str, str] | None = None,
          raw: set[str] | None = None, compact: bool = False, row_ids: list[str | None] | None = None) -> str:
    """DataFrame -> <table>. ``columns`` maps column -> header (and picks/orders them); ``raw``
    columns hold HTML already escaped by the caller. ``compact`` (wide tables): columns empty in
    every row are left out, and list cells show a few cut names (``abbr_list``, full names in titles).
    ``row_ids``: an id per row (None: none), for links to a row."""
    if df is None or df.empty:
        return ""
    columns = columns or {c: c for c in df.columns}
    if compact:
        columns = {c: h for c, h in columns.items() if c in df.columns and not df[c].map(_empty).all()}
    raw = raw or set()
    head = "".join(f"<th>{html.escape(h)}</th>" for h in columns.values())
    body = []
    for i, (_, row) in enumerate(df.iterrows()):
        cells = []
        for c in columns:
            v = row.get(c)
            cls = (cell_class or {}).get(c) or ("num" if isinstance(v, int | float) and not isinstance(v, bool)
                                                 else "")
            text = v if c in raw else abbr_list(v, 30, keep=3) if compact and isinstance(v, list | tuple) else fmt(v, c)
            cells.append(f'<td class="{cls}">{text}</td>' if cls else f"<td>{text}</td>")
        rid = row_ids[i] if row_ids else None
        body.append((f'<tr id="{html.escape(rid)}">' if rid else "<tr>") + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def render(context: dict[str, Any]) -> str:
    pkg = resources.files("kernelmap.reports")
    env = jinja2.Environment(autoescape=jinja2.select_autoescape(["html", "j2"]), undefined=jinja2.StrictUndefined)
    template = env.from_string(pkg.joinpath("report.html.j2").read_text())
    ctx = dict(context)
    ctx["css"] = jinja2.utils.markupsafe.Markup(pkg.joinpath("report.css").read_text())
    for k, v in list(ctx.items()):
        if k.endswith("_html") and isinstance(v, str):
            ctx[k] = jinja2.utils.markupsafe.Markup(v)
    for key in ("op_tables", "figures", "answers", "answers_shared", "answers_alone", "cpu_answers"):
        for item in ctx.get(key, []):
            for k, v in list(item.items()):
                if k.endswith("html") and isinstance(v, str):
                    item[k] = jinja2.utils.markupsafe.Markup(v)
    if ctx.get("trend"):
        ctx["trend"]["table_html"] = jinja2.utils.markupsafe.Markup(ctx["trend"].get("table_html", ""))
    return template.render(**ctx)


def wrappable(text: str) -> str:
    """Escaped text that may wrap after the separators inside a name (``_``, ``:``, ``/``, ``.``), never
    inside a word: a line break opportunity (``<wbr>``) after each."""
    out = html.escape(text)
    for sep in ("_", ":", "/", "."):
        out = out.replace(sep, sep + "<wbr>")
    return out


def abbr(text: Any, limit: int = 36, wrap: bool = False) -> str:
    """Escaped text cut to ``limit`` characters, the whole of it in a title attribute; with ``wrap`` (the
    answer's cells, which never break inside a word) it may wrap between the parts of a name (``wrappable``)."""
    s = str(text)
    esc = wrappable if wrap else html.escape
    if len(s) <= limit:
        return esc(s)
    return f'<span class="abbr" title="{html.escape(s, quote=True)}">{esc(s[: limit - 1])}…</span>'


def abbr_list(values: Any, limit: int = 36, keep: int = 2, wrap: bool = False) -> str:
    """A list cell for narrow tables: at most ``keep`` items, each cut by ``abbr``; the rest as
    "+N more" with their names in its title."""
    if not isinstance(values, list | tuple):
        return fmt(values)
    vals = [str(v) for v in values]
    if not vals:
        return ""
    shown = [abbr(v, limit, wrap) for v in vals[:keep]]
    rest = vals[keep:]
    if rest:
        shown.append(f'<span class="abbr" title="{html.escape(chr(10).join(rest), quote=True)}">'
                     f"+{len(rest)} more</span>")
    return "<br>".join(shown)


def notes_list(notes: dict[str, int], anchor: str) -> str:
    """The numbered reasons a table's cells point at (``[n]``), each once."""
    if not notes:
        return ""
    items = "".join(f'<li id="{anchor}-{n}" value="{n}">{html.escape(w)}</li>' for w, n in notes.items())
    return f'<ol class="noratio-notes">{items}</ol>'


def letter(n: int) -> str:
    """The n-th (from 1) note letter: a, b, ... z, aa, ab ... (statements under a table, apart from its numbered
    reasons)."""
    out = ""
    while n:
        n, r = divmod(n - 1, 26)
        out = chr(ord("a") + r) + out
    return out


def statements_list(stated: dict[str, int], anchor: str) -> str:
    """A table's statements said once under it instead of in every row (``[a]`` in the cells), each with its id."""
    if not stated:
        return ""
    items = "".join(f'<li id="{anchor}-{n}" value="{n}">{html.escape(w)}</li>' for w, n in stated.items())
    return f'<ol class="noratio-notes call-notes" type="a">{items}</ol>'


NOISE_SAID = "noise"  # a ratio whose two figures' 95% intervals overlap (answer.NOISE_RULE)


def ratio_value_cell(v: float, gap: float, within_noise: bool = False, noise_rule: str = "") -> str:
    """A ratio's cell: grey and called noise where ``within_noise`` (``noise_rule`` in its title), else marked
    where ``gap`` or more either way."""
    if within_noise:
        return (f'<td class="num within-noise" title="{html.escape(noise_rule)}">{v:.3g}× '
                f'<span class="meta">{NOISE_SAID}</span></td>')
    far = v >= gap or v <= 1 / gap
    return f'<td class="num{" differs" if far else ""}">{v:.3g}×</td>'


def ratio_cell(v: Any, why: Any, notes: dict[str, int], anchor: str, gap: float, within_noise: bool = False,
               noise_rule: str = "") -> str:
    """A ratio cell: the ratio (marked where ``gap`` or more either way, unless ``within_noise``: then called noise,
    ``noise_rule`` in its title), or a pointer to why there is none."""
    if v is not None and not pd.isna(v):
        return ratio_value_cell(float(v), gap, within_noise, noise_rule)
    if not isinstance(why, str):
        return "<td>–</td>"
    n = notes.setdefault(why, len(notes) + 1)
    return (f'<td class="noratio" title="{html.escape(why)}">no ratio '
            f'<a href="#{anchor}-{n}">[{n}]</a></td>')


def _cpu_cell(r: pd.Series, fw: str) -> str:
    """One framework's CPU-time cell of ``cpu_tables``: its pass and interval, BUSY where the machine was, the figure."""
    ms, ci, busy = r.get(f"{fw}.cpu_ms"), r.get(f"{fw}.ci_ms"), r.get(f"{fw}.busy")
    why = r.get(f"{fw}.not_sampled")  # answer.cpu_table: why a layer's cell is not its ops' sampled time
    if ms is None or pd.isna(ms):
        return f'<td class="withheld" title="{html.escape(why)}">not sampled</td>' if isinstance(why, str) else "<td>–</td>"
    how = html.escape(str(r.get(f"{fw}.method") or "") + (f" ({why})" if isinstance(why, str) else ""))
    under = f"{r.get(f'{fw}.pass')} pass" + (f" · {ci[0]:.3g}–{ci[1]:.3g}" if isinstance(ci, tuple) else "")
    mark = f' <span class="busy" title="{html.escape(str(busy))}">BUSY</span>' if isinstance(busy, str) else ""
    return (f'<td class="num" title="{how}"><span class="pass">{html.escape(under)}</span>{mark} '
            f"<b>{fmt(ms, 'ms_per_step')}</b></td>")


def cpu_tables(cpu: pd.DataFrame, fws: list[str], ref: str, label, gap: float, within: str = "",
               noise_rule: str = "") -> list[dict[str, Any]]:
    """``answer.cpu_table`` as one HTML table per run, its batch sizes one above the other (a ``bs`` column
    where there are several: every layer and direction of every batch size on the first screen): per framework
    its CPU time per step (ms, on one line with its pass, the clean pass's 95% interval on the whole-step row,
    BUSY where the machine was), then each framework's CPU time over the reference's, called noise where its
    ``<fw>.vs_ref_noise`` is ``within`` (``noise_rule``). ``label``: framework key -> its name. The reasons a cell
    has no ratio are numbered once per table, folded under it."""
    out: list[dict[str, Any]] = []
    if cpu.empty:
        return out
    for run, g in cpu.groupby("run", sort=False, dropna=False):
        here = [fw for fw in fws if f"{fw}.cpu_ms" in g and g[f"{fw}.cpu_ms"].notna().any()]
        others = [fw for fw in here if fw != ref and ref in here]
        sizes = list(dict.fromkeys(g["batch_size"]))
        several = len(sizes) > 1
        head = ("<th>bs</th>" if several else "") + "<th>layer</th><th>direction</th>" + "".join(
            f"<th>{html.escape(label(fw))} <small>CPU ms/step</small></th>" for fw in here) + "".join(
            f"<th>{html.escape(label(fw))} / {html.escape(label(ref))} <small>CPU time</small></th>" for fw in others)
        anchor = f"cpunote-{run}"
        notes: dict[str, int] = {}
        body = []
        for bs in sizes:
            rows = g[g["batch_size"] == bs]
            for i, (_, r) in enumerate(rows.iterrows()):
                cells = ([f'<td class="key bs" rowspan="{len(rows)}">{html.escape(str(bs))}</td>'] if several and i == 0
                         else []) + [f'<td class="key">{html.escape(str(r["layer"]))}</td>',
                                     f'<td class="key">{html.escape(str(r["direction"]))}</td>']
                cells += [_cpu_cell(r, fw) for fw in here]
                cells += [ratio_cell(r.get(f"{fw}.vs_ref"), r.get(f"{fw}.no_ratio"), notes, anchor, gap,
                                     bool(within) and r.get(f"{fw}.vs_ref_noise") == within, noise_rule)
                          for fw in others]
                body.append(('<tr class="bs-first">' if several and i == 0 and bs != sizes[0] else "<tr>")
                            + "".join(cells) + "</tr>")
        n_ratio = sum(int(g[f"{fw}.vs_ref"].notna().sum()) for fw in others)
        n_noise = sum(int((g[f"{fw}.vs_ref_noise"] == within).sum()) for fw in others
                      if within and f"{fw}.vs_ref_noise" in g)
        n_cells = sum(int(g[f"{fw}.cpu_ms"].notna().sum()) for fw in others)
        # cells with no figure that say why (answer.WITHHELD: not sampled apart), counted as such, not as figures
        n_withheld = sum(int((g[f"{fw}.cpu_ms"].isna() & g[f"{fw}.not_sampled"].map(lambda v: isinstance(v, str)))
                             .sum()) for fw in here if f"{fw}.not_sampled" in g)
        folded = (f"<details><summary>Why a cell has no ratio ({len(notes)} reason(s), numbered in the table; hover a"
                  f" cell for its own)</summary>{notes_list(notes, anchor)}</details>" if notes else "")
        sizes_said = ", ".join(str(b) for b in sizes)
        out.append({"title": f"Run {run}, batch size{'s' if several else ''} {sizes_said}", "ratios": n_ratio,
                    "ratio_cells": n_cells, "withheld": n_withheld, "noise": n_noise,
                    "html": f'<table class="answer cpu"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}'
                            f"</tbody></table>" + folded})
    return out


def checks_tables(checks: pd.DataFrame, columns: dict[str, str], failed: str) -> tuple[str, str]:
    """(the failed checks, every check's table). The first: one line per failed check (its first failed row and
    how many rows failed, without the ``detail`` column, linked from the banner: ``failure_anchor``), then every
    failed row folded under it where a check failed more than once; the second whole (each row's detail)."""
    if checks is None or checks.empty:
        return "", ""
    bad = checks[checks["status"] == failed]
    short = {c: h for c, h in columns.items() if c != "detail"}
    first = bad[~bad["check"].duplicated()].copy()
    first.insert(len(first.columns), "failed_rows", [int((bad["check"] == k).sum()) for k in first["check"]])
    ids = [failure_anchor(k) for k in first["check"]]
    head = table(first, {**short, "failed_rows": "failed rows"}, cell_class={"status": "status"}, row_ids=ids)
    rest = (f"<details id=\"checks-failed\"><summary>Every failed row ({len(bad)})</summary>"
            f"{table(bad, short, cell_class={'status': 'status'})}</details>" if len(bad) > len(first) else "")
    return head + rest, table(checks, columns, cell_class={"status": "status"})


def failure_anchor(check: str) -> str:
    """The id of a failed check's first row in the page's short table of failures."""
    return "fail-" + "-".join("".join(ch if ch.isalnum() else " " for ch in str(check).lower()).split())


def failure_lines(checks: pd.DataFrame, failed: str, label, first: str | None = None) -> list[dict[str, Any]]:
    """The banner's failed checks: one line per check (``first``, if it failed, then the table's order) with how
    many rows failed and every failed row's subject (framework, batch size and what was checked; each named once),
    linked to its first row in the short table of failures (``failure_anchor``). ``head``: the subjects that fit
    on the line (``LINE_CHARS``), ``more``: how many are left to the folded whole (``subjects``)."""
    if checks is None or checks.empty:
        return []
    bad = checks[checks["status"] == failed]
    kinds = sorted(dict.fromkeys(bad["check"]), key=lambda k: k != first)
    out = []
    for kind in kinds:
        g = bad[bad["check"] == kind]
        one = g["subject"].nunique(dropna=False) == 1
        who = [" ".join(x for x in (label(r["framework"]) if isinstance(r["framework"], str) else "",
                                    f"bs {int(r['batch_size'])}" if pd.notna(r["batch_size"]) else "",
                                    "" if one or pd.isna(r["subject"]) else str(r["subject"])) if x)
               for _, r in g.iterrows()]
        names = list(dict.fromkeys(w for w in who if w))
        common = str(g["subject"].iloc[0]) if one and pd.notna(g["subject"].iloc[0]) else ""
        shown = _fitting(names, LINE_CHARS - len(str(kind)) - len(common))
        said = {}
        for key, part in (("subjects", names), ("head", names[:shown])):
            whole = ", ".join(part)
            said[key] = f"{whole} ({common})" if whole and common else whole or common
        out.append({"check": str(kind), "rows": len(g), **said, "more": len(names) - shown,
                    "anchor": failure_anchor(kind)})
    return out


LINE_CHARS = 150  # about one line of the banner at 1,400 px: a failed check's line names its first subjects in it


def _fitting(names: list[str], room: int) -> int:
    """How many of ``names`` (joined by ", ") fit in ``room`` characters: at least one."""
    used = 0
    for i, n in enumerate(names):
        used += len(n) + 2
        if used > room and i:
            return i
    return len(names)


# contention.summarise's busiest other process, "(most: pid N COMMAND, C cores)": the banner's list names it in full
MOST_CLAUSE = re.compile(r" \(most: pid \d+ .*?, [\d.]+ cores\)")


def busy_span(text: Any) -> str:
    """A busy pass's contention text, marked, in a table cell: the busiest other process (``MOST_CLAUSE``, named in
    full in the banner's list of busy figures) moved into its title, so that the cell stays a line or two."""
    full = str(text)
    short = MOST_CLAUSE.sub("", full)
    title = f' title="{html.escape(full, quote=True)}"' if short != full else ""
    return f'<span class="busy"{title}>{html.escape(short)}</span>'


def busy_mark(ov: pd.DataFrame, passes: tuple[str, ...], label) -> tuple[bool | None, str]:
    """(busy, words) for a figure drawn from ``passes`` of every case: busy True where any of them ran on a
    busy machine (each named), None where one was not measured, False where all ran quiet. ``ov``:
    ``analysis.profiler_overhead`` (a row per case x pass, ``contended``, ``contention``)."""
    if ov is None or ov.empty:
        return None, "contention: no pass figures"
    rows = ov[ov["pass"].isin(passes) & ov["skipped"].isna()] if "skipped" in ov else ov[ov["pass"].isin(passes)]
    if rows.empty:
        return None, "contention: no pass figures"
    flag = rows["contended"].map(lambda v: v if isinstance(v, bool) else None)
    busy = rows[flag.eq(True).to_numpy(dtype=bool)]
    who = "; ".join(f"{label(r['framework'])} bs {r['batch_size']} {r['pass']} pass "
                    f"({str(r['contention']).removeprefix('BUSY: ')})"
                    for _, r in busy.iterrows())
    if len(busy):
        return True, f"BUSY: measured while the machine was busy: {who}"
    if flag.isna().any():
        return None, "contention not measured for every pass it draws from"
    return False, f"quiet: every pass it draws from ({', '.join(passes)}) ran on a quiet machine"


FINDING_FIELDS = {"run": "run", "rank": "#", "call": "call", "batch_size": "bs", "case": "case", "remedy": "remedy",
                  "where": "layer (op)", "direction": "direction", "saving_ms": "saves ms/step",
                  "saving_lo_ms": "95% low", "saving_hi_ms": "95% high", "case_ms": "case ms", "remedy_ms": "remedy ms",
                  "cause": "cause", "caveat": "caveat", "busy": "busy"}


def findings_html(df: pd.DataFrame, kind: str, top: int = 10) -> str:
    """The ``top`` findings of one kind per run (``analyses.findings``: ranked, findings before noise)."""
    if df is None or df.empty:
        return ""
    rows = df[df["kind"] == kind]
    return table(rows[rows["rank"] <= top], FINDING_FIELDS, compact=True)
